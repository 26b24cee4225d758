"""MinAtar Breakout as numpy arrays: N games stepped at once, rule for rule as `minatar.environments.breakout`.

The ball moves on diagonals, reflects off walls and bricks, and is bounced back by the paddle on row 9 (straight back
when it falls onto the paddle, sideways when the paddle catches it at its landing cell); +1 per brick, the three brick
rows refill when the ball reaches row 9 with none left, and the episode ends when the ball reaches row 9 unbounced.

Speed: a numpy call costs about a microsecond whatever its size at these N, so the ball's geometry is precomputed into
lookup tables over (cell, direction), the brick map lives inside the observation buffer (channel 3), and the other
channels are updated by clearing last step's three marks rather than the whole buffer.
"""

from __future__ import annotations

import numpy as np

from rlctl.minatar_vec.base import LEFT, RIGHT, MinAtarVecEnv

# Ball directions, MinAtar's numbering: 0 up-left, 1 up-right, 2 down-right, 3 down-left. MinAtar's reflections are
# XORs of the direction: off a brick or straight off the paddle ^3, off the paddle's edge ^2 (walls ^1, top ^3).
_DX = (-1, 1, 1, -1)
_DY = (-1, -1, 1, 1)


def _ball_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over code = cell*4 + dir (cell = y*10 + x): the cell and direction after one move with wall and top
    reflections, and the cell the ball takes when bounced back vertically instead (its old row, its new column).

    A ball on row 9 heading down only belongs to a finished game: it stays put, so every index stays on the board.
    """
    move_cell, move_dir, back_cell = (np.zeros(400, dtype=np.int64) for _ in range(3))
    for cell in range(100):
        y, x = divmod(cell, 10)
        for d in range(4):
            new_x, new_y, new_d = x + _DX[d], y + _DY[d], d
            if not 0 <= new_x <= 9:
                new_x, new_d = min(max(new_x, 0), 9), new_d ^ 1
            if new_y < 0:
                new_y, new_d = 0, new_d ^ 3
            if new_y > 9:
                new_x, new_y, new_d = x, y, d
            move_cell[cell * 4 + d], move_dir[cell * 4 + d] = new_y * 10 + new_x, new_d
            back_cell[cell * 4 + d] = y * 10 + new_x
    return move_cell, move_dir, back_cell


_MOVE_CELL, _MOVE_DIR, _BACK_CELL = _ball_tables()
_CELL_X = np.arange(100) % 10
_PADDLE_NEXT = np.array([[min(max(p - (a == LEFT) + (a == RIGHT), 0), 9) for p in range(10)] for a in range(6)]).ravel()
_DIR_FLIP = np.array([0, 3, 2])  # by 1*(brick or straight paddle bounce) + 2*(paddle edge bounce); never both
_WALL = np.zeros((10, 10), dtype=bool)
_WALL[1:4, :] = True


class BreakoutVec(MinAtarVecEnv):
    """N MinAtar Breakout games (channels paddle, ball, trail, brick); deterministic after the reset's ball side."""

    channels = ("paddle", "ball", "trail", "brick")
    minimal_actions = (0, 1, 3)  # no-op, left, right

    def __init__(self, num_envs: int = 1, **kwargs):
        super().__init__(num_envs, **kwargs)
        n = num_envs
        self._obs = np.zeros((n, 10, 10, 4), dtype=bool)
        self._obs_flat = self._obs.reshape(-1)
        self.bricks = self._obs[..., 3]  # a view: the state is its own observation channel
        self._env_base = np.arange(n) * 400  # flat offset of each env's block in the observation buffer
        self._marks = np.zeros((3, n), dtype=np.int64)  # flat indices of the paddle, ball and trail marks
        self._mark_base = self._env_base + np.array([[360], [1], [2]])  # paddle on row 9 channel 0; channels 1, 2
        self.ball_cell = np.zeros(n, dtype=np.int64)  # y*10 + x
        self.ball_dir = np.zeros(n, dtype=np.int64)
        self.last_cell = np.zeros(n, dtype=np.int64)  # the ball's previous cell: the trail channel
        self.paddle = np.zeros(n, dtype=np.int64)
        self.strike = np.zeros(n, dtype=bool)  # the ball touched a brick last step: the next brick is not broken
        self.bricks_left = np.zeros(n, dtype=np.int64)
        self.terminal = np.zeros(n, dtype=bool)

    def _draw_ball_starts(self, env_ids: np.ndarray) -> np.ndarray:
        """Which side each new episode's ball starts on (True: right), MinAtar's `randint(2)`; tests override this."""
        return self.np_random.random(len(env_ids)) < 0.5

    def _reset_games(self, mask: np.ndarray) -> None:
        ids = np.flatnonzero(mask)
        from_right = self._draw_ball_starts(ids)
        cell = np.where(from_right, 39, 30)  # row 3, column 9 heading down-left or column 0 heading down-right
        self.ball_cell[ids] = cell
        self.last_cell[ids] = cell
        self.ball_dir[ids] = np.where(from_right, 3, 2)
        self.paddle[ids] = 4
        self.strike[ids] = False
        self.terminal[ids] = False
        self.bricks_left[ids] = 30
        self.bricks[ids] = _WALL

    def _step_games(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        paddle = self.paddle = _PADDLE_NEXT[action * 10 + self.paddle]
        code = self.ball_cell * 4 + self.ball_dir
        last_cell = self.last_cell = self.ball_cell
        cell, back = _MOVE_CELL[code], _BACK_CELL[code]
        d = _MOVE_DIR[code]

        # Bricks only ever fill rows 1-3, so a brick hit excludes the top and the paddle cases by itself.
        brick_at = self._env_base + cell * 4 + 3
        brick = self._obs_flat[brick_at]
        breaks = brick & ~self.strike
        self.strike = brick
        self._obs_flat[brick_at[breaks]] = False
        self.bricks_left -= breaks

        bottom = cell >= 90
        cleared = bottom & (self.bricks_left == 0)
        if np.count_nonzero(cleared):  # MinAtar refills on reaching row 9 with no bricks, whatever happens next
            self.bricks[cleared] = _WALL
            self.bricks_left[cleared] = 30
        straight = bottom & (_CELL_X[last_cell] == paddle)  # fell onto the paddle from above
        edge = bottom & (_CELL_X[cell] == paddle) & ~straight  # the paddle moved under its landing cell
        flip = breaks | straight
        np.copyto(cell, back, where=flip | edge)
        d ^= _DIR_FLIP[flip + edge * 2]
        # A finished game's ball sits on row 9 and may "bounce" again: harmless, the base resets it next.
        self.terminal |= bottom & ~(straight | edge)
        self.ball_cell, self.ball_dir = cell, d
        return breaks.astype(np.float32), self.terminal.copy()

    def _observe(self) -> np.ndarray:
        marks, flat = self._marks, self._obs_flat
        flat[marks] = False
        np.multiply(self.paddle, 4, out=marks[0])
        np.multiply(self.ball_cell, 4, out=marks[1])
        np.multiply(self.last_cell, 4, out=marks[2])
        marks += self._mark_base
        flat[marks] = True
        return self._obs.copy()
