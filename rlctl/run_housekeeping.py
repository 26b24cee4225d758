"""`rlctl rm` and `rlctl prune`: removing run directories, never one whose run still lives.

A run may go once it is over (finished, stopped, failed, or lost with none of its local processes left), or when
it was made but never started (`created` for over a minute, no supervisor). A Slurm batch run that is queued, or
preempted with its job requeued, stays while Slurm may still start it (unless forced: `rlctl rm --force`). The run's
lock is held while it goes,
so a resume or stop cannot start in the middle. Only the local directory goes: a remote host's private folder of
the run is cleaned by the run's own shutdown (or `rlctl stop`).

On the fast CLI path: standard library only.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass

from rlctl import metric_names as M
from rlctl.rundir import OVER_STATES, RunBusy, RunDir, remove_weight_board, status_of
from rlctl.run_reading import job_of_run_id, live_processes, real_number
from rlctl.run_status import RunStatus
from rlctl.slurm_queue import resuming_job

NEVER_STARTED_AFTER_S = 60.0  # a run still `created` this long after it was written never got a supervisor
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class RunInUse(Exception):
    """The run cannot be removed now (the message says why and what to do)."""


def parse_age(text: str) -> float:
    """"7d", "12h", "30m", "45s", "2w" -> seconds; ValueError naming the form otherwise."""
    match = _AGE_RE.match(text or "")
    if match is None:
        raise ValueError(f"{text!r} is not an age: a number and a unit, e.g. 7d, 12h, 30m, 45s, 2w")
    return float(match[1]) * _UNIT_S[match[2]]


def refusal(rundir: RunDir, state: dict | None, now: float | None = None, force: bool = False) -> str | None:
    """Why the run may not be removed now, or None when it may; `force`: even though a pending Slurm job will start
    it (again), without asking Slurm."""
    now = time.time() if now is None else now
    status = status_of(state)
    if status == RunStatus.UNKNOWN:
        return None  # no state.json: nothing was ever supervised from it
    if status in (RunStatus.QUEUED, RunStatus.PREEMPTED):
        job = None if force else resuming_job(state)
        if job is not None:
            return (f"{rundir.run_id} is {status}: it will {'resume' if status == RunStatus.PREEMPTED else 'start'} "
                    f"in its pending Slurm job {job}; end it with rlctl stop {rundir.run_id} (or scancel {job}), "
                    "or remove it anyway with --force")
        if status == RunStatus.QUEUED and state.get("slurm_job_id") is not None:
            return None  # forced, or Slurm has ended its job: it never starts
    if status == RunStatus.CREATED and state.get("supervisor_pid") is None:
        try:  # when state.json was written (a resumed run's started_at is its first segment's)
            written = rundir.state_json.stat().st_mtime
        except OSError:
            written = 0.0
        if now - written >= NEVER_STARTED_AFTER_S:
            return None
    if status not in OVER_STATES:
        return f"{rundir.run_id} is {status}; stop it first: rlctl stop {rundir.run_id}"
    alive = live_processes(state)
    if alive:
        return (f"processes of {rundir.run_id} still run ({', '.join(alive)}); end them first: "
                f"rlctl stop {rundir.run_id}")
    return None


def remove_run(rundir: RunDir, force: bool = False) -> None:
    """Remove the run's directory (and a weight board a killed learner left); RunInUse if it still lives or another
    command is changing it (`force`: see refusal)."""
    try:
        lock = rundir.lock(wait_s=1.0)
    except RunBusy as exc:
        raise RunInUse(str(exc)) from None
    with lock:
        why = refusal(rundir, rundir.read_state(), force=force)
        if why is not None:
            raise RunInUse(why)
        remove_weight_board(rundir.read_plan() or {})
        shutil.rmtree(rundir.path)


def final_return(state: dict) -> float | None:
    """How well a run ended: its last evaluation's mean return, else its mean training return."""
    metrics = state.get("metrics") if isinstance(state.get("metrics"), dict) else {}
    value = real_number(metrics.get(M.EVAL_RETURN_MEAN))
    return value if value is not None else real_number(metrics.get(M.EPISODE_RETURN_MEAN))


@dataclass(frozen=True)
class Candidate:
    """A run `rlctl prune` looks at: its directory, state and when it last did anything."""

    rundir: RunDir
    state: dict
    last_active: float

    @property
    def job(self) -> str:
        """The run's job name (runs of one job compete under --keep-best)."""
        return str(self.state.get("job") or job_of_run_id(self.rundir.run_id))


def _last_active(rundir: RunDir, state: dict) -> float:
    """When the run was last doing anything: its end, its last state write, its start, or the folder's mtime."""
    for key in ("ended_at", "updated_at", "started_at"):
        value = real_number(state.get(key))
        if value is not None:
            return value
    try:
        return rundir.path.stat().st_mtime
    except OSError:
        return 0.0


def to_prune(runs: list[RunDir], older_than_s: float, keep_best: bool,
             now: float | None = None) -> tuple[list[RunDir], list[RunDir]]:
    """(the runs `rlctl prune` removes, the idle runs it keeps because a pending Slurm job will start them again):
    idle longer than `older_than_s` and removable, except (keep_best) the run of each job name with the best final
    return, however old."""
    now = time.time() if now is None else now
    seen = [Candidate(r, s, _last_active(r, s)) for r in runs for s in [r.read_state() or {}]]
    kept: set[RunDir] = set()
    if keep_best:
        best: dict[str, tuple[float, Candidate]] = {}
        for c in seen:
            value = final_return(c.state)
            if value is not None and (c.job not in best or value > best[c.job][0]):
                best[c.job] = (value, c)
        kept = {c.rundir for _, c in best.values()}
    chosen, awaiting = [], []
    for c in seen:
        if c.rundir in kept or now - c.last_active <= older_than_s:
            continue
        if resuming_job(c.state) is not None:
            awaiting.append(c.rundir)
        elif refusal(c.rundir, c.state, now, force=True) is None:  # Slurm asked already
            chosen.append(c.rundir)
    return chosen, awaiting
