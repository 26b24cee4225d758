"""The learner's divergence guard: non-finite figures or |Q| far past the bound the rewards and gamma allow are
named in the heartbeat (learner/diverging), the live table and `rlctl status`."""

from __future__ import annotations

import math

import torch

from rlctl import metric_names as M
from rlctl.views.console import divergence_text, header_lines, progress_line
from rlctl.roles.learner import DIVERGENCE_FACTOR, build_core, divergence
from test_cores import collect_blocks, learner_batch, small_job


def test_guard_names_non_finite_figures_and_runaway_values():
    assert divergence({M.TD_LOSS: 0.5, M.Q_ABS_MAX: 103.0, M.Q_BOUND: 100.0}) is None  # a few percent over: fine
    assert divergence({M.TD_LOSS: 0.5}) is None  # no bound known (gamma = 1, or a rollout algorithm)
    assert divergence({M.TD_LOSS: math.nan, M.Q_MEAN: 1.0}) == f"non-finite {M.TD_LOSS}"
    assert "non-finite" in divergence({M.Q_ABS_MAX: math.inf, M.Q_BOUND: 100.0})
    assert divergence({M.Q_ABS_MAX: 451.8, M.Q_BOUND: 100.0}) is None  # seen in a 24-collector run that solved
    why = divergence({M.Q_ABS_MAX: 3.2e7, M.Q_BOUND: 100.0})
    assert why and "3.2e+07" in why and "100" in why
    assert divergence({M.Q_ABS_MAX: DIVERGENCE_FACTOR * 100.0 + 1, M.Q_BOUND: 100.0})


def test_apex_and_r2d2_cores_report_values_the_guard_reads():
    for name in ("apex", "r2d2"):
        torch.manual_seed(0)
        job = small_job(name)
        info, _, _, blocks = collect_blocks(job, 6)
        batch = learner_batch(job, blocks)
        core = build_core(job, info, torch.device("cpu"))
        stats = {k: float(v) for k, v in core.update(batch).stats.items()}
        # CartPole: reward 1 per step, so |Q| <= 1 / (1 - gamma) = 100 at gamma 0.99.
        assert abs(stats[M.Q_BOUND] - 1.0 / (1.0 - job.algorithm.gamma)) < 1e-6 * stats[M.Q_BOUND], (name, stats)
        assert divergence(stats) is None, (name, stats)
        # Blow the network's outputs up as a diverged run's are: the guard names it.
        with torch.no_grad():
            for p in core.model.parameters():
                p.mul_(1000.0)
        stats = {k: float(v) for k, v in core.update(batch).stats.items()}
        why = divergence(stats)
        assert why is not None and (stats[M.Q_ABS_MAX] > DIVERGENCE_FACTOR * stats[M.Q_BOUND] or "non-finite" in why), \
            (name, stats)


def test_live_table_and_status_name_a_diverging_run():
    state = {"job": "j", "algorithm": "apex", "run_id": "j-1", "status": "running", "started_at": 0,
             "metrics": {M.ENV_STEPS: 10, M.DIVERGING: 1, M.Q_ABS_MAX: 3.2e7, M.Q_BOUND: 100.0}}
    for text in (" | ".join(header_lines(state, now=1.0)), progress_line(state, now=1.0)):
        assert "DIVERGING: |Q| 3.2e+07 against a bound of 100" in text
    state["metrics"][M.DIVERGING] = 0
    assert "DIVERGING" not in " | ".join(header_lines(state, now=1.0))
    assert divergence_text({M.DIVERGING: 1, M.Q_ABS_MAX: float("nan")}) == "DIVERGING: non-finite losses or values"


def test_every_core_refuses_a_gradient_step_from_non_finite_data():
    """A NaN reward (a buggy or hostile collector, or a run gone wrong) must not reach the weights that are
    published and checkpointed: the step is skipped and counted, and the next finite batch trains as before."""
    for name in ("apex", "ppo", "r2d2"):
        torch.manual_seed(0)
        job = small_job(name)
        info, _, _, blocks = collect_blocks(job, 6)
        batch = learner_batch(job, blocks)
        core = build_core(job, info, torch.device("cpu"))
        before = [p.detach().clone() for p in core.model.parameters()]
        poisoned = dict(batch)
        reward = poisoned["reward"]
        poisoned["reward"] = reward.copy() if hasattr(reward, "copy") else reward.clone()
        poisoned["reward"][0] = float("nan")
        core.update(poisoned)
        assert core.nonfinite_steps > 0, name
        assert all(torch.equal(a, b) for a, b in zip(before, core.model.parameters())), name
        steps = core.nonfinite_steps
        core.update(batch)
        assert core.nonfinite_steps == steps, name
        assert all(torch.isfinite(p).all() for p in core.model.parameters()), name
        assert not all(torch.equal(a, b) for a, b in zip(before, core.model.parameters())), name
