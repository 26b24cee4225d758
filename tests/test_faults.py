"""Nothing lost: every fault caused for real (SIGKILL of a learner rank, a replay shard or the supervisor; SIGSTOP
of a collector; a kill inside a checkpoint write; a full disk), then `rlctl run --resume`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import marked_processes, only_run, pid_alive, read_state, run_cli, wait_for
from jobfiles import shipped_job
from rlctl import events

pytestmark = pytest.mark.slow  # end-to-end: real jobs run to their target, faults, or a lab of hosts

CAP_S = 300  # bounds a broken run; the jobs solve in 10-20 s


@pytest.fixture
def mark():
    """A marker every process of the test's runs inherits; whatever still carries it at the end is killed."""
    value = uuid.uuid4().hex
    yield value
    for pid in marked_processes(value):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def apex_job(tmp_path: Path, name: str = "apex.toml", stop: str | None = None, replay: str = "",
             topology: str = "", logging: str = "", **replace: str) -> Path:
    """jobs/apex.toml with checkpoints and snapshots every second, the wall cap raised and `replace`d keys."""
    return shipped_job(tmp_path, "apex", stop=stop, wall_s=CAP_S, file_name=name,
                       add={"replay": f"snapshot_interval_s = 1.0\n{replay}", **({"topology": topology} if topology else {})},
                       extra=f"\n[logging]\ncheckpoint_interval_s = 1.0\n{logging}\n", **replace)


def start_run(args: list[str], mark: str, env: dict | None = None) -> subprocess.Popen:
    """`rlctl ARGS` in the background, as a user's terminal would run it."""
    return subprocess.Popen([sys.executable, "-m", "rlctl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "RLCTL_TEST_MARK": mark, **(env or {})})


def finish(proc: subprocess.Popen, timeout: float = CAP_S + 60) -> tuple[int, str, str]:
    """Wait for a background `rlctl` and return (exit code, stdout, stderr)."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def metric(run_dir: Path, key: str, default=0):
    """A run-level figure from state.json."""
    return read_state(run_dir).get("metrics", {}).get(key, default)


def process_row(run_dir: Path, name: str) -> dict:
    """One process's row of state.json."""
    return next((p for p in read_state(run_dir).get("processes", []) if p["name"] == name), {})


def children(pid: int) -> list[int]:
    """Direct children of a process."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(") ", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def log_text(run_dir: Path, name: str) -> str:
    """The whole log of one process."""
    path = run_dir / "logs" / f"{name}.log"
    return path.read_text() if path.exists() else ""


def resumes(run_dir: Path) -> list[events.Event]:
    """The learner ranks' `resumed` events, oldest first."""
    return [e for e in events.read(run_dir / "logs" / "learner-0.log") if e.name == "resumed"]


def learning_with_a_checkpoint(run_dir: Path) -> None:
    """Wait until the learner has made some updates and written a checkpoint: the moment for a fault, long before the
    job can be done (it once solved after 1,298 updates, before a wait for 1,500 was over)."""
    wait_for(lambda: metric(run_dir, "learner/updates") >= 200 and (run_dir / "checkpoints/latest.pt").exists(),
             CAP_S, what="updates and a checkpoint")


def assert_solved(run_dir: Path) -> dict:
    """The run stopped at its greedy-evaluation target."""
    state = read_state(run_dir)
    assert state["status"] == "finished" and state["stopped_by"]["criterion"] == "eval_return", state["exit_reason"]
    return state


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_killed_learner_rank_restarts_from_its_checkpoint_and_the_job_solves(tmp_path, mark, ranks):
    runs = tmp_path / "runs"
    proc = start_run(["run", str(apex_job(tmp_path, learner_procs=str(ranks))), "--runs-dir", str(runs)], mark)
    run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 30, what="the run directory")
    learning_with_a_checkpoint(run_dir)
    agent = process_row(run_dir, "learner-0")["pid"]
    ranks_pids = sorted(children(agent))
    assert len(ranks_pids) == ranks, ranks_pids
    os.kill(ranks_pids[-1], signal.SIGKILL)  # the last rank: with two, rank 0 must notice through the collective
    code, _, err = finish(proc)
    assert code == 0, err
    state = assert_solved(run_dir)
    resumed = [e for e in resumes(run_dir) if e["path"].endswith("latest.pt") and e["restart"] == 1]
    assert resumed and all(e["update"] > 0 for e in resumed), log_text(run_dir, "learner-0")[-3000:]
    assert process_row(run_dir, "learner-0")["restarts"] == 1
    assert state["metrics"]["learner/updates"] > resumed[0]["update"]


def test_a_killed_torchrun_agent_is_restarted_from_the_checkpoint_and_the_job_solves(tmp_path, mark):
    """Issue 28 (7): SIGKILL of the learner's torchrun agent (not a rank): the supervisor starts the learner again,
    like any role, and it continues from the newest checkpoint."""
    runs = tmp_path / "runs"
    proc = start_run(["run", str(apex_job(tmp_path)), "--runs-dir", str(runs)], mark)
    run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 30, what="the run directory")
    learning_with_a_checkpoint(run_dir)
    agent = process_row(run_dir, "learner-0")["pid"]
    os.kill(agent, signal.SIGKILL)
    code, _, err = finish(proc)
    assert code == 0, err
    state = assert_solved(run_dir)
    assert process_row(run_dir, "learner-0")["restarts"] == 1 and process_row(run_dir, "learner-0")["pid"] != agent
    resumed = [e for e in resumes(run_dir) if e["path"].endswith("latest.pt")]
    assert resumed and resumed[-1]["update"] > 0, log_text(run_dir, "learner-0")[-3000:]
    assert state["metrics"]["learner/updates"] > resumed[-1]["update"]


@pytest.mark.parametrize("target", ["group", "rank"])
def test_a_sigterm_stops_the_learner_at_once_and_the_job_solves(tmp_path, mark, target):
    """SIGTERM to the learner's process group (the supervisor's fallback for ranks that never said hello, Slurm's
    to every process): the rank stops cleanly and it and its agent are gone at once, where the rank waited for the
    shutting-down agent to read its return value until SIGKILLed (21 s of a preemption's stop in a clean-clone
    CI). The rank alone SIGTERMed: its agent, alive, restarts it. Either way the job solves."""
    runs = tmp_path / "runs"
    proc = start_run(["run", str(apex_job(tmp_path)), "--runs-dir", str(runs)], mark)
    run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 30, what="the run directory")
    learning_with_a_checkpoint(run_dir)
    agent = process_row(run_dir, "learner-0")["pid"]
    rank = children(agent)[0]
    os.killpg(agent, signal.SIGTERM) if target == "group" else os.kill(rank, signal.SIGTERM)
    signalled_at = time.time()
    gone = [rank, agent] if target == "group" else [rank]
    wait_for(lambda: not any(pid_alive(pid) for pid in gone), 30, interval=0.02, what="the learner to stop")
    assert time.time() - signalled_at < 3.0, time.time() - signalled_at
    code, _, err = finish(proc)
    assert code == 0, err
    assert_solved(run_dir)
    assert "stopped after" in log_text(run_dir, "learner-0")
    if target == "group":
        assert process_row(run_dir, "learner-0")["restarts"] == 1
    else:  # torchrun restarted the rank; its agent lived on
        assert process_row(run_dir, "learner-0")["pid"] == agent and len(resumes(run_dir)) >= 1


def test_a_frozen_learner_rank_is_killed_once_and_the_job_solves(tmp_path, mark):
    """Issue 28 (7): a SIGSTOPped rank with heartbeat_timeout_s = 5 is killed once; torchrun's restart of it
    (longer than the timeout) is waited for, not taken for a second hang."""
    runs = tmp_path / "runs"
    job = apex_job(tmp_path, logging="heartbeat_timeout_s = 5")
    proc = start_run(["run", str(job), "--runs-dir", str(runs)], mark)
    run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 30, what="the run directory")
    learning_with_a_checkpoint(run_dir)
    agent = process_row(run_dir, "learner-0")["pid"]
    rank = children(agent)[0]
    os.kill(rank, signal.SIGSTOP)
    code, _, err = finish(proc)
    assert code == 0, err
    assert_solved(run_dir)
    assert err.count("learner-0 hung") == 1, err
    assert process_row(run_dir, "learner-0")["pid"] == agent  # torchrun restarted the rank; its agent lived on


def test_a_killed_replay_shard_comes_back_with_its_contents_and_the_job_solves(tmp_path, mark):
    runs = tmp_path / "runs"
    proc = start_run(["run", str(apex_job(tmp_path)), "--runs-dir", str(runs)], mark)
    run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 30, what="the run directory")

    def snapshot_sizes():
        return [e["size"] for e in events.read(run_dir / "logs" / "replay-0.log") if e.name == "snapshot_written"]
    wait_for(lambda: any(n >= 5000 for n in snapshot_sizes()), CAP_S, what="a snapshot of 5000 transitions")
    before = snapshot_sizes()[-1]
    os.killpg(process_row(run_dir, "replay-0")["pid"], signal.SIGKILL)
    loaded = wait_for(lambda: events.first(run_dir / "logs" / "replay-0.log", "snapshot_loaded"),
                      60, what="the restarted shard loading its snapshot")
    assert loaded["size"] >= before
    code, _, err = finish(proc)
    assert code == 0, err
    assert_solved(run_dir)
    assert process_row(run_dir, "replay-0")["restarts"] == 1


def test_a_killed_supervisor_leaves_nothing_running_and_resume_continues_the_run(tmp_path, mark):
    runs = tmp_path / "runs"
    # A target no return reaches (CartPole's is at most 500): the run cannot finish before the kill (confirming
    # rounds run back to back, so any reachable target raced it); the resume brings the real one in, a change of
    # [job.stop] that --job allows.
    killed = apex_job(tmp_path, name="killed.toml", eval_return="501.0")
    proc = start_run(["run", str(killed), "--runs-dir", str(runs)], mark)
    run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 30, what="the run directory")
    wait_for(lambda: metric(run_dir, "eval/return_mean") >= 300, CAP_S, interval=0.02, what="a greedy return of 300")
    proc.kill()
    proc.wait()
    killed_at = time.time()
    steps_at_kill = metric(run_dir, "charts/env_steps")
    version_at_kill = metric(run_dir, "learner/version")
    wait_for(lambda: not marked_processes(mark), 10, interval=0.05, what="every process of the run to stop")
    # Each stops by itself at once (0.2 s here), well inside the 4 s orphan grace that ends it otherwise: a learner
    # rank waiting for torchrun's dying agent to read its return value, or a heartbeat lingering for the dead
    # supervisor, reached the grace and a clean-clone CI's 5 s.
    assert time.time() - killed_at < 3.0, time.time() - killed_at
    status = json.loads(run_cli(["status", run_dir.name, "--runs-dir", str(runs), "--json"]).stdout)
    assert status["status"] == "lost"
    # Each process noticed and stopped by itself.
    assert events.first(run_dir / "logs" / "learner-0.log", "exit", reason=events.EXIT_SUPERVISOR_GONE)

    out = run_cli(["run", "--resume", run_dir.name, "--job", str(apex_job(tmp_path)), "--runs-dir", str(runs)],
                  env={"RLCTL_TEST_MARK": mark},
                  timeout=CAP_S + 60)
    assert f"resuming {run_dir.name} (lost)" in out.stderr
    state = assert_solved(run_dir)
    total = state["metrics"]["charts/env_steps"]
    assert resumes(run_dir)
    assert events.first(run_dir / "logs" / "replay-0.log", "snapshot_loaded")
    # It continued: the first weights evaluated after the resume are the killed learner's (its checkpoint, at most a
    # second older: a version near the one at the kill, where a new learner would start from 0), at env steps counted
    # on from the kill. (Steps to solve are no witness: from a greedy 300 to three rounds at 475 Ape-X took anywhere
    # from a few thousand to more steps than a fresh run, in CI, with the learner's weights carried over.)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    after = [(e.step, e.value) for e in acc.Scalars("eval/version") if e.wall_time > killed_at]
    print(f"killed at {steps_at_kill} env steps (learner version {version_at_kill}), resumed run {total} in all; "
          f"(env steps, version) evaluated after the resume {after[:5]}")
    assert version_at_kill > 100 and after and after[0][1] >= version_at_kill / 2, (version_at_kill, after)
    assert steps_at_kill <= after[0][0] <= total, (steps_at_kill, after, total)
    assert len(state["segments"]) == 2


def test_a_supervisor_killed_during_start_up_leaves_nothing_running(tmp_path, mark):
    """Issue 28 (9): killed while its processes still import torch, the supervisor left them running for 8-12 s
    (each one's watch starts after that import), and a learner could initialise after it was gone."""
    runs = tmp_path / "runs"
    proc = start_run(["run", str(apex_job(tmp_path)), "--runs-dir", str(runs)], mark)
    wait_for(lambda: len(marked_processes(mark)) >= 3, 30, interval=0.01, what="processes starting")
    proc.kill()
    proc.wait()
    killed_at = time.time()
    wait_for(lambda: not marked_processes(mark), 10, interval=0.05, what="every process of the run to end")
    assert time.time() - killed_at < 3.0, time.time() - killed_at


def test_a_kill_inside_a_checkpoint_write_leaves_the_previous_checkpoint_for_resume(tmp_path, mark):
    from rlctl.checkpoint import load_checkpoint

    runs = tmp_path / "runs"
    job = apex_job(tmp_path, stop="env_steps = 400000", topology="learner_max_restarts = 0\n",
                   logging="checkpoint_keep_every = 0")
    proc = start_run(["run", str(job), "--runs-dir", str(runs)], mark,
                     env={"RLCTL_FAULT": "kill-before-rename:latest.pt:3"})  # the learner's 3rd checkpoint write
    code, _, err = finish(proc)
    run_dir = only_run(runs)
    assert code == 1 and read_state(run_dir)["failure"]["process"] == "learner-0", err
    ckpts = run_dir / "checkpoints"
    assert list(ckpts.glob(".latest.pt.*.tmp")), "the kill left the half-done write behind"
    kept = load_checkpoint(ckpts / "latest.pt")["updates"]  # the 2nd write: whole, loadable
    assert kept > 0

    out = run_cli(["run", "--resume", "--runs-dir", str(runs), "--until", f"env_steps={metric(run_dir, 'charts/env_steps') + 20000}"],
                  env={"RLCTL_TEST_MARK": mark}, timeout=CAP_S + 60)
    assert "resuming" in out.stderr
    assert [e["update"] for e in resumes(run_dir)] == [kept], log_text(run_dir, "learner-0")[-3000:]
    assert not list(ckpts.glob(".latest.pt.*.tmp"))
    assert read_state(run_dir)["stopped_by"]["criterion"] == "env_steps"


def test_state_json_on_a_full_disk_fails_the_run_cleanly(tmp_path, mark):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        runs = disk / "runs"
        proc = start_run(["run", str(apex_job(tmp_path, stop="env_steps = 10000000")), "--runs-dir", str(runs)], mark)
        run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 30, what="the run directory")
        wait_for(lambda: metric(run_dir, "learner/updates") > 0, CAP_S, what="learning")
        with open(disk / "filler", "wb") as f:  # take every block that is left
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        code, _, err = finish(proc, timeout=120)
        assert code == 1, err
        assert "No space left on device" in err, err
        wait_for(lambda: not marked_processes(mark), 10, interval=0.1, what="every process of the run to stop")
        (disk / "filler").unlink()
        state = read_state(run_dir)
        assert state["status"] == "failed" and "No space left on device" in state["exit_reason"], state.get("exit_reason")
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_frozen_collector_is_found_hung_and_replaced(tmp_path, mark):
    runs = tmp_path / "runs"
    job = apex_job(tmp_path, stop="env_steps = 10000000", logging="heartbeat_timeout_s = 3.0\nmetrics_interval_s = 0.5")
    proc = start_run(["run", str(job), "--runs-dir", str(runs)], mark)
    run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 30, what="the run directory")
    wait_for(lambda: process_row(run_dir, "collector-0").get("state") == "running" and metric(run_dir, "learner/updates"),
             CAP_S, what="a running collector")
    frozen = process_row(run_dir, "collector-0")["pid"]
    os.kill(frozen, signal.SIGSTOP)
    stopped_at = time.time()
    wait_for(lambda: process_row(run_dir, "collector-0").get("restarts") == 1
             and process_row(run_dir, "collector-0").get("state") == "running", 30, what="a replacement collector")
    replaced_in = time.time() - stopped_at
    row = process_row(run_dir, "collector-0")
    assert row["pid"] != frozen and "hung: no heartbeat" in row["note"]
    assert not os.path.exists(f"/proc/{frozen}") or open(f"/proc/{frozen}/stat").read().split(") ")[1][0] == "Z"
    assert replaced_in < 3.0 + 15, replaced_in  # the timeout, then a restart (fork, env, first heartbeat)
    run_cli(["stop", run_dir.name, "--runs-dir", str(runs)], timeout=60)
    code, _, err = finish(proc, timeout=60)
    assert read_state(run_dir)["status"] == "stopped", err


def test_resuming_a_finished_run_with_a_higher_target_continues_tensorboard_s_step_axis(tmp_path, mark):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = tmp_path / "runs"
    run_cli(["run", str(apex_job(tmp_path, stop="env_steps = 20000")), "--runs-dir", str(runs)],
            env={"RLCTL_TEST_MARK": mark}, timeout=CAP_S)
    run_dir = only_run(runs)
    first = read_state(run_dir)
    assert first["status"] == "finished" and first["metrics"]["charts/env_steps"] >= 20000
    first_updates = first["metrics"]["learner/updates"]

    # What may not change, and what is not a number: refused with exit 2 before anything starts.
    changed = apex_job(tmp_path, name="changed.toml", stop="env_steps = 40000", lr="5e-4")
    refused = run_cli(["run", "--resume", run_dir.name, "--job", str(changed), "--runs-dir", str(runs)], expected_exit=2)
    assert "algorithm.lr" in refused.stderr
    bad = run_cli(["run", "--resume", "--until", "env_steps=lots", "--runs-dir", str(runs)], expected_exit=2)
    assert "not a number" in bad.stderr
    assert read_state(run_dir)["status"] == "finished"

    run_cli(["run", "--resume", "--until", "env_steps=40000", "--runs-dir", str(runs)], env={"RLCTL_TEST_MARK": mark},
            timeout=CAP_S)
    second = read_state(run_dir)
    assert second["status"] == "finished" and second["stopped_by"]["criterion"] == "env_steps"
    assert second["metrics"]["charts/env_steps"] >= 40000
    assert second["metrics"]["learner/updates"] > first_updates
    assert resumes(run_dir)

    files = sorted((run_dir / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 2
    segments = []
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        segments.append([e.step for e in acc.Scalars("charts/env_steps")])
    # One axis: each segment increasing, the second starting past the first's last step, no step written twice.
    for steps in segments:
        assert steps == sorted(steps)
    assert segments[1][0] > segments[0][-1]
    assert len(set(segments[0]) & set(segments[1])) == 0
    assert segments[1][-1] >= 40000
