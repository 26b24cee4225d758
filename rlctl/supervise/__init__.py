"""Runtime supervision: the supervisor's loop and its parts (process table, restart policy as a state machine,
process start, control router, run state, metrics sink, remote clean-up), stopping a run, stop-rule progress.
Imported by the launch pipeline, the CLI's `stop` and views (stop progress); it imports the job, launch, net and
run-directory layers, never the roles or an algorithm."""
