"""`rlctl logs --follow` across a Slurm batch run's allocations: a preempted run whose requeued job Slurm will start
again is followed on (the next allocation appends to the same log files), with a marker line where an allocation
ended and where the next one began; the follow ends when the run is over for good, or when no allocation will come.

On the fast CLI path (`rlctl logs`): standard library only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rlctl.role_names import SUPERVISOR
from rlctl.run_logs import LogEntry, is_end_line, merged_log_lines
from rlctl.run_reading import real_number, segments
from rlctl.rundir import OVER_STATES, RunDir, status_of
from rlctl.run_status import RunStatus
from rlctl.slurm_queue import job_state, resuming_job

SQUEUE_EVERY_S = 3.0  # how often a follow asks Slurm about a preempted run's job (each squeue loads its controller)


@dataclass
class Look:
    """One round's reading of the followed run."""

    over: bool = False  # over for good: read every file to its end, then end
    settled: bool = False  # every line of the segment is in its file: no need to hold lines back for late ones
    before: list[LogEntry] = field(default_factory=list)  # markers ahead of this round's lines (an allocation began)
    after: list[LogEntry] = field(default_factory=list)  # markers after them (an allocation ended)


def _marker(text: str, ts: float | None = None) -> LogEntry:
    return (time.time() if ts is None else ts, SUPERVISOR, f"── {text} ──")


def last_preemption(state: dict) -> dict:
    """The run's last preemption record (state.json's, or, before the next segment's supervisor writes one, the
    record its resume carried over); {} when none."""
    for holder in (state, state.get("resumed")):
        listed = holder.get("preemptions") if isinstance(holder, dict) else None
        if isinstance(listed, list) and listed and isinstance(listed[-1], dict):
            return listed[-1]
    return {}


def live_segment_number(state: dict) -> int:
    """Which segment (1 = the first) a run that is not over is in: one after those that ended."""
    return sum(1 for s in segments(state) if s["ended_at"] is not None) + 1


class AllocationWatch:
    """Reads the followed run's status each round: whether it is over for good, and the markers between its
    allocations."""

    def __init__(self, rundir: RunDir, ask_every_s: float = SQUEUE_EVERY_S):
        self.rundir = rundir
        self.ask_every_s = ask_every_s
        self.segment: int | None = None  # the segment followed (1 = the first)
        self.marked: int | None = None  # the last segment whose preemption has its marker
        self._asked_at, self._answer = float("-inf"), None

    def look(self) -> Look:
        """This round's reading (read before the round's lines: all written before it are read after it)."""
        state = self.rundir.read_state() or {}
        status = status_of(state)
        if status == RunStatus.PREEMPTED:
            return self._preempted(state)
        if status in OVER_STATES:
            return Look(over=True, settled=True)
        if status == RunStatus.QUEUED:  # not started yet: no segment of its own
            return Look()
        number, before = live_segment_number(state), []
        if self.segment is not None and number > self.segment:
            if self.marked != self.segment:  # its preemption went by between two looks, or without an end line
                before.append(self._preempted_marker(last_preemption(state), "its next allocation started"))
            job = state.get("slurm_job_id")
            before.append(_marker(f"resumed in allocation {number}" + (f" of Slurm job {job}" if job else "")))
            self.marked = self.segment
        self.segment = number
        return Look(before=before)

    def _preempted(self, state: dict) -> Look:
        """A preempted run: followed on while its job will start it again, over when none will."""
        number = len(segments(state)) or 1  # the preempted segment is the last one listed
        self.segment = number
        job = resuming_job(state, self._ask)
        record = last_preemption(state)
        run_id = self.rundir.run_id
        if job is None:
            why = ("its Slurm job was not requeued" if record.get("requeued") is not True else
                   f"Slurm job {state.get('slurm_job_id')} has ended")
            text = f"no allocation will resume it: {why}; rlctl run --resume {run_id} continues it"
            marker = _marker(text) if self.marked == number else self._preempted_marker(record, text)
            return Look(over=True, settled=True, after=[marker])
        # Its supervisor's end line is written once every process's last line is in its log; a job pending again has
        # no process left of its last allocation (a supervisor killed before its end line wrote none).
        supervisor = merged_log_lines(self.rundir, SUPERVISOR, tail=1)
        settled = bool(supervisor) and is_end_line(supervisor[-1][2]) or self._answer == "PENDING"
        if not settled or self.marked == number:
            return Look(settled=settled)
        self.marked = number
        waiting = f"waiting for the next allocation of Slurm job {job}; Ctrl-C leaves (rlctl stop {run_id} ends it)"
        return Look(settled=True, after=[self._preempted_marker(record, waiting)])

    def _preempted_marker(self, record: dict, then: str) -> LogEntry:
        at = real_number(record.get("at"))
        when = f" at {time.strftime('%H:%M:%S', time.localtime(at))}" if at is not None else ""
        reason = record.get("reason")
        return _marker(f"{RunStatus.PREEMPTED}{when}" + (f" ({reason})" if isinstance(reason, str) and reason else "") +
                       f"; {then}", at)

    def _ask(self, job: int) -> str | None:
        """Slurm's word on the job, asked at most every `ask_every_s` (the first time at once)."""
        now = time.monotonic()
        if now - self._asked_at >= self.ask_every_s:
            self._asked_at, self._answer = now, job_state(job)
        return self._answer
