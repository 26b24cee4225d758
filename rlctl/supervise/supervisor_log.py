"""logs/supervisor.log: the supervisor's own lines beside its processes' logs (the run starting, stopping, and its
end line, the last line of the run), stamped as the processes' lines are, so `rlctl logs` merges them in."""

from __future__ import annotations

import sys

from rlctl.role_names import SUPERVISOR
from rlctl.run_logs import end_line_text, stamp
from rlctl.rundir import RunDir


class SupervisorLog:
    """Appends the supervisor's lines to logs/supervisor.log, each flushed at once."""

    def __init__(self, rundir: RunDir):
        self.path = rundir.logs_dir / f"{SUPERVISOR}.log"

    def write(self, text: str) -> None:
        """One line; a log that cannot be written is said on stderr and the run goes on (state.json still tells)."""
        try:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(f"{stamp()} {text}\n")
        except OSError as exc:
            print(f"rlctl: cannot write {self.path}: {exc}", file=sys.stderr)

    def end(self, status: str, reason: str | None, elapsed_s: float) -> None:
        """The run's end line: written after every process's output is in its log, before the last state.json."""
        self.write(end_line_text(status, reason, elapsed_s))
