"""CPU time per env step of rlctl's vectorized MinAtar games against gymnasium's SyncVectorEnv over MinAtar's own.

Both sides step N envs (default 64) with the same uniform random actions of the game's minimal set, no sticky
actions; a side's figure is the best of three timed runs (CPU time of this process: the machine is shared). The
baseline is what a user would otherwise reach for: `gymnasium.make_vec("MinAtar/<Game>-v1", vectorization_mode=
"sync")` from the minatar package. That the two play the same game is tests/test_minatar_vec_*.py's job.

    python bench/minatar_envs.py [--games breakout,asterix,...] [--envs 64]

Last line: {"bench": "minatar_envs", "envs": N, "<game>_us", "<game>_sync_us", "<game>_speedup"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# This script's folder is first on sys.path, and its bench/minatar.py would stand in for the minatar package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if str(REPO) not in sys.path:  # `python bench/minatar_envs.py` from a checkout
    sys.path.insert(0, str(REPO))

GAMES = ("breakout", "asterix", "freeway", "space_invaders", "seaquest")
STEPS = 300  # per timed run of ours
SYNC_STEPS = 30  # per timed run of the baseline, about 20x slower


def per_env_step_us(env, actions: np.ndarray, steps: int) -> float:
    """Microseconds of CPU per env step: the best of three runs of `steps` vector steps after a reset and one step."""
    n = env.num_envs
    env.reset(seed=0)
    env.step(actions[0])
    runs = []
    for _ in range(3):
        start = time.process_time()
        for t in range(steps):
            env.step(actions[t])
        runs.append((time.process_time() - start) / (steps * n) * 1e6)
    return min(runs)


def main() -> None:
    """Time each game both ways; print a line per game and the JSON summary last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", default=",".join(GAMES))
    parser.add_argument("--envs", type=int, default=64)
    args = parser.parse_args()
    games = args.games.split(",")
    unknown = sorted(set(games) - set(GAMES))
    if unknown:
        parser.error(f"unknown games {unknown}; known: {', '.join(GAMES)}")

    import gymnasium
    import minatar.gym

    from rlctl.minatar_vec import make_vector_env

    if "MinAtar/Breakout-v1" not in gymnasium.registry:
        minatar.gym.register_envs()
    n, summary = args.envs, {"bench": "minatar_envs", "envs": args.envs}
    print(f"CPU microseconds per env step at N={n} (best of 3):")
    for game in games:
        ours_env = make_vector_env(n, game, sticky_action_prob=0.0, use_minimal_action_set=True)
        actions = np.random.default_rng(0).integers(0, len(ours_env.minimal_actions), (STEPS + 1, n))
        ours = per_env_step_us(ours_env, actions, STEPS)
        name = "".join(word.title() for word in game.split("_"))
        sync = gymnasium.make_vec(f"MinAtar/{name}-v1", num_envs=n, vectorization_mode="sync", sticky_action_prob=0.0)
        theirs = per_env_step_us(sync, actions, SYNC_STEPS)
        sync.close()
        print(f"  {game:15s} {ours:7.2f} vectorized  {theirs:7.2f} SyncVectorEnv  {theirs / ours:5.1f}x")
        summary.update({f"{game}_us": round(ours, 3), f"{game}_sync_us": round(theirs, 3),
                        f"{game}_speedup": round(theirs / ours, 2)})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
