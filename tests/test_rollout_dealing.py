"""Rollouts in an elastic world: every collector sends to rank 0, which deals each round's rollouts to the ranks of
the world as it is (rlctl.datapaths.rollout_source), over real CURVE sockets on loopback."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import zmq

from rlctl.algos.onpolicy.actor import RolloutActor
from rlctl.datapaths.rollout_source import RolloutSource
from rlctl.envs import probe_space_info
from rlctl.job.load import load_job
from rlctl.net import wire
from conftest import free_ports

JOB = '''
[job]
name = "deal"
seed = 1

[env]
id = "CartPole-v1"
envs_per_collector = 2

[algorithm]
name = "{algo}"
rollout_len = 4
{extra}

[topology]
min_learner_nodes = 1

[[hosts]]
name = "h1"
address = "localhost"
advertise_address = "127.0.0.1"
learner = true
collectors = 3

[[hosts]]
name = "h2"
address = "127.0.0.2"
learner = true
'''


@pytest.fixture
def net():
    ctx = wire.SecureContext(wire.CurveKeys.generate())
    yield ctx
    ctx.close()


def elastic_job(tmp_path, algo: str = "ppo", extra: str = ""):
    path = tmp_path / f"{algo}.toml"
    path.write_text(JOB.format(algo=algo, extra=extra))
    job = load_job(path)
    assert job.elastic_learners and job.collector_count == 3
    return job


def rollout(job, info, collector: int, version: int) -> dict[str, np.ndarray]:
    """One well-formed rollout of `collector` (its index in every reward, to tell them apart)."""
    out = {}
    for name, (rows, shape, dtype) in RolloutActor.layout(job.algorithm.rollout_len, info).items():
        out[name] = np.zeros((rows, job.env.envs_per_collector, *shape), dtype)
    out["reward"][:] = collector
    return out


def take_all(sources: list[RolloutSource], version: int, timeout: float = 5.0) -> list[dict]:
    """Each source's batch of `version`, polled in turn as the learner ranks would."""
    got: list = [None] * len(sources)
    deadline = time.monotonic() + timeout
    while any(g is None for g in got) and time.monotonic() < deadline:
        for i, s in enumerate(sources):
            if got[i] is None:
                got[i] = s.take(version)
        time.sleep(0.005)
    assert all(g is not None for g in got), [g is not None for g in got]
    return got


def collectors_of(batch: dict) -> list[int]:
    return [int(r) for r in batch["reward"][0, ::2]]


def world(net, job, info, size: int) -> tuple[list[RolloutSource], str]:
    """A world's rank sources, rank 0 dealing to the others, and rank 0's endpoint (where collectors send)."""
    eps = [f"tcp://127.0.0.1:{port}" for port in free_ports(size)]
    layout = RolloutActor.layout
    cpu = torch.device("cpu")
    return [RolloutSource(net, eps[r], job, info, layout, r, size, cpu, eps[1:] if r == 0 else None)
            for r in range(size)], eps[0]


def test_rank_0_deals_each_ppo_round_to_the_ranks_present_and_a_world_of_one_takes_all(tmp_path, net):
    """PPO, 3 collectors over a world of 2: rank 0 takes rollouts 0 and 2 of the round, rank 1 rollout 1; a
    duplicate and an old version are dropped as stale. Re-formed as a world of 1, rank 0 takes all three."""
    job = elastic_job(tmp_path)
    info = probe_space_info(job.env)
    ranks, head = world(net, job, info, 2)
    push = net.client(zmq.PUSH, head)
    for c in (2, 0, 2, 1):  # collector 2 twice: the second is a duplicate
        wire.send(push, "rollout", f"collector-{c}", 5, None, rollout(job, info, c, 5))
    wire.send(push, "rollout", "collector-0", 4, None, rollout(job, info, 0, 4))
    r0, r1 = take_all(ranks, 5)
    # Dealt in arrival order: 2 -> rank 0, 0 -> rank 1, 1 -> rank 0 (kept by collector).
    assert collectors_of(r0) == [1, 2] and collectors_of(r1) == [0]
    assert r0["obs"].shape[1] == 4 and r1["obs"].shape[1] == 2
    time.sleep(0.1)
    assert ranks[0].take(5) is None  # the next round has nothing yet
    assert ranks[0].metrics()["learner/rollouts_dropped"] == 2
    push.close(linger=0)
    for s in ranks:
        s.sock.close(linger=0)

    (alone,), head = world(net, job, info, 1)
    push = net.client(zmq.PUSH, head)
    for c in range(3):
        wire.send(push, "rollout", f"collector-{c}", 6, None, rollout(job, info, c, 6))
    (batch,) = take_all([alone], 6)
    assert collectors_of(batch) == [0, 1, 2]
    push.close(linger=0)


def test_rank_0_deals_appo_batches_of_rollouts_per_update_to_every_rank(tmp_path, net):
    """APPO, 2 rollouts per update: rank 0 of a world of 2 accepts 4 within the lag bound, keeps 2 and deals 2;
    a rollout past max_policy_lag is dropped."""
    job = elastic_job(tmp_path, "appo", "batch_steps = 16\nmax_policy_lag = 1")
    info = probe_space_info(job.env)
    assert job.algorithm.rollouts_per_update(job.env.envs_per_collector) == 2
    ranks, head = world(net, job, info, 2)
    push = net.client(zmq.PUSH, head)
    wire.send(push, "rollout", "collector-1", 1, None, rollout(job, info, 1, 1))  # 2 versions old at 3
    for c, v in ((0, 3), (1, 2), (2, 3), (0, 3)):
        wire.send(push, "rollout", f"collector-{c}", v, None, rollout(job, info, c, v))
    r0, r1 = take_all(ranks, 3)
    assert r0["obs"].shape[1] == r1["obs"].shape[1] == 4
    assert sorted(collectors_of(r0) + collectors_of(r1)) == [0, 0, 1, 2]
    assert ranks[0].metrics()["learner/rollouts_dropped"] == 1
    push.close(linger=0)


def test_a_rank_takes_dealt_rollouts_only_from_a_learner_and_in_an_elastic_world(tmp_path, net):
    """The dealt rank's inbox admits a learner node's key speaking for a collector; a fixed world's does not."""
    from rlctl.datapaths.rollout_source import RolloutInbox

    keys = wire.CurveKeys.generate()
    learner_keys = zmq.curve_keypair()
    owners = {keys.client_public: "collector-0", learner_keys[0]: "learner-0"}
    job = elastic_job(tmp_path)
    info = probe_space_info(job.env)
    layout = RolloutActor.layout(job.algorithm.rollout_len, info)
    for dealt, expect in ((True, 1), (False, 0)):
        (port,) = free_ports(1)
        server = wire.SecureContext(keys.for_process((keys.client_public, keys.client_secret), True, owners))
        client = wire.SecureContext(keys.for_process(learner_keys, False, owners))
        try:
            inbox = RolloutInbox(server, f"tcp://127.0.0.1:{port}", layout, 2, info.n_actions, dealt=dealt)
            push = client.client(zmq.PUSH, f"tcp://127.0.0.1:{port}")
            wire.send(push, "rollout", "collector-2", 0, None, rollout(job, info, 2, 0))
            deadline, got = time.monotonic() + 3, []
            while time.monotonic() < deadline and not got and not inbox.dropped:
                got = inbox.receive(1)
                time.sleep(0.01)
            assert (len(got), inbox.dropped) == (expect, 1 - expect)
            push.close(linger=0)
        finally:
            client.close()
            server.close()
