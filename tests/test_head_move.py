"""The job an elastic run goes on with once its head's host is lost (rlctl.job.head_move): the next learner host
heads it with what the lost host ran, the lost host last as a learner node alone; jobs that cannot are refused with
the reason. Over real SSH hosts: tests/test_ssh.py."""

from __future__ import annotations

import pytest

from rlctl.job.head_move import HeadNotMovable, head_moved
from rlctl.launch.plan import make_plan
from rlctl.launch.preflight import joins_later
from test_host_loss import spec_of

ELASTIC = '''
[job]
name = "heads"

[env]
id = "CartPole-v1"

[algorithm]
name = "apex"

[topology]
min_learner_nodes = 1

[[hosts]]
name = "h1"
learner = true
replay_shards = 1
evaluator = true
collectors = 1
env = { TOKEN = "secret" }

[[hosts]]
name = "h2"
collectors = 2

[[hosts]]
name = "h3"
learner = true
collectors = 1

[[hosts]]
name = "h4"
learner = true
spare = true
'''


def rows(spec) -> list[tuple]:
    return [(h.name, h.learner, h.spare, h.collectors, h.replay_shards, h.evaluator) for h in spec.hosts]


def test_the_next_learner_host_heads_the_job_with_what_the_lost_head_ran(tmp_path):
    spec = head_moved(spec_of(tmp_path, ELASTIC), "h1")
    assert rows(spec) == [("h3", True, False, 2, 1, True), ("h2", False, False, 2, 0, False),
                          ("h4", True, True, 0, 0, False), ("h1", True, False, 0, 0, False)]
    assert spec.hosts[-1].env == {"TOKEN": "secret"}  # the host's secrets kept, not their masks
    plan = make_plan(spec, "heads-1", str(tmp_path / "run"), 42000)
    assert next(p.host for p in plan.processes if p.role == "learner") == "h3"  # node 0: the head
    assert joins_later(spec, plan) == {"h1", "h4"}  # the lost host may be unreachable at the start


def test_a_spare_heads_the_job_when_no_other_learner_host_is_left(tmp_path):
    spec = head_moved(spec_of(tmp_path, ELASTIC.replace('name = "h3"\nlearner = true', 'name = "h3"')), "h1")
    assert rows(spec) == [("h4", True, False, 1, 1, True), ("h2", False, False, 2, 0, False),
                          ("h3", False, False, 1, 0, False), ("h1", True, False, 0, 0, False)]


def test_a_job_that_cannot_go_on_without_its_head_is_refused_with_the_reason(tmp_path):
    with pytest.raises(HeadNotMovable, match="h3 is not the head"):
        head_moved(spec_of(tmp_path, ELASTIC), "h3")
    with pytest.raises(HeadNotMovable, match="not the head of an elastic learner group"):
        head_moved(spec_of(tmp_path, ELASTIC.replace("min_learner_nodes = 1", "learner_procs = 1")
                           .replace("spare = true\n", "")), "h1")


def test_a_run_that_cannot_go_on_without_its_head_is_recorded_failed_with_the_reason(tmp_path):
    from rlctl.rundir import RunDir
    from rlctl.supervise.head_failover import prepare_next_segment

    rundir = RunDir.create(tmp_path / "runs", "heads")
    rundir.write_state({"run_id": rundir.run_id, "status": "stopped", "exit_reason": "head host h3 lost"})
    why = prepare_next_segment(rundir, spec_of(tmp_path, ELASTIC), "h3", 1_700_000_000.0)
    assert why == "h3 is not the head of an elastic learner group"
    state = rundir.read_state()
    assert state["status"] == "failed" and state["exit_reason"] == (
        "head host h3 lost; the run cannot go on without it: h3 is not the head of an elastic learner group")


def test_a_head_whose_host_two_starts_in_a_row_did_not_reach_ends_the_segment_as_lost(tmp_path):
    import subprocess
    import time
    from types import SimpleNamespace

    from rlctl.supervise.process_table import ProcessTable
    from rlctl.supervise.restart_policy import ProcState

    spec = spec_of(tmp_path, ELASTIC.replace("[topology]\n", "[topology]\nmax_restarts = 100\n"))
    table = ProcessTable(spec, make_plan(spec, "heads-1", str(tmp_path / "run"), 42000), on_restart=lambda name: None)
    head = table.by_name["learner-0"]
    for began, expected in ((True, None), (False, None), (False, "h1")):
        # ssh's exit 255, from a session whose far side began (it dropped) or from one that never reached the host.
        head.popen = subprocess.Popen(["sh", "-c", "exit 255"])
        head.popen.wait()
        head.pump = SimpleNamespace(session_at=1.0 if began else None, startup_failure=None, join=lambda timeout: None)
        if head.life.state is ProcState.RESTARTING:
            assert head in table.due(time.time() + 3600)
        elif head.life.state is not ProcState.STARTING:
            head.life.start()
        end = table.reap()
        assert (end.head_lost if end else None) == expected, end
    assert end.status == "stopped"
    assert end.reason == "head host h1 lost: ssh could not reach it (2 starts of learner-0 in a row)"
    assert head.life.state is ProcState.LOST
    table.watch.close()


def test_between_two_segments_the_run_says_starting_and_a_stop_there_ends_it_stopped_with_its_counters(tmp_path):
    import os
    import signal

    from rlctl.launch.resume import ResumeRefused, previous_segment
    from rlctl.liveness import process_start_time
    from rlctl.rundir import RunDir
    from rlctl.run_logs import is_end_line
    from rlctl.supervise.head_failover import StopBetweenSegments, stop_between_segments

    rundir = RunDir.create(tmp_path / "runs", "heads")
    # What a segment's wind-down writes when its head host was lost: the run goes on, so it says starting.
    ended = {"run_id": rundir.run_id, "status": "starting", "exit_reason": "head host h1 lost",
             "started_at": 100.0, "ended_at": 160.0, "updated_at": 160.0, "supervisor_pid": os.getpid(),
             "supervisor_start": process_start_time(os.getpid()),
             "segments": [{"started_at": 100.0, "ended_at": 130.0}, {"started_at": 140.0, "ended_at": 160.0}],
             "metrics": {"charts/env_steps": 5000}, "processes": []}
    rundir.write_state(ended)
    with pytest.raises(ResumeRefused, match="is starting"):
        previous_segment(rundir)  # `rlctl run --resume` of a run whose supervisor goes on with it
    assert previous_segment(rundir, ended_here=True)["env_steps"] == 5000  # the supervisor's own next segment

    before = signal.getsignal(signal.SIGTERM)
    with StopBetweenSegments() as gap:
        os.kill(os.getpid(), signal.SIGTERM)  # `rlctl stop` while no segment's supervisor holds the signals
        assert gap.signum == signal.SIGTERM
        rundir.write_state({"run_id": rundir.run_id, "status": "created", "metrics": {}})  # the next one, prepared
        assert stop_between_segments(rundir, ended, gap.signum) == 0
    assert signal.getsignal(signal.SIGTERM) is before
    state = rundir.read_state()
    assert state["status"] == "stopped" and state["metrics"] == {"charts/env_steps": 5000}
    assert state["exit_reason"] == "stopped by SIGTERM before its next segment started (head host h1 lost)"
    last = (rundir.logs_dir / "supervisor.log").read_text().splitlines()[-1]
    assert is_end_line(last.partition(" ")[2]) and "run stopped after 50.0s" in last, last
    assert previous_segment(rundir)["env_steps"] == 5000  # resumable as any stopped run
