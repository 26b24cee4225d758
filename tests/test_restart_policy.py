"""The restart policy's state machine, in-process: backoff, the restart window, hangs, torchrun's ranks, Slurm moves,
and the process table's decisions on ends (fake processes: only exit codes are needed)."""

from __future__ import annotations

import os
import signal

import pytest

from conftest import small_job
from rlctl.supervise.restart_policy import (ALIVE, TRANSITIONS, Event, IllegalTransition, Lifecycle, ProcState, RestartPolicy,
                                  agent_killed)

POLICY = RestartPolicy(max_restarts=3, window_s=100.0, backoff_s=0.5, heartbeat_timeout_s=5.0)
KILLED = -signal.SIGKILL


def running(policy: RestartPolicy = POLICY) -> Lifecycle:
    """A process that has said hello."""
    life = Lifecycle(policy)
    life.heard()
    return life


def test_a_process_runs_once_heard_and_a_late_message_changes_nothing():
    life = Lifecycle(POLICY)
    assert life.state is ProcState.STARTING and life.alive
    life.heard()
    assert life.state is ProcState.RUNNING
    assert life.ended(0, critical=False, now=10.0)
    life.heard()  # still queued from the process that ended
    assert life.state is ProcState.RESTARTING


def test_backoff_doubles_per_restart_in_the_window_up_to_its_cap_and_restarts_run_out():
    life = running(RestartPolicy(max_restarts=8, window_s=1000.0, backoff_s=4.0, heartbeat_timeout_s=5.0))
    delays = []
    for now in (10.0, 20.0, 30.0, 40.0, 50.0):
        assert life.ended(1, critical=False, now=now)
        delays.append(life.start_at - now)
        assert not life.due(life.start_at - 0.01) and life.due(life.start_at)
        life.start()
        assert life.state is ProcState.STARTING and life.start_at is None
    assert delays == [4.0, 8.0, 16.0, 30.0, 30.0]  # 32 and 64 capped at MAX_BACKOFF_S
    assert life.restarts == 5 and life.note.startswith("exited with code 1 at ")
    assert life.note.endswith("restarted after 30.0s")


def test_restarts_are_counted_within_the_window_only():
    life = running()
    for now in (0.0, 1.0, 2.0):
        assert life.ended(1, critical=False, now=now)
        life.start()
    assert not life.ended(1, critical=False, now=50.0)  # the fourth within 100 s: not restarted
    assert life.state is ProcState.STARTING  # untouched: the caller loses or fails it
    life.give_up()
    assert life.state is ProcState.FAILED and not life.alive
    again = running()
    for now in (0.0, 1.0, 2.0):
        assert again.ended(1, critical=False, now=now)
        again.start()
    assert again.ended(1, critical=False, now=101.5)  # the first two have left the window
    assert again.start_at == pytest.approx(101.5 + 0.5 * 2)  # one restart left in it: backoff doubled once


def test_torchrun_giving_up_is_final_but_a_killed_agent_restarts():
    assert agent_killed(KILLED) and agent_killed(137) and agent_killed(255) and not agent_killed(1)
    life = running()
    assert not life.ended(1, critical=True, now=1.0)
    assert POLICY.why_not_restarted(True, 1) == "torchrun gave up restarting its ranks"
    assert POLICY.why_not_restarted(False, KILLED) == "exceeded 3 restarts within 100s"
    assert life.ended(KILLED, critical=True, now=1.0) and life.state is ProcState.RESTARTING


def test_a_silent_process_is_hung_shows_running_and_its_restart_keeps_the_reason():
    life = running()
    assert life.silent_for(100.0, 104.0) is None and life.silent_for(None, 1e9) is None
    silence = life.silent_for(100.0, 106.0)
    assert silence == pytest.approx(6.0)
    life.silent(silence, 106.0, by_ranks=False)
    assert life.state is ProcState.HUNG and life.state.shown == "running" and life.alive
    assert life.note.startswith("hung: no heartbeat for 6s; killed at ")
    assert life.silent_for(106.0, 112.0) is not None  # a kill that did not take is sent again a timeout later
    life.silent(6.0, 112.0, by_ranks=True)  # a hung process is killed whole, never by ranks
    assert life.state is ProcState.HUNG
    assert life.ended(KILLED, critical=False, now=113.0)
    assert life.note.startswith("hung: no heartbeat") and life.state.shown == "restarting"
    other = running()
    other.silent(6.0, 106.0, by_ranks=False)
    assert other.ended(0, critical=False, now=107.0)  # it ended by itself, not of the kill
    assert other.note.startswith("exited with code 0")


def test_a_learner_s_killed_ranks_are_waited_for_then_its_agent_is_killed():
    life = running()
    life.silent(6.0, 100.0, by_ranks=True)
    assert life.state is ProcState.RANKS_RESTARTING and life.state.shown == "running"
    assert life.silent_for(0.0, 150.0) is None  # no second kill while torchrun restarts them
    assert not life.ranks_overdue(160.0) and life.ranks_overdue(160.1)  # the grace: max(60 s, 3 timeouts)
    life.ranks_back()
    assert life.state is ProcState.RUNNING and life.ranks_killed_at is None
    slow = Lifecycle(RestartPolicy(3, 100.0, 0.5, heartbeat_timeout_s=30.0))
    slow.heard()
    slow.silent(31.0, 100.0, by_ranks=True)
    assert not slow.ranks_overdue(190.0) and slow.ranks_overdue(190.1)
    slow.ranks_late(190.1)
    assert slow.state is ProcState.HUNG and slow.note.startswith("hung: torchrun did not restart its ranks")
    assert slow.ended(KILLED, critical=True, now=191.0) and slow.note.startswith("hung: torchrun")
    assert slow.ranks_killed_at is None


def test_moves_and_joint_learner_restarts_start_without_using_the_window():
    life = running()
    life.moved("n2", "n3", now=50.0)
    assert life.state is ProcState.RESTARTING and life.start_at == 50.0 and life.due(50.0)
    assert life.restarts == 1 and not life.restart_times and "node n2 lost" in life.note and "moved to n3" in life.note
    partner = running()
    partner.silent(6.0, 10.0, by_ranks=True)
    partner.restart_with("learner-0", start_at=12.5, now=11.0)
    assert partner.state is ProcState.RESTARTING and partner.start_at == 12.5 and partner.ranks_killed_at is None
    assert partner.note.startswith("restarted with learner-0 at ")


def test_stop_ends_every_process_but_a_failed_or_lost_one_stays_so():
    for prepare, final in ((lambda life: None, ProcState.STOPPED), (lambda life: life.silent(6.0, 1.0, False),
                                                                     ProcState.STOPPED),
                           (lambda life: life.ended(1, False, 1.0), ProcState.STOPPED),
                           (lambda life: life.give_up(), ProcState.FAILED), (lambda life: life.lose(), ProcState.LOST)):
        life = running()
        prepare(life)
        life.stop()
        assert life.state is final


@pytest.mark.parametrize("state,event", [
    (ProcState.RUNNING, Event.START), (ProcState.STARTING, Event.SILENT), (ProcState.RUNNING, Event.RANKS_BACK),
    (ProcState.FAILED, Event.ENDED), (ProcState.STOPPED, Event.STOP), (ProcState.RESTARTING, Event.ENDED),
    (ProcState.HUNG, Event.RANKS_KILLED), (ProcState.LOST, Event.START),
])
def test_events_without_a_transition_are_refused(state, event):
    life = Lifecycle(POLICY, state=state)
    with pytest.raises(IllegalTransition):
        life.fire(event)
    assert life.state is state


def test_every_state_is_reachable_and_every_live_one_can_end():
    reached, frontier = {ProcState.STARTING}, [ProcState.STARTING]
    while frontier:
        state = frontier.pop()
        for (source, _), target in TRANSITIONS.items():
            if source is state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(ProcState)
    for state in ALIVE:
        assert {TRANSITIONS[state, e] for e in (Event.ENDED, Event.GAVE_UP, Event.LOSE, Event.STOP)} == {
            ProcState.RESTARTING, ProcState.FAILED, ProcState.LOST, ProcState.STOPPED}
    assert all((state, Event.HEARD) in TRANSITIONS for state in ProcState)


class EndedProcess:
    """Stands in for a Popen whose process has exited with `code`."""

    def __init__(self, code: int):
        self.code = code

    def poll(self) -> int:
        return self.code


def test_the_process_table_restarts_a_collector_until_its_restarts_run_out(tmp_path):
    from rlctl.launch.plan import make_plan
    from rlctl.supervise.process_table import ProcessTable
    from rlctl.job.load import load_job

    spec = load_job(small_job(tmp_path, max_restarts=1))
    restarted = []
    table = ProcessTable(spec, make_plan(spec, "t-1", str(tmp_path / "run"), 30000), on_restart=restarted.append)
    assert table.policy == RestartPolicy.of(spec) and table.policy.max_restarts == 1
    collector = table.by_name["collector-0"]
    collector.popen = EndedProcess(KILLED)
    assert table.reap() is None and collector.life.state is ProcState.RESTARTING and restarted == ["collector-0"]
    assert table.due(collector.life.start_at) == [collector] and collector.life.state is ProcState.STARTING
    collector.popen = EndedProcess(KILLED)
    end = table.reap()
    assert end.status == "failed" and collector.life.state is ProcState.FAILED
    assert end.reason == f"collector-0 exited with code -9 (exceeded 1 restarts within {spec.topology.restart_window_s:g}s)"
    assert end.failure == {"process": "collector-0", "exit_code": KILLED, "log_tail": []}
    assert table.reap() is None  # a failed process is not looked at again


def test_a_process_that_cannot_start_is_not_restarted_whatever_restarts_it_has_left():
    from rlctl.events import STARTUP_FAILED_CODE

    life = running()
    assert not life.ended(STARTUP_FAILED_CODE, critical=False, now=10.0) and life.restarts == 0
    assert POLICY.why_not_restarted(False, STARTUP_FAILED_CODE) == "it cannot start, and would not on a restart either"
    life.cannot_start("env.id 'm:E': making the env failed (RuntimeError: boom)")
    assert life.state is ProcState.FAILED and life.restarts == 0
    assert life.note == "cannot start: env.id 'm:E': making the env failed (RuntimeError: boom)"


def _pump_of(tmp_path, *lines: str):
    """A real LogPump that has read `lines` (a process's output) to its end."""
    import io

    from rlctl.supervise.process_table import LogPump

    pump = LogPump(io.BytesIO("".join(f"{line}\n" for line in lines).encode()), tmp_path / "p.log")
    pump.start()
    pump.join(timeout=10)
    return pump


def test_the_process_table_fails_the_run_at_once_when_a_process_says_it_cannot_start(tmp_path):
    """The process's `exit` event (rlctl.events) names the cause: the run fails with it first, nothing restarted;
    a process that said so but still runs (a learner's torchrun agent, about to start its ranks again) is killed."""
    import subprocess

    from rlctl import events
    from rlctl.launch.plan import make_plan
    from rlctl.supervise.process_table import ProcessTable
    from rlctl.job.load import load_job

    spec = load_job(small_job(tmp_path, max_restarts=3))
    cause = ("env.id 'mypkg.envs:MyEnv': cannot import module 'mypkg.envs' (ModuleNotFoundError: No module named "
             "'mypkg')")
    said = events.line("exit", reason=events.EXIT_STARTUP_FAILED, detail=cause)
    table = ProcessTable(spec, make_plan(spec, "t-1", str(tmp_path / "run"), 30000), on_restart=lambda name: None)
    collector = table.by_name["collector-0"]
    collector.popen, collector.pump = EndedProcess(events.STARTUP_FAILED_CODE), _pump_of(tmp_path, "Traceback", said)
    end = table.reap()
    assert end.status == "failed" and end.reason == f"collector-0 cannot start: {cause}"
    assert end.failure["cause"] == cause and collector.life.state is ProcState.FAILED and collector.life.restarts == 0

    table = ProcessTable(spec, make_plan(spec, "t-2", str(tmp_path / "run"), 30000), on_restart=lambda name: None)
    learner = table.by_name["learner-0"]
    learner.popen = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        learner.pump = _pump_of(tmp_path, "2026-12-04T00:11:48.434 " + said)  # stamped, as remote lines come
        end = table.reap()
        assert end.reason == f"learner-0 cannot start: {cause}" and learner.life.state is ProcState.FAILED
        assert learner.popen.wait(timeout=10) == KILLED
    finally:
        learner.popen.kill()
        learner.popen.wait()
    # An exit code alone (the event lost) still restarts nothing.
    table = ProcessTable(spec, make_plan(spec, "t-3", str(tmp_path / "run"), 30000), on_restart=lambda name: None)
    replay = table.by_name["replay-0"]
    replay.popen, replay.pump = EndedProcess(events.STARTUP_FAILED_CODE), _pump_of(tmp_path, "Traceback")
    end = table.reap()
    assert end.reason == (f"replay-0 exited with code {events.STARTUP_FAILED_CODE} (it cannot start, and would not "
                          "on a restart either)") and replay.life.restarts == 0


def test_a_row_s_rate_is_its_heartbeats_mean_over_the_window_and_a_new_start_forgets_the_old_ones(tmp_path):
    """Rates in a row average the last RATE_WINDOW_S of heartbeats (one slow heartbeat is no blink to 0.0); the
    evaluator's figure is its latest return; a process started again shows none of its predecessor's."""
    from rlctl.launch.plan import ProcessSpec
    from rlctl.supervise.process_table import ProcessHandle
    from rlctl.supervise.run_state import RATE_WINDOW_S, note_rate, shown_rate
    from rlctl import metric_names as M

    def handle(role: str) -> ProcessHandle:
        return ProcessHandle(ProcessSpec(f"{role}-0", role, 0, "localhost", ["true"], {}), Lifecycle(POLICY))

    collector = handle("collector")
    assert shown_rate(collector, 100.0) is None
    for t, rate in ((80.0, 1000.0), (95.0, 400.0), (99.0, 0.0), (100.0, 500.0)):
        collector.metrics = {M.ENV_STEPS_PER_S: rate}
        note_rate(collector, t)
    assert shown_rate(collector, 100.0) == pytest.approx((400 + 0 + 500) / 3)  # 80.0 is out of the window
    assert shown_rate(collector, 100.0 + 2 * RATE_WINDOW_S) == 500.0  # nothing recent: the last heard
    evaluator = handle("evaluator")
    for t, ret in ((90.0, 20.0), (99.0, 480.0)):
        evaluator.metrics = {M.EVAL_RETURN_MEAN: ret}
        note_rate(evaluator, t)
    assert shown_rate(evaluator, 100.0) == 480.0
    collector.start(dict(os.environ), tmp_path)  # `true`, started for real
    assert shown_rate(collector, 100.0) is None
    collector.popen.wait(10)
    collector.pump.join(10)
