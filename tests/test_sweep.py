"""Sweeps (`rlctl sweep`): a bad sweep file refused before anything starts, naming the file, the parameter and the
trial; the trials listed by `rlctl plan`; a small PPO sweep run to its end with one command and ranked by `rlctl
compare`; a killed scheduler's trials stopped with their checkpoints and continued, none from zero, by `rlctl run
--resume SWEEP`; `rlctl stop SWEEP`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import pid_alive, run_cli, wait_for
from jobfiles import shipped_job
from rlctl import events


def _sweep_file(directory: Path, body: str, base: str = "base.toml", head: str = "") -> Path:
    f = directory / "sweep.toml"
    f.write_text(f'[sweep]\nbase = "{base}"\n{head}\n[sweep.params]\n{body}\n')
    return f


def _base(directory: Path, stop: str = "train_return = 150.0\nwall_s = 120") -> Path:
    return shipped_job(directory, "ppo", stop=stop, file_name="base.toml")


@pytest.mark.parametrize("body, head, says", [
    ('"algorithm.lrr" = [1e-3, 2e-3]', "", [r"sweep\.params\.'algorithm\.lrr'", r"trial t000 \(algorithm\.lrr=0\.001",
                                            r"unknown key 'lrr' \(did you mean 'lr'\?\)", r"and 1 more trials"]),
    ('"algorithm.lr" = []', "", [r"sweep\.params\.'algorithm\.lr': an empty grid"]),
    # Only the second grid value is refused: the message names that trial, not the first.
    ('"algorithm.clip" = [0.2, 20.0]', "seeds = [1, 2]",
     [r"sweep\.params\.'algorithm\.clip'", r"trial t002 \(algorithm\.clip=20, seed 1\)", r"less than or equal to 10",
      r"and 1 more trials"]),
    ('"algorithm.ent_coef" = { log_uniform = [0, 1] }', "trials = 2", [r"log_uniform: bounds above 0"]),
    ('"algorithm.lr" = [1e-3]', "trials = 3", [r"sweep\.trials: draws from distributions"]),
    ('"algorithm.lr" = { normal = [0, 1] }', "", [r"sweep\.params\.'algorithm\.lr': a list \(a grid axis\) or one"]),
    ('"algorithm.lr" = [1e-3]', 'place = "cloud"', [r"sweep\.place: one of 'local', 'hosts', 'nodes' \(got 'cloud'\)"]),
    ('"algorithm.lr" = [1e-3]', 'place = "nodes"', [r"sweep\.place: \"nodes\" runs each trial on one node of the Slurm "
                                                    r"allocation the sweep runs in; base\.toml needs cluster\.scheduler"]),
    ('"algorithm.lr" = [1e-3]', 'place = "hosts"', [r"sweep\.place: \"hosts\" runs each trial on one of the base job's "
                                                    r"\[\[hosts\]\]; base\.toml lists none"]),
])
def test_a_bad_sweep_file_exits_2_naming_file_parameter_and_trial_and_starts_nothing(tmp_path, body, head, says):
    _base(tmp_path)
    f = _sweep_file(tmp_path, body, head=head)
    runs = tmp_path / "runs"
    for args in (["sweep", str(f)], ["plan", str(f)]):
        proc = run_cli([*args, "--runs-dir", str(runs)], expected_exit=2)
        assert proc.stderr.startswith(f"{f}: invalid sweep file"), proc.stderr
        for pattern in says:
            assert re.search(pattern, proc.stderr), (pattern, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert not runs.exists()  # nothing was made, let alone started


def test_a_sweep_without_its_base_job_names_the_missing_file(tmp_path):
    f = _sweep_file(tmp_path, '"algorithm.lr" = [1e-3]', base="nowhere.toml")
    proc = run_cli(["sweep", str(f), "--runs-dir", str(tmp_path / "runs")], expected_exit=2)
    assert f"sweep.base: {tmp_path / 'nowhere.toml'}: file not found" in proc.stderr


def test_plan_lists_every_trial_grid_times_draws_times_seeds_the_same_each_time(tmp_path):
    _base(tmp_path)
    f = _sweep_file(tmp_path, '"algorithm.lr" = [1e-3, 4e-3]\n"algorithm.ent_coef" = { log_uniform = [1e-4, 1e-1] }',
                    head="seeds = [1, 2]\ntrials = 2")
    first = json.loads(run_cli(["plan", str(f), "--json"]).stdout)
    assert json.loads(run_cli(["plan", str(f), "--json"]).stdout) == first  # a seeded RNG draws the values
    trials = first["trials"]
    assert [t["id"] for t in trials] == [f"t{i:03d}" for i in range(8)]
    assert [(t["values"]["algorithm.lr"], t["seed"]) for t in trials[:4]] == [(1e-3, 1), (1e-3, 2), (4e-3, 1),
                                                                             (4e-3, 2)]
    draws = sorted({t["values"]["algorithm.ent_coef"] for t in trials})
    assert len(draws) == 2 and all(1e-4 <= d <= 1e-1 for d in draws)
    table = run_cli(["sweep", "--plan", str(f)], env={"COLUMNS": "120"}).stdout
    assert "8 trials" in table and re.search(r"t007 +0\.004 +[\d.e-]+ +2", table), table


HOSTS = """
[[hosts]]
name = "h1"
address = "10.9.9.1"
learner = true
learner_procs = 2
collectors = 1

[[hosts]]
name = "h2"
address = "10.9.9.2"
collectors = 2
evaluator = true

[[hosts]]
name = "h3"
address = "10.9.9.3"
collectors = 1
"""


def test_place_hosts_runs_each_trial_whole_on_one_host_in_turn(tmp_path):
    """`place = "hosts"`: trial i runs on host i mod 3, with every process of the base job there (the head's learner
    ranks, all hosts' collectors and the evaluator); `rlctl plan` shows where."""
    shipped_job(tmp_path, "ppo", file_name="base.toml", drop=("collectors", "evaluator"), extra=HOSTS)
    f = _sweep_file(tmp_path, '"algorithm.lr" = [1e-3, 2e-3]', head='seeds = [1, 2]\nplace = "hosts"')
    plan = json.loads(run_cli(["plan", str(f), "--json"]).stdout)
    assert plan["place"] == "hosts" and plan["trials_per_host"] == 1
    assert [t["host"] for t in plan["trials"]] == ["h1", "h2", "h3", "h1"]
    table = run_cli(["plan", str(f)], env={"COLUMNS": "120"}).stdout
    assert "each on one host, 1 per host at most" in " ".join(table.split()) and re.search(r"t003 +0\.002 +2 +h1", table), table
    from rlctl.job.sweep_spec import load_sweep

    spec = load_sweep(f)
    for trial, job in zip(spec.trials, spec.jobs):
        (host,) = job.hosts
        assert (host.name, host.learner, host.learner_procs, host.collectors, host.evaluator) == (
            trial.host, True, 2, 4, True)
        assert host.address == {"h1": "10.9.9.1", "h2": "10.9.9.2", "h3": "10.9.9.3"}[trial.host]


def test_host_slots_start_a_trial_only_where_its_host_has_room():
    from rlctl.supervise.sweep_scheduler import HostSlots

    data = {"trials_per_host": 1, "trials": [{"id": "t000", "host": "h1"}, {"id": "t001", "host": "h2"},
                                             {"id": "t002", "host": "h1"}, {"id": "t003", "host": "h2"}]}
    slots = HostSlots(data)
    assert slots.next_startable(["t000", "t001", "t002", "t003"], {}) == "t000"
    assert slots.next_startable(["t002", "t003"], {"t000": None}) == "t003"  # h1 is busy; h2 is free
    assert slots.next_startable(["t002"], {"t000": None, "t003": None}) is None
    assert HostSlots({**data, "trials_per_host": 2}).next_startable(["t002"], {"t000": None}) == "t002"
    local = HostSlots({"trials": [{"id": "t000", "host": None}]})
    assert local.next_startable(["t000"], {"t009": None}) == "t000"


def test_a_trial_whose_run_finished_did_not_fail_whatever_signal_ended_its_supervisor():
    # A PBT exploit's SIGTERM reached a trial's supervisor while it exited after its run met its env-step budget:
    # exit -15, and the sweep ended 1 for a population that had done all it should.
    from rlctl.supervise.sweep_scheduler import trial_ended_well

    assert trial_ended_well(-15, {"status": "finished"}) and trial_ended_well(-15, {"status": "stopped"})
    assert trial_ended_well(0, {}) and trial_ended_well(130, {"status": "running"})
    assert not trial_ended_well(-15, {"status": "running"}) and not trial_ended_well(1, {"status": "failed"})
    assert not trial_ended_well(1, {})


def test_place_nodes_outside_an_allocation_exits_2_before_anything_is_made(tmp_path):
    shipped_job(tmp_path, "ppo", file_name="base.toml", drop=("collectors", "evaluator"),
                extra='\n[cluster]\nscheduler = "slurm"\nlearner_node_collectors = 1\n')
    f = _sweep_file(tmp_path, '"algorithm.lr" = [1e-3, 2e-3]', head='place = "nodes"')
    plan = json.loads(run_cli(["plan", str(f), "--json"]).stdout)
    assert plan["place"] == "nodes" and [t["host"] for t in plan["trials"]] == [None, None]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run([sys.executable, "-m", "rlctl", "sweep", str(f), "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and 'place = "nodes"' in proc.stderr and "not inside a Slurm allocation" in proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_node_slots_put_each_trial_on_the_least_busy_node_with_room():
    from types import SimpleNamespace

    from rlctl.supervise.sweep_scheduler import HostSlots

    slots = HostSlots({"trials_per_host": 1, "place": "nodes"}, ("n1", "n2"))
    assert slots.next_startable(["t000", "t001", "t002"], {}) == "t000" and slots.node_for({}) == "n1"
    running = {"t000": SimpleNamespace(node="n1")}
    assert slots.node_for(running) == "n2"
    running["t001"] = SimpleNamespace(node="n2")
    assert slots.node_for(running) is None and slots.next_startable(["t002"], running) is None
    two = HostSlots({"trials_per_host": 2}, ("n1", "n2"))
    assert two.node_for(running) == "n1"


def _trials(runs: Path) -> tuple[Path, list[dict]]:
    sweep = next(p for p in runs.iterdir() if (p / "sweep.json").is_file())
    return sweep, json.loads((sweep / "sweep.json").read_text())["trials"]


def _state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
def test_a_ppo_sweep_runs_to_its_end_with_one_command_and_compare_ranks_by_time_to_target(tmp_path):
    """2 learning rates x 2 seeds, 2 at once (a smaller version of jobs/sweep-ppo.toml's 4 x 2 for CI): the ones
    that reach the target rank first, by their time to it."""
    _base(tmp_path, stop="train_return = 100.0\nenv_steps = 20000\nwall_s = 120")
    f = _sweep_file(tmp_path, '"algorithm.lr" = [1e-5, 4e-3]', head="seeds = [1, 2]\nmax_concurrent = 2")
    runs = tmp_path / "runs"
    proc = run_cli(["sweep", str(f), "--runs-dir", str(runs)], timeout=400, env={"COLUMNS": "120"})
    sweep, trials = _trials(runs)
    assert re.search(r"\| finished \| 4 trials: 4 finished", proc.stdout), proc.stdout
    states = {t["id"]: _state(sweep / t["id"]) for t in trials}
    assert {s["job"] for s in states.values()} == {"ppo-cartpole"} and len(states) == 4
    # Never more than 2 at once: each trial began after all but one of those before it had ended.
    spans = sorted((s["started_at"], s["ended_at"]) for s in states.values())
    assert all(sum(end > start for _, end in spans[:i]) <= 1 for i, (start, _) in enumerate(spans)), spans
    ranked = json.loads(run_cli(["compare", sweep.name, "--runs-dir", str(runs), "--json"]).stdout)
    order = list(ranked)
    assert [ranked[t]["job"]["algorithm.lr"] for t in order] == [4e-3, 4e-3, 1e-5, 1e-5], ranked
    times = [ranked[t]["time_to_target_s"] for t in order]
    assert times[0] <= times[1] and times[2] is None and times[3] is None, times
    status = run_cli(["status", sweep.name, "--runs-dir", str(runs)], env={"COLUMNS": "120"}).stdout
    assert re.search(r"t00[23] +lr=0\.004 seed=[12] +finished +100%", status), status


@pytest.mark.slow
def test_a_killed_scheduler_leaves_its_trials_stopped_and_resume_continues_them_none_from_zero(tmp_path):
    # A fixed length (what matters is where each goes on), long enough that neither ends by itself before the kill
    # reaches it: at 9000 env steps (5 s here) one could finish first, never "stopped" (a CI run timed out here).
    _base(tmp_path, stop="env_steps = 40000\nwall_s = 120")
    f = _sweep_file(tmp_path, '"algorithm.lr" = [4e-3]', head="seeds = [1, 2, 3]\nmax_concurrent = 2")
    runs = tmp_path / "runs"
    sweep_id = run_cli(["sweep", str(f), "--detach", "--runs-dir", str(runs)]).stdout.strip()
    sweep = runs / sweep_id
    scheduler = wait_for(lambda: json.loads((sweep / "sweep.json").read_text()).get("supervisor_pid"), what="pid")
    begun = ["t000", "t001"]

    def learning(t: str) -> bool:  # an update made: a checkpoint to write on the stop
        metrics = _state(sweep / t).get("metrics") or {}
        return metrics.get("charts/env_steps", 0) >= 1500 and metrics.get("learner/updates", 0) > 0
    wait_for(lambda: all(learning(t) for t in begun), timeout=120, what="both first trials learning")
    supervisors = [_state(sweep / t)["supervisor_pid"] for t in begun]
    os.kill(scheduler, signal.SIGKILL)
    # Each trial's supervisor is told to stop by the kernel: a graceful stop, a last checkpoint.

    def ended() -> dict:
        return {t: (_state(sweep / t).get("status"), _state(sweep / t).get("exit_reason")) for t in begun}
    try:
        wait_for(lambda: all(s == "stopped" for s, _ in ended().values()), timeout=90, what="stopped")
    except pytest.fail.Exception:
        logs = {t: (sweep / t / "logs" / "supervisor.log").read_text()[-2000:] for t in begun}
        pytest.fail(f"the trials did not stop: {ended()}; their supervisors' logs end: {logs}")
    wait_for(lambda: not any(pid_alive(p) for p in supervisors), timeout=30, what="trial supervisors gone")
    assert not (sweep / "t002" / "state.json").exists()  # never begun
    steps = {t: _state(sweep / t)["metrics"]["charts/env_steps"] for t in begun}
    assert all((sweep / t / "checkpoints" / "latest.pt").is_file() for t in begun), {
        t: (sorted(p.name for p in (sweep / t / "checkpoints").iterdir()), _state(sweep / t).get("exit_reason"))
        for t in begun}
    status = run_cli(["status", sweep_id, "--runs-dir", str(runs)], env={"COLUMNS": "120"}).stdout
    assert re.search(r"\| lost \| 3 trials: 2 stopped, 1 pending", status), status

    run_cli(["run", "--resume", sweep_id, "--runs-dir", str(runs)], timeout=400)
    for t in begun:
        state = _state(sweep / t)
        assert state["status"] == "finished" and len(state["segments"]) == 2, state
        assert state["metrics"]["charts/env_steps"] > steps[t]
        resumed = [e for e in events.read(sweep / t / "logs" / "learner-0.log") if e.name == "resumed"]
        assert resumed and resumed[-1].fields["update"] > 0, t  # from its checkpoint, not from zero
    assert _state(sweep / "t002")["status"] == "finished" and len(_state(sweep / "t002")["segments"]) == 1
    assert json.loads((sweep / "sweep.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_stop_of_a_sweep_stops_its_scheduler_and_every_trial_keeping_checkpoints(tmp_path):
    _base(tmp_path, stop="train_return = 475.0\nwall_s = 300")
    f = _sweep_file(tmp_path, '"algorithm.lr" = [4e-3, 2e-3]', head="max_concurrent = 2")
    runs = tmp_path / "runs"
    sweep_id = run_cli(["sweep", str(f), "--detach", "--runs-dir", str(runs)]).stdout.strip()
    sweep = runs / sweep_id
    # Learning, not just started: a learner stopped while it still imports torch has no checkpoint to write yet.
    wait_for(lambda: all((_state(sweep / t).get("metrics") or {}).get("learner/updates", 0) > 0
                         for t in ("t000", "t001")), timeout=120, what="both trials learning")
    scheduler = json.loads((sweep / "sweep.json").read_text())["supervisor_pid"]
    proc = run_cli(["stop", sweep_id, "--runs-dir", str(runs)], timeout=120)
    assert f"{sweep_id} stopped" in proc.stdout
    assert not pid_alive(scheduler)
    for t in ("t000", "t001"):
        assert _state(sweep / t)["status"] == "stopped"
        assert (sweep / t / "checkpoints" / "latest.pt").is_file()


def test_a_trial_supervisor_ends_with_the_process_that_started_it(tmp_path):
    """rlctl.supervise.tethered_run exits at once when its parent is already gone (the kernel's parent-death
    signal covers a parent that dies later): a scheduler killed mid-start leaves no trial behind."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    proc = subprocess.run([sys.executable, "-m", "rlctl.supervise.tethered_run", str(gone.pid), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr


def test_trials_at_once_on_this_machine_share_its_cores_between_their_learners(tmp_path):
    """max_concurrent trials each get cores // max_concurrent learner threads (at least 1) unless their job sets
    learner_threads; trials placed on hosts of their own keep rlctl's choice there."""
    from rlctl.job.sweep_spec import load_sweep
    from rlctl.launch.plan import usable_cpus
    from rlctl.launch.sweep import create_sweep

    _base(tmp_path)
    f = _sweep_file(tmp_path, '"algorithm.lr" = [1e-3, 2e-3]', head="max_concurrent = 2")
    sweep = create_sweep(load_sweep(f), tmp_path / "runs")
    for trial in ("t000", "t001"):
        assert re.search(rf"(?m)^learner_threads = {max(1, usable_cpus() // 2)}$",
                         (sweep.path / trial / "job.toml").read_text())
    f = _sweep_file(tmp_path, '"algorithm.lr" = [1e-3, 2e-3]\n"topology.learner_threads" = [3]',
                    head="max_concurrent = 2")
    sweep = create_sweep(load_sweep(f), tmp_path / "runs")
    assert re.search(r"(?m)^learner_threads = 3$", (sweep.path / "t000" / "job.toml").read_text())
    f = _sweep_file(tmp_path, '"algorithm.lr" = [1e-3, 2e-3]', head="max_concurrent = 1")
    sweep = create_sweep(load_sweep(f), tmp_path / "runs")
    assert re.search(r"(?m)^learner_threads = 0$", (sweep.path / "t000" / "job.toml").read_text())
