"""`rlctl status --json`: the shapes scripts read, stable and documented in the README. Over all runs, one summary
per run; for one run, the same summary with the run's details after it.

On the fast CLI path: standard library only.
"""

from __future__ import annotations

from rlctl import metric_names as M
from rlctl.rundir import RunDir
from rlctl.run_reading import as_read, job_of_run_id, real_number, segments

# The details `rlctl status RUN --json` adds to a run's summary, each as state.json has it (null where missing).
DETAIL_KEYS = ("ended_at", "updated_at", "stopped_by", "failure", "stop", "metrics", "host_rows",
               "supervisor_pid", "supervisor_host", "slurm_job_id")
PROCESS_KEYS = ("name", "role", "rank", "host", "pid", "state", "restarts", "rate", "rate_unit", "last_heartbeat",
                "remote", "note")


def run_summary(rundir: RunDir, state: dict | None = None, now: float | None = None) -> dict:
    """One run as `rlctl status --json` lists it: raw numbers under snake_case keys (null where unknown);
    `started_at` is the first segment's start, `elapsed_s` adds up every segment, `status` is the effective one."""
    raw = rundir.read_state() if state is None else state
    seen = as_read(raw, now)
    metrics = seen.get("metrics") if isinstance(seen.get("metrics"), dict) else {}
    hosts = seen.get("hosts")
    steps = real_number(metrics.get(M.ENV_STEPS))
    return {
        "run_id": rundir.run_id,
        "job": seen.get("job") or job_of_run_id(rundir.run_id),
        "algorithm": seen.get("algorithm"),
        "status": seen["status"],
        "exit_reason": seen.get("exit_reason"),
        "started_at": seen["started_at"],
        "elapsed_s": seen["elapsed_s"],
        "env_steps": int(steps) if steps is not None else None,
        "return_mean": real_number(metrics.get(M.EPISODE_RETURN_MEAN)),
        "eval_return_mean": real_number(metrics.get(M.EVAL_RETURN_MEAN)),
        "hosts": [str(h) for h in hosts] if isinstance(hosts, list) else [],
        "run_dir": str(rundir.path),
    }


def run_json(rundir: RunDir, now: float | None = None) -> dict:
    """`rlctl status RUN --json`: the run's summary (the keys of the list's rows, alike), then its segments, its
    processes (a lost run's shown lost) and DETAIL_KEYS."""
    raw = rundir.read_state() or {}
    seen = as_read(raw, now)
    procs = seen.get("processes") if isinstance(seen.get("processes"), list) else []
    return {**run_summary(rundir, raw, now),
            "segments": [dict(s) for s in segments(raw)],
            "processes": [{k: p.get(k) for k in PROCESS_KEYS} for p in procs if isinstance(p, dict)],
            **{k: seen.get(k) for k in DETAIL_KEYS}}
