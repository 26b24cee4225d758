"""Vectorized MinAtar Breakout, Freeway and Asterix against MinAtar's own games.

Lockstep: each slot of a vector env runs beside a MinAtar reference env whose random draws are recorded and fed to the
vector env's draw hook, so every observation, reward and terminal must match exactly, across episodes and autoresets.
Statistics: random-policy return and length against MinAtar's (constants below; `python tests/test_minatar_vec_a.py`
recomputes them). Contract: gymnasium's vector API. Speed against SyncVectorEnv over MinAtar: bench/minatar_envs.py.
"""

from __future__ import annotations


import gymnasium
import numpy as np
import pytest

from conftest import missing_extra
from minatar_stats import assert_statistics_match, first_episodes, minatar_game, reference_stats

if missing_extra("minatar", "minatar"):
    pytest.skip(missing_extra("minatar", "minatar"), allow_module_level=True)
asterix = minatar_game("asterix")
breakout = minatar_game("breakout")
freeway = minatar_game("freeway")

from rlctl.minatar_vec.asterix import AsterixVec  # noqa: E402
from rlctl.minatar_vec.breakout import BreakoutVec  # noqa: E402
from rlctl.minatar_vec.freeway import FreewayVec  # noqa: E402


class RecordingRandom:
    """Stands in for a MinAtar env's RandomState and queues every draw, for the vector env's hook to take."""

    def __init__(self, seed: int):
        self.state = np.random.RandomState(seed)
        self.draws: list[tuple[str, tuple, object]] = []

    def rand(self, *args):
        value = self.state.rand(*args)
        self.draws.append(("rand", args, value))
        return value

    def randint(self, *args):
        value = self.state.randint(*args)
        self.draws.append(("randint", args, np.copy(value)))  # MinAtar multiplies its speeds in place
        return value

    def take(self, name: str, args: tuple):
        """The oldest queued draw, which must be the call `name(*args)` (the vector env draws what MinAtar drew)."""
        assert self.draws, f"vector env drew {name}{args}; the reference drew nothing"
        got_name, got_args, value = self.draws.pop(0)
        assert (got_name, got_args) == (name, args), f"vector env drew {name}{args}; reference {got_name}{got_args}"
        return value


class FedBreakout(BreakoutVec):
    """BreakoutVec whose ball sides are the ones its reference envs (`refs`, one per slot) drew."""

    refs: list = []

    def _draw_ball_starts(self, env_ids):
        return np.array([self.refs[i].random.take("randint", (2,)) == 1 for i in env_ids], dtype=bool)


class FedFreeway(FreewayVec):
    """FreewayVec whose car speeds are the ones its reference envs drew."""

    refs: list = []

    def _draw_car_velocities(self, env_ids):
        rows = []
        for i in env_ids:
            speeds = self.refs[i].random.take("randint", (1, 6, 8))
            rows.append(speeds * np.sign(self.refs[i].random.take("rand", (8,)) - 0.5).astype(int))
        return np.array(rows, dtype=np.int64).reshape(len(env_ids), 8)


class FedAsterix(AsterixVec):
    """AsterixVec whose spawns are the ones its reference envs drew; it checks its free-slot counts against theirs."""

    refs: list = []
    full_spawns = 0  # spawns that found all 8 rows taken: the lockstep must cover them

    def _draw_spawns(self, env_ids, n_free):
        draws = []
        for i, free in zip(env_ids, n_free):
            rnd = self.refs[i].random
            from_left, gold = rnd.take("rand", ()) < 1 / 2, rnd.take("rand", ()) < 1 / 3
            pick = rnd.take("randint", (int(free),)) if free else 0
            self.full_spawns += free == 0
            draws.append((from_left, gold, pick))
        from_left, gold, pick = (np.array(column) for column in zip(*draws))
        return from_left, gold, pick.astype(np.int64)


def breakout_tracking(refs, rng):
    """Chase the ball's next cells, 2% random: long episodes that clear (and refill) the wall, bricks back to back."""
    lead = rng.integers(0, 3, len(refs))  # aim 0-2 cells ahead, to vary straight and edge bounces
    target = [min(9, max(0, r.ball_x + (-1, 1, 1, -1)[r.ball_dir] * j)) for r, j in zip(refs, lead)]
    act = np.array([3 if x > r.pos else 1 if x < r.pos else 0 for r, x in zip(refs, target)])
    return np.where(rng.random(len(refs)) < 0.02, rng.integers(0, 6, len(refs)), act)


def asterix_ramped(refs, vec):
    """Start slots at assorted points of the difficulty ramp (spawn, its timer, move, its timer, ramp timer, index)."""
    starts = [None, (3, 0, 2, 0, 2, 9), (2, 0, 1, 0, 0, 12), (1, 0, 1, 0, 50, 20), (4, 1, 3, 2, 1, 4),
              (1, 0, 5, 4, 50, 7), (2, 1, 4, 0, 0, 7), None]
    names = ("spawn_speed", "spawn_timer", "move_speed", "move_timer", "ramp_timer", "ramp_index")
    for i, start in enumerate(starts[:len(refs)]):
        for name, value in zip(names, start or ()):
            setattr(refs[i], name, value)
            getattr(vec, name)[i] = value


def lockstep(fed_cls, module, k, steps, seed, ramping=True, policy=None, prepare=None):
    """Step k reference envs and a k-slot fed vector env together, asserting equality every step; (returns, vec)."""
    refs = []
    for i in range(k):
        ref = module.Env(ramping=ramping)
        ref.random = RecordingRandom(seed + i)
        ref.reset()
        refs.append(ref)
    vec = fed_cls(k, sticky_action_prob=0.0, difficulty_ramping=ramping)
    vec.refs = refs
    obs, _ = vec.reset(seed=seed)
    if prepare:
        prepare(refs, vec)
        obs = vec._observe()
    assert all(not r.random.draws for r in refs)
    assert np.array_equal(obs, np.stack([r.state() for r in refs]))
    rng = np.random.default_rng(seed)
    done, returns, ret = np.zeros(k, dtype=bool), [], np.zeros(k)
    for t in range(steps):
        actions = policy(refs, rng) if policy else rng.integers(0, 6, k)
        reward, terminal = np.zeros(k, dtype=np.float32), np.zeros(k, dtype=bool)
        for i, ref in enumerate(refs):
            if done[i]:  # gymnasium NEXT_STEP: this step starts a new episode
                ref.reset()
            else:
                reward[i], terminal[i] = ref.act(int(actions[i]))
        obs, got_reward, got_terminal, truncated, _ = vec.step(actions)
        assert all(not r.random.draws for r in refs), f"step {t}: the vector env drew less than the reference"
        assert np.array_equal(obs, np.stack([r.state() for r in refs])), f"step {t}: observations differ"
        assert np.array_equal(got_reward, reward), f"step {t}: rewards {got_reward} != {reward}"
        assert np.array_equal(got_terminal, terminal) and not truncated.any(), f"step {t}: terminals differ"
        ret += reward
        returns += list(ret[terminal])
        ret[terminal] = 0
        done = terminal
    return returns, vec


def test_breakout_lockstep_random_and_tracking():
    assert len(lockstep(FedBreakout, breakout, k=4, steps=400, seed=1)[0]) > 50
    returns, _ = lockstep(FedBreakout, breakout, k=4, steps=1500, seed=2, policy=breakout_tracking)
    assert max(returns) > 30  # a wall was cleared and refilled


def test_freeway_lockstep_through_the_time_limit():
    up_mostly = lambda refs, rng: rng.choice(6, size=len(refs), p=[.1, .1, .5, .1, .1, .1])
    returns, _ = lockstep(FedFreeway, freeway, k=3, steps=2600, seed=3, policy=up_mostly)
    assert len(returns) == 3 and min(returns) > 0  # every episode redrew its car speeds mid-episode


@pytest.mark.parametrize("ramping", [True, False])
def test_asterix_lockstep(ramping):
    returns, vec = lockstep(FedAsterix, asterix, k=8, steps=800, seed=4, ramping=ramping, prepare=asterix_ramped)
    assert len(returns) > 40 and sum(returns) > 10
    assert vec.full_spawns > 0


# -- random-policy statistics -------------------------------------------------------------------------------------

POLICY = {"breakout": [1 / 6] * 6, "freeway": [.1, .1, .5, .1, .1, .1], "asterix": [1 / 6] * 6}
EPISODES = {"breakout": 16, "freeway": 2, "asterix": 8}  # per vector slot, 256 slots
VEC = {"breakout": BreakoutVec, "freeway": FreewayVec, "asterix": AsterixVec}
MODULE = {"breakout": breakout, "freeway": freeway, "asterix": asterix}
# MinAtar's own envs under POLICY: (return mean, return std, length mean, length std, episodes), as
# minatar_stats.reference_stats gives them.
REFERENCE = {
    "breakout": (0.5339, 0.7569, 11.4552, 7.9083, 100000),
    "freeway": (10.665, 3.2636, 2501.0, 0.0, 1200),
    "asterix": (0.4943, 0.8623, 70.2357, 44.4891, 40000),
}


def draw_policy(game):
    """Actions of the full set under POLICY[game]."""
    return lambda rng, size: rng.choice(6, size=size, p=POLICY[game])


@pytest.mark.parametrize("game", list(VEC))
def test_random_policy_statistics_match_minatar(game):
    returns, lengths = first_episodes(VEC[game](256, sticky_action_prob=0.0), draw_policy(game), EPISODES[game])
    assert_statistics_match(game, returns, lengths, REFERENCE[game])


# -- gymnasium contract --------------------------------------------------------------------------------------------

FRESH = {  # what an observation at the start of an episode must show
    "breakout": lambda o: o[9, 4, 0] and o[3, :, 1].any() and o[1:4, :, 3].all() and o[..., 3].sum() == 30,
    "freeway": lambda o: o[9, 4, 0] and o[1:9, 0, 1].all() and o[..., 1].sum() == 8,
    "asterix": lambda o: o[5, 5, 0] and o.sum() == 1,
}


@pytest.mark.parametrize("game", list(VEC))
def test_gymnasium_vector_contract(game):
    n, limit = 16, 25
    ref = MODULE[game].Env()
    env = VEC[game](n, max_episode_steps=limit)
    channels = ref.state_shape()[2]
    assert env.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.NEXT_STEP
    assert env.single_observation_space.shape == (10, 10, channels) and env.single_observation_space.dtype == bool
    assert env.observation_space.shape == (n, 10, 10, channels) and env.single_action_space.n == 6
    assert list(env.action_space.nvec) == [6] * n
    minimal = VEC[game](n, use_minimal_action_set=True)
    assert list(minimal.action_set) == ref.minimal_action_set() == list(VEC[game].minimal_actions)
    assert minimal.single_action_space.n == len(ref.minimal_action_set())

    obs, _ = env.reset(seed=7)
    assert obs.dtype == bool and obs.shape == (n, 10, 10, channels) and all(FRESH[game](o) for o in obs)
    rng, steps_in_episode, fresh = np.random.default_rng(7), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    trajectory, truncations = [obs], 0
    for _ in range(3 * limit):
        obs, reward, terminated, truncated, _ = env.step(rng.integers(0, 6, n))
        trajectory.append(obs)
        assert obs.dtype == bool and reward.dtype == np.float32 and reward.shape == (n,)
        assert not (terminated & truncated).any()
        steps_in_episode = np.where(fresh, 0, steps_in_episode + 1)
        assert np.array_equal(truncated, (steps_in_episode == limit) & ~terminated)
        assert not reward[fresh].any() and not terminated[fresh].any() and not truncated[fresh].any()
        assert all(FRESH[game](o) for o in obs[fresh])
        fresh = terminated | truncated
        truncations += truncated.sum()
    assert truncations > 0

    again = VEC[game](n, max_episode_steps=limit)
    obs, _ = again.reset(seed=7)
    rng = np.random.default_rng(7)
    assert np.array_equal(obs, trajectory[0])
    for t in range(1, 3 * limit + 1):
        assert np.array_equal(again.step(rng.integers(0, 6, n))[0], trajectory[t])


if __name__ == "__main__":
    for name, episodes in (("breakout", 100000), ("freeway", 1200), ("asterix", 40000)):
        stats = reference_stats(MODULE[name].Env, draw_policy(name), episodes)
        print(f'"{name}": {tuple(round(float(v), 4) for v in stats)},')
