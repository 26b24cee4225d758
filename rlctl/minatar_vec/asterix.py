"""MinAtar Asterix as numpy arrays: N games stepped at once, rule for rule as `minatar.environments.asterix`.

The player moves in rows 1-8; every `spawn_speed` frames an enemy (2/3) or gold (1/3) enters a random free row from a
random side and crosses it one cell every `move_speed` frames. Touching gold gives +1 and removes it; touching an enemy
ends the episode. With difficulty ramping, every ~100 frames the spawn interval shrinks, and the move interval every
other time, down to 1.

Speed: entity slot k lives on row k+1, so the only entity the player can touch is one gather away; an empty slot is
parked at x 10 with direction 0 (it never moves and never meets the player), which lets observations be written from
lookup tables through flat indices, off-board marks landing in one spare cell past the buffer.
"""

from __future__ import annotations

import numpy as np

from rlctl.minatar_vec.base import DOWN, LEFT, RIGHT, UP, MinAtarVecEnv

RAMP_INTERVAL = 100
INIT_SPAWN_SPEED = 10
INIT_MOVE_INTERVAL = 5
N_SLOTS = 8
PARKED = 10  # the x of an empty slot
_OFF = 10**9  # an offset that lands past the observation buffer: `put(mode="clip")` sends it to the spare cell


def _tables():
    """Player moves by (action, coordinate); and over code = x*3 + dir, an entity's and its trail's flat offsets within
    its row (channel 1; the caller adds 2 for gold; trail channel 2), _OFF where nothing is drawn. Code -1 (x 0 heading
    left) is the last entry, as numpy reads a negative index."""
    x_next = np.array([[min(max(c - (a == LEFT) + (a == RIGHT), 0), 9) for c in range(10)] for a in range(6)]).ravel()
    y_next = np.array([[min(max(c - (a == UP) + (a == DOWN), 1), 8) for c in range(10)] for a in range(6)]).ravel()
    entity, trail = np.full(33, _OFF), np.full(33, _OFF)
    for x in range(10):
        for d in (-1, 1):
            entity[x * 3 + d] = x * 4 + 1
            if 0 <= x - d <= 9:
                trail[x * 3 + d] = (x - d) * 4 + 2
    return x_next, y_next, entity, trail


_X_NEXT, _Y_NEXT, _ENTITY_OFF, _TRAIL_OFF = _tables()
_START_TIMERS = np.array([[INIT_SPAWN_SPEED], [INIT_MOVE_INTERVAL]])
_START_LEVELS = np.array([[INIT_SPAWN_SPEED], [INIT_MOVE_INTERVAL], [RAMP_INTERVAL], [0]])
_START_X = np.array([9, 0])  # by from_left
_START_DIR = np.array([-1, 1])
_PARKED_TIMER = -(10**15)  # counts down from here, never reaching 0 again before the reset
# Over an 8-bit occupancy mask (bit k: slot k taken): how many slots are free, and the k-th free slot (8: none).
_N_FREE = np.array([8 - bin(m).count("1") for m in range(256)])
_KTH_FREE = np.array([([k for k in range(8) if not m >> k & 1] + [8] * 8)[:8] for m in range(256)]).ravel()


class AsterixVec(MinAtarVecEnv):
    """N MinAtar Asterix games (channels player, enemy, trail, gold)."""

    channels = ("player", "enemy", "trail", "gold")
    minimal_actions = (0, 1, 2, 3, 4)  # no-op, left, up, right, down

    def __init__(self, num_envs: int = 1, **kwargs):
        super().__init__(num_envs, **kwargs)
        n = num_envs
        self._buf = np.zeros(n * 400 + 1, dtype=bool)  # the observations, then one spare cell for off-board marks
        self._obs = self._buf[:-1].reshape(n, 10, 10, 4)
        self._env_base = np.arange(n) * 400
        self._row_base = self._env_base[:, None] + np.arange(1, N_SLOTS + 1) * 40  # slot k's row in the buffer
        self._marks = np.zeros((2, n, N_SLOTS), dtype=np.int64)  # flat indices of entity and trail marks
        self._slot_base = np.arange(n) * N_SLOTS - 1  # + player_y: the flat index of the slot on the player's row
        self.player_x = np.zeros(n, dtype=np.int64)
        self.player_y = np.zeros(n, dtype=np.int64)
        self.entity_x = np.full((n, N_SLOTS), PARKED, dtype=np.int64)
        self.entity_dir = np.zeros((n, N_SLOTS), dtype=np.int64)  # +1 entered on the left, -1 on the right, 0 empty
        self.gold = np.zeros((n, N_SLOTS), dtype=bool)
        self._x_flat, self._dir_flat = self.entity_x.reshape(-1), self.entity_dir.reshape(-1)
        self._gold_flat = self.gold.reshape(-1)
        # Per-game counters as rows of two arrays: a reset is two writes, and both timers tick in one op.
        self._timers = np.zeros((2, n), dtype=np.int64)
        self.spawn_timer, self.move_timer = self._timers
        self._levels = np.zeros((4, n), dtype=np.int64)
        self.spawn_speed, self.move_speed, self.ramp_timer, self.ramp_index = self._levels  # index: difficulty_ramp()
        self.terminal = np.zeros(n, dtype=bool)

    def _draw_spawns(self, env_ids: np.ndarray, n_free: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """MinAtar's spawn draws per env: (from the left, is gold, which free slot: uniform below n_free).

        `pick` is ignored where n_free is 0 (MinAtar then draws no slot). Tests override this to feed a reference's
        draws.
        """
        u = self.np_random.random((3, len(env_ids)))
        return u[0] < 1 / 2, u[1] < 1 / 3, (u[2] * n_free).astype(np.int64)

    def _spawn(self, ids: np.ndarray) -> None:
        """Put a new entity in a random free slot of games `ids` (none where all 8 rows are taken)."""
        occupied = np.packbits(self.entity_dir[ids] != 0, axis=1, bitorder="little")[:, 0].astype(np.int64)
        n_free = _N_FREE[occupied]
        from_left, gold, pick = self._draw_spawns(ids, n_free)
        at = ids * N_SLOTS + _KTH_FREE[occupied * 8 + pick]
        if np.count_nonzero(n_free) < len(ids):
            room = n_free > 0
            at, from_left, gold = at[room], from_left[room], gold[room]
        side = from_left.astype(np.intp)
        self._x_flat[at] = _START_X[side]
        self._dir_flat[at] = _START_DIR[side]
        self._gold_flat[at] = gold

    def _reset_games(self, mask: np.ndarray) -> None:
        self.player_x[mask] = 5
        self.player_y[mask] = 5
        self.entity_x[mask] = PARKED
        self.entity_dir[mask] = 0
        self._timers[:, mask] = _START_TIMERS
        self._levels[:, mask] = _START_LEVELS
        self.terminal[mask] = False

    def _touch(self, reward: np.ndarray, at: np.ndarray) -> None:
        """The player meets what stands on its cell (slot `at`, the only one on its row): gold is taken (+1), an enemy
        ends the game."""
        met = self._x_flat[at] == self.player_x
        if np.count_nonzero(met):
            gold = met & self._gold_flat[at]
            taken = at[gold]
            self._x_flat[taken] = PARKED
            self._dir_flat[taken] = 0
            reward += gold
            enemy = met & ~gold
            self.terminal |= enemy
            # A finished game stands still (MinAtar's act returns at once) and must not spawn, which would draw:
            # its timers are parked far below zero until the base resets it.
            self._timers[:, enemy] = _PARKED_TIMER

    def _step_games(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        spawning = self.spawn_timer == 0
        if np.count_nonzero(spawning):
            self._spawn(np.flatnonzero(spawning))
            np.copyto(self.spawn_timer, self.spawn_speed, where=spawning)

        action10 = action * 10
        self.player_x = _X_NEXT[action10 + self.player_x]
        self.player_y = _Y_NEXT[action10 + self.player_y]
        at = self._slot_base + self.player_y

        # Entities move even in the step whose first touch ends the game, as in MinAtar.
        moving = self.move_timer == 0
        reward = np.zeros(self.num_envs, dtype=np.float32)
        self._touch(reward, at)
        if np.count_nonzero(moving):
            np.copyto(self.move_timer, self.move_speed, where=moving)
            x = self.entity_x
            x += self.entity_dir * moving[:, None]
            gone = x.view(np.uint64) > 9  # walked off either side (parked slots rewrite themselves)
            np.copyto(x, PARKED, where=gone)
            np.copyto(self.entity_dir, 0, where=gone)
            self._touch(reward, at)

        self._timers -= 1
        if self.ramping:
            self._ramp()
        return reward, self.terminal.copy()

    def _ramp(self) -> None:
        """MinAtar's difficulty ramp: every RAMP_INTERVAL+1 frames, faster spawns (and moves, every other time)."""
        ramping = self.spawn_speed + self.move_speed > 2  # either is above its floor of 1
        due = ramping & (self.ramp_timer < 0)
        self.ramp_timer -= ramping
        if np.count_nonzero(due):
            self.move_speed -= due & (self.move_speed > 1) & (self.ramp_index % 2 == 1)
            self.spawn_speed -= due & (self.spawn_speed > 1)
            self.ramp_index += due
            np.copyto(self.ramp_timer, RAMP_INTERVAL, where=due)

    def _observe(self) -> np.ndarray:
        buf = self._buf
        buf.fill(False)
        buf[self._env_base + self.player_y * 40 + self.player_x * 4] = True
        code = self.entity_x * 3
        code += self.entity_dir
        marks = self._marks
        _ENTITY_OFF.take(code, out=marks[0])
        marks[0] += self.gold
        marks[0] += self.gold  # gold is channel 3, enemies channel 1
        _TRAIL_OFF.take(code, out=marks[1])
        marks += self._row_base
        buf.put(marks, True, mode="clip")
        return self._obs.copy()
