"""MinAtar Seaquest for N envs at once: the player's state as arrays [N], objects in slot arrays [field, N, K].

Port of `minatar.environments.seaquest.Env`; rules, their order within a step, difficulty ramping and the
observation are MinAtar's. Spawns draw from `self.np_random` with MinAtar's distributions through two hooks
(`_draw_enemy_spawns`, `_draw_diver_spawns`) that tests override to replay a reference env's draws.

Slot capacities (why they suffice): a friendly bullet lives at most 10 frames and the sub fires at most every 5,
so at most 2 exist; a diver lives 59 frames and one spawns every 30, so at most 2. Enemies spawn at most one a
frame and live at most 60 frames, so any bound below 60 is a bet: their slots start at 8 (random play rarely has
more than 4 enemies at a time) and double when an env fills them, which keeps the port exact. Enemy bullets need
no slots: they are row bitmasks (see `seaquest_objects.advance_enemy_bullets`).
"""

from __future__ import annotations

import numpy as np

from rlctl.minatar_vec.base import FIRE, MinAtarVecEnv
from rlctl.minatar_vec.seaquest_objects import (BULLET_SHOTS, BULLETS, CELL, CELLS, CH, DIR, DIVER_MOVE_INTERVAL,
                                                DIVER_SPAWNS, DIVERS, ENEMIES, ENEMY_SHOT_INTERVAL, ENEMY_SPAWNS, LANE,
                                                N_CHANNELS, OPPOSING_LANE, ROW, SEQ, SHOT, TIMER, TOFF, Objects,
                                                advance_enemy_bullets, bullets_hit, diver_code, divers_board,
                                                enemies_fire, enemies_meet_bullets, enemy_code, off_screen)

MAX_OXYGEN = 200
INIT_SPAWN_SPEED = 20
DIVER_SPAWN_SPEED = 30
INIT_MOVE_INTERVAL = 5
SHOT_COOL_DOWN = 5
# Per-env scalars, rows of one array so a reset is one assignment; the three timers count down together.
_STATE = ("sub_cell", "facing", "oxygen", "diver_count", "e_spawn_speed", "move_speed", "ramp_index", "surfaced",
          "e_spawn_timer", "d_spawn_timer", "shot_timer")
_INITIAL = np.array([5, 0, MAX_OXYGEN, 0, INIT_SPAWN_SPEED, INIT_MOVE_INTERVAL, 0, 1, INIT_SPAWN_SPEED,
                     DIVER_SPAWN_SPEED, 0])
_TIMERS = slice(8, 11)
# Where an action takes the sub: cell [cell, action] and facing (1 = right) [facing, action]; fire moves nothing.
_NEXT_CELL = np.array([[y * ROW + x, y * ROW + max(0, x - 1), max(0, y - 1) * ROW + x, y * ROW + min(9, x + 1),
                        min(8, y + 1) * ROW + x, y * ROW + x] if x < 10 else [0] * 6
                       for y in range(10) for x in range(ROW)])
_NEXT_FACING = np.array([[f, 0, f, 1, f, f] for f in (0, 1)])
_BACK_OFFSET = np.array([1, -1]) * N_CHANNELS + 1  # observation index of the sub's back from its front, by facing


def _gauge_indices() -> np.ndarray:
    """Observation indices (within an env) lit by the bottom row's oxygen and diver gauges, by oxygen (0-200) * 8 +
    divers + 1 (-1 to 6); unlit places point off-screen."""
    table = np.full((MAX_OXYGEN + 1, 8, 16), 10 * ROW * N_CHANNELS)
    for oxygen in range(MAX_OXYGEN + 1):
        for divers in range(-1, 7):
            lit = [(9 * ROW + x) * N_CHANNELS + 7 for x in range(oxygen * 10 // MAX_OXYGEN)]
            lit += [(9 * ROW + x) * N_CHANNELS + 8 for x in range(9 - divers, 9)]
            table[oxygen, divers + 1, :len(lit)] = lit
    return table.reshape(-1, 16)


_GAUGES = _gauge_indices()


class SeaquestVec(MinAtarVecEnv):
    """Vectorized MinAtar Seaquest: submarine, oxygen, divers, enemy fish and subs, bullets both ways."""

    channels = ("sub_front", "sub_back", "friendly_bullet", "trail", "enemy_bullet", "enemy_fish", "enemy_sub",
                "oxygen_guage", "diver_guage", "diver")
    minimal_actions = (0, 1, 2, 3, 4, 5)

    def __init__(self, num_envs: int = 1, **kwargs):
        super().__init__(num_envs, **kwargs)
        n = num_envs
        self._tick = 0  # stamps each new object (SEQ), so list order survives slot reuse
        self.state = np.zeros((len(_STATE), n), dtype=np.int64)
        for name, row in zip(_STATE, self.state):
            setattr(self, name, row)  # views: update in place only
        self.objects = Objects(n, enemy_capacity=8)
        self.e_bullets = np.zeros((2, n, 10), dtype="<u2")  # [left/right-moving, env, row], bit = column
        self._obs = np.zeros((n, CELLS, N_CHANNELS), dtype=bool)
        self._obs_base = np.arange(n) * (CELLS * N_CHANNELS)
        self._pools = {}  # kind -> [generator drawn from, spawn codes, next unused]

    # -- random draws (tests replace the two hooks to replay MinAtar's) -------------------------------------------

    def _draw_enemy_spawns(self, envs: np.ndarray) -> np.ndarray:
        """For each env in `envs`, an `enemy_code` of MinAtar's `_spawn_enemy` draws: right 1/2, sub 1/3, row 1-8."""
        return self._pooled_draws("enemy", len(envs))

    def _draw_diver_spawns(self, envs: np.ndarray) -> np.ndarray:
        """For each env in `envs`, a `diver_code` of MinAtar's `_spawn_diver` draws: right 1/2, row 1-8."""
        return self._pooled_draws("diver", len(envs))

    def _pooled_draws(self, kind: str, count: int) -> np.ndarray:
        """`count` spawn codes, drawn from `self.np_random` a few thousand at a time (one call, not one a frame)."""
        pool = self._pools.get(kind)
        if pool is None or pool[0] is not self.np_random or pool[2] + count > len(pool[1]):
            u = self.np_random.random((3, max(4096, count)))
            rows = 1 + (u[2] * 8).astype(np.int64)
            codes = enemy_code(u[0] < 1 / 2, u[1] < 1 / 3, rows) if kind == "enemy" else diver_code(u[0] < 1 / 2, rows)
            pool = self._pools[kind] = [self.np_random, codes, 0]
        pool[2] += count
        return pool[1][pool[2] - count:pool[2]]

    # -- the game ---------------------------------------------------------------------------------------------------

    def _reset_games(self, mask: np.ndarray) -> None:
        self.state[:, mask] = _INITIAL[:, None]
        self.objects.clear(mask)
        self.objects.reload[mask, ENEMIES] = INIT_MOVE_INTERVAL
        self.e_bullets[:, mask] = 0

    def _step_games(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._tick += 1
        reward = np.zeros(self.num_envs, dtype=np.int64)
        terminal = np.zeros(self.num_envs, dtype=bool)
        self._spawn()
        self._move_player(action)
        self._move_objects(reward, terminal)
        advance_enemy_bullets(self.e_bullets, self.sub_cell, terminal)

        self.state[_TIMERS] -= self.state[_TIMERS] > 0
        terminal |= self.oxygen <= 0
        below = self.sub_cell >= ROW
        self.oxygen -= below
        self.surfaced &= ~below
        arriving = ~below & (self.surfaced == 0)
        if np.count_nonzero(arriving):
            terminal |= arriving & (self.diver_count == 0)  # surfacing with nobody to deliver ends the game
            surfacing = arriving & (self.diver_count != 0)
            if np.count_nonzero(surfacing):
                self._surface(surfacing, reward)
        return reward.astype(np.float32), terminal

    def _spawn(self) -> None:
        """Spawn an enemy and a diver where their timers ran out (an enemy is dropped if its row runs the other way)."""
        objects = self.objects
        spawning = self.e_spawn_timer == 0
        if np.count_nonzero(spawning):
            envs = spawning.nonzero()[0]
            code = self._draw_enemy_spawns(envs)
            blocked = (objects.data[LANE, envs, ENEMIES] == OPPOSING_LANE[code][:, None]).any(axis=1)
            if np.count_nonzero(blocked):
                envs, code = envs[~blocked], code[~blocked]
            columns = ENEMY_SPAWNS[:, code]
            columns[TIMER], columns[SEQ] = self.move_speed[envs], self._tick
            objects.add(ENEMIES, envs, columns)
            self.e_spawn_timer[spawning] = self.e_spawn_speed[spawning]
        spawning = self.d_spawn_timer == 0
        if np.count_nonzero(spawning):
            envs = spawning.nonzero()[0]
            columns = DIVER_SPAWNS[:, self._draw_diver_spawns(envs)]
            columns[TIMER], columns[SEQ] = DIVER_MOVE_INTERVAL, self._tick
            objects.add(DIVERS, envs, columns)
            self.d_spawn_timer[envs] = DIVER_SPAWN_SPEED

    def _move_player(self, action: np.ndarray) -> None:
        """Fire from the sub's cell when cooled down, else move (left/right also turn the sub)."""
        fire = (action == FIRE) & (self.shot_timer == 0)
        if np.count_nonzero(fire):
            envs = fire.nonzero()[0]
            columns = BULLET_SHOTS[:, self.facing[envs]]
            columns[CELL], columns[SEQ] = self.sub_cell[envs], self._tick
            self.objects.add(BULLETS, envs, columns)
            self.shot_timer[envs] = SHOT_COOL_DOWN
        self.sub_cell[:] = _NEXT_CELL[self.sub_cell, action]
        self.facing[:] = _NEXT_FACING[self.facing, action]

    def _move_objects(self, reward: np.ndarray, terminal: np.ndarray) -> None:
        """MinAtar's friendly-bullet, diver, enemy-sub and enemy-fish loops, as one move of every object.

        The loops touch different things except where noted (bullets against enemies as they stood before moving,
        then against enemies that moved onto them), and those cases go to the ordered passes.
        """
        objects, sub_cell = self.objects, self.sub_cell[:, None]
        cell, clocks = objects.data[CELL], objects.data[TIMER:SHOT + 1]  # move and shot timers
        before = cell.copy()
        moving, fires = clocks == 0  # fish, divers, bullets and empty slots hold a shot timer of -1
        clocks -= clocks > 0
        np.copyto(clocks[0], objects.reload, where=moving)
        np.add(cell, objects.data[DIR], out=cell, where=moving)
        gone = off_screen(cell)
        if np.count_nonzero(gone):
            objects.clear(gone)
            fires &= ~gone  # a sub leaving fires once more in MinAtar, off-screen, where the shot hits nothing
        hits = cell[:, BULLETS, None] == before[:, None, ENEMIES]  # [env, bullet, enemy]
        if np.count_nonzero(hits):
            bullets_hit(objects, before, hits, reward, fires)
        here_after = cell == sub_cell
        here = (before == sub_cell) | here_after
        boarding = here[:, DIVERS]
        if np.count_nonzero(boarding):
            divers_board(objects, boarding, self.diver_count)
        terminal |= here[:, ENEMIES].any(axis=1)
        if np.count_nonzero(fires):
            objects.data[SHOT][fires] = ENEMY_SHOT_INTERVAL
            enemies_fire(objects, fires, self.e_bullets)
        # A bullet left on an enemy's cell means the enemy moved onto it (had it been there, the bullet would have hit).
        meets = cell[:, None, ENEMIES] == cell[:, BULLETS, None]
        if np.count_nonzero(meets):
            enemies_meet_bullets(objects, meets & (moving & ~here_after)[:, None, ENEMIES], reward)

    def _surface(self, mask: np.ndarray, reward: np.ndarray) -> None:
        """MinAtar's `_surface`: refill oxygen, drop a diver (or cash in all six for oxygen left), ramp difficulty.

        Cashing in six leaves the count at -1, as in MinAtar, so the next surfacing does not end the game.
        """
        self.surfaced |= mask
        full = mask & (self.diver_count == 6)
        reward += np.where(full, self.oxygen * 10 // MAX_OXYGEN, 0)
        self.diver_count[full] = 0
        self.oxygen[mask] = MAX_OXYGEN
        self.diver_count -= mask
        if self.ramping:
            ramp = mask & ((self.e_spawn_speed > 1) | (self.move_speed > 2))
            self.move_speed -= ramp & (self.move_speed > 2) & (self.ramp_index % 2 == 1)
            self.e_spawn_speed -= ramp & (self.e_spawn_speed > 1)
            self.ramp_index += ramp
            self.objects.reload[ramp, ENEMIES] = self.move_speed[ramp, None]

    def _observe(self) -> np.ndarray:
        obs, base, n = self._obs, self._obs_base, self.num_envs
        obs.fill(False)
        flat, data = obs.reshape(-1), self.objects.data
        front = base + self.sub_cell * N_CHANNELS
        flat[front] = True
        flat[front + _BACK_OFFSET[self.facing]] = True
        at = base[:, None] + data[CELL] * N_CHANNELS + data[CH]  # empty slots draw in row 10, cut off below
        flat[at] = True
        flat[at + data[TOFF]] = True  # trails; one off the edge lands in an off-screen column
        grid = obs.reshape(n, 11, ROW, N_CHANNELS)
        bits = np.unpackbits((self.e_bullets[0] | self.e_bullets[1]).view(np.uint8), axis=1, bitorder="little")
        grid[:, :10, :, 4] = bits.reshape(n, 10, ROW)
        gauges = np.maximum(self.oxygen, 0) * 8 + np.maximum(self.diver_count + 1, 0)
        flat[base[:, None] + np.take(_GAUGES, gauges, axis=0)] = True
        return grid[:, :10, :10].copy()

    def _load_reference(self, i: int, ref) -> None:
        """Test helper: put slot `i` into the state of MinAtar env `ref` (a `seaquest.Env`), lists in their order."""
        for name in ("oxygen", "diver_count", "e_spawn_speed", "move_speed", "ramp_index", "e_spawn_timer",
                     "d_spawn_timer", "shot_timer"):
            getattr(self, name)[i] = getattr(ref, name)
        self.sub_cell[i], self.facing[i], self.surfaced[i] = ref.sub_y * ROW + ref.sub_x, ref.sub_or, ref.surface
        self.e_bullets[:, i] = 0
        for x, y, right in ref.e_bullets:
            self.e_bullets[int(right), i, y] |= 1 << x
        self.objects.clear(np.arange(self.num_envs) == i)
        self.objects.reload[i, ENEMIES] = ref.move_speed
        env = np.array([i])
        for seq, s in enumerate(ref.e_subs + ref.e_fish):  # SEQ: list order within each kind, before any spawn
            columns = ENEMY_SPAWNS[:, [enemy_code(s[2], len(s) == 5, s[1])]]
            columns[CELL] += s[0] - columns[CELL] % ROW
            columns[TIMER], columns[SEQ] = s[3], seq - 1000
            if len(s) == 5:
                columns[SHOT] = s[4]
            self.objects.add(ENEMIES, env, columns)
        for seq, (x, y, right, timer) in enumerate(ref.divers):
            columns = DIVER_SPAWNS[:, [diver_code(right, y)]]
            columns[CELL] += x - columns[CELL] % ROW
            columns[TIMER], columns[SEQ] = timer, seq - 1000
            self.objects.add(DIVERS, env, columns)
        for seq, (x, y, right) in enumerate(ref.f_bullets):
            columns = BULLET_SHOTS[:, [int(right)]]
            columns[CELL], columns[SEQ] = y * ROW + x, seq - 1000
            self.objects.add(BULLETS, env, columns)
