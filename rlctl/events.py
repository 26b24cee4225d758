"""Milestones that code waits on, as one line each in a process's log: `rlctl.event NAME {JSON object}`.

A process writes the line with `emit` (an SSH session begun, the first env step, the first batch sent, the first
update, a resume from a checkpoint or a replay snapshot, a snapshot written, and why it stopped by itself); the
supervisor stamps it like every other line of the log, and people read it there as it is. Tests and benches find
it with `read` / `first`, never by matching sentences.

A log holds whatever a process printed (an env's, a library's, a user's code), so it is parsed as hostile input: a
line is an event only if it has the prefix, a known name and a JSON object with exactly that event's fields, of
their types. Every other line is skipped.

Light (json, re, dataclasses): torch-free collectors, `rlctl.launch.remote` and the CLI path import it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from rlctl.run_logs import parse_log_line

PREFIX = "rlctl.event "
# Longer lines are not events: a real one is a name and a few short fields, a path (PATH_MAX 4096) at most.
MAX_LINE = 16384

# Every event: its fields, all required, of exactly these types (an int is never a bool).
EVENTS: dict[str, dict[str, type]] = {
    # a collector (or central collector) stepped its envs for the first time, with this weights version
    "first_env_step": {"process": str, "version": int},
    # a collector's first batch left it (bench/faults.py times a collector's restart up to here)
    "first_batch_sent": {"process": str, "transitions": int},
    # a learner rank's first update since it started; `update` is its number, counted on from a resume
    "first_update": {"process": str, "update": int},
    # a learner rank continues from a checkpoint: its counters, torchrun's restart count, and the learning rate its
    # optimizer uses from now on (the job's, not the checkpoint's: PBT may have changed it)
    "resumed": {"process": str, "path": str, "update": int, "version": int, "restart": int, "lr": float},
    # a replay shard continues from its snapshot (`size` items held, `inserted` counted on), read in `seconds`
    "snapshot_loaded": {"process": str, "path": str, "size": int, "inserted": int, "seconds": float},
    # a replay shard wrote its snapshot
    "snapshot_written": {"process": str, "size": int, "inserted": int, "seconds": float},
    # an SSH session's far side began (rlctl.launch.remote, before its process starts): its host answered then
    "remote_session": {"host": str},
    # a process stopping by itself: `reason` is one of the EXIT_* codes, `detail` says it for people
    "exit": {"reason": str, "detail": str},
}
EXIT_SUPERVISOR_GONE = "supervisor_gone"  # the local supervisor that started the process died
EXIT_SUPERVISOR_SILENT = "supervisor_silent"  # a remote session heard nothing from the supervisor for too long
# The process cannot start, and would fail the same way on every start (its env cannot be made, code it needs cannot
# be imported): `detail` is the cause on one line. The supervisor fails the run on it at once, without restarts.
EXIT_STARTUP_FAILED = "startup_failed"
STARTUP_FAILED_CODE = 78  # what such a process exits with (sysexits' EX_CONFIG)

_NAME = re.compile(r"[a-z_]{1,40}")


@dataclass(frozen=True)
class Event:
    """One event of a log: its name, the log line's timestamp (None on an unstamped line) and its fields."""

    name: str
    ts: float | None
    fields: MappingProxyType

    def __getitem__(self, key: str):
        return self.fields[key]


def line(name: str, **fields) -> str:
    """The log line for an event (without the supervisor's stamp); ValueError unless it is one `parse` accepts."""
    schema = EVENTS.get(name)
    if schema is None or not _fits(schema, fields):
        raise ValueError(f"not an rlctl event: {name} {fields!r}")
    # ensure_ascii: one line whatever a path holds; allow_nan=False: strict JSON only.
    text = f"{PREFIX}{name} {json.dumps(fields, ensure_ascii=True, allow_nan=False, separators=(', ', ': '))}"
    if len(text) > MAX_LINE:
        raise ValueError(f"event line of {len(text)} characters, more than {MAX_LINE}")
    return text


def emit(name: str, **fields) -> None:
    """Print an event's line to stdout (the process's log), flushed at once: something may be waiting for it."""
    print(line(name, **fields), flush=True)


def parse(text: str) -> Event | None:
    """The event on one log line (stamped by the supervisor or not), or None for anything that is not exactly one."""
    if len(text) > MAX_LINE + 64:  # room for the stamp; checked first, so a huge line costs nothing more
        return None
    ts, body = parse_log_line(text)
    if len(body) > MAX_LINE or not body.startswith(PREFIX):
        return None
    name, _, payload = body[len(PREFIX):].partition(" ")
    schema = EVENTS.get(name) if _NAME.fullmatch(name) else None
    if schema is None:
        return None
    try:
        fields = json.loads(payload, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None
    if not isinstance(fields, dict) or not _fits(schema, fields):
        return None
    return Event(name, ts, MappingProxyType(fields))


def read(log_path: str | Path) -> list[Event]:
    """Every event of a log file, in order; [] while the file does not exist."""
    return list(_events(Path(log_path)))


def first(log_path: str | Path, name: str, after: float | None = None, **match) -> Event | None:
    """The first `name` event of a log stamped after `after` (epoch seconds), whose fields equal `match`; or None."""
    if name not in EVENTS:
        raise ValueError(f"no event is called {name!r}")
    for event in _events(Path(log_path)):
        if event.name != name or any(event.fields.get(k) != v for k, v in match.items()):
            continue
        if after is None or (event.ts is not None and event.ts > after):
            return event
    return None


def _events(path: Path) -> Iterator[Event]:
    try:
        f = open(path, encoding="utf-8", errors="replace", newline="\n")  # lines as the supervisor wrote them
    except FileNotFoundError:
        return
    with f:
        for text in f:
            event = parse(text)
            if event is not None:
                yield event


def _fits(schema: dict[str, type], fields: dict) -> bool:
    """Exactly the schema's keys, each value of exactly its type (so True is no int, 1.0 no int)."""
    return fields.keys() == schema.keys() and all(type(fields[k]) is t for k, t in schema.items())


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")
