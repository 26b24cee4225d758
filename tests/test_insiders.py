"""Nobody inside either (issue 28): one job member's keys must not let it fail, poison or impersonate the rest.

One central-inference Ape-X job runs for the module; the tests act as a compromised collector host: they hold
collector-1's keys, read from its environment as anyone on that host could, and send what its keys allow.
"""

from __future__ import annotations

import json
import statistics
import time

import msgpack
import numpy as np
import pytest
import zmq

from conftest import member_keys, read_state, run_cli, wait_for
from rlctl import metric_names as M
from rlctl.net import wire

pytestmark = pytest.mark.slow  # end-to-end: real jobs run to their target, faults, or a lab of hosts

JOB = """
[job]
name = "insiders"
seed = 1
[job.stop]
wall_s = 240
[env]
id = "CartPole-v1"
envs_per_collector = 8
[algorithm]
name = "apex"
batch_size = 64
publish_interval = 10
[replay]
capacity = 20000
min_size = 500
[topology]
collectors = 2
evaluator = false
inference = "central"
[logging]
metrics_interval_s = 0.3
"""


class Job:
    """The running job: its directory, plan and a secure context holding collector-1's keys."""

    def __init__(self, run_dir, plan: dict, keys: wire.CurveKeys):
        self.run_dir, self.plan = run_dir, plan
        self.net = wire.SecureContext(keys)

    def state(self) -> dict:
        """state.json, once it reads whole."""
        return wait_for(lambda: read_state(self.run_dir), 10, what="state.json")

    def dropped(self) -> int:
        """The job's net/dropped, summed over its processes by the supervisor."""
        return int(self.state()["metrics"].get(M.NET_DROPPED, 0))

    def process(self, name: str) -> dict:
        """One process's row of state.json."""
        return next(p for p in self.state()["processes"] if p["name"] == name)

    def expect_dropped(self, at_least: int, what: str) -> None:
        """Wait until net/dropped reaches `at_least`; the run still running with no process restarted."""
        wait_for(lambda: self.dropped() >= at_least, 30, what=f"{what} dropped and counted")
        state = self.state()
        assert state["status"] == "running", state["exit_reason"]
        assert all(p["restarts"] == 0 and p["state"] == "running" for p in state["processes"]), state["processes"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The job, running (experience flowing) until the module's tests are done; then stopped."""
    root = tmp_path_factory.mktemp("insiders")
    (root / "job.toml").write_text(JOB)
    runs = root / "runs"
    env = {"RLCTL_RUNS_DIR": str(runs)}
    run_id = run_cli(["run", str(root / "job.toml"), "--detach"], env=env, timeout=60).stdout.split()[0]
    run_dir = runs / run_id
    try:
        wait_for(lambda: read_state(run_dir).get("metrics", {}).get(M.UPDATES, 0) > 0, 120,
                 what="the learner's first update")
        running = Job(run_dir, json.loads((run_dir / "plan.json").read_text()), member_keys(run_id, "collector", 1))
        try:
            yield running
        finally:
            running.net.close()
    finally:
        run_cli(["stop", run_id], env=env, expected_exit=None, timeout=120)
    assert read_state(run_dir)["status"] == "stopped"


def _true_shaped(kind: str, sender: str) -> list[bytes]:
    """A message whose one array has the shape [true] (msgpack's bool, which passes an isinstance int check)."""
    header = {"k": kind, "s": sender, "v": 0, "m": {}, "a": [["x", "float32", [True]]]}
    return [msgpack.packb(header), b"\0" * 4]


def test_a_true_shaped_array_fails_neither_the_supervisor_nor_a_replay_shard(job):
    """Item 1: the `[true]`-shape heartbeat to the control socket and to a replay shard's experience socket, sent
    with a member's keys: dropped and counted, the run goes on, nothing restarts."""
    before = job.dropped()
    control = job.net.client(zmq.DEALER, job.plan["endpoints"]["control"])
    control.send_multipart(_true_shaped("heartbeat", "collector-1"))
    job.expect_dropped(before + 1, "the heartbeat")
    experience = job.net.client(zmq.PUSH, job.plan["endpoints"]["replay"][0]["experience"])
    experience.send_multipart(_true_shaped("experience", "collector-1"))
    job.expect_dropped(before + 2, "the experience message")


def _step(sender: str, token: str) -> dict:
    """A well-formed step request of this job's shapes (8 CartPole envs)."""
    arrays = {"obs": np.zeros((8, 4), np.float32), "reward": np.zeros(8, np.float32),
              "terminated": np.zeros(8, bool), "truncated": np.zeros(8, bool)}
    return {"kind": "step", "sender": sender, "version": 0, "meta": {"token": token, "seq": 0}, "arrays": arrays}


def _rates(job: Job, name: str, seconds: float, act=None) -> float:
    """The median of `name`'s env steps per second over `seconds`, calling act() in between."""
    rates, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        if act is not None:
            act()
        rates.append(job.process(name)["rate"] or 0.0)
        time.sleep(0.05)
    return statistics.median(rates)


def test_a_collector_cannot_speak_as_another(job):
    """Item 4: with collector-1's keys, step requests as collector-0 (each a new session) and experience as
    collector-0 are dropped and counted: no session is begun for them, and collector-0 keeps stepping."""
    inference = job.net.client(zmq.DEALER, job.plan["endpoints"]["inference"][0], sndhwm=100000)
    experience = job.net.client(zmq.PUSH, job.plan["endpoints"]["replay"][0]["experience"])
    item = {"obs": np.zeros((64, 4), np.float32), "action": np.zeros(64, np.int64)}
    before_rate = _rates(job, "collector-0", 4.0)
    before, begun = job.dropped(), job.state()["metrics"][M.INFERENCE_SESSIONS_BEGUN]
    sent = 0

    def flood():
        nonlocal sent
        for _ in range(20):
            wire.send(inference, **_step("collector-0", f"forged-{sent}"))
            sent += 1

    during_rate = _rates(job, "collector-0", 4.0, flood)
    wire.send(experience, "experience", "collector-0", 0, None, {**item, "priority": np.ones(64, np.float32)})
    job.expect_dropped(before + sent + 1, f"{sent} forged step requests and a forged experience message")
    # A forged request admitted would replace collector-0's session (its real requests then out of order, its rate
    # near 0). The flood's own cost is not that: on 2 cores the sender's encryption and the server's decryption of
    # 400 messages/s take CPU from the job, and its rates fall with it (to 0.59x of before on a CI machine).
    assert job.state()["metrics"][M.INFERENCE_SESSIONS_BEGUN] == begun
    assert during_rate >= 0.3 * before_rate, (before_rate, during_rate)


def test_a_collector_key_cannot_sample_replay(job):
    """Item 4: only learners sample: a collector's `sample` request is refused (no batch, dropped and counted)."""
    before = job.dropped()
    sampler = job.net.client(zmq.DEALER, job.plan["endpoints"]["replay"][0]["sample"])
    wire.send(sampler, "sample", "learner-0", 0, {"n": 8})
    wire.send(sampler, "priorities", "learner-0", 0, None, {"keys": np.zeros(8, np.int64),
                                                              "priority": np.full(8, 1e30, np.float32)})
    assert not sampler.poll(2000), "a collector's key was sent a batch"
    job.expect_dropped(before + 2, "the sample request and the priority update")


def test_a_refused_handshake_on_the_supervisor_s_own_socket_is_counted(job):
    """Item 9: keys of no member, at the control socket: refused, and counted in net/refused like on any other."""
    refused = lambda: int(job.state()["metrics"].get(M.NET_REFUSED, 0))  # noqa: E731
    before = refused()
    stranger = wire.SecureContext(wire.CurveKeys.generate())
    try:
        sock = stranger.client(zmq.DEALER, job.plan["endpoints"]["control"])
        wire.send(sock, "heartbeat", "collector-1", 0, {"metrics": {}})
        wait_for(lambda: refused() > before, 30, what="the refused handshake counted")
    finally:
        stranger.close()
