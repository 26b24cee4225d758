"""What to do next with a run, by how it stands: the command lines `rlctl run` prints when it ends, `rlctl status RUN`
and `rlctl watch` print under the run. A run that can go on (stopped, lost, preempted and not requeued, or failed with a checkpoint) is offered
`rlctl run --resume`; a finished one a new target.

On the fast CLI path: standard library only.
"""

from __future__ import annotations

from rlctl.rundir import OVER_STATES, RunDir
from rlctl.run_status import RunStatus


def next_steps(rundir: RunDir, status: str) -> list[str]:
    """Command lines for a run in `status` (its effective status), most useful first."""
    run = rundir.run_id
    has_checkpoint = (rundir.checkpoints_dir / "latest.pt").is_file()
    if status not in OVER_STATES and status != RunStatus.UNKNOWN:  # created, queued (a preempted run requeued too), running...
        return [f"rlctl watch {run}", f"rlctl logs --follow {run}", f"rlctl stop {run}"]
    lines = []
    if status in (RunStatus.STOPPED, RunStatus.LOST, RunStatus.PREEMPTED) or (
            status == RunStatus.FAILED and has_checkpoint):
        lines.append(f"rlctl run --resume {run}")
    if status == RunStatus.FINISHED:
        lines.append(f"rlctl run --resume {run} --until env_steps=N")  # train on to a new target
    lines.append(f"rlctl logs {run}")
    if has_checkpoint or (rundir.checkpoints_dir / "best.pt").is_file():
        lines.append(f"rlctl eval {run}")
    return lines


def next_steps_text(rundir: RunDir, status: str) -> str:
    """The next steps as lines indented under a run's view."""
    return "\n".join(f"  {line}" for line in next_steps(rundir, status))
