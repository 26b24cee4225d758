"""Launch and placement: the launch plan (pure data) and its port layout, hosts and launchers (local, SSH, Slurm),
the remote side of a session, preflight, the fork server and torchrun entry, resume preparation, and the launch
pipeline as a library call. Imported by the CLI, the supervisor and tests; it imports the job schema, never the
supervisor or the roles (roles are started by module name)."""
