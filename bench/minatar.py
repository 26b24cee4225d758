"""Time to reward on the five MinAtar games: rlctl's shipped jobs against a single-process JAX + gymnax PPO.

The baseline is bench/minatar_jax.py (PureJaxRL's PPO and its MinAtar settings, written here; `pip install -e
'.[bench-jax]'`). Both sides are timed the same way: wall seconds from starting a fresh process until it has exited
at the game's target, the mean training return of the last 100 episodes (imports, JAX's compilation and rlctl's
start-up and shutdown all count). Runs are interleaved (for each seed, every game, the two sides in alternating
order), so a machine that slows down for a while slows both.

gymnax's games have no sticky actions and cut episodes at 1,000 steps (Freeway at 2,500); rlctl's jobs run
MinAtar's own rules with the same settings (`sticky_action_prob = 0`, `max_episode_steps`), and MinAtar's minimal
action sets, as gymnax uses.

    python bench/minatar.py [--seeds 3] [--games breakout,asterix,...] [--cap 600] [--runs-dir DIR]
    python bench/minatar.py --measure-targets [--seeds 3]    # the baseline's return after 2M env steps

Targets: rlctl's median time to target <= 0.5x the baseline's in every game (1x in the worst game is the floor),
and its median env steps <= 1.5x the baseline's. Last line: one JSON object with `<game>_ratio`, `<game>_rlctl_s`,
`<game>_baseline_s`, `<game>_rlctl_steps`, `<game>_baseline_steps` per game and `all_reached`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _children as children  # noqa: E402
from solve_cartpole import run_job_text  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BASELINE = Path(__file__).resolve().parent / "minatar_jax.py"
GAMES = ("breakout", "asterix", "freeway", "space_invaders", "seaquest")
TARGET_STEPS = 2_000_000
# Each game's target: the median over seeds 1-3 of the baseline's mean training return (last 100 episodes) after
# 2M env steps, measured with `python bench/minatar.py --measure-targets` (2026-12-03, this 2-core machine).
# Breakout's is at least 10 (the first yardstick's target).
TARGETS = {
    "breakout": 24.13,
    "asterix": 2.0,
    "freeway": 29.21,
    "space_invaders": 118.91,
    "seaquest": 11.64,
}


def job_path(game: str) -> Path:
    """The shipped job for a game: jobs/<algorithm>-<game>-minatar.toml (the one there is)."""
    stem = game.replace("_", "-")
    found = sorted((REPO / "jobs").glob(f"*-{stem}-minatar.toml"))
    if len(found) != 1:
        raise SystemExit(f"expected one jobs/*-{stem}-minatar.toml, found {[p.name for p in found]}")
    return found[0]


def run_baseline(game: str, seed: int, cap: float, target: float | None, max_steps: int) -> dict:
    """One baseline run in a fresh process: to `target` (then it exits), or to `max_steps` env steps."""
    argv = [sys.executable, str(BASELINE), "--game", game, "--seed", str(seed), "--max-env-steps", str(max_steps)]
    if target is not None:
        argv += ["--target", str(target)]
    t0 = time.time()
    try:
        out = children.run(argv, capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired:
        return {"solved": False, "wall_s": None, "env_steps": None, "return_mean": None, "error": "timed out"}
    wall = time.time() - t0
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    last = events[-1] if events else {}
    if out.returncode != 0 or not last:
        return {"solved": False, "wall_s": None, "env_steps": None, "return_mean": None,
                "error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    solved = last.get("event") == "target"
    return {"solved": solved, "wall_s": wall if solved else None, "env_steps": last.get("env_steps"),
            "return_mean": last.get("return_mean"), "end_wall_s": wall}


def run_rlctl(game: str, seed: int, cap: float, runs_dir: Path | None) -> dict:
    """The game's shipped job, seed replaced, its wall cap set to `cap` (its run kept in `runs_dir` if given)."""
    path = job_path(game)
    return run_job_text(path.read_text(), path.stem, seed, cap, runs_dir=runs_dir)


def median_worst(runs: list[dict], key: str) -> tuple[float | None, float | None]:
    """Median and worst of `key` over runs, an unsolved run counting as worse than any solved one (None)."""
    values = sorted(r[key] if r["solved"] else float("inf") for r in runs)
    if not values:
        return None, None
    med, worst = statistics.median(values), values[-1]
    return (None if med == float("inf") else med), (None if worst == float("inf") else worst)


def measure_targets(games: list[str], seeds: list[int], cap: float) -> None:
    """The baseline's mean return of the last 100 training episodes after 2M env steps, per game and seed."""
    found = {}
    for game in games:
        returns = []
        for seed in seeds:
            r = run_baseline(game, seed, cap, None, TARGET_STEPS)
            print(f"{game:15s} seed {seed}: return {r['return_mean']} after {r['env_steps']} env steps "
                  f"({r.get('end_wall_s') or 0:.0f} s){'  ' + r['error'] if r.get('error') else ''}", flush=True)
            if r["return_mean"] is not None:
                returns.append(r["return_mean"])
        found[game] = round(statistics.median(returns), 2) if returns else None
        print(f"{game:15s} target (median): {found[game]}", flush=True)
    print(json.dumps({"bench": "minatar_targets", **found}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--games", default=",".join(GAMES))
    ap.add_argument("--cap", type=float, default=600.0, help="seconds before a run counts as not reaching its target")
    ap.add_argument("--only", choices=("both", "rlctl", "baseline"), default="both")
    ap.add_argument("--measure-targets", action="store_true")
    ap.add_argument("--runs-dir", type=Path, default=None,
                    help="keep rlctl's run directories here (for `rlctl plot`); by default they are removed")
    args = ap.parse_args()
    children.install()  # killed or failing: no rlctl run (nor its processes) or JAX run outlives the bench
    games = [g for g in args.games.split(",") if g]
    unknown = set(games) - set(GAMES)
    if unknown:
        ap.error(f"unknown games {sorted(unknown)}; choose from {', '.join(GAMES)}")
    seeds = list(range(1, args.seeds + 1))
    if args.measure_targets:
        measure_targets(games, seeds, args.cap)
        return
    sides = ("rlctl", "baseline") if args.only == "both" else (args.only,)
    runs: dict[tuple[str, str], list[dict]] = {(g, s): [] for g in games for s in sides}
    for i, seed in enumerate(seeds):
        for j, game in enumerate(games):
            order = sides if (i + j) % 2 == 0 else sides[::-1]
            for side in order:
                if side == "rlctl":
                    r = run_rlctl(game, seed, args.cap, args.runs_dir)
                else:
                    r = run_baseline(game, seed, args.cap, TARGETS[game], 10 * TARGET_STEPS)
                runs[(game, side)].append(r)
                wall = f"{r['wall_s']:.1f} s" if r["solved"] else "not reached"
                why = "" if r["solved"] else f"  {r.get('error') or r.get('exit_reason')}"
                print(f"{game:15s} {side:8s} seed {seed}: {wall}, {r['env_steps']} env steps, return "
                      f"{r['return_mean']}{why}", flush=True)
    print()
    print(f"{'game':15s} {'target':>6s} {'side':8s} {'reached':>7s} {'median s':>9s} {'worst s':>8s} "
          f"{'median steps':>12s}")
    summary: dict = {"bench": "minatar", "seeds": len(seeds)}
    all_reached = True
    for game in games:
        for side in sides:
            rs = runs[(game, side)]
            med, worst = median_worst(rs, "wall_s")
            steps, _ = median_worst(rs, "env_steps")
            reached = sum(r["solved"] for r in rs)
            all_reached &= reached == len(rs)
            nan = float("nan")
            print(f"{game:15s} {TARGETS[game]:6.1f} {side:8s} {reached:>4d}/{len(rs)} {nan if med is None else med:9.1f} "
                  f"{nan if worst is None else worst:8.1f} {nan if steps is None else steps:12.0f}")
            summary[f"{game}_{side}_s"] = None if med is None else round(med, 1)
            summary[f"{game}_{side}_worst_s"] = None if worst is None else round(worst, 1)
            summary[f"{game}_{side}_steps"] = None if steps is None else int(steps)
        if len(sides) == 2:
            r, b = summary[f"{game}_rlctl_s"], summary[f"{game}_baseline_s"]
            rs, bs = summary[f"{game}_rlctl_steps"], summary[f"{game}_baseline_steps"]
            summary[f"{game}_ratio"] = round(r / b, 3) if r and b else None
            summary[f"{game}_steps_ratio"] = round(rs / bs, 3) if rs and bs else None
    if len(sides) == 2:
        print()
        for game in games:
            ratio, steps_ratio = summary[f"{game}_ratio"], summary[f"{game}_steps_ratio"]
            verdict = ("MET" if ratio is not None and ratio <= 0.5 else
                       "floor" if ratio is not None and ratio <= 1.0 else "MISSED")
            print(f"target {game}: time <= 0.5x baseline: {ratio}x {verdict}; env steps <= 1.5x: {steps_ratio}x "
                  f"{'MET' if steps_ratio is not None and steps_ratio <= 1.5 else 'MISSED'}")
    summary["all_reached"] = all_reached
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
