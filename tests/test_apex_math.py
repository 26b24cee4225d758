"""Tests for the Ape-X DQN math (rlctl.algos.apex.dqn) and the Q-network helpers (rlctl.models)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from conftest import examples
from rlctl.algos.apex.dqn import (
    NStepAccumulator,
    double_dqn_targets,
    epsilon_ladder,
    initial_priorities,
    td_loss,
)
from rlctl.models import QNetwork, flat_parameters, load_flat_parameters, mlp, parameter_digest

torch.set_num_threads(1)

GAMMA = 0.9


def _step_1env(acc, t, reward, terminated=False, truncated=False, valid=True):
    """Feed a 1-env step whose obs is the id t and next_obs is t + 1."""
    return acc.step(
        obs=np.array([[t]], dtype=np.float32),
        actions=np.array([t % 2]),
        rewards=np.array([reward], dtype=np.float32),
        next_obs=np.array([[t + 1]], dtype=np.float32),
        terminated=np.array([terminated]),
        truncated=np.array([truncated]),
        valid=np.array([valid]),
    )


def _assert_rows(out, obs_ids, rewards, next_ids, discounts):
    """Check the emitted rows (in order) against hand-computed values."""
    np.testing.assert_array_equal(out["obs"][:, 0], np.array(obs_ids, dtype=np.float32))
    np.testing.assert_allclose(out["reward"], rewards, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out["next_obs"][:, 0], np.array(next_ids, dtype=np.float32))
    np.testing.assert_allclose(out["discount"], discounts, rtol=1e-6, atol=1e-7)
    assert out["reward"].dtype == np.float32 and out["discount"].dtype == np.float32
    assert out["action"].dtype == np.int64


# ---------------------------------------------------------------- n-step: hand-computed


def test_nstep_one_env_middle_then_termination():
    acc = NStepAccumulator(num_envs=1, n=3, gamma=GAMMA, obs_shape=(1,))
    assert len(_step_1env(acc, 0, 1.0)["obs"]) == 0
    assert len(_step_1env(acc, 1, 2.0)["obs"]) == 0
    out = _step_1env(acc, 2, 3.0)
    _assert_rows(out, [0], [1 + 0.9 * 2 + 0.81 * 3], [3], [0.729])
    np.testing.assert_array_equal(out["action"], [0])
    out = _step_1env(acc, 3, 4.0)
    _assert_rows(out, [1], [2 + 0.9 * 3 + 0.81 * 4], [4], [0.729])
    np.testing.assert_array_equal(out["action"], [1])
    # Termination flushes the whole window: partial sums, next_obs = final obs 5, no bootstrap.
    out = _step_1env(acc, 4, 5.0, terminated=True)
    _assert_rows(out, [2, 3, 4], [3 + 0.9 * 4 + 0.81 * 5, 4 + 0.9 * 5, 5.0], [5, 5, 5], [0, 0, 0])
    np.testing.assert_array_equal(out["action"], [0, 1, 0])
    assert acc.pending()[0] == 0


def test_nstep_one_env_truncation_bootstraps_from_final_obs():
    acc = NStepAccumulator(num_envs=1, n=3, gamma=GAMMA, obs_shape=(1,))
    for t, r in enumerate([1.0, 2.0, 3.0]):
        _step_1env(acc, t, r)
    out = _step_1env(acc, 3, 4.0, truncated=True)
    _assert_rows(out, [1, 2, 3], [2 + 0.9 * 3 + 0.81 * 4, 3 + 0.9 * 4, 4.0], [4, 4, 4], [0.729, 0.81, 0.9])


def test_nstep_short_episode_and_next_step_autoreset():
    acc = NStepAccumulator(num_envs=1, n=3, gamma=GAMMA, obs_shape=(1,))
    _step_1env(acc, 0, 1.0)
    out = _step_1env(acc, 1, 2.0, terminated=True)  # episode shorter than n
    _assert_rows(out, [0, 1], [1 + 0.9 * 2, 2.0], [2, 2], [0, 0])
    # NEXT_STEP autoreset: the reset step (reward 0, action ignored) is marked invalid.
    out = _step_1env(acc, 2, 0.0, valid=False)
    assert len(out["obs"]) == 0 and acc.pending()[0] == 0
    # The new episode starts cleanly from the reset obs 10.
    _step_1env(acc, 10, 1.0)
    _step_1env(acc, 11, 1.0)
    out = _step_1env(acc, 12, 1.0)
    _assert_rows(out, [10], [1 + 0.9 + 0.81], [13], [0.729])


def test_nstep_three_envs_ending_at_different_steps():
    """n=3, reward t+1 at step t; env0 terminates at t=1 and t=5, env1 truncates at t=3, env2 terminates at t=5."""
    acc = NStepAccumulator(num_envs=3, n=3, gamma=GAMMA, obs_shape=(1,))
    envs = np.arange(3)
    terminated = {1: [True, False, False], 5: [True, False, True]}
    truncated = {3: [False, True, False]}
    prev_done = np.zeros(3, dtype=bool)
    outs = []
    for t in range(6):
        term = np.array(terminated.get(t, [False] * 3))
        trunc = np.array(truncated.get(t, [False] * 3))
        outs.append(
            acc.step(
                obs=(100 * envs + t).astype(np.float32)[:, None],
                actions=envs.copy(),
                rewards=np.full(3, t + 1.0, dtype=np.float32),
                next_obs=(100 * envs + t + 1).astype(np.float32)[:, None],
                terminated=term,
                truncated=trunc,
                valid=~prev_done,
            )
        )
        prev_done = term | trunc

    assert len(outs[0]["obs"]) == 0
    # t=1: env0 terminates after two steps.
    _assert_rows(outs[1], [0, 1], [1 + 0.9 * 2, 2.0], [2, 2], [0, 0])
    # t=2: env0 is the invalid reset step; env1 and env2 are full.
    _assert_rows(outs[2], [100, 200], [5.23, 5.23], [103, 203], [0.729, 0.729])
    # t=3: env1 truncates (window t1..t3), env2 emits its oldest, env0 (new episode) holds one step.
    _assert_rows(
        outs[3],
        [101, 102, 103, 201],
        [2 + 0.9 * 3 + 0.81 * 4, 3 + 0.9 * 4, 4.0, 2 + 0.9 * 3 + 0.81 * 4],
        [104, 104, 104, 204],
        [0.729, 0.81, 0.9, 0.729],
    )
    np.testing.assert_array_equal(outs[3]["action"], [1, 1, 1, 2])
    # t=4: env1 is invalid; env2 emits its oldest; env0 holds two steps.
    _assert_rows(outs[4], [202], [3 + 0.9 * 4 + 0.81 * 5], [205], [0.729])
    # t=5: env0 and env2 terminate with windows t3..t5; env1's new episode holds one step.
    tail = [4 + 0.9 * 5 + 0.81 * 6, 5 + 0.9 * 6, 6.0]
    _assert_rows(outs[5], [3, 4, 5, 203, 204, 205], tail + tail, [6] * 3 + [206] * 3, [0.0] * 6)
    np.testing.assert_array_equal(acc.pending(), [0, 1, 0])


def test_nstep_terminated_and_truncated_together_means_terminal():
    acc = NStepAccumulator(num_envs=1, n=2, gamma=GAMMA, obs_shape=(1,))
    out = _step_1env(acc, 0, 1.0, terminated=True, truncated=True)
    _assert_rows(out, [0], [1.0], [1], [0.0])


def test_nstep_image_obs_keep_shape_and_dtype():
    acc = NStepAccumulator(num_envs=2, n=1, gamma=GAMMA, obs_shape=(2, 3), obs_dtype=np.uint8)
    obs = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    out = acc.step(obs, np.array([0, 1]), np.zeros(2), obs + 1, np.zeros(2, bool), np.zeros(2, bool))
    assert out["obs"].shape == (2, 2, 3) and out["obs"].dtype == np.uint8
    assert out["next_obs"].dtype == np.uint8
    np.testing.assert_array_equal(out["obs"], obs)
    np.testing.assert_array_equal(out["next_obs"], obs + 1)


# ---------------------------------------------------------------- n-step: property test vs reference


def _reference_nstep(stream, n, gamma):
    """Plain per-env Python n-step reference: list (per step) of emitted (obs_id, action, ret, next_id, disc)."""
    num_envs = len(stream[0])
    pending = [[] for _ in range(num_envs)]
    per_step = []
    for row in stream:
        emitted = []
        for e, (obs_id, action, reward, next_id, term, trunc, valid) in enumerate(row):
            if not valid:
                continue
            window = pending[e]
            window.append((obs_id, action, reward))
            if term or trunc:
                for i, (o, a, _) in enumerate(window):
                    rewards = [w[2] for w in window[i:]]
                    ret = sum(gamma**j * r for j, r in enumerate(rewards))
                    disc = 0.0 if term else gamma ** len(rewards)
                    emitted.append((o, a, ret, next_id, disc))
                window.clear()
            elif len(window) == n:
                o, a, _ = window[0]
                ret = sum(gamma**j * w[2] for j, w in enumerate(window))
                emitted.append((o, a, ret, next_id, gamma**n))
                window.pop(0)
        per_step.append(sorted(emitted))
    return per_step


_EVENT = st.tuples(
    st.integers(-5, 5),  # reward
    st.sampled_from(["run", "run", "run", "run", "term", "trunc"]),
    st.integers(0, 9).map(lambda x: x != 0),  # rarely drop a row at random (valid=False)
)


@settings(max_examples=examples(60), deadline=None)
@given(
    num_envs=st.integers(1, 4),
    n=st.integers(1, 5),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 0.99]),
    data=st.data(),
)
def test_nstep_matches_reference(num_envs, n, gamma, data):
    steps = data.draw(st.integers(1, 25))
    events = data.draw(st.lists(st.lists(_EVENT, min_size=num_envs, max_size=num_envs), min_size=steps, max_size=steps))

    acc = NStepAccumulator(num_envs=num_envs, n=n, gamma=gamma, obs_shape=(2,))
    prev_done = np.zeros(num_envs, dtype=bool)
    stream, got_per_step = [], []
    for t, row in enumerate(events):
        obs_ids = np.array([2 * (t * num_envs + e) for e in range(num_envs)], dtype=np.float64)
        next_ids = obs_ids + 1  # every observation carries a unique id
        rewards = np.array([ev[0] for ev in row], dtype=np.float32)
        actions = np.array([(t + e) % 3 for e in range(num_envs)], dtype=np.int64)
        # NEXT_STEP autoreset: the step after a done is invalid and never ends an episode itself.
        valid = ~prev_done & np.array([ev[2] for ev in row])
        term = np.array([ev[1] == "term" for ev in row]) & ~prev_done
        trunc = np.array([ev[1] == "trunc" for ev in row]) & ~prev_done
        stream.append(
            [
                (obs_ids[e], actions[e], float(rewards[e]), next_ids[e], term[e], trunc[e], valid[e])
                for e in range(num_envs)
            ]
        )
        obs = np.stack([obs_ids, np.arange(num_envs)], axis=1)
        out = acc.step(obs, actions, rewards, np.stack([next_ids, np.arange(num_envs)], 1), term, trunc, valid)
        assert out["obs"].shape[1:] == (2,) and out["next_obs"].shape[1:] == (2,)
        np.testing.assert_array_equal(out["obs"][:, 1], out["next_obs"][:, 1])  # env tag travels intact
        got_per_step.append(
            sorted(
                zip(
                    out["obs"][:, 0].tolist(),
                    out["action"].tolist(),
                    out["reward"].tolist(),
                    out["next_obs"][:, 0].tolist(),
                    out["discount"].tolist(),
                )
            )
        )
        prev_done = (term | trunc) & valid

    expected_per_step = _reference_nstep(stream, n, gamma)
    for got, expected in zip(got_per_step, expected_per_step):
        assert len(got) == len(expected)
        for g, x in zip(got, expected):
            assert g[0] == x[0] and g[1] == x[1] and g[3] == x[3]
            assert g[2] == pytest.approx(x[2], rel=1e-5, abs=1e-5)
            assert g[4] == pytest.approx(x[4], rel=1e-6, abs=1e-7)


# ---------------------------------------------------------------- learner / actor math


class FixedQ(nn.Module):
    """Returns a fixed Q-table row per observation id (obs[:, 0])."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.tensor(table, dtype=torch.float32)
        self.calls = 0

    def forward(self, obs):
        self.calls += 1
        return self.table[obs[:, 0].long()]


def test_double_dqn_target_online_picks_target_evaluates():
    online = FixedQ([[1.0, 5.0, 2.0], [0.0, 0.0, 9.0]])
    target = FixedQ([[10.0, 3.0, 7.0], [4.0, 4.0, -2.0]])
    next_obs = torch.tensor([[0.0], [1.0], [0.0]])
    rewards = torch.tensor([1.0, 0.5, 2.0])
    discounts = torch.tensor([0.9, 0.81, 0.0])
    y = double_dqn_targets(online, target, next_obs, rewards, discounts)
    # Row 0: online argmax = 1 -> target 3 (not target's max 10); row 1: argmax 2 -> -2; row 2: discount 0 -> r.
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.9 * 3.0, 0.5 + 0.81 * -2.0, 2.0]))
    assert not y.requires_grad


def test_double_dqn_target_has_no_grad_with_real_network():
    net = QNetwork((3,), 2, hidden=(8,))
    y = double_dqn_targets(net, copy.deepcopy(net), torch.randn(4, 3), torch.zeros(4), torch.ones(4))
    assert y.shape == (4,) and not y.requires_grad


def test_td_loss_weights_and_td_abs():
    q = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    actions = torch.tensor([1, 0])
    targets = torch.tensor([2.5, 0.0])
    weights = torch.tensor([2.0, 0.5])
    loss, td_abs = td_loss(q, actions, targets, weights)
    # TD errors -0.5 (huber 0.125) and 3 (huber 2.5); weighted mean = (0.25 + 1.25) / 2.
    assert loss.item() == pytest.approx(0.75)
    torch.testing.assert_close(td_abs, torch.tensor([0.5, 3.0]))
    assert not td_abs.requires_grad
    loss.backward()
    # d/dq of mean(w * huber): row0 = 2 * (-0.5) / 2, row1 = 0.5 * 1 / 2, zero on untaken actions.
    torch.testing.assert_close(q.grad, torch.tensor([[0.0, -0.5], [0.25, 0.0]]))


def test_initial_priorities_single_forward():
    online = FixedQ([[1.0, 2.0], [0.0, 6.0], [3.0, -1.0]])
    batch = {
        "obs": np.array([[0.0], [2.0]], dtype=np.float32),
        "action": np.array([1, 0], dtype=np.int64),
        "reward": np.array([1.0, 2.0], dtype=np.float32),
        "next_obs": np.array([[1.0], [0.0]], dtype=np.float32),
        "discount": np.array([0.5, 0.0], dtype=np.float32),
    }
    prio = initial_priorities(online, batch)
    # Row 0: |1 + 0.5 * 6 - 2| = 2; row 1: |2 + 0 - 3| = 1.
    np.testing.assert_allclose(prio, [2.0, 1.0])
    assert prio.dtype == np.float32 and online.calls == 1
    empty = {k: v[:0] for k, v in batch.items()}
    assert initial_priorities(QNetwork((1,), 2, hidden=(4,)), empty).shape == (0,)


def test_epsilon_ladder():
    np.testing.assert_allclose(epsilon_ladder(1), [0.4])
    eps = epsilon_ladder(4)
    assert eps.dtype == np.float32 and eps.shape == (4,)
    expected = [0.4 ** (1 + 7.0 * i / 3) for i in range(4)]
    np.testing.assert_allclose(eps, expected, rtol=1e-6)
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4**8)
    assert np.all(np.diff(eps) < 0)
    with pytest.raises(ValueError):
        epsilon_ladder(0)


# ---------------------------------------------------------------- models


def test_mlp_activations_and_errors():
    trunk, width = mlp(4, (8, 6), "tanh")
    assert width == 6 and isinstance(trunk[1], nn.Tanh)
    assert mlp(5, (), "elu")[1] == 5
    with pytest.raises(ValueError):
        mlp(4, (8,), "gelu")


def test_qnetwork_shapes_and_dueling_identity():
    torch.manual_seed(0)
    net = QNetwork((2, 3), 4, hidden=(16, 16), dueling=True)
    obs = torch.randn(5, 2, 3, dtype=torch.float64)  # other float dtypes are converted
    q = net(obs)
    assert q.shape == (5, 4) and q.dtype == torch.float32
    features = net.trunk(obs.reshape(5, -1).float())
    value, advantage = net.value_head(features), net.advantage_head(features)
    torch.testing.assert_close(q, value + advantage - advantage.mean(1, keepdim=True))
    # The mean over actions of Q equals V exactly under the mean-subtracted dueling head.
    torch.testing.assert_close(q.mean(1, keepdim=True), value)
    plain = QNetwork((3,), 2, hidden=(8,), activation="elu", dueling=False)
    assert plain(torch.zeros(7, 3, dtype=torch.uint8)).shape == (7, 2)


def test_flat_parameters_round_trip_and_digest():
    torch.manual_seed(0)
    src = QNetwork((4,), 3, hidden=(8, 8))
    dst = QNetwork((4,), 3, hidden=(8, 8))
    flat = flat_parameters(src)
    n_params = sum(p.numel() for p in src.parameters())
    assert flat.shape == (n_params,) and flat.dtype == torch.float32 and flat.is_contiguous()
    assert not flat.requires_grad
    assert parameter_digest(src) != parameter_digest(dst)

    # Read-only numpy buffers (as from the wire) are accepted.
    as_numpy = flat.numpy().copy()
    as_numpy.setflags(write=False)
    load_flat_parameters(dst, as_numpy)
    assert parameter_digest(dst) == parameter_digest(src)
    x = torch.randn(6, 4)
    torch.testing.assert_close(dst(x), src(x))

    # flat is a copy: mutating it leaves the module alone.
    flat[0] += 1.0
    assert parameter_digest(src) == parameter_digest(dst)

    twin = copy.deepcopy(src)
    assert parameter_digest(twin) == parameter_digest(src)
    with torch.no_grad():
        next(twin.parameters())[0, 0] += 1e-3
    assert parameter_digest(twin) != parameter_digest(src)

    with pytest.raises(ValueError):
        load_flat_parameters(dst, torch.zeros(n_params + 1))


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 7), st.integers(0, 2**31 - 1))
def test_chunked_nstep_agrees_with_per_step_accumulator(num_envs, n, chunk, seed):
    from rlctl.algos.apex.dqn import ChunkedNStep

    rng = np.random.default_rng(seed)
    per_step = NStepAccumulator(num_envs, n, 0.9, (1,))
    chunked = ChunkedNStep(num_envs, n, 0.9, (1,), chunk=chunk)
    got_a, got_b = [], []
    prev_done = np.zeros(num_envs, dtype=bool)
    uid = 0
    for _ in range(60):
        obs = (uid + np.arange(num_envs, dtype=np.float32))[:, None]
        uid += num_envs
        nxt = -obs
        term = rng.random(num_envs) < 0.1
        trunc = ~term & (rng.random(num_envs) < 0.1)
        valid = ~prev_done
        rewards = rng.integers(0, 5, num_envs).astype(np.float32) * valid
        actions = rng.integers(0, 3, num_envs)
        term, trunc = term & valid, trunc & valid
        got_a.append(per_step.step(obs, actions, rewards, nxt, term, trunc, valid))
        if chunked.add(obs, actions, rewards, nxt, term, trunc):  # derives valid = ~prev_done itself
            got_b.append(chunked.take())
        prev_done = term | trunc
    got_b.append(chunked.take())

    def rows(outs):
        return sorted(
            (float(o["obs"][i, 0]), int(o["action"][i]), round(float(o["reward"][i]), 4),
             float(o["next_obs"][i, 0]), round(float(o["discount"][i]), 5))
            for o in outs for i in range(len(o["reward"])))

    assert rows(got_a) == rows(got_b)


def test_epsilon_greedy_blocks_follow_per_row_rates():
    from rlctl.algos.apex.dqn import EpsilonGreedy

    q = torch.tensor([[0.0, 1.0, 0.5], [2.0, 0.0, 1.0]])
    pick = EpsilonGreedy(np.array([0.0, 1.0]), 3, np.random.default_rng(0), block=64)
    actions = np.stack([pick(q) for _ in range(3000)])  # crosses many block refills
    assert actions.dtype == np.int64
    assert (actions[:, 0] == 1).all()  # eps 0: always argmax
    np.testing.assert_allclose(np.bincount(actions[:, 1], minlength=3) / 3000, [1 / 3] * 3, atol=0.03)


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_chunked_priorities_from_acting_q_equal_a_fresh_forward(num_envs, n, chunk, seed):
    from rlctl.algos.apex.dqn import ChunkedNStep

    torch.manual_seed(seed % 1000)
    rng = np.random.default_rng(seed)
    model = QNetwork((2,), 3, (8,))
    chunked = ChunkedNStep(num_envs, n, 0.9, (2,), chunk=chunk, n_actions=3)
    obs = rng.normal(size=(num_envs, 2)).astype(np.float32)
    prev_done = np.zeros(num_envs, dtype=bool)
    outs = []
    for _ in range(40):
        with torch.no_grad():
            q = model(torch.from_numpy(obs)).numpy()
        actions = rng.integers(0, 3, num_envs)
        nxt = rng.normal(size=(num_envs, 2)).astype(np.float32)
        valid = ~prev_done
        term = valid & (rng.random(num_envs) < 0.15)
        trunc = valid & ~term & (rng.random(num_envs) < 0.1)
        rewards = rng.normal(size=num_envs).astype(np.float32) * valid
        if chunked.add(obs, actions, rewards, nxt, term, trunc, q=q):
            outs.append(chunked.take())
        # NEXT_STEP autoreset: after an end the env returns the final obs again as the next step's obs.
        obs, prev_done = nxt, term | trunc
    outs = [o for o in outs if len(o["reward"])]
    assert outs, "no transitions emitted"
    batch = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
    np.testing.assert_allclose(batch["priority"], initial_priorities(model, batch), rtol=1e-4, atol=1e-5)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(1, 9), min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_episode_tracker_blocks_agree_with_per_step_accounting(num_envs, blocks, seed):
    from rlctl.envs import autoreset_valid
    from rlctl.roles.collector_report import EpisodeTracker

    rng = np.random.default_rng(seed)
    steps = sum(blocks)
    done = rng.random((steps, num_envs)) < 0.3
    rewards = rng.normal(size=(steps, num_envs)).astype(np.float32)
    # Reference: one step at a time, the NEXT_STEP autoreset step after an end counts for nothing.
    ref_returns, ref_lengths, ref_valid = [], [], 0
    ret, length, prev = np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64), np.zeros(num_envs, dtype=bool)
    for t in range(steps):
        for e in range(num_envs):
            if prev[e]:
                continue
            ret[e] += rewards[t, e]
            length[e] += 1
            ref_valid += 1
        for e in range(num_envs):
            if done[t, e]:
                ref_returns.append(ret[e])
                ref_lengths.append(int(length[e]))
                ret[e], length[e] = 0.0, 0
        prev = done[t]

    # Block by block (`steps`), and queued until `take` (`add`, as the collector does), cut at a random block.
    cut = int(rng.integers(0, len(blocks) + 1))
    for queued in (False, True):
        tracker, counted, start, before = EpisodeTracker(num_envs), 0, 0, np.zeros(num_envs, dtype=bool)
        got = {"episode_returns": [], "episode_lengths": []}
        for i, size in enumerate(blocks):
            block = slice(start, start + size)
            valid = autoreset_valid(done[block], before)
            counted += (tracker.add if queued else tracker.steps)(rewards[block], done[block], valid)
            before, start = done[start + size - 1], start + size
            if queued and i + 1 == cut:
                assert tracker.ended == bool(done[:start].any())
                part = tracker.take()
                for k in got:
                    got[k] += part[k]
        part = tracker.take()
        for k in got:
            got[k] += part[k]
        assert counted == ref_valid
        assert got["episode_lengths"] == ref_lengths
        np.testing.assert_allclose(got["episode_returns"], ref_returns, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(tracker.ep_return, ret, rtol=1e-9, atol=1e-9)
        np.testing.assert_array_equal(tracker.ep_length, length)


def test_shared_flat_storage_keeps_values_and_loads_in_one_copy():
    from rlctl.models import share_flat_storage

    torch.manual_seed(0)
    model, other = QNetwork((4,), 2, (16, 16)), QNetwork((4,), 2, (16, 16))
    x = torch.randn(5, 4)
    before = model(x).detach()
    flat = share_flat_storage(model)
    assert flat.dtype == np.float32 and flat.shape == (flat_parameters(model).numel(),)
    torch.testing.assert_close(model(x).detach(), before)  # same values, same forward
    np.copyto(flat, flat_parameters(other).numpy())  # what a collector does with published weights
    torch.testing.assert_close(model(x).detach(), other(x).detach())
    assert parameter_digest(model) == parameter_digest(other)
    assert share_flat_storage(QNetwork((4,), 2, (8,)).double()) is None  # not float32: the per-tensor path
