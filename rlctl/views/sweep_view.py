"""What people see of a sweep: one table of its trials (the values that differ, status, progress to the target, best
return, time to target) under a line for the sweep, its JSON form, and its trials ranked for `rlctl compare`.

Read from the sweep directory (sweep.json, each trial's state.json), as `rlctl status` reads a run: no torch.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rlctl import metric_names as M
from rlctl.run_reading import as_read, real_number
from rlctl.rundir import RunDir
from rlctl.run_status import RunStatus
from rlctl.sweep_dir import SweepDir, trial_status
from rlctl.views.compare_view import target_reached
from rlctl.views.console import build_table, format_duration, stop_rows

SWEEP_COLUMNS = ["trial", "values", "status", "progress", "best return", "to target", "elapsed"]
SWEEP_DROP = ["elapsed", "best return"]
RETURN, EVAL = 2, 3  # columns of a progress_history point (rlctl.supervise.stop_progress)


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each key path's last part where that is unique among them (`algorithm.lr` -> `lr`), else the whole path."""
    last = Counter(k.rsplit(".", 1)[-1] for k in keys)
    return {k: k.rsplit(".", 1)[-1] if last[k.rsplit(".", 1)[-1]] == 1 else k for k in keys}


def values_text(trial: dict, names: dict[str, str], seeds: bool) -> str:
    """`lr=0.001 seed=2`: a trial's parameter values (and its seed where the sweep has several)."""
    values = trial.get("values") if isinstance(trial.get("values"), dict) else {}
    parts = [f"{names.get(k, k)}={_plain(v)}" for k, v in values.items()]
    return " ".join(parts + ([f"seed={trial.get('seed')}"] if seeds else []))


def best_return(state: dict) -> float | None:
    """The best mean return the run has shown: training or evaluation, over its progress history and now."""
    history = state.get("progress_history")
    seen = [real_number(p[c]) for p in (history if isinstance(history, list) else []) if isinstance(p, list)
            for c in (RETURN, EVAL) if len(p) > c]
    metrics = state.get("metrics") if isinstance(state.get("metrics"), dict) else {}
    seen += [real_number(v) for k, v in metrics.items() if k.endswith("return_mean") or k == M.EPISODE_RETURN_BEST]
    seen = [v for v in seen if v is not None]
    return max(seen) if seen else None


def progress(state: dict) -> float | None:
    """How far the run is toward its target: the largest fraction among its goals (limits only when it has none)."""
    rows = stop_rows(state)
    goals = [p for p in rows if not p.limit and p.fraction is not None] or [p for p in rows if p.fraction is not None]
    return max(p.fraction for p in goals) if goals else None


def trial_summary(sweep: SweepDir, trial: dict) -> dict:
    """One trial as raw figures: id, values, seed, status, progress (0-1), best return, time to target, elapsed."""
    rundir = sweep.trial_dir(trial["id"])
    raw = rundir.read_state()
    state = as_read(raw) if raw is not None else {}
    reached = raw is not None and target_reached(raw)
    data = sweep.read()
    return {"trial": trial["id"], "values": trial.get("values") or {}, "seed": trial.get("seed"),
            "host": trial.get("host"), "status": trial_status(rundir), "progress": progress(state) if raw is not None else None,
            "best_return": best_return(state) if raw is not None else None,
            "time_to_target_s": state.get("elapsed_s") if reached else None, "elapsed_s": state.get("elapsed_s"),
            "run_dir": str(rundir.path), "refused": (data.get("refused") or {}).get(trial["id"]),
            "early_stopped": (data.get("early_stopped") or {}).get(trial["id"])}


def sweep_json(sweep: SweepDir) -> dict:
    """`rlctl status SWEEP --json`: the sweep's own fields and a summary per trial."""
    data, lineage = sweep.read(), sweep.lineage()
    trials = [trial_summary(sweep, t) for t in sweep.trials()]
    for t in trials:  # after an exploit, a trial goes on with the values PBT gave it
        for record in (r for r in lineage if r["trial"] == t["trial"] and isinstance(r.get("new"), dict)):
            t["values"] = {**t["values"], **record["new"]}
    return {"sweep_id": sweep.sweep_id, "name": data.get("name"), "status": sweep.status(data),
            "max_concurrent": data.get("max_concurrent"), "params": data.get("params"),
            "early_stop": data.get("early_stop"), "trials": trials, "lineage": lineage}


def sweep_rows(sweep: SweepDir) -> tuple[list[str], list[list]]:
    """Columns and one row per trial."""
    data = sweep_json(sweep)
    perturbed = [p["key"] for p in (sweep.read().get("pbt") or {}).get("perturb", []) if isinstance(p, dict)]
    names = short_keys(list(dict.fromkeys([*(data.get("params") or []), *perturbed])))
    seeds = len({t["seed"] for t in data["trials"]}) > 1
    rows = [[t["trial"], values_text({"values": t["values"], "seed": t["seed"]}, names, seeds),
             f"{t['status']} (early)" if t["early_stopped"] else t["status"],
             f"{100 * t['progress']:.0f}%" if t["progress"] is not None else None,
             f"{t['best_return']:.1f}" if t["best_return"] is not None else None,
             format_duration(t["time_to_target_s"]) if t["time_to_target_s"] is not None else None,
             format_duration(t["elapsed_s"]) if t["elapsed_s"] is not None else None] for t in data["trials"]]
    if any(t["host"] for t in data["trials"]):  # place = "hosts": where each trial runs
        return _with_host_column(list(SWEEP_COLUMNS), rows, [t["host"] for t in data["trials"]])
    return list(SWEEP_COLUMNS), rows


def _with_host_column(columns: list[str], rows: list[list], hosts: list) -> tuple[list[str], list[list]]:
    """A "host" column after the values (the trials' hosts, in row order)."""
    at = columns.index("values") + 1 if "values" in columns else 1
    return columns[:at] + ["host"] + columns[at:], [r[:at] + [h] + r[at:] for r, h in zip(rows, hosts)]


def sweep_header(sweep: SweepDir) -> str:
    """`ppo-lr-20261204-101010 (ppo-lr) | running | 8 trials: 2 finished, 2 running, 4 pending | 2 at once` (with
    trials stopped early: `1 stopped (1 early)`)."""
    data = sweep.read()
    counts = Counter(trial_status(sweep.trial_dir(t["id"])) for t in sweep.trials())
    order = [RunStatus.FINISHED, RunStatus.RUNNING, RunStatus.STARTING, RunStatus.STOPPING, RunStatus.STOPPED,
             RunStatus.FAILED, RunStatus.LOST, RunStatus.CREATED, RunStatus.PENDING]
    early = len(data.get("early_stopped") or {})
    told = ", ".join(f"{counts[s]} {s}" + (f" ({early} early)" if s == RunStatus.STOPPED and early else "")
                     for s in order if counts[s])
    return (f"{sweep.sweep_id} ({data.get('name')}) | {sweep.status(data)} | {sum(counts.values())} trials: {told} "
            f"| {data.get('max_concurrent')} at once")


def sweep_view(sweep: SweepDir, width: int | None = None) -> list[Any]:
    """The header line, the trials table, why any trial could not start and why any was stopped early."""
    lines: list[Any] = [sweep_header(sweep), build_table(None, *sweep_rows(sweep), width, SWEEP_DROP)]
    data = sweep.read()
    lines += [f"{trial} not started: {why}" for trial, why in (data.get("refused") or {}).items()]
    lines += [f"{trial} early-stopped: {why}" for trial, why in (data.get("early_stopped") or {}).items()]
    return lines + lineage_lines(sweep)


def lineage_lines(sweep: SweepDir) -> list[str]:
    """Population-based training's exploits, oldest first: `t003 <- t001 at 8,192 env steps (return 21.0 < 95.3):
    lr 1e-05 -> 0.0042`, under a `lineage` line (none without exploits)."""
    records = sweep.lineage()
    if not records:
        return []
    names = short_keys(sorted({k for r in records for k in (r.get("new") or {})}))
    lines = ["lineage (population-based training):"]
    for r in records:
        scores = r.get("scores") or {}
        mine, theirs = real_number(scores.get(r["trial"])), real_number(scores.get(r.get("from")))
        told = f" (return {mine:.1f} < {theirs:.1f})" if mine is not None and theirs is not None else ""
        steps = real_number(r.get("env_steps"))
        changes = ", ".join(f"{names.get(k, k)} {_plain((r.get('old') or {}).get(k))} -> {_plain(v)}"
                            for k, v in (r.get("new") or {}).items())
        lines.append(f"  {r['trial']} <- {r.get('from')} at {steps or 0:,.0f} env steps{told}: {changes}")
    return lines


def ranked_trials(sweep: SweepDir) -> list[RunDir]:
    """The trials that began, best first: those that reached the target by time to it, then the others by best
    return (for `rlctl compare SWEEP`)."""
    summaries = [trial_summary(sweep, t) for t in sweep.trials()]
    begun = [s for s in summaries if s["status"] != RunStatus.PENDING]

    def key(s: dict) -> tuple:
        reached = s["time_to_target_s"]
        return (reached is None, reached or 0.0, -(s["best_return"] if s["best_return"] is not None else -1e300))

    return [sweep.trial_dir(s["trial"]) for s in sorted(begun, key=key)]


def trials_to_plot(sweep: SweepDir, key: str | None) -> tuple[list[RunDir], dict[str, str]]:
    """`rlctl plot SWEEP [--group-by KEY]`: the trials that began and, with `key` (a parameter's key path, or its
    short name as the trials table shows it), each trial's group (`lr=0.004`: its seeds are one curve); ValueError
    naming the sweep's parameters for a key that is none of them."""
    params = list(sweep.read().get("params") or [])
    names = short_keys(params)
    trials = {t["id"]: t for t in sweep.trials() if trial_status(sweep.trial_dir(t["id"])) != RunStatus.PENDING}
    dirs = [sweep.trial_dir(t) for t in trials]
    if key is None:
        return dirs, {}
    full = key if key in params else next((k for k, n in names.items() if n == key), None)
    if full is None:
        raise ValueError(f"--group-by {key!r}: not a parameter of {sweep.sweep_id}; its parameters: "
                         f"{', '.join(params) or 'none'}")
    values = {t: (trial.get("values") or {}).get(full) for t, trial in trials.items()}
    return dirs, {rd.run_id: f"{names[full]}={_plain(values[rd.run_id])}" for rd in dirs}


def plan_rows(trials: list[dict], params: list[str]) -> tuple[list[str], list[list]]:
    """`rlctl plan SWEEP.toml`: one row per trial (id, the values of its parameters, seed); starts nothing."""
    names = short_keys(params)
    columns = ["trial", *(names[k] for k in params), "seed"]
    rows = [[t["id"], *(_plain(t["values"][k]) for k in params), t["seed"]] for t in trials]
    if any(t.get("host") for t in trials):
        return columns + ["host"], [r + [t.get("host")] for r, t in zip(rows, trials)]
    return columns, rows


def _plain(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def sweep_printer(interval_s: float = 10.0):
    """A scheduler display for non-TTY output: the sweep's line every interval_s and when it ends."""
    import time

    from rlctl.rundir import OVER_STATES

    last = [0.0]

    def show(sweep: SweepDir, data: dict) -> None:
        now = time.time()
        if now - last[0] >= interval_s or data.get("status") in OVER_STATES:
            last[0] = now
            print(sweep_header(sweep), flush=True)

    return show
