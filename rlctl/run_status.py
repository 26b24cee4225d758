"""The statuses a run passes through, as state.json and `rlctl status` say them: one name for each, used everywhere
(plain strings, so that state.json read back compares equal without conversion). rlctl.rundir groups them
(TERMINAL_STATES, OVER_STATES)."""

from __future__ import annotations


class RunStatus:
    """A run's status: created -> starting -> running -> stopping -> finished / stopped; failed at any point; lost
    when its supervisor died without saying how the run ended (found by whoever reads state.json). A Slurm batch
    run is queued until its allocation starts; preempted when its allocation ended under it (time limit,
    preemption, requeue) after it checkpointed everything: its next allocation (or `run --resume`) continues it,
    and while Slurm holds it pending again it shows as queued."""

    QUEUED = "queued"
    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"
    LOST = "lost"
    PREEMPTED = "preempted"
    UNKNOWN = "unknown"  # no state.json to read
    PENDING = "pending"  # a sweep's trial not begun yet (its folder has no state.json)

