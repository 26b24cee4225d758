"""A run's process logs (logs/<role>-<rank>.log) read as one stream: lines merged by their timestamps across files,
the last N of them, or followed as they grow.

On the fast CLI path (`rlctl logs`): standard library only.
"""

from __future__ import annotations

import bisect
import heapq
import os
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Iterator

from rlctl.role_names import SUPERVISOR
from rlctl.rundir import OVER_STATES, RunDir, parse_log_name
from rlctl.run_status import RunStatus

HOLD_S = 0.5  # how long a followed line waits for lines stamped before it that are still being written
_FOLLOW_CHUNK = 8 << 20  # bytes read per file per round, so a huge backlog cannot blow up memory

LogEntry = tuple[float, str, str]  # (timestamp, source such as "collector-0", text)
_END_LINE = re.compile(r"^run (\w+) after ")  # the supervisor's last line (end_line_text)


def stamp(now: float | None = None) -> str:
    """The timestamp that starts every log line: local time to the millisecond, "2026-11-29T22:01:11.123"."""
    now = time.time() if now is None else now
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def end_line_text(status: str, reason: str | None, elapsed_s: float) -> str:
    """The run's end line, the last one of the supervisor's log: "run finished after 12.3s: <reason>"."""
    return f"run {status} after {elapsed_s:.1f}s: {reason or status}"


def is_end_line(text: str) -> bool:
    """True for the run's end line (end_line_text)."""
    return _END_LINE.match(text) is not None


def parse_log_line(line: str) -> tuple[float | None, str]:
    """(epoch seconds, text) from "2026-11-29T22:01:11.123 text"; (None, line) if no timestamp."""
    line = line.rstrip("\r\n")
    stamp, sep, text = line.partition(" ")
    # Cheap shape check first: fromisoformat would also accept bare dates like "2026-11-29".
    if len(stamp) < 19 or stamp[4] != "-" or stamp[10] != "T":
        return None, line
    try:
        return datetime.fromisoformat(stamp).timestamp(), text
    except ValueError:
        return None, line


def _decode(raw: bytes) -> str:
    """Text of one raw log line (bad bytes replaced, trailing CR removed)."""
    return raw.decode("utf-8", errors="replace").rstrip("\r")


def _to_entries(lines: list[str], source: str, prev_ts: float | None, fallback_ts: float) -> list[LogEntry]:
    """Timestamped entries; lines without a timestamp take the previous line's one."""
    parsed = [parse_log_line(line) for line in lines]
    if prev_ts is None:
        # Leading untimestamped lines: borrow the first real timestamp so the file stays ordered.
        prev_ts = next((ts for ts, _ in parsed if ts is not None), fallback_ts)
    entries = []
    for ts, text in parsed:
        prev_ts = prev_ts if ts is None else ts
        entries.append((prev_ts, source, text))
    return entries


def _read_lines(path: Path, tail: int | None = None, end: int | None = None) -> list[str]:
    """All lines of a file up to byte `end` (default: its end), or only its last `tail`, reading backwards so big
    logs stay cheap."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        pos = size if end is None else min(end, size)
        if tail is None:
            f.seek(0)
            data = f.read(pos)
        else:
            data = b""
            while pos > 0 and data.count(b"\n") <= tail:
                step = min(1 << 16, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    return [_decode(raw) for raw in lines]


def _mtime(path: Path) -> float:
    """File mtime, or now if it vanished."""
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def _merge(per_file: list[list[LogEntry]]) -> Iterator[LogEntry]:
    """Entries of several files merged by timestamp; ties in the order of RunDir.log_files (role, then rank), so
    that a followed stream and a later read agree line for line."""
    return heapq.merge(*per_file, key=_order)


def _order(entry: LogEntry) -> tuple[float, str, int]:
    role, rank = parse_log_name(Path(entry[1]))
    return entry[0], role, -1 if rank is None else rank


def merged_log_lines(
    rundir: RunDir, role: str | None = None, rank: int | None = None, tail: int | None = None
) -> list[LogEntry]:
    """(timestamp, source, text) of the run's log lines, ordered by time across files; last `tail` only if given."""
    return _merged(rundir.log_files(role, rank), tail, {})


def _merged(paths: list[Path], tail: int | None, ends: dict[Path, int]) -> list[LogEntry]:
    """The lines of `paths` (each up to its byte offset in `ends`, if there) merged by time; last `tail` if given."""
    per_file = []
    for path in paths:
        try:
            lines = _read_lines(path, tail, ends.get(path))
        except OSError:
            continue
        per_file.append(_to_entries(lines, path.stem, None, _mtime(path)))
    merged = list(_merge(per_file))
    if tail is not None:
        merged = merged[-tail:] if tail > 0 else []
    return merged


def end_entry(rundir: RunDir) -> LogEntry | None:
    """The run's end line: the supervisor's, or, where it wrote none (a lost run), one made from state.json; None
    while the run is not over."""
    state = rundir.read_state() or {}
    status = rundir.effective_status(state)
    if status not in OVER_STATES:
        return None
    path = rundir.logs_dir / f"{SUPERVISOR}.log"
    last = merged_log_lines(rundir, SUPERVISOR, tail=1) if path.is_file() else []
    if last and is_end_line(last[-1][2]):
        return last[-1]
    started, ended = state.get("started_at"), state.get("ended_at") or state.get("updated_at")
    numbers = all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (started, ended))
    reason = state.get("exit_reason") if status != RunStatus.LOST else "its supervisor is gone"
    return (float(ended) if numbers else time.time(), SUPERVISOR,
            end_line_text(status, reason, float(ended) - float(started) if numbers else 0.0))


class _LogCursor:
    """Read position of one followed log file, with its unfinished last line and last timestamp."""

    def __init__(self, path: Path, offset: int = 0):
        self.path = path
        self.source = path.stem
        self.offset = offset
        self.partial = b""
        self.last_ts: float | None = None
        self.pending = False  # more bytes on disk than this round read

    def read_new(self) -> list[LogEntry]:
        """Complete lines appended since the last call (an unfinished last line is kept for later)."""
        try:
            stat = self.path.stat()
        except OSError:
            return []
        if stat.st_size < self.offset:  # truncated: start over
            self.offset, self.partial = 0, b""
        if stat.st_size == self.offset:
            self.pending = False
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(min(stat.st_size - self.offset, _FOLLOW_CHUNK))
        except OSError:
            return []
        self.offset += len(data)
        self.pending = self.offset < stat.st_size
        *complete, self.partial = (self.partial + data).split(b"\n")
        return self._entries([_decode(raw) for raw in complete], stat.st_mtime)

    def flush(self) -> list[LogEntry]:
        """The unfinished last line, if any (used once the run is over and it will not be completed)."""
        if not self.partial:
            return []
        text, self.partial = _decode(self.partial), b""
        return self._entries([text], _mtime(self.path))

    def _entries(self, lines: list[str], mtime: float) -> list[LogEntry]:
        entries = _to_entries(lines, self.source, self.last_ts, mtime)
        if entries:
            self.last_ts = entries[-1][0]
        return entries


def _offset_after_last_line(path: Path) -> int:
    """Byte offset just after the file's last complete line (where "start at end" begins)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - (1 << 16))
            f.seek(start)
            newline = f.read(size - start).rfind(b"\n")
    except OSError:
        return 0
    return size if newline < 0 else start + newline + 1


def follow_logs(
    rundir: RunDir,
    role: str | None = None,
    rank: int | None = None,
    poll_s: float = 0.2,
    tail: int | None = None,
) -> Iterator[LogEntry]:
    """Yield the run's log lines as they are written (also from files created later) until the run is over, then
    its end line (end_entry). With `tail`, the last `tail` lines written so far come first, and then every line after
    them: nothing falls between the two. A preempted Slurm batch run whose job will start it again is followed
    across its allocations, with a marker line where one ended and where the next began
    (rlctl.allocation_watch).

    Only complete lines are yielded while the run is live. Each poll round yields the new lines of all files merged
    by timestamp, each line once it is HOLD_S old. Returns once the run is over and every file has been read to its
    end: the supervisor writes a status that is over only after every line of its processes is in their logs (and
    its own end line in logs/supervisor.log), so the round that reads that status first and the files after it
    misses none.
    """
    from rlctl.allocation_watch import AllocationWatch

    cursors: dict[Path, _LogCursor] = {}
    if tail is not None:
        paths = rundir.log_files(role, rank)
        cursors = {path: _LogCursor(path, _offset_after_last_line(path)) for path in paths}
        yield from _merged(paths, tail, {path: cursor.offset for path, cursor in cursors.items()})
    watch, ended, held = AllocationWatch(rundir), False, []
    while True:
        look = watch.look()  # status first, then read: everything written before it is read below
        if look.before:  # a new allocation: what the last one wrote goes first
            yield from held
            held = []
            yield from look.before
        for path in rundir.log_files(role, rank):
            cursors.setdefault(path, _LogCursor(path))  # a file that appears later is read from its start
        while True:
            held = list(_merge([held, *(cursor.read_new() for cursor in cursors.values())]))
            if not any(cursor.pending for cursor in cursors.values()):
                break
        if look.over:
            held = list(_merge([held, *(cursor.flush() for cursor in cursors.values())]))
        # A line stamped just before another may reach its file just after it: while the run is live, lines wait
        # until they are HOLD_S old, so that the stream is in the same order as `rlctl logs` gives afterwards.
        ready = len(held) if look.settled else bisect.bisect_right([ts for ts, _, _ in held], time.time() - HOLD_S)
        for entry in held[:ready]:
            if entry[1] == SUPERVISOR:  # a preempted segment's end line is not the run's when another follows
                ended = is_end_line(entry[2])
            yield entry
        held = held[ready:]
        if look.over:
            end = None if ended else end_entry(rundir)
            if end is not None:
                yield end
        yield from look.after
        if look.over:
            return
        time.sleep(poll_s)
