"""The data plane's wire: messages and their one parser, CURVE keys and admission, control messages, the weight
board and publisher/subscriber. Imported by every process; imports numpy and ZeroMQ, never torch at import."""
