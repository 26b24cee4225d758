"""A2C: its loss is the n-step actor-critic loss written out by hand, and the shipped job learns CartPole-v1."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import only_run, read_state, run_cli
from jobfiles import shipped_job


def _job(**algorithm):
    from rlctl.job.load import validate_job

    return validate_job({"job": {"name": "t", "seed": 2}, "env": {"id": "CartPole-v1", "envs_per_collector": 3},
                         "algorithm": {"name": "a2c", "rollout_len": 4, "ent_coef": 0.01, **algorithm}})


def _batch(T: int, B: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(T + 1, B, 4, generator=g), "value": torch.randn(T + 1, B, generator=g),
            "action": torch.randint(0, 2, (T, B), generator=g), "logp": -torch.rand(T, B, generator=g) - 0.3,
            "reward": torch.randn(T, B, generator=g), "terminated": torch.rand(T, B, generator=g) < 0.2,
            "done": torch.zeros(T, B, dtype=torch.bool), "valid": torch.rand(T, B, generator=g) < 0.8}


def _core(job):
    from rlctl.algos.base import LearnerSetup
    from rlctl.envs import probe_space_info

    return job.algorithm_entry.load("learner")(LearnerSetup(job, probe_space_info(job.env), torch.device("cpu")))


def test_a2c_loss_is_the_n_step_actor_critic_loss():
    job = _job()
    algo = job.algorithm
    core = _core(job)
    T, B = 4, 3
    batch = _batch(T, B, seed=1)
    # As collectors record them: episodes end by termination; the step after an end is the env's reset (invalid).
    batch["done"] = batch["terminated"].clone()
    batch["valid"] = torch.cat([torch.ones(1, B, dtype=torch.bool), ~batch["done"][:-1]])
    with torch.no_grad():
        loss = core.loss(batch, True).loss
        head, values = core.model(batch["obs"].reshape((T + 1) * B, 4))
        values = values.reshape(T + 1, B)
        logp, entropy = core.model.log_prob_entropy(head[: T * B], batch["action"].reshape(T * B, -1))
    logp, entropy = logp.reshape(T, B), entropy.reshape(T, B)
    # n-step returns, written as a loop over each env: R_t = r_t + gamma R_{t+1}, cut at terminations, V(s_T) after.
    returns = torch.zeros(T, B)
    for b in range(B):
        running = values[T, b]
        for t in reversed(range(T)):
            running = batch["reward"][t, b] + (0.0 if batch["terminated"][t, b] else algo.gamma * running)
            returns[t, b] = running
    valid = batch["valid"]
    adv = returns - values[:T]
    expected = (-(logp * adv)[valid].mean() + algo.vf_coef * ((values[:T] - returns) ** 2)[valid].mean()
                - algo.ent_coef * entropy[valid].mean())
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_a2c_update_takes_one_clipped_step_and_reports_its_losses():
    from rlctl import metric_names as M

    core = _core(_job(optimizer="adam", max_grad_norm=0.1))
    before = [p.detach().clone() for p in core.model.parameters()]
    result = core.update(_batch(4, 3, seed=2))
    assert any(not torch.equal(a, b) for a, b in zip(before, core.model.parameters()))
    assert {M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.GRAD_NORM, M.LR} <= set(result.stats)
    assert float(result.stats[M.GRAD_NORM]) > 0 and core.version == 1
    assert result.samples == int(_batch(4, 3, seed=2)["valid"].sum())


@pytest.mark.slow
def test_shipped_a2c_job_solves_cartpole(tmp_path):
    runs = tmp_path / "runs"
    run_cli(["run", str(shipped_job(tmp_path, "a2c", wall_s=300)), "--runs-dir", str(runs)], timeout=420)
    state = read_state(only_run(runs))
    assert state["status"] == "finished", state.get("exit_reason")
    match = re.fullmatch(r"charts/episode_return_mean (-?[\d.]+) >= (-?[\d.]+)", state["exit_reason"])
    assert match and float(match.group(1)) >= 475.0, state["exit_reason"]
    assert state["metrics"]["learner/policy_lag_mean"] == 0  # synchronous: each round trains on its own version
