"""GAE, V-trace and the actor-critic model against hand-computed cases and independent reference loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlctl.algos.onpolicy.returns import gae, ppo_loss, vtrace
from rlctl.models import ActorCritic, ConvEncoder
from conftest import needs_extra


def t(x, dtype=torch.float32):
    return torch.tensor(np.asarray(x), dtype=dtype)


def test_gae_hand_computed_terminated_vs_truncated():
    # One env, T = 4. Step 1 terminates (no bootstrap); step 2 is the reset step that follows (invalid);
    # step 3 is truncated by a time limit (bootstrapped from the final observation's value V[4]).
    gamma, lam = 0.9, 0.5
    rewards = t([[1.0], [2.0], [0.0], [3.0]])
    values = t([[0.5], [1.0], [9.0], [2.0], [4.0]])
    terminated = t([[0], [1], [0], [0]], torch.bool)
    done = t([[0], [1], [0], [1]], torch.bool)
    valid = t([[1], [1], [0], [1]], torch.bool)
    adv, ret = gae(rewards, values, terminated, done, valid, gamma, lam)
    d3 = 3.0 + 0.9 * 4.0 - 2.0  # truncated: bootstrap from V[4]
    d1 = 2.0 + 0.0 - 1.0  # terminated: no bootstrap
    d0 = 1.0 + 0.9 * 1.0 - 0.5
    expected = [d0 + gamma * lam * d1, d1, 0.0, d3]  # the chain stops at the episode end after step 1
    assert adv[:, 0].tolist() == pytest.approx(expected)
    assert ret[:, 0].tolist() == pytest.approx([e + v for e, v in zip(expected, [0.5, 1.0, 9.0, 2.0])])


def test_gae_with_lambda_one_is_the_discounted_return_to_go_plus_bootstrap():
    rng = np.random.default_rng(0)
    T, B, gamma = 6, 3, 0.95
    r = rng.normal(size=(T, B))
    v = rng.normal(size=(T + 1, B))
    zeros = np.zeros((T, B), dtype=bool)
    adv, ret = gae(t(r), t(v), t(zeros, torch.bool), t(zeros, torch.bool), t(~zeros, torch.bool), gamma, 1.0)
    for s in range(T):
        g = sum(gamma ** (k - s) * r[k] for k in range(s, T)) + gamma ** (T - s) * v[T]
        np.testing.assert_allclose(ret[s].numpy(), g, rtol=1e-5, atol=1e-5)


def vtrace_reference(blogp, tlogp, r, v, term, done, valid, gamma, rho_bar, c_bar):
    """V-trace by the paper's sum (no recursion), one env and one start step at a time."""
    T, B = r.shape
    ratio = np.exp(tlogp - blogp)
    rho, c = np.minimum(ratio, rho_bar), np.minimum(ratio, c_bar)
    vs = np.array(v[:T], dtype=np.float64)
    for b in range(B):
        for s in range(T):
            if not valid[s, b]:
                continue
            total, coef = 0.0, 1.0
            for k in range(s, T):
                delta = rho[k, b] * (r[k, b] + gamma * v[k + 1, b] * (1.0 - term[k, b]) - v[k, b])
                total += gamma ** (k - s) * coef * delta
                if done[k, b]:
                    break
                coef *= c[k, b]
            vs[s, b] = v[s, b] + total
    adv = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            if not valid[s, b]:
                continue
            nxt = v[s + 1, b] if (done[s, b] or s == T - 1) else vs[s + 1, b]
            adv[s, b] = rho[s, b] * (r[s, b] + gamma * nxt * (1.0 - term[s, b]) - v[s, b])
    return vs, adv


def _episodes(rng, T, B):
    """Random episode ends with the NEXT_STEP reset step after each (invalid)."""
    done = rng.random((T, B)) < 0.15
    term = done & (rng.random((T, B)) < 0.5)
    valid = np.ones((T, B), dtype=bool)
    valid[1:] = ~done[:-1]
    done &= valid  # a reset step never ends an episode
    term &= valid
    return term, done, valid


@pytest.mark.parametrize("seed", range(5))
def test_vtrace_matches_reference_loops_on_random_inputs(seed):
    rng = np.random.default_rng(seed)
    T, B, gamma = 9, 4, 0.97
    rho_bar, c_bar = [(1.0, 1.0), (0.8, 1.2), (2.0, 0.5), (1.0, 1.0), (1.5, 1.0)][seed]
    blogp, tlogp = rng.normal(scale=0.5, size=(T, B)), rng.normal(scale=0.5, size=(T, B))
    r, v = rng.normal(size=(T, B)), rng.normal(size=(T + 1, B))
    term, done, valid = _episodes(rng, T, B)
    vs, adv = vtrace(t(blogp), t(tlogp), t(r), t(v), t(term, torch.bool), t(done, torch.bool), t(valid, torch.bool),
                     gamma, rho_bar, c_bar)
    ref_vs, ref_adv = vtrace_reference(blogp, tlogp, r, v, term.astype(float), done, valid, gamma, rho_bar, c_bar)
    np.testing.assert_allclose(vs.numpy()[valid], ref_vs[valid], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adv.numpy()[valid], ref_adv[valid], rtol=1e-4, atol=1e-4)


def test_vtrace_on_policy_is_the_n_step_return():
    rng = np.random.default_rng(7)
    T, B, gamma = 7, 3, 0.9
    logp = rng.normal(size=(T, B))
    r, v = rng.normal(size=(T, B)), rng.normal(size=(T + 1, B))
    zeros = np.zeros((T, B), dtype=bool)
    vs, _ = vtrace(t(logp), t(logp), t(r), t(v), t(zeros, torch.bool), t(zeros, torch.bool), t(~zeros, torch.bool),
                   gamma, 1.0, 1.0)
    for s in range(T):
        n_step = sum(gamma ** (k - s) * r[k] for k in range(s, T)) + gamma ** (T - s) * v[T]
        np.testing.assert_allclose(vs[s].numpy(), n_step, rtol=1e-5, atol=1e-5)
    # ... and equals GAE with lambda 1 (the same estimator on-policy).
    _, ret = gae(t(r), t(v), t(zeros, torch.bool), t(zeros, torch.bool), t(~zeros, torch.bool), gamma, 1.0)
    np.testing.assert_allclose(vs.numpy(), ret.numpy(), rtol=1e-5, atol=1e-5)


def test_ppo_loss_clips_the_ratio_in_the_advantage_direction():
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    zeros = torch.zeros(4)
    loss, stats = ppo_loss(new, old, adv, zeros, zeros, zeros, zeros, clip=0.2, value_clip=None, vf_coef=0.0,
                           ent_coef=0.0)
    # min(r A, clip(r) A) per sample: 1.2, -1.5, 0.5, -0.8 -> loss is minus their mean.
    assert float(loss) == pytest.approx(-(1.2 - 1.5 + 0.5 - 0.8) / 4)
    assert float(stats["losses/clipfrac"]) == 1.0


def test_actor_critic_log_probs_match_torch_distributions():
    torch.manual_seed(0)
    disc = ActorCritic((3,), n_actions=4, hidden=(8,))
    obs = torch.randn(5, 3)
    actions, logp, _ = disc.act(obs)
    head, _ = disc(obs)
    ref = torch.distributions.Categorical(logits=head)
    lp, ent = disc.log_prob_entropy(head, actions)
    torch.testing.assert_close(lp, ref.log_prob(actions))
    torch.testing.assert_close(logp, ref.log_prob(actions))
    torch.testing.assert_close(ent, ref.entropy())

    cont = ActorCritic((2, 2), action_dim=2, hidden=(8,), log_std_init=-0.5)
    obs = torch.randn(6, 2, 2)
    actions, logp, _ = cont.act(obs)
    head, _ = cont(obs)
    ref = torch.distributions.Normal(head, cont.log_std.exp())
    lp, ent = cont.log_prob_entropy(head, actions)
    torch.testing.assert_close(lp, ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(logp, ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(ent, ref.entropy().sum(-1))
    assert torch.equal(cont.greedy(obs), head)


@pytest.mark.parametrize("shape", [(84, 84, 4), (3, 64, 64)])
def test_conv_encoder_takes_hwc_and_chw_images(shape):
    enc = ConvEncoder(shape)
    assert enc.channels_last == (shape[-1] < shape[0])
    net = ActorCritic(shape, n_actions=6, encoder="conv")
    obs = torch.randint(0, 255, (2, *shape), dtype=torch.uint8)
    head, value = net(obs)
    assert head.shape == (2, 6) and value.shape == (2,)
    (head.sum() + value.sum()).backward()
    assert all(p.grad is not None for p in net.parameters())
    assert math.isfinite(float(head.detach().sum()))


def test_actor_critic_initialisation_repeats_with_the_seed():
    # A set of the two trunks was initialised in address order: the same seed gave one of two initial networks.
    from rlctl.models import ActorCritic, parameter_digest

    digests, alive = set(), []
    for _ in range(30):
        torch.manual_seed(3)
        alive.append(ActorCritic((4,), n_actions=2, hidden=(16, 16)))  # kept alive: fresh addresses each time
        digests.add(parameter_digest(alive[-1]))
    assert len(digests) == 1


def _random_rollouts(info, T: int, B: int, seed: int) -> tuple[dict, torch.Generator]:
    """A random [T(+1), B] rollout batch of two-action CartPole shape, without `valid`, and its generator (to draw
    that next)."""
    g = torch.Generator().manual_seed(seed)
    batch = {"obs": torch.randn(T + 1, B, *info.obs_shape, generator=g), "value": torch.randn(T + 1, B, generator=g),
             "action": torch.randint(0, 2, (T, B), generator=g), "logp": -torch.rand(T, B, generator=g) - 0.3,
             "reward": torch.randn(T, B, generator=g), "terminated": torch.rand(T, B, generator=g) < 0.1,
             "done": torch.rand(T, B, generator=g) < 0.2}
    return batch, g


@pytest.mark.parametrize("valid_rows", ["all", "some", "none"])
def test_appo_one_pass_update_equals_the_two_pass_one(valid_rows):
    # epochs = minibatches = 1 with V-trace: targets from the training forward itself, one pass fewer; the step it
    # takes must be the two-pass one's (a no-grad forward for the targets, then the loss) to float precision.
    from rlctl.algos.base import LearnerSetup
    from rlctl.algos.onpolicy.learner import APPOLearner
    from rlctl.envs import probe_space_info
    from rlctl.job.load import validate_job

    job = validate_job({"job": {"name": "t", "seed": 4}, "env": {"id": "CartPole-v1", "envs_per_collector": 4},
                        "algorithm": {"name": "appo", "rollout_len": 8, "vtrace": True, "epochs": 1,
                                      "minibatches": 1, "value_clip": 0.2}})
    info = probe_space_info(job.env)
    T, B = 8, 4
    batch, g = _random_rollouts(info, T, B, seed=5)
    batch["valid"] = {"all": torch.ones(T, B, dtype=torch.bool), "none": torch.zeros(T, B, dtype=torch.bool),
                      "some": torch.rand(T, B, generator=g) < 0.7}[valid_rows]
    one, two = (APPOLearner(LearnerSetup(job, info, torch.device("cpu"))) for _ in range(2))
    two.model.load_state_dict(one.model.state_dict())
    before = [p.detach().clone() for p in one.model.parameters()]
    assert one.one_pass
    two.one_pass = False  # PPO's path: a no-grad pass for the targets, then the minibatch loss
    stats_one = one.update(batch).stats
    stats_two = two.update(batch).stats
    for a, b in zip(one.model.parameters(), two.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    moved = any(not torch.equal(a, b) for a, b in zip(before, one.model.parameters()))
    assert moved == (valid_rows != "none")
    assert set(stats_two) == set(stats_one)
    for k, v in stats_two.items():
        assert float(stats_one[k]) == pytest.approx(float(v), rel=1e-4, abs=1e-6), k


def test_impala_step_with_the_bootstrap_row_outside_autograd_equals_the_step_through_all_rows():
    # The learner runs the T trained rows through autograd and the bootstrap row's value under no_grad; the step
    # must be the one a single forward over all T+1 rows gives (nothing reads that row's head or value gradient).
    from rlctl.algos.base import LearnerSetup
    from rlctl.algos.onpolicy.learner import IMPALALearner
    from rlctl.algos.onpolicy.returns import impala_loss
    from rlctl.envs import probe_space_info
    from rlctl.job.load import validate_job

    job = validate_job({"job": {"name": "t", "seed": 4}, "env": {"id": "CartPole-v1", "envs_per_collector": 4},
                        "algorithm": {"name": "impala", "rollout_len": 8, "optimizer": "adam"}})
    info = probe_space_info(job.env)
    T, B = 8, 4
    batch, g = _random_rollouts(info, T, B, seed=6)
    batch["valid"] = torch.rand(T, B, generator=g) < 0.8
    learner, ref = (IMPALALearner(LearnerSetup(job, info, torch.device("cpu"))) for _ in range(2))
    ref.model.load_state_dict(learner.model.state_dict())
    before = [p.detach().clone() for p in learner.model.parameters()]
    learner.update(batch)
    algo = job.algorithm
    head, values = ref.model(batch["obs"].reshape((T + 1) * B, -1))
    head, values = head.reshape(T + 1, B, -1), values.reshape(T + 1, B)
    logp, entropy = ref.model.log_prob_entropy(head[:T].reshape(T * B, -1), batch["action"].reshape(T * B, -1))
    logp, entropy = logp.reshape(T, B), entropy.reshape(T, B)
    with torch.no_grad():
        vs, pg_adv = vtrace(batch["logp"], logp.detach(), batch["reward"] * algo.reward_scale, values.detach(),
                            batch["terminated"], batch["done"], batch["valid"], algo.gamma, algo.rho_bar, algo.c_bar)
    loss, _ = impala_loss(logp, entropy, values[:T], vs, pg_adv, batch["valid"].float(), algo.vf_coef, algo.ent_coef)
    ref.gradient_step(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    for a, b in zip(learner.model.parameters(), ref.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_live_columns_are_the_set_ones_of_a_boolean_batch_and_none_where_most_are():
    from rlctl.models import LIVE_SHARE_MAX, live_columns

    flat = torch.zeros(5, 10, dtype=torch.bool)
    flat[0, 2] = flat[3, 7] = flat[4, 2] = True
    assert live_columns(flat).tolist() == [2, 7]
    assert live_columns(flat.float()) is None  # only 0/1 batches known as such
    flat[:, : int(LIVE_SHARE_MAX * 10) + 1] = True
    assert live_columns(flat) is None  # the gather would cost about what it saves


@needs_extra("minatar", "minatar")
@pytest.mark.parametrize("share_trunk", [False, True])
def test_ppo_update_on_the_live_columns_of_boolean_grids_equals_the_dense_one(monkeypatch, share_trunk):
    # MinAtar Breakout frames from real play: the update that trains on the columns some frame sets takes the
    # same step as the one over all 400 (a column no row sets adds no output and an exact zero of weight gradient),
    # with separate trunks and with one shared by actor and critic.
    from rlctl import models
    from rlctl.job.load import validate_job
    from rlctl.roles.learner import build_core
    from test_cores import collect_blocks, learner_batch

    job = validate_job({"job": {"name": "t", "seed": 3},
                        "env": {"id": "MinAtar/Breakout-v1", "envs_per_collector": 8},
                        "algorithm": {"name": "ppo", "rollout_len": 32, "epochs": 2, "minibatches": 4, "lr": 5e-3},
                        "model": {"hidden": [32, 32], "activation": "relu", "share_trunk": share_trunk},
                        "topology": {"collectors": 2}})
    info, _, _, blocks = collect_blocks(job, 2)
    batch = learner_batch(job, blocks)
    live, dense = (build_core(job, info, torch.device("cpu")) for _ in range(2))
    dense.model.load_state_dict(live.model.state_dict())
    live_stats = live.update(batch).stats
    assert live.cols is not None and 0 < len(live.cols) < 400, "Breakout's frames leave most columns unset"
    monkeypatch.setattr(models, "LIVE_SHARE_MAX", 0.0)
    dense_stats = dense.update(batch).stats
    assert dense.cols is None
    for a, b in zip(live.model.parameters(), dense.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for k, v in dense_stats.items():
        assert float(live_stats[k]) == pytest.approx(float(v), rel=1e-3, abs=1e-5), k


def test_a_shared_trunk_is_one_trunk_under_both_heads():
    shared = ActorCritic((3, 3, 2), n_actions=4, hidden=(8, 8), activation="relu", share_trunk=True)
    separate = ActorCritic((3, 3, 2), n_actions=4, hidden=(8, 8), activation="relu")
    assert shared.actor_body is shared.critic_body
    trunk = sum(p.numel() for p in shared.actor_body.parameters())
    assert sum(p.numel() for p in separate.parameters()) - sum(p.numel() for p in shared.parameters()) == trunk
    # Seeded and sparse: at 0.3 a cell, the global generator's draw left over 80% of the columns set about half the
    # time, and live_columns then gave None (the test failed by the order tests ran in).
    obs = torch.rand(5, 3, 3, 2, generator=torch.Generator().manual_seed(0)) < 0.15
    features = shared.actor_body(obs)
    head, value = shared(obs)
    torch.testing.assert_close(head, F.linear(features, shared.actor_head.weight, shared.actor_head.bias))
    torch.testing.assert_close(value, shared.value(obs))
    cols = shared.live_columns(obs)
    assert cols is not None and len(cols) < 18
    cut = obs.flatten(1).index_select(1, cols)
    for a, b in zip(shared(cut, cols), (head, value)):
        torch.testing.assert_close(a, b)
    # Both heads' gradients reach the one trunk.
    (head.sum() + value.sum()).backward()
    assert all(p.grad is not None for p in shared.parameters())


def test_an_actor_critic_without_hidden_layers_takes_every_column():
    # Heads directly on the input (model.hidden = []): there is no first trunk layer to cut.
    model = ActorCritic((3, 3, 2), n_actions=2, hidden=())
    assert model.live_columns(torch.zeros(4, 3, 3, 2, dtype=torch.bool)) is None
    assert ActorCritic((3, 3, 2), n_actions=2, hidden=(8,)).live_columns(torch.zeros(4, 3, 3, 2, dtype=torch.bool)) \
        is not None


@pytest.mark.parametrize("scale", [1e-3, 1e3, float("inf")])
def test_clip_grad_norm_is_torchs_to_the_bit(scale):
    # The learner's own clip (rlctl.algos.base.clip_grad_norm) must take torch's step: same norm, same gradients,
    # a non-finite norm included (the learner then skips the step).
    from rlctl.algos.base import clip_grad_norm

    torch.manual_seed(0)
    ours, theirs = (ActorCritic((3, 3, 2), n_actions=4, hidden=(16, 8)) for _ in range(2))
    theirs.load_state_dict(ours.state_dict())
    for p, q in zip(ours.parameters(), theirs.parameters()):
        p.grad = torch.randn_like(p) * scale
        q.grad = p.grad.clone()
    mine, torchs = clip_grad_norm(ours.parameters(), 0.5), torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)
    assert torch.equal(mine, torchs) or (mine.isinf() and torchs.isinf())
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(p.grad, q.grad) or (p.grad.isnan().any() and q.grad.isnan().any())
