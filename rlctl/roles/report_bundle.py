"""A relay's bundle of its host's control messages: the hellos and heartbeats of the processes behind it, taken as
they come over the relay's control socket, merged per process and sent on to the supervisor as one message per
interval. The supervisor then takes a message per host and interval, not one per process and heartbeat; what it
checks of each report is unchanged (rlctl.net.control.parse_bundle, then parse_control for each).

Merging keeps what the supervisor would have made of the heartbeats one by one: the newest figures win (its metrics
hub merges them so too), and the episodes that ended are concatenated, none lost below MAX_MERGED_EPISODES.
"""

from __future__ import annotations

import msgpack
import numpy as np

from rlctl.net import wire
from rlctl.net.control import KINDS, LIST_METRICS, MAX_BUNDLE_REPORTS

BUNDLE_INTERVAL_S = 0.5  # how long a report may wait at the relay (a stop rule on returns waits that much more);
# state.json is written as often, and a process then costs the supervisor at most two reports a second
MAX_MERGED_EPISODES = 10_000  # per process and bundle: a collector sends at most 1000 per heartbeat, 10 a second
MAX_FRAME_BYTES = 512 * 1024  # a bundle's frame, well below the control sockets' 1 MiB limit


def merge_heartbeat(old: dict | None, new: dict) -> dict:
    """Two heartbeats of one process as one: the newest figures, the episodes of both."""
    if old is None:
        return new
    before, now = old.get("metrics"), new.get("metrics")
    if not isinstance(before, dict) or not isinstance(now, dict):
        return new  # not a heartbeat's shape: the supervisor's parser refuses it, not the relay
    metrics = {**before, **now}
    for key in LIST_METRICS:
        a, b = before.get(key), now.get(key)
        if isinstance(a, list) and isinstance(b, list):
            metrics[key] = (a + b)[-MAX_MERGED_EPISODES:]
    return {**old, **new, "metrics": metrics}


class ReportBundle:
    """The reports waiting at a relay, per process; `frames()` packs them into bundles and starts the next."""

    def __init__(self, interval_s: float = BUNDLE_INTERVAL_S):
        self.interval_s = interval_s
        self.hellos: dict[str, dict] = {}
        self.heartbeats: dict[str, dict] = {}
        self.next_at = 0.0
        self.taken = self.refused = 0

    def take(self, msg: wire.Message, owner: str | None) -> bool:
        """Keep one message if the process whose key sent it (`owner`, as CURVE authenticated it) sent it under its
        own name, as a hello or a heartbeat; False (counted) otherwise."""
        if owner != msg.sender or msg.kind not in KINDS:
            self.refused += 1
            return False
        if msg.kind == "hello":
            self.hellos[msg.sender] = msg.meta
        else:
            self.heartbeats[msg.sender] = merge_heartbeat(self.heartbeats.get(msg.sender), msg.meta)
        self.taken += 1
        return True

    @property
    def waiting(self) -> bool:
        """Whether any report waits."""
        return bool(self.hellos or self.heartbeats)

    def due(self, now: float) -> bool:
        """Whether a bundle should leave now: something waits and the interval since the last has passed."""
        return self.waiting and now >= self.next_at

    def frames(self, now: float) -> list[np.ndarray]:
        """The waiting reports as bundles' `reports` frames (a process's hello before its heartbeat), each under
        MAX_FRAME_BYTES and MAX_BUNDLE_REPORTS; the reports are cleared."""
        packed = [msgpack.packb(["hello", s, m]) for s, m in self.hellos.items()]
        packed += [msgpack.packb(["heartbeat", s, m]) for s, m in self.heartbeats.items()]
        self.hellos, self.heartbeats, self.next_at = {}, {}, now + self.interval_s
        chunks: list[list[bytes]] = [[]]
        size = 0
        for p in packed:
            if chunks[-1] and (size + len(p) > MAX_FRAME_BYTES or len(chunks[-1]) >= MAX_BUNDLE_REPORTS):
                chunks.append([])
                size = 0
            chunks[-1].append(p)
            size += len(p)
        header = msgpack.Packer().pack_array_header
        return [np.frombuffer(header(len(c)) + b"".join(c), dtype=np.uint8) for c in chunks if c]
