"""What Slurm's queue says of a batch run's job, for the fast CLI path (`rlctl status`, `watch`, `logs`, `rm`):
standard library only, and never more than a short wait (a login node whose Slurm does not answer shows the run as
it is)."""

from __future__ import annotations

import subprocess
from typing import Callable

from rlctl.run_status import RunStatus

SQUEUE_TIMEOUT_S = 3.0
# A requeued job completes its last allocation (COMPLETING, for up to KillWait) before it is pending again.
PENDING_STATES = frozenset({"PENDING", "COMPLETING", "REQUEUED", "REQUEUE_FED"})
# States of a job that has not ended for good: an allocation of it runs or will. RUNNING too: a preempted run's
# supervisor asks for the requeue as its last step, and the next allocation starts before it rewrites state.json.
UNENDED_STATES = PENDING_STATES | {"RUNNING", "CONFIGURING", "REQUEUE_HOLD", "SUSPENDED", "RESIZING", "SIGNALING",
                                   "STAGE_OUT"}


def _job_id(job_id: object) -> int | None:
    """A Slurm job id as state.json holds it, or None."""
    return job_id if isinstance(job_id, int) and not isinstance(job_id, bool) and job_id > 0 else None


def job_state(job_id: object) -> str | None:
    """Slurm's word for batch job `job_id`'s state ("PENDING", "RUNNING", ...); "" when Slurm does not list it (it
    ended and was forgotten, or never was); None when Slurm cannot be asked here (no squeue, no answer in time)."""
    if _job_id(job_id) is None:
        return ""
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=SQUEUE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:  # a job id the controller no longer knows, else the controller did not answer
        return "" if "invalid job id" in out.stderr.lower() else None
    return out.stdout.strip()


def job_pending(job_id: object) -> bool:
    """Whether Slurm holds batch job `job_id` pending (queued, or requeued and waiting for its next allocation), or
    completing on the way there; asked only of a run whose supervisor requeued it."""
    return job_state(job_id) in PENDING_STATES


def resuming_job(state: dict, ask: Callable[[int], str | None] = job_state) -> int | None:
    """The Slurm job that will start this run (again): the job of a run queued and not started, or of a preempted
    run whose job was requeued, while Slurm has not ended it (or cannot be asked: the requeue is what was said);
    None when no allocation will come. `ask`: how Slurm is asked (job_state)."""
    job = _job_id(state.get("slurm_job_id"))
    if job is None:
        return None
    status = state.get("status")
    if status == RunStatus.PREEMPTED:
        preemptions = state.get("preemptions") if isinstance(state.get("preemptions"), list) else []
        last = preemptions[-1] if preemptions and isinstance(preemptions[-1], dict) else {}
        if last.get("requeued") is not True:
            return None
    elif status != RunStatus.QUEUED:
        return None
    seen = ask(job)
    return job if seen is None or seen in UNENDED_STATES else None
