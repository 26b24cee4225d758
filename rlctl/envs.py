"""Environment construction: gymnasium vector envs from the job's [env] section."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rlctl.job.entry_points import EntryPointError, load_entry_point, one_line
from rlctl.job.env_ids import ENV_PACKAGES, register_env_packages
from rlctl.job.spec import EnvSpec


class EnvStartError(RuntimeError):
    """The job's env cannot be made here (an entry point that does not load, a constructor that raises): an error
    that recurs on every start, so a role process that meets it stops for good (rlctl.roles.context.role_main).
    The message is one line and names the env."""


def resolve_env_id(env_id: str) -> str:
    """A registered id as is (ALE and MinAtar ids once register_env_packages has run); an entry point `module:attr`
    registered once under a derived id."""
    if ":" not in env_id:
        # A package's ids also when something else registered them first: MinAtar's get their vector entry point.
        if env_id not in gym.registry or env_id.split("/")[0] in ENV_PACKAGES:
            register_env_packages()
        return env_id
    if env_id in gym.registry:
        return env_id
    module, _, attr = env_id.partition(":")
    try:
        load_entry_point(env_id)
    except EntryPointError as exc:
        raise EnvStartError(f"env.id {env_id!r}: {exc}") from None
    derived = f"rlctl-{module.replace('.', '-')}-{attr}-v0"
    if derived not in gym.registry:
        gym.register(id=derived, entry_point=env_id)
    return derived


def make_vec_env(spec: EnvSpec, num_envs: int | None = None, outer_wrappers: list | None = None,
                 render_mode: str | None = None) -> gym.vector.VectorEnv:
    """Vector env per the job: native vectorized implementation where one exists (auto), else sync/async;
    the job's wrappers around every sub-env, then `outer_wrappers` (called once per sub-env, in order).
    EnvStartError when it cannot be made, whatever the cause (the env's own code may raise anything)."""
    try:
        return _make_vec_env(spec, num_envs, outer_wrappers, render_mode)
    except EnvStartError:
        raise
    except Exception as exc:
        raise EnvStartError(f"env.id {spec.id!r}: making the env failed ({one_line(exc)})") from exc


def _make_vec_env(spec: EnvSpec, num_envs: int | None, outer_wrappers: list | None,
                  render_mode: str | None) -> gym.vector.VectorEnv:
    env_id = resolve_env_id(spec.id)
    num = num_envs or spec.envs_per_collector
    mode = spec.vectorization
    kwargs = dict(spec.kwargs)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if spec.max_episode_steps is not None:
        kwargs["max_episode_steps"] = spec.max_episode_steps
    wrappers = preset_wrappers(spec) + [_wrapper(w.name, w.kwargs) for w in spec.wrappers] + list(outer_wrappers or [])
    if spec.preset == "atari" and env_id.startswith("ALE/"):
        kwargs.setdefault("frameskip", 1)  # AtariPreprocessing skips frames itself
    if mode == "auto":
        native = gym.spec(env_id).vector_entry_point is not None and not wrappers
        mode = "vector_entry_point" if native else "sync"
    return gym.make_vec(env_id, num_envs=num, vectorization_mode=mode, wrappers=wrappers or None, **kwargs)


def preset_wrappers(spec: EnvSpec) -> list:
    """The preset's wrappers (innermost first): `atari` is AtariPreprocessing, then FrameStackObservation."""
    if spec.preset != "atari":
        return []
    a = spec.atari

    def atari(env: gym.Env) -> gym.Env:
        env = gym.wrappers.AtariPreprocessing(env, noop_max=a.noop_max, frame_skip=a.frame_skip,
                                              screen_size=a.screen_size, grayscale_obs=a.grayscale,
                                              terminal_on_life_loss=a.terminal_on_life_loss, scale_obs=False)
        return gym.wrappers.FrameStackObservation(env, a.frame_stack) if a.frame_stack > 1 else env
    return [atari]


def _wrapper(name: str, kwargs: dict):
    """`module:Class` -> a callable that wraps one env with it."""
    try:
        cls = load_entry_point(name)
    except EntryPointError as exc:
        raise EnvStartError(f"env.wrappers: {name!r}: {exc}") from None
    return lambda env: cls(env, **kwargs)


class MaskVelocity(gym.ObservationWrapper):
    """Hides the velocities of a classic-control observation, leaving a partially observed task.

    CartPole's (x, x_dot, theta, theta_dot) becomes (x, theta): a policy has to remember earlier observations to
    tell which way the pole is moving. Other envs name the observation entries to keep with `keep`.
    """

    KEEP = {"CartPole": (0, 2)}

    def __init__(self, env: gym.Env, keep: list[int] | None = None):
        super().__init__(env)
        if keep is None:
            name = env.spec.id.split("-")[0] if env.spec is not None else ""
            if name not in self.KEEP:
                raise ValueError(f"MaskVelocity: say which observation entries to keep (keep = [...]) for {name!r}")
            keep = list(self.KEEP[name])
        self.keep = np.asarray(keep, dtype=np.int64)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[self.keep], space.high[self.keep], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """The kept entries."""
        return observation[self.keep]


def autoreset_valid(done: np.ndarray, done_before: np.ndarray) -> np.ndarray:
    """Which steps of a [T, n_envs] block are transitions under gymnasium's NEXT_STEP autoreset.

    The step after an episode end resets that env (the action is ignored, the reward is 0): not a transition.
    `done` is terminated | truncated per step, `done_before` the same for the step before the block.
    """
    valid = np.empty(done.shape, dtype=bool)
    if len(done):
        np.logical_not(done_before, out=valid[0])
        np.logical_not(done[:-1], out=valid[1:])
    return valid


@dataclass(frozen=True)
class SpaceInfo:
    """What a policy needs to know of an env: observation shape/dtype and the action space (Discrete or Box)."""

    obs_shape: tuple[int, ...]
    obs_dtype: str
    n_actions: int = 0  # Discrete: number of actions; 0 for Box
    action_shape: tuple[int, ...] = ()  # Box: action shape
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

    @property
    def discrete(self) -> bool:
        """True for a Discrete action space."""
        return self.n_actions > 0

    @property
    def obs_bytes(self) -> int:
        """Bytes of one observation."""
        return int(np.prod(self.obs_shape, dtype=np.int64)) * np.dtype(self.obs_dtype).itemsize

    def to_dict(self) -> dict:
        """Plain data for checkpoints."""
        return {"obs_shape": list(self.obs_shape), "obs_dtype": self.obs_dtype, "n_actions": self.n_actions,
                "action_shape": list(self.action_shape), "action_low": list(self.action_low),
                "action_high": list(self.action_high)}

    @classmethod
    def from_dict(cls, d: dict) -> "SpaceInfo":
        """Inverse of to_dict."""
        return cls(tuple(d["obs_shape"]), d.get("obs_dtype", "float32"), int(d.get("n_actions", 0)),
                   tuple(d.get("action_shape", ())), tuple(d.get("action_low", ())), tuple(d.get("action_high", ())))


def env_space_info(env: gym.vector.VectorEnv) -> SpaceInfo:
    """SpaceInfo of a vector env; Discrete and Box action spaces are supported."""
    obs, act = env.single_observation_space, env.single_action_space
    if isinstance(act, gym.spaces.Discrete):
        return SpaceInfo(tuple(obs.shape), str(np.dtype(obs.dtype)), n_actions=int(act.n))
    if isinstance(act, gym.spaces.Box):
        return SpaceInfo(tuple(obs.shape), str(np.dtype(obs.dtype)), action_shape=tuple(act.shape),
                         action_low=tuple(float(x) for x in act.low.reshape(-1)),
                         action_high=tuple(float(x) for x in act.high.reshape(-1)))
    raise ValueError(f"unsupported action space {act}: rlctl handles Discrete and Box")


def probe_space_info(spec: EnvSpec) -> SpaceInfo:
    """SpaceInfo of the job's env, from a one-env vector env that is closed again."""
    env = make_vec_env(spec, num_envs=1)
    try:
        return env_space_info(env)
    except ValueError as exc:  # a space rlctl cannot handle: the same on every start
        raise EnvStartError(f"env.id {spec.id!r}: {exc}") from None
    finally:
        env.close()
