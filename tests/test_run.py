"""`rlctl run` with real processes: lifecycle, logs, detach/status/logs/stop, restarts, failures, TensorBoard."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import (group_alive, marked_processes, only_run, pid_alive, read_state, run_cli, small_job, start_cli,
                      wait_for)
from rlctl import events


def _all_gone(state: dict) -> bool:
    return all(not group_alive(p["pgid"]) for p in state["processes"] if p.get("pgid"))


def test_run_to_finish_moves_through_states_and_writes_everything(tmp_path):
    # With the rate limit, 8000 env steps need the learner to have sampled about 30000 transitions.
    job = small_job(tmp_path, stop="env_steps = 8000\nwall_s = 240")
    job.write_text(job.read_text().replace("min_size = 200", "min_size = 200\nsamples_per_insert = 4.0")
                   .replace("batch_size = 32", "batch_size = 32\nsend_batch = 64"))
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "rlctl", "run", str(job), "--runs-dir", str(runs)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, alive_when_finished = [], None
    while proc.poll() is None:
        if runs.exists() and any(runs.iterdir()):
            current = read_state(only_run(runs))
            status = current.get("status")
            if status and (not seen or seen[-1] != status):
                seen.append(status)
            if status == "finished" and alive_when_finished is None:
                alive_when_finished = not _all_gone(current)
        time.sleep(0.02)
    out = proc.stdout.read()
    assert proc.returncode == 0, out
    run_dir = only_run(runs)
    state = read_state(run_dir)
    seen.append(state["status"])
    assert seen[0] in ("created", "starting")
    assert "running" in seen and seen[-1] == "finished" and seen[seen.index("finished") - 1] == "stopping", seen
    assert not alive_when_finished, "state.json said finished while processes of the run were still stopping"
    assert state["stopped_by"]["criterion"] == "env_steps" and state["stopped_by"]["value"] >= 8000, state
    assert state["metrics"]["charts/env_steps"] > 0 and state["metrics"]["learner/updates"] > 0
    # The milestones came as events (rlctl.events), each in its own process's log.
    logs = run_dir / "logs"
    assert events.first(logs / "collector-0.log", "first_env_step", process="collector-0")
    assert events.first(logs / "collector-0.log", "first_batch_sent", process="collector-0")
    assert events.first(logs / "learner-0.log", "first_update", process="learner-0", update=1)
    assert not [e for e in events.read(logs / "learner-0.log") if e.name == "resumed"]  # a fresh run
    # Every process has a log with its own output, and the resolved job and plan are there.
    # (A log is its process's alone: its lines do not repeat the process's name, `rlctl logs` prefixes it.)
    own_words = {"replay-0": "capacity", "learner-0": "stopped after", "collector-0": "x CartPole-v1", "evaluator-0": "greedy"}
    for name, words in own_words.items():
        text = (run_dir / "logs" / f"{name}.log").read_text()
        assert words in text and f"{name}:" not in text, name
    # Weights reached the collector through the learner's shared-memory board, which is gone with the run.
    learner = next(p for p in json.loads((run_dir / "plan.json").read_text())["processes"] if p["name"] == "learner-0")
    board = learner["env"]["RLCTL_WEIGHT_BOARD"]
    assert f"weights from shared memory {board}" in (run_dir / "logs" / "collector-0.log").read_text()
    assert state["metrics"]["collector/weight_version_lag"] < state["metrics"]["learner/version"]  # loaded some
    assert not os.path.exists(board)
    assert "[replay]" in (run_dir / "job.toml").read_text()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert {p["role"] for p in plan["processes"]} == {"replay", "learner", "collector", "evaluator"}
    assert (run_dir / "checkpoints" / "latest.pt").is_file()
    assert _all_gone(state)
    assert "finished" in out
    _assert_tensorboard(run_dir / "tb")


def _assert_tensorboard(tb_dir: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("charts/episode_return", "charts/env_steps_per_s", "losses/td_loss", "learner/updates_per_s",
                "learner/q_mean", "replay/size", "replay/insert_per_s", "collector/weight_version_lag",
                "eval/return_mean"):
        assert tag in tags, (tag, sorted(tags))
    assert max(e.value for e in acc.Scalars("replay/size")) > 0
    assert max(e.value for e in acc.Scalars("learner/updates_per_s")) > 0
    assert "hyperparameters" in acc.Tags()["tensors"], acc.Tags()


def test_detach_then_status_logs_follow_and_stop_from_other_invocations(tmp_path):
    job = small_job(tmp_path, name="detached", stop="wall_s = 300")
    runs = tmp_path / "runs"
    env = {"RLCTL_RUNS_DIR": str(runs)}
    res = run_cli(["run", str(job), "--detach"], env=env, timeout=30)
    run_id = res.stdout.strip().splitlines()[0]
    assert run_id.startswith("detached-")
    assert f"rlctl stop {run_id}" in res.stderr
    run_dir = runs / run_id
    wait_for(lambda: read_state(run_dir).get("status") == "running", 60, what="running")
    wait_for(lambda: all(p["state"] == "running" for p in read_state(run_dir)["processes"]), 90,
             what="every process running")
    follower = start_cli(["logs", "--follow", run_id], env=env)
    st = run_cli(["status"], env=env)
    assert run_id in st.stdout and "running" in st.stdout
    st = run_cli(["status", run_id, "--json"], env=env)
    data = json.loads(st.stdout)
    assert {p["name"] for p in data["processes"]} == {"replay-0", "learner-0", "collector-0", "evaluator-0"}
    wait_for(lambda: read_state(run_dir)["metrics"].get("charts/env_steps", 0) > 0, 60, what="env steps")
    res = run_cli(["stop", run_id], env=env, timeout=90)
    assert "stopped" in res.stdout
    state = read_state(run_dir)
    assert state["status"] == "stopped"
    assert not pid_alive(state["supervisor_pid"])
    assert _all_gone(state)
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    assert "collector-0" in out and "learner-0" in out
    # A stopped run keeps its checkpoint, logs and state.
    assert (run_dir / "checkpoints" / "latest.pt").is_file()
    tail = run_cli(["logs", run_id, "--role", "learner", "--tail", "2"], env=env).stdout.splitlines()
    assert len(tail) == 2 and all("learner-0 |" in line for line in tail), tail


@pytest.mark.slow  # three runs at once, each to its end; the quick tier follows one run in the detach test above
def test_logs_follow_prints_every_line_of_a_finished_run_as_logs_does_ending_with_its_end_line(tmp_path):
    # Three short runs at once, each followed from its start: what `logs -f` printed is what `logs` prints after,
    # to the learner's last words and the supervisor's end line; the logs say how the runs went as they went.
    runs = tmp_path / "runs"
    env = {"RLCTL_RUNS_DIR": str(runs), "COLUMNS": "200"}
    followers = {}
    for i in range(3):
        job = small_job(tmp_path, name=f"follow{i}", stop="env_steps = 4000\nwall_s = 90")
        # Replay takes in experience only as fast as the learner samples it (4 samples per transition past
        # min_size), so the 4000 env steps take about 475 updates: the learner logs metrics lines before the stop
        # however late it starts. Without the limit, three runs starting at once on a slow machine once had one
        # run's collectors reach 4000 env steps before its learner's first update.
        job.write_text(job.read_text().replace("min_size = 200", "min_size = 200\nsamples_per_insert = 4.0")
                       .replace("evaluator = true", "evaluator = false")
                       .replace("metrics_interval_s = 0.3", "metrics_interval_s = 0.2\nlog_interval_s = 0.5"))
        run_id = run_cli(["run", str(job), "--detach"], env=env, timeout=60).stdout.strip().splitlines()[0]
        followers[run_id] = start_cli(["logs", "-f", run_id], env=env)
    for run_id, follower in followers.items():
        followed, err = follower.communicate(timeout=120)
        assert follower.returncode == 0, err
        state = read_state(runs / run_id)
        assert state["status"] == "finished", state.get("exit_reason")
        assert followed == run_cli(["logs", run_id], env=env).stdout
        lines = followed.splitlines()
        assert re.search(r"supervisor \| run finished after [\d.]+s: charts/env_steps \d+ >= 4000$", lines[-1]), lines
        assert any(re.search(r"learner-0 \| stopped after \d+ updates", line) for line in lines), lines
        # The process name once a line, and metrics lines between start and end.
        assert not [line for line in lines if re.search(r"(\S+-\d) \| \1:", line)], lines
        collector = [line for line in lines if "collector-0 | metrics env_steps=" in line]
        learner = [line for line in lines if "learner-0 | metrics updates=" in line]
        assert collector and " env_steps/s=" in collector[-1] and " return_mean=" in collector[-1], lines
        assert learner and " td_loss=" in learner[-1] and " samples/s=" in learner[-1], lines


@pytest.mark.slow  # end to end with real processes: the slow tier
def test_killed_collector_and_replay_shard_are_restarted_until_their_restarts_run_out(tmp_path):
    job = small_job(tmp_path, name="faults", stop="wall_s = 300", max_restarts=1)
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "rlctl", "run", str(job), "--runs-dir", str(runs)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_dir = wait_for(lambda: runs.exists() and any(runs.iterdir()) and only_run(runs), 30, what="run dir")

        def row(name):
            return next(p for p in read_state(run_dir).get("processes", []) if p["name"] == name)

        wait_for(lambda: read_state(run_dir).get("processes") and row("collector-0")["state"] == "running", 90,
                 what="collector running")
        first_pid = row("collector-0")["pid"]
        os.kill(first_pid, signal.SIGKILL)
        wait_for(lambda: row("collector-0")["restarts"] == 1 and row("collector-0")["state"] == "running", 60,
                 what="collector restarted")
        assert row("collector-0")["pid"] != first_pid
        assert read_state(run_dir)["status"] == "running"
        # A replay shard comes back too (from its snapshot), once: past max_restarts it fails the run.
        first_pid = row("replay-0")["pid"]
        os.kill(first_pid, signal.SIGKILL)
        wait_for(lambda: row("replay-0")["restarts"] == 1 and row("replay-0")["state"] == "running", 60,
                 what="replay shard restarted")
        assert row("replay-0")["pid"] != first_pid and read_state(run_dir)["status"] == "running"
        os.kill(row("replay-0")["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    state = read_state(run_dir)
    assert state["status"] == "failed"
    assert state["failure"]["process"] == "replay-0"
    assert "replay-0" in out and "exited with code -9" in out
    assert _all_gone(state)
    assert not list(Path("/dev/shm").glob(f"rlctl-{run_dir.name}-*"))


def test_bad_job_file_starts_nothing(tmp_path):
    job = small_job(tmp_path, name="bad", extra="\n[evaluator]\n")
    runs = tmp_path / "runs"
    res = run_cli(["run", str(job), "--runs-dir", str(runs)], expected_exit=2)
    assert "Traceback" not in res.stderr and str(job) in res.stderr
    assert not runs.exists() or not any(runs.iterdir())


BROKEN_ENVS = """
import gymnasium as gym


class Broken(gym.Env):
    def __init__(self, **kwargs):
        raise RuntimeError("the simulator licence is missing")
"""
START_FAILURES = {
    "constructor-raises": ("brokenenvs:Broken",
                           "making the env failed (RuntimeError: the simulator licence is missing)"),
    # Imported by `rlctl run` (so the job passes its check) but not by the processes: an env package installed on
    # the machine the run starts from and missing where its processes run.
    "unimportable-where-it-runs": ("hostonlyenvs:Env", "cannot import module 'hostonlyenvs' (ImportError: not "
                                                       "installed for this process)"),
}
HOST_ONLY_ENVS = """
import os

import gymnasium as gym

if "RLCTL_ROLE" in os.environ:  # a process of the run
    raise ImportError("not installed for this process")


class Env(gym.Env):
    pass
"""


@pytest.mark.parametrize("case", list(START_FAILURES))
def test_a_run_whose_env_cannot_be_made_fails_at_once_naming_the_cause(tmp_path, case):
    """An error every start would repeat fails the run once, without restarts, the cause in the first line of its
    message, printed once (the traceback stays in the process's log)."""
    env_id, why = START_FAILURES[case]
    (tmp_path / "brokenenvs.py").write_text(BROKEN_ENVS)
    (tmp_path / "hostonlyenvs.py").write_text(HOST_ONLY_ENVS)
    job = small_job(tmp_path, name="broken", stop="wall_s = 120", max_restarts=3)
    job.write_text(job.read_text().replace('id = "CartPole-v1"', f'id = "{env_id}"'))
    runs = tmp_path / "runs"
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    res = run_cli(["run", str(job), "--runs-dir", str(runs)], expected_exit=1, env={"PYTHONPATH": path}, timeout=120)
    state = read_state(only_run(runs))
    cause = f"env.id '{env_id}': {why}"
    assert state["status"] == "failed" and state["ended_at"] - state["started_at"] < 10, state
    process, _, said = state["exit_reason"].partition(" cannot start: ")
    assert said == cause and state["failure"]["process"] == process and state["failure"]["cause"] == cause, state
    assert [p["restarts"] for p in state["processes"]] == [0] * len(state["processes"]), state["processes"]
    out = res.stdout + res.stderr
    assert f"run {only_run(runs).name} failed: {process} cannot start: {cause}\n" in res.stdout, out
    assert out.count(why) == 1 and "Traceback" not in out, out
    shown = run_cli(["status", only_run(runs).name, "--runs-dir", str(runs)], env={"COLUMNS": "400"}).stdout
    assert f"exit: {process} cannot start: {cause}" in shown and "Traceback" not in shown, shown
    log = (only_run(runs) / "logs" / f"{process}.log").read_text()
    assert "Traceback" in log and events.first(only_run(runs) / "logs" / f"{process}.log", "exit",
                                                 reason=events.EXIT_STARTUP_FAILED, detail=cause)


@pytest.mark.slow  # end to end with real processes: the slow tier
@pytest.mark.parametrize("when", ["at-its-target", "twice"])
def test_sigterms_do_not_force_a_shutdown(tmp_path, when):
    """SIGTERM while a run shuts down at its target, or several for one stop (PR_SET_PDEATHSIG sends one per thread
    of a dying parent: a sweep's trials got two), stop it gracefully: the learner's last checkpoint written, no
    process SIGKILLed. (A second Ctrl-C still forces: test_a_second_ctrl_c_during_start_up_forces_the_stop....)"""
    stop = "env_steps = 3000\nwall_s = 120" if when == "at-its-target" else "wall_s = 120"
    job = small_job(tmp_path, name="ending", stop=stop)
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "rlctl", "run", str(job), "--runs-dir", str(runs)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log = wait_for(lambda: runs.exists() and any(runs.iterdir()) and only_run(runs) / "logs" / "supervisor.log",
                       60, what="the run directory")
        if when == "at-its-target":
            wait_for(lambda: log.is_file() and "stopping: charts/env_steps" in log.read_text(), 90, interval=0.005,
                     what="the run stopping at its target")
        else:
            wait_for(lambda: read_state(only_run(runs)).get("metrics", {}).get("learner/updates", 0) > 0, 90,
                     what="a first update")
        processes = {p["name"]: p for p in read_state(only_run(runs))["processes"]}
        learner = processes["learner-0"]
        # The learner held still while the signals arrive: a forced stop would SIGKILL it now; a graceful one lets
        # it finish (its last update, its checkpoint) once it goes on.
        os.killpg(learner["pgid"], signal.SIGSTOP)
        alive = pid_alive(learner["pid"])
        if when == "at-its-target":
            wait_for(lambda: not pid_alive(processes["collector-0"]["pid"]), 30, interval=0.01,
                     what="the shutdown under way")
            proc.send_signal(signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(learner["pgid"], signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    state = read_state(only_run(runs))
    assert alive, out  # the signals came while the learner was still running
    if when == "at-its-target":
        assert state["status"] == "finished" and state["stopped_by"]["criterion"] == "env_steps", (state, out)
    else:
        assert state["status"] == "stopped" and state["exit_reason"] == "stopped by SIGTERM", (state, out)
    codes = {p["name"]: p["exit_code"] for p in state["processes"]}
    assert all(code != -signal.SIGKILL for code in codes.values()), codes
    assert (only_run(runs) / "checkpoints" / "latest.pt").is_file()


@pytest.mark.slow  # end to end with real processes: the slow tier
def test_killed_supervisor_shows_lost_and_stop_ends_its_processes(tmp_path):
    job = small_job(tmp_path, name="orphans", stop="wall_s = 300")
    runs = tmp_path / "runs"
    env = {"RLCTL_RUNS_DIR": str(runs)}
    run_id = run_cli(["run", str(job), "--detach"], env=env, timeout=30).stdout.split()[0]
    run_dir = runs / run_id
    wait_for(lambda: read_state(run_dir).get("processes") and
             all(p["state"] == "running" for p in read_state(run_dir)["processes"]), 90, what="processes running")
    state = read_state(run_dir)
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: not pid_alive(state["supervisor_pid"]), 10, what="supervisor gone")
    assert "lost" in run_cli(["status"], env=env).stdout
    assert json.loads(run_cli(["status", run_id, "--json"], env=env).stdout)["status"] == "lost"
    run_cli(["stop", run_id], env=env, timeout=60)
    assert read_state(run_dir)["status"] == "stopped"
    assert _all_gone(state)
    assert not list(Path("/dev/shm").glob(f"rlctl-{run_id}-*"))  # the learner's weight board too


def _thread_cores(pid: int) -> dict[str, set[int]]:
    """Each thread's name -> the CPUs it may run on (threads of one name merged)."""
    out: dict[str, set[int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            out.setdefault(name, set()).update(os.sched_getaffinity(int(tid)))
        except OSError:  # a thread that just ended
            pass
    return out


def _thread_policies(pid: int) -> set[int]:
    """The scheduling policies of a process's threads."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out.add(os.sched_getscheduler(int(tid)))
        except OSError:  # a thread that just ended
            pass
    return out


@pytest.mark.slow  # end to end with real processes: the slow tier
def test_dedicated_learner_cores_keep_the_learner_and_the_other_processes_apart(tmp_path):
    """`topology.learner_cores = "dedicated"`: every thread of the learner rank (ZeroMQ's I/O threads too) on a core
    of its own; the collectors and the evaluator on the cores left. Collectors run every thread under SCHED_BATCH
    (their wake-ups never preempt), the learner and the evaluator under the normal policy."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("dedicating a core needs two")
    job = tmp_path / "pinned.toml"
    job.write_text('[job]\nname = "pinned"\n[job.stop]\nwall_s = 120\n[env]\nid = "CartPole-v1"\n'
                   '[algorithm]\nname = "appo"\n[topology]\ncollectors = 2\nlearner_threads = 1\n'
                   'learner_cores = "dedicated"\n[logging]\nmetrics_interval_s = 0.3\n')
    runs = tmp_path / "runs"
    env = {"RLCTL_RUNS_DIR": str(runs)}
    run_id = run_cli(["run", str(job), "--detach"], env=env, timeout=30).stdout.split()[0]
    run_dir = runs / run_id
    try:
        wait_for(lambda: read_state(run_dir).get("metrics", {}).get("learner/updates", 0) >= 3, 120,
                 what="learner updates")
        rows = {p["name"]: p for p in read_state(run_dir)["processes"]}
        agent = rows["learner-0"]["pid"]  # torchrun's agent: the rank is its child
        (worker,) = map(int, Path(f"/proc/{agent}/task/{agent}/children").read_text().split())
        own, rest = {cpus[0]}, set(cpus[1:])
        threads = _thread_cores(worker)
        assert "ZMQbg/IO/0" in threads and all(c == own for c in threads.values()), threads
        for name in ("collector-0", "collector-1", "evaluator-0"):
            assert all(c == rest for c in _thread_cores(rows[name]["pid"]).values()), name
        for name in ("collector-0", "collector-1"):
            assert _thread_policies(rows[name]["pid"]) == {os.SCHED_BATCH}, name
            assert ", SCHED_BATCH" in (run_dir / "logs" / f"{name}.log").read_text()
        assert _thread_policies(worker) == _thread_policies(rows["evaluator-0"]["pid"]) == {os.SCHED_OTHER}
        log = (run_dir / "logs" / "learner-0.log").read_text()
        assert f"pinned to CPU cores {cpus[0]}" in log, log
    finally:
        run_cli(["stop", run_id], env=env, timeout=60)
    assert read_state(run_dir)["status"] == "stopped"


def _lines_of(stream, into: list) -> threading.Thread:
    """Collect a pipe's lines as they come (a reader thread)."""
    thread = threading.Thread(target=lambda: into.extend(iter(stream.readline, "")), daemon=True)
    thread.start()
    return thread


def _as_in_a_terminal() -> None:
    """SIGINT at its default, as for a command a shell runs in the foreground: a test run started in the background
    of a non-interactive shell inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow  # a detached run watched, left and stopped: 13 s here
def test_watch_shows_a_detached_run_leaves_on_ctrl_c_with_the_run_going_and_ends_with_the_run(tmp_path):
    job = small_job(tmp_path, name="watched", stop="wall_s = 300")
    runs = tmp_path / "runs"
    env = {"RLCTL_RUNS_DIR": str(runs)}
    run_id = run_cli(["run", str(job), "--detach"], env=env, timeout=30).stdout.split()[0]
    run_dir = runs / run_id
    try:
        watcher = subprocess.Popen([sys.executable, "-m", "rlctl", "watch", run_id, "--interval", "0.2"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
                                   preexec_fn=_as_in_a_terminal)
        lines: list[str] = []
        _lines_of(watcher.stdout, lines)
        # The progress the supervisor writes, as the watch shows it: env steps counted up while it runs.
        wait_for(lambda: any(re.search(r"\] running env_steps=[1-9]", line) for line in lines), 120,
                 what="the watch showing env steps")
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=10) == 130
        assert f"{run_id} goes on" in watcher.stderr.read()
        state = read_state(run_dir)
        assert pid_alive(state["supervisor_pid"])
        assert json.loads(run_cli(["status", run_id, "--json"], env=env).stdout)["status"] == "running"
        # A second watch ends by itself when the run does, with what to do next.
        watcher = subprocess.Popen([sys.executable, "-m", "rlctl", "watch", run_id], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
        run_cli(["stop", run_id], env=env, timeout=90)
        out, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 0, err
        assert f"run {run_id} stopped: stopped by SIGTERM" in out and f"rlctl run --resume {run_id}" in out, out
    finally:
        if read_state(run_dir).get("status") not in ("stopped", "finished", "failed"):
            run_cli(["stop", run_id], env=env, timeout=90)


@pytest.mark.slow  # two segments of a run: 20 s here
def test_a_resumed_run_keeps_its_start_and_counts_every_segment_in_elapsed_and_the_wall_s_budget(tmp_path):
    job = small_job(tmp_path, name="segments", stop="wall_s = 300")
    runs = tmp_path / "runs"
    env = {"RLCTL_RUNS_DIR": str(runs)}
    run_id = run_cli(["run", str(job), "--detach"], env=env, timeout=30).stdout.split()[0]
    run_dir = runs / run_id
    wait_for(lambda: read_state(run_dir).get("metrics", {}).get("charts/env_steps", 0) > 0, 120, what="env steps")
    run_cli(["stop", run_id], env=env, timeout=90)
    first = json.loads(run_cli(["status", run_id, "--json"], env=env).stdout)
    assert first["status"] == "stopped" and len(first["segments"]) == 1
    one = first["segments"][0]["ended_at"] - first["segments"][0]["started_at"]
    # A wall-time budget 6 s past what the first segment used: counted over the whole run, the second segment gets 6 s.
    budget = first["elapsed_s"] + 6.0
    res = run_cli(["run", "--resume", run_id, "--until", f"wall_s={budget}"], env=env, timeout=120)
    assert f"resuming {run_id} (stopped)" in res.stderr
    second = json.loads(run_cli(["status", run_id, "--json"], env=env).stdout)
    assert second["status"] == "finished" and second["stopped_by"]["criterion"] == "wall_s", second["exit_reason"]
    assert second["started_at"] == first["started_at"]
    assert second["segments"][0] == first["segments"][0] and len(second["segments"]) == 2
    two = second["segments"][1]["ended_at"] - second["segments"][1]["started_at"]
    assert second["elapsed_s"] >= one + two - 1e-6, (second["elapsed_s"], one, two)
    # The wall time the stop rule saw counts the first segment too: more than the whole second segment lasted
    # (counting this segment alone, it could not pass the segment's own length).
    assert second["stopped_by"]["value"] >= budget and second["stopped_by"]["value"] > two, (second, one, two)
    # Finished, and no new target: refused, saying how to give one.
    refused = run_cli(["run", "--resume", run_id], env=env, expected_exit=2)
    assert f"rlctl run --resume {run_id} --until" in refused.stderr


def test_a_second_ctrl_c_during_start_up_forces_the_stop_and_leaves_no_process(tmp_path):
    # A terminal's Ctrl-C goes to the whole foreground process group: the attached `rlctl run` is given a group of
    # its own and both SIGINTs go to that group, once the run is starting (its processes on their way).
    mark = f"ctrlc-{os.getpid()}-{time.monotonic_ns()}"
    job = small_job(tmp_path, name="ctrlc", stop="wall_s = 120")
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "rlctl", "run", str(job), "--runs-dir", str(runs)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "RLCTL_TEST_MARK": mark})
    try:
        wait_for(lambda: runs.exists() and any(runs.iterdir()) and read_state(only_run(runs)).get("status")
                 == "starting", 60, interval=0.01, what="the run starting")
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.02)  # two quick presses, not one
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert took < 15, took
    assert "Traceback" not in out, out
    wait_for(lambda: not marked_processes(mark), 5, interval=0.05, what="every process of the run to stop")
    run_dir = only_run(runs)
    state = read_state(run_dir)
    assert state["status"] == "stopped" and state["exit_reason"] == "stopped by SIGINT", (state, out)
    assert f"rlctl run --resume {run_dir.name}\n" in out, out  # what to do next: go on with it
