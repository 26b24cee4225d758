"""A run read truthfully (lost processes, times over resumed segments, `status RUN --json`), the next-step hints,
refused resumes and run housekeeping (`rlctl rm`, `rlctl prune`): real run directories and the real CLI, no jobs
run."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import run_cli, small_job
from rlctl import liveness, run_reading
from rlctl.rundir import RunDir
from rlctl.views.next_steps import next_steps

OWN_START = liveness.process_start_time(os.getpid())  # with the pid: a supervisor alive as recorded
T0 = 1_764_453_671.0


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def make_run(root: Path, job: str = "tiny", live: bool = False, **state) -> RunDir:
    """A run directory whose supervisor is this test (live) or a process that has ended."""
    run = RunDir.create(root, job)
    base = {"run_id": run.run_id, "job": job, "algorithm": "apex", "status": "running", "started_at": T0,
            "supervisor_pid": os.getpid() if live else dead_pid(), "supervisor_start": OWN_START if live else None}
    run.write_state({**base, **state})
    return run


def status_json(root: Path, run: RunDir) -> dict:
    return json.loads(run_cli(["status", run.run_id, "--json", "--runs-dir", str(root)]).stdout)


def test_a_lost_run_shows_its_unsettled_processes_lost_and_offers_resume(tmp_path):
    procs = [{"name": "collector-0", "role": "collector", "rank": 0, "host": "localhost", "state": "running"},
             {"name": "learner-0", "role": "learner", "rank": 0, "host": "localhost", "state": "restarting"},
             {"name": "replay-0", "role": "replay", "rank": 0, "host": "localhost", "state": "stopped"}]
    run = make_run(tmp_path, processes=procs, updated_at=T0 + 42.0)
    data = status_json(tmp_path, run)
    assert data["status"] == "lost"
    assert {p["name"]: p["state"] for p in data["processes"]} == {
        "collector-0": "lost", "learner-0": "lost", "replay-0": "stopped"}
    assert data["elapsed_s"] == 42.0  # until its last sign of life
    table = run_cli(["status", run.run_id, "--runs-dir", str(tmp_path)], env={"COLUMNS": "200"}).stdout
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.split()[:1] in
            (["collector-0"], ["learner-0"], ["replay-0"])}
    assert "lost" in rows["collector-0"] and "running" not in rows["collector-0"], table
    assert "lost" in rows["learner-0"] and "stopped" in rows["replay-0"], table
    assert f"rlctl run --resume {run.run_id}" in table
    # The file itself is left as the supervisor wrote it: "lost" is how it is read.
    assert run.read_state()["processes"][0]["state"] == "running"


def test_next_steps_offer_resume_after_ctrl_c_a_lost_run_or_a_failure_with_a_checkpoint(tmp_path):
    run = RunDir.create(tmp_path, "job")
    resume = f"rlctl run --resume {run.run_id}"
    assert resume in next_steps(run, "stopped")  # Ctrl-C, or `rlctl stop`
    assert resume in next_steps(run, "lost")
    assert resume not in next_steps(run, "failed")  # nothing to continue from
    (run.checkpoints_dir / "latest.pt").write_bytes(b"x")
    assert resume in next_steps(run, "failed")
    assert any("--until" in line for line in next_steps(run, "finished"))
    assert resume not in next_steps(run, "finished")
    assert next_steps(run, "running")[0] == f"rlctl watch {run.run_id}"


def test_elapsed_adds_up_every_segment_and_started_is_the_first_one():
    segments = [{"started_at": T0, "ended_at": T0 + 10.0}, {"started_at": T0 + 100.0, "ended_at": T0 + 105.5}]
    finished = {"status": "finished", "started_at": T0, "segments": segments}
    assert run_reading.elapsed_s(finished) == 15.5 and run_reading.first_started(finished) == T0
    running = {"status": "running", "supervisor_pid": os.getpid(), "supervisor_start": OWN_START,
               "started_at": T0, "segments": [segments[0], {"started_at": T0 + 100.0, "ended_at": None}]}
    assert run_reading.elapsed_s(running, now=T0 + 103.0) == 13.0
    lost = {**running, "supervisor_start": None, "updated_at": T0 + 101.0}
    assert run_reading.elapsed_s(lost, now=T0 + 999.0) == 11.0
    assert run_reading.closed_segments(lost)[-1] == {"started_at": T0 + 100.0, "ended_at": T0 + 101.0}
    # `rlctl stop` of the lost run, a day later, ends its orphans: the segment still ended at its last sign of life.
    stopped = {**lost, "status": "stopped", "ended_at": T0 + 86400.0}
    assert run_reading.elapsed_s(stopped) == 11.0
    assert run_reading.closed_segments(stopped)[-1]["ended_at"] == T0 + 101.0
    assert run_reading.elapsed_s({"status": "stopped", "started_at": T0, "ended_at": T0 + 3.0}) == 3.0  # no list


def test_status_json_of_one_run_has_the_list_keys_then_its_details(tmp_path):
    segments = [{"started_at": T0, "ended_at": T0 + 10.0}, {"started_at": T0 + 100.0, "ended_at": T0 + 104.0}]
    run = make_run(tmp_path, status="finished", started_at=T0, ended_at=T0 + 104.0, segments=segments,
                   exit_reason="charts/env_steps 20000 >= 20000", hosts=["localhost"],
                   stopped_by={"criterion": "env_steps", "value": 20000, "threshold": 20000},
                   metrics={"charts/env_steps": 20000, "charts/episode_return_mean": 120.5},
                   processes=[{"name": "learner-0", "role": "learner", "rank": 0, "host": "localhost", "pid": 7,
                               "pgid": 7, "state": "stopped", "restarts": 0}])
    data = status_json(tmp_path, run)
    (row,) = json.loads(run_cli(["status", "--json", "--runs-dir", str(tmp_path)]).stdout)
    assert {k: data[k] for k in row} == row  # the list's keys, the same values
    assert row["started_at"] == T0 and row["elapsed_s"] == 14.0
    assert set(data) == set(row) | {"segments", "processes", "ended_at", "updated_at", "stopped_by", "failure",
                                    "stop", "metrics", "host_rows", "supervisor_pid", "supervisor_host",
                                    "slurm_job_id"}
    assert data["segments"] == segments and data["stopped_by"]["criterion"] == "env_steps"
    assert data["processes"][0]["state"] == "stopped" and "pgid" not in data["processes"][0]


def _finished_run(tmp_path: Path, stop: str, env_steps: int, seconds: float) -> RunDir:
    """A finished run directory of a real job file (no processes: only what `--resume` reads)."""
    run = make_run(tmp_path / "runs", status="finished", ended_at=T0 + seconds, exit_reason="done",
                   metrics={"charts/env_steps": env_steps},
                   segments=[{"started_at": T0, "ended_at": T0 + seconds}])
    run.write_job(small_job(tmp_path, stop=stop).read_text())
    return run


def test_resuming_a_finished_run_without_a_new_target_is_refused_with_the_hint(tmp_path):
    run = _finished_run(tmp_path, "env_steps = 20000\nwall_s = 60", 20000, 30.0)
    runs = str(tmp_path / "runs")
    out = run_cli(["run", "--resume", run.run_id, "--runs-dir", runs], expected_exit=2)
    assert "finished" in out.stderr and f"rlctl run --resume {run.run_id} --until env_steps=N" in out.stderr
    # A new target that is no new target: the run has it already.
    out = run_cli(["run", "--resume", run.run_id, "--until", "env_steps=10000", "--runs-dir", runs], expected_exit=2)
    assert "already reached its env_steps target (20,000 of 10,000" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and run.read_state()["status"] == "finished"


def test_resuming_a_run_whose_wall_time_is_spent_over_its_segments_is_refused(tmp_path):
    # 30 s + 35 s of a 60 s budget: the wall_s budget counts the whole run, so another segment would stop at once.
    run = _finished_run(tmp_path, "wall_s = 60", 500, 30.0)
    run.write_state({**run.read_state(), "status": "stopped", "segments": [
        {"started_at": T0, "ended_at": T0 + 30.0}, {"started_at": T0 + 500.0, "ended_at": T0 + 535.0}]})
    out = run_cli(["run", "--resume", run.run_id, "--until", "env_steps=99999", "--runs-dir", str(tmp_path / "runs")],
                  expected_exit=2)
    assert "already reached its wall_s target (65s of 60s" in out.stderr and "--until wall_s=N" in out.stderr


def test_rm_refuses_a_live_run_and_removes_nothing_then_removes_runs_that_are_over(tmp_path):
    live = make_run(tmp_path, live=True)
    done = make_run(tmp_path, status="finished")
    lost = make_run(tmp_path)  # its supervisor is gone, and it had no processes left
    out = run_cli(["rm", done.run_id, live.run_id, "--runs-dir", str(tmp_path)], expected_exit=2)
    assert f"{live.run_id} is running; stop it first: rlctl stop {live.run_id}" in out.stderr
    assert "nothing was removed" in out.stderr and done.path.is_dir() and live.path.is_dir()
    out = run_cli(["rm", done.run_id, lost.run_id, "--runs-dir", str(tmp_path)])
    assert out.stdout.split() == ["removed", done.run_id, "removed", lost.run_id]
    assert not done.path.exists() and not lost.path.exists() and live.path.is_dir()


def test_rm_refuses_a_lost_run_whose_processes_still_live(tmp_path):
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run = make_run(tmp_path, processes=[{"name": "collector-0", "pgid": child.pid, "state": "running"}])
        out = run_cli(["rm", run.run_id, "--runs-dir", str(tmp_path)], expected_exit=2)
        assert "processes of" in out.stderr and "collector-0" in out.stderr and run.path.is_dir()
    finally:
        child.kill()
        child.wait()


def test_prune_removes_old_runs_keeps_each_job_s_best_and_never_a_live_one(tmp_path):
    old = time.time() - 10 * 86400

    def run(job, ret, **state):
        return make_run(tmp_path, job, **{"status": "finished", "ended_at": old,
                                          "metrics": {"eval/return_mean": ret} if ret is not None else {}, **state})

    best_a, worse_a, none_a = run("a", 500.0), run("a", 120.0), run("a", None)
    best_b = run("b", 30.0)
    recent = run("a", 10.0, ended_at=time.time() - 3600)
    live = make_run(tmp_path, "a", live=True, updated_at=old)
    root = str(tmp_path)
    bad = run_cli(["prune", "--older-than", "a week", "--runs-dir", root], expected_exit=2)
    assert "--older-than" in bad.stderr and "7d" in bad.stderr
    dry = run_cli(["prune", "--older-than", "7d", "--keep-best", "--dry-run", "--runs-dir", root]).stdout
    assert sorted(dry.split()[2::3]) == sorted([worse_a.run_id, none_a.run_id]), dry
    assert worse_a.path.is_dir()
    run_cli(["prune", "--older-than", "7d", "--keep-best", "--runs-dir", root])
    assert not worse_a.path.exists() and not none_a.path.exists()
    assert all(r.path.is_dir() for r in (best_a, best_b, recent, live))
    run_cli(["prune", "--older-than", "2d", "--runs-dir", root])
    assert not best_a.path.exists() and not best_b.path.exists() and recent.path.is_dir() and live.path.is_dir()


@pytest.mark.parametrize("age, seconds", [("7d", 7 * 86400), ("12h", 43200), ("30m", 1800), ("45s", 45),
                                          ("2w", 14 * 86400), ("1.5h", 5400)])
def test_ages_for_prune(age, seconds):
    from rlctl.run_housekeeping import parse_age

    assert parse_age(age) == seconds


def test_a_preempted_run_stays_preempted_offers_resume_and_shows_queued_while_slurm_holds_it(tmp_path, monkeypatch):
    # Its supervisor is gone, on purpose: not lost, however long ago it wrote.
    run = make_run(tmp_path, status="preempted", supervisor_pid=dead_pid(), supervisor_host="node-1",
                   updated_at=T0, slurm_job_id=42, segments=[{"started_at": T0, "ended_at": T0 + 30}],
                   preemptions=[{"at": T0 + 30, "reason": "Slurm job 42 nears its time limit (SIGUSR1)",
                                 "requeued": True}])
    not_requeued = make_run(tmp_path, job="other", status="preempted", slurm_job_id=42,
                            preemptions=[{"requeued": False}])
    assert run.effective_status() == "preempted"
    assert f"rlctl run --resume {run.run_id}" in next_steps(run, "preempted")
    # A login node without Slurm's commands: shown as it is.
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert run_reading.as_read(run.read_state())["status"] == "preempted"
    # Slurm holds the requeued job pending: queued (a fake squeue answering for job 42 only).
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "squeue").write_text('#!/bin/sh\n[ "$3" = 42 ] && echo PENDING\n')
    (fake / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    seen = run_reading.as_read(run.read_state())
    assert seen["status"] == "queued" and seen["elapsed_s"] == 30
    assert next_steps(run, seen["status"])[0] == f"rlctl watch {run.run_id}"
    assert run_reading.as_read(not_requeued.read_state())["status"] == "preempted"
