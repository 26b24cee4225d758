"""A Slurm run's allocation ending under it: the time-limit warning (SIGUSR1, which the batch script asks for with
`--signal=B:USR1@<cluster.signal_grace_s>`), or Slurm ending the job to requeue it (preemption, `scontrol requeue`:
SIGTERM, with the job's restart count already raised). Either way the supervisor stops the run as for `rlctl stop`
(the learner's last checkpoint, every replay shard's snapshot, the counters in state.json) but records it
`preempted`, the reason in state.json's `preemptions`; a batch run with `cluster.requeue` then has Slurm requeue its
job, whose next allocation resumes the same run directory (rlctl.launch.resume.prepare_batch_restart).
"""

from __future__ import annotations

import os
import re
import signal
import time

from rlctl.launch.slurm import SlurmError, slurm_command


def restart_count(job_id: int) -> int | None:
    """How often Slurm has started the job again (`Restarts=` of `scontrol show job`); None when it does not say."""
    try:
        match = re.search(r"\bRestarts=(\d+)\b", slurm_command("scontrol", "-o", "show", "job", str(job_id)))
    except SlurmError:
        return None
    return int(match[1]) if match else None


class Preemption:
    """Whether this segment ends by preemption, why, and the requeue that follows (by Slurm, or asked here)."""

    def __init__(self, slurm_job: int | None, batch: bool, requeue: bool, history: list | None = None,
                 env: dict | None = None):
        env = os.environ if env is None else env
        self.job, self.batch, self.requeue = slurm_job, batch, requeue and batch
        count = str(env.get("SLURM_RESTART_COUNT") or "0")  # unset in a job's first allocation
        self.restarts = int(count) if count.isdigit() else 0
        self.history = [p for p in history or [] if isinstance(p, dict)]
        self.warned = self.terminated = False
        self.record: dict | None = None  # this segment's preemption, once decided

    def signals(self) -> tuple:
        """The signals besides SIGINT and SIGTERM the supervisor takes as a stop: SIGUSR1 in a Slurm job."""
        return (signal.SIGUSR1,) if self.job is not None else ()

    def on_signal(self, signum: int) -> None:
        """Note a stop signal (from the supervisor's handler: nothing but flags here)."""
        self.warned |= signum == signal.SIGUSR1
        self.terminated |= signum == signal.SIGTERM

    def decide(self, env_steps: object = None) -> str | None:
        """Once, as the run winds down: the reason when this stop is a preemption, else None. A SIGTERM counts when
        Slurm has raised the job's restart count (it is requeueing the job), not when it cancels it or `rlctl stop`
        asked."""
        if self.job is None or self.record is not None:
            return self.record and self.record["reason"]
        if self.warned:
            reason, by_slurm = f"Slurm job {self.job} nears its time limit (SIGUSR1)", False
        elif self.terminated and self.batch and (restart_count(self.job) or 0) > self.restarts:
            reason, by_slurm = f"Slurm job {self.job} was requeued (preemption or scontrol requeue)", True
        else:
            return None
        self.record = {"at": time.time(), "reason": reason, "slurm_job_id": self.job, "allocation": self.restarts,
                       "env_steps": env_steps, "requeued": by_slurm or self.requeue, "requeued_by": (
                           "slurm" if by_slurm else "rlctl" if self.requeue else None)}
        return reason

    @property
    def job_ending(self) -> bool:
        """Slurm is ending the job now: no new job step can start (nothing to fetch from the nodes through one)."""
        return bool(self.record and self.record["requeued_by"] == "slurm")

    def requeue_job(self) -> str | None:
        """Ask Slurm to requeue the job when that is left to this supervisor (the last thing it does: Slurm then
        ends the allocation); the error, or None."""
        if not self.record or self.record["requeued_by"] != "rlctl":
            return None
        try:
            slurm_command("scontrol", "requeue", str(self.job))
        except SlurmError as exc:
            self.record.update(requeued=False, requeued_by=None, requeue_error=str(exc))
            return str(exc)
        return None

    def document(self) -> dict:
        """What state.json says of it: whether the run is a batch job, and every preemption of the run so far."""
        return {"slurm_batch": self.batch, "preemptions": self.history + ([self.record] if self.record else [])}
