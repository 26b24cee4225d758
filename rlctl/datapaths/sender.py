"""The collector side of every data path: PUSH experience to replay shards or to a learner rank, with backpressure."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import zmq

from rlctl.net import wire

if TYPE_CHECKING:
    from rlctl.roles.context import StopFlag


class ExperienceSender:
    """PUSH to replay shards (ZeroMQ spreads batches over the shards that have room) or to one learner rank."""

    def __init__(self, net: wire.SecureContext, endpoints: str | list[str], sender: str, kind: str, sndbuf: int):
        # Small queues and kernel buffers: when shards rate-limit (or a learner is busy), a collector blocks
        # within a batch or two instead of parking stale transitions in TCP buffers (see BUFFERED_TRANSITIONS).
        self.sock = net.client(zmq.PUSH, endpoints, sndhwm=1, sndbuf=sndbuf)
        self.sender, self.kind = sender, kind
        self.sent = 0

    def try_send(self, batch: dict[str, np.ndarray], version: int, sender: str | None = None) -> bool:
        """Send unless every shard is full (backpressure from a rate-limited shard); `sender` names the collector
        the experience is of (an inference server sends for many)."""
        try:
            wire.send(self.sock, self.kind, sender or self.sender, version, None, batch, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        self.sent += batch["reward"].size
        return True

    def send_blocking(self, batch: dict[str, np.ndarray], version: int, stop: StopFlag, on_wait,
                      sender: str | None = None) -> bool:
        """Send, waiting for room (backpressure) while calling `on_wait`; False if stopped first."""
        while not stop:
            if self.try_send(batch, version, sender):
                return True
            self.sock.poll(20, zmq.POLLOUT)
            on_wait()
        return False
