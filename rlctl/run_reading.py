"""A run's state.json read truthfully: the status its supervisor can no longer correct (`lost`), the processes of a
lost run shown lost rather than as their last word, and times over every segment of a resumed run (`started` is the
first segment's, `elapsed` adds up all of them).

On the fast CLI path (`rlctl status`, `watch`, `compare`): standard library only.
"""

from __future__ import annotations

import time

from rlctl.liveness import group_alive
from rlctl.rundir import OVER_STATES, status_of
from rlctl.run_status import RunStatus

# Process states that stay what they were when the run is lost: the supervisor saw these ends itself.
SETTLED_PROCESS_STATES = frozenset({RunStatus.STOPPED, RunStatus.FAILED, RunStatus.LOST})


def real_number(x: object) -> float | None:
    """x as a float if it is a real number (not bool, None or a string), else None: state.json is read as hostile."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def job_of_run_id(run_id: str) -> str:
    """Job name part of a run id ("apex-cartpole-20261129-220111" -> "apex-cartpole")."""
    parts = run_id.split("-")
    # Drop "-YYYYmmdd-HHMMSS" and an optional collision suffix "-N".
    for drop in (3, 2):
        if len(parts) > drop and parts[-drop].isdigit() and len(parts[-drop]) == 8:
            return "-".join(parts[:-drop])
    return run_id


def segments(state: dict) -> list[dict]:
    """The run's segments, oldest first, each {started_at, ended_at} (ended_at None while it runs, or where its
    supervisor died); a state.json without a list gives its own times as one segment."""
    listed = state.get("segments") if isinstance(state, dict) else None
    if isinstance(listed, list):
        out = [{"started_at": real_number(s.get("started_at")), "ended_at": real_number(s.get("ended_at"))}
               for s in listed if isinstance(s, dict)]
        out = [s for s in out if s["started_at"] is not None]
        if out:
            return out
    start = real_number(state.get("started_at")) if isinstance(state, dict) else None
    return [] if start is None else [{"started_at": start, "ended_at": real_number(state.get("ended_at"))}]


def closed_segments(state: dict) -> list[dict]:
    """The segments of a run that is over, each with an end: a segment whose supervisor died ends at the run's last
    sign of life (updated_at) if it is the last, else where it started (nothing tells how long it ran)."""
    listed = segments(state)
    # Not the run's ended_at: `rlctl stop` of a lost run sets that when it ends the orphans, maybe days later.
    last_word = real_number(state.get("updated_at")) or real_number(state.get("ended_at"))
    out = []
    for i, s in enumerate(listed):
        end = s["ended_at"]
        if end is None:
            end = last_word if i == len(listed) - 1 and last_word is not None else s["started_at"]
        out.append({"started_at": s["started_at"], "ended_at": max(end, s["started_at"])})
    return out


def first_started(state: dict) -> float | None:
    """When the run began: its first segment's start."""
    listed = segments(state)
    return listed[0]["started_at"] if listed else None


def elapsed_s(state: dict, now: float | None = None) -> float | None:
    """Seconds the run has been going, every segment added up: the last one until now while it runs, until its last
    sign of life (updated_at) once it is over without an end (lost)."""
    listed = segments(state)
    if not listed:
        return None
    over = status_of(state) in OVER_STATES
    now = time.time() if now is None else now
    total = 0.0
    for i, s in enumerate(listed):
        end = s["ended_at"]
        if end is None:
            if i < len(listed) - 1:  # an earlier segment whose supervisor died: nothing tells how long it ran
                end = s["started_at"]
            else:
                end = (real_number(state.get("updated_at")) or s["started_at"]) if over else now
        total += max(0.0, end - s["started_at"])
    return total


def live_processes(state: dict) -> list[str]:
    """Names of the run's local processes whose process group still lives on this host."""
    procs = state.get("processes") if isinstance(state, dict) else None
    return [str(p.get("name")) for p in (procs if isinstance(procs, list) else [])
            if isinstance(p, dict) and not p.get("remote") and isinstance(p.get("pgid"), int) and p["pgid"] > 1
            and group_alive(p["pgid"])]


def as_read(state: dict | None, now: float | None = None) -> dict:
    """The state as the views show it: the effective status (a preempted run that Slurm holds pending again:
    queued), a lost run's unsettled processes `lost`, `started_at` the first segment's and `elapsed_s` over every
    segment."""
    state = dict(state) if isinstance(state, dict) else {}
    status = status_of(state) if state else RunStatus.UNKNOWN
    state["status"] = status
    if status == RunStatus.LOST and isinstance(state.get("processes"), list):
        state["processes"] = [{**p, "state": RunStatus.LOST} if isinstance(p, dict) and
                              p.get("state") not in SETTLED_PROCESS_STATES else p for p in state["processes"]]
    preemptions = state.get("preemptions") if isinstance(state.get("preemptions"), list) else []
    last = preemptions[-1] if preemptions and isinstance(preemptions[-1], dict) else {}
    if status == RunStatus.PREEMPTED and last.get("requeued") is True:
        from rlctl.slurm_queue import job_pending

        if job_pending(state.get("slurm_job_id")):
            state["status"] = RunStatus.QUEUED  # requeued, waiting for its next allocation
    state["started_at"] = first_started(state)
    state["elapsed_s"] = elapsed_s(state, now)
    return state
