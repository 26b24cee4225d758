"""`rlctl run --resume`: which job a stopped, failed, lost or finished run continues with, and from which counters.

The learner and replay shards continue by themselves from what the run directory holds (the newest checkpoint,
each shard's snapshot); this module decides what may change between segments and carries the run-level counters
(env steps, episodes, TensorBoard's step axis) over to the next supervisor.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from rlctl import metric_names as M
from rlctl.rundir import OVER_STATES, TERMINAL_STATES, RunBusy, RunDir, RunLock, resolve_run, runs_root, status_of
from rlctl.run_reading import closed_segments, live_processes
from rlctl.run_status import RunStatus
from rlctl.job.load import load_job, validate_job
from rlctl.job.resolved import host_secrets, resolved_dict, with_host_secrets
from rlctl.job.spec import JobSpec

# What a resumed run may change: its stop criteria, how many of each process run, and where.
RESUMABLE_KEYS = ("job.stop.", "topology.collectors", "topology.learner_procs", "topology.replay_shards",
                  "topology.evaluator", "env.envs_per_collector", "hosts")
STOP_CRITERIA = ("eval_return", "train_return", "env_steps")  # what --until replaces (wall_s stays unless given)


class ResumeRefused(Exception):
    """The run cannot be resumed as asked (the message says why)."""


class RunAlreadyOver(Exception):
    """A batch job started again for a run that had met a stop target by the end of its last allocation (its stop
    took the run past it): recorded finished, nothing to run (the message says which target)."""


def changed_keys(old: object, new: object, prefix: str = "") -> list[str]:
    """Dotted key paths where two resolved job dicts differ (lists compare whole)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += changed_keys(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if _same(old, new) else [prefix.rstrip(".")]


def _same(old: object, new: object) -> bool:
    """Equal values, nan equal to nan (an env kwarg may be nan, and the same job must compare the same)."""
    if isinstance(old, float) and isinstance(new, float) and old != old and new != new:
        return True
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(old, new))
    return old == new


def refused_changes(old: JobSpec, new: JobSpec) -> list[str]:
    """The changed key paths that a resumed run may not change."""
    return [k for k in changed_keys(resolved_dict(old), resolved_dict(new))
            if not any(k == allowed or k.startswith(allowed) for allowed in RESUMABLE_KEYS)]


def parse_until(items: list[str]) -> dict[str, object]:
    """`--until key=value` items -> new [job.stop] entries; ResumeRefused naming a bad item."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise ResumeRefused(f"--until {item!r}: expected KEY=VALUE, e.g. env_steps=500000")
        try:
            value: object = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise ResumeRefused(f"--until {item!r}: {text!r} is not a number") from None
        out[key] = value
    return out


def job_for_resume(old: JobSpec, new: JobSpec | None, until: dict[str, object], source: str) -> JobSpec:
    """The job the next segment runs: `new` (only resumable keys changed) or the old one, with `until`'s criteria
    replacing the stop criteria. JobFileError for invalid values, ResumeRefused for refused changes."""
    spec = new or old
    refused = refused_changes(old, spec)
    if refused:
        raise ResumeRefused(f"{source} changes {', '.join(refused)}; a resumed run may change only its stop "
                            f"criteria ([job.stop]), topology counts and hosts")
    if not until:
        return spec
    data = resolved_dict(spec)  # masks hosts[].env: they go back in below, or the masks would reach the processes
    stop = data["job"]["stop"]
    for key in STOP_CRITERIA:
        stop[key] = None
    stop.update(until)
    return with_host_secrets(validate_job(data, "--until"), host_secrets(spec))


def previous_segment(rundir: RunDir, supervisor_gone: bool = False, ended_here: bool = False) -> dict:
    """What the next supervisor continues from: env steps, episodes, the segments so far (each closed: a lost one
    ends at its last state write), its preemptions and how the run stands. ResumeRefused while the run (or a
    process of it) is still alive; `supervisor_gone`: its supervisor is known to be gone, whatever state.json says
    (Slurm started its batch job again), so the run is lost unless it said how it ended; `ended_here`: this
    process's supervisor ended the segment to start the next itself (a head move: the run says starting)."""
    state = rundir.read_state()
    if state is None:
        raise ResumeRefused(f"{rundir.run_id} has no readable state.json")
    status = status_of(state)
    if supervisor_gone and status not in OVER_STATES:
        status = RunStatus.LOST
    if status not in OVER_STATES and not (ended_here and status == RunStatus.STARTING):
        raise ResumeRefused(f"{rundir.run_id} is {status} (supervisor pid {state.get('supervisor_pid')}); "
                            f"stop it first: rlctl stop {rundir.run_id}")
    alive = live_processes(state)
    if alive:
        raise ResumeRefused(f"processes of {rundir.run_id} are still running: {', '.join(alive)}")
    metrics = state.get("metrics") if isinstance(state.get("metrics"), dict) else {}
    return {"env_steps": _count(metrics.get(M.ENV_STEPS)), "episodes": _count(metrics.get(M.EPISODES)),
            "segments": closed_segments(state), "status": status, "exit_reason": state.get("exit_reason"),
            "best_return": metrics.get(M.EPISODE_RETURN_BEST), "preemptions": _records(state.get("preemptions")),
            "head_moves": _records(state.get("head_moves"))}


def _records(value: object) -> list[dict]:
    """A list of records of state.json (preemptions, head moves), whatever is not one left out."""
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def _count(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) and value >= 0 else 0


def refuse_spent_targets(rundir: RunDir, old: JobSpec, spec: JobSpec, resumed: dict, until: dict) -> None:
    """ResumeRefused when the next segment would have nothing to do: a finished run resumed without a new target
    (no --until, no changed [job.stop]), or an env-step or wall-time target the run has already reached (wall time
    counts every segment)."""
    run = rundir.run_id
    if resumed["status"] == RunStatus.FINISHED and not until and spec.job.stop == old.job.stop:
        raise ResumeRefused(f"{run} finished ({resumed.get('exit_reason')}); to train on, give it a new target: "
                            f"rlctl run --resume {run} --until env_steps=N (or eval_return=, train_return=, wall_s=)")
    spent = spent_target(spec, resumed)
    if spent:
        criterion, value, target, unit = spent
        raise ResumeRefused(f"{run} has already reached its {criterion} target ({value:,.0f}{unit} of "
                            f"{target:,.0f}{unit}; wall time counts every segment): it would stop at once; give a "
                            f"higher one: rlctl run --resume {run} --until {criterion}=N")


def spent_target(spec: JobSpec, resumed: dict) -> tuple[str, float, float, str] | None:
    """(criterion, value, target, unit) of the first env-step or wall-time target the run has already reached (wall
    time counts every segment), by the supervisor's own rule (stop_progress); None when there is none."""
    stop = spec.job.stop
    elapsed = sum(s["ended_at"] - s["started_at"] for s in resumed["segments"])
    for criterion, value, target, unit in (("env_steps", resumed["env_steps"], stop.env_steps, ""),
                                           ("wall_s", elapsed, stop.wall_s, "s")):
        if target is not None and value >= target:
            return criterion, value, target, unit
    return None


def record_spent_run(rundir: RunDir, spent: tuple[str, float, float, str]) -> str:
    """Record a run whose last allocation's stop took it past a target as finished by that target, as its
    supervisor would have; returns the reason."""
    criterion, value, target, _ = spent
    reason = (f"charts/env_steps {int(value)} >= {int(target)}" if criterion == "env_steps"
              else f"wall time {value:.0f}s >= {target:g}s")
    state = rundir.read_state() or {}
    state.update(status=RunStatus.FINISHED, exit_reason=reason, updated_at=time.time(),
                 stopped_by={"criterion": criterion, "value": value, "threshold": target})
    rundir.write_state(state)
    return reason


def prepare_resume(runs_dir: Path | None, run: str | None, job_file: Path | None,
                   until: list[str]) -> tuple[RunDir, JobSpec, dict, RunLock]:
    """(run dir, job, what the next segment continues from, the run's lock) for `run --resume`. The caller lets the
    lock go once the run's state says "created": a second resume then finds the run taken. RunNotFound, JobFileError
    or ResumeRefused (a run another command holds too) say what is refused."""
    rundir = resolve_run(runs_root(runs_dir), run)
    try:
        lock = rundir.lock()
    except RunBusy as exc:
        raise ResumeRefused(str(exc)) from None
    try:
        resumed = previous_segment(rundir)
        old = with_host_secrets(load_job(rundir.job_toml), rundir.read_secrets())
        new = load_job(job_file) if job_file is not None else None
        wanted = parse_until(until)
        spec = job_for_resume(old, new, wanted, str(job_file or "--until"))
        refuse_spent_targets(rundir, old, spec, resumed, wanted)
    except BaseException:
        lock.release()
        raise
    print(f"rlctl: resuming {rundir.run_id} ({resumed['status']}) from {resumed['env_steps']} env steps",
          file=sys.stderr)
    return rundir, spec, resumed, lock


def prepare_batch_restart(rundir: RunDir, env: dict | None = None) -> tuple[JobSpec, dict, RunLock]:
    """(job, what it continues from, the run's lock) for a Slurm batch job started again (requeued after a
    preemption, or after a node failure): the same run directory resumed with the same job, as `run --resume`
    does. ResumeRefused for a run that is over (finished, stopped, failed: nothing to do) or still alive."""
    env = os.environ if env is None else env
    lock = rundir.lock()
    try:
        state = rundir.read_state() or {}
        if status_of(state) in TERMINAL_STATES:
            raise ResumeRefused(f"{rundir.run_id} is {status_of(state)}: Slurm job {env.get('SLURM_JOB_ID')} has "
                                "nothing to run")
        # A batch job's script runs in one allocation at a time: once Slurm starts it again, the supervisor of
        # its last allocation is gone, whatever it last wrote.
        same_job = str(state.get("slurm_job_id")) == str(env.get("SLURM_JOB_ID"))
        restarted = same_job and str(env.get("SLURM_RESTART_COUNT") or "0") not in ("", "0")
        resumed = previous_segment(rundir, supervisor_gone=restarted)
        spec = with_host_secrets(load_job(rundir.job_toml), rundir.read_secrets())
        spent = spent_target(spec, resumed)
        if spent:
            # Its last allocation stopped past the target (a slow stop counts as wall time): nothing to run, and
            # the run is over; left `preempted`, it would wait for an allocation that never comes.
            reason = record_spent_run(rundir, spent)
            raise RunAlreadyOver(f"{rundir.run_id} finished: {reason} (reached in its last allocation); Slurm job "
                                 f"{env.get('SLURM_JOB_ID')} has nothing to run")
    except BaseException:
        lock.release()
        raise
    print(f"rlctl: Slurm job {env.get('SLURM_JOB_ID')} (start {int(str(env.get('SLURM_RESTART_COUNT') or 0)) + 1}) "
          f"resumes {rundir.run_id} ({resumed['status']}) from {resumed['env_steps']} env steps", file=sys.stderr)
    return spec, resumed, lock
