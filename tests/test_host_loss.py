"""Hosts that vanish, in-process: where the processes of a lost host go (launch.plan.re_placement, shared by lost
Slurm nodes and SSH hosts), and the process table losing a silent SSH host and taking it back once it answers.
The same over real SSH hosts with a network interface taken down: tests/test_ssh.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlctl.job.load import load_job
from rlctl.launch.plan import make_plan, re_placement
from rlctl.supervise.restart_policy import ProcState

HOSTS = '''
[job]
name = "vanish"

[env]
id = "CartPole-v1"

[algorithm]
name = "apex"

[network]
base_port = 42000

[logging]
heartbeat_timeout_s = 10.0

[[hosts]]
name = "h1"
learner = true
replay_shards = 1

[[hosts]]
name = "h2"
collectors = 2

[[hosts]]
name = "h3"
collectors = 2
evaluator = true

[[hosts]]
name = "h4"
collectors = 1
'''


def spec_of(tmp_path: Path, text: str = HOSTS):
    path = tmp_path / "vanish.toml"
    path.write_text(text)
    return load_job(path)


def test_a_lost_hosts_collectors_and_evaluator_go_to_the_least_loaded_hosts_left_learner_hosts_last(tmp_path):
    spec = spec_of(tmp_path)
    procs = make_plan(spec, "v-1", str(tmp_path / "run"), 42000).processes
    on = {p.name: p.host for p in procs}
    assert [n for n, h in on.items() if h == "h3"] == ["evaluator-0", "relay-1", "collector-2", "collector-3"]
    # h4 runs 1, h2 2: h4 takes the first, then the two tie and the first host in the job's order takes the next.
    assert re_placement(spec.hosts, procs, {"h3"}) == {"evaluator-0": "h4", "collector-2": "h2", "collector-3": "h4"}
    assert re_placement(spec.hosts, procs, set()) == {}
    # A learner host's learner and replay shard go nowhere: their ports and data are their host's.
    assert re_placement(spec.hosts, procs, {"h1"}) == {}
    # With only the learner host left, it takes them all; with no host left, nothing moves.
    assert set(re_placement(spec.hosts, procs, {"h2", "h3", "h4"}).values()) == {"h1"}
    assert re_placement(spec.hosts, procs, {"h1", "h2", "h3", "h4"}) == {}
    # Processes that no longer run (not passed in) are not counted: h2 emptied takes the first two.
    alive = [p for p in procs if p.host != "h2"]
    assert re_placement(spec.hosts, alive, {"h3"}) == {"evaluator-0": "h2", "collector-2": "h2", "collector-3": "h4"}


def test_the_launching_machine_never_takes_a_remote_process(tmp_path):
    local = 'name = "h1"\naddress = "localhost"\nadvertise_address = "10.0.0.1"\n'
    spec = spec_of(tmp_path, HOSTS.replace('name = "h1"\n', local))
    procs = make_plan(spec, "v-1", str(tmp_path / "run"), 42000).processes
    assert re_placement(spec.hosts, procs, {"h2", "h3"}) == {"collector-0": "h4", "collector-1": "h4",
                                                           "evaluator-0": "h4", "collector-2": "h4",
                                                           "collector-3": "h4"}
    assert re_placement(spec.hosts, procs, {"h2", "h3", "h4"}) == {}


class Answers:
    """Stands in for the sweep a lost host is probed with: no answer, until `up` says it is back."""

    def __init__(self):
        self.up, self.calls = False, []

    def __call__(self, hosts, run_id, kill=True, placed=False, timeout=20.0):
        self.calls.append((hosts[0].name, run_id, kill, placed))
        return {hosts[0].name: {"left": [], "killed": [4242]} if self.up else {"error": "No route to host"}}


@pytest.fixture
def answers(monkeypatch):
    fake = Answers()
    monkeypatch.setattr("rlctl.launch.hosts.sweep_hosts", fake)
    monkeypatch.setattr("rlctl.supervise.host_loss.PROBE_INTERVAL_S", 0.01)
    return fake


def test_a_silent_ssh_host_is_lost_its_processes_move_after_the_session_timeout_and_it_is_taken_back(tmp_path,
                                                                                                     answers):
    from rlctl.supervise.host_loss import restart_delay
    from rlctl.supervise.process_table import ProcessTable

    spec = spec_of(tmp_path)
    restarted = []
    table = ProcessTable(spec, make_plan(spec, "v-1", str(tmp_path / "run"), 42000), on_restart=restarted.append)
    gone = [table.by_name[n] for n in ("evaluator-0", "collector-2", "collector-3")]
    # One of them still has its session: it is cut (a real process standing in for the ssh client).
    gone[1].popen = subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE, start_new_session=True)
    hear(table, 100.0)
    hear(table, 109.0, but="h3")
    assert table.check_hosts(110.0) == []  # h3 silent for 10 s: not past the timeout yet
    said = table.check_hosts(110.5)
    assert len(said) == 1 and said[0].startswith("host h3 lost at ") and "no word from its processes for 10s" in said[0]
    assert "collector-2 re-placed on h2" in said[0] and "evaluator-0 re-placed on h4" in said[0]
    assert gone[1].popen.poll() is not None and gone[1].last_exit == -9
    assert {h.spec.name: h.spec.host for h in gone} == {"evaluator-0": "h4", "collector-2": "h2", "collector-3": "h4"}
    assert all(h.spec.env["RLCTL_HOST"] == h.spec.host for h in gone)
    # Each new session forwards its own control socket to the supervisor's control port, as the first one did.
    control = str(table.control_port)
    assert control == str(make_plan(spec, "v-1", str(tmp_path / "run"), 42000).endpoints["control"]).rsplit(":")[-1]
    for h in gone:
        forward = h.spec.argv[h.spec.argv.index("-R") + 1]
        assert forward == f"{h.spec.env['RLCTL_CONTROL'].removeprefix('ipc://')}:127.0.0.1:{control}"
        assert h.spec.argv[h.spec.argv.index("--") - 1] == h.spec.host  # ssh's destination: the new host
    # They start once a copy still running on h3 has ended itself for want of word from the supervisor.
    assert restart_delay(spec) == spec.network.session_timeout_s + 5.0
    start_at = 110.5 + restart_delay(spec)
    assert all(h.life.state is ProcState.RESTARTING and h.life.start_at == start_at for h in gone)
    assert all(h.life.note.startswith("host h3 lost at ") and h.life.note.endswith(f"moved to {h.spec.host}")
               for h in gone)
    assert sorted(restarted) == ["collector-2", "collector-3", "evaluator-0"]
    # h3's weights relay goes with its host (the processes moved take weights from rank 0); h2's serves on.
    relay = table.by_name["relay-1"]
    assert relay.spec.host == "h3" and relay.life.state is ProcState.LOST and relay.life.start_at is None
    assert table.by_name["relay-0"].life.state is ProcState.RUNNING
    assert not any("RLCTL_WEIGHTS_VIA" in h.spec.env or "RLCTL_WEIGHT_BOARD" in h.spec.env for h in gone)
    hear(table, 111.0, but="h3")
    assert table.lost_nodes == {"h3"} and table.check_hosts(111.0) == []  # lost once
    assert table.due(start_at - 0.1) == [] and table.due(start_at) == gone

    # Probed until it answers; the answer ends what of the run is left there (its sweep, by the host's name).
    assert answers.calls and answers.calls[0] == ("h3", "v-1", True, True)
    answers.up = True
    said = wait_said(table, 112.0)
    assert len(said) == 1 and said[0].startswith("host h3 back at ") and "1 leftover processes" in said[0]
    assert "h3" not in table.lost_nodes and "h3" not in table.watch.lost
    loss = table.watch.losses["h3"]
    assert loss.moved == {"evaluator-0": "h4", "collector-2": "h2", "collector-3": "h4"} and loss.back_at is not None
    assert loss.note(lambda t: "T").startswith("lost at T; collector-2 re-placed on h2; ")
    table.watch.close()


def test_when_every_host_is_silent_or_a_learner_is_there_nothing_moves(tmp_path, answers):
    from rlctl.supervise.process_table import ProcessTable

    spec = spec_of(tmp_path)
    table = ProcessTable(spec, make_plan(spec, "v-1", str(tmp_path / "run"), 42000), on_restart=lambda name: None)
    hear(table, 100.0)
    # Every host silent at once: the supervisor's side is the one cut off; each process's own rules apply.
    assert table.check_hosts(200.0) == [] and not table.lost_nodes and answers.calls == []
    # h1 runs the learner and a replay shard: it is never lost as a host, whoever else is heard.
    hear(table, 205.0, but="h1")
    assert table.check_hosts(206.0) == [] and not table.lost_nodes
    table.watch.close()


def test_an_elastic_learner_node_is_lost_with_its_host_and_starts_there_again_once_it_answers(tmp_path, answers):
    """topology.min_learner_nodes = 1 with learners on h1 and h2: h2 silent is lost (its node goes with it, the run
    goes on: the head's world re-forms without it); its probe answered, the node starts on h2 again to rejoin."""
    from rlctl.supervise.process_table import ProcessTable

    text = HOSTS.replace('name = "h2"\n', 'name = "h2"\nlearner = true\n')
    spec = spec_of(tmp_path, text.replace("[logging]\n", "[topology]\nmin_learner_nodes = 1\n\n[logging]\n"))
    table = ProcessTable(spec, make_plan(spec, "v-1", str(tmp_path / "run"), 42000), on_restart=lambda name: None)
    node = table.by_name["learner-1"]
    assert node.spec.host == "h2" and not node.spec.critical and table.by_name["learner-0"].spec.critical
    hear(table, 100.0)
    hear(table, 109.0, but="h2")
    said = table.check_hosts(110.5)
    # Its collectors move as ever; the learner node goes with the host.
    assert len(said) == 1 and said[0].startswith("host h2 lost at ") and "collector-0 re-placed on h4" in said[0]
    assert node.life.state is ProcState.LOST and node.spec.host == "h2"
    answers.up = True
    said = wait_said(table, 112.0)
    assert said[1] == "learner-1 starts again on h2 and rejoins the learner group", said
    assert node.life.state is ProcState.RESTARTING and node.life.note.startswith("host h2 back at ")
    assert node in table.due(node.life.start_at) and node.spec.host == "h2"
    table.watch.close()


def test_a_spare_learner_host_starts_once_the_group_has_formed_and_waits_to_take_a_place(tmp_path, answers):
    """`spare = true` on a third learner host: torchrun's group holds at most the two others (`--nnodes 1:2`); the
    spare's node is held back at the start (so it can never take the head's place in the first round), released
    once the learner group has formed, and noted as in the group once its ranks speak."""
    import shlex

    from rlctl.supervise import spares
    from rlctl.supervise.process_table import ProcessTable

    text = HOSTS.replace('name = "h2"\n', 'name = "h2"\nlearner = true\n')
    text = text.replace('name = "h4"\n', 'name = "h4"\nlearner = true\nspare = true\n')
    spec = spec_of(tmp_path, text.replace("[logging]\n", "[topology]\nmin_learner_nodes = 1\n\n[logging]\n"))
    assert spec.elastic_learners and spec.max_learner_nodes == 2 and spec.learner_ranks == 3
    plan = make_plan(spec, "v-1", str(tmp_path / "run"), 42000)
    table = ProcessTable(spec, plan, on_restart=lambda name: None)
    spare, h2 = table.by_name["learner-2"], table.by_name["learner-1"]
    assert spare.spec.spare and spare.spec.host == "h4" and not spare.spec.critical and not h2.spec.spare
    for h in (table.by_name["learner-0"], h2, spare):
        argv = shlex.split(h.spec.argv[-1]) if h.spec.remote else h.spec.argv
        assert argv[argv.index("--nnodes") + 1] == "1:2"
    from rich.console import Console

    from rlctl.views.plan_view import process_table

    console = Console(width=200, record=True)
    console.print(process_table(plan, 200))
    assert re.search(r"learner-2 +learner \(spare\) +2 +h4", console.export_text()), console.export_text()
    assert spare.life.state is ProcState.RESTARTING and spare.life.note == spares.HELD
    assert spare not in table.due(1e12)  # held, whatever the time
    spares.release(table.handles, 100.0)
    assert spare.life.note == spares.WAITING and table.due(100.0) == [spare]
    assert spare.life.state is ProcState.STARTING and spare.life.restarts == 0
    spares.release(table.handles, 101.0)  # once
    assert spare.life.state is ProcState.STARTING
    spares.heard(spare, 130.0)  # as the supervisor's loop hears a process: before the table
    table.heard(spare, SimpleNamespace(role="learner", pid=None, rank=1), 130.0)
    assert spare.life.state is ProcState.RUNNING and spare.life.note.startswith("spare: in the learner group since ")
    table.watch.close()


def test_a_spare_must_be_an_elastic_learner_host_other_than_the_head(tmp_path):
    from rlctl.job.load import JobFileError

    elastic = HOSTS.replace("[logging]\n", "[topology]\nmin_learner_nodes = 1\n\n[logging]\n")
    cases = [
        (elastic.replace('name = "h2"\n', 'name = "h2"\nspare = true\n'),
         r"hosts\[1\].spare: only a learner host can be a spare"),
        (elastic.replace('name = "h1"\nlearner = true\n', 'name = "h1"\nlearner = true\nspare = true\n'),
         r"hosts\[0\].spare: the first learner host is the head"),
        (HOSTS.replace('name = "h2"\n', 'name = "h2"\nlearner = true\nspare = true\n'),
         r"hosts\[1\].spare: a spare learner host needs elastic learners"),
        (elastic.replace('min_learner_nodes = 1', 'min_learner_nodes = 2')
         .replace('name = "h2"\n', 'name = "h2"\nlearner = true\nspare = true\n'),
         r"min_learner_nodes: 2 is more than the job's 1 learner node \(spares aside\)"),
    ]
    for text, why in cases:
        with pytest.raises(JobFileError, match=why):
            spec_of(tmp_path, text)


def test_an_elastic_learner_node_whose_host_ssh_cannot_reach_loses_the_host_at_once(tmp_path, answers):
    """An elastic learner node alone on its host, its session ended by ssh (255) with no restart left: the host is
    lost then and there (probed from now on), not a heartbeat timeout later."""
    from rlctl.supervise.process_table import ProcessTable

    text = HOSTS.replace('name = "h2"\ncollectors = 2\n', 'name = "h2"\nlearner = true\n')
    text = text.replace("[logging]\n", "[topology]\nmin_learner_nodes = 1\nmax_restarts = 0\n\n[logging]\n")
    spec = spec_of(tmp_path, text)
    table = ProcessTable(spec, make_plan(spec, "v-1", str(tmp_path / "run"), 42000), on_restart=lambda name: None)
    node = table.by_name["learner-1"]
    hear(table, 100.0)
    node.popen = subprocess.Popen(["sh", "-c", "exit 255"], stdin=subprocess.PIPE, start_new_session=True)
    node.popen.wait()
    assert table.reap() is None and node.life.state is ProcState.LOST and node.lost_sessions == 1
    assert "h2" in table.watch.lost and "h2" in table.lost_nodes
    said = table.check_hosts(101.0)
    assert len(said) == 1 and re.fullmatch(r"host h2 lost at \S+: ssh cannot reach it", said[0]), said
    answers.up = True
    assert wait_said(table, 102.0)[1] == "learner-1 starts again on h2 and rejoins the learner group"
    table.watch.close()


def test_an_evaluator_that_ssh_cannot_reach_is_lost_not_the_run_and_moves_once_its_host_is_lost(tmp_path, answers):
    """h3's evaluator, its session ended by ssh (255) with no restart left (its restarts run out within seconds of
    the host vanishing, long before the heartbeat timeout): lost, the run goes on; once h3 is lost for its silence
    the evaluator starts on another host with the collectors. A local evaluator's end is no such case."""
    from rlctl.supervise.process_table import ProcessTable

    spec = spec_of(tmp_path, HOSTS.replace("[logging]\n", "[topology]\nmax_restarts = 0\n\n[logging]\n"))
    table = ProcessTable(spec, make_plan(spec, "v-1", str(tmp_path / "run"), 42000), on_restart=lambda name: None)
    evaluator = table.by_name["evaluator-0"]
    assert evaluator.spec.host == "h3" and evaluator.spec.remote
    hear(table, 100.0)
    evaluator.popen = subprocess.Popen(["sh", "-c", "exit 255"], stdin=subprocess.PIPE, start_new_session=True)
    evaluator.popen.wait()
    assert table.reap() is None and evaluator.life.state is ProcState.LOST
    hear(table, 109.0, but="h3")
    said = table.check_hosts(110.5)
    assert len(said) == 1 and "evaluator-0 re-placed on h4" in said[0], said
    assert evaluator.life.state is ProcState.RESTARTING and evaluator.spec.host == "h4"
    table.watch.close()
    local = spec_of(tmp_path, HOSTS.replace('name = "h3"\n', 'name = "h3"\naddress = "localhost"\n')
                    .replace("[logging]\n", "[topology]\nmax_restarts = 0\n\n[logging]\n"))
    table = ProcessTable(local, make_plan(local, "v-1", str(tmp_path / "run"), 42000), on_restart=lambda name: None)
    evaluator = table.by_name["evaluator-0"]
    assert not evaluator.spec.remote
    evaluator.popen = subprocess.Popen(["sh", "-c", "exit 255"], start_new_session=True)
    evaluator.popen.wait()
    end = table.reap()
    assert end is not None and "evaluator-0 exited with code 255" in end.reason, end
    table.watch.close()


def test_a_run_that_fails_for_an_unreached_host_names_the_host_and_every_process_of_it(tmp_path, answers):
    """h1's replay shard out of restarts because ssh never reached h1 (255, no session began): the run fails, and its
    reason names h1 and its learner too, whichever of h1's processes ran out of restarts first. A session that began
    and then ended (255 from a cut connection) says nothing of reaching the host."""
    from rlctl.supervise.process_table import ProcessTable

    spec = spec_of(tmp_path, HOSTS.replace("[logging]\n", "[topology]\nmax_restarts = 0\n\n[logging]\n"))
    table = ProcessTable(spec, make_plan(spec, "v-1", str(tmp_path / "run"), 42000), on_restart=lambda name: None)
    on_h1 = [h.spec.name for h in table.handles if h.spec.host == "h1"]
    assert "learner-0" in on_h1 and "replay-0" in on_h1, on_h1
    shard = table.by_name["replay-0"]
    shard.popen = subprocess.Popen(["sh", "-c", "exit 255"], stdin=subprocess.PIPE, start_new_session=True)
    shard.popen.wait()
    end = table.reap()
    assert end is not None and end.reason.startswith("replay-0 exited with code 255"), end
    assert f"ssh could not reach h1 (1 starts in a row), where {', '.join(on_h1)} ran" in end.reason, end.reason
    table.watch.close()
    table = ProcessTable(spec, make_plan(spec, "v-1", str(tmp_path / "run"), 42000), on_restart=lambda name: None)
    shard = table.by_name["replay-0"]
    shard.pump = SimpleNamespace(session_at=1.0, startup_failure=None, tail=[], join=lambda timeout: None)
    shard.popen = subprocess.Popen(["sh", "-c", "exit 255"], stdin=subprocess.PIPE, start_new_session=True)
    shard.popen.wait()
    end = table.reap()
    assert end is not None and "could not reach" not in end.reason, end.reason
    table.watch.close()


def test_a_session_begun_on_a_host_is_word_from_it_until_a_heartbeat_timeout_later(tmp_path, answers):
    """h2's learner node started again (its ssh session's far side began: rlctl.launch.remote's event) waits
    silently in its rendezvous: h2 is not lost for its processes' silence until a heartbeat timeout after that
    session began, nor at all while the node still starts over a live session. (In CI h2 was taken for lost, its
    new node killed as it joined the head's world, and the head, restarting its rank for it, went silent past the
    timeout.) A session from before a loss arms nothing."""
    import io
    import time

    from rlctl import events
    from rlctl.supervise.process_table import LogPump, ProcessTable

    text = HOSTS.replace('name = "h2"\n', 'name = "h2"\nlearner = true\n')
    spec = spec_of(tmp_path, text.replace("[logging]\n", "[topology]\nmin_learner_nodes = 1\n\n[logging]\n"))
    table = ProcessTable(spec, make_plan(spec, "v-1", str(tmp_path / "run"), 42000), on_restart=lambda name: None)
    node, t0 = table.by_name["learner-1"], time.time()
    hear(table, t0 - 20.0)  # h2 last heard 20 s ago, twice the timeout
    node.pump = LogPump(io.BytesIO(f"rlctl.launch.remote: on vm: x\n{events.line('remote_session', host='vm')}\n"
                                   "Warning: a line of anything\n".encode()), tmp_path / "learner-1.log")
    node.pump.start()
    node.pump.join(5)
    began = node.pump.session_at
    assert began is not None and t0 <= began <= time.time()
    hear(table, began + 9.5, but="h2")
    assert table.check_hosts(began + 9.5) == [] and not table.lost_nodes
    hear(table, began + 10.5, but="h2")
    said = table.check_hosts(began + 10.5)
    assert len(said) == 1 and said[0].startswith("host h2 lost at ") and "for 10s" in said[0], said
    table.watch.sessions_begun(table.handles, began + 11.0)  # the same session, from before the loss
    assert "h2" not in table.watch.last_heard
    table.watch.close()

    # Still starting over a live session (its ssh client runs): h2 answers now, however long the start takes.
    table = ProcessTable(spec, make_plan(spec, "v-1", str(tmp_path / "run"), 42000), on_restart=lambda name: None)
    node = table.by_name["learner-1"]
    hear(table, t0 - 20.0, but="h2")  # h2 unheard, its collectors lost: only the node (its session) speaks for h2
    for h in table.handles:
        if h.spec.host == "h2" and h is not node:
            h.life.lose()
    node.pump = SimpleNamespace(session_at=began)
    node.popen = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert node.life.state is ProcState.STARTING
        for later in (began + 30.0, began + 60.0):
            hear(table, later, but="h2")
            assert table.check_hosts(later) == [] and not table.lost_nodes
    finally:
        node.popen.kill()
        node.popen.wait()
    # Its session gone (a process heard from no longer counts this way either): silent past the timeout, lost.
    hear(table, began + 71.0, but="h2")
    said = table.check_hosts(began + 71.0)
    assert len(said) == 1 and "no word from its processes for 11s" in said[0], said
    table.watch.close()


def hear(table, now: float, but: str = "") -> None:
    """Every process of the table heard from at `now`, but those on host `but`."""
    msg = SimpleNamespace(role="collector", pid=None, rank=0)
    for h in table.handles:
        if h.spec.host != but:
            table.heard(h, msg, now)


def wait_said(table, now: float, timeout: float = 10.0) -> list[str]:
    """What check_hosts says once it has something to say (a probe runs in its own thread)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = table.check_hosts(now)
        if said:
            return said
        time.sleep(0.01)
    raise AssertionError("check_hosts said nothing")


def test_status_and_the_live_view_show_a_lost_hosts_note_only_where_one_was_lost():
    from rich.console import Console

    from rlctl.views.console import hosts_table_rows, live_renderable

    row = {"name": "h3", "remote": True, "via": "ssh", "state": "lost", "processes": 0, "running": 0, "restarts": 0,
           "lost_sessions": 0, "loss": {"lost_at": 1.0, "moved": {"collector-1": "h2"}, "back_at": None},
           "note": "lost at 03:32:07; collector-1 re-placed on h2"}
    ok = {**row, "name": "h2", "state": "ok", "processes": 2, "running": 2, "loss": None, "note": None}
    columns, rows = hosts_table_rows({"host_rows": [ok, row]})
    assert columns[-1] == "note" and rows[1][-1] == row["note"] and rows[0][-1] == ""
    assert "note" not in hosts_table_rows({"host_rows": [ok]})[0]
    console = Console(record=True, width=160)
    console.print(live_renderable({"status": "running", "processes": [], "host_rows": [ok, row]}))
    text = console.export_text()
    assert re.search(r"h3\s+ssh\s+lost\s+0/0\s+0\s+0\s+lost at 03:32:07; collector-1 re-placed on h2\n", text), text


def test_the_learner_worlds_sizes_are_recorded_and_shown_once_it_changed(monkeypatch):
    """Rank 0's heartbeats carry the group's size: each change is recorded (the ranks past a smaller world
    forgotten), and `rlctl status` says "learner world 2 -> 1 (t) -> 2 (t)" once there was one."""
    from rlctl import metric_names as M
    from rlctl.metrics import MetricsHub
    from rlctl.views.console import header_lines

    hub, clock = MetricsHub(), iter([100.0, 160.0, 220.0])
    monkeypatch.setattr("rlctl.metrics.time.time", lambda: next(clock))
    hub.on_heartbeat("learner-1", "learner", {"rank": 1, M.WORLD: 2, M.UPDATES: 5})
    hub.on_heartbeat("learner-0", "learner", {"rank": 0, M.WORLD: 2, M.UPDATES: 5})
    hub.on_heartbeat("learner-0", "learner", {"rank": 0, M.WORLD: 2, M.UPDATES: 9})
    assert hub.learner_worlds == [(100.0, 2)]
    assert not any(line.startswith("learner world") for line in header_lines({"learner_worlds": [[100.0, 2]]}))
    hub.on_heartbeat("learner-0", "learner", {"rank": 0, M.WORLD: 1, M.UPDATES: 12})
    assert hub.learner_worlds == [(100.0, 2), (160.0, 1)] and set(hub.learner_ranks) == {0}
    hub.on_heartbeat("learner-0", "learner", {"rank": 0, M.WORLD: 2, M.UPDATES: 20})
    hub.on_heartbeat("learner-1", "learner", {"rank": 1, M.WORLD: 2, M.UPDATES: 20})
    state = {"learner_worlds": [[t, w] for t, w in hub.learner_worlds]}
    line = next(x for x in header_lines(state) if x.startswith("learner world"))
    assert re.fullmatch(r"learner world 2 -> 1 \(\d\d:\d\d:\d\d\) -> 2 \(\d\d:\d\d:\d\d\)", line), line
    assert set(hub.learner_ranks) == {0, 1}


def test_an_unreachable_learner_host_at_the_start_is_a_warning_that_says_whether_it_waits_as_a_spare(tmp_path,
                                                                                                       monkeypatch,
                                                                                                       capsys):
    """Hosts that SSH cannot reach and that run only an elastic learner node do not stop the run: the warning says
    the node joins the group once its host answers, or, a spare's, waits as the spare."""
    from rlctl.launch import pipeline, preflight

    text = HOSTS.replace('name = "h2"\n', 'name = "h5"\nlearner = true\n\n[[hosts]]\nname = "h2"\n')
    text = text.replace('name = "h4"\n', 'name = "h4"\nlearner = true\nspare = true\n')
    text = text.replace('collectors = 1\n', '')  # h4: the spare's learner node alone
    spec = spec_of(tmp_path, text.replace("[logging]\n", "[topology]\nmin_learner_nodes = 1\n\n[logging]\n"))
    plan = make_plan(spec, "v-1", str(tmp_path / "run"), 42000)
    down = [preflight.HostProblem(h, f"host {h}: cannot connect over SSH", True) for h in ("h5", "h4")]
    monkeypatch.setattr(preflight, "check_hosts", lambda spec, plan: down)
    pipeline.preflight(spec, plan)
    err = capsys.readouterr().err
    assert "host h5: cannot connect over SSH; its learner node joins the learner group once it answers" in err, err
    assert "host h4: cannot connect over SSH; its learner node waits as a spare once it answers" in err, err
