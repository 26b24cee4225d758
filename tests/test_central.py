"""Central (SEED RL style) inference end to end, with the shipped SEED jobs: real supervisor, inference server,
collectors, learner and sockets. (Over SSH hosts: test_ssh.py.)"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from conftest import only_run, read_state, run_cli, wait_for
from jobfiles import shipped_job
from rlctl import events

pytestmark = pytest.mark.slow  # end-to-end: real jobs run to their target, faults, or a lab of hosts

CAP_S = 300


def _job(tmp_path: Path, name: str, **replace: str) -> Path:
    """A shipped job with `key = value` lines replaced (the wall-clock cap raised to CAP_S)."""
    return shipped_job(tmp_path, name, wall_s=CAP_S, **replace)


def _start(tmp_path: Path, job: Path) -> tuple[Path, Path]:
    runs = tmp_path / "runs"
    run_cli(["run", str(job), "--detach", "--runs-dir", str(runs)], timeout=60)
    return runs, only_run(runs)


def _running(run_dir: Path) -> dict:
    """The state once every process has said hello and collectors have stepped (failing at once, with what the run
    says, if it ended instead)."""
    deadline = time.time() + 120
    while time.time() < deadline:
        st = read_state(run_dir)
        procs = st.get("processes") or []
        if st.get("status") in ("finished", "failed", "stopped"):
            break
        if procs and all(p["state"] == "running" for p in procs) and st["metrics"].get("charts/env_steps", 0) > 0:
            return st
        time.sleep(0.1)
    logs = {p.name: p.read_text()[-1500:] for p in sorted((run_dir / "logs").glob("*.log"))}
    raise AssertionError(f"not all running with env steps: status {st.get('status')}, {st.get('exit_reason')}, "
                         f"{[(p['name'], p['state'], p.get('note')) for p in st.get('processes') or []]}, "
                         f"metrics {st.get('metrics')}, logs {logs}")


def _ended(run_dir: Path) -> dict:
    return wait_for(lambda: (st := read_state(run_dir)).get("status") in ("finished", "failed", "stopped") and st,
                    CAP_S + 60, interval=0.5, what="the run to end")


def _pid(state: dict, name: str) -> int:
    return next(p["pid"] for p in state["processes"] if p["name"] == name)


def test_seed_impala_solves_with_batched_requests_and_collectors_that_load_no_model(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs, run_dir = _start(tmp_path, _job(tmp_path, "seed-impala", collectors="3"))
    state = _running(run_dir)
    plan = json.loads((run_dir / "plan.json").read_text())
    collectors = [p for p in plan["processes"] if p["role"] == "collector"]
    assert [p["name"] for p in plan["processes"] if p["role"] == "inference"] == ["inference-0"]
    assert all(p["argv"][-1] == "rlctl.roles.central_collector" and "RLCTL_WEIGHT_BOARD" not in p["env"]
               for p in collectors)
    # In the processes themselves: no collector has torch's library mapped (so no model can exist there); the
    # inference server, which runs the policy, has.
    for p in collectors:
        maps = Path(f"/proc/{_pid(state, p['name'])}/maps").read_text()
        assert "libtorch" not in maps, p["name"]
    assert "libtorch" in Path(f"/proc/{_pid(state, 'inference-0')}/maps").read_text()
    state = _ended(run_dir)
    assert state["status"] == "finished", state.get("exit_reason")
    assert state["stopped_by"]["criterion"] == "train_return", state["exit_reason"]
    assert state["stopped_by"]["value"] >= state["stopped_by"]["threshold"]
    m = state["metrics"]
    assert m["collector/torch_loaded"] == 0  # each collector's own look at sys.modules, every heartbeat
    assert m["net/dropped"] == 0 and m["collector/stale_answers"] == 0
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"inference/batch_size_mean", "inference/latency_ms_p50", "inference/latency_ms_p99",
            "inference/requests_per_s"} <= tags, tags
    # A batch really combines several collectors' requests: the mean over forwards exceeds one request.
    batches = [e.value for e in acc.Scalars("inference/batch_size_mean") if e.value > 0]
    assert max(batches) > 1.5, batches
    assert max(e.value for e in acc.Scalars("inference/requests_per_s")) > 100
    p50 = [e.value for e in acc.Scalars("inference/latency_ms_p50") if e.value > 0]
    p99 = [e.value for e in acc.Scalars("inference/latency_ms_p99") if e.value > 0]
    assert p50 and p99 and max(p50) <= max(p99)
    table = run_cli(["status", run_dir.name, "--runs-dir", str(runs)]).stdout
    assert re.search(r"inference-0\s+inference\s+0\s+localhost", table), table
    assert "inference " in table and "req/s" in table


def test_collector_killed_mid_request_gets_a_new_session_and_answers_stay_exactly_once_in_order(tmp_path):
    """The server is frozen while collector-0's request is in flight, the collector is SIGKILLed, the server thawed:
    it answers the dead request into nothing, the restarted collector starts a new session and every answer it
    gets is the one it waits for (no stale or malformed answer is dropped, no out-of-order request accepted)."""
    job = _job(tmp_path, "seed-impala", train_return="501.0")  # unreachable: the run ends on env_steps below
    job.write_text(job.read_text().replace("[job.stop]\n", "[job.stop]\nenv_steps = 120000\n"))
    runs, run_dir = _start(tmp_path, job)
    state = _running(run_dir)
    server, victim = _pid(state, "inference-0"), _pid(state, "collector-0")
    os.kill(server, signal.SIGSTOP)
    try:
        time.sleep(0.5)  # collector-0's request (sent within a millisecond of its last answer) waits unanswered
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.3)
    finally:
        os.kill(server, signal.SIGCONT)
    state = _ended(run_dir)
    assert state["status"] == "finished", state.get("exit_reason")
    assert state["stopped_by"]["criterion"] == "env_steps", state["exit_reason"]
    rows = {p["name"]: p for p in state["processes"]}
    assert rows["collector-0"]["restarts"] == 1 and rows["inference-0"]["restarts"] == 0
    log = (run_dir / "logs" / "inference-0.log").read_text()
    assert re.search(r"collector-0 started a new session at request 0 \(the last one ended at request \d+\)", log), log
    # The restarted collector stepped again with answers of its own session.
    stepped = [e for e in events.read(run_dir / "logs" / "collector-0.log") if e.name == "first_env_step"]
    assert [e["process"] for e in stepped] == ["collector-0"] * 2, stepped
    m = state["metrics"]
    assert m["net/dropped"] == 0 and m["collector/stale_answers"] == 0, m
    assert m["collector/torch_loaded"] == 0
