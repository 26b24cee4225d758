"""`rlctl watch`: the live view of a run that another process supervises (detached, or a batch job's supervisor on
another machine), read from its run directory. Everything the attached view shows is in state.json, which the
supervisor rewrites twice a second (status, processes, run-level figures, return history, stop criteria), so the
same view is drawn from the same document. Watching never signals the run; Ctrl-C only leaves the watch.

On the fast CLI path: no torch, numpy or zmq.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from rlctl.rundir import OVER_STATES, RunDir
from rlctl.run_reading import as_read
from rlctl.run_status import RunStatus

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rich.console import Console


def exit_code(status: str) -> int:
    """What `rlctl watch` exits with once the run is over: 0 finished or stopped, 1 failed, lost or preempted and not
    requeued (as `rlctl run`). A requeued run is watched on through its queued wait into its next allocation."""
    return 0 if status in (RunStatus.FINISHED, RunStatus.STOPPED) else 1


def follow_state(rundir: RunDir, interval_s: float, show: Callable[[dict], None]) -> dict:
    """Call `show` with the run's state as read (rlctl.run_reading.as_read) every `interval_s` until the run is over;
    the last state."""
    while True:
        state = as_read(rundir.read_state())
        show(state)
        if state["status"] in OVER_STATES:
            return state
        time.sleep(interval_s)


def watch_run(rundir: RunDir, con: "Console", interval_s: float) -> dict:
    """The live view on a terminal (the attached `rlctl run`'s), else a progress line whenever the supervisor has
    written something new; the run's last state once it is over (KeyboardInterrupt leaves it early)."""
    from rlctl.views.console import progress_line, run_view

    if con.is_terminal:
        from rich.live import Live

        with Live(console=con, refresh_per_second=4, transient=False) as live:
            return follow_state(rundir, interval_s, lambda st: live.update(run_view(st)))
    last = [None]

    def line(state: dict) -> None:
        mark = (state.get("updated_at"), state["status"])
        if mark != last[0]:
            last[0] = mark
            con.print(progress_line(state), markup=False)

    return follow_state(rundir, interval_s, line)
