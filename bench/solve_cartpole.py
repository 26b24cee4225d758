"""Time to solve CartPole-v1: rlctl jobs against stable-baselines3 (rl-zoo3 settings), same invocation, same criteria.

Wall seconds are measured from starting a fresh process until it has stopped at the criterion (imports and process
start-up included). Off-policy jobs are judged on a 10-episode greedy evaluation (training returns include
exploration), on-policy ones on the mean of the last 20 training episodes. Median of --seeds seeds each.

    python bench/solve_cartpole.py [--seeds 3] [--cap 300]
        [--only ppo,appo,impala,apex,a2c,r2d2,r2d2_plain,seed_impala,seed_apex,seed_r2d2,sb3_ppo,sb3_dqn]

Targets: ppo and appo <= 0.5x sb3 PPO's wall time, impala <= 1x, apex <= 1.5x and faster than sb3 DQN; a2c
(jobs/a2c.toml), no target. `r2d2` is
jobs/r2d2.toml, on CartPole with its velocities hidden (a harder, partially observed task; no target), and
`r2d2_plain` the same job on plain CartPole-v1. `seed_impala`, `seed_apex` and `seed_r2d2` are the shipped SEED jobs
(jobs/seed-*.toml: central inference; seed_r2d2 on masked CartPole), no target.
Start-up (`startup_s`) is measured from invoking `rlctl run` to a collector's first env step.

Needs `pip install -e '.[bench]'` for the stable-baselines3 rows. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _children as children  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RETURN_TARGETS = ("eval_return", "train_return")  # state.json's stopped_by criteria that mean solved
ROWS = ("ppo", "appo", "impala", "apex", "a2c", "r2d2", "r2d2_plain", "seed_impala", "seed_apex", "seed_r2d2", "sb3_ppo",
        "sb3_dqn")

# rl-zoo3 hyperparams/ppo.yml and dqn.yml, CartPole-v1 entries.
SB3_CHILD = r'''
import sys, time, json
T0 = float(sys.argv[3])
import numpy as np, torch, gymnasium as gym
from stable_baselines3 import PPO, DQN
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
torch.set_num_threads(1)
algo, seed = sys.argv[1], int(sys.argv[2])

class Criterion(BaseCallback):
    def __init__(self, eval_env=None):
        super().__init__()
        self.eval_env, self.next_eval = eval_env, 0
    def _on_step(self):
        if algo == "ppo":
            buf = [e["r"] for e in self.model.ep_info_buffer][-20:]
            return not (len(buf) == 20 and np.mean(buf) >= 475)
        if self.num_timesteps >= self.next_eval:
            self.next_eval = self.num_timesteps + 1000
            obs, _ = self.eval_env.reset(seed=seed + self.num_timesteps)
            returns, running = np.zeros(10), np.ones(10, bool)
            while running.any():
                a, _ = self.model.predict(obs, deterministic=True)
                obs, r, term, trunc, _ = self.eval_env.step(a)
                returns += r * running
                running &= ~(term | trunc)
            return returns.mean() < 475
        return True

if algo == "ppo":
    lin = lambda v: (lambda p: p * v)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                learning_rate=lin(0.001), clip_range=lin(0.2), seed=seed, device="cpu")
    cb = Criterion()
else:
    env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
    model = DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100000, learning_starts=1000,
                gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]), seed=seed, device="cpu")
    cb = Criterion(gym.make_vec("CartPole-v1", num_envs=10, vectorization_mode="vector_entry_point"))
model.learn(total_timesteps=10_000_000, callback=cb)
print(json.dumps({"wall_s": time.time() - T0, "env_steps": int(model.num_timesteps)}))
'''


def run_sb3(algo: str, seed: int, cap: float) -> dict:
    """One stable-baselines3 run in a fresh process, timed from its start."""
    t0 = time.time()
    try:
        out = children.run([sys.executable, "-c", SB3_CHILD, algo, str(seed), str(t0)], capture_output=True,
                           text=True, timeout=cap)
    except subprocess.TimeoutExpired:
        return {"solved": False, "wall_s": None, "env_steps": None}
    if out.returncode != 0:
        return {"solved": False, "wall_s": None, "env_steps": None, "error": out.stderr.strip().splitlines()[-1:]}
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {"solved": True, "wall_s": time.time() - t0, "env_steps": res["env_steps"]}


def job_text(name: str) -> str:
    """The job file a bench row runs: jobs/<name>.toml, jobs/seed-<algo>.toml for seed_<algo>, or (r2d2_plain)
    jobs/r2d2.toml without its mask."""
    if name == "r2d2_plain":
        return re.sub(r"(?m)^wrappers = .*\n", "", (REPO / "jobs" / "r2d2.toml").read_text())
    return (REPO / "jobs" / f"{name.replace('seed_', 'seed-')}.toml").read_text()


def run_rlctl(name: str, seed: int, cap: float, edit=None, tb_max: tuple[str, ...] = ()) -> dict:
    """`rlctl run` of the row's job with the seed replaced and the wall cap set; timed from invocation to exit.

    `edit` changes the job text further; `tb_max` names TensorBoard scalars whose largest value over the run is
    returned (under "max")."""
    text = job_text(name)
    return run_job_text(edit(text) if edit else text, name, seed, cap, tb_max)


def run_job_text(text: str, name: str, seed: int, cap: float, tb_max: tuple[str, ...] = (),
                 runs_dir: Path | None = None) -> dict:
    """`rlctl run` of a job file's text with its seed replaced and `wall_s` set to `cap`, in a temporary runs
    directory (or `runs_dir`, kept); timed from invocation to exit. Solved: finished at its return target."""
    with tempfile.TemporaryDirectory() as tmp:
        text = re.sub(r"(?m)^seed = \d+", f"seed = {seed}", text)
        text = re.sub(r"(?m)^wall_s = [\d.]+", f"wall_s = {cap}", text)
        path = Path(tmp) / f"{name}.toml"
        path.write_text(text)
        runs = Path(runs_dir or Path(tmp, "runs"))
        before = set(runs.iterdir()) if runs.is_dir() else set()
        t0 = time.time()
        # The supervisor is stopped (SIGTERM: it stops its processes, then itself) on a timeout or when this bench is
        # killed, before the temporary directory goes; its own session keeps a terminal's Ctrl-C for this bench.
        out = children.run([sys.executable, "-m", "rlctl", "run", str(path), "--runs-dir", str(runs)],
                           capture_output=True, text=True, timeout=cap + 120, env={**os.environ, "TERM": "dumb"},
                           grace=children.SUPERVISOR_GRACE_S)
        wall = time.time() - t0
        run_dir = next(iter(set(runs.iterdir()) - before))
        state = json.loads((run_dir / "state.json").read_text())
        first_step = _first_env_step_s(run_dir, t0)
        maxima = _tb_maxima(run_dir, tb_max) if tb_max else {}
    solved = state.get("status") == "finished" and (state.get("stopped_by") or {}).get("criterion") in RETURN_TARGETS
    metrics = state.get("metrics", {})
    return {"solved": solved, "wall_s": wall if solved else None, "env_steps": int(metrics.get("charts/env_steps", 0)),
            "return_mean": metrics.get("charts/episode_return_mean"), "startup_s": first_step,
            "exit_reason": state.get("exit_reason"), "rc": out.returncode, "max": maxima, "run_id": run_dir.name}


def _tb_maxima(run_dir: Path, tags: tuple[str, ...]) -> dict[str, float]:
    """The largest value of each TensorBoard scalar over the run (tensorboard's own reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    have = set(acc.Tags()["scalars"])
    return {tag: max(e.value for e in acc.Scalars(tag)) for tag in tags if tag in have}


def _first_env_step_s(run_dir: Path, t0: float) -> float | None:
    """Seconds from `rlctl run` being invoked (t0) to a collector's first env step (its `first_env_step` event)."""
    from rlctl import events

    found = [events.first(p, "first_env_step") for p in (run_dir / "logs").glob("collector-*.log")]
    ts = [e.ts for e in found if e is not None and e.ts is not None]
    return min(ts) - t0 if ts else None


def summarize(name: str, runs: list[dict]) -> dict:
    """Medians with unsolved runs counted as slower than any solved one (None when the median run did not solve)."""
    solved = [r for r in runs if r["solved"]]

    def med(key: str) -> float | None:
        values = sorted(r[key] for r in solved) + [float("inf")] * (len(runs) - len(solved))
        m = statistics.median(values) if values else float("inf")
        return None if m == float("inf") else m

    row = {"name": name, "wall_s": med("wall_s"), "env_steps": med("env_steps"), "solved": f"{len(solved)}/{len(runs)}",
           "runs": runs}
    if any(r.get("startup_s") is not None for r in runs):
        row["startup_s"] = statistics.median([r["startup_s"] for r in runs if r.get("startup_s") is not None])
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seed-list", default=None,
                    help="comma-separated seeds instead of 1..--seeds; repeat one (1,1,1) to see how much runs of "
                         "the same seed differ (they do, by process timing)")
    ap.add_argument("--cap", type=float, default=300.0, help="seconds before a run counts as unsolved")
    ap.add_argument("--only", default=",".join(ROWS))
    args = ap.parse_args()
    children.install()  # killed or failing: no rlctl run (nor its processes) or sb3 run outlives the bench
    which = args.only.split(",")
    seeds = [int(x) for x in args.seed_list.split(",")] if args.seed_list else list(range(1, args.seeds + 1))
    results = []
    for name in which:
        runs = []
        for seed in seeds:
            if name.startswith("sb3_"):
                r = run_sb3(name[4:], seed, args.cap)
            else:
                r = run_rlctl(name, seed, args.cap)
            print(f"{name:10s} seed {seed}: {'solved' if r['solved'] else 'NOT solved'} "
                  f"wall {r['wall_s'] and round(r['wall_s'], 1)} s, env steps {r['env_steps']}"
                  + (f", first env step after {r['startup_s']:.1f} s" if r.get("startup_s") else ""), flush=True)
            runs.append(r)
        results.append(summarize(name, runs))
    base = {r["name"]: r for r in results}
    print()
    print(f"{'name':10s} {'solved':>7s} {'wall s':>8s} {'env steps':>10s}  vs sb3 ppo  vs sb3 dqn")
    for r in results:
        ratios = []
        for ref in ("sb3_ppo", "sb3_dqn"):
            b = base.get(ref, {}).get("wall_s")
            ratios.append(f"{r['wall_s'] / b:9.2f}x" if (b and r["wall_s"]) else f"{'-':>10s}")
        print(f"{r['name']:10s} {r['solved']:>7s} {r['wall_s'] or float('nan'):8.1f} {r['env_steps'] or 0:10.0f}  "
              + "  ".join(ratios))
    ppo_base = base.get("sb3_ppo", {}).get("wall_s")
    ratios = {f"{n}_vs_sb3_ppo": round(base[n]["wall_s"] / ppo_base, 3)
              for n in ROWS if not n.startswith("sb3_")
              if n in base and base[n]["wall_s"] and ppo_base}
    targets = {"ppo": 0.5, "appo": 0.5, "impala": 1.0, "apex": 1.5}
    for key, value in ratios.items():
        name = key.split("_vs_")[0]
        if name in targets:
            print(f"target {name}: <= {targets[name]}x sb3_ppo: {value:.2f}x "
                  f"{'MET' if value <= targets[name] else 'MISSED'}")
    if "apex" in base and "sb3_dqn" in base:
        a, d = base["apex"]["wall_s"], base["sb3_dqn"]["wall_s"]
        # An sb3 DQN whose median run did not solve has no median time: apex is faster only if it has one.
        why = f" (sb3_dqn solved {base['sb3_dqn']['solved']}: no median time)" if d is None else ""
        print(f"target apex faster than sb3_dqn: {'MET' if a and (d is None or a < d) else 'MISSED'}{why}")
    startup = {f"{r['name']}_startup_s": round(r["startup_s"], 2) for r in results if r.get("startup_s") is not None}
    print(json.dumps({"bench": "solve_cartpole", **ratios, **startup,
                      "results": [{k: v for k, v in r.items() if k != "runs"} for r in results]}))


if __name__ == "__main__":
    main()
