"""The replay data path's learner side: batches sampled from this rank's replay shard(s), `prefetch` requests always
in flight, new priorities sent back (`ReplaySource`, built by rlctl.datapaths.replay.ReplayPath.learner_source)."""

from __future__ import annotations

import math
import time

import numpy as np
import zmq

from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.algos.base import UpdateResult
from rlctl.envs import SpaceInfo

RESEND_FIRST_S, RESEND_MAX_S = 2.0, 30.0  # silence after which sample requests are sent again


class SampleStream:
    """Pipelined sampling from this rank's shard(s): `prefetch` requests always in flight."""

    def __init__(self, net: wire.SecureContext, endpoints: list[str], batch_size: int, prefetch: int, name: str,
                 layout: dict, n_actions: int = 0):
        # No frame larger than a batch of the biggest field is received at all.
        item_bytes = max(8, *(math.prod(shape) * np.dtype(dt).itemsize for shape, dt in layout.values()))
        self.sock = net.client(zmq.DEALER, endpoints, sndhwm=1000, rcvhwm=1000,
                               maxmsgsize=wire.CONTROL_MAXMSGSIZE + batch_size * item_bytes)
        # What every batch must be: the item layout, `keys` and `weights`, batch_size rows each.
        self.expected = {**{k: ((batch_size, *shape), np.dtype(dt)) for k, (shape, dt) in layout.items()},
                         "keys": ((batch_size,), np.dtype(np.int64)), "weights": ((batch_size,), np.dtype(np.float32))}
        self.n_actions = n_actions
        self.batch_size, self.name, self.prefetch = batch_size, name, prefetch
        self.dropped = 0
        self.last_reply, self.resend_after = time.monotonic(), RESEND_FIRST_S
        for _ in range(prefetch):
            self.request()

    def request(self) -> None:
        """Ask for one more batch."""
        wire.send(self.sock, "sample", self.name, 0, {"n": self.batch_size})

    def next(self, timeout_ms: int) -> dict[str, np.ndarray] | None:
        """The next batch, or None after `timeout_ms`; immediately re-requests so the pipe stays full."""
        while self.sock.poll(timeout_ms):
            try:
                _, msg = wire.recv(self.sock, zmq.NOBLOCK)
            except zmq.Again:
                continue
            except wire.WireError:
                self.dropped += 1
                continue
            if not self._valid(msg):
                self.dropped += 1
                continue
            self.request()
            self.last_reply, self.resend_after = time.monotonic(), RESEND_FIRST_S
            return msg.arrays
        if time.monotonic() - self.last_reply > self.resend_after:
            # A shard that died took the requests it held (a restarted one knows none): ask again, backing off while
            # shards are merely filling up to min_size, so extra requests stay few.
            for _ in range(self.prefetch):
                self.request()
            self.last_reply, self.resend_after = time.monotonic(), min(2 * self.resend_after, RESEND_MAX_S)
        return None

    def _valid(self, msg: wire.Message) -> bool:
        """A batch of exactly the expected fields, shapes and dtypes, its actions in range."""
        if msg.kind != "batch" or msg.arrays.keys() != self.expected.keys():
            return False
        if any(a.shape != self.expected[k][0] or a.dtype != self.expected[k][1] for k, a in msg.arrays.items()):
            return False
        return "action" not in msg.arrays or wire.actions_in_range(msg.arrays["action"], self.n_actions)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Send new priorities back (fire and forget; the shard ignores stale keys)."""
        wire.send(self.sock, "priorities", self.name, 0, None, {"keys": keys, "priority": priorities})


def shards_for_rank(rank: int, world: int, shards: int) -> list[int]:
    """Replay shards a rank samples from: its own (r, r+world, ...), or a shared one when shards < ranks."""
    mine = list(range(rank, shards, world))
    return mine or [rank % shards]


class ReplaySource:
    """The replay data path: sampled batches in, priorities out."""

    def __init__(self, net: wire.SecureContext, endpoints: list[dict], job, info: SpaceInfo, rank: int, world: int,
                 name: str):
        algo = job.algorithm
        self.stream = SampleStream(net, [endpoints[i]["sample"] for i in shards_for_rank(rank, world, len(endpoints))],
                                   algo.batch_size, algo.prefetch, name, job.algorithm_entry.load("actor").item_layout(job, info),
                                   info.n_actions)
        self.sock = self.stream.sock

    def take(self, version: int) -> dict[str, np.ndarray] | None:
        """A sampled batch if one has arrived."""
        return self.stream.next(0)

    def feedback(self, batch: dict, result: UpdateResult) -> None:
        """The core's new priorities for the sampled keys."""
        if result.priorities is not None:
            self.stream.update_priorities(np.array(batch["keys"]), result.priorities)

    def metrics(self) -> dict:
        """Figures for the heartbeat."""
        return {M.NET_DROPPED: self.stream.dropped}
