"""What every vectorized MinAtar game shares: spaces, seeding, sticky actions, time limits, next-step autoreset.

A game subclass keeps its state as arrays with one row per env and implements three array methods
(`_reset_games`, `_step_games`, `_observe`); no Python loop runs per env. The dynamics follow MinAtar's own
per-env classes (`minatar.environments.*`), which stay the reference: tests step both and compare.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

# MinAtar's full action set, by index: no-op, left, up, right, down, fire.
NOOP, LEFT, UP, RIGHT, DOWN, FIRE = range(6)


class MinAtarVecEnv(VectorEnv):
    """N copies of one MinAtar game stepped together as numpy arrays (gymnasium NEXT_STEP autoreset).

    Keyword arguments are MinAtar's (`sticky_action_prob`, `difficulty_ramping`, `use_minimal_action_set`) plus
    gymnasium's `max_episode_steps` (a truncation; MinAtar itself has none but Freeway's own clock).
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}
    channels: tuple[str, ...] = ()  # channel names in MinAtar's order
    minimal_actions: tuple[int, ...] = ()  # MinAtar's minimal_action_set(), as indices into the full set

    def __init__(self, num_envs: int = 1, sticky_action_prob: float = 0.1, difficulty_ramping: bool = True,
                 use_minimal_action_set: bool = False, max_episode_steps: int | None = None,
                 render_mode: str | None = None):
        self.num_envs = num_envs
        self.sticky_action_prob = float(sticky_action_prob)
        self.ramping = bool(difficulty_ramping)
        self.max_episode_steps = max_episode_steps
        self.render_mode = render_mode
        self.action_set = np.asarray(self.minimal_actions if use_minimal_action_set else range(6), dtype=np.int64)
        self.single_action_space = spaces.Discrete(len(self.action_set))
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.single_observation_space = spaces.Box(0.0, 1.0, shape=(10, 10, len(self.channels)), dtype=bool)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.last_action = np.zeros(num_envs, dtype=np.int64)
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self.prev_done = np.zeros(num_envs, dtype=bool)
        self._all = np.ones(num_envs, dtype=bool)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Every env to a fresh episode."""
        super().reset(seed=seed)
        self._reset_games(self._all)
        self.steps[:] = 0
        self.prev_done[:] = False
        return self._observe(), {}

    def step(self, actions):
        """One step of every env; envs that ended on the previous call start a new episode instead (reward 0)."""
        a = self.action_set[np.asarray(actions, dtype=np.int64)]
        if self.sticky_action_prob > 0.0:
            sticky = self.np_random.random(self.num_envs) < self.sticky_action_prob
            a = np.where(sticky, self.last_action, a)
        self.last_action = a
        reward, terminated = self._step_games(a)
        self.steps += 1
        if self.max_episode_steps is not None:
            truncated = (self.steps >= self.max_episode_steps) & ~terminated
        else:
            truncated = np.zeros(self.num_envs, dtype=bool)
        if self.prev_done.any():
            self._reset_games(self.prev_done)
            self.steps[self.prev_done] = 0
            reward[self.prev_done] = 0.0
            terminated[self.prev_done] = False
            truncated[self.prev_done] = False
        self.prev_done = terminated | truncated
        return self._observe(), reward, terminated, truncated, {}

    # -- what a game implements -------------------------------------------------------------------------------------

    def _reset_games(self, mask: np.ndarray) -> None:
        """Start a new episode in the envs where `mask` (bool [N]) is set; others keep their state."""
        raise NotImplementedError

    def _step_games(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advance every env by one step of full-set actions (int [N]); returns (reward float32 [N], terminal bool [N]).

        Envs already terminal may be stepped (their rows are reset right after); they must not raise.
        """
        raise NotImplementedError

    def _observe(self) -> np.ndarray:
        """The observation of every env: bool [N, 10, 10, channels], MinAtar's `state()` stacked."""
        raise NotImplementedError
