"""The control channel's parser, and a running supervisor fed malformed control messages."""

from __future__ import annotations

import math
import time

import msgpack
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples, member_keys, only_run, read_state, run_cli, small_job, wait_for
from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.net.control import ControlError, parse_control


def test_a_valid_heartbeat_parses_to_typed_figures():
    msg = parse_control("heartbeat", "collector-3", {"pid": 42, "rank": 3, "metrics": {
        "env_steps": 10, M.ENV_STEPS_PER_S: 5.5, M.EPISODE_RETURNS: [1.0, float("inf"), 2], M.PARAM_DIGEST: "ab"}})
    assert (msg.role, msg.rank, msg.pid, msg.sender) == ("collector", 3, 42, "collector-3")
    assert msg.metrics == {"env_steps": 10, M.ENV_STEPS_PER_S: 5.5, M.PARAM_DIGEST: "ab"}
    assert msg.episodes == {M.EPISODE_RETURNS: [1.0, 2.0]}  # the infinite return is left out


@pytest.mark.parametrize("kind,sender,meta", [
    ("heartbeat", "collector-0", {"metrics": {"env_steps": "x"}}),
    ("heartbeat", "learner-0", {"rank": "x", "metrics": {}}),
    ("heartbeat", "collector-0", {"metrics": {M.EPISODE_RETURNS: 5}}),
    ("heartbeat", "learner-²", {"metrics": {}}),
    ("heartbeat", "collector-0", {"rank": 1, "metrics": {}}),  # a rank that is not the sender's
    ("heartbeat", "collector-0", {"pid": -4, "metrics": {}}),
    ("heartbeat", "collector-0", {"metrics": {"x": [1, 2]}}),
    ("heartbeat", "collector-0", {"metrics": {"x": 1 << 70}}),
    ("heartbeat", "collector-0", {"metrics": {"": 1}}),
    ("heartbeat", "collector-0", {"metrics": {M.EPISODE_RETURNS: ["a"]}}),
    ("heartbeat", "collector-0", {"metrics": 7}),
    ("heartbeat", "collector-0", []),
    ("stop", "collector-0", {}),
    ("heartbeat", "supervisor", {}),
    ("heartbeat", "collector-01234567", {}),
])
def test_malformed_control_messages_are_refused(kind, sender, meta):
    with pytest.raises(ControlError):
        parse_control(kind, sender, meta)


def test_non_finite_figures_are_left_out():
    msg = parse_control("heartbeat", "evaluator-0", {"metrics": {M.EVAL_RETURN_MEAN: float("inf"),
                                                                 M.EVAL_STREAK: 3, "x": float("nan")}})
    assert msg.metrics == {M.EVAL_STREAK: 3}


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20)


@settings(max_examples=examples(500), deadline=None)
@given(kind=st.sampled_from(["hello", "heartbeat", "stop", ""]) | st.text(max_size=10),
       sender=st.sampled_from(["collector-0", "learner-1", "evaluator-0", "replay-2"]) | st.text(max_size=20),
       meta=st.dictionaries(st.sampled_from(["pid", "rank", "metrics"]) | st.text(max_size=5), json_like, max_size=4)
       | json_like)
def test_the_control_parser_raises_nothing_but_its_own_error(kind, sender, meta):
    try:
        msg = parse_control(kind, sender, meta)
    except ControlError:
        return
    for value in msg.metrics.values():
        assert isinstance(value, str) or math.isfinite(value)


@pytest.mark.slow  # end to end with real processes: the slow tier
def test_a_running_supervisor_drops_and_counts_malformed_control_messages(tmp_path):
    """Each malformed heartbeat once crashed the supervisor (and then nothing was stopped); it now drops and counts
    them, and neither a forged infinite evaluator return nor a finite one sent with another process's key (a
    spoofed evaluator-0) ends the run as finished."""
    job = small_job(tmp_path, name="hostile", stop="wall_s = 12\neval_return = 1e9")
    runs = tmp_path / "runs"
    env = {"RLCTL_RUNS_DIR": str(runs)}
    run_id = run_cli(["run", str(job), "--detach"], env=env, timeout=30).stdout.split()[0]
    run_dir = runs / run_id
    wait_for(lambda: read_state(run_dir).get("status") == "running", 60, what="a running supervisor")
    plan = __import__("json").loads((run_dir / "plan.json").read_text())
    keys = member_keys(plan["run_id"], "learner", 0)
    net = wire.SecureContext(keys)
    sock = net.client(zmq.DEALER, plan["endpoints"]["control"])
    bad = [
        ("heartbeat", "collector-0", {"metrics": {"env_steps": "x"}}),
        ("heartbeat", "learner-0", {"rank": "x", "metrics": {}}),
        ("heartbeat", "collector-0", {"metrics": {M.EPISODE_RETURNS: 5}}),
        ("heartbeat", "learner-²", {"metrics": {}}),
    ]
    for kind, sender, meta in bad:
        wire.send(sock, kind, sender, 0, meta)
    sock.send_multipart([msgpack.packb({"k": 1}), b"junk"])
    wire.send(sock, "heartbeat", "evaluator-0", 0, {"metrics": {M.EVAL_RETURN_MEAN: float("inf"), M.EVAL_STREAK: 99}})
    # Well-formed, but sent with another process's key: a sender is who CURVE authenticated, not what it claims.
    wire.send(sock, "heartbeat", "evaluator-0", 0, {"metrics": {M.EVAL_RETURN_MEAN: 2e9, M.EVAL_STREAK: 99}})
    wait_for(lambda: read_state(run_dir)["metrics"].get(M.NET_DROPPED, 0) >= len(bad) + 3, 20, what="drops counted")
    net.close()
    state = wait_for(lambda: read_state(run_dir).get("status") in ("finished", "failed", "stopped")
                     and read_state(run_dir), 60, what="the run to end")
    assert state["status"] == "finished" and state["stopped_by"]["criterion"] == "wall_s", state["exit_reason"]
    assert only_run(runs) == run_dir


def test_every_role_may_say_hello_and_send_heartbeats():
    """A process of any role (rlctl.role_names.ROLES) is heard: the parser once spelled the roles out itself, and a
    new role's hellos were refused."""
    from rlctl.role_names import ROLES

    for role in sorted(ROLES):
        for kind in ("hello", "heartbeat"):
            msg = parse_control(kind, f"{role}-3", {"pid": 5, "rank": 3, "metrics": {"x": 1.0}})
            assert (msg.kind, msg.role, msg.rank) == (kind, role, 3)


def test_a_flood_of_control_messages_does_not_hold_up_the_supervisor_s_loop(tmp_path, monkeypatch):
    """The router handles messages for at most its budget per pass and leaves the rest queued: before, messages
    that came faster than they were handled kept the loop in drain (no state.json, no reaping) while ZeroMQ
    queued them by the gigabyte (1,000 simulated collectors on 16 hosts, bench/control_plane.py --no-relays)."""
    from rlctl.supervise import control_router
    from rlctl.supervise.control_router import ControlRouter

    keys = wire.CurveKeys.generate()
    router = ControlRouter(keys, f"ipc://{tmp_path}/control.sock", None, {}, {})
    router.open()
    net = wire.SecureContext(keys)
    try:
        sock = net.client(zmq.DEALER, f"ipc://{tmp_path}/control.sock", sndhwm=0)
        for _ in range(1000):
            wire.send(sock, "heartbeat", "collector-0", 0, {"metrics": {}})
        monkeypatch.setattr(control_router, "DRAIN_BUDGET_S", 0.0)
        wait_for(lambda: router.socket.poll(10), 10, interval=0.01, what="the first message")
        time.sleep(0.5)  # the rest arrive
        router.drain(0)
        assert router.received == 64  # one batch, then the budget (none here) is checked
        monkeypatch.setattr(control_router, "DRAIN_BUDGET_S", 60.0)
        router.drain(0)
        assert router.received == 1000 and router.dropped == 1000  # no process of that name: each dropped
    finally:
        net.close()
        router.close()


def test_the_loop_s_checks_wait_for_their_interval_while_messages_are_handled_in_between(tmp_path):
    """Supervisor._listen_until: every message that arrives is handled, and the pass's checks (which walk every
    process) come at the interval, not once per arriving message: at 1,000 collectors behind 16 relays they ran
    ~50 times a second and were half the supervisor's CPU."""
    from types import SimpleNamespace

    from rlctl.supervise.control_router import ControlRouter
    from rlctl.supervise.loop import Supervisor

    keys = wire.CurveKeys.generate()
    router = ControlRouter(keys, f"ipc://{tmp_path}/control.sock", None, {}, {})
    router.open()
    net = wire.SecureContext(keys)
    pings = []
    loop = SimpleNamespace(router=router, stop_signals=0, table=SimpleNamespace(ping_sessions=lambda: pings.append(1)))
    try:
        sock = net.client(zmq.DEALER, f"ipc://{tmp_path}/control.sock", sndhwm=0)
        for _ in range(200):
            wire.send(sock, "heartbeat", "collector-0", 0, {"metrics": {}})
        wait_for(lambda: router.socket.poll(10), 10, interval=0.01, what="the first message")
        t0 = time.monotonic()
        Supervisor._listen_until(loop, t0 + 0.3)
        took = time.monotonic() - t0
        assert 0.3 <= took < 1.0 and router.received == 200 and pings == [1]
        loop.stop_signals = 1  # a signal ends the wait at once
        t0 = time.monotonic()
        Supervisor._listen_until(loop, t0 + 5)
        assert time.monotonic() - t0 < 0.1
    finally:
        net.close()
        router.close()


def test_a_learner_rank_is_the_node_its_key_was_given_to_in_an_elastic_world(tmp_path):
    """Ranks are numbered per rendezvous round: in an elastic world of three learner nodes where node 1 left (or
    node 2 is a spare that took its place), rank 1 runs on node 2 and sends with node 2's key; its messages are
    node 2's. A fixed world's rank 1 is node 1's, and node 2's key cannot speak for it."""
    from types import SimpleNamespace

    from rlctl.job.load import load_job
    from rlctl.supervise.control_router import ControlRouter

    hosts = "".join(f'\n[[hosts]]\nname = "h{i}"\naddress = "10.0.0.{i}"\nlearner = true\ncollectors = 1\n'
                    for i in range(1, 4))
    base = '[job]\nname = "r"\n\n[env]\nid = "CartPole-v1"\n\n[algorithm]\nname = "ppo"\n\n[topology]\n'
    names = ["learner-0", "learner-1", "learner-2"]
    keys = wire.CurveKeys.generate()
    pairs = {n: zmq.curve_keypair() for n in names}
    owned = wire.CurveKeys(keys.server_public, keys.server_secret, keys.client_public, keys.client_secret,
                           tuple(cp for cp, _ in pairs.values()), tuple(names))
    by_name = {n: SimpleNamespace(spec=SimpleNamespace(name=n)) for n in names}
    hello = parse_control("hello", "learner-1", {"pid": 9, "role": "learner", "rank": 1, "host": "h3"})
    for elastic, node in ((True, "learner-2"), (False, None)):
        path = tmp_path / f"{elastic}.toml"
        path.write_text(base + ("min_learner_nodes = 1\n" if elastic else "") + hosts)
        router = ControlRouter(owned, "tcp://127.0.0.1:1", load_job(path), by_name, {})
        peer = pairs["learner-2"][0].decode()
        if node:
            assert router._sender(hello, peer) is by_name[node]
        else:
            with pytest.raises(ControlError, match="learner-1 sent with the key of learner-2"):
                router._sender(hello, peer)
