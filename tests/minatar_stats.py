"""Random-policy statistics of a MinAtar game, for the vectorized ports' tests: MinAtar's own per-env class
against a port's first episodes per slot, compared within a few standard errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Callable

import numpy as np

Draw = Callable[[np.random.Generator, int], np.ndarray]  # (rng, how many) -> actions of the full set


def minatar_game(name: str) -> ModuleType:
    """MinAtar's own game module (minatar.environments.NAME), loaded from its file alone.

    Importing it the usual way runs the package's __init__, which imports MinAtar's display (seaborn, matplotlib:
    2.5 s of every test session); the game modules need only numpy.
    """
    spec = importlib.util.find_spec("minatar")
    path = Path(spec.submodule_search_locations[0]) / "environments" / f"{name}.py"
    game_spec = importlib.util.spec_from_file_location(f"minatar_reference_{name}", path)
    module = importlib.util.module_from_spec(game_spec)
    game_spec.loader.exec_module(module)
    return module


def reference_stats(env_class, draw: Draw, episodes: int, seed: int = 0, max_len: int = 5000) -> tuple:
    """(return mean, return std, length mean, length std, episodes) of MinAtar's own game (ramping on, no sticky
    actions) under the policy `draw` samples from."""
    env = env_class(ramping=True)
    env.random = np.random.RandomState(seed)
    rng = np.random.default_rng(seed)
    returns, lengths = [], []
    for _ in range(episodes):
        env.reset()
        actions, total, n, done = draw(rng, max_len), 0, 0, False
        while not done:
            reward, done = env.act(int(actions[n]))
            total, n = total + reward, n + 1
        returns.append(total)
        lengths.append(n)
    return np.mean(returns), np.std(returns), np.mean(lengths), np.std(lengths), episodes


def first_episodes(env, draw: Draw, k: int, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of each slot's first `k` episodes under `draw` (not the first episodes overall, which
    would favour short ones); the autoreset step belongs to no episode."""
    n = env.num_envs
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    returns, lengths = [[] for _ in range(n)], [[] for _ in range(n)]
    ret, length, fresh = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    while min(len(r) for r in returns) < k:
        _, reward, terminated, truncated, _ = env.step(draw(rng, n))
        assert not truncated.any()
        ret += reward
        length += ~fresh
        for i in np.flatnonzero(terminated):
            returns[i].append(ret[i])
            lengths[i].append(length[i])
        ret[terminated], length[terminated], fresh = 0, 0, terminated
    return np.concatenate([r[:k] for r in returns]), np.concatenate([x[:k] for x in lengths])


def assert_statistics_match(game: str, returns: np.ndarray, lengths: np.ndarray, reference: tuple) -> None:
    """Mean return and length within 4.5 standard errors of MinAtar's (`reference` as reference_stats gives it)."""
    ret_mean, ret_std, len_mean, len_std, ref_n = reference
    for name, got, mean, std in (("return", returns, ret_mean, ret_std), ("length", lengths, len_mean, len_std)):
        tolerance = 4.5 * std * np.sqrt(1 / len(got) + 1 / ref_n) + 1e-9
        assert abs(got.mean() - mean) <= tolerance, f"{game} mean {name} {got.mean():.3f}, MinAtar {mean:.3f}"
