"""A large role as one row of the processes table: a job of 1,000 collectors would otherwise draw 1,000 rows in the
live table and `rlctl status`. `rlctl status RUN --all` still lists every process.

Pure data over state.json's process rows (dicts); views/console.py draws it.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass

from rlctl.run_reading import real_number
from rlctl.run_status import RunStatus

FOLD_OVER = 16  # a role of more processes than this is folded into one row
RUNNING = RunStatus.RUNNING  # a process's state as state.json shows it (ProcState.shown): the same word


@dataclass(frozen=True)
class RoleSummary:
    """One role's processes in one row: how many in each state, where, their restarts, rates and heartbeats."""

    role: str
    count: int
    states: tuple[tuple[str, int], ...]  # (state, processes), running first, then the most common
    hosts: tuple[str, ...]  # distinct, in the order the processes name them
    ranks: tuple[int, ...]  # sorted
    restarts: int
    rates: tuple[float, ...]  # of the running processes that report one
    rate_unit: str
    oldest_heartbeat: float | None  # epoch seconds: the longest any of them has been silent

    @property
    def all_running(self) -> bool:
        """Every process of the role is running."""
        return self.states == ((RUNNING, self.count),)

    def rate_figures(self) -> tuple[float, float, float] | None:
        """Sum, minimum and median of the running processes' rates (None when none reports one)."""
        if not self.rates:
            return None
        return math.fsum(self.rates), min(self.rates), statistics.median(self.rates)


def _number(x: object) -> float | None:
    """A finite real number from a JSON value (state.json is read as untrusted), else None."""
    value = real_number(x)
    return value if value is not None and math.isfinite(value) else None


def summarise(role: str, procs: list[dict]) -> RoleSummary:
    """The summary of one role's process rows."""
    states = Counter(str(p.get("state") or RunStatus.UNKNOWN) for p in procs)
    ordered = sorted(states.items(), key=lambda kv: (kv[0] != RUNNING, -kv[1], kv[0]))
    hosts = tuple(dict.fromkeys(str(p.get("host") or "-") for p in procs))
    ranks = tuple(sorted(p["rank"] for p in procs if isinstance(p.get("rank"), int) and not isinstance(p["rank"], bool)))
    restarts = sum(int(n) for n in (_number(p.get("restarts")) for p in procs) if n is not None)
    running = [p for p in procs if p.get("state") == RUNNING]
    rates = tuple(r for r in (_number(p.get("rate")) for p in running) if r is not None)
    units = [str(p["rate_unit"]) for p in running if p.get("rate_unit")]
    beats = [b for b in (_number(p.get("last_heartbeat")) for p in procs) if b is not None]
    return RoleSummary(role, len(procs), tuple(ordered), hosts, ranks, restarts, rates, units[0] if units else "",
                       min(beats) if beats else None)


def fold_roles(procs: list[dict], fold_over: int = FOLD_OVER) -> list[dict | RoleSummary]:
    """The processes in their order, except that a role of more than `fold_over` becomes its summary, in its first
    process's place, followed by those of its processes that are not running (each needs a look: by name)."""
    by_role: dict[str, list[dict]] = {}
    for p in procs:
        by_role.setdefault(str(p.get("role") or "-"), []).append(p)
    out: list[dict | RoleSummary] = []
    for p in procs:
        role = str(p.get("role") or "-")
        members = by_role[role]
        if len(members) <= fold_over:
            out.append(p)
        elif p is members[0]:
            out.append(summarise(role, members))
            out.extend(m for m in members if m.get("state") != RUNNING)
    return out
