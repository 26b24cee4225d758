"""R2D2 math (rlctl.algos.r2d2): value rescaling, n-step targets, burn-in, priorities, the recurrent Q-network and
the actor's sequence cutter against a slow per-env reference."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from rlctl.algos.r2d2.model import RecurrentQNetwork
from rlctl.algos.r2d2.sequences import SequenceCutter
from rlctl.algos.r2d2.targets import (
    actor_priorities,
    nstep_targets,
    r2d2_loss,
    sequence_priorities,
    value_rescale,
    value_rescale_inv,
)

torch.set_num_threads(1)


def t(x, dtype=torch.float32):
    return torch.tensor(np.asarray(x), dtype=dtype)


# ---------------------------------------------------------------- value rescaling


def _paper_inverse(x, eps):
    """h^-1 exactly as the R2D2 paper writes it (float64)."""
    return np.sign(x) * (((np.sqrt(1 + 4 * eps * (np.abs(x) + 1 + eps)) - 1) / (2 * eps)) ** 2 - 1)


@settings(max_examples=examples(200), deadline=None)
@given(x=st.floats(-1e6, 1e6, allow_nan=False), eps=st.sampled_from([1e-3, 1e-2, 1e-4]))
def test_value_rescale_round_trip(x, eps):
    x64 = np.array([x, -x, x / 1e3, x / 1e6])
    # float64, numpy: both directions, and the inverse is the paper's formula (where that one is accurate).
    np.testing.assert_allclose(value_rescale_inv(value_rescale(x64, eps), eps), x64, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(value_rescale(value_rescale_inv(x64, eps), eps), x64, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(value_rescale_inv(x64, eps), _paper_inverse(x64, eps), rtol=1e-8, atol=1e-9)
    # float32, torch: stays float32 and round-trips to float32 precision, also near 0.
    x32 = torch.tensor(x64, dtype=torch.float32)
    there = value_rescale(x32, eps)
    back = value_rescale_inv(there, eps)
    assert there.dtype == back.dtype == torch.float32
    torch.testing.assert_close(back, x32, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(value_rescale_inv(x32, eps).double(), t(_paper_inverse(x32.double().numpy(), eps),
                                                                       torch.float64), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(there.numpy(), value_rescale(x64, eps), rtol=1e-6, atol=1e-7)


def test_value_rescale_values_and_monotone():
    assert value_rescale(np.array(0.0)) == 0.0 and value_rescale_inv(np.array(0.0)) == 0.0
    assert float(value_rescale(torch.tensor(0.0))) == 0.0
    # h(3) = sqrt(4) - 1 + 3e-3; odd function.
    np.testing.assert_allclose(value_rescale(np.array([3.0, -3.0, 8.0])), [1.003, -1.003, 2.008], rtol=1e-12)
    x = np.sort(np.random.default_rng(0).normal(scale=300.0, size=2000))
    assert np.all(np.diff(value_rescale(x)) > 0) and np.all(np.diff(value_rescale_inv(x)) > 0)
    x32 = torch.linspace(-1e4, 1e4, 20001)
    assert torch.all(torch.diff(value_rescale(x32)) > 0)


# ---------------------------------------------------------------- n-step targets


def test_nstep_targets_hand_computed():
    # T = 6, three columns, n = 3:
    #   col 0: steps 0-2 an episode that terminates at step 2; step 3 the autoreset step (invalid), steps 4-5 the
    #          next episode, cut by the sequence end (bootstrap from row 6);
    #   col 1: steps 0-3 valid, truncated after step 3 (final obs at row 4), steps 4-5 padding;
    #   col 2: all valid, no end (bootstrap from rows t+3, or row 6 near the sequence end).
    gamma, eps, n = 0.9, 1e-3, 3
    rng = np.random.default_rng(1)
    r = np.round(rng.normal(size=(6, 3)), 2)
    q_on = rng.normal(size=(7, 3, 2)) * 5
    q_tg = rng.normal(size=(7, 3, 2)) * 5
    term = np.zeros((6, 3), bool)
    term[2, 0] = True
    valid = np.ones((6, 3), bool)
    valid[3, 0] = False
    valid[4:, 1] = False
    h, hinv = value_rescale, value_rescale_inv

    def boot(row, col, double):
        a = q_on[row, col].argmax() if double else q_tg[row, col].argmax()
        return hinv(q_tg[row, col, a], eps)

    for double in (True, False):
        def B(row, col):
            return boot(row, col, double)
        g = gamma
        expected = np.zeros((6, 3))
        expected[0, 0] = h(r[0, 0] + g * r[1, 0] + g**2 * r[2, 0], eps)  # terminated: no bootstrap
        expected[1, 0] = h(r[1, 0] + g * r[2, 0], eps)
        expected[2, 0] = h(r[2, 0], eps)
        expected[4, 0] = h(r[4, 0] + g * r[5, 0] + g**2 * B(6, 0), eps)  # sequence end
        expected[5, 0] = h(r[5, 0] + g * B(6, 0), eps)
        expected[0, 1] = h(r[0, 1] + g * r[1, 1] + g**2 * r[2, 1] + g**3 * B(3, 1), eps)
        expected[1, 1] = h(r[1, 1] + g * r[2, 1] + g**2 * r[3, 1] + g**3 * B(4, 1), eps)
        expected[2, 1] = h(r[2, 1] + g * r[3, 1] + g**2 * B(4, 1), eps)  # truncated: final obs at row 4
        expected[3, 1] = h(r[3, 1] + g * B(4, 1), eps)
        for s in range(6):
            m = min(3, 6 - s)
            expected[s, 2] = h(sum(g**k * r[s + k, 2] for k in range(m)) + g**m * B(s + m, 2), eps)
        got = nstep_targets(t(q_on), t(q_tg), torch.zeros(6, 3, dtype=torch.int64), t(r), t(term, torch.bool),
                            t(valid, torch.bool), gamma, n, eps, double=double)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
    # The two argmax rules really differ on this data (else `double` would be untested).
    assert (q_on[1:].argmax(-1) != q_tg[1:].argmax(-1)).any()


def test_sequence_priorities_hand_computed():
    td = t([[1.0, 5.0, 7.0], [3.0, 1.0, 9.0], [2.0, 4.0, 8.0]])
    mask = t([[1, 0, 0], [1, 1, 0], [1, 1, 0]], torch.bool)
    got = sequence_priorities(td, mask, eta=0.9)
    # col 0: 0.9 * 3 + 0.1 * 2; col 1 (step 0 masked): 0.9 * 4 + 0.1 * 2.5; col 2: nothing unmasked.
    np.testing.assert_allclose(got.numpy(), [2.9, 3.85, 0.0], rtol=1e-6)


# ---------------------------------------------------------------- loss, burn-in, actor priorities


def _batch(seed, steps=8, cols=4, actions=3):
    rng = np.random.default_rng(seed)
    valid = np.ones((steps, cols), bool)
    valid[5:, 1] = False  # ends after step 4 ...
    term = np.zeros((steps, cols), bool)
    term[4, 1] = True  # ... by termination
    valid[6:, 2] = False  # truncated after step 5
    valid[2:, 3] = False  # ends inside the burn-in: no loss steps at all
    return dict(q=rng.normal(size=(steps + 1, cols, actions)).astype(np.float32),
                q_target=rng.normal(size=(steps + 1, cols, actions)).astype(np.float32),
                actions=rng.integers(0, actions, size=(steps, cols)),
                rewards=rng.normal(size=(steps, cols)).astype(np.float32), terminated=term, valid=valid,
                weights=rng.uniform(0.2, 1.0, size=cols).astype(np.float32))


def _loss(b, burn_in, **kw):
    q = torch.tensor(b["q"], requires_grad=True)
    out = r2d2_loss(q, t(b["q_target"]), t(b["actions"], torch.int64), t(b["rewards"]), t(b["terminated"], torch.bool),
                    t(b["valid"], torch.bool), t(b["weights"]), burn_in, 0.95, 3, 1e-3, True, 0.9, **kw)
    return q, out


def test_r2d2_loss_value():
    b, burn_in = _batch(0), 3
    _, (loss, prio, stats) = _loss(b, burn_in)
    y = nstep_targets(t(b["q"]), t(b["q_target"]), None, t(b["rewards"]), t(b["terminated"], torch.bool),
                      t(b["valid"], torch.bool), 0.95, 3, 1e-3).numpy()
    q_taken = np.take_along_axis(b["q"][:-1], b["actions"][..., None], -1)[..., 0]
    expected_loss, expected_prio = 0.0, []
    for col in range(4):
        steps = [s for s in range(burn_in, 8) if b["valid"][s, col]]
        d = np.array([q_taken[s, col] - y[s, col] for s in steps])
        expected_loss += b["weights"][col] * (np.mean(0.5 * d**2) if steps else 0.0) / 4
        expected_prio.append(0.9 * np.abs(d).max() + 0.1 * np.abs(d).mean() if steps else 0.0)
    assert float(loss.detach()) == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(prio, expected_prio, rtol=1e-5)
    assert prio.dtype == np.float32 and prio[3] == 0.0
    assert float(stats["losses/td_loss"]) == pytest.approx(expected_loss, rel=1e-5)
    loss_mask = b["valid"].copy()
    loss_mask[:burn_in] = False
    assert float(stats["learner/q_mean"]) == pytest.approx(q_taken[loss_mask].mean(), rel=1e-5)


def test_burn_in_steps_carry_no_loss():
    b, burn_in = _batch(1), 3
    q, (loss, prio, _) = _loss(b, burn_in)
    loss.backward()
    # The burn-in rows' Q get exactly zero gradient; so does the last row (it is only bootstrapped from).
    assert torch.all(q.grad[:burn_in] == 0) and torch.all(q.grad[-1] == 0)
    assert q.grad[burn_in:-1].abs().sum() > 0
    # Changing everything at burn-in positions only changes nothing: rewards, actions, online Q rows < burn_in,
    # target Q rows <= burn_in (read only by burn-in steps' bootstraps: later steps read rows > burn_in).
    rng = np.random.default_rng(7)
    c = {k: v.copy() for k, v in b.items()}
    c["rewards"][:burn_in] += rng.normal(size=c["rewards"][:burn_in].shape).astype(np.float32) * 10
    c["actions"][:burn_in] = (c["actions"][:burn_in] + 1) % 3
    c["q"][:burn_in] += rng.normal(size=c["q"][:burn_in].shape).astype(np.float32) * 10
    c["q_target"][:burn_in + 1] += rng.normal(size=c["q_target"][:burn_in + 1].shape).astype(np.float32) * 10
    _, (loss_c, prio_c, _) = _loss(c, burn_in)
    assert torch.equal(loss_c.detach(), loss.detach())
    np.testing.assert_array_equal(prio_c, prio)
    # Sanity: the same change with no burn-in does move the loss.
    assert float(_loss(c, 0)[1][0].detach()) != pytest.approx(float(_loss(b, 0)[1][0].detach()), rel=1e-3)


def test_actor_priorities_match_learner_when_target_is_online():
    for seed, burn_in in ((2, 0), (3, 2), (4, 5)):
        b = _batch(seed)
        b["q_target"] = b["q"]
        _, (_, prio, _) = _loss(b, burn_in)
        got = actor_priorities(b["q"], b["actions"], b["rewards"], b["terminated"], b["valid"], burn_in, 0.95, 3,
                               1e-3, 0.9)
        assert got.dtype == np.float32 and got.shape == (4,)
        np.testing.assert_allclose(got, prio, rtol=1e-6, atol=1e-7)
        assert got[[0, 2]].min() > 0  # column 1 may lie wholly in the burn-in


# ---------------------------------------------------------------- the network


def test_recurrent_network_api():
    torch.manual_seed(0)
    net = RecurrentQNetwork((2, 3), 4, hidden=(16,), lstm_size=8)
    assert all(p.dtype == torch.float32 for p in net.parameters())
    h, c = net.initial_state(5)
    assert h.shape == c.shape == (5, 8) and h.dtype == torch.float32 and not h.any() and not c.any()
    obs = torch.randn(6, 5, 2, 3, dtype=torch.float64)
    q, (h_n, c_n) = net.unroll(obs, (h, c))
    assert q.shape == (6, 5, 4) and q.dtype == torch.float32
    # Step by step gives the same Q and final state as one unroll.
    state = (h, c)
    for i in range(6):
        q_i, state = net.step(obs[i], state)
        torch.testing.assert_close(q_i, q[i], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[0], h_n, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[1], c_n, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(net(obs[0]), q[0], rtol=1e-5, atol=1e-6)  # forward: one step from zero state
    actions, greedy_state = net.greedy(obs[0], (h, c))
    assert actions.dtype == torch.int64 and torch.equal(actions, q[0].argmax(1))
    torch.testing.assert_close(greedy_state[0], net.step(obs[0], (h, c))[1][0])
    assert net(torch.randint(0, 255, (5, 2, 3), dtype=torch.uint8)).shape == (5, 4)
    mask = np.array([True, False, True, False, False])
    h_r, c_r = net.reset_state((h_n, c_n), mask)
    assert not h_r[mask].any() and not c_r[mask].any()
    assert torch.equal(h_r[~mask], h_n[~mask]) and torch.equal(c_r[~mask], c_n[~mask])
    # The plain head works too.
    plain = RecurrentQNetwork((3,), 2, dueling=False, lstm_size=4)
    assert plain.unroll(torch.randn(2, 1, 3), plain.initial_state(1))[0].shape == (2, 1, 2)


def test_memory_none_ignores_history_and_passes_state_through():
    torch.manual_seed(0)
    flat = RecurrentQNetwork((3,), 2, hidden=(8,), lstm_size=6, memory="none")
    lstm = RecurrentQNetwork((3,), 2, hidden=(8,), lstm_size=6)
    state = (torch.randn(4, 6), torch.randn(4, 6))
    obs = torch.randn(5, 4, 3)
    q, out_state = flat.unroll(obs, state)
    assert torch.equal(out_state[0], state[0]) and torch.equal(out_state[1], state[1])
    q_step, step_state = flat.step(obs[2], state)
    assert torch.equal(step_state[0], state[0]) and torch.equal(step_state[1], state[1])
    torch.testing.assert_close(q_step, q[2])
    # Outputs depend on the current observation only: change the earlier ones and the state, q[4] stays.
    obs2 = obs.clone()
    obs2[:4] = torch.randn(4, 4, 3)
    q2, _ = flat.unroll(obs2, flat.initial_state(4))
    torch.testing.assert_close(q2[4], q[4])
    torch.testing.assert_close(flat(obs[4]), q[4])
    # ... whereas the LSTM's do depend on them (so the comparison above can fail).
    assert not torch.allclose(lstm.unroll(obs2, state)[0][4], lstm.unroll(obs, state)[0][4])


def test_sequences_restore_the_recurrent_state():
    # Act step by step on real CartPole envs (next-step autoreset, time-limit truncations and terminations),
    # resetting each env's state before acting on its reset observation; every stored sequence, unrolled from its
    # stored (h0, c0), must reproduce the Q-values the actor computed at its steps and at its bootstrap row.
    torch.manual_seed(0)
    num_envs, seq_len, period = 3, 8, 5
    net = RecurrentQNetwork((4,), 2, hidden=(16,), lstm_size=8)
    env = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync", max_episode_steps=14)
    cutter = SequenceCutter(num_envs, seq_len, period, (4,), np.float32, 8, min_ready=4)
    rng = np.random.default_rng(0)
    acted_q: dict[bytes, np.ndarray] = {}
    batches, ends = [], {"terminated": 0, "truncated": 0}
    obs, _ = env.reset(seed=0)
    state = net.initial_state(num_envs)
    autoreset = reset_next = np.zeros(num_envs, bool)
    with torch.no_grad():
        for _ in range(150):
            state = net.reset_state(state, reset_next)
            h, c = state[0].numpy().copy(), state[1].numpy().copy()
            q, state = net.step(torch.as_tensor(obs), state)
            for e in range(num_envs):
                acted_q[obs[e].tobytes()] = q[e].numpy()
            actions = rng.integers(0, 2, num_envs)
            next_obs, rewards, terminated, truncated, _ = env.step(actions)
            ends["terminated"] += int((terminated & ~truncated).sum())
            ends["truncated"] += int(truncated.sum())
            if cutter.add(obs, actions, rewards, next_obs, terminated, truncated, h, c):
                batches.append(cutter.take())
            reset_next, autoreset = autoreset, terminated | truncated
            obs = next_obs
    env.close()
    assert ends["terminated"] and ends["truncated"]
    seqs = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    assert len(seqs["valid"]) > 20 and (~seqs["valid"]).any()
    assert np.abs(seqs["h0"]).sum(1).min() == 0 and np.abs(seqs["h0"]).sum(1).max() > 0  # starts and mid-episode
    with torch.no_grad():
        q_seq, _ = net.unroll(torch.as_tensor(seqs["obs"]).transpose(0, 1),
                              (torch.as_tensor(seqs["h0"]), torch.as_tensor(seqs["c0"])))
    q_seq = q_seq.transpose(0, 1).numpy()
    for j, length in enumerate(seqs["valid"].sum(1)):
        for i in range(length + 1):
            np.testing.assert_allclose(q_seq[j, i], acted_q[seqs["obs"][j, i].tobytes()], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- the sequence cutter against a slow reference


def _make_stream(episodes, num_steps, rng, obs_dtype, n_actions):
    """One env's per-global-step records under next-step autoreset: episodes [(length, terminated?)], then an
    episode that never ends; obs of each step is the previous step's next_obs."""
    flags = []  # (terminated, truncated) per global step; the step after each end is the autoreset step
    for length, terminated in episodes:
        flags += [(False, False)] * (length - 1) + [(terminated, not terminated), (False, False)]
    flags += [(False, False)] * max(0, num_steps - len(flags))
    flags = flags[:num_steps]

    def draw_obs():
        if obs_dtype == np.uint8:
            return rng.integers(0, 256, size=(2,)).astype(np.uint8)
        return rng.normal(size=(2,)).astype(obs_dtype)

    steps, obs = [], draw_obs()
    for terminated, truncated in flags:
        next_obs = draw_obs()
        steps.append(dict(obs=obs, action=int(rng.integers(0, n_actions)), reward=float(rng.normal()),
                          next_obs=next_obs, terminated=terminated, truncated=truncated,
                          h=rng.normal(size=3).astype(np.float32), c=rng.normal(size=3).astype(np.float32), q=rng.normal(size=n_actions).astype(np.float32)))
        obs = next_obs
    return steps


def _reference_sequences(stream, env, L, P):
    """Slow per-env reference: [(emit step, env, start, item)] for every sequence emitted by the end of the stream.

    Per episode, windows start at 0, P, 2P, ...; a window is complete when it holds L steps or its episode has
    ended, and is emitted by the add after its last step (the one that brings the Q-values of its bootstrap obs).
    """
    out = []
    episodes, current, skip = [], [], False
    for g, step in enumerate(stream):
        if skip:  # the autoreset step after an end: not a transition
            skip = False
            continue
        current.append(g)
        if step["terminated"] or step["truncated"]:
            episodes.append((current, True))
            current, skip = [], True
    episodes.append((current, False))
    for gs, ended in episodes:
        for s in range(0, len(gs), P):
            length = min(L, len(gs) - s)
            last = gs[s + length - 1]
            if not (length == L or ended) or last + 1 >= len(stream):
                continue
            rows = [stream[g] for g in gs[s:s + length]]
            obs = np.zeros((L + 1, 2), dtype=stream[0]["obs"].dtype)
            q = np.zeros((L + 1, len(stream[0]["q"])), dtype=np.float32)
            item = dict(action=np.zeros(L, np.int64), reward=np.zeros(L, np.float32),
                        terminated=np.zeros(L, bool), valid=np.zeros(L, bool), h0=rows[0]["h"], c0=rows[0]["c"])
            for i, row in enumerate(rows):
                obs[i], q[i] = row["obs"], row["q"]
                item["action"][i], item["reward"][i] = row["action"], row["reward"]
                item["terminated"][i], item["valid"][i] = row["terminated"], True
            obs[length] = stream[last]["next_obs"]  # the next obs, or the episode's final obs
            q[length] = stream[last + 1]["q"]  # acted on one step later (on the autoreset step after an end)
            item["obs"], item["q"] = obs, q
            out.append((last + 1, env, s, item))
    return out


@settings(max_examples=examples(150), deadline=None)
@given(num_envs=st.integers(1, 3), seq_len=st.integers(1, 7), data=st.data(), num_steps=st.integers(1, 45),
       min_ready=st.integers(1, 4), uint8=st.booleans(), seed=st.integers(0, 2**16),
       episodes=st.lists(st.lists(st.tuples(st.integers(1, 11), st.booleans()), max_size=6), min_size=3,
                         max_size=3))
def test_sequence_cutter_matches_reference(num_envs, seq_len, data, num_steps, min_ready, uint8, seed, episodes):
    period = data.draw(st.integers(1, seq_len), label="period")
    burn_in = data.draw(st.integers(0, seq_len - 1), label="burn_in")
    n_actions, rng = 3, np.random.default_rng(seed)
    obs_dtype = np.uint8 if uint8 else np.float32
    streams = [_make_stream(episodes[e], num_steps, rng, obs_dtype, n_actions) for e in range(num_envs)]
    cutter = SequenceCutter(num_envs, seq_len, period, (2,), obs_dtype, 3, n_actions=n_actions, burn_in=burn_in,
                            gamma=0.9, n=2, eps=1e-3, eta=0.9, min_ready=min_ready)
    expected = sorted((r for e in range(num_envs) for r in _reference_sequences(streams[e], e, seq_len, period)),
                      key=lambda r: r[:3])
    valid_ref = np.array([[not (g and (s[g - 1]["terminated"] or s[g - 1]["truncated"])) for s in streams]
                          for g in range(num_steps)], dtype=bool)
    taken, batches, since = 0, [], 0

    def take():
        nonlocal since
        reward, done, valid = cutter.fresh_steps()
        rows = [[s[g] for s in streams] for g in range(since, step + 1)]
        np.testing.assert_array_equal(reward, np.array([[r["reward"] for r in row] for row in rows]
                                                       ).reshape(-1, num_envs))
        np.testing.assert_array_equal(done, np.array([[r["terminated"] or r["truncated"] for r in row] for row in rows],
                                                     dtype=bool).reshape(-1, num_envs))
        np.testing.assert_array_equal(valid, valid_ref[since:step + 1])
        since = step + 1
        return cutter.take()

    for step in range(num_steps):
        rows = [s[step] for s in streams]
        ready = cutter.add(np.stack([r["obs"] for r in rows]), np.array([r["action"] for r in rows]),
                           np.array([r["reward"] for r in rows]), np.stack([r["next_obs"] for r in rows]),
                           np.array([r["terminated"] for r in rows]), np.array([r["truncated"] for r in rows]),
                           np.stack([r["h"] for r in rows]), np.stack([r["c"] for r in rows]),
                           np.stack([r["q"] for r in rows]))
        emitted = sum(1 for r in expected if r[0] <= step)
        assert ready == (emitted - taken >= min_ready)
        if ready:
            batches.append(take())
            taken = emitted
    batches.append(take())
    got = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    assert len(got["valid"]) == len(expected)
    for key in ("obs", "action", "reward", "terminated", "valid", "h0", "c0"):
        want = np.stack([r[3][key] for r in expected]) if expected else got[key][:0]
        assert got[key].dtype == want.dtype and got[key].shape == want.shape, key
        np.testing.assert_array_equal(got[key], want, err_msg=key)
    if expected:
        items = [r[3] for r in expected]
        want = actor_priorities(np.stack([i["q"] for i in items], 1), *(np.stack([i[k] for i in items], 1) for k in
                                ("action", "reward", "terminated", "valid")), burn_in, 0.9, 2, 1e-3, 0.9)
        np.testing.assert_allclose(got["priority"], want, rtol=1e-6, atol=1e-7)
    assert got["priority"].dtype == np.float32


def test_sequence_cutter_hand_case():
    # One env, L = 4, P = 2: an episode of 5 steps (ids 0-4) that terminates, the autoreset step (acting on the
    # final obs 5), then a new episode (ids 10, 11, ...). Sequences start at 0, 2, 4: [0-3] full, [2-4] and [4]
    # padded after the end, each with the final obs 5 as its bootstrap row.
    cutter = SequenceCutter(1, 4, 2, (1,), np.float32, 1)
    obs_ids = [0, 1, 2, 3, 4, 5, 10, 11]
    ends = [False, False, False, False, True, False, False, False]
    for i, (o, end) in enumerate(zip(obs_ids, ends)):
        next_o = obs_ids[i + 1] if i + 1 < len(obs_ids) else 12
        cutter.add(np.array([[o]], np.float32), np.array([o % 2]), np.array([float(o)]), np.array([[next_o]]),
                   np.array([end]), np.array([False]), np.array([[float(o)]]), np.array([[-float(o)]]))
    out = cutter.take()
    np.testing.assert_array_equal(out["obs"][..., 0], [[0, 1, 2, 3, 4], [2, 3, 4, 5, 0], [4, 5, 0, 0, 0]])
    np.testing.assert_array_equal(out["valid"], [[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(out["reward"], [[0, 1, 2, 3], [2, 3, 4, 0], [4, 0, 0, 0]])
    np.testing.assert_array_equal(out["terminated"], [[0, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(out["h0"][:, 0], [0, 2, 4])
    np.testing.assert_array_equal(out["c0"][:, 0], [0, -2, -4])
    assert "priority" not in out and len(cutter.take()["obs"]) == 0
