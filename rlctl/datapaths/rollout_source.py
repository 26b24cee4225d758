"""The rollouts data path's learner side: this rank's PULL socket, where collector c sends to rank c % ranks.
Synchronous algorithms (PPO) take one rollout of the current version from each of the rank's collectors, older
ones are dropped and counted; asynchronous ones (APPO, IMPALA) take `rollouts_per_update` (`batch_steps` env steps)
within `max_policy_lag` (`RolloutSource`, built by rlctl.datapaths.rollouts.RolloutPath.learner_source).

In an elastic world the ranks present change while the head's rank 0 stays, so every collector sends to rank 0,
which deals each round's rollouts to the ranks of the world as it is (`RolloutDealer`): the i-th rollout it accepts
in a round goes to rank i % world. A round is the same as in a fixed world: PPO's one current rollout per collector
(all of them, split over the ranks), APPO's and IMPALA's `rollouts_per_update` per rank.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import torch
import zmq

from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.algos.base import UpdateResult
from rlctl.net.control import collector_index
from rlctl.datapaths.rollouts import RolloutPath
from rlctl.envs import SpaceInfo
from rlctl.data.frames import frame_stack_depth, parse_rollout_frames, rebuild_stacks


def rollout_buffer_bytes(job, info: SpaceInfo) -> int:
    """Kernel buffer bytes of rollout sockets (collector or inference server PUSH, learner PULL): a sixteenth of one
    rollout, within [4 KB, 4 MB]. Far less than a rollout on each side keeps the queues, and so the async policy
    lag, bounded by the sockets' HWMs; a fixed 4 KB cut a 4 MB Pong rollout into a thousand reads, each waking the
    learner's I/O thread on the learner's core (3,300 preemptions of the learner a second)."""
    n_envs = job.env.envs_per_collector
    layout = job.algorithm_entry.load("actor").layout(job.algorithm.rollout_len, info)
    whole = sum(rows * n_envs * math.prod(shape) * np.dtype(dt).itemsize for rows, shape, dt in layout.values())
    return min(max(whole // 16, wire.SOCKET_BUFFER_MIN), wire.SOCKET_BUFFER_MAX)


class RolloutCheck:
    """Whether a decoded message is a rollout of the job's layout: the fields, shapes and dtypes, a collector's
    sender, actions in range, floats finite. With `frame_stack` S > 0 the (S, H, W) `obs` travel as `frames` and
    `obs_frame` stack starts (rlctl.data.frames)."""

    def __init__(self, layout: dict, n_actions: int, frame_stack: int = 0):
        self.layout, self.n_actions = dict(layout), n_actions
        self.obs_rows, self.obs_shape, _ = layout["obs"]
        if frame_stack:
            del self.layout["obs"]  # checked by parse_rollout_frames instead
            self.layout["obs_frame"] = (self.obs_rows, (), np.dtype(np.int32))
        self.frame_stack = frame_stack
        self.fields = set(self.layout) | ({"frames"} if frame_stack else set())

    def __call__(self, msg: wire.Message) -> bool:
        if msg.kind != RolloutPath.message_kind or msg.arrays.keys() != self.fields or collector_index(msg.sender) < 0:
            return False
        n_envs = msg.arrays["reward"].shape[1] if msg.arrays["reward"].ndim == 2 else -1
        for name, (rows, trailing, dtype) in self.layout.items():
            a = msg.arrays[name]
            if a.dtype != dtype or a.shape != (rows, n_envs, *trailing) or n_envs < 1:
                return False
        if self.frame_stack and not parse_rollout_frames(msg.arrays["frames"], msg.arrays["obs_frame"],
                                                         self.obs_rows, n_envs, self.obs_shape):
            return False
        return wire.actions_in_range(msg.arrays["action"], self.n_actions) and wire.all_finite(msg.arrays.values())


class RolloutInbox:
    """This rank's PULL socket: rollouts that pass the job's RolloutCheck; malformed ones dropped and counted."""

    def __init__(self, net: wire.SecureContext, endpoint: str, layout: dict, n_envs: int, n_actions: int,
                 frame_stack: int = 0, rcvbuf: int = wire.SOCKET_BUFFER_MIN, dealt: bool = False):
        # Small queues: what the learner has not taken yet pushes back on the collectors (bounding policy lag)
        # instead of piling up in socket buffers. rcvhwm=1 would never deliver a multipart message; 2 does. No frame
        # larger than a rollout's biggest field is received at all.
        frame = max(rows * n_envs * math.prod(shape) * np.dtype(dt).itemsize for rows, shape, dt in layout.values())
        self.sock = net.server(zmq.PULL, endpoint, rcvhwm=2, rcvbuf=rcvbuf,
                               maxmsgsize=wire.CONTROL_MAXMSGSIZE + frame)
        self.valid = RolloutCheck(layout, n_actions, frame_stack)
        # Collectors send their own rollouts; an inference server those of its collectors (central inference); in an
        # elastic world rank 0 those it deals to this rank (`dealt`: a learner node's key, for any collector).
        ranks = {"learner": wire.ANY_COLLECTOR} if dealt else {}
        self.admission = wire.Admission(net.keys, collector=wire.OWN_NAME, inference=wire.ANY_COLLECTOR, **ranks)
        self.dropped = 0

    def receive(self, limit: int) -> list[wire.Message]:
        """Up to `limit` rollouts that are waiting (the rest stay queued, as backpressure)."""
        out: list[wire.Message] = []
        for _, msg in wire.receive_waiting(self.sock, admission=self.admission):
            if msg is None or not self.valid(msg):
                self.dropped += 1
            else:
                out.append(msg)
            if len(out) >= limit:
                break
        return out


def stack_rollouts(msgs: list[wire.Message], device: torch.device, frame_stack: int = 0) -> dict[str, torch.Tensor]:
    """Concatenate rollouts along the env axis into [T(+1), B, ...] tensors on `device`; rollouts whose obs came as
    frames (`frame_stack` > 0) get their `obs` stacks rebuilt there."""
    fields = [k for k in msgs[0].arrays if k not in ("frames", "obs_frame")]
    out = {k: torch.from_numpy(np.concatenate([m.arrays[k] for m in msgs], axis=1)).to(device) for k in fields}
    if frame_stack:
        counts = np.cumsum([0] + [len(m.arrays["frames"]) for m in msgs[:-1]])
        start = np.concatenate([m.arrays["obs_frame"] + np.int64(c) for m, c in zip(msgs, counts)], axis=1)
        frames = torch.from_numpy(np.concatenate([m.arrays["frames"] for m in msgs])).to(device)
        out["obs"] = rebuild_stacks(frames, torch.from_numpy(start).to(device), frame_stack)
    return out


class RolloutDealer:
    """Rank 0 of an elastic world: the rollouts it accepts for ranks 1..world-1, sent on to each rank's own socket
    as they came (the frames themselves, no copy). A rank that cannot take one yet (its queue full) gets it later:
    a dropped rollout would leave a synchronous round waiting for it."""

    def __init__(self, net: wire.SecureContext, endpoints: list[str], sndhwm: int, sndbuf: int):
        # endpoints[i] is rank i + 1's socket.
        self.socks = [net.client(zmq.PUSH, ep, sndhwm=sndhwm, sndbuf=sndbuf) for ep in endpoints]
        self.waiting: list[deque] = [deque() for _ in endpoints]

    def deal(self, rank: int, msg: wire.Message) -> None:
        """Send `msg` on to `rank` (>= 1), after what still waits for it."""
        self.waiting[rank - 1].append(msg)
        self.flush()

    def flush(self) -> None:
        """Send what waits, in order, as far as each rank's queue has room."""
        for sock, queue in zip(self.socks, self.waiting):
            while queue:
                m = queue[0]
                try:
                    wire.send(sock, m.kind, m.sender, m.version, m.meta, m.arrays, flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                queue.popleft()

    def holding(self) -> bool:
        """Whether some rollout still waits to be sent on."""
        return any(self.waiting)


class RolloutSource:
    """The rollouts data path: this rank's share of the collectors' rollouts, stacked for the core."""

    def __init__(self, net: wire.SecureContext, endpoint: str, job, info: SpaceInfo, layout, rank: int, world: int,
                 device: torch.device, dealt_to: list[str] | None = None):
        """`dealt_to` (elastic worlds): None on ranks >= 1, which take what rank 0 deals them; on rank 0 the
        endpoints of ranks 1..world-1."""
        algo = job.algorithm
        elastic = job.elastic_learners
        self.frame_stack = frame_stack_depth(job, info)
        self.inbox = RolloutInbox(net, endpoint, layout(algo.rollout_len, info), job.env.envs_per_collector,
                                  info.n_actions, self.frame_stack, rollout_buffer_bytes(job, info),
                                  dealt=elastic and rank > 0)
        self.sock = self.inbox.sock
        self.device = device
        self.synchronous = job.algorithm_entry.synchronous
        self.world = world
        collectors = job.collector_count
        # Collectors whose rollouts this rank may take: in an elastic world any (rank 0 deals them).
        self.mine = {c for c in range(collectors) if elastic or c % world == rank}
        if elastic:
            # A round of rollouts dealt i -> rank i % world: PPO's one per collector, else rollouts_per_update a rank.
            per_round = collectors if self.synchronous else algo.rollouts_per_update(job.env.envs_per_collector) * world
            own = per_round // world + (rank < per_round % world)
            self.per_batch = per_round if rank == 0 else own
        else:
            self.per_batch = len(self.mine) if self.synchronous else algo.rollouts_per_update(job.env.envs_per_collector)
        self.dealer = None
        if elastic and rank == 0 and world > 1:
            self.dealer = RolloutDealer(net, dealt_to or [], collectors + 1, rollout_buffer_bytes(job, info))
        self.max_lag = 0 if self.synchronous else algo.max_policy_lag
        self.accepted = 0  # rollouts of the round accepted so far (rank 0 of an elastic world: dealt ones too)
        self.seen: set[int] = set()  # synchronous: the collectors whose rollout the round has
        self.got: dict[int, wire.Message] = {}  # this rank's own, by collector (synchronous) or arrival
        self.stale = 0
        self.lags: list[int] = []

    def _accepts(self, msg: wire.Message, version: int) -> bool:
        lag = version - msg.version
        if self.synchronous:
            c = collector_index(msg.sender)
            return lag == 0 and c in self.mine and c not in self.seen
        return 0 <= lag <= self.max_lag

    def take(self, version: int) -> dict[str, torch.Tensor] | None:
        """This version's batch once complete: PPO one current rollout per own collector; else enough rollouts
        within the lag bound. Rank 0 of an elastic world deals the other ranks their shares meanwhile."""
        if self.dealer is not None:
            self.dealer.flush()
        for msg in self.inbox.receive(self.per_batch - self.accepted) if self.accepted < self.per_batch else ():
            if not self._accepts(msg, version):
                self.stale += 1  # from an older version (a collector that fell behind or restarted)
                continue
            to = self.accepted % self.world if self.dealer is not None else 0
            self.accepted += 1
            c = collector_index(msg.sender)
            self.seen.add(c)
            if to:
                self.dealer.deal(to, msg)
            else:
                self.got[c if self.synchronous else len(self.got)] = msg
        if self.accepted < self.per_batch or (self.dealer is not None and self.dealer.holding()):
            return None  # rank 0 ends its round only once the others have theirs: they wait for it in the update
        msgs = [self.got[k] for k in sorted(self.got)]
        self.got, self.seen, self.accepted = {}, set(), 0
        self.lags.extend(version - m.version for m in msgs)
        return stack_rollouts(msgs, self.device, self.frame_stack)

    def feedback(self, batch: dict, result: UpdateResult) -> None:
        """Nothing goes back to collectors but the next weights."""

    def metrics(self) -> dict:
        """Policy lag since the last call, rollouts dropped as stale, malformed messages."""
        lag = float(np.mean(self.lags)) if self.lags else 0.0
        self.lags = []
        return {M.POLICY_LAG_MEAN: lag, M.ROLLOUTS_DROPPED: self.stale, M.NET_DROPPED: self.inbox.dropped}
