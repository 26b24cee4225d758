"""The segment after an elastic run's head host was lost: prepared in the same supervisor process, at once.

The supervisor ends the segment whose head's host two starts of the head in a row could not reach over SSH (its
processes stopped, its checkpoints home), and this prepares the next as `rlctl run --resume RUN --job FILE` would, with the job
rlctl.job.head_move renders: the same run directory, its counters and segments carried on, and a start that sends
the new head the newest checkpoint that came home. What cannot go on fails the run, with the reason. Between the two
segments the run says starting; a stop there (StopBetweenSegments) ends it stopped, as the last segment left it.
"""

from __future__ import annotations

import signal
import sys
import time

from rlctl.run_reading import elapsed_s
from rlctl.rundir import RunDir
from rlctl.run_status import RunStatus
from rlctl.job.spec import JobSpec
from rlctl.supervise.checkpoint_mirror import checkpoints_to_send
from rlctl.supervise.supervisor_log import SupervisorLog


def prepare_next_segment(rundir: RunDir, spec: JobSpec, lost: str, lost_at: float) -> str | None:
    """Write the run directory's next segment (job, plan, state "created") with the learner head off `lost` (lost
    at `lost_at`, recorded in state.json's `head_moves`); None once it is ready, else why the run cannot go on
    (recorded: the run failed)."""
    from rlctl.job.load import JobFileError
    from rlctl.job.head_move import HeadNotMovable, head_moved
    from rlctl.launch.pipeline import LaunchInput, LaunchRefused, PreflightFailed, prepare
    from rlctl.launch.resume import ResumeRefused, previous_segment

    try:
        moved = head_moved(spec, lost)
        resumed = previous_segment(rundir, ended_here=True)
        head = next(h.name for h in moved.hosts if h.learner)
        resumed["head_moves"] = [*resumed["head_moves"], {"lost": lost, "at": lost_at, "head": head}]
        prepare(LaunchInput(moved, rundir, resumed))
    except (HeadNotMovable, JobFileError, LaunchRefused, PreflightFailed, ResumeRefused) as exc:
        why = str(exc) if not isinstance(exc, JobFileError) else exc.render()
        state = rundir.read_state() or {}
        rundir.write_state({**state, "status": RunStatus.FAILED,
                            "exit_reason": f"{state.get('exit_reason')}; the run cannot go on without it: {why}"})
        SupervisorLog(rundir).write(f"the run cannot go on without {lost}: {why}")
        print(f"rlctl: the run cannot go on without {lost}: {why}", file=sys.stderr, flush=True)
        return why
    line = f"the run goes on with its learner head on {head}" + (
        "" if checkpoints_to_send(rundir.checkpoints_dir) else
        f", from nothing: no checkpoint of the run came home before {lost} was lost")
    SupervisorLog(rundir).write(line)
    print(f"rlctl: {line}", file=sys.stderr, flush=True)
    return None


class StopBetweenSegments:
    """SIGINT and SIGTERM between two segments of a run, recorded (`signum`): a segment's supervisor puts these
    handlers back when it ends, so that a stop arriving before the next segment's supervisor has its own stops the
    run there, rather than the process dying of the signal with the run left starting."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self.old: dict = {}

    def __enter__(self) -> "StopBetweenSegments":
        self.old = {s: signal.signal(s, self._on_signal) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.old.items():
            signal.signal(s, handler)

    def _on_signal(self, signum, frame) -> None:
        self.signum = signum


def stop_between_segments(rundir: RunDir, state: dict, signum: int) -> int:
    """End the run stopped, as `state` (the last segment's end) had it, after a stop between two segments; 0."""
    reason = f"stopped by {signal.Signals(signum).name} before its next segment started ({state.get('exit_reason')})"
    now = time.time()
    stopped = {**state, "status": RunStatus.STOPPED, "exit_reason": reason, "ended_at": now, "updated_at": now}
    rundir.write_state(stopped)
    SupervisorLog(rundir).end(RunStatus.STOPPED, reason, elapsed_s(stopped) or 0.0)
    print(f"rlctl: {reason}", file=sys.stderr, flush=True)
    return 0
