"""The rollout algorithms: synchronous PPO, asynchronous PPO (APPO) and IMPALA (V-trace)."""
