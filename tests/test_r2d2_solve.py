"""R2D2 learns CartPole-v1 with its velocities hidden (jobs/r2d2.toml) and uses its memory to: the same job with
the LSTM swapped for a feed-forward layer of the same width does not reach the target in the same env-step budget.
R2D2 solves plain CartPole-v1 too, and `rlctl eval` runs its recurrent policy."""

from __future__ import annotations

import json
import re

import pytest

from conftest import only_run, read_state, run_cli
from jobfiles import shipped_job

pytestmark = pytest.mark.slow  # end-to-end: real jobs run to their target, faults, or a lab of hosts

BUDGET_ENV_STEPS = 500_000  # the masked job needed 129k-282k over seeds 1-4; the feed-forward one never got there
CAP_S = 300
# The feed-forward run has to use its whole env-step budget: 153 s in one clean-clone CI, but 300 s were not enough
# for it in a later one, whose learner ran at 40-60 updates/s where the first ran at 116-128. Its cap only bounds a
# broken run.
NO_MEMORY_CAP_S = 900


def _job(tmp_path, name: str, *, memory: str | None = None, masked: bool = True, cap_s: float = CAP_S):
    stop = f"eval_return = 475.0\neval_rounds = 3\nenv_steps = {BUDGET_ENV_STEPS}"
    return shipped_job(tmp_path, "r2d2", name=name, stop=stop, wall_s=cap_s, drop=() if masked else ("wrappers",),
                       add={"algorithm": f'memory = "{memory}"'} if memory is not None else None)


def _run(tmp_path, job, cap_s: float = CAP_S) -> tuple[dict, object]:
    runs = tmp_path / "runs"
    run_cli(["run", str(job), "--runs-dir", str(runs)], timeout=cap_s + 120)
    run_dir = only_run(runs)
    state = read_state(run_dir)
    assert state["status"] == "finished", state.get("exit_reason")
    return state, run_dir


def _solved(state: dict) -> bool:
    by = state["stopped_by"]
    return by["criterion"] == "eval_return" and by["value"] >= 475  # for eval_rounds = 3 rounds in a row


def test_r2d2_solves_masked_cartpole_and_eval_runs_its_recurrent_policy(tmp_path):
    state, run_dir = _run(tmp_path, _job(tmp_path, "r2d2-masked"))
    assert _solved(state), state["exit_reason"]
    m = state["metrics"]
    assert m["charts/env_steps"] < BUDGET_ENV_STEPS
    assert m["learner/updates"] > 0 and m["replay/size"] > 0
    # The learned checkpoint in a fresh process, on fresh (masked) episodes, carrying the LSTM state. The bar is not
    # the run's 475: ten other episodes of a policy picked for scoring >= 475 on its own ten come out lower now and
    # then (one CI run's best.pt: 472-489 over seeds 0-4). Carrying the state is what the test is after, and a
    # policy that lost it between steps scored 20 with that same checkpoint.
    res = run_cli(["eval", run_dir.name, "--episodes", "10", "--json", "--runs-dir", str(run_dir.parent)])
    result = json.loads(res.stdout)
    assert result["return_mean"] >= 400, result


def test_r2d2_without_memory_does_not_solve_masked_cartpole_in_the_same_budget(tmp_path):
    state, run_dir = _run(tmp_path, _job(tmp_path, "r2d2-no-memory", memory="none", cap_s=NO_MEMORY_CAP_S),
                          NO_MEMORY_CAP_S)
    assert not _solved(state), state["exit_reason"]
    assert state["stopped_by"]["criterion"] == "env_steps", state["exit_reason"]
    evals = [float(x) for x in re.findall(r"return ([\d.]+) \(min", (run_dir / "logs" / "evaluator-0.log").read_text())]
    assert evals and max(evals) < 475, max(evals)


def test_r2d2_solves_plain_cartpole(tmp_path):
    state, _ = _run(tmp_path, _job(tmp_path, "r2d2-plain", masked=False))
    assert _solved(state), state["exit_reason"]
