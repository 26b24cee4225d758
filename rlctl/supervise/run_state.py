"""The run's own state and its writer: state.json (atomically, twice a second), with a row per process and per host.

`rlctl status`, `logs` and `stop` read what this writes; the live table and progress lines are drawn from the same
document (the `display` callback).
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from rlctl import metric_names as M
from rlctl.supervise.restart_policy import SSH_FAILED, ProcState
from rlctl.liveness import process_start_time
from rlctl.rundir import RunDir
from rlctl.run_status import RunStatus
from rlctl.role_names import Role

if TYPE_CHECKING:
    from rlctl.supervise.metrics_sink import MetricsSink
    from rlctl.launch.plan import LaunchPlan
    from rlctl.supervise.process_table import ProcessHandle, ProcessTable
    from rlctl.job.spec import JobSpec

RATE_KEYS = {  # the one figure shown per process in the live table
    Role.COLLECTOR: (M.ENV_STEPS_PER_S, "env steps/s"),
    Role.LEARNER: (M.SAMPLES_PER_S, "samples/s"),
    Role.REPLAY_SHARD: (M.REPLAY_INSERT_PER_S, "inserts/s"),
    Role.EVALUATOR: (M.EVAL_RETURN_MEAN, "eval return"),
    Role.INFERENCE: (M.INFERENCE_REQUESTS_PER_S, "requests/s"),
    Role.RELAY: (M.RELAY_VERSIONS_PER_S, "versions/s"),
}

RATE_WINDOW_S = 10.0  # a process's rate is the mean of its heartbeats' over this long: no blink to 0.0 between them


def note_rate(h: ProcessHandle, now: float) -> None:
    """Keep the rate of `h`'s latest heartbeat (its role's RATE_KEYS figure) for the row's window; samples past
    the window are let go (state.json reads every process's twice a second: 1,000 collectors' full deques were
    the largest part of writing it), the newest is always kept."""
    value = h.metrics.get(RATE_KEYS.get(h.spec.role, ("", ""))[0])
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        samples = h.rate_samples
        while samples and now - samples[0][0] > RATE_WINDOW_S:
            samples.popleft()
        samples.append((now, float(value)))


def shown_rate(h: ProcessHandle, now: float) -> float | None:
    """The rate a row shows: the mean over the last RATE_WINDOW_S of heartbeats (the evaluator's return: its
    latest, being no rate); None before the first."""
    if not h.rate_samples:
        return None
    if h.spec.role == Role.EVALUATOR:
        return h.rate_samples[-1][1]
    recent = [v for t, v in h.rate_samples if now - t <= RATE_WINDOW_S] or [h.rate_samples[-1][1]]
    return sum(recent) / len(recent)


@dataclass(frozen=True)
class RunEnd:
    """Why a run ends: its status, the reason shown, and (when a process failed it) what state.json says of it."""

    status: str
    reason: str
    failure: dict | None = None
    stopped_by: dict | None = None  # the [job.stop] criterion met, with its figures (StopProgress.record)
    head_lost: str | None = None  # an elastic run's head host, lost: the run goes on in a next segment


def process_row(h: ProcessHandle) -> dict:
    """One process's entry in state.json."""
    _, unit = RATE_KEYS.get(h.spec.role, ("", ""))
    return {
        "name": h.spec.name, "role": h.spec.role, "rank": h.spec.rank, "host": h.spec.host,
        "pid": h.pid, "pgid": h.pid, "start_time": h.start_time, "state": h.life.state.shown,
        "restarts": h.life.restarts + int(h.metrics.get(M.LEARNER_RESTARTS, 0) or 0),
        "exit_code": h.exit_code, "rate": shown_rate(h, time.time()), "rate_unit": unit,
        "last_heartbeat": h.last_heartbeat, "remote": h.spec.remote, "note": h.life.note,
    }


def host_state(host: dict, mine: list[ProcessHandle], lost_nodes: set[str]) -> str:
    """ok, lost, stopped, or k/n up."""
    running = sum(h.life.state.shown == ProcState.RUNNING.value for h in mine)
    if host["name"] in lost_nodes or (
            not host["local"] and running == 0 and any(h.last_exit == SSH_FAILED for h in mine)):
        return RunStatus.LOST
    if running == len(mine):
        return "ok"
    if all(h.life.state is ProcState.STOPPED for h in mine):
        return RunStatus.STOPPED
    return f"{running}/{len(mine)} up"


class RunState:
    """How the run stands (status, exit reason, failure, segments) and its writer: state.json and the display."""

    def __init__(self, spec: JobSpec, plan: LaunchPlan, rundir: RunDir, table: ProcessTable, sink: MetricsSink,
                 resumed: dict | None = None, display: Callable[[dict], None] | None = None):
        self.spec, self.plan, self.rundir, self.table, self.sink = spec, plan, rundir, table, sink
        self.display = display  # callable(state) for the live table / progress line, or None
        self.status = RunStatus.CREATED
        self.exit_reason: str | None = None  # for people; code reads stopped_by and failure
        self.stopped_by: dict | None = None  # the [job.stop] criterion met (StopProgress.record)
        self.failure: dict | None = None
        self.segment_started_at = time.time()  # this segment's (this supervisor's) start
        self.ended_at: float | None = None
        # A resumed run continues the segments before it (each closed by `run --resume`): the run started with the
        # first, and its elapsed time (the wall_s budget too) adds up all of them.
        self.segments: list[dict] = [s for s in (resumed or {}).get("segments", []) if isinstance(s, dict)]
        # An elastic run's head hosts lost so far, each with the host that took its place (supervise.head_failover).
        self.head_moves: list[dict] = [m for m in (resumed or {}).get("head_moves", []) if isinstance(m, dict)]
        self.started_at = self.segments[0]["started_at"] if self.segments else self.segment_started_at
        self.elapsed_before = sum(max(0.0, s["ended_at"] - s["started_at"]) for s in self.segments)
        self.remote_cleanup: dict[str, dict] = {}  # host -> what shutdown found and fetched there
        self.own_start = process_start_time(os.getpid())  # with the pid: `rlctl stop` never signals a reused pid
        self.annotations: Callable[[], dict] = dict  # more keys of state.json (the supervisor's preemption record)

    def end(self, ending: RunEnd) -> None:
        """The run ends as `ending` says."""
        self.status, self.exit_reason = ending.status, ending.reason
        if ending.stopped_by is not None:
            self.stopped_by = ending.stopped_by
        if ending.failure is not None:
            self.failure = ending.failure

    def fail_self(self, exc: BaseException) -> None:
        """Record a fault of the supervisor's own (a full disk, a bug) as the run's failure, once."""
        traceback.print_exception(exc, file=sys.stderr)
        # A failed run winding down is "stopping" on disk, with its first failure kept.
        if self.status != RunStatus.FAILED and self.failure is None:
            self.exit_reason = f"supervisor error: {type(exc).__name__}: {exc}"
            self.failure = {"process": "supervisor", "error": f"{type(exc).__name__}: {exc}"}
        self.status = RunStatus.FAILED

    def document(self) -> dict:
        """The state.json document."""
        hub = self.sink.hub
        return {
            "run_id": self.plan.run_id, "job": self.plan.job, "algorithm": self.plan.algorithm,
            "status": self.status, "supervisor_pid": os.getpid(), "supervisor_start": self.own_start,
            "supervisor_host": socket.gethostname(), "slurm_job_id": self.table.slurm_job,
            "started_at": self.started_at,
            "ended_at": self.ended_at, "updated_at": time.time(), "exit_reason": self.exit_reason,
            "stopped_by": self.stopped_by, "failure": self.failure, "hosts": [h["name"] for h in self.plan.hosts], "host_rows": self.host_rows(),
            "processes": [process_row(h) for h in self.table.handles], "metrics": self.sink.figures(),
            "learner_ranks": {str(r): v for r, v in sorted(hub.learner_ranks.items())},
            "learner_worlds": [[round(t, 3), w] for t, w in hub.learner_worlds],
            "segments": self.segments + [{"started_at": self.segment_started_at, "ended_at": self.ended_at}],
            "head_moves": self.head_moves,
            "stop": self.spec.job.stop.model_dump(), "episodes_seen": hub.episodes,
            "return_history": list(self.sink.return_history),
            "progress_history": list(self.sink.progress_history),
            **self.annotations(),
        }

    def host_rows(self) -> list[dict]:
        """Per host: its processes, how many run, restarts, sessions lost, its state (ok, lost, stopped, k/n up), and
        for an SSH host that was lost, when, where its processes went and when it came back (`loss`, `note`)."""
        by_host: dict[str, list[ProcessHandle]] = {}  # one walk over the processes, not one per host
        for h in self.table.handles:
            # A weights relay lost with its host is no longer its host's: the processes it served moved away.
            if not (h.spec.role == Role.RELAY and h.life.state is ProcState.LOST):
                by_host.setdefault(h.spec.host, []).append(h)
        rows = []
        for host in self.plan.hosts:
            mine = by_host.get(host["name"], [])
            loss = self.table.watch.losses.get(host["name"])
            rows.append({"name": host["name"], "remote": not host["local"], "via": host.get("via"),
                         "state": host_state(host, mine, self.table.lost_nodes), "processes": len(mine),
                         "running": sum(h.life.state.shown == ProcState.RUNNING.value for h in mine),
                         "restarts": sum(h.life.restarts for h in mine),
                         "lost_sessions": sum(h.lost_sessions for h in mine),
                         "cleanup": self.remote_cleanup.get(host["name"]),
                         "loss": loss.record() if loss else None, "note": loss.note() if loss else None})
        return rows

    def publish(self) -> dict:
        """Write state.json and show it."""
        state = self.document()
        self.rundir.write_state(state)
        if self.display is not None:
            self.display(state)
        return state

    def publish_final(self) -> None:
        """The last state.json; on a full disk, in place over the old one (whose blocks that frees), so `status`
        still says how the run ended."""
        state = self.document()
        try:
            self.rundir.write_state(state)
        except OSError as exc:
            self.fail_self(exc)
            state = self.document()
            try:
                self.rundir.write_state(state, in_place=True)
            except OSError as again:
                print(f"rlctl: could not write {self.rundir.state_json}: {again}", file=sys.stderr)
        if self.display is not None:
            self.display(state)
        if self.status == RunStatus.FAILED and self.failure and self.failure.get("process") == "supervisor":
            print(f"rlctl: run {self.plan.run_id} failed: {self.exit_reason}", file=sys.stderr)
