"""MinAtar Space Invaders for N envs at once: every map is a bool array [N, 10, 10] (row, column).

Port of `minatar.environments.space_invaders.Env`; the rules, their order within a step and the observation are
MinAtar's. The game has no randomness after reset, so a slot matches MinAtar exactly, frame by frame.
"""

from __future__ import annotations

import numpy as np

from rlctl.minatar_vec.base import FIRE, LEFT, RIGHT, MinAtarVecEnv

SHOT_COOL_DOWN = 5
ENEMY_MOVE_INTERVAL = 12
ENEMY_SHOT_INTERVAL = 10
FASTEST_MOVE_INTERVAL = 6  # ramping stops once the wave moves every 6 frames
_COLS = np.arange(10)


class SpaceInvadersVec(MinAtarVecEnv):
    """Vectorized MinAtar Space Invaders: cannon, alien wave, friendly and enemy bullets."""

    channels = ("cannon", "alien", "alien_left", "alien_right", "friendly_bullet", "enemy_bullet")
    minimal_actions = (0, 1, 3, 5)  # no-op, left, right, fire

    def __init__(self, num_envs: int = 1, **kwargs):
        super().__init__(num_envs, **kwargs)
        n = num_envs
        self._rows = np.arange(n)
        self.alien = np.zeros((n, 10, 10), dtype=bool)
        self.f_bullet = np.zeros((n, 10, 10), dtype=bool)
        self.e_bullet = np.zeros((n, 10, 10), dtype=bool)
        self.pos = np.zeros(n, dtype=np.int64)
        self.alien_dir = np.zeros(n, dtype=np.int64)  # -1 left, +1 right
        self.move_interval = np.zeros(n, dtype=np.int64)
        self.alien_move_timer = np.zeros(n, dtype=np.int64)
        self.alien_shot_timer = np.zeros(n, dtype=np.int64)
        self.shot_timer = np.zeros(n, dtype=np.int64)
        self.ramp_index = np.zeros(n, dtype=np.int64)
        self._obs = np.zeros((n, 10, 10, len(self.channels)), dtype=bool)

    def _reset_games(self, mask: np.ndarray) -> None:
        self.pos[mask] = 5
        self.f_bullet[mask] = False
        self.e_bullet[mask] = False
        self.alien[mask] = False
        self.alien[mask, 0:4, 2:8] = True
        self.alien_dir[mask] = -1
        self.move_interval[mask] = ENEMY_MOVE_INTERVAL
        self.alien_move_timer[mask] = ENEMY_MOVE_INTERVAL
        self.alien_shot_timer[mask] = ENEMY_SHOT_INTERVAL
        self.ramp_index[mask] = 0
        self.shot_timer[mask] = 0

    def _step_games(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, alien = self._rows, self.alien
        # Player: fire when cooled down, else move (a fire press during cool-down does nothing).
        fire = (action == FIRE) & (self.shot_timer == 0)
        self.f_bullet[rows[fire], 9, self.pos[fire]] = True
        self.shot_timer[fire] = SHOT_COOL_DOWN
        self.pos -= (action == LEFT) & (self.pos > 0)
        self.pos += (action == RIGHT) & (self.pos < 9)

        # Bullets advance one row; the ones leaving the screen vanish.
        self.f_bullet[:, :9] = self.f_bullet[:, 1:]
        self.f_bullet[:, 9] = False
        self.e_bullet[:, 1:] = self.e_bullet[:, :9]
        self.e_bullet[:, 0] = False
        terminal = self.e_bullet[rows, 9, self.pos] | alien[rows, 9, self.pos]

        moving = self.alien_move_timer == 0
        if moving.any():
            self._move_aliens(moving, terminal)
            terminal |= alien[rows, 9, self.pos]

        shooting = self.alien_shot_timer == 0
        if shooting.any():
            self._aliens_shoot(shooting)
            self.alien_shot_timer[shooting] = ENEMY_SHOT_INTERVAL

        kills = alien & self.f_bullet
        reward = kills.sum(axis=(1, 2)).astype(np.float32)
        alien ^= kills
        self.f_bullet ^= kills

        self.shot_timer -= self.shot_timer > 0
        self.alien_move_timer -= 1
        self.alien_shot_timer -= 1
        cleared = ~alien.any(axis=(1, 2))
        if cleared.any():
            ramp = cleared & (self.move_interval > FASTEST_MOVE_INTERVAL) & self.ramping
            self.move_interval -= ramp
            self.ramp_index += ramp
            alien[cleared, 0:4, 2:8] = True
        return reward, terminal

    def _move_aliens(self, moving: np.ndarray, terminal: np.ndarray) -> None:
        """The wave's move in the envs where `moving`: sideways, or down and turn when it touches its edge."""
        alien = self.alien
        self.alien_move_timer[moving] = np.minimum(alien.sum(axis=(1, 2)), self.move_interval)[moving]
        at_edge = ((alien[:, :, 0].any(axis=1) & (self.alien_dir < 0))
                   | (alien[:, :, 9].any(axis=1) & (self.alien_dir > 0)))
        down = moving & at_edge
        if down.any():
            self.alien_dir[down] *= -1
            terminal |= down & alien[:, 9, :].any(axis=1)
            # MinAtar rolls, so a wave already on the bottom row wraps to the top (seen in the final frame).
            alien[down] = np.roll(alien[down], 1, axis=1)
        left = moving & ~at_edge & (self.alien_dir < 0)
        if left.any():  # no alien is in column 0 here, so a shift equals MinAtar's roll
            alien[left, :, :9] = alien[left, :, 1:]
            alien[left, :, 9] = False
        right = moving & ~at_edge & (self.alien_dir > 0)
        if right.any():
            alien[right, :, 1:] = alien[right, :, :9]
            alien[right, :, 0] = False

    def _aliens_shoot(self, shooting: np.ndarray) -> None:
        """The lowest alien of the column nearest the cannon fires (ties go to the left column, as MinAtar's sort)."""
        envs = self._rows[shooting]
        alien = self.alien[envs]
        pos = self.pos[envs, None]
        nearness = np.abs(_COLS - pos) * 2 + (_COLS > pos)
        nearness[~alien.any(axis=1)] = 100
        col = nearness.argmin(axis=1)
        column = alien[np.arange(len(envs)), :, col]
        row = 9 - column[:, ::-1].argmax(axis=1)
        self.e_bullet[envs, row, col] = True

    def _observe(self) -> np.ndarray:
        obs, alien = self._obs, self.alien
        obs[..., 0] = False
        obs[self._rows, 9, self.pos, 0] = True
        obs[..., 1] = alien
        obs[..., 2] = alien & (self.alien_dir < 0)[:, None, None]
        obs[..., 3] = alien & (self.alien_dir > 0)[:, None, None]
        obs[..., 4] = self.f_bullet
        obs[..., 5] = self.e_bullet
        return obs.copy()  # callers may keep observations; the buffer is refilled next step

    def _load_reference(self, i: int, ref) -> None:
        """Test helper: put slot `i` into the state of MinAtar env `ref` (a `space_invaders.Env`)."""
        self.pos[i] = ref.pos
        self.alien[i] = ref.alien_map != 0
        self.f_bullet[i] = ref.f_bullet_map != 0
        self.e_bullet[i] = ref.e_bullet_map != 0
        self.alien_dir[i] = ref.alien_dir
        self.move_interval[i] = ref.enemy_move_interval
        self.alien_move_timer[i] = ref.alien_move_timer
        self.alien_shot_timer[i] = ref.alien_shot_timer
        self.shot_timer[i] = ref.shot_timer
        self.ramp_index[i] = ref.ramp_index
