"""The inference server of central (SEED RL style) inference: one batched forward answers many collectors.

Collectors of a central job (roles/central_collector.py) only step their envs: each vector step they send the
observations, with the rewards and episode ends of the step before, and wait for actions. The server holds one
`CollectorSession` per collector, around the algorithm's own actor core (rlctl.algos) as a local collector would run
it, so the server records the experience, cuts the blocks and sends them on under the collector's name (n-step
transitions or sequences to the replay shards, rollouts to learner rank c % ranks): nothing travels twice.

A batch closes at `inference.max_batch` requests, as soon as every collector being served has asked, or
`inference.deadline_ms` after its first request; one forward (`ActorCore.forward`) serves it on the server's device,
and each core takes its rows (`act_on`). Weights come from learner rank 0 as they would to a collector: the
shared-memory board on its host, the weights socket elsewhere.

Exactly once, in order: a collector has one request in flight, numbered `seq` within its session (a random token per
collector process). Each request is answered once. A request sent again (the collector heard nothing for a while,
e.g. across a restart of this server) gets the same answer again, or nothing while it is being served; a new token
(a restarted collector) starts a new session, and an answer to the dead one goes nowhere (counted as undeliverable).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch
import zmq

from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.algos import build_model
from rlctl.algos.base import ActorCore, ActorSetup
from rlctl.envs import SpaceInfo, probe_space_info
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, process_seed, role_main, set_torch_threads
from rlctl.net.control import collector_index
from rlctl.net.weights import WeightSubscriber
from rlctl.role_names import Role

ACTIVE_S = 1.0  # a collector heard from within this long is one a batch waits for (up to the deadline)
SESSION_IDLE_S = 60.0  # a session silent this long, with no request being served, is forgotten (its collector is gone)
MAX_TOKEN = 64


@dataclass
class StepRequest:
    """One collector's vector step, as validated off the wire."""

    collector: int
    token: str
    seq: int
    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray


class RequestParser:
    """Turns a received message into a StepRequest of this job's shapes, or None (dropped and counted)."""

    def __init__(self, info: SpaceInfo, n_envs: int, collectors: int):
        self.collectors = collectors
        self.expected = {"obs": ((n_envs, *info.obs_shape), np.dtype(info.obs_dtype)),
                         "reward": ((n_envs,), np.dtype(np.float32)),
                         "terminated": ((n_envs,), np.dtype(bool)), "truncated": ((n_envs,), np.dtype(bool))}

    def __call__(self, msg: wire.Message | None) -> StepRequest | None:
        """The request, or None if anything about it is off."""
        if msg is None or msg.kind != "step" or msg.arrays.keys() != self.expected.keys():
            return None
        c = collector_index(msg.sender)
        token, seq = msg.meta.get("token"), msg.meta.get("seq")
        if not 0 <= c < self.collectors or not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN:
            return None
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            return None
        a = msg.arrays
        if any(a[k].shape != shape or a[k].dtype != dtype for k, (shape, dtype) in self.expected.items()):
            return None
        if not wire.all_finite(a.values()):
            return None
        return StepRequest(c, token, seq, a["obs"], a["reward"], a["terminated"], a["truncated"])


class CollectorSession:
    """One collector process as the server knows it: its actor core, the step awaiting its outcome (the next
    request brings it), the request being served and the last answer (for a request sent again)."""

    def __init__(self, collector: int, token: str, core: ActorCore, seq: int):
        self.collector, self.token, self.core = collector, token, core
        self.name = f"collector-{collector}"
        self.next_seq = seq
        self.identity: list = []
        self.obs: np.ndarray | None = None
        self.actions: np.ndarray | None = None
        self.request: StepRequest | None = None
        self.arrived = self.last_seen = time.monotonic()
        self.answer: tuple[int, dict] | None = None  # (version, arrays) of the last answer
        self.begun = False
        self.version = -1  # weights version the current block began with


def inference_device(job, index: int) -> torch.device:
    """`auto`: a GPU where present (server `index` of its host on cuda:index mod the GPUs), else the CPU."""
    want = job.inference.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        return torch.device(f"cuda:{index % max(torch.cuda.device_count(), 1)}")
    return torch.device("cpu")


class InferenceServer:
    """The server's loop: take requests, close batches, answer, send experience on, report."""

    def __init__(self, rc: RoleContext, stop: StopFlag):
        job = rc.job
        self.rc, self.stop, self.job = rc, stop, job
        set_torch_threads()
        torch.manual_seed(job.job.seed)  # the learner's initial parameters, until its weights arrive
        self.device = inference_device(job, rc.rank % job.inference.servers_per_host)
        self.info = probe_space_info(job.env)
        self.model = build_model(job, self.info).to(self.device)
        self.model.eval()
        self.net = wire.SecureContext(rc.keys)
        self.control = ControlClient(self.net, rc)
        self.weights = WeightSubscriber(self.net, rc.endpoints["weights"], self.model, rc.weight_board,
                                       bulk=rc.endpoints.get("weights_bulk"))
        n_envs = job.env.envs_per_collector
        self.parse = RequestParser(self.info, n_envs, job.collector_count)
        self.admission = wire.Admission(rc.keys, collector=wire.OWN_NAME)  # a collector asks for itself only
        obs_frame = n_envs * self.info.obs_bytes
        # Requests queue in ZeroMQ, not in kernel buffers of 64 KB: one step of every collector at most, each.
        self.sock = self.net.server(zmq.ROUTER, rc.binds[Role.INFERENCE], router_mandatory=1, sndhwm=1000,
                                    rcvhwm=1000, maxmsgsize=wire.CONTROL_MAXMSGSIZE + obs_frame)
        self.actor_class = job.algorithm_entry.load("actor")
        # Collector c's experience goes through senders[c % len(senders)] (one to every shard, or one per rank).
        self.senders = job.data_path.senders(self.net, rc.endpoints, job, self.info, rc.name)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        for sock in self.weights.sockets:
            self.poller.register(sock, zmq.POLLIN)
        self.sessions: dict[int, CollectorSession] = {}
        self.batch: list[CollectorSession] = []
        self.parked: list[CollectorSession] = []  # waiting for weights their core will begin with
        self.max_batch = job.inference.max_batch or 1 << 30
        self.deadline = job.inference.deadline_ms / 1000
        self.dropped = self.undeliverable = self.resent = 0
        self.requests = self.batches = self.sessions_begun = 0
        self.latencies: list[float] = []
        self.last_t, self.last_requests, self.last_batches = time.monotonic(), 0, 0

    # -- requests ------------------------------------------------------------
    def on_message(self, identity: list, msg: wire.Message | None) -> None:
        """A request: a new session, a repeat (answered again), the next step (recorded, then queued), or junk."""
        req = self.parse(msg)
        if req is None:
            self.dropped += 1
            return
        now = time.monotonic()
        s = self.sessions.get(req.collector)
        if s is None or s.token != req.token:
            if s is not None:  # that collector was restarted: its old session ends here
                self.rc.say(f"{s.name} started a new session at request {req.seq} (the last one ended at "
                            f"request {s.next_seq - 1})")
                self.forget(s)
            s = self.sessions[req.collector] = CollectorSession(req.collector, req.token, self.new_core(req.collector),
                                                                req.seq)
            self.sessions_begun += 1
        elif req.seq == s.next_seq - 1:  # asked again: answer again (or ignore while it is being served)
            s.identity, s.last_seen = identity, now
            if s.answer is not None:
                self.resent += 1
                self.deliver(s, req.seq, *s.answer)
            return
        elif req.seq != s.next_seq:
            self.dropped += 1
            return
        s.identity, s.last_seen, s.arrived = identity, now, now
        s.next_seq, s.answer, s.request = req.seq + 1, None, req
        if s.obs is not None and s.core.record(s.obs, s.actions, req.reward, req.obs, req.terminated, req.truncated):
            self.send_block(s)
        self.enqueue(s)

    def new_core(self, collector: int) -> ActorCore:
        """The actor core a local collector of this rank would run, on the server's model."""
        return self.actor_class(ActorSetup(self.job, self.info, self.model, collector, self.job.env.envs_per_collector,
                                           process_seed(self.job.job.seed, Role.COLLECTOR, collector)))

    def forget(self, s: CollectorSession) -> None:
        """Drop a session (its collector restarted or is gone); its unsent experience goes with it."""
        self.sessions.pop(s.collector, None)
        if s in self.batch:
            self.batch.remove(s)
        if s in self.parked:
            self.parked.remove(s)

    def enqueue(self, s: CollectorSession) -> None:
        """Into the open batch, once the core has begun a block (else parked until other weights arrive)."""
        if not s.begun:
            if not s.core.begin(self.weights.version, self.weights.serial):
                self.parked.append(s)
                return
            s.begun, s.version = True, self.weights.version
        self.batch.append(s)

    def unpark(self) -> None:
        """New weights: the parked sessions try to begin again."""
        parked, self.parked = self.parked, []
        for s in parked:
            self.enqueue(s)

    def send_block(self, s: CollectorSession) -> None:
        """The block the core cut, on to the replay shards or the collector's learner rank (waiting for room)."""
        block = s.core.take()
        sender = self.senders[s.collector % len(self.senders)]
        sender.send_blocking(block.arrays, s.version, self.stop, self.while_blocked, s.name)
        s.begun = False

    def while_blocked(self) -> None:
        """A full shard or a busy learner holds the server up: keep weights fresh and heartbeats going."""
        if self.weights.poll():
            self.unpark()
        self.report()

    # -- batches -------------------------------------------------------------
    def batch_due(self, now: float) -> bool:
        """Full, everyone being served has asked, or the first request has waited `deadline_ms`."""
        if not self.batch:
            return False
        if len(self.batch) >= self.max_batch or now - self.batch[0].arrived >= self.deadline:
            return True
        waiting_for = sum(1 for s in self.sessions.values()
                          if s.request is None and now - s.last_seen < ACTIVE_S)
        return waiting_for == 0

    def run_batch(self) -> None:
        """One forward for the batch; each collector's core takes its rows and its answer goes out."""
        batch, self.batch = self.batch, []
        obs = np.concatenate([s.request.obs for s in batch])  # also a writable copy of a single request
        states = [s.core.step_state() for s in batch]
        state = tuple(torch.cat([p.to(self.device) for p in parts]) for parts in zip(*states))
        outputs = self.actor_class.forward(self.model, torch.from_numpy(obs).to(self.device), *state)
        sizes = [len(s.request.obs) for s in batch]
        rows = [o.cpu().split(sizes) for o in outputs]
        now = time.monotonic()
        for i, s in enumerate(batch):
            req = s.request
            actions = s.core.act_on(req.obs, tuple(r[i] for r in rows))
            s.obs, s.actions, s.request = req.obs, actions, None
            s.answer = (s.version, {"action": actions})
            self.deliver(s, req.seq, *s.answer)
            self.latencies.append(now - s.arrived)
        self.requests += len(batch)
        self.batches += 1

    def deliver(self, s: CollectorSession, seq: int, version: int, arrays: dict) -> None:
        """Send an answer; one to a collector that is gone is counted, not kept."""
        try:
            wire.send(self.sock, "actions", self.rc.name, version, {"seq": seq}, arrays, flags=zmq.NOBLOCK,
                      prefix=s.identity)
        except zmq.ZMQError:  # EHOSTUNREACH (router_mandatory): that connection is gone; EAGAIN: it reads nothing
            self.undeliverable += 1

    # -- the loop ------------------------------------------------------------
    def report(self) -> None:
        """A heartbeat with the server's figures, when due."""
        now = time.monotonic()
        if not self.control.due(now):
            return
        dt = max(now - self.last_t, 1e-9)
        batches = self.batches - self.last_batches
        requests = self.requests - self.last_requests
        lat = np.asarray(self.latencies) * 1000
        for s in [s for s in self.sessions.values() if s.request is None and now - s.last_seen > SESSION_IDLE_S]:
            self.forget(s)
        self.control.heartbeat({
            M.INFERENCE_REQUESTS_PER_S: requests / dt, M.INFERENCE_BATCH_SIZE_MEAN: requests / batches if batches else 0.0,
            M.INFERENCE_LATENCY_P50: float(np.percentile(lat, 50)) if len(lat) else 0.0,
            M.INFERENCE_LATENCY_P99: float(np.percentile(lat, 99)) if len(lat) else 0.0,
            M.INFERENCE_UNDELIVERABLE: self.undeliverable, M.INFERENCE_RESENT: self.resent,
            M.INFERENCE_SESSIONS: len(self.sessions), M.INFERENCE_SESSIONS_BEGUN: self.sessions_begun,
            M.INFERENCE_WEIGHT_VERSION: self.weights.version,
            M.NET_DROPPED: self.dropped + self.weights.dropped})
        self.latencies = []
        self.last_t, self.last_requests, self.last_batches = now, self.requests, self.batches

    def run(self) -> None:
        """Serve until stopped."""
        self.rc.say(f"{self.job.algorithm.name} policy on {self.device} for collectors "
                    f"{self.rc.rank} + k x {self.job.inference_server_count}, weights "
                    f"{'from shared memory ' + self.rc.weight_board if self.rc.weight_board else 'over the network'}, "
                    f"pid {os.getpid()}")
        with torch.no_grad():
            while not self.stop:
                now = time.monotonic()
                wait = (self.batch[0].arrived + self.deadline - now) if self.batch else 0.05
                ready = dict(self.poller.poll(max(0, math.ceil(wait * 1000))))
                if self.sock in ready:
                    for identity, msg in wire.receive_waiting(self.sock, routed=True, admission=self.admission):
                        self.on_message(identity, msg)
                if self.weights.poll():
                    self.unpark()
                if self.batch_due(time.monotonic()):
                    self.run_batch()
                self.report()

    def close(self) -> None:
        """Close every socket."""
        self.net.close()


def run(rc: RoleContext, stop: StopFlag) -> None:
    """The inference server process."""
    server = InferenceServer(rc, stop)
    try:
        server.run()
    finally:
        server.close()


if __name__ == "__main__":
    role_main(run)
