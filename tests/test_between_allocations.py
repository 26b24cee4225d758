"""A Slurm batch run between its allocations (preempted, its job pending again): `rlctl logs --follow` follows it
across them, `rlctl rm` and `rlctl prune` leave it, `rlctl stop` cancels its job. Real run directories written as
the supervisor and `prepare_batch_restart` write them, the real CLI; only Slurm's `squeue` and `scancel` are fakes on
PATH (a file per job holds what squeue says of it)."""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from pathlib import Path

import pytest

from conftest import run_cli, start_cli
from rlctl.run_logs import end_line_text, stamp
from rlctl.rundir import RunDir

JOB = 42
PREEMPTED_BY = f"Slurm job {JOB} nears its time limit (SIGUSR1)"


class FakeSlurm:
    """`squeue -h -j ID -o FMT` prints the state in the job's file (none: an unknown job id); `scancel ... ID` logs
    its arguments and ends the job."""

    def __init__(self, root: Path):
        self.bin = root / "fake-slurm"
        self.jobs = root / "fake-jobs"
        self.bin.mkdir()
        self.jobs.mkdir()
        self.scancels = root / "scancel.log"
        unknown = 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1'
        self._script("squeue", f'f="{self.jobs}/$3"\n[ -f "$f" ] || {{ {unknown}; }}\n'
                               'case "$5" in *%N*) echo "$(cat "$f")|" ;; *) cat "$f" ;; esac\n')
        self._script("scancel", f'echo "$@" >> "{self.scancels}"\n'
                                'for last in "$@"; do :; done\n'
                                f'rm -f "{self.jobs}/$last"\n')
        self.env = {"PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"}

    def _script(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)

    def says(self, job: int, state: str | None) -> None:
        """What squeue says of `job` from now on (None: Slurm no longer knows it)."""
        path = self.jobs / str(job)
        if state is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(state + "\n")


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> FakeSlurm:
    fake = FakeSlurm(tmp_path)
    monkeypatch.setenv("PATH", fake.env["PATH"])  # for the library calls in this process too
    return fake


def batch_state(run: RunDir, status: str, segments: list, **more) -> dict:
    """state.json of a batch run as its supervisor on node-1 writes it."""
    state = {"run_id": run.run_id, "job": "tiny", "algorithm": "apex", "status": status, "slurm_job_id": JOB,
             "slurm_batch": True, "supervisor_host": "node-1", "supervisor_pid": 4242, "updated_at": time.time(),
             "started_at": segments[0]["started_at"], "segments": segments, "processes": [], "metrics": {}, **more}
    run.write_state(state)
    return state


def preemption(at: float, requeued: bool = True) -> dict:
    return {"at": at, "reason": PREEMPTED_BY, "slurm_job_id": JOB, "allocation": 0, "env_steps": 1000,
            "requeued": requeued, "requeued_by": "rlctl" if requeued else None}


def log(run: RunDir, source: str, text: str) -> None:
    """One line appended, as the supervisor and the processes write them (every segment appends)."""
    with open(run.logs_dir / f"{source}.log", "a", encoding="utf-8") as f:
        f.write(f"{stamp()} {text}\n")


def preempted_run(root: Path, requeued: bool = True, end_line: bool = True) -> RunDir:
    """A run whose first allocation ended at its time limit: the supervisor's last lines (`end_line`: Slurm did not
    kill it first) and state."""
    run = RunDir.create(root, "tiny")
    t0 = time.time() - 3600
    log(run, "collector-0", "seg1 last")
    if end_line:
        log(run, "supervisor", end_line_text("preempted", f"preempted: {PREEMPTED_BY}", 30.0))
    batch_state(run, "preempted", [{"started_at": t0, "ended_at": t0 + 30}], ended_at=t0 + 30,
                exit_reason=f"preempted: {PREEMPTED_BY}", preemptions=[preemption(t0 + 30, requeued)])
    return run


class Follower:
    """`rlctl logs RUN --follow --json` as a subprocess, its lines read as they come."""

    def __init__(self, run: RunDir, env: dict):
        self.proc = start_cli(["logs", run.run_id, "-f", "--json", "--runs-dir", str(run.path.parent)], env=env)
        self.lines: queue.Queue = queue.Queue()
        self.texts: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line)["text"])
        self.lines.put(None)

    def until(self, pred, timeout: float = 20.0) -> str:
        """The texts up to the first one `pred` accepts (the test fails if the stream ends or stalls first)."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            assert text is not None, f"the follow ended after {self.texts}; stderr: {self.proc.stderr.read()}"
            self.texts.append(text)
            if pred(text):
                return text

    def end(self, timeout: float = 20.0) -> int:
        """Its exit code, once every line it printed is in `texts`."""
        try:
            code = self.proc.wait(timeout)
        finally:
            self.proc.kill()
        while (text := self.lines.get(timeout=5)) is not None:
            self.texts.append(text)
        return code


def test_logs_follow_a_run_across_its_allocations_until_it_really_ends(tmp_path, slurm):
    run = RunDir.create(tmp_path, "tiny")
    t0 = time.time()
    slurm.says(JOB, "RUNNING")
    first = [{"started_at": t0, "ended_at": None}]
    batch_state(run, "running", first)
    log(run, "collector-0", "seg1 a")
    follow = Follower(run, slurm.env)
    try:
        follow.until(lambda t: t == "seg1 a")
        # The time limit's warning: the supervisor stops the run, writes its end line, then state.json; its job
        # runs on until it has asked for the requeue.
        log(run, "collector-0", "seg1 last")
        log(run, "supervisor", f"stopping: preempted: {PREEMPTED_BY}")
        end1 = end_line_text("preempted", f"preempted: {PREEMPTED_BY}", 30.0)
        log(run, "supervisor", end1)
        closed = [{"started_at": t0, "ended_at": time.time()}]
        record = preemption(time.time())
        batch_state(run, "preempted", closed, ended_at=time.time(), preemptions=[record],
                    exit_reason=f"preempted: {PREEMPTED_BY}")
        waiting = follow.until(lambda t: t.startswith("── preempted"))
        assert follow.texts[-4:-1] == ["seg1 last", f"stopping: preempted: {PREEMPTED_BY}", end1]
        clock = time.strftime("%H:%M:%S", time.localtime(record["at"]))
        assert waiting == (f"── preempted at {clock} ({PREEMPTED_BY}); waiting for the next allocation of Slurm job "
                           f"{JOB}; Ctrl-C leaves (rlctl stop {run.run_id} ends it) ──")
        # Requeued: pending for a while (`rlctl status` shows it queued); the follow waits on.
        slurm.says(JOB, "PENDING")
        assert json.loads(run_cli(["status", run.run_id, "--json", "--runs-dir", str(tmp_path)],
                                  env=slurm.env).stdout)["status"] == "queued"
        assert follow.proc.poll() is None
        # The next allocation: prepare_batch_restart's state, then its supervisor's.
        slurm.says(JOB, "RUNNING")
        batch_state(run, "created", closed, resumed={"preemptions": [record], "status": "preempted"},
                    supervisor_pid=None)
        log(run, "supervisor", "starting (resumed)")
        batch_state(run, "running", closed + [{"started_at": time.time(), "ended_at": None}], preemptions=[record])
        follow.until(lambda t: t == "starting (resumed)")
        assert follow.texts[-2] == f"── resumed in allocation 2 of Slurm job {JOB} ──"
        log(run, "collector-0", "seg2 a")
        follow.until(lambda t: t == "seg2 a")
        log(run, "collector-0", "seg2 last")
        end2 = end_line_text("finished", "charts/env_steps 2000 >= 2000", 40.0)
        log(run, "supervisor", end2)
        batch_state(run, "finished", closed + [{"started_at": t0 + 100, "ended_at": time.time()}],
                    preemptions=[record], ended_at=time.time())
        slurm.says(JOB, None)
        assert follow.end() == 0
    finally:
        follow.proc.kill()
    assert follow.texts == ["seg1 a", "seg1 last", f"stopping: preempted: {PREEMPTED_BY}", end1, waiting,
                            f"── resumed in allocation 2 of Slurm job {JOB} ──", "starting (resumed)", "seg2 a",
                            "seg2 last", end2]  # one end line: the run's


@pytest.mark.parametrize("requeued", [True, False])
def test_logs_follow_of_a_preempted_run_that_no_allocation_will_resume_ends_saying_so(tmp_path, slurm, requeued):
    run = preempted_run(tmp_path, requeued)
    slurm.says(JOB, None if requeued else "PENDING")  # gone from Slurm; or pending, but not this run's requeue
    out = run_cli(["logs", run.run_id, "-f", "--runs-dir", str(tmp_path)], env={**slurm.env, "COLUMNS": "300"},
                  timeout=30)
    *lines, last = out.stdout.splitlines()
    assert lines[-1].endswith(f"run preempted after 30.0s: preempted: {PREEMPTED_BY}")
    why = f"Slurm job {JOB} has ended" if requeued else "its Slurm job was not requeued"
    assert last.endswith(f"({PREEMPTED_BY}); no allocation will resume it: {why}; rlctl run --resume {run.run_id} "
                         "continues it ──"), out.stdout


@pytest.mark.parametrize("end_line", [True, False])
def test_logs_follow_of_a_waiting_run_ends_when_its_job_does(tmp_path, slurm, end_line):
    run = preempted_run(tmp_path, end_line=end_line)
    slurm.says(JOB, "PENDING")
    follow = Follower(run, slurm.env)
    try:
        follow.until(lambda t: "waiting for the next allocation" in t)
        slurm.says(JOB, None)  # scancel'd while pending
        assert follow.end() == 0
    finally:
        follow.proc.kill()
    assert follow.texts[-1] == (f"── no allocation will resume it: Slurm job {JOB} has ended; rlctl run --resume "
                                f"{run.run_id} continues it ──")


def test_rm_and_prune_leave_a_run_that_a_pending_slurm_job_will_resume(tmp_path, slurm):
    root = str(tmp_path)
    waiting, done = preempted_run(tmp_path), RunDir.create(tmp_path, "tiny")
    done.write_state({"run_id": done.run_id, "status": "finished", "ended_at": time.time() - 10})
    slurm.says(JOB, "PENDING")
    out = run_cli(["rm", waiting.run_id, done.run_id, "--runs-dir", root], expected_exit=2)
    assert out.stderr.splitlines() == [
        f"rlctl rm: {waiting.run_id} is preempted: it will resume in its pending Slurm job {JOB}; end it with rlctl "
        f"stop {waiting.run_id} (or scancel {JOB}), or remove it anyway with --force", "nothing was removed"]
    assert waiting.path.is_dir() and done.path.is_dir()
    out = run_cli(["prune", "--older-than", "1s", "--runs-dir", root])
    assert out.stdout.splitlines() == [f"removed {done.run_id}", f"skipped 1 run that a pending Slurm job will start "
                                       f"(again): {waiting.run_id}; rlctl stop RUN ends one"]
    assert waiting.path.is_dir() and not done.path.exists()
    assert run_cli(["rm", "--force", waiting.run_id, "--runs-dir", root]).stdout.split() == ["removed", waiting.run_id]
    assert not slurm.scancels.exists()  # rm removes files; it ends no job


def test_a_run_whose_job_slurm_has_ended_goes_with_rm_and_prune(tmp_path, slurm):
    gone, queued = preempted_run(tmp_path), RunDir.create(tmp_path, "tiny")
    queued.write_state({"run_id": queued.run_id, "status": "queued", "slurm_job_id": JOB + 1,
                        "started_at": time.time() - 10})
    # Neither job is in Slurm's queue (cancelled outside rlctl): nothing will start them.
    run_cli(["prune", "--older-than", "1s", "--runs-dir", str(tmp_path)])
    assert not gone.path.exists() and not queued.path.exists()


@pytest.mark.parametrize("host", ["node-1", "here"])
def test_stop_of_a_queued_run_cancels_its_pending_job_and_marks_it_stopped(tmp_path, slurm, host):
    run = preempted_run(tmp_path)
    if host == "here":  # a one-machine cluster: its supervisor ran on this host
        import socket

        run.write_state({**run.read_state(), "supervisor_host": socket.gethostname()})
    slurm.says(JOB, "PENDING")
    out = run_cli(["stop", run.run_id, "--timeout", "10", "--runs-dir", str(tmp_path)], env=slurm.env)
    assert out.stdout.strip() == f"{run.run_id} stopped (Slurm job {JOB} ended)"
    assert slurm.scancels.read_text().split() == [str(JOB)]
    state = run.read_state()
    assert state["status"] == "stopped" and state["exit_reason"] == f"Slurm job {JOB} cancelled while preempted"
    run_cli(["rm", run.run_id, "--runs-dir", str(tmp_path)])  # and then it goes


def test_a_requeued_job_whose_run_its_last_stop_took_past_the_target_records_it_finished(tmp_path):
    """Its last allocation's stop (slow, and counted as run time) took the run past its wall-time target: the next
    allocation records the run finished by that target and exits 0, where it refused to run and left the run
    `preempted`, waiting for an allocation that would never come (a clean-clone CI's Slurm test, 20 min)."""
    from conftest import small_job

    run = preempted_run(tmp_path)  # one allocation of 30 s
    run.write_job(small_job(tmp_path, stop="wall_s = 25").read_text())
    out = run_cli(["run", "--slurm-run-dir", str(run.path)], env={"SLURM_JOB_ID": str(JOB), "SLURM_RESTART_COUNT": "1"})
    assert f"{run.run_id} finished: wall time 30s >= 25s (reached in its last allocation)" in out.stderr, out.stderr
    state = run.read_state()
    assert state["status"] == "finished" and state["exit_reason"] == "wall time 30s >= 25s", state
    assert state["stopped_by"] == {"criterion": "wall_s", "value": 30.0, "threshold": 25.0}
    assert state["preemptions"] and len(state["segments"]) == 1  # what the run was is kept
    shown = json.loads(run_cli(["status", run.run_id, "--json", "--runs-dir", str(tmp_path)]).stdout)
    assert shown["status"] == "finished"
