"""Ape-X learns CartPole-v1 end to end: the shipped job, the same job with two DDP learner ranks, and with 12
collectors."""

from __future__ import annotations

import json
import os

import pytest

from conftest import only_run, read_state, run_cli
from jobfiles import shipped_job

pytestmark = pytest.mark.slow  # end-to-end: real jobs run to their target, faults, or a lab of hosts

CAP_S = 420  # generous: the job usually stops far sooner; this only bounds a broken run


def _job_copy(tmp_path, **replace: str):
    return shipped_job(tmp_path, "apex", wall_s=CAP_S, **replace)


def _assert_solved(run_dir):
    state = read_state(run_dir)
    assert state["status"] == "finished", state.get("exit_reason")
    # The stop is decided on one evaluation; later ones (the evaluator keeps going until it is stopped) may differ,
    # so the figure that counts is the one it stopped on.
    by = state["stopped_by"]
    assert by["criterion"] == "eval_return" and by["value"] >= 475 and by["threshold"] == 475, state["exit_reason"]
    return state


def test_apex_job_solves_cartpole_and_its_checkpoint_scores_475(tmp_path):
    runs = tmp_path / "runs"
    run_cli(["run", str(_job_copy(tmp_path)), "--runs-dir", str(runs)], timeout=CAP_S + 120)
    run_dir = only_run(runs)
    _assert_solved(run_dir)
    # The learned checkpoint, loaded again in a fresh process, on 100 fresh episodes (CartPole's own definition of
    # solved; ten let one failed episode of an otherwise solid policy decide).
    res = run_cli(["eval", run_dir.name, "--episodes", "100", "--json", "--runs-dir", str(runs)], timeout=120)
    result = json.loads(res.stdout)
    assert result["episodes"] == 100 and result["return_mean"] >= 475, result
    assert (run_dir / "checkpoints" / "latest.pt").is_file()


def test_two_learner_ranks_solve_and_hold_identical_parameters(tmp_path):
    runs = tmp_path / "runs"
    job = _job_copy(tmp_path, learner_procs="2")
    run_cli(["run", str(job), "--runs-dir", str(runs)], timeout=CAP_S + 120)
    run_dir = only_run(runs)
    state = _assert_solved(run_dir)
    plan = json.loads((run_dir / "plan.json").read_text())
    assert "--nproc-per-node 2" in " ".join(next(p for p in plan["processes"] if p["role"] == "learner")["argv"])
    assert len(plan["endpoints"]["replay"]) == 2
    ranks = state["learner_ranks"]
    assert set(ranks) == {"0", "1"}, ranks
    assert ranks["0"]["learner/final"] == 1 and ranks["1"]["learner/final"] == 1
    assert ranks["0"]["learner/param_digest"] == ranks["1"]["learner/param_digest"]
    assert ranks["0"]["learner/updates"] == ranks["1"]["learner/updates"] > 0


def test_many_collectors_solve_with_fresh_weights_and_bounded_values(tmp_path):
    """12 collectors on this machine's few cores (the shipped job with only its topology changed): the run solves,
    `rlctl run` warns that the machine is crowded, and the values stay near what CartPole's rewards allow. While
    socket buffers held ~1,300 transitions per collector, one such run diverged (Q mean 4.5e8, named by the guard
    after 13k updates) and never solved."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = tmp_path / "runs"
    job = _job_copy(tmp_path, collectors="12", envs_per_collector="2")
    proc = run_cli(["run", str(job), "--runs-dir", str(runs)], timeout=CAP_S + 120)
    if (os.cpu_count() or 1) < 7:  # 15 processes: more than twice the cores
        assert "warning: 15 processes on this machine's" in proc.stderr, proc.stderr
    run_dir = only_run(runs)
    state = _assert_solved(run_dir)
    assert state["metrics"]["learner/diverging"] == 0
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    q_mean = max(e.value for e in acc.Scalars("learner/q_mean"))
    q_max = max(e.value for e in acc.Scalars("learner/q_abs_max"))
    bound = max(e.value for e in acc.Scalars("learner/q_bound"))
    # The mean Q of sampled transitions stays within three times the bound (any single action's |Q| may pass it
    # briefly: 208 in one CI run), and nothing comes near the divergence guard's 10x. One clean-clone CI, on a day
    # this machine ran everything 2-3x slower, saw the mean reach 251 (|Q| 458) in a run that solved; why it went
    # that high there is not known. The diverged run this test guards against reached 4.5e8.
    assert abs(bound - 100.0) < 0.01 and q_mean < 3 * bound and q_max < 5 * bound, (q_mean, q_max, bound)
    assert sum(p["role"] == "collector" for p in state["processes"]) == 12
