"""Early stopping of a sweep's losing trials (`[sweep.early_stop]`): the median rule as a pure function of the trials'
curves; the table refused with exit 2 naming the file and key; the scheduler's records (sweep.json, the trial's exit
reason, `rlctl status SWEEP`) and a resumed sweep that leaves an early-stopped trial alone; and (slow) a 3-trial PPO
sweep whose trial with a learning rate of almost 0 is stopped early."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from jobfiles import shipped_job
from rlctl.job.early_stop_spec import EarlyStopRule
from rlctl.supervise.early_stop import EarlyStopper, TrialCurves, median_stops
from rlctl.sweep_dir import SweepDir

RULE = EarlyStopRule(grace_env_steps=1000, interval_env_steps=1000, min_trials=2)


def _line(points: dict[int, float]) -> list[tuple[float, float]]:
    return [(float(s), r) for s, r in points.items()]


def test_a_trial_below_the_median_of_the_others_at_the_same_env_steps_is_stopped_with_why():
    curves = {"good1": _line({500: 20, 1000: 60, 2000: 120}), "good2": _line({500: 25, 1000: 40, 2000: 90}),
              "bad": _line({500: 22, 1000: 21, 1500: 23})}
    stops = median_stops(curves, ["bad", "good2"], RULE)
    assert list(stops) == ["bad"]  # good2 is judged at 2000 env steps, which only good1 reached: too few others
    assert stops["bad"] == "best return 23 by 1500 env steps, below the median 50 of 2 other trials by 1000"


def test_a_trial_is_judged_by_the_others_at_its_own_env_steps_not_by_where_they_ended():
    # The others ended far better (500), but by 2000 env steps they were where this trial is now.
    curves = {"a": _line({1000: 20, 2000: 30, 9000: 500}), "b": _line({1000: 22, 2000: 28, 9000: 480}),
              "late": _line({1000: 21, 2000: 31})}
    assert median_stops(curves, ["late"], RULE) == {}


def test_no_trial_is_stopped_in_its_grace_nor_against_fewer_than_min_trials_that_got_as_far():
    curves = {"a": _line({1000: 100, 3000: 200}), "b": _line({900: 100}), "slow": _line({800: 10, 2000: 10})}
    # b, still running, has not reached 2000 env steps: one other trial is fewer than min_trials
    assert median_stops(curves, ["slow", "b"], RULE) == {}
    assert median_stops(curves, ["slow", "b"], EarlyStopRule(grace_env_steps=1000, interval_env_steps=1000,
                                                             min_trials=1)) != {}
    assert median_stops(curves, ["slow", "b"], EarlyStopRule(grace_env_steps=2500, interval_env_steps=1000,
                                                             min_trials=1)) == {}
    assert median_stops({"a": [], "b": []}, ["a"], RULE) == {}  # nothing seen yet


def test_trials_that_ended_before_the_check_point_count_with_their_best():
    """Trials that met their target at ~10k env steps, and one that starts after them and is first seen at 11k (a
    fast trial alone on the machine): it is judged against their best, not let through for want of others."""
    curves = {"t000": _line({4000: 57, 9857: 156}), "t001": _line({3000: 48, 6552: 120}), "t002": _line({11263: 25})}
    stops = median_stops(curves, ["t002"], RULE)
    assert stops == {"t002": "best return 25 by 11263 env steps, below the median 138 of 2 other trials by 11000"}
    assert median_stops(curves, ["t002", "t001"], RULE) == {}  # t001 still running, short of 11k: too few


def test_check_points_start_at_the_grace_and_follow_every_interval():
    rule = EarlyStopRule(grace_env_steps=3000, interval_env_steps=2000)
    assert [rule.check_point(s) for s in (0, 2999, 3000, 4999, 5000, 9100)] == [None, None, 3000, 3000, 5000, 9000]


def test_curves_gather_history_and_current_figures_ignoring_what_is_not_a_number():
    curves = TrialCurves()
    curves.observe("t0", {"progress_history": [[1.0, 100, None, None], [2.0, 200, 15.5, None], "junk"],
                          "metrics": {"charts/env_steps": 300, "charts/episode_return_mean": 18.0}})
    curves.observe("t0", {"progress_history": [], "metrics": {"charts/env_steps": 400,
                                                              "charts/episode_return_mean": float("nan")}})
    curves.observe("t1", None)
    assert curves.curves() == {"t0": [(200.0, 15.5), (300.0, 18.0)]} and not curves.seen("t1")


def _sweep_file(tmp_path: Path, early: str) -> Path:
    shipped_job(tmp_path, "ppo", file_name="base.toml")
    f = tmp_path / "sweep.toml"
    f.write_text(f'[sweep]\nbase = "base.toml"\n\n[sweep.params]\n"algorithm.lr" = [1e-3, 2e-3]\n\n{early}\n')
    return f


@pytest.mark.parametrize("early, says", [
    ('[sweep.early_stop]\nrule = "mean"', r"sweep\.early_stop\.rule: one of median \(got 'mean'\)"),
    ("[sweep.early_stop]\ngrace = 5", r"sweep\.early_stop\.grace: unknown key \(known: rule, grace_env_steps"),
    ("[sweep.early_stop]\ninterval_env_steps = 0", r"sweep\.early_stop\.interval_env_steps: an integer >= 1"),
    ("[sweep.early_stop]\nmin_trials = 2.5", r"sweep\.early_stop\.min_trials: an integer >= 1 \(got 2\.5\)"),
])
def test_a_bad_early_stop_table_exits_2_naming_the_file_and_key(tmp_path, early, says):
    f = _sweep_file(tmp_path, early)
    proc = run_cli(["sweep", str(f), "--runs-dir", str(tmp_path / "runs")], expected_exit=2)
    assert proc.stderr.startswith(f"{f}: invalid sweep file") and re.search(says, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_the_rule_reaches_sweep_json(tmp_path):
    from rlctl.job.sweep_spec import load_sweep
    from rlctl.launch.sweep import create_sweep

    f = _sweep_file(tmp_path, "[sweep.early_stop]\ngrace_env_steps = 4000\nmin_trials = 2")
    sweep = create_sweep(load_sweep(f), tmp_path / "runs")
    assert sweep.read()["early_stop"] == {"rule": "median", "grace_env_steps": 4000, "interval_env_steps": 5000,
                                          "min_trials": 2}
    assert EarlyStopper.of(sweep).rule == EarlyStopRule(grace_env_steps=4000, min_trials=2)
    assert EarlyStopper.of(SweepDir(tmp_path)) is None  # no sweep.json, no rule


def _state(status: str, curve: dict[int, float]) -> dict:
    return {"status": status, "job": "ppo-cartpole", "exit_reason": "stopped by SIGTERM",
            "progress_history": [[0.0, s, r, None] for s, r in curve.items()]}


def _made_sweep(tmp_path: Path, states: dict[str, dict]) -> SweepDir:
    sweep = SweepDir(tmp_path / "sw-20260101-000000")
    sweep.path.mkdir()
    for trial, state in states.items():
        (sweep.path / trial).mkdir()
        sweep.trial_dir(trial).write_state(state)
    sweep.write({"sweep_id": sweep.sweep_id, "name": "sw", "status": "finished", "max_concurrent": 1,
                 "params": ["algorithm.lr"], "early_stop": RULE.record(),
                 "trials": [{"id": t, "values": {"algorithm.lr": 0.001 * (i + 1)}, "seed": 1}
                            for i, t in enumerate(states)]})
    return sweep


def test_the_scheduler_records_an_early_stop_in_sweep_json_the_run_and_the_sweep_view(tmp_path):
    sweep = _made_sweep(tmp_path, {"t000": _state("finished", {1000: 80, 2000: 150}),
                                   "t001": _state("finished", {1000: 60, 2000: 140}),
                                   "t002": _state("running", {1000: 20, 2000: 22})})
    stopper = EarlyStopper.of(sweep)
    why = "best return 22 by 2000 env steps, below the median 145 of 2 other trials by 2000"
    assert stopper.judge(["t002"]) == {"t002": why}
    assert stopper.judge(["t002"]) == {}  # told once
    assert sweep.read()["early_stopped"] == {"t002": why}
    sweep.trial_dir("t002").write_state(_state("stopped", {1000: 20, 2000: 22}))  # as its supervisor leaves it
    stopper.ended("t002")
    assert sweep.trial_dir("t002").read_state()["exit_reason"] == f"early-stopped: {why}"
    assert EarlyStopper.of(sweep).stopped == {"t002": why}  # a resumed scheduler knows
    out = run_cli(["status", str(sweep.path)], env={"COLUMNS": "200"}).stdout
    assert "3 trials: 2 finished, 1 stopped (1 early)" in out, out
    assert re.search(r"t002 +lr=0\.003 +stopped \(early\)", out) and f"t002 early-stopped: {why}" in out, out
    data = json.loads(run_cli(["status", str(sweep.path), "--json"]).stdout)
    assert [t["early_stopped"] for t in data["trials"]] == [None, None, why]


def test_a_trial_that_met_its_target_before_the_stop_reached_it_is_not_told_as_stopped_early(tmp_path):
    sweep = _made_sweep(tmp_path, {"t000": _state("finished", {1000: 80}), "t001": _state("finished", {1000: 60}),
                                   "t002": _state("running", {1000: 20})})
    stopper = EarlyStopper.of(sweep)
    assert list(stopper.judge(["t002"])) == ["t002"]
    sweep.trial_dir("t002").write_state({**_state("finished", {1000: 20}), "exit_reason": "env steps met"})
    stopper.ended("t002")
    assert sweep.read()["early_stopped"] == {} and stopper.stopped == {}
    assert sweep.trial_dir("t002").read_state()["exit_reason"] == "env steps met"


def test_a_resumed_sweep_does_not_continue_a_trial_stopped_early(tmp_path):
    sweep = _made_sweep(tmp_path, {"t000": _state("finished", {1000: 80}), "t001": _state("stopped", {1000: 5})})
    sweep.update(early_stopped={"t001": "best return 5 ..."}, status="stopped")
    proc = subprocess.run([sys.executable, "-m", "rlctl.supervise.sweep_scheduler", str(sweep.path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sweep.trial_dir("t001").read_state()["status"] == "stopped"
    assert sweep.read()["status"] == "finished" and not sweep.log.exists()  # nothing started


@pytest.mark.slow
def test_a_sweep_stops_its_trial_that_does_not_learn_early_keeping_its_checkpoint(tmp_path):
    """Three PPO trials, two at a time, to a return of 150 within 30000 env steps; the third's learning rate is
    almost 0: from 4000 env steps on its best return is below the median of the two others' there, and it stops.
    (With a budget of 10000 env steps for all, the third, alone on the machine, used it up in 2.8 s, before the
    scheduler had looked.)"""
    shipped_job(tmp_path, "ppo", stop="train_return = 150.0\nenv_steps = 30000\nwall_s = 120", file_name="base.toml")
    f = tmp_path / "sweep.toml"
    f.write_text('[sweep]\nbase = "base.toml"\nmax_concurrent = 2\n\n[sweep.params]\n'
                 '"algorithm.lr" = [4e-3, 3e-3, 1e-9]\n\n'
                 "[sweep.early_stop]\ngrace_env_steps = 4000\ninterval_env_steps = 1000\nmin_trials = 2\n")
    runs = tmp_path / "runs"
    proc = run_cli(["sweep", str(f), "--runs-dir", str(runs)], timeout=300, env={"COLUMNS": "160"})
    sweep = next(SweepDir(p) for p in runs.iterdir() if (p / "sweep.json").is_file())
    assert re.search(r"3 trials: 2 finished, 1 stopped \(1 early\)", proc.stdout), proc.stdout
    assert list(sweep.read()["early_stopped"]) == ["t002"], sweep.read()
    state = sweep.trial_dir("t002").read_state()
    assert state["status"] == "stopped" and state["exit_reason"].startswith("early-stopped: best return"), state
    assert state["metrics"]["charts/env_steps"] < 30000
    assert (sweep.path / "t002" / "checkpoints" / "latest.pt").is_file()
    ranked = json.loads(run_cli(["compare", sweep.sweep_id, "--runs-dir", str(runs), "--json"]).stdout)
    assert list(ranked)[-1].endswith("t002") and ranked[list(ranked)[-1]]["exit_reason"].startswith("early-stopped")
