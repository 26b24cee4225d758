"""Replay shard role: prioritized replay serving one learner rank.

Experience arrives on a PULL socket from collectors; the learner asks for
batches and sends priority updates on a ROUTER socket. Started as
`python -m rlctl.roles.replay`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path

import numpy as np
import zmq

from rlctl import events
from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.data.buffers import PrioritizedReplay, SnapshotError, load_snapshot, save_snapshot
from rlctl.datapaths.replay import MAX_SAMPLE
from rlctl.envs import SpaceInfo, probe_space_info
from rlctl.data.frames import FrameReplay, frame_capacity, frame_stack_depth, parse_frame_items
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main

MAX_ITEMS = 1 << 20  # items one experience message may carry (a collector sends a few thousand)


class ReplayShard:
    """The shard's state: buffer (allocated from the first batch's layout), pending requests, counters."""

    def __init__(self, rc: RoleContext, info: SpaceInfo):
        self.rc = rc
        self.replay_spec = rc.job.replay
        # What one item is (an n-step transition, a sequence), from the env spaces: the only layout accepted.
        self.expected = {k: (tuple(shape), np.dtype(dt))
                         for k, (shape, dt) in rc.job.algorithm_entry.load("actor").item_layout(rc.job, info).items()}
        # Frame-stack observations (the atari preset) are stored one frame each (rlctl.data.frames).
        self.frame_stack = frame_stack_depth(rc.job, info)
        self.buffer: PrioritizedReplay | FrameReplay | None = None
        self.fields: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self.pending: deque[tuple[list, int]] = deque()
        self.dropped = 0
        self.sampled = 0  # transitions handed to the learner
        self.snapshot_path = Path(rc.checkpoint_dir) / f"{rc.name}.npz" if rc.checkpoint_dir else None
        self.snapshot_at = -1  # `inserted` at the last snapshot: an unchanged buffer is not written again

    def restore(self) -> None:
        """Continue from this shard's newest snapshot, if any (after a restart, or `rlctl run --resume`)."""
        if self.snapshot_path is None or not self.snapshot_path.exists():
            return
        started = time.monotonic()
        try:
            buffer = load_snapshot(self.snapshot_path, self.replay_spec.capacity,
                                   replay_class=FrameReplay if self.frame_stack else PrioritizedReplay)
        except (SnapshotError, OSError) as exc:
            self.rc.say(f"cannot use {self.snapshot_path} ({exc}); starting empty")
            return
        if buffer.layout() != self.expected:
            self.rc.say(f"{self.snapshot_path} holds another layout than this job's; starting empty")
            return
        self.buffer, self.fields, self.snapshot_at = buffer, buffer.layout(), buffer.inserted
        self.describe_memory()
        # The rate limit goes on from its balance point: samples owed for the inserts so far count as made.
        spi = self.replay_spec.samples_per_insert
        self.sampled = int(max(0, buffer.inserted - self.replay_spec.min_size) * spi)
        events.emit("snapshot_loaded", process=self.rc.name, path=str(self.snapshot_path), size=int(buffer.size),
                    inserted=int(buffer.inserted), seconds=round(time.monotonic() - started, 3))

    def describe_memory(self) -> None:
        """One log line: what a transition costs in memory, and in all."""
        per = self.buffer.bytes_per_item()
        how = f"frames of {self.frame_stack}-frame stacks kept once" if self.frame_stack else "whole transitions"
        self.rc.say(f"{how}: {per / 1024:.1f} KB per transition, {per * self.buffer.capacity / 2**30:.2f} "
                    f"GiB for {self.buffer.capacity}")

    def snapshot(self) -> None:
        """Write the contents to this host's disk (durably: a kill leaves the previous snapshot)."""
        if self.snapshot_path is None or self.buffer is None or self.buffer.inserted == self.snapshot_at:
            return
        started = time.monotonic()
        self.snapshot_path.parent.mkdir(parents=True, exist_ok=True)
        save_snapshot(self.buffer, self.snapshot_path)
        self.snapshot_at = self.buffer.inserted
        events.emit("snapshot_written", process=self.rc.name, size=int(self.buffer.size),
                    inserted=int(self.buffer.inserted), seconds=round(time.monotonic() - started, 3))

    def accepting(self) -> bool:
        """Rate limit: read experience only while inserts stay within samples / samples_per_insert."""
        spi = self.replay_spec.samples_per_insert
        if spi <= 0 or self.buffer is None:
            return True
        return self.buffer.inserted <= self.replay_spec.min_size + self.sampled / spi

    def take_experience(self, sock: zmq.Socket, admission: wire.Admission) -> None:
        """Insert the collector batches waiting on the experience socket: at most 64, and only while the rate limit
        accepts them, so sample requests are never starved."""
        for count, (_, msg) in enumerate(wire.receive_waiting(sock, admission=admission), 1):
            if msg is None:
                self.dropped += 1
            else:
                self.on_experience(msg)
            if count >= 64 or not self.accepting():
                break

    def take_requests(self, sock: zmq.Socket, admission: wire.Admission) -> None:
        """Take every learner request waiting on the sample socket."""
        for identity, msg in wire.receive_waiting(sock, routed=True, admission=admission):
            if msg is None:
                self.dropped += 1
            else:
                self.on_request(identity, msg)

    def on_experience(self, msg: wire.Message) -> None:
        """Insert one collector batch; dropped and counted unless it is exactly the job's item layout (from the env
        spaces, never from what arrives; frame stacks as frames and stack starts; floats finite) with one
        finite-or-not 1-D float priority per item."""
        arrays = dict(msg.arrays)
        prio = arrays.pop("priority", None)
        if prio is None or prio.ndim != 1 or prio.dtype.kind != "f" or not 0 < len(prio) <= MAX_ITEMS:
            self.dropped += 1
            return
        n = len(prio)
        r = self.replay_spec
        if self.frame_stack:
            items = parse_frame_items(arrays, self.expected, n, frame_capacity(r.capacity, self.frame_stack))
        elif ({k: (tuple(a.shape[1:]), a.dtype) for k, a in arrays.items()} == self.expected
                and all(a.ndim > 0 and len(a) == n for a in arrays.values())):
            items = arrays
        else:
            items = None
        if items is None or not wire.all_finite(arrays.values()):  # as received: frame items are no dict
            self.dropped += 1
            return
        if self.buffer is None:
            self.fields = self.expected
            kind = FrameReplay if self.frame_stack else PrioritizedReplay
            self.buffer = kind(r.capacity, self.expected, alpha=r.alpha, beta=r.beta, beta_steps=r.beta_steps,
                               seed=self.rc.seed)
            self.describe_memory()
        prio = np.abs(np.nan_to_num(prio.astype(np.float64), nan=0.0, posinf=0.0))
        self.buffer.add(items, prio)

    def ready(self) -> bool:
        """True once the shard holds enough to serve samples."""
        return self.buffer is not None and self.buffer.size >= max(1, self.replay_spec.min_size)

    def serve(self, sock: zmq.Socket) -> None:
        """Answer every pending sample request."""
        while self.pending and self.ready():
            identity, n = self.pending.popleft()
            batch, keys, weights = self.buffer.sample(n)
            self.sampled += n
            wire.send(sock, "batch", self.rc.name, 0, None, {**batch, "keys": keys, "weights": weights}, prefix=identity)

    def on_request(self, identity: list, msg: wire.Message) -> None:
        """A learner's sample request or priority update."""
        if msg.kind == "sample":
            n = msg.meta.get("n")
            if not isinstance(n, int) or not 1 <= n <= MAX_SAMPLE:
                self.dropped += 1
                return
            self.pending.append((identity, n))
        elif msg.kind == "priorities":
            keys, prio = msg.arrays.get("keys"), msg.arrays.get("priority")
            if self.buffer is None or keys is None or prio is None or keys.shape != prio.shape or keys.dtype != np.int64:
                self.dropped += 1
                return
            self.buffer.update_priorities(keys, np.abs(np.nan_to_num(prio.astype(np.float64))))
        else:
            self.dropped += 1


def run(rc: RoleContext, stop: StopFlag) -> None:
    """The shard loop: insert, serve, update priorities, report."""
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    info = probe_space_info(rc.job.env)
    shard = ReplayShard(rc, info)
    # Small queues (rcvhwm 1 never woke the reader again) and buffers: see wire.BUFFERED_TRANSITIONS. No frame
    # larger than the biggest field of the most items a message may carry is even received.
    frame = MAX_ITEMS * max(math.prod(shape) * dt.itemsize for shape, dt in shard.expected.values())
    exp_sock = net.server(zmq.PULL, rc.binds["experience"], rcvhwm=2,
                          rcvbuf=wire.experience_buffer_bytes(info.obs_bytes), maxmsgsize=frame)
    smp_sock = net.server(zmq.ROUTER, rc.binds["sample"], sndhwm=64, rcvhwm=1000,
                          maxmsgsize=wire.CONTROL_MAXMSGSIZE + 16 * MAX_SAMPLE)
    # Experience comes from collectors (an inference server sends its collectors'); only learners sample.
    pushers = wire.Admission(rc.keys, collector=wire.OWN_NAME, inference=wire.ANY_COLLECTOR)
    samplers = wire.Admission(rc.keys, learner=wire.ANY_RANK)
    shard.restore()
    interval = rc.job.replay.snapshot_interval_s
    next_snapshot = time.monotonic() + interval
    inserted_last = shard.buffer.inserted if shard.buffer is not None else 0
    sampled_last, last_t = shard.sampled, time.monotonic()
    rc.say(f"capacity {rc.job.replay.capacity}, alpha {rc.job.replay.alpha}, listening")
    poller_all, poller_smp = zmq.Poller(), zmq.Poller()
    for p in (poller_all, poller_smp):
        p.register(smp_sock, zmq.POLLIN)
    poller_all.register(exp_sock, zmq.POLLIN)
    while not stop:
        polled = dict((poller_all if shard.accepting() else poller_smp).poll(100))
        if exp_sock in polled:
            shard.take_experience(exp_sock, pushers)
        if smp_sock in polled:
            shard.take_requests(smp_sock, samplers)
        shard.serve(smp_sock)
        now = time.monotonic()
        if control.due(now):
            inserted = shard.buffer.inserted if shard.buffer else 0
            dt = max(now - last_t, 1e-9)
            frames = {M.REPLAY_FRAMES_PER_ITEM: shard.buffer.frames_per_item()} if isinstance(
                shard.buffer, FrameReplay) else {}
            control.heartbeat({
                **frames, M.REPLAY_SIZE: shard.buffer.size if shard.buffer else 0, M.REPLAY_INSERTED: inserted,
                M.REPLAY_INSERT_PER_S: (inserted - inserted_last) / dt,
                M.REPLAY_SAMPLED_PER_S: (shard.sampled - sampled_last) / dt,
                M.REPLAY_PENDING: len(shard.pending), M.NET_DROPPED: shard.dropped,
            })
            inserted_last, sampled_last, last_t = inserted, shard.sampled, now
        if interval and now >= next_snapshot:
            shard.snapshot()
            next_snapshot = time.monotonic() + interval
    shard.snapshot()  # at stop, also when the supervisor is gone: the contents outlive the process
    net.close()


if __name__ == "__main__":
    role_main(run)
