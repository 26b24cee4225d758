"""Seaquest's moving objects for N envs: one slot array standing in for MinAtar's Python lists, and their updates.

All objects live in `Objects.data` [field, env, slot]: slots 0-1 hold friendly bullets, 2-3 divers, 4 on enemies
(fish and subs). A position is a cell, row * 16 + column: columns 10-15 and row 10 are off-screen, so an object
that steps off the edge (column -1 wraps to 15, or 10) lands off-screen. An empty slot holds dead values (a cell in
row 10, direction 0, timers -1) that match no live cell, never move and never fire, so the common-case updates need
no alive mask, and bullets, divers and enemies move in one pass.

MinAtar walks each list newest first and removes as it goes. Here everything moves at once; an ordered pass (by the
SEQ field, MinAtar's list order) runs only in the envs where order decides an outcome: two bullets reaching one
enemy, stacked enemies meeting one bullet, two divers and one free seat.
"""

from __future__ import annotations

import numpy as np

CELL, DIR, TIMER, SHOT, CH, TOFF, SEQ, LANE = range(8)  # slot fields
# TOFF: observation-index offset from an object to its trail; LANE: an enemy's row * 2 + (1 if heading right).
ROW = 16  # cell = row * ROW + column
CELLS = 11 * ROW  # cells per env, off-screen ones included
N_CHANNELS = 10
BULLETS, DIVERS, ENEMIES = slice(0, 2), slice(2, 4), slice(4, None)
BULLET_CH, TRAIL_CH, FISH_CH, SUB_CH, DIVER_CH = 2, 3, 5, 6, 9
ENEMY_SHOT_INTERVAL = 10
DIVER_MOVE_INTERVAL = 5
_SUB_FIRST = 1 << 40  # rank = is_sub * this + SEQ
_INT_MIN, _INT_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def off_screen(cell: np.ndarray) -> np.ndarray:
    """Cells in columns 10-15 (a step off either edge lands there)."""
    return (cell & (ROW - 1)) > 9


def enemy_code(right, is_sub, row):
    """One number for an enemy spawn draw (moves right, is a sub, row 1-8): the column of `ENEMY_SPAWNS`."""
    return np.asarray(right) * 18 + np.asarray(is_sub) * 9 + np.asarray(row)


def diver_code(right, row):
    """One number for a diver spawn draw (moves right, row 1-8): the column of `DIVER_SPAWNS`."""
    return np.asarray(right) * 9 + np.asarray(row)


def _new_objects(right, row, shot, channel, trail: bool = True, lane: bool = False) -> np.ndarray:
    """Slot values [field, m] of new objects; TIMER, SEQ (and a bullet's CELL) are filled in when one is made."""
    right, row, shot, channel = np.broadcast_arrays(right, row, shot, channel)
    columns = np.zeros((8, right.size), dtype=np.int64)
    columns[CELL], columns[DIR], columns[SHOT], columns[CH] = row * ROW + 9 * (1 - right), 2 * right - 1, shot, channel
    columns[TOFF] = TRAIL_CH - columns[CH] - columns[DIR] * N_CHANNELS if trail else 0  # the cell behind
    columns[LANE] = row * 2 + right if lane else -1
    return columns


_RIGHT, _SUB, _ROW = (a.ravel() for a in np.meshgrid([0, 1], [0, 1], np.arange(9), indexing="ij"))
ENEMY_SPAWNS = _new_objects(_RIGHT, _ROW, np.where(_SUB, ENEMY_SHOT_INTERVAL, -1), FISH_CH + _SUB, lane=True)
OPPOSING_LANE = ENEMY_SPAWNS[LANE] ^ 1  # by enemy_code: the lane whose enemies block the spawn
_RIGHT, _ROW = (a.ravel() for a in np.meshgrid([0, 1], np.arange(9), indexing="ij"))
DIVER_SPAWNS = _new_objects(_RIGHT, _ROW, -1, DIVER_CH)  # by diver_code
BULLET_SHOTS = _new_objects(np.array([0, 1]), 0, -1, BULLET_CH, trail=False)  # by facing; CELL is the sub's


class Objects:
    """Every object of N envs in `data` [field, env, slot]; the enemy slots double when an env's are all taken.

    `reload` [env, slot] is what a slot's TIMER is set to when it moves: 0 for bullets (they move every frame), 5 for
    divers, the env's move_speed for enemies (kept in step as the difficulty ramps).
    """

    def __init__(self, num_envs: int, enemy_capacity: int):
        self.dead = self._dead(4 + enemy_capacity)
        self.data = np.repeat(self.dead[:, None, :], num_envs, axis=1)
        self.reload = np.zeros((num_envs, 4 + enemy_capacity), dtype=np.int64)
        self.reload[:, DIVERS] = DIVER_MOVE_INTERVAL

    @staticmethod
    def _dead(capacity: int) -> np.ndarray:
        """Empty-slot values [field, slot]; each kind of slot has its own row-10 cell, so empties never meet."""
        dead = np.zeros((8, capacity), dtype=np.int64)
        dead[CELL] = 10 * ROW + np.minimum(np.arange(capacity) // 2, 2)
        dead[TIMER] = dead[SHOT] = dead[LANE] = -1
        return dead

    def add(self, kind: slice, envs: np.ndarray, columns: np.ndarray) -> None:
        """Put one new object (`columns` [field, len(envs)]) into a free `kind` slot of each of `envs` (distinct)."""
        if kind != ENEMIES:  # two slots, never both taken (MinAtar's timers rule it out): the first free one
            self.data[:, envs, kind.start + (self.data[DIR, envs, kind.start] != 0)] = columns
            return
        free = self.data[DIR, envs, kind] == 0
        slot = free.argmax(axis=1)
        if np.count_nonzero(free[np.arange(len(envs)), slot]) < len(envs):
            self._grow()
            return self.add(kind, envs, columns)
        self.data[:, envs, slot + kind.start] = columns

    def _grow(self) -> None:
        n, k = self.data.shape[1:]
        extra = k - 4
        self.dead = self._dead(k + extra)
        self.data = np.concatenate([self.data, np.repeat(self.dead[:, None, k:], n, axis=1)], axis=2)
        self.reload = np.concatenate([self.reload, np.repeat(self.reload[:, -1:], extra, axis=1)], axis=1)

    def clear(self, mask: np.ndarray) -> None:
        """Empty every slot of the envs where `mask` [N] is set, or the slots where `mask` [N, K] is."""
        if mask.ndim == 1:
            self.data[:, mask] = self.dead[:, None, :]
        else:
            np.copyto(self.data, self.dead[:, None, :], where=mask)

    def kill(self, envs: np.ndarray, slots: np.ndarray) -> None:
        """Empty slot `slots[j]` of env `envs[j]`, for each j."""
        self.data[:, envs, slots] = self.dead[:, slots]

    def newest_first(self, kind: slice, envs: np.ndarray) -> np.ndarray:
        """Slot indices of `envs`' `kind` slots, newest object first ([len(envs), slots]); empty slots last."""
        seq = np.where(self.data[DIR, envs, kind] != 0, self.data[SEQ, envs, kind], _INT_MIN)
        return np.argsort(-seq, axis=1, kind="stable") + kind.start


def bullets_hit(objects: Objects, before: np.ndarray, hits: np.ndarray, reward: np.ndarray,
                fires: np.ndarray) -> None:
    """MinAtar's friendly-bullet loop, where some bullet reached an enemy (`hits` [env, bullet, enemy]).

    Each bullet kills the first fish (else sub) in list order on its cell, as enemies stood before this frame's
    moves (`before`; a victim's cell is blanked there, and its shot this frame cancelled in `fires`). Where both
    bullets of an env hit, the newer goes first, as MinAtar walks the list newest first.
    """
    env, bullet = hits.any(axis=2).nonzero()
    later = np.zeros(len(env), dtype=bool)
    both = env[1:] == env[:-1]  # pairs come env by env, bullet 0 before bullet 1
    if np.count_nonzero(both):
        second_newer = objects.data[SEQ, env[1:], bullet[1:]] > objects.data[SEQ, env[:-1], bullet[:-1]]
        later[1:] |= both & ~second_newer
        later[:-1] |= both & second_newer
    for now in (~later, later):
        e, b = env[now], bullet[now]
        on_cell = before[e, ENEMIES] == objects.data[CELL, e, b][:, None]
        hit = on_cell.any(axis=1)
        rank = np.where(on_cell, (objects.data[CH, e, ENEMIES] == SUB_CH) * _SUB_FIRST
                        + objects.data[SEQ, e, ENEMIES], _INT_MAX)
        e, b, victim = e[hit], b[hit], rank[hit].argmin(axis=1) + ENEMIES.start
        objects.kill(e, victim)
        objects.kill(e, b)
        before[e, victim] = objects.dead[CELL, victim]
        fires[e, victim] = False
        reward[e] += 1
        if not np.count_nonzero(later):
            break


def divers_board(objects: Objects, boarding: np.ndarray, diver_count: np.ndarray) -> None:
    """MinAtar's diver loop, where a diver is on the sub's cell before or after its move (`boarding` [env, diver]).

    Divers board while a seat is free (< 6); when two want the last seat, the newer takes it, as MinAtar walks the
    list newest first. One that boards before its move never moves in MinAtar; here it has moved, but it is removed
    all the same.
    """
    seats = 6 - diver_count
    short = boarding.sum(axis=1) > seats
    if np.count_nonzero(short):
        boarding = boarding & (seats > 0)[:, None]
        seq = objects.data[SEQ, :, DIVERS]
        last_seat = short & (seats == 1)
        boarding[last_seat] = np.stack([seq[:, 0] > seq[:, 1], seq[:, 1] > seq[:, 0]], axis=1)[last_seat]
    boards = np.zeros(objects.data.shape[1:], dtype=bool)
    boards[:, DIVERS] = boarding
    objects.clear(boards)
    diver_count += boarding.sum(axis=1)


def enemies_fire(objects: Objects, fires: np.ndarray, e_bullets: np.ndarray) -> None:
    """Subs whose shot timer ran out (`fires` [env, slot]) drop a bullet on their cell, heading their way."""
    env, slot = fires.nonzero()
    cell = objects.data[CELL, env, slot]
    heading = (objects.data[DIR, env, slot] > 0).astype(np.intp)
    # Two subs may fire into one row at once, so OR in place with `at`, which applies repeated indices in turn.
    np.bitwise_or.at(e_bullets, (heading, env, cell // ROW), (1 << (cell % ROW)).astype(e_bullets.dtype))


def enemies_meet_bullets(objects: Objects, meets: np.ndarray, reward: np.ndarray) -> None:
    """MinAtar's sub and fish loops, where an enemy moved onto a bullet (`meets` [env, bullet, enemy]).

    MinAtar walks subs newest first, then fish newest first, each taking the oldest bullet on its new cell; that
    equals taking bullets oldest first, each by the highest-ranked enemy that moved onto it.
    """
    envs = meets.any(axis=(1, 2)).nonzero()[0]
    meets, rows = meets[envs], np.arange(len(envs))
    for bullet in objects.newest_first(BULLETS, envs)[:, ::-1].T:
        d = objects.data[:, envs]
        candidates = meets[rows, bullet] & (d[DIR, :, ENEMIES] != 0)  # not taken by an older bullet
        hit = candidates.any(axis=1)
        rank = np.where(candidates, (d[CH, :, ENEMIES] == SUB_CH) * _SUB_FIRST + d[SEQ, :, ENEMIES], _INT_MIN)
        objects.kill(envs[hit], rank[hit].argmax(axis=1) + ENEMIES.start)
        objects.kill(envs[hit], bullet[hit])
        reward[envs] += hit


def advance_enemy_bullets(e_bullets: np.ndarray, sub_cell: np.ndarray, terminal: np.ndarray) -> None:
    """MinAtar's enemy-bullet loop on row bitmasks `e_bullets` [left/right-moving, env, row] (bit = column).

    Enemy bullets only ever hit the player, so which cells hold one (per direction) is all that matters, however
    many share a cell and in whatever list order. The player dies if one is on its cell before or after the move:
    a left-mover now on its column or the next, or a right-mover on its column or the one before.
    """
    envs, row, col = np.arange(len(sub_cell)), sub_cell // ROW, sub_cell % ROW
    near = (e_bullets[0, envs, row] | (e_bullets[1, envs, row] << 1)) >> col
    terminal |= (near & 3) != 0
    e_bullets[0] >>= 1
    e_bullets[1] <<= 1
    e_bullets[1] &= (1 << 10) - 1
