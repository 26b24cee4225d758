"""A run's process logs (logs/<role>-<rank>.log) read as one stream: lines merged by their timestamps across files,
the last N of them, or followed as they grow.

On the fast CLI path (`rlctl logs`): standard library only.
"""

from __future__ import annotations

import heapq
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Iterator

from rlctl.rundir import OVER_STATES, RunDir

_FOLLOW_CHUNK = 8 << 20  # bytes read per file per round, so a huge backlog cannot blow up memory

LogEntry = tuple[float, str, str]  # (timestamp, source such as "collector-0", text)


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


def _read_lines(path: Path, tail: int | None = None) -> list[str]:
    """All lines of a file, or only its last `tail`, reading backwards so big logs stay cheap."""
    with open(path, "rb") as f:
        if tail is None:
            data = f.read()
        else:
            pos = f.seek(0, os.SEEK_END)
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
    """Entries of several files merged by timestamp (stable: ties keep file order)."""
    return heapq.merge(*per_file, key=lambda entry: entry[0])


def merged_log_lines(
    rundir: RunDir, role: str | None = None, rank: int | None = None, tail: int | None = None
) -> list[LogEntry]:
    """(timestamp, source, text) of the run's log lines, ordered by time across files; last `tail` only if given."""
    per_file = []
    for path in rundir.log_files(role, rank):
        try:
            lines = _read_lines(path, tail)
        except OSError:
            continue
        per_file.append(_to_entries(lines, path.stem, None, _mtime(path)))
    merged = list(_merge(per_file))
    if tail is not None:
        merged = merged[-tail:] if tail > 0 else []
    return merged


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
    start_at_end: bool = False,
) -> Iterator[LogEntry]:
    """Yield new log lines as they appear (also from files created later); stop when the run is over.

    Only complete lines are yielded while the run is live. Each poll round yields the new lines of
    all files merged by timestamp. Returns once the run's effective status is terminal or lost and
    every file has been read to its end (then unfinished last lines are yielded too).
    """
    cursors: dict[Path, _LogCursor] = {}
    first_round = True
    while True:
        # Status first, then read: everything written before the run ended is read below.
        over = rundir.effective_status() in OVER_STATES
        for path in rundir.log_files(role, rank):
            if path not in cursors:
                # Files existing when following starts may be skipped; files appearing later never are.
                offset = _offset_after_last_line(path) if (start_at_end and first_round) else 0
                cursors[path] = _LogCursor(path, offset)
        first_round = False
        while True:
            yield from _merge([cursor.read_new() for cursor in cursors.values()])
            if not any(cursor.pending for cursor in cursors.values()):
                break
        if over:
            yield from _merge([cursor.flush() for cursor in cursors.values()])
            return
        time.sleep(poll_s)
