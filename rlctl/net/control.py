"""The control channel's one parser: a decoded wire message from a role -> a typed `ControlMessage`, or ControlError.

Everything the supervisor acts on (who sent it, which learner rank, which pid, which figures) passes through
`parse_control` first (a relay's bundle of its host's messages: `parse_bundle`, then `parse_control` for each);
what fails is dropped and counted (`net/dropped`), and the supervisor goes on. Figures are finite numbers (the
parameter digests: short strings); non-finite values are left out (a stop criterion never fires on inf or nan; a
diverging learner says so in its own flag), lists only where a heartbeat carries the episodes that ended.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import msgpack
import numpy as np

from rlctl import metric_names as M
from rlctl.role_names import ROLES, Role

KINDS = frozenset({"hello", "heartbeat"})
BUNDLE = "bundle"  # a relay's messages of its host's processes (rlctl.roles.report_bundle), one frame of them
MAX_BUNDLE_REPORTS = 4096
# ASCII digits only: str.isdigit() also takes "²", which int() then refuses.
SENDER = re.compile(rf"({'|'.join(sorted(ROLES))})-([0-9]{{1,6}})")  # every role of role_names, and only those
MAX_METRICS = 256
MAX_KEY_CHARS = 128
MAX_TEXT_CHARS = 256
MAX_EPISODES = 100_000  # episodes one heartbeat may report (a collector with many envs between heartbeats)
LIST_METRICS = frozenset({M.EPISODE_RETURNS, M.EPISODE_LENGTHS})
TEXT_METRICS = frozenset({M.PARAM_DIGEST, M.DIGEST_CHAIN})  # every other figure is a number


class ControlError(ValueError):
    """A control message that does not match the schema."""


@dataclass(frozen=True)
class ControlMessage:
    """A validated hello or heartbeat."""

    kind: str
    role: str
    rank: int  # the sender's rank (a learner: its torchrun rank)
    pid: int | None = None
    metrics: dict = field(default_factory=dict)  # name -> finite number or short string; LIST_METRICS -> lists
    episodes: dict = field(default_factory=dict)  # EPISODE_RETURNS / EPISODE_LENGTHS -> list[float]

    @property
    def sender(self) -> str:
        """`role-rank`."""
        return f"{self.role}-{self.rank}"


def collector_index(sender: str) -> int:
    """`collector-3` -> 3 (-1 for anything else)."""
    match = SENDER.fullmatch(sender)
    return int(match.group(2)) if match and match.group(1) == Role.COLLECTOR else -1  # ASCII digits: never "²"


def _int(value: object, what: str, low: int = 0, high: int = 1 << 31) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise ControlError(f"{what} is not an integer in [{low}, {high})")
    return value


def _finite_list(value: object, name: str) -> list[float]:
    if not isinstance(value, list) or len(value) > MAX_EPISODES:
        raise ControlError(f"{name} is not a list of at most {MAX_EPISODES} numbers")
    out = []
    for x in value:
        if not isinstance(x, (int, float)) or isinstance(x, bool):
            raise ControlError(f"{name} holds a non-number")
        if math.isfinite(x):
            out.append(float(x))
    return out


def parse_metrics(raw: object) -> tuple[dict, dict]:
    """(figures, episode lists) from a heartbeat's `metrics` map; non-finite numbers are left out."""
    if not isinstance(raw, dict) or len(raw) > MAX_METRICS:
        raise ControlError(f"metrics is not a map of at most {MAX_METRICS} entries")
    figures, episodes = {}, {}
    for key, value in raw.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS or not key.isprintable():
            raise ControlError("a metric name is not a short printable string")
        if key in LIST_METRICS:
            episodes[key] = _finite_list(value, key)
        elif isinstance(value, bool):
            figures[key] = int(value)
        elif isinstance(value, int):
            if abs(value) >= 1 << 63:
                raise ControlError(f"{key} is out of range")
            figures[key] = value
        elif isinstance(value, float):
            if math.isfinite(value):
                figures[key] = value
        elif isinstance(value, str) and key in TEXT_METRICS:
            if len(value) > MAX_TEXT_CHARS:
                raise ControlError(f"{key} is a string over {MAX_TEXT_CHARS} characters")
            figures[key] = value
        else:
            raise ControlError(f"{key} is not a number")
    return figures, episodes


def parse_control(kind: str, sender: str, meta: object) -> ControlMessage:
    """Validate one message from a role; ControlError says what is wrong."""
    if kind not in KINDS:
        raise ControlError(f"unknown kind {kind!r}")
    match = SENDER.fullmatch(sender)
    if match is None:
        raise ControlError(f"sender {sender!r} is not role-rank")
    if not isinstance(meta, dict):
        raise ControlError("meta is not a map")
    role, rank = match.group(1), int(match.group(2))
    pid = _int(meta["pid"], "pid", 1, 1 << 32) if "pid" in meta else None
    if "rank" in meta and _int(meta["rank"], "rank", 0, 1 << 20) != rank:
        raise ControlError(f"rank {meta['rank']} does not match sender {sender}")
    figures, episodes = parse_metrics(meta.get("metrics", {})) if kind == "heartbeat" else ({}, {})
    if "rank" in figures and figures["rank"] != rank:
        raise ControlError(f"metrics rank {figures['rank']} does not match sender {sender}")
    return ControlMessage(kind, role, rank, pid, figures, episodes)


def parse_bundle(arrays: dict[str, np.ndarray]) -> tuple[list[tuple[str, str, object]], int]:
    """A relay's bundle -> ([(kind, sender, meta)] to parse one by one, entries dropped for their shape). The
    entries are a msgpack list in the `reports` frame (uint8): a header holds at most 64 KiB, a frame up to the
    control sockets' 1 MiB. ControlError when the frame is not such a list."""
    frame = arrays.get("reports")
    if frame is None or frame.dtype != np.uint8 or frame.ndim != 1:
        raise ControlError("a bundle without its reports frame")
    try:
        # No bins or extensions: only the types a heartbeat holds (what parse_control then checks).
        reports = msgpack.unpackb(frame.data, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ControlError(f"undecodable bundle: {type(exc).__name__}") from None
    if not isinstance(reports, list) or len(reports) > MAX_BUNDLE_REPORTS:
        raise ControlError(f"a bundle is not a list of at most {MAX_BUNDLE_REPORTS} reports")
    good = [tuple(r) for r in reports if isinstance(r, list) and len(r) == 3 and isinstance(r[0], str)
            and isinstance(r[1], str)]
    return good, len(reports) - len(good)
