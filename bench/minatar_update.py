"""The PPO update of each shipped MinAtar job on its own frames: over the live columns against over all of them.

For each game the job's actor core (a fresh policy) plays its vector env until it has cut one rollout per collector
(2 x 32 envs x 128 steps = 8,192 frames for the shipped jobs); the job's learner core
(rlctl.roles.learner.build_core, with every core here, as a synchronous job's learner has them) then updates on
that batch, alternately with rlctl.models.live_columns on (the first layers see only the columns some frame sets)
and off (LIVE_SHARE_MAX = 0: every column), `--repeats` times each after a warm-up. The two take the same step
(tests/test_onpolicy_math.py); only the time differs. Frames of a random policy, not a trained one: which cells a
game ever sets depends on play, and a trained policy's frames may set more or fewer.

    python bench/minatar_update.py [--games breakout,asterix,...] [--repeats 5]

Last line: {"bench": "minatar_update", "<game>_live_ms", "<game>_dense_ms", "<game>_speedup", "<game>_live_share"}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
# This script's folder is first on sys.path, and its bench/minatar.py would stand in for the minatar package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
GAMES = ("breakout", "asterix", "freeway", "space_invaders", "seaquest")


def rollout_batch(job):
    """One rollout per collector of the job from its actor core on a real vector env, stacked as the learner's
    rollout source stacks them; returns (space info, batch)."""
    from rlctl.algos.base import ActorSetup
    from rlctl.algos import build_model
    from rlctl.datapaths.rollout_source import stack_rollouts
    from rlctl.envs import env_space_info, make_vec_env
    from rlctl.net import wire

    env = make_vec_env(job.env)
    info = env_space_info(env)
    model = build_model(job, info)
    msgs = []
    with torch.no_grad():
        for rank in range(job.collector_count):
            actor = job.algorithm_entry.load("actor")(ActorSetup(job, info, model, rank, env.num_envs, seed=rank))
            obs, _ = env.reset(seed=rank)
            actor.begin(0, 1)
            while True:
                actions = actor.act(obs)
                next_obs, rewards, terminated, truncated, _ = env.step(actions)
                done = actor.record(obs, actions, rewards, next_obs, terminated, truncated)
                obs = next_obs
                if done:
                    break
            msgs.append(wire.Message("rollout", arrays=actor.take().arrays))
    env.close()
    return info, stack_rollouts(msgs, torch.device("cpu"))


def time_update(core, batch) -> float:
    """Milliseconds of one update."""
    t0 = time.perf_counter()
    core.update(batch)
    return (time.perf_counter() - t0) * 1e3


def measure(game: str, repeats: int) -> dict:
    """Live and dense update times of one game's shipped job, interleaved."""
    from rlctl import models
    from rlctl.job.load import load_job
    from rlctl.launch.plan import usable_cpus
    from rlctl.roles.learner import build_core

    # A synchronous job's learner takes every core here (its collectors wait while it updates).
    threads = usable_cpus()
    torch.set_num_threads(threads)
    path = REPO / "jobs" / f"ppo-{game.replace('_', '-')}-minatar.toml"
    job = load_job(path)
    info, batch = rollout_batch(job)
    core = build_core(job, info, torch.device("cpu"))
    share_max = models.LIVE_SHARE_MAX
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(repeats + 1):  # the first pair warms up
        for live in (True, False) if i % 2 else (False, True):
            models.LIVE_SHARE_MAX = share_max if live else 0.0
            ms = time_update(core, batch)
            if i:
                times[live].append(ms)
    models.LIVE_SHARE_MAX = share_max
    flat = batch["obs"][:-1].flatten(0, 1).flatten(1)
    live_ms, dense_ms = statistics.median(times[True]), statistics.median(times[False])
    cols = models.live_columns(flat)
    share = len(cols) / flat.shape[1] if cols is not None else 1.0
    print(f"{game:15s} {len(flat):6d} frames, {share * 100:5.1f}% of {flat.shape[1]} columns live, "
          f"{threads} threads: live {live_ms:6.1f} ms, all columns {dense_ms:6.1f} ms per update, "
          f"{dense_ms / live_ms:.2f}x", flush=True)
    return {f"{game}_live_ms": round(live_ms, 1), f"{game}_dense_ms": round(dense_ms, 1),
            f"{game}_speedup": round(dense_ms / live_ms, 3), f"{game}_live_share": round(share, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--games", default=",".join(GAMES))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    games = [g for g in args.games.split(",") if g]
    unknown = sorted(set(games) - set(GAMES))
    if unknown:
        sys.exit(f"unknown games {unknown}; expected some of {list(GAMES)}")
    out: dict = {"bench": "minatar_update"}
    for game in games:
        out.update(measure(game, args.repeats))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
