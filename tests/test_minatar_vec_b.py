"""Vectorized MinAtar Space Invaders and Seaquest against MinAtar's own games.

Lockstep: each slot of a vector env runs beside a MinAtar reference env, from fresh episodes and from mid-game states
copied out of MinAtar envs (`_load_reference`), and every observation, reward and terminal must match exactly, over
whole episodes. Space Invaders has no randomness after reset; Seaquest's spawn draws are recorded from the reference
and fed to the vector env's draw hooks. Statistics: random-policy return and length against MinAtar's (constants
below; `python tests/test_minatar_vec_b.py` recomputes them). Contract: gymnasium's vector API. Speed:
bench/minatar_envs.py.
"""

from __future__ import annotations

import copy
import types

import gymnasium
import numpy as np
import pytest

from conftest import missing_extra
from minatar_stats import assert_statistics_match, first_episodes, minatar_game, reference_stats

if missing_extra("minatar", "minatar"):
    pytest.skip(missing_extra("minatar", "minatar"), allow_module_level=True)
seaquest = minatar_game("seaquest")
space_invaders = minatar_game("space_invaders")

from rlctl.minatar_vec.seaquest import SeaquestVec  # noqa: E402
from rlctl.minatar_vec.seaquest_objects import diver_code, enemy_code  # noqa: E402
from rlctl.minatar_vec.space_invaders import SpaceInvadersVec  # noqa: E402


class RecordingRandom:
    """Stands in for a MinAtar env's RandomState and queues every draw, for the vector env's hooks to take."""

    def __init__(self, seed: int):
        self.state = np.random.RandomState(seed)
        self.draws: list[tuple[str, object]] = []

    def rand(self):
        return self._queue("rand", self.state.rand())

    def randint(self, low, high):
        return self._queue("randint", self.state.randint(low=low, high=high))

    def _queue(self, name, value):
        self.draws.append((name, value))
        return value

    def take(self, *names: str) -> list:
        """The oldest queued draws, which must be calls of `names` in that order."""
        got = [self.draws.pop(0) for _ in names if self.draws]
        assert [name for name, _ in got] == list(names), f"vector env drew {names}; the reference drew {got}"
        return [value for _, value in got]


class FedSeaquest(SeaquestVec):
    """SeaquestVec whose spawns are the ones its reference envs (`refs`, one per slot) drew."""

    refs: list = []

    def _draw_enemy_spawns(self, envs):
        draws = [self.refs[i].random.take("rand", "rand", "randint") for i in envs]
        return np.array([enemy_code(right < 1 / 2, sub < 1 / 3, row) for right, sub, row in draws], dtype=np.int64)

    def _draw_diver_spawns(self, envs):
        draws = [self.refs[i].random.take("rand", "randint") for i in envs]
        return np.array([diver_code(right < 1 / 2, row) for right, row in draws], dtype=np.int64)


def lockstep(vec, refs, steps: int, rng, restart, policy=None, watch=None) -> int:
    """Step `vec`'s slots and the reference envs `refs` with the same random actions, asserting equal frames; a slot
    whose episode ended gets `restart(i)` (a new reference episode, reset or copied in). `watch(ref, before, reward)`,
    if given, sees each reference step (`before`: a copy of the env), to count events. Returns episodes ended."""
    episodes = 0
    for t in range(steps):
        action = rng.choice(6, size=len(refs), p=policy)
        before = [types.SimpleNamespace(**copy.deepcopy({k: v for k, v in vars(r).items() if k != "random"}))
                  for r in refs] if watch else None
        expected = [ref.act(int(a)) for ref, a in zip(refs, action)]  # first, so Seaquest's draws are recorded
        reward, terminal = vec._step_games(action)
        obs = vec._observe()
        for i, ref in enumerate(refs):
            assert (reward[i], terminal[i]) == expected[i], f"step {t}, env {i}: (reward, terminal)"
            wrong = sorted({int(c) for c in np.argwhere(obs[i] != ref.state())[:, 2]})
            assert not wrong, f"step {t}, env {i}: channels {wrong} differ"
            if watch:
                watch(ref, before[i], reward[i])
        for i in np.flatnonzero(terminal):
            restart(i)
            episodes += 1
    if isinstance(vec, FedSeaquest):
        assert not any(ref.random.draws for ref in refs), "the reference drew what the vector env did not"
    return episodes


# -- lockstep: whole episodes, fresh and from mid-game states -------------------------------------------------------

def envs_and_references(game: str, n: int, ramping: bool = True, seed: int = 0):
    """A vector env of n slots and n MinAtar reference envs (Seaquest's recording their draws for the slots)."""
    if game == "space_invaders":
        vec, refs = SpaceInvadersVec(n, difficulty_ramping=ramping), [space_invaders.Env(ramping) for _ in range(n)]
    else:
        vec, refs = FedSeaquest(n, difficulty_ramping=ramping), [seaquest.Env(ramping) for _ in range(n)]
        for i, ref in enumerate(refs):
            ref.random = RecordingRandom(seed + i)
        vec.refs = refs
    vec.reset(seed=0)
    return vec, refs


@pytest.mark.parametrize("ramping", [True, False])
@pytest.mark.parametrize("game", ["space_invaders", "seaquest"])
def test_lockstep_whole_episodes(game, ramping):
    vec, refs = envs_and_references(game, 16, ramping)

    def restart(i):
        refs[i].reset()
        vec._reset_games(np.arange(len(refs)) == i)

    assert lockstep(vec, refs, 250, np.random.default_rng(3), restart) >= 60


def invaders_mid_game(ref, rng) -> None:
    """A random mid-game state: a thinned wave at any height (sometimes on the bottom row), bullets in flight,
    timers mid-count, the difficulty ramped some way."""
    ref.reset()
    ref.f_bullet_map, ref.e_bullet_map = (rng.random((2, 10, 10)) < 0.03).astype(float)
    ref.alien_map = np.zeros((10, 10))
    top, left = rng.integers(0, 7), rng.integers(0, 5)
    ref.alien_map[top:top + 4, left:left + 6] = rng.random((4, 6)) < rng.choice([0.05, 0.2, 0.6, 1.0])
    ref.alien_map[top, left + rng.integers(0, 6)] = 1
    ref.alien_dir, ref.enemy_move_interval = int(rng.choice([-1, 1])), int(rng.integers(6, 13))
    ref.ramp_index = 12 - ref.enemy_move_interval
    ref.alien_move_timer = int(rng.integers(0, ref.enemy_move_interval))
    ref.alien_shot_timer, ref.shot_timer, ref.pos = (int(v) for v in rng.integers(0, [11, 6, 10]))


def invaders_seen(seen, ref, before, reward):
    """Count into `seen` what a Space Invaders step went through."""
    seen["waves cleared"] = seen.get("waves cleared", 0) + (ref.alien_map.sum() > before.alien_map.sum())
    seen["ramps"] = seen.get("ramps", 0) + (ref.ramp_index > before.ramp_index)
    seen["wave on the bottom row"] = seen.get("wave on the bottom row", 0) + before.alien_map[9].any()


def seaquest_mid_game(ref, rng) -> None:
    """A random harder state: divers aboard (or the -1 MinAtar leaves after cashing in six), difficulty ramped
    (spawns up to every frame: many and stacked enemies), oxygen, position and timers anywhere."""
    ref.reset()
    ref.diver_count = int(rng.integers(-2, 7))
    ref.e_spawn_speed, ref.move_speed, ref.ramp_index = (int(v) for v in rng.integers([1, 2, 0], [21, 6, 20]))
    ref.e_spawn_timer = int(rng.integers(0, ref.e_spawn_speed + 1))
    ref.oxygen, ref.d_spawn_timer, ref.sub_y, ref.sub_x = (int(v) for v in rng.integers([1, 0, 0, 1], [201, 31, 9, 9]))
    ref.surface = ref.sub_y == 0


def seaquest_seen(seen, ref, before, reward):
    """Count into `seen` what a Seaquest step went through (and the most enemies at once)."""
    enemies = [tuple(e[:2]) for e in ref.e_subs + ref.e_fish]
    events = {"stacked enemies": len(set(enemies)) < len(enemies), "boardings": ref.diver_count > before.diver_count,
              "kills": reward > 0 and len(enemies) < len(before.e_subs + before.e_fish),
              "six cashed in": reward > 1, "ramps": ref.ramp_index > before.ramp_index}
    for name, happened in events.items():
        seen[name] = seen.get(name, 0) + happened
    seen["enemies at once"] = max(seen.get("enemies at once", 0), len(enemies))


MID_GAME = {"space_invaders": (invaders_mid_game, invaders_seen, [0.1, 0.2, 0.1, 0.2, 0.1, 0.3]),
            "seaquest": (seaquest_mid_game, seaquest_seen, [0.1, 0.2, 0.15, 0.2, 0.15, 0.2])}


@pytest.mark.parametrize("game", list(MID_GAME))
def test_lockstep_from_mid_game_states(game):
    vec, refs = envs_and_references(game, 16, seed=100)
    make_state, count, policy = MID_GAME[game]
    rng, seen = np.random.default_rng(4), {}

    def restart(i):
        make_state(refs[i], rng)
        vec._load_reference(i, refs[i])

    for i in range(len(refs)):
        restart(i)
    assert lockstep(vec, refs, 300, rng, restart, policy, watch=lambda *args: count(seen, *args)) >= 50
    assert min(seen.values()) >= 3, seen  # the run went through all of these
    if game == "seaquest":
        assert seen["enemies at once"] > 8 and vec.objects.data.shape[2] > 4 + 8, seen  # enemy slots grew


ORDER_CASES = {  # what happens in MinAtar: the attributes set on a fresh env (the sub at row 1, doing nothing)
    "two bullets, one fish: the newer bullet kills it": dict(
        f_bullets=[[3, 5, True], [5, 5, False]], e_fish=[[4, 5, True, 3]]),
    "two bullets, two stacked fish: both die": dict(
        f_bullets=[[3, 5, True], [5, 5, False]], e_fish=[[4, 5, True, 3], [4, 5, True, 1]]),
    "a bullet into stacked fish: the first listed dies": dict(
        f_bullets=[[2, 6, True]], e_fish=[[3, 6, True, 2], [3, 6, True, 4]]),
    "stacked subs move onto a bullet: the newest dies, and fires still": dict(
        f_bullets=[[6, 4, False]], e_subs=[[4, 4, True, 0, 3], [4, 4, True, 0, 0]]),
    "a sub and a fish move onto a bullet: the sub dies": dict(
        f_bullets=[[6, 4, False]], e_subs=[[4, 4, True, 0, 5]], e_fish=[[4, 4, True, 0]]),
    "two divers, one seat: the newer boards": dict(
        sub_x=5, sub_y=3, diver_count=5, divers=[[5, 3, True, 2], [5, 3, False, 3]]),
    "two divers, seats for both": dict(sub_x=5, sub_y=3, diver_count=2, divers=[[5, 3, True, 2], [4, 3, True, 0]]),
    "a diver onto a full sub stays": dict(sub_x=5, sub_y=3, diver_count=6, divers=[[4, 3, True, 0]]),
}


@pytest.mark.parametrize("case", list(ORDER_CASES))
def test_seaquest_lockstep_where_list_order_decides(case):
    vec, refs = envs_and_references("seaquest", 1)
    refs[0].sub_y, refs[0].surface = 1, False
    for name, value in ORDER_CASES[case].items():
        setattr(refs[0], name, value)
    vec._load_reference(0, refs[0])
    lockstep(vec, refs, 6, np.random.default_rng(0), restart=lambda i: None, policy=[1, 0, 0, 0, 0, 0])


# -- statistics under a random policy ------------------------------------------------------------------------------

VEC = {"space_invaders": SpaceInvadersVec, "seaquest": SeaquestVec}
MODULE = {"space_invaders": space_invaders, "seaquest": seaquest}
EPISODES = {"space_invaders": 8, "seaquest": 24}  # per slot, of 256
# MinAtar's own envs under a uniform random policy: (return mean, return std, length mean, length std, episodes).
REFERENCE = {
    "space_invaders": (2.9673, 2.3647, 50.1403, 38.1245, 15000),
    "seaquest": (0.0998, 0.3897, 28.2194, 36.1612, 60000),
}


def uniform(rng, size):
    """Uniformly random actions of the full set."""
    return rng.integers(0, 6, size)


@pytest.mark.parametrize("game", list(VEC))
def test_random_policy_statistics_match_minatar(game):
    returns, lengths = first_episodes(VEC[game](256, sticky_action_prob=0.0), uniform, EPISODES[game])
    assert_statistics_match(game, returns, lengths, REFERENCE[game])


# -- gymnasium contract --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("game", list(VEC))
def test_gymnasium_vector_contract(game):
    n, limit = 16, 30
    ref = MODULE[game].Env()
    channels = ref.state_shape()[2]
    env = VEC[game](n, max_episode_steps=limit)
    assert env.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.NEXT_STEP
    assert list(env.channels) == sorted(ref.channels, key=ref.channels.get)
    assert env.single_observation_space.shape == (10, 10, channels) and env.single_observation_space.dtype == bool
    assert env.observation_space.shape == (n, 10, 10, channels) and env.single_action_space.n == 6
    minimal = VEC[game](n, use_minimal_action_set=True)
    assert list(minimal.action_set) == ref.minimal_action_set()
    assert minimal.single_action_space.n == len(ref.minimal_action_set())

    obs, _ = env.reset(seed=7)
    ref.reset()
    fresh_obs = ref.state()
    assert obs.dtype == bool and obs.shape == (n, 10, 10, channels) and (obs == fresh_obs).all()
    rng, steps_in_episode, fresh = np.random.default_rng(7), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    trajectory, ends = [obs], np.zeros(2, dtype=np.int64)
    for _ in range(4 * limit):
        obs, reward, terminated, truncated, _ = env.step(rng.integers(0, 6, n))
        trajectory.append(obs)
        assert obs.dtype == bool and obs.shape == (n, 10, 10, channels)
        assert reward.dtype == np.float32 and reward.shape == (n,) and not (terminated & truncated).any()
        steps_in_episode = np.where(fresh, 0, steps_in_episode + 1)
        assert np.array_equal(truncated, (steps_in_episode == limit) & ~terminated)
        # The step after an episode's end starts the next: its first observation, reward 0, not done.
        assert not reward[fresh].any() and not terminated[fresh].any() and not truncated[fresh].any()
        assert (obs[fresh] == fresh_obs).all()
        fresh = terminated | truncated
        ends += terminated.sum(), truncated.sum()
    assert ends.all(), f"terminations, truncations: {ends}"
    assert not np.shares_memory(trajectory[-1], trajectory[-2])  # observations are not overwritten later

    again = VEC[game](n, max_episode_steps=limit)
    obs, _ = again.reset(seed=7)
    rng = np.random.default_rng(7)
    assert np.array_equal(obs, trajectory[0])
    for t in range(1, len(trajectory)):
        assert np.array_equal(again.step(rng.integers(0, 6, n))[0], trajectory[t]), f"step {t} not reproduced"


if __name__ == "__main__":
    for name, episodes in (("space_invaders", 15000), ("seaquest", 60000)):
        print(f'"{name}": {tuple(round(float(v), 4) for v in reference_stats(MODULE[name].Env, uniform, episodes))},')
