"""What Slurm's queue says of a batch run's job, for the fast CLI path (`rlctl status`, `watch`): standard library
only, and never more than a short wait (a login node whose Slurm does not answer shows the run as it is)."""

from __future__ import annotations

import subprocess

SQUEUE_TIMEOUT_S = 3.0


def job_pending(job_id: object) -> bool:
    """Whether Slurm holds batch job `job_id` pending (queued, or requeued and waiting for its next allocation), or
    completing on the way there; asked only of a run whose supervisor requeued it."""
    if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id <= 0:
        return False
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=SQUEUE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    # A requeued job completes its last allocation (COMPLETING, for up to KillWait) before it is pending again.
    return out.returncode == 0 and out.stdout.strip() in ("PENDING", "COMPLETING", "REQUEUED", "REQUEUE_FED")
