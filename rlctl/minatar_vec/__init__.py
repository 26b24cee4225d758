"""Numpy-vectorized ports of MinAtar's five games: N envs stepped as arrays, for collectors.

MinAtar's own classes step one env per Python call (5-36 us a step here, more through gymnasium's SyncVectorEnv);
these step every env of a collector in one call. `attach_vector_entry_points` makes them the `vector_entry_point`
of MinAtar's gymnasium ids, so `env.vectorization = "auto"` picks them as it picks gymnasium's own vectorized
CartPole, while `gymnasium.make` (one env: evaluation, videos) and `vectorization = "sync"` keep MinAtar's classes.
Imported by rlctl.job.spec (registration) and by gymnasium when a vector env is made; imports only numpy and gymnasium.
"""

from __future__ import annotations

import importlib

# MinAtar's `game` kwarg (its gymnasium ids carry it) -> the class here.
GAME_CLASSES = {
    "breakout": "rlctl.minatar_vec.breakout:BreakoutVec",
    "asterix": "rlctl.minatar_vec.asterix:AsterixVec",
    "freeway": "rlctl.minatar_vec.freeway:FreewayVec",
    "space_invaders": "rlctl.minatar_vec.space_invaders:SpaceInvadersVec",
    "seaquest": "rlctl.minatar_vec.seaquest:SeaquestVec",
}
ENTRY_POINT = "rlctl.minatar_vec:make_vector_env"


def make_vector_env(num_envs: int = 1, game: str = "breakout", display_time: int | None = None, **kwargs):
    """The vector env of MinAtar's `game` (its gymnasium spec's kwargs; `display_time` is for its GUI only)."""
    if game not in GAME_CLASSES:
        raise ValueError(f"no vectorized MinAtar game {game!r}; there are {', '.join(GAME_CLASSES)}")
    module, _, attr = GAME_CLASSES[game].partition(":")
    return getattr(importlib.import_module(module), attr)(num_envs=num_envs, **kwargs)


def attach_vector_entry_points(registry) -> None:
    """Give MinAtar's registered ids (v0 and v1 of every game) the vectorized ports as their vector entry point."""
    for spec in registry.values():
        ours = spec.id.startswith("MinAtar/") and spec.kwargs.get("game") in GAME_CLASSES
        if ours and spec.vector_entry_point is None:
            spec.vector_entry_point = ENTRY_POINT
