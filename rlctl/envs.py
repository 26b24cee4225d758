"""Environment construction: gymnasium vector envs from the job's [env] section."""

from __future__ import annotations

import importlib

import gymnasium as gym
import numpy as np

from rlctl.spec import EnvSpec


def resolve_env_id(env_id: str) -> str:
    """A registered id as is; an entry point `module:attr` registered once under a derived id."""
    if ":" not in env_id or env_id in gym.registry:
        return env_id
    module, _, attr = env_id.partition(":")
    try:
        getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"env.id {env_id!r}: cannot load entry point ({exc})") from None
    derived = f"rlctl-{module.replace('.', '-')}-{attr}-v0"
    if derived not in gym.registry:
        gym.register(id=derived, entry_point=env_id)
    return derived


def make_vec_env(spec: EnvSpec, num_envs: int | None = None) -> gym.vector.VectorEnv:
    """Vector env per the job: native vectorized implementation where one exists (auto), else sync/async."""
    env_id = resolve_env_id(spec.id)
    num = num_envs or spec.envs_per_collector
    mode = spec.vectorization
    kwargs = dict(spec.kwargs)
    if spec.max_episode_steps is not None:
        kwargs["max_episode_steps"] = spec.max_episode_steps
    if mode == "auto":
        mode = "vector_entry_point" if gym.spec(env_id).vector_entry_point is not None else "sync"
    return gym.make_vec(env_id, num_envs=num, vectorization_mode=mode, **kwargs)


def space_info(env: gym.vector.VectorEnv) -> tuple[tuple[int, ...], np.dtype, int]:
    """(single observation shape, its dtype, number of discrete actions) of a vector env."""
    obs, act = env.single_observation_space, env.single_action_space
    if not isinstance(act, gym.spaces.Discrete):
        raise ValueError(f"this algorithm needs a discrete action space, got {act}")
    return tuple(obs.shape), np.dtype(obs.dtype), int(act.n)
