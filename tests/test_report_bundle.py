"""A relay's bundles of its host's control messages (rlctl.roles.report_bundle, rlctl.roles.relay.ControlGather):
merged per process, split below the frame limit, parsed back by the supervisor's one parser, dispatched only for
the relay's own host's processes, and a process behind a restarting relay not taken for hung."""

from __future__ import annotations

import time
from types import SimpleNamespace

import msgpack
import numpy as np
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples, wait_for
from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.net.control import ControlError, parse_bundle
from rlctl.roles.report_bundle import MAX_FRAME_BYTES, MAX_MERGED_EPISODES, ReportBundle, merge_heartbeat
from test_host_loss import hear, spec_of


def heartbeat(sender: str, metrics: dict, pid: int = 7) -> wire.Message:
    return wire.Message("heartbeat", sender, meta={"pid": pid, "metrics": metrics})


def test_heartbeats_of_one_process_merge_to_the_newest_figures_and_every_episode():
    a = {"pid": 7, "metrics": {M.ENV_STEPS: 100, M.ENV_STEPS_PER_S: 5.0, M.EPISODE_RETURNS: [1.0, 2.0],
                               M.EPISODE_LENGTHS: [10, 20]}}
    b = {"pid": 7, "metrics": {M.ENV_STEPS: 250, M.EPISODE_RETURNS: [3.0], M.EPISODE_LENGTHS: [30]}}
    merged = merge_heartbeat(a, b)
    assert merged["metrics"] == {M.ENV_STEPS: 250, M.ENV_STEPS_PER_S: 5.0, M.EPISODE_RETURNS: [1.0, 2.0, 3.0],
                                 M.EPISODE_LENGTHS: [10, 20, 30]}
    assert merge_heartbeat(None, b) is b
    # Not a heartbeat's shape: the newest goes on as it is, for the supervisor's parser to refuse.
    assert merge_heartbeat(a, {"metrics": 5}) == {"metrics": 5}
    many = {"metrics": {M.EPISODE_RETURNS: [0.0] * MAX_MERGED_EPISODES, M.EPISODE_LENGTHS: [1] * MAX_MERGED_EPISODES}}
    last = merge_heartbeat(many, {"metrics": {M.EPISODE_RETURNS: [9.0], M.EPISODE_LENGTHS: [9]}})["metrics"]
    assert len(last[M.EPISODE_RETURNS]) == MAX_MERGED_EPISODES and last[M.EPISODE_RETURNS][-1] == 9.0


def test_a_relay_takes_only_hellos_and_heartbeats_sent_under_the_sender_s_own_key():
    bundle = ReportBundle()
    assert bundle.take(heartbeat("collector-1", {"x": 1.0}), owner="collector-1")
    assert not bundle.take(heartbeat("collector-2", {"x": 1.0}), owner="collector-1")  # another's name
    assert not bundle.take(heartbeat("collector-2", {"x": 1.0}), owner=None)  # a key of no process
    assert not bundle.take(wire.Message("stop", "collector-1"), owner="collector-1")
    assert (bundle.taken, bundle.refused) == (1, 3)
    assert bundle.due(0.0)  # at once: nothing was sent before
    [frame] = bundle.frames(10.0)
    assert not bundle.waiting and not bundle.due(10.1) and bundle.next_at == 10.0 + bundle.interval_s
    reports, bad = parse_bundle({"reports": frame})
    assert bad == 0 and reports == [("heartbeat", "collector-1", {"pid": 7, "metrics": {"x": 1.0}})]


def test_bundles_split_below_the_frame_limit_and_parse_back_whole():
    bundle = ReportBundle()
    returns = [float(i) for i in range(1000)]
    for k in range(300):  # ~18 KB of episodes each: about 5 MB in all
        name = f"collector-{k}"
        bundle.take(wire.Message("hello", name, meta={"pid": k + 1}), owner=name)
        bundle.take(heartbeat(name, {M.EPISODE_RETURNS: returns, M.EPISODE_LENGTHS: [5] * 1000}), owner=name)
    frames = bundle.frames(0.0)
    assert len(frames) > 5 and all(f.dtype == np.uint8 and f.nbytes <= MAX_FRAME_BYTES for f in frames)
    got = [r for f in frames for r in parse_bundle({"reports": f})[0]]
    assert len(got) == 600 and {s for _, s, _ in got} == {f"collector-{k}" for k in range(300)}
    # A process's hello goes before its heartbeat.
    order = [(k, s) for k, s, _ in got]
    assert all(order.index(("hello", s)) < order.index(("heartbeat", s)) for _, s in order)


LEAVES = st.none() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=5) | st.floats()  # what msgpack packs


@settings(max_examples=examples(300), deadline=None)
@given(payload=st.binary(max_size=200) | st.builds(msgpack.packb, st.recursive(
    LEAVES, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=3), c, max_size=3))))
def test_the_bundle_parser_raises_nothing_but_its_own_error(payload):
    try:
        reports, bad = parse_bundle({"reports": np.frombuffer(payload, dtype=np.uint8)})
    except ControlError:
        return
    assert bad >= 0 and all(isinstance(k, str) and isinstance(s, str) for k, s, _ in reports)


def test_a_bundle_without_its_frame_or_with_another_dtype_is_refused():
    for arrays in ({}, {"reports": np.zeros(4, dtype=np.float32)}, {"reports": np.zeros((2, 2), dtype=np.uint8)}):
        try:
            parse_bundle(arrays)
        except ControlError:
            continue
        raise AssertionError(f"{arrays} parsed")


def test_reports_through_a_relay_reach_the_supervisor_and_only_for_the_relay_s_own_host(tmp_path):
    """Real sockets and CURVE: two collectors of h2 and one of h3 send to h2's relay; the supervisor's router takes
    one bundle per interval, dispatches h2's collectors' reports (their episodes merged) and drops h3's."""
    from rlctl.launch.plan import make_plan
    from rlctl.roles.context import ControlClient, RoleContext
    from rlctl.roles.relay import ControlGather
    from rlctl.supervise.control_router import ControlRouter, issue_keys
    from rlctl.supervise.process_table import ProcessTable

    spec = spec_of(tmp_path)
    plan = make_plan(spec, f"b-{tmp_path.name}", str(tmp_path / "run"), 42000)  # its relays' sockets are in /tmp
    table = ProcessTable(spec, plan, on_restart=lambda name: None)
    own, keys = issue_keys(wire.CurveKeys.generate(), plan.processes)
    endpoint = f"ipc://{tmp_path}/control.sock"
    heard: list[tuple[str, str, dict]] = []
    router = ControlRouter(own, endpoint, spec, table.by_name, {
        "hello": lambda h, m: heard.append((h.spec.name, "hello", m.episodes)),
        "heartbeat": lambda h, m: heard.append((h.spec.name, "heartbeat", m.episodes))})
    router.open()
    nets = []

    def client(name: str, control: str) -> ControlClient:
        net = wire.SecureContext(keys[name])
        nets.append(net)
        p = table.by_name[name].spec
        rc = RoleContext(role=p.role, rank=p.rank, host=p.host, run_id="b-1", job=spec,
                         endpoints={"control": control}, checkpoint_dir="", keys=net.keys, binds=p.binds)
        return ControlClient(net, rc)

    relay = table.by_name["relay-0"].spec
    assert relay.host == "h2" and [table.relay_of(table.by_name[n]) for n in ("collector-0", "collector-2")] == [
        table.by_name["relay-0"], table.by_name["relay-1"]]
    via = relay.binds["control"]
    gather = ControlGather(wire.SecureContext(keys["relay-0"]), via, client("relay-0", endpoint))
    nets.append(gather.net)
    try:
        # collector-2 is h3's (it reports through relay-1), yet sends to h2's relay.
        senders = {n: client(n, via) for n in ("collector-0", "collector-1", "collector-2")}
        for n, c in senders.items():
            c.heartbeat({M.ENV_STEPS: 10, M.EPISODE_RETURNS: [1.0], M.EPISODE_LENGTHS: [3]})
            c.heartbeat({M.ENV_STEPS: 20, M.EPISODE_RETURNS: [2.0], M.EPISODE_LENGTHS: [4]})

        def gathered() -> bool:
            gather.take_waiting()
            return gather.bundle.taken >= 9  # 3 hellos, 6 heartbeats

        wait_for(gathered, 10, interval=0.01, what="the reports at the relay")
        wait_for(lambda: router.drain(50) or ("relay-0", "hello", {}) in heard, 10, interval=0.01,
                 what="the relay's own hello")
        received = router.received
        gather.send_due(time.monotonic())
        wait_for(lambda: router.drain(50) or router.received > received and
                 sum(k == "heartbeat" for _, k, _ in heard) >= 2, 10, interval=0.01, what="the bundle")
        router.drain(50)
        assert router.received == received + 1  # one message for all of them
        mine = sorted((n, k, e.get(M.EPISODE_RETURNS)) for n, k, e in heard if n.startswith("collector"))
        assert mine == [("collector-0", "heartbeat", [1.0, 2.0]), ("collector-0", "hello", None),
                        ("collector-1", "heartbeat", [1.0, 2.0]), ("collector-1", "hello", None)]
        assert router.dropped == 2  # collector-2 is h3's: its hello and heartbeat are dropped
        # A bundle sent with a collector's key (not a relay's) is dropped whole.
        direct = client("collector-0", endpoint)  # its hello reaches the supervisor as any process's would
        wait_for(lambda: router.drain(50) or len(heard) == 6, 10, interval=0.01, what="collector-0's hello")
        forged = ReportBundle()
        forged.take(heartbeat("collector-1", {M.ENV_STEPS: 99}), owner="collector-1")
        direct.send("bundle", {}, {"reports": forged.frames(0.0)[0]})
        wait_for(lambda: router.drain(50) or router.dropped == 3, 10, interval=0.01, what="the forged bundle dropped")
        assert len(heard) == 6
    finally:
        router.close()
        for net in nets:
            net.close()


def test_a_process_behind_a_restarting_relay_is_not_taken_for_hung(tmp_path):
    """Its reports wait for the relay: silence counts neither while the relay is down nor before its new start."""
    from rlctl.launch.plan import make_plan
    from rlctl.supervise.process_table import ProcessTable
    from rlctl.supervise.restart_policy import Event, ProcState

    spec = spec_of(tmp_path)  # heartbeat_timeout_s = 10
    table = ProcessTable(spec, make_plan(spec, "v-1", str(tmp_path / "run"), 42000), on_restart=lambda n: None)
    hear(table, 100.0)
    relay, behind, direct = (table.by_name[n] for n in ("relay-0", "collector-0", "replay-0"))
    assert table.relay_of(behind) is relay and table.relay_of(direct) is None
    relay.life.fire(Event.ENDED)  # the relay died
    assert relay.life.state is ProcState.RESTARTING
    killed = []
    for h in table.handles:
        h.signal_group = lambda sig, h=h: killed.append(h.spec.name)
    table.check_hung(120.0)
    assert "collector-0" not in killed and "collector-1" not in killed  # behind the dead relay
    assert "replay-0" in killed and "collector-4" in killed  # silent, and reporting to the supervisor themselves
    # h3's relay was silent too: killed, and its processes wait for its next start.
    assert "relay-1" in killed and "collector-2" not in killed
    # The relay is back at 125: its host's processes are silent from then on, not from 100.
    relay.life.fire(Event.START)
    relay.started_at = 125.0
    table.heard(relay, SimpleNamespace(role="relay", pid=None, rank=0), 126.0)
    killed.clear()
    table.check_hung(130.0)
    assert "collector-0" not in killed
    table.check_hung(135.5)
    assert "collector-0" in killed and "collector-1" in killed
    table.watch.close()
