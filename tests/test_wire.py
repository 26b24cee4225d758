"""Message framing, keys, and a real replay shard that survives bad bytes and strangers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples, free_ports, small_job
from rlctl.net import wire


def test_round_trip_is_zero_copy_views_with_header_fields():
    arrays = {"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "action": np.array([1, 0, 1]),
              "empty": np.zeros((0, 4), dtype=np.uint8)}
    frames = wire.encode("experience", "collector-0", 7, {"n": 3}, arrays)
    msg = wire.decode([bytes(f) for f in frames])
    assert (msg.kind, msg.sender, msg.version, msg.meta) == ("experience", "collector-0", 7, {"n": 3})
    for name, arr in arrays.items():
        np.testing.assert_array_equal(msg.arrays[name], arr)
        assert msg.arrays[name].dtype == arr.dtype
    # The sent frames are the arrays' own memory, not copies.
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.float32), arrays["obs"])


@pytest.mark.parametrize("frames", [
    [],
    [msgpack.packb({"k": "x", "s": "", "v": 0, "m": {}, "a": [["obs", ["float32"], [1]]]}), b"\0" * 4],  # bench/fuzz.py
    [b"\xc1"],
    [msgpack.packb([1, 2, 3])],
    [msgpack.packb({"k": 1, "s": "", "v": 0, "m": {}, "a": []})],
    [msgpack.packb({"k": "x", "s": "", "v": 0, "m": {}, "a": [["a", "float32", [2]]]})],  # frame missing
    [msgpack.packb({"k": "x", "s": "", "v": 0, "m": {}, "a": [["a", "float32", [2]]]}), b"\x00" * 7],  # size
    [msgpack.packb({"k": "x", "s": "", "v": 0, "m": {}, "a": [["a", "object", [1]]]}), b"\x00" * 8],  # dtype
    [msgpack.packb({"k": "x", "s": "", "v": 0, "m": {}, "a": [["a", "float32", [-1]]]}), b""],  # shape
    [msgpack.packb({"k": "x", "s": "", "v": 0, "m": {}, "a": []}), b"extra"],
    [b"\x80" * (wire.MAX_HEADER_BYTES + 1)],
    # Dimensions whose product overflows int64 to 0 must not pass the size check with an empty frame.
    [msgpack.packb({"k": "x", "s": "", "v": 0, "m": {}, "a": [["a", "uint8", [2**32, 2**32]]]}), b""],
    # msgpack's true is an int to isinstance: as a dimension it made numpy raise TypeError, which failed a run.
    [msgpack.packb({"k": "x", "s": "", "v": 0, "m": {}, "a": [["x", "float32", [True]]]}), b"\0" * 4],
    [msgpack.packb({"k": "x", "s": "", "v": True, "m": {}, "a": []})],
    # Empty, so the size check passes, but no array numpy can shape (it raised ValueError from reshape).
    [msgpack.packb({"k": "x", "s": "", "v": 0, "m": {}, "a": [["a", "uint8", [2**39, 2**39, 0]]]}), b""],
])
def test_malformed_frames_raise_wire_error(frames):
    with pytest.raises(wire.WireError):
        wire.decode(frames)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=4))
def test_random_bytes_never_raise_anything_but_wire_error(frames):
    try:
        wire.decode(frames)
    except wire.WireError:
        pass


def test_keys_travel_as_one_env_string():
    keys = wire.CurveKeys.generate()
    assert wire.CurveKeys.from_env(keys.to_env()) == keys
    with pytest.raises(RuntimeError, match="RLCTL_CURVE_KEYS"):
        wire.CurveKeys.from_env("nope")


def test_replay_shard_drops_malformed_and_unauthenticated_messages_and_keeps_running(tmp_path):
    from rlctl.job.load import load_job
    from rlctl.job.resolved import resolved_dict
    from rlctl.job.toml_writer import dumps_toml

    job = tmp_path / "job.toml"
    small = small_job(tmp_path)
    small.write_text(small.read_text().replace("min_size = 200", "min_size = 1"))
    job.write_text(dumps_toml(resolved_dict(load_job(small))))
    control_port, exp_port, smp_port = free_ports(3)
    keys = wire.CurveKeys.generate()
    exp_ep, smp_ep = f"tcp://127.0.0.1:{exp_port}", f"tcp://127.0.0.1:{smp_port}"
    env = {**os.environ, "RLCTL_ROLE": "replay", "RLCTL_RANK": "0", "RLCTL_RUN_ID": "t", "RLCTL_JOB": str(job),
           "RLCTL_ENDPOINTS": json.dumps({"control": f"tcp://127.0.0.1:{control_port}",
                                          "replay": [{"experience": exp_ep, "sample": smp_ep}]}),
           "RLCTL_BINDS": json.dumps({"experience": exp_ep, "sample": smp_ep}), wire.KEYS_ENV: keys.to_env()}
    net = wire.SecureContext(keys)
    control = net.server(zmq.ROUTER, f"tcp://127.0.0.1:{control_port}")
    proc = subprocess.Popen([sys.executable, "-m", "rlctl.roles.replay"], env=env)
    stranger = wire.SecureContext(wire.CurveKeys.generate())
    try:
        push = net.client(zmq.PUSH, exp_ep)
        good = {"obs": np.zeros((5, 4), np.float32), "action": np.zeros(5, np.int64),
                "reward": np.ones(5, np.float32), "next_obs": np.zeros((5, 4), np.float32),
                "discount": np.ones(5, np.float32), "priority": np.ones(5, np.float32)}
        # The first batch may not set the layout: one that differs from the job's env spaces is dropped too.
        wire.send(push, "experience", "x", 0, None, {**good, "obs": np.zeros((5, 3), np.float32)})
        push.send_multipart([b"not msgpack at all"])
        push.send_multipart([msgpack.packb({"k": "experience", "s": "x", "v": 0, "m": {}, "a": [["obs", "float32", [5, 4]]]}), b"1"])
        wire.send(push, "experience", "x", 0, None, {"obs": np.zeros((5, 4), np.float32)})  # no priority
        wire.send(push, "experience", "x", 0, None, {**good, "priority": np.float32(1.0)})  # 0-d priority
        wire.send(push, "experience", "x", 0, None, {**good, "": np.zeros(5, np.float32)})  # empty field name
        wire.send(push, "experience", "x", 0, None, {**good, "action": np.zeros(5, np.int32)})  # wrong dtype
        wire.send(push, "experience", "x", 0, None, good)
        wire.send(push, "experience", "x", 0, None, {**good, "reward": np.ones(4, np.float32)})  # ragged
        wire.send(push, "experience", "x", 0, None, {**good, "obs": np.zeros((5, 3), np.float32)})  # layout changed
        push.send_multipart([msgpack.packb({"k": "experience", "s": "x", "v": 0, "m": {},
                                            "a": [["obs", "float32", [True]]]}), b"\0" * 4])  # crashed the shard
        wire.send(push, "experience", "x", 0, None, {**good, "reward": np.full(5, np.nan, np.float32)})  # NaN
        wire.send(push, "experience", "x", 0, None, {**good, "next_obs": np.full((5, 4), np.inf, np.float32)})
        intruder = stranger.client(zmq.PUSH, exp_ep)
        wire.send(intruder, "experience", "evil", 0, None, good)
        deadline, metrics = time.time() + 60, {}
        while time.time() < deadline:
            if control.poll(200):
                _, msg = wire.recv(control, routed=True)
                metrics = msg.meta.get("metrics") or metrics
                if metrics.get("net/dropped", 0) >= 12 and metrics.get("net/refused", 0) >= 1:
                    break
        assert metrics.get("net/dropped") == 12, metrics
        assert metrics.get("net/refused", 0) >= 1, metrics
        assert metrics.get("replay/size") == 5, metrics
        assert proc.poll() is None, "the shard must keep running"
        # And it still serves: a learner-style request gets the good batch back.
        dealer = net.client(zmq.DEALER, smp_ep)
        wire.send(dealer, "sample", "learner-0", 0, {"n": 3})
        assert dealer.poll(10000)
        _, batch = wire.recv(dealer)
        assert batch.kind == "batch" and batch.arrays["obs"].shape == (3, 4) and "keys" in batch.arrays
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        stranger.close()
        net.close()
    assert proc.returncode == 0


def _rollout(info, T: int, n_envs: int) -> dict[str, np.ndarray]:
    from rlctl.algos.onpolicy.actor import RolloutBuffer

    a = RolloutBuffer(T, n_envs, info).arrays
    rng = np.random.default_rng(0)
    a["obs"][:] = rng.normal(size=a["obs"].shape)
    a["value"][:] = 0.0
    a["action"][:] = rng.integers(0, 2, size=a["action"].shape)
    a["logp"][:] = np.log(0.5)
    a["reward"][:] = 1.0
    a["terminated"][:] = False
    a["done"][:] = False
    a["valid"][:] = True
    return a


@contextlib.contextmanager
def _ppo_learner(tmp_path, ranks: int):
    """A real PPO learner (torchrun, `ranks` ranks, two collectors in the job) started as the plan would, with the
    test playing the supervisor's control ROUTER; yields its sockets, endpoints and one valid rollout."""
    from rlctl.envs import probe_space_info
    from rlctl.job.load import validate_job
    from rlctl.job.resolved import resolved_dict
    from rlctl.job.toml_writer import dumps_toml

    spec = validate_job({"job": {"name": "t"}, "env": {"id": "CartPole-v1", "envs_per_collector": 2},
                         "algorithm": {"name": "ppo", "rollout_len": 8, "epochs": 1, "minibatches": 1},
                         "topology": {"collectors": 2, "evaluator": False, "learner_procs": ranks}})
    job = tmp_path / "job.toml"
    job.write_text(dumps_toml(resolved_dict(spec)))
    control_port, weights_port, *rollout_ports = free_ports(2 + ranks)
    keys = wire.CurveKeys.generate()
    weights_ep = f"tcp://127.0.0.1:{weights_port}"
    rollouts = [f"tcp://127.0.0.1:{port}" for port in rollout_ports]
    env = {**os.environ, "RLCTL_ROLE": "learner", "RLCTL_RANK": "0", "RLCTL_RUN_ID": "t", "RLCTL_JOB": str(job),
           "RLCTL_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "RLCTL_ENDPOINTS": json.dumps({"control": f"tcp://127.0.0.1:{control_port}", "weights": weights_ep,
                                          "replay": [], "rollouts": rollouts}),
           "RLCTL_BINDS": json.dumps({"weights": weights_ep, **{f"rollouts-{r}": ep for r, ep in enumerate(rollouts)}}),
           wire.KEYS_ENV: keys.to_env()}
    net = wire.SecureContext(keys)
    control = net.server(zmq.ROUTER, f"tcp://127.0.0.1:{control_port}")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                             str(ranks), "-m", "rlctl.roles.learner"], env=env, start_new_session=True)
    try:
        yield SimpleNamespace(proc=proc, net=net, control=control, weights=weights_ep, rollouts=rollouts,
                              good=_rollout(probe_space_info(spec.env), 8, 2))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        net.close()


@pytest.mark.slow  # end to end with real processes: the slow tier
def test_rollout_learner_counts_stale_and_malformed_rollouts_and_keeps_running(tmp_path):
    metrics: dict = {}
    identity: list = []
    with _ppo_learner(tmp_path, ranks=1) as learner:
        control, good, rollout_ep = learner.control, learner.good, learner.rollouts[0]

        def until(pred, what):
            nonlocal metrics, identity
            deadline = time.time() + 60
            while time.time() < deadline:
                if control.poll(200):
                    identity, msg = wire.recv(control, routed=True)
                    metrics = (msg.meta.get("metrics") or metrics) if msg.kind == "heartbeat" else metrics
                    if pred(metrics):
                        return
            pytest.fail(f"{what}: {metrics}")

        stranger = wire.SecureContext(wire.CurveKeys.generate())
        try:
            sub = learner.net.client(zmq.SUB, learner.weights, subscribe=b"")
            push = learner.net.client(zmq.PUSH, rollout_ep)
            until(lambda m: "learner/updates" in m, "learner never reported")
            ragged = {**good, "reward": np.ones((8, 3), np.float32)}
            wire.send(push, "rollout", "collector-0", 0, None, ragged)
            wire.send(push, "rollout", "collector-0", 0, None, {k: v for k, v in good.items() if k != "logp"})
            push.send_multipart([b"not msgpack at all"])
            intruder = stranger.client(zmq.PUSH, rollout_ep)  # kept: a dropped socket closes before its handshake
            wire.send(intruder, "rollout", "collector-1", 0, None, good)  # wrong keys
            wire.send(push, "rollout", "collector-²", 0, None, good)  # not an ASCII rank: int() once crashed on it
            wire.send(push, "rollout", "collector-1", 0, None, {**good, "action": np.full_like(good["action"], 7)})
            poisoned = {**good, "obs": good["obs"].copy(), "reward": good["reward"].copy()}
            poisoned["obs"][0, 0, 0], poisoned["reward"][-1, -1] = np.nan, np.inf  # one update: every weight NaN
            wire.send(push, "rollout", "collector-1", 0, None, poisoned)
            # One PPO round needs version 0 from both of this rank's collectors.
            wire.send(push, "rollout", "collector-0", 0, None, good)
            wire.send(push, "rollout", "collector-1", 0, None, good)
            until(lambda m: m.get("learner/updates") == 1, "no update after a full round")
            wire.send(push, "rollout", "collector-0", 0, None, good)  # version 0 again: now stale
            until(lambda m: m.get("learner/rollouts_dropped") == 1 and m.get("net/dropped") == 6
                  and m.get("net/refused", 0) >= 1, "stale/malformed/refused not counted")
            assert learner.proc.poll() is None, "the learner must keep running"
            newest = None
            while sub.poll(2000):
                _, newest = wire.recv(sub)
                if newest.version >= 1:
                    break
            assert newest is not None and newest.version == 1 and newest.kind == "weights"
            # Stopped as the supervisor stops learners: a control-channel `stop`, then a final checkpoint.
            wire.send(control, "stop", "supervisor", 0, {}, prefix=identity)
            learner.proc.wait(timeout=30)
        finally:
            stranger.close()
    assert learner.proc.returncode == 0
    assert (tmp_path / "ckpt" / "latest.pt").is_file()
    import torch

    from rlctl.checkpoint import load_checkpoint

    weights = load_checkpoint(tmp_path / "ckpt" / "latest.pt")["model"]
    assert all(torch.isfinite(t).all() for t in weights.values()), "the NaN rollout reached the weights"


@pytest.mark.slow  # end to end with real processes: the slow tier
def test_two_rank_learner_keeps_publishing_weights_for_a_collector_that_subscribes_late(tmp_path):
    # Rank 0 gets its collector's rollout at once and waits in the ranks' stop agreement for rank 1, whose collector
    # subscribed after every publication so far: rank 0 must keep re-publishing or both ranks wait forever.
    def weights_version(sub, at_least: int, timeout_s: float) -> int:
        """The first published version >= at_least (-1 if none arrives in time)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if sub.poll(100):
                _, msg = wire.recv(sub)
                if msg.kind == "weights" and msg.version >= at_least:
                    return msg.version
        return -1

    identities: dict[str, list] = {}
    with _ppo_learner(tmp_path, ranks=2) as learner:
        net, control, good = learner.net, learner.control, learner.good
        deadline = time.time() + 90
        while len(identities) < 2 and time.time() < deadline:
            if control.poll(200):
                ident, msg = wire.recv(control, routed=True)
                identities[msg.sender] = ident
        assert set(identities) == {"learner-0", "learner-1"}
        early = net.client(zmq.SUB, learner.weights, subscribe=b"")
        assert weights_version(early, 0, 30) == 0
        # Kept in variables: a dropped socket closes at once (linger 0) and takes its unsent message with it.
        push0, push1 = net.client(zmq.PUSH, learner.rollouts[0]), net.client(zmq.PUSH, learner.rollouts[1])
        wire.send(push0, "rollout", "collector-0", 0, None, good)
        time.sleep(3.0)  # rank 0 is now waiting for rank 1; its re-publishing has backed off to once a second
        late = net.client(zmq.SUB, learner.weights, subscribe=b"")
        assert weights_version(late, 0, 10) == 0, "rank 0 stopped publishing while it waited"
        wire.send(push1, "rollout", "collector-1", 0, None, good)
        assert weights_version(late, 1, 30) == 1, "the round did not complete"
        for ident in identities.values():
            wire.send(control, "stop", "supervisor", 0, {}, prefix=ident)
        learner.proc.wait(timeout=60)
    assert learner.proc.returncode == 0


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


SENDER_CHILD = r'''
import os, sys, zmq
from rlctl.net import wire
keys = wire.CurveKeys.from_env()
net = wire.SecureContext(keys)
push = net.client(zmq.PUSH, sys.argv[1], linger=0)
dropped = push.get_monitor_socket(zmq.EVENT_DISCONNECTED)
push.send(b"\0" * (256 << 20))  # one 256 MB frame
# The receiver drops the connection once it has read the frame's size; exit 0 when it has, 3 if it never does.
os._exit(0 if dropped.poll(30_000) else 3)
'''


def test_an_oversized_frame_is_refused_before_it_is_allocated(tmp_path):
    """A PULL socket with the job's limit (ZMQ_MAXMSGSIZE) drops the connection of a peer sending a 256 MB frame:
    the receiver's memory does not grow by the frame's size."""
    keys = wire.CurveKeys.generate()
    net = wire.SecureContext(keys)
    ep = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    pull = net.server(zmq.PULL, ep, maxmsgsize=1 << 20)
    before = _rss_bytes()
    child = subprocess.Popen([sys.executable, "-c", SENDER_CHILD, ep], env={**os.environ, wire.KEYS_ENV: keys.to_env()})
    try:
        code = child.wait(timeout=60)
        got = pull.poll(100)
        grew = _rss_bytes() - before
    finally:
        child.kill()
        child.wait()
        net.close()
    assert code == 0, "the receiver did not drop the sender's connection"
    assert not got
    assert grew < 64 << 20, grew


def _check(n_actions: int = 2, frame_stack: int = 0):
    """A rollout inbox's validator (of 4-step rollouts: of 3-float observations, or of 2-frame 2 x 3 stacks)."""
    from rlctl.algos.onpolicy.actor import rollout_layout
    from rlctl.envs import SpaceInfo
    from rlctl.datapaths.rollout_source import RolloutCheck

    info = SpaceInfo((2, 2, 3), "uint8", n_actions) if frame_stack else SpaceInfo((3,), "float32", n_actions)
    return RolloutCheck(rollout_layout(4, info), n_actions, frame_stack)


array_specs = st.tuples(st.sampled_from(sorted(wire.ALLOWED_DTYPES)),
                        st.lists(st.integers(0, 6), min_size=0, max_size=3))


@settings(max_examples=examples(300), deadline=None)
@given(sender=st.text(max_size=14) | st.sampled_from(["collector-0", "collector-²", "collector-1"]),
       fields=st.dictionaries(st.sampled_from(["obs", "value", "action", "logp", "reward", "terminated", "done",
                                               "valid", "frames", "obs_frame", "", "x"]), array_specs, max_size=9),
       fill=st.integers(-5, 5), frame_stack=st.sampled_from([0, 2]))
def test_the_rollout_validator_raises_nothing_on_any_decoded_message(sender, fields, fill, frame_stack):
    arrays = {name: np.full(shape, fill).astype(dtype) for name, (dtype, shape) in fields.items()}
    msg = wire.decode([bytes(f) for f in wire.encode("rollout", sender, 0, None, arrays)])
    assert _check(frame_stack=frame_stack)(msg) in (True, False)


header_values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
                             | st.sampled_from(["float32", "int64", "object", "experience"]),
                             lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                          max_size=3), max_leaves=12)


@settings(max_examples=examples(500), deadline=None)
@given(header=st.dictionaries(st.sampled_from(["k", "s", "v", "m", "a"]), header_values, max_size=5),
       frames=st.lists(st.binary(max_size=64), max_size=3))
def test_any_header_the_decoder_is_given_raises_nothing_but_wire_error(header, frames):
    """Structured headers (lists where strings belong, lying array specs) reach deeper than random bytes do: a list
    as an array's dtype once raised TypeError (found by bench/fuzz.py)."""
    try:
        wire.decode([msgpack.packb(header), *frames])
    except wire.WireError:
        pass


def test_admission_takes_the_sender_from_the_key_and_admits_roles_only():
    """Issue 28 (4): the sender is whoever CURVE authenticated; a header naming someone else, a role not admitted to
    the socket, or a key of no member is refused. Keys keep their owners through the environment."""
    server = wire.CurveKeys.generate()
    pairs = {name: zmq.curve_keypair() for name in ("collector-0", "collector-1", "inference-0", "learner-0")}
    owners = {cp: name for name, (cp, _) in pairs.items()}
    keys = wire.CurveKeys.from_env(server.for_process(pairs["learner-0"], True, owners).to_env())
    assert keys.owner(pairs["collector-1"][0].decode()) == "collector-1" and keys.owner("x" * 40) is None
    pushers = wire.Admission(keys, collector=wire.OWN_NAME, inference=wire.ANY_COLLECTOR)
    samplers = wire.Admission(keys, learner=wire.ANY_RANK)

    def msg(key_of: str | None, sender: str) -> wire.Message:
        return wire.Message("x", sender, peer=pairs[key_of][0].decode() if key_of else None)

    assert pushers.admits(msg("collector-1", "collector-1"))
    assert not pushers.admits(msg("collector-1", "collector-0"))  # speaking as another collector
    assert pushers.admits(msg("inference-0", "collector-0")) and not pushers.admits(msg("inference-0", "learner-0"))
    assert not pushers.admits(msg("inference-0", "collector-01")) and not pushers.admits(msg("inference-0", "collector-²"))
    assert not pushers.admits(msg("learner-0", "learner-0")) and not pushers.admits(msg(None, "collector-0"))
    assert samplers.admits(msg("learner-0", "learner-3")) and not samplers.admits(msg("collector-0", "learner-0"))
    # A process that binds nothing holds no admitted keys at all.
    assert server.for_process(pairs["collector-0"], False, owners).allowed == ()
