"""Nobody else in: a local run's files are private and its sockets listen on loopback only."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import marked_processes, read_state, small_job, wait_for


def _listening(pids: set[int]) -> list[str]:
    """`address:port` of every listening TCP socket held by one of `pids` (from ss)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            found.append(line.split()[3])
    return found


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_local_run_is_private_and_listens_on_loopback_only(tmp_path):
    job = small_job(tmp_path, name="private", stop="wall_s = 60")
    runs = tmp_path / "runs"
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "rlctl", "run", str(job), "--runs-dir", str(runs)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "RLCTL_TEST_MARK": mark})
    try:
        run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 30, what="the run directory")
        wait_for(lambda: read_state(run_dir).get("processes")
                 and all(p["state"] == "running" for p in read_state(run_dir)["processes"])
                 and (run_dir / "checkpoints" / "latest.pt").exists(), 90, what="every process running")
        listening = _listening(set(marked_processes(mark)) | {proc.pid})
        assert listening, "the run binds sockets"
        assert all(addr.startswith("127.0.0.1:") for addr in listening), listening  # torchrun's store too
        for path in [run_dir, *run_dir.rglob("*")]:
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
        boards = [p for p in os.listdir("/dev/shm") if p.startswith(f"rlctl-{run_dir.name}-")]
        assert boards and all(stat.S_IMODE(os.stat(f"/dev/shm/{b}").st_mode) == 0o600 for b in boards)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


TWO_RANK_JOB = """
[job]
name = "loopback"
[job.stop]
wall_s = 120
[env]
id = "CartPole-v1"
envs_per_collector = 4
[algorithm]
name = "ppo"
rollout_len = 32
[topology]
collectors = 2
learner_procs = 2
[logging]
checkpoint_interval_s = 1.0
"""
# Run inside a network, UTS and mount namespace of its own where the host name resolves to 10.99.0.1 on a veth:
# the job runs, and what its processes listen on once every process runs is printed as JSON.
IN_NAMESPACE = """
import json, os, subprocess, sys, uuid
sys.path.insert(0, sys.argv[1])
from conftest import marked_processes, read_state, wait_for
from test_security import _listening
job, runs = sys.argv[2], sys.argv[3]
mark = uuid.uuid4().hex
proc = subprocess.Popen([sys.executable, "-m", "rlctl", "run", job, "--runs-dir", runs], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, env={**os.environ, "RLCTL_TEST_MARK": mark})
try:
    run_dir = wait_for(lambda: os.path.isdir(runs) and next(iter(os.scandir(runs)), None), 30, what="run dir").path
    from pathlib import Path
    run_dir = Path(run_dir)
    wait_for(lambda: read_state(run_dir).get("processes")
             and all(p["state"] == "running" for p in read_state(run_dir)["processes"])
             and (run_dir / "checkpoints" / "latest.pt").exists(), 90, what="every process running")
    print(json.dumps(_listening(set(marked_processes(mark)) | {proc.pid})))
finally:
    proc.terminate()
    proc.wait(timeout=60)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(b) for b in ("ss", "ip", "unshare")),
                    reason="needs root, iproute2 and util-linux (namespaces)")
@pytest.mark.slow  # end to end with real processes: the slow tier
def test_an_all_local_job_listens_on_loopback_even_where_the_host_name_does_not(tmp_path):
    """Issue 28 (8): with the host name resolving to a routable address, gloo's listeners of a two-rank learner
    stay on loopback like every other socket of an all-local job."""
    job = tmp_path / "loopback.toml"
    job.write_text(TWO_RANK_JOB)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.99.0.1 node-a\n")
    setup = ("ip link set lo up && ip link add v0 type veth peer name v1 && ip addr add 10.99.0.1/24 dev v0 && "
             "ip link set v0 up && ip link set v1 up && hostname node-a && mount --bind \"$1\" /etc/hosts && "
             "shift && exec \"$@\"")
    tests = str(Path(__file__).resolve().parent)
    proc = subprocess.run(["unshare", "--net", "--uts", "--mount", "sh", "-c", setup, "sh", str(hosts), sys.executable,
                           "-c", IN_NAMESPACE, tests, str(job), str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    listening = json.loads(proc.stdout.splitlines()[-1])
    # The supervisor's control socket, the store, two gloo listeners, weights and two rollout ports at least.
    assert len(listening) >= 7, listening
    assert all(addr.startswith("127.") for addr in listening), listening


@pytest.mark.parametrize("recorded", ["other start times", "no start times"])
def test_stop_never_signals_a_pid_that_another_process_took_over(tmp_path, recorded):
    """state.json names pids whose processes are gone and whose numbers now belong to others (simulated: live
    processes with other start times): `status` says lost, `stop` signals none of them. Nor does it signal pids of a
    planted state.json that records no start times (issue 28, item 9): it cannot tell they are the run's."""
    import json

    from conftest import run_cli
    from rlctl.liveness import process_start_time

    others = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2)]
    try:
        run_dir = tmp_path / "runs" / "reused-20260101-000000"
        run_dir.mkdir(parents=True)
        starts = [process_start_time(p.pid) + 1 if recorded == "other start times" else None for p in others]
        (run_dir / "state.json").write_text(json.dumps({
            "run_id": run_dir.name, "status": "running", "supervisor_pid": others[0].pid,
            "supervisor_start": starts[0],
            "processes": [{"name": "collector-0", "role": "collector", "pid": others[1].pid, "pgid": others[1].pid,
                           "start_time": starts[1], "state": "running"}]}))
        env = {"RLCTL_RUNS_DIR": str(tmp_path / "runs")}
        status = json.loads(run_cli(["status", run_dir.name, "--json"], env=env).stdout)
        assert status["status"] == "lost"
        run_cli(["stop", run_dir.name], env=env, timeout=60)
        assert all(p.poll() is None for p in others), "a process that is not the run's was signalled"
    finally:
        for p in others:
            p.kill()
            p.wait()


@pytest.mark.slow  # end to end with real processes: the slow tier
def test_a_host_secret_appears_in_no_command_line_file_or_checkpoint(tmp_path):
    """A token in hosts[].env reaches the processes' environment, and nothing else: no /proc/*/cmdline, plan.json,
    job.toml, `rlctl plan`, TensorBoard event file or checkpoint holds it."""
    import json

    from conftest import run_cli

    sentinel = "s3cr3t-" + uuid.uuid4().hex
    job = tmp_path / "secret.toml"
    job.write_text(f"""
[job]
name = "secret"
[job.stop]
env_steps = 6000
wall_s = 120
[env]
id = "CartPole-v1"
envs_per_collector = 4
[algorithm]
name = "apex"
batch_size = 32
[replay]
capacity = 5000
min_size = 200
samples_per_insert = 4.0  # collectors wait for the learner: the run cannot end before it trains (and checkpoints)
[logging]
checkpoint_interval_s = 0.5

[[hosts]]
name = "here"
address = "localhost"
learner = true
collectors = 1
replay_shards = 1
evaluator = true
env = {{ API_TOKEN = "{sentinel}" }}
""")
    runs = tmp_path / "runs"
    assert sentinel not in run_cli(["plan", str(job), "--json", "--runs-dir", str(runs)]).stdout
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "rlctl", "run", str(job), "--runs-dir", str(runs)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "RLCTL_TEST_MARK": mark})
    seen_in_env = False
    try:
        run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 30, what="the run directory")
        while proc.poll() is None:
            for pid in marked_processes(mark):
                try:
                    assert sentinel.encode() not in open(f"/proc/{pid}/cmdline", "rb").read()
                    seen_in_env |= f"API_TOKEN={sentinel}".encode() in open(f"/proc/{pid}/environ", "rb").read()
                except OSError:
                    pass
            time.sleep(0.2)
        out = proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert seen_in_env, "the processes get the value in their environment"
    assert read_state(run_dir)["status"] == "finished"
    files = [p for p in run_dir.rglob("*") if p.is_file() and p.name != "secrets.json"]
    assert any(p.suffix == ".pt" for p in files) and any("tfevents" in p.name for p in files)
    for path in files:
        assert sentinel.encode() not in path.read_bytes(), path
    assert json.loads((run_dir / "secrets.json").read_text()) == {"here": {"API_TOKEN": sentinel}}
    assert stat.S_IMODE((run_dir / "secrets.json").stat().st_mode) == 0o600


def test_each_process_holds_only_the_keys_it_needs(tmp_path):
    """A client key pair per process; the server secret only where a process binds (learner, replay shards)."""
    from rlctl.net import wire
    from rlctl.launch.plan import make_plan
    from rlctl.rundir import RunDir
    from rlctl.job.load import load_job
    from rlctl.supervise.loop import Supervisor

    spec = load_job(small_job(tmp_path, name="keys", collectors=2))
    plan = make_plan(spec, "keys-1", str(tmp_path / "run"), 30000)
    sup = Supervisor(spec, plan, RunDir(tmp_path / "run"), wire.CurveKeys.generate())
    keys = {name: wire.CurveKeys.from_env(k.to_env()) for name, k in sup.process_keys.items()}
    assert {name for name, k in keys.items() if k.server_secret} == {"learner-0", "replay-0"}
    assert len({k.client_secret for k in keys.values()}) == len(keys)  # no two processes share a client key
    for name in ("collector-0", "collector-1", "evaluator-0"):
        assert keys[name].allowed == ()
        with pytest.raises(RuntimeError):
            wire.SecureContext(keys[name]).server(__import__("zmq").PULL, "tcp://127.0.0.1:0")
    assert set(keys["replay-0"].allowed) == {k.client_public for k in keys.values()} | {sup.keys.client_public}


def test_the_remote_private_folder_is_made_0700_and_nothing_else_is_taken_for_it(tmp_path):
    """Remote sessions forward the control socket into the run's private folder, made by the preflight check."""
    from rlctl.launch.hosts import control_socket, private_dir
    from rlctl.launch.remote import make_private_dir

    fresh = tmp_path / "fresh"
    assert make_private_dir(str(fresh)) is None and stat.S_IMODE(fresh.stat().st_mode) == 0o700
    assert make_private_dir(str(fresh)) is None  # a second check of the same run
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    os.chmod(wide, 0o755)
    planted = tmp_path / "planted"
    planted.symlink_to(fresh)
    assert "not a private folder" in make_private_dir(str(wide))
    assert "not a private folder" in make_private_dir(str(planted))
    assert control_socket("run", "collector-0", "ab12").startswith(private_dir("ab12") + "/")
