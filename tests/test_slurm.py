"""Jobs inside a real Slurm allocation (tests/slurmlab.py): slurmctld, and one slurmd per network-namespace host.

The root namespace is the login node: `salloc` and `sbatch` run there, and so do `rlctl status` and `rlctl stop`
for a batch job, whose supervisor runs on the allocation's first node. Every process of a job is a job step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl import events
from rlctl.net import wire
from conftest import REPO, cmdline, command_lines, only_run, read_state, run_cli, wait_for
from jobfiles import shipped_job
import slurmlab

CAP_S = 300
QUEUED_S = 120  # an allocation asked for just after the last one ended can wait ~15 s for its nodes
pytestmark = [pytest.mark.slow, pytest.mark.skipif(slurmlab.unavailable() is not None, reason=str(slurmlab.unavailable()))]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Three Slurm nodes for the whole module."""
    yield from slurmlab.module_lab(tmp_path_factory, 3)


@pytest.fixture(autouse=True)
def idle_cluster(lab):
    """Every test starts on idle nodes and leaves them so: a job left queued (say by a salloc killed while it
    waited) is cancelled, and a node left drained or down fails the test that did it, with Slurm's reason."""
    yield
    why = lab.settle()
    if why is not None:
        pytest.fail(f"the Slurm nodes were not idle after the test:\n{why}")


def slurm_job(tmp_path: Path, job: str, name: str, cluster: str = "", **replace: str) -> Path:
    """A shipped job made a Slurm job (its counts from [cluster]), the wall cap raised and `replace`d keys."""
    return shipped_job(tmp_path, job, name=name, wall_s=CAP_S, drop=("collectors", "evaluator", "replay_shards"),
                       drop_sections=("cluster",), **replace,
                       extra=f'\n[cluster]\nscheduler = "slurm"\n{cluster}\n[logging]\ncheckpoint_interval_s = 2.0\n')


def salloc(lab, args: list[str], **kwargs) -> subprocess.Popen:
    """`salloc --no-kill -N3 python -m rlctl ARGS` on the login node, in the background."""
    return subprocess.Popen(["salloc", "--no-kill", "--nodes=3", sys.executable, "-m", "rlctl", *args], env=lab.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True, **kwargs)


def end(proc: subprocess.Popen) -> None:
    """Kill salloc and the supervisor it started (its process group), if still there."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def running(proc: subprocess.Popen, predicate):
    """predicate(), failing at once when the run ended first."""
    def check():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended with {proc.returncode}: {err[-3000:]}")
        return predicate()
    return check


def rlctl_processes(lab) -> dict[str, list[int]]:
    """Node -> pids of rlctl processes there (role processes, torchrun, rlctl.launch.remote), the daemons left out."""
    return {node: [pid for pid in lab.node_pids(node) if b"rlctl" in (cmdline(pid) or b"")] for node in lab.nodes}


def wait_until_no_rlctl_process(lab, timeout: float = 30) -> None:
    """Fail unless every node is free of rlctl processes within `timeout` (Slurm ends a step's leftovers
    asynchronously, after the step's task and srun are gone)."""
    deadline = time.monotonic() + timeout
    while left := {node: pids for node, pids in rlctl_processes(lab).items() if pids}:
        if time.monotonic() > deadline:
            shown = {node: [(cmdline(pid) or b"(ended)")[:200] for pid in pids] for node, pids in left.items()}
            pytest.fail(f"rlctl processes still on nodes after {timeout:.0f}s: {shown}")
        time.sleep(0.2)


def job_keys(run_id: str) -> set[bytes]:
    """Every key (public and secret) the run's processes were given, read from their environments."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RLCTL_RUN_ID={run_id}".encode() not in env:
            continue
        for var in env:
            if var.startswith(b"RLCTL_CURVE_KEYS="):
                keys = wire.CurveKeys.from_env(var.split(b"=", 1)[1].decode())
                found.update(k for k in (keys.server_secret, keys.client_secret, keys.client_public) if k)
    return found


def test_apex_solves_in_a_3_node_allocation_keys_stay_hidden_and_a_downed_node_moves_its_collectors(lab, tmp_path):
    runs = tmp_path / "runs"
    proc = salloc(lab, ["run", str(slurm_job(tmp_path, "apex-slurm", "slurm-apex")), "--runs-dir", str(runs)])
    try:
        run_dir = wait_for(running(proc, lambda: runs.exists() and next(runs.iterdir(), None)), QUEUED_S,
                           what="the run directory")
        wait_for(running(proc, lambda: read_state(run_dir).get("metrics", {}).get("learner/updates", 0) >= 200),
                 CAP_S, what="learner updates")
        state = read_state(run_dir)
        job_id = state["slurm_job_id"]
        hosts = {p["name"]: p["host"] for p in state["processes"]}
        assert hosts["learner-0"] == "h1" and hosts["replay-0"] == "h1" and hosts["evaluator-0"] == "h1"
        assert sorted(h for n, h in hosts.items() if n.startswith("collector")) == ["h2", "h2", "h3", "h3"]
        # Every process is a step of the allocation, on its node.
        steps = lab.slurm("squeue", "-h", "-s", "-j", str(job_id), "-o", "%N").stdout.split()
        assert len(steps) >= 7 and set(steps) == {"h1", "h2", "h3"}, steps
        # The keys: in no command line on this machine (every node's included), nor in what Slurm shows of the job.
        keys = job_keys(run_dir.name)
        assert len(keys) >= 8
        shown = lab.slurm("scontrol", "show", "job", "-d", str(job_id)).stdout
        shown += lab.slurm("scontrol", "show", "step", str(job_id)).stdout
        assert "JobId=" in shown and "Name=rlctl-learner-0" in shown and "Name=rlctl-collector-3" in shown, shown
        for line in command_lines():
            assert b"RLCTL_CURVE_KEYS" not in line and not any(k in line for k in keys), line
        assert not any(k.decode() in shown for k in keys) and "RLCTL_CURVE_KEYS" not in shown
        # A collector node goes down mid-run: reported, its collectors start again on the nodes left, the run goes on.
        assert lab.slurm("scontrol", "update", "nodename=h3", "state=down", "reason=rlctl-test").returncode == 0
        out, err = proc.communicate(timeout=CAP_S + 60)
    finally:
        end(proc)
        lab.slurm("scontrol", "update", "nodename=h3", "state=resume")
    assert proc.returncode == 0, err[-3000:]
    assert "node h3 left Slurm job" in err
    state = read_state(run_dir)
    assert state["status"] == "finished" and state["exit_reason"].startswith("eval/return_mean"), state["exit_reason"]
    moved = [p for p in state["processes"] if p["name"] in ("collector-2", "collector-3")]
    assert all(p["host"] in ("h1", "h2") and "node h3 lost" in (p["note"] or "") for p in moved), moved
    assert next(r for r in state["host_rows"] if r["name"] == "h3")["state"] == "lost"
    status = run_cli(["status", run_dir.name, "--runs-dir", str(runs)], env={"COLUMNS": "200"}).stdout
    assert re.search(r"h3\s+slurm\s+lost", status), status
    assert (run_dir / "checkpoints" / "latest.pt").is_file() and (run_dir / "checkpoints" / "best.pt").is_file(), (
        [(r["name"], r["cleanup"]) for r in state["host_rows"]], err[-3000:])
    wait_until_no_rlctl_process(lab)


def test_ppo_solves_in_a_3_node_allocation(lab, tmp_path):
    runs = tmp_path / "runs"
    job = slurm_job(tmp_path, "ppo", "slurm-ppo", 'collectors_per_node = 1\nevaluator = "none"\n')
    proc = salloc(lab, ["run", str(job), "--runs-dir", str(runs)])
    try:
        out, err = proc.communicate(timeout=CAP_S + 60)
    finally:
        end(proc)
    assert proc.returncode == 0, err[-3000:]
    state = read_state(only_run(runs))
    assert state["status"] == "finished" and state["exit_reason"].startswith("charts/episode_return_mean"), state
    assert {p["name"]: p["host"] for p in state["processes"]} == {
        "learner-0": "h1", "collector-0": "h2", "collector-1": "h3"}
    wait_until_no_rlctl_process(lab)


def _submit(lab, tmp_path, name: str) -> tuple[Path, str, int]:
    """`rlctl run --sbatch` of an Ape-X job that never reaches its target: (runs dir, run id, Slurm job id)."""
    runs = tmp_path / "runs"
    job = slurm_job(tmp_path, "apex-slurm", name, eval_return="501.0")
    out = run_cli(["run", "--sbatch", str(job), "--nodes", "3", "--time", "10:00", "--runs-dir", str(runs)],
                  env=lab.env, cwd=REPO)
    run_id = out.stdout.strip()
    job_id = int(re.search(r"Slurm job (\d+)", out.stderr).group(1))
    script = (runs / run_id / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=3" in script and "#SBATCH --time=10:00" in script and "RLCTL_CURVE_KEYS" not in script
    return runs, run_id, job_id


def test_sbatch_run_shows_in_status_from_the_login_node_and_stop_ends_it(lab, tmp_path):
    runs, run_id, job_id = _submit(lab, tmp_path, "slurm-batch")
    listed = json.loads(run_cli(["status", "--json", "--runs-dir", str(runs)], env=lab.env).stdout)
    assert [r["run_id"] for r in listed] == [run_id] and listed[0]["status"] in ("queued", "created", "running")
    run_dir = runs / run_id
    wait_for(lambda: (st := read_state(run_dir)).get("status") == "running" and st.get("processes")
             and all(p["state"] == "running" for p in st["processes"])
             and st.get("metrics", {}).get("learner/updates", 0) > 0, 120, what="every process running")
    state = json.loads(run_cli(["status", run_id, "--json", "--runs-dir", str(runs)], env=lab.env).stdout)
    assert state["status"] == "running" and state["supervisor_host"] == "h1" and state["slurm_job_id"] == job_id
    table = run_cli(["status", "--runs-dir", str(runs)], env={**lab.env, "COLUMNS": "200"}).stdout
    assert re.search(rf"{run_id}\s.*running", table), table
    logs = run_cli(["logs", run_id, "--role", "learner", "--runs-dir", str(runs)], env=lab.env).stdout
    assert "rlctl.launch.remote: on h1" in logs and f"{events.PREFIX}first_update " in logs, logs
    out = run_cli(["stop", run_id, "--runs-dir", str(runs)], env=lab.env, timeout=120)
    assert f"Slurm job {job_id} ended" in out.stdout, out.stdout + out.stderr
    state = read_state(run_dir)
    assert state["status"] == "stopped" and state["exit_reason"] == "stopped by SIGTERM", state["exit_reason"]
    assert (run_dir / "checkpoints" / "latest.pt").is_file()  # the learner's last checkpoint came home
    assert lab.slurm("squeue", "-h", "-j", str(job_id)).stdout.strip() == ""
    wait_until_no_rlctl_process(lab)


@pytest.mark.parametrize("how", ["sbatch", "salloc"])
def test_scancel_of_the_allocation_leaves_no_process_on_any_node(lab, tmp_path, how):
    proc = None
    if how == "sbatch":
        runs, run_id, job_id = _submit(lab, tmp_path, "slurm-scancel")
        run_dir = runs / run_id
    else:  # the supervisor on the login node outlives the allocation: it notices and stops the run
        runs = tmp_path / "runs"
        proc = salloc(lab, ["run", str(slurm_job(tmp_path, "apex-slurm", "slurm-scancel-salloc", eval_return="501.0")),
                            "--runs-dir", str(runs)])
        run_dir = wait_for(running(proc, lambda: runs.exists() and next(runs.iterdir(), None)), QUEUED_S,
                           what="the run directory")
    try:
        wait_for(lambda: (st := read_state(run_dir)).get("processes")
                 and all(p["state"] == "running" for p in st["processes"]), 120, what="every process running")
        job_id = read_state(run_dir)["slurm_job_id"]
        assert all(rlctl_processes(lab).values())  # something of the run on every node
        assert lab.slurm("scancel", str(job_id)).returncode == 0
        wait_until_no_rlctl_process(lab)
        wait_for(lambda: lab.slurm("squeue", "-h", "-j", str(job_id)).stdout.strip() == "", 30, what="the job gone")
        if proc is not None:
            out, err = proc.communicate(timeout=60)
            state = read_state(run_dir)
            assert state["status"] == "stopped", (state["exit_reason"], err[-2000:])
            assert state["exit_reason"].startswith(f"Slurm job {job_id} ended"), state["exit_reason"]
    finally:
        if proc is not None:
            end(proc)


@pytest.mark.parametrize("how", ["ctrl-c", "supervisor-killed"])
def test_ctrl_c_or_a_dead_supervisor_leaves_no_process_on_any_node(lab, tmp_path, how):
    runs = tmp_path / "runs"
    proc = salloc(lab, ["run", str(slurm_job(tmp_path, "apex-slurm", f"slurm-{how}", eval_return="501.0")),
                        "--runs-dir", str(runs)])
    try:
        run_dir = wait_for(running(proc, lambda: runs.exists() and next(runs.iterdir(), None)), QUEUED_S,
                           what="the run directory")
        wait_for(running(proc, lambda: (st := read_state(run_dir)).get("processes")
                         and all(p["state"] == "running" for p in st["processes"])), 120, what="every process running")
        assert all(rlctl_processes(lab).values())
        supervisor = read_state(run_dir)["supervisor_pid"]
        if how == "ctrl-c":
            # The terminal's Ctrl-C goes to its foreground group: the one salloc gives the command it runs.
            os.killpg(os.getpgid(supervisor), signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err[-3000:]
            state = read_state(run_dir)
            assert state["status"] == "stopped" and state["exit_reason"] == "stopped by SIGINT", state["exit_reason"]
            assert (run_dir / "checkpoints" / "latest.pt").is_file()
        else:
            os.kill(supervisor, signal.SIGKILL)
        # A step's processes end once its srun (the supervisor's child) brings no more word: stdin closed.
        wait_until_no_rlctl_process(lab)
    finally:
        end(proc)


def test_a_node_that_cannot_run_rlctl_fails_the_check_naming_it_and_starts_nothing(lab, tmp_path):
    runs = tmp_path / "runs"
    job = slurm_job(tmp_path, "apex-slurm", "slurm-unfit", 'python = "/nonexistent/python3"\n')
    proc = salloc(lab, ["run", str(job), "--runs-dir", str(runs)])
    try:
        out, err = proc.communicate(timeout=QUEUED_S + 60)
    finally:
        end(proc)
    assert proc.returncode == 1, err
    assert "3 of 3 remote hosts failed the check" in err and "node h2 (Slurm job" in err, err
    assert not runs.exists() or not any(runs.iterdir())


def test_a_sweep_with_place_nodes_runs_one_trial_on_each_node_of_the_allocation(lab, tmp_path):
    """`rlctl sweep` with `place = "nodes"` inside a 3-node allocation: three trials at once, each with every process
    on a node of its own (the base job's learner node and its collector), all reaching their target."""
    runs = tmp_path / "runs"
    shipped_job(tmp_path, "ppo", name="slurm-sweep", stop="env_steps = 3000\nwall_s = 120", file_name="base.toml",
                drop=("collectors", "evaluator"), drop_sections=("cluster",),
                extra='\n[cluster]\nscheduler = "slurm"\nlearner_node_collectors = 1\nevaluator = "none"\n')
    sweep_file = tmp_path / "sweep.toml"
    sweep_file.write_text('[sweep]\nbase = "base.toml"\nseeds = [1, 2, 3]\nmax_concurrent = 3\nplace = "nodes"\n'
                          '[sweep.params]\n"algorithm.lr" = [4e-3]\n')
    proc = salloc(lab, ["sweep", str(sweep_file), "--runs-dir", str(runs)])
    try:
        out, err = proc.communicate(timeout=CAP_S + 60)
    finally:
        end(proc)
    assert proc.returncode == 0, (out[-2000:], err[-3000:])
    assert re.search(r"\| finished \| 3 trials: 3 finished", out), out
    sweep_dir = next(p for p in runs.iterdir() if (p / "sweep.json").is_file())
    hosts, spans = [], []
    for trial in ("t000", "t001", "t002"):
        state = read_state(sweep_dir / trial)
        assert state["status"] == "finished", state.get("exit_reason")
        on = {p["host"] for p in state["processes"]}
        assert len(on) == 1 and {p["role"] for p in state["processes"]} == {"learner", "collector"}, state["processes"]
        hosts += on
        spans.append((state["started_at"], state["ended_at"]))
    assert sorted(hosts) == ["h1", "h2", "h3"], hosts
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans  # all three ran at once
    wait_until_no_rlctl_process(lab)
