"""MinAtar Freeway as numpy arrays: N games stepped at once, rule for rule as `minatar.environments.freeway`.

The chicken walks up column 4 (one cell per 3 frames) across 8 lanes of cars; reaching row 0 gives +1, sends it back to
row 9 and redraws every car's speed; a car on its cell sends it back to row 9. The car of row r drives along it,
wrapping around, moving once every |speed| + 1 frames. The episode ends after 2500 frames (2501 steps).

Speed: car arrays are indexed by row (10 columns; rows 0 and 9 hold parked dummy cars), so "the car in the chicken's
row" is a single gather, and observations are written through flat indices into one preallocated buffer.
"""

from __future__ import annotations

import numpy as np

from rlctl.minatar_vec.base import DOWN, UP, MinAtarVecEnv

PLAYER_SPEED = 3  # frames between chicken moves
TIME_LIMIT = 2500
LANES = slice(1, 9)  # the car columns that hold real cars
_C = 7  # channels
_VERTICAL = np.isin(np.arange(6), (UP, DOWN))
_Y_NEXT = np.array([[min(max(y - (a == UP) + (a == DOWN), 0), 9) for y in range(10)] for a in range(6)]).ravel()


class FreewayVec(MinAtarVecEnv):
    """N MinAtar Freeway games (channels chicken, car, speed1..speed5 trails)."""

    channels = ("chicken", "car", "speed1", "speed2", "speed3", "speed4", "speed5")
    minimal_actions = (0, 2, 4)  # no-op, up, down

    def __init__(self, num_envs: int = 1, **kwargs):
        super().__init__(num_envs, **kwargs)
        n = num_envs
        self._obs = np.zeros((n, 10, 10, _C), dtype=bool)
        self._obs_flat = self._obs.reshape(-1)
        env_base = np.arange(n) * 100 * _C
        self._chicken_base = env_base + 4 * _C  # column 4, channel 0
        self._car_base = env_base[:, None] + np.arange(1, 9) * 10 * _C + 1  # row r, column 0, channel 1
        self._lane_base = np.arange(n) * 10  # flat offset of each env's row in the [N, 10] car arrays
        self.chicken_y = np.zeros(n, dtype=np.int64)
        self.move_timer = np.zeros(n, dtype=np.int64)
        self.time_left = np.zeros(n, dtype=np.int64)  # MinAtar's terminate_timer
        self.terminal = np.zeros(n, dtype=bool)
        # Dummy cars (columns 0 and 9) park at x 0 with direction 0: never moving, never on column 4.
        self.car_x = np.zeros((n, 10), dtype=np.int64)
        self._car_x_flat = self.car_x.reshape(-1)
        self.car_dir = np.zeros((n, 10), dtype=np.int64)  # +1 rightwards, -1 leftwards
        self.car_period = np.ones((n, 10), dtype=np.int64)  # |speed|: 1 (moves every other frame) .. 5
        self.car_timer = np.zeros((n, 10), dtype=np.int64)  # frames until the car next moves

    def _draw_car_velocities(self, env_ids: np.ndarray) -> np.ndarray:
        """Signed car speeds (int [len(env_ids), 8]) as MinAtar draws them: |v| uniform in 1..5, sign a coin flip.

        Tests override this to feed the values a reference env drew.
        """
        u = self.np_random.random((2, len(env_ids), 8))
        speeds = (u[0] * 5).astype(np.int64) + 1
        return np.where(u[1] < 0.5, -speeds, speeds)

    def _set_car_velocities(self, ids: np.ndarray) -> None:
        velocity = self._draw_car_velocities(ids)
        period = np.abs(velocity)
        self.car_period[ids, LANES] = period
        self.car_timer[ids, LANES] = period
        self.car_dir[ids, LANES] = np.sign(velocity)

    def _reset_games(self, mask: np.ndarray) -> None:
        ids = np.flatnonzero(mask)
        self._set_car_velocities(ids)
        self.car_x[ids] = 0
        self.chicken_y[ids] = 9
        self.move_timer[ids] = PLAYER_SPEED
        self.time_left[ids] = TIME_LIMIT
        self.terminal[ids] = False

    def _step_games(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ready = self.move_timer == 0
        np.copyto(self.move_timer, PLAYER_SPEED, where=ready & _VERTICAL[action])  # even when a wall stops it
        y = self.chicken_y = np.where(ready, _Y_NEXT[action * 10 + self.chicken_y], self.chicken_y)

        # A finished game must not draw new speeds (MinAtar's act returns at once); the rest of its step is harmless.
        crossed = (y == 0) & ~self.terminal
        if np.count_nonzero(crossed):
            self._set_car_velocities(np.flatnonzero(crossed))
            y[crossed] = 9

        # Only the car in the chicken's row can hit it, and once sent to row 9 (a dummy lane) no car can, so MinAtar's
        # car-by-car order does not matter. A hit counts before the car moves and after.
        lane = self._lane_base + y
        hit = self._car_x_flat[lane] == 4
        moving = self.car_timer == 0
        self.car_timer -= 1
        np.copyto(self.car_timer, self.car_period, where=moving)
        self.car_x += self.car_dir * moving
        np.remainder(self.car_x, 10, out=self.car_x)  # wrap around: -1 -> 9, 10 -> 0
        hit |= self._car_x_flat[lane] == 4
        np.copyto(y, 9, where=hit)

        self.move_timer -= self.move_timer > 0
        self.time_left -= 1
        self.terminal |= self.time_left < 0
        return crossed.astype(np.float32), self.terminal.copy()

    def _observe(self) -> np.ndarray:
        flat = self._obs_flat
        self._obs.fill(False)
        flat[self._chicken_base + self.chicken_y * (10 * _C)] = True
        x = self.car_x[:, LANES]
        flat[self._car_base + x * _C] = True
        trail_x = x - self.car_dir[:, LANES]
        trail_x %= 10
        flat[self._car_base + trail_x * _C + self.car_period[:, LANES]] = True  # channel speedK = 1 + K
        return self._obs.copy()
