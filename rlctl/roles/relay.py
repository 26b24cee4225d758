"""A host's relay: takes each version of the policy once from learner rank 0 and hands it to the host's collectors,
evaluator or inference servers through a shared-memory board, and over a local socket to any that cannot map it
(rlctl.net.weights); and gathers those processes' hellos and heartbeats into one bundle per interval for the
supervisor (rlctl.roles.report_bundle). Rank 0 then sends one copy of each version per host, and the supervisor
takes one message per host and interval, not one per process and heartbeat.

The plan starts one on every host other than rank 0's with more than one process that takes weights. Past
`network.relay_fanout` relays they form a tree: the others take each version from a relay above them (bound at a
TCP port of its host besides its Unix socket), or from rank 0 while that relay is out of reach. It binds
two Unix sockets in the run's private folder; the host's processes subscribe to the first (RLCTL_WEIGHTS_VIA) and
send their control messages to the second (RLCTL_CONTROL_VIA). They keep working while it is gone: they hold their
weights (a restarted relay reuses its board file, and the next version reaches them as before), their reports
wait in their sockets for the relay's next start, and the supervisor does not count them silent meanwhile. Each
version keeps rank 0's generation, so subscribers order versions across learner restarts as they would rank 0's own.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from rlctl import metric_names as M
from rlctl.algos import build_model
from rlctl.envs import probe_space_info
from rlctl.net import wire
from rlctl.net.control import BUNDLE
from rlctl.net.weights import PUBLISHER_IO_THREADS, WeightPublisher, WeightSubscriber
from rlctl.models import flat_parameters
from rlctl.roles.report_bundle import ReportBundle
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main, set_torch_threads


@dataclass(frozen=True)
class SealedLinks:
    """A relay's bulk sockets for sealed versions (rlctl.net.sealed): where it takes them (the relay above, or rank
    0), rank 0's (its fallback below another relay), and where it hands them on to relays below; None: not sealed."""

    upstream: str | None = None
    root: str | None = None
    bind: str | None = None


# A relay whose relay above it (in a tree of relays) has been out of reach this long takes the versions from learner
# rank 0 meanwhile: a lost host's relay must not cut off the hosts below it.
FALLBACK_S = 3.0


def _peer(endpoint: str | bytes) -> str:
    """An endpoint as the socket monitor names it: without a source address (`tcp://source;destination`)."""
    text = endpoint.decode() if isinstance(endpoint, bytes) else endpoint
    scheme, _, rest = text.partition("://")
    return f"{scheme}://{rest.rpartition(';')[2]}"


class UpstreamWatch:
    """Whether a relay's subscription is connected to the relay above it; while it has not been for FALLBACK_S, the
    subscription is also connected to learner rank 0 (`root`), and cut from it once the relay above is back.
    Connects `sock` (unconnected: its first handshake must come after the monitor) to the relay above; `bulk`
    (socket, the relay above's bulk endpoint, rank 0's) follows `sock` to rank 0 and back."""

    def __init__(self, sock: zmq.Socket, parent: str, root: str, say=None,
                 bulk: tuple[zmq.Socket, str, str] | None = None):
        self.sock, self.parent, self.root, self.say = sock, parent, root, say or (lambda text: None)
        self.bulk = bulk
        self.monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.up, self.down_since, self.on_root = False, time.monotonic(), False
        sock.connect(parent)
        if bulk is not None:
            bulk[0].connect(bulk[1])

    def check(self, now: float) -> None:
        """Take the connection's events; connect to or cut from rank 0 as they say."""
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            if _peer(event["endpoint"]) != _peer(self.parent):
                continue  # rank 0's connection
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.up = True
            elif self.up:
                self.up, self.down_since = False, now
        if not self.up and not self.on_root and now - self.down_since >= FALLBACK_S:
            self.sock.connect(self.root)
            if self.bulk is not None:
                self.bulk[0].connect(self.bulk[2])
            self.on_root = True
            self.say(f"{self.parent} out of reach for {FALLBACK_S:g} s: taking the versions from learner rank 0 "
                     f"at {self.root} meanwhile")
        elif self.up and self.on_root:
            self.sock.disconnect(self.root)
            if self.bulk is not None:
                self.bulk[0].disconnect(self.bulk[2])
            self.on_root = False
            self.say(f"taking the versions from {self.parent} again")


class WeightRelay:
    """One version in from learner rank 0 (or, in a tree of relays, from the relay above), handed on to this host's
    subscribers (and to the relays below)."""

    def __init__(self, net: wire.SecureContext, upstream: str, bind: str | list[str], name: str, board: str | None,
                 model, root: str | None = None, say=None, bulk: "SealedLinks | None" = None):
        # The model gives the vector's size and dtype (a frame past one vector is refused) and holds the newest.
        self.model = model
        below = bool(root) and root != upstream  # a relay below another, rank 0 its fallback
        bulk = bulk or SealedLinks()
        sealed = bulk.upstream is not None and (not below or bulk.root is not None)
        self.upstream = WeightSubscriber(net, [] if below else upstream, model,
                                         bulk=([] if below else bulk.upstream) if sealed else None)
        links = (self.upstream.bulk.sock, bulk.upstream, bulk.root) if sealed else None
        self.watch = UpstreamWatch(self.upstream.sock, upstream, root, say, links) if below else None
        self.local = WeightPublisher(net, bind, name, board, bulk=bulk.bind)
        if sealed and bulk.bind:  # relays below take rank 0's chunks from here as they come, unopened
            self.upstream.bulk.forward = []
        self.forwarded = None  # the stamp whose seal went on last
        self.relayed = 0

    def step(self, timeout_ms: int) -> bool:
        """Wait up to `timeout_ms` for a new version and hand it on (to newcomers too: the current one); True when
        a new version went out."""
        new = self.upstream.wait(timeout_ms) and self.upstream.poll()
        self._forward()
        if self.watch is not None:
            # Only once the subscription is drained: a poll takes the first frame of a waiting message, and cutting
            # the connection it came on before its other frames are read aborts libzmq ("!_more", fq.cpp).
            self.watch.check(time.monotonic())
        if new:
            self._send()
            self.relayed += 1
            return True
        if self.local.joined():
            if self.upstream.version >= 0:
                self._send()
            self._forward_kept()
        return False

    @property
    def forwarding(self) -> bool:
        """Whether sealed versions go on to the relays below chunk by chunk as they come (`_forward`)."""
        return self.upstream.bulk is not None and self.upstream.bulk.forward is not None

    def _forward(self) -> None:
        """The chunks taken since the last step, on to the relays below, each version's seal before its first."""
        if not self.forwarding:
            return
        for s, frames in self.upstream.bulk.forward:
            if s.stamp != self.forwarded:
                self.local.forward_seal(s)
                self.forwarded = s.stamp
            self.local.forward_chunk(frames)
        self.upstream.bulk.forward.clear()

    def _forward_kept(self) -> None:
        """For a newcomer below, which missed the chunks as they went on: the version opened last and the chunks so
        far of one still coming, all again (the others below take them for late or second copies)."""
        if not self.forwarding:
            return
        for s, chunks in self.upstream.bulk.kept():
            self.local.forward_seal(s)
            for index in sorted(chunks):
                self.local.forward_chunk(chunks[index][1])

    def _send(self) -> None:
        flat = self.upstream.flat if self.upstream.flat is not None else flat_parameters(self.model).numpy()
        self.local.relay(self.upstream.version, self.upstream.stamp[0], flat, forwarded=self.forwarding)

    def close(self) -> None:
        """Remove the board's file (after a clean stop; a killed relay's successor reuses it)."""
        self.local.close()


class ControlGather:
    """The relay's control socket: its host's processes' hellos and heartbeats in, one bundle per interval out
    through the relay's own control client (the supervisor checks each report, and that its process is this host's)."""

    def __init__(self, net: wire.SecureContext, bind: str, control: ControlClient):
        self.net, self.control = net, control
        self.sock = net.server(zmq.ROUTER, bind, rcvhwm=10000)
        self.bundle = ReportBundle()
        self.undecodable = 0

    @property
    def dropped(self) -> int:
        """Messages dropped: undecodable, or refused by the bundle (not sent under the sender's own key)."""
        return self.undecodable + self.bundle.refused

    def take_waiting(self) -> None:
        """Take every message already queued."""
        for _, msg in wire.receive_waiting(self.sock, routed=True):
            if msg is None:
                self.undecodable += 1
            else:
                self.bundle.take(msg, self.net.keys.owner(msg.peer))

    def send_due(self, now: float) -> None:
        """Send the waiting reports if the interval has passed."""
        if self.bundle.due(now):
            for frame in self.bundle.frames(now):
                self.control.send(BUNDLE, {}, {"reports": frame})


def serve(weights: list[WeightRelay], gather: ControlGather, control: ControlClient, stop) -> None:
    """The relay's loop until `stop` is truthy: versions handed on, reports bundled, heartbeats of its own
    (bench/control_plane.py runs it with a relay per model size)."""
    poller = zmq.Poller()
    for relay in weights:
        for sock in relay.upstream.sockets:
            poller.register(sock, zmq.POLLIN)
    poller.register(gather.sock, zmq.POLLIN)
    last_n, last_t = 0, time.monotonic()
    while not stop:
        # Wakes for a version or a report, and at least every 0.1 s (newcomers to the weights), or when a bundle
        # is due.
        bundle = gather.bundle
        poller.poll(min(100, max(0, 1000 * (bundle.next_at - time.monotonic()))) if bundle.waiting else 100)
        for relay in weights:
            relay.step(0)
        gather.take_waiting()
        now = time.monotonic()
        gather.send_due(now)
        if control.due(now):
            relayed = sum(r.relayed for r in weights)
            control.heartbeat({M.RELAY_VERSIONS_PER_S: (relayed - last_n) / max(now - last_t, 1e-9),
                               M.RELAY_WEIGHT_VERSION: weights[0].upstream.version,
                               M.RELAY_REPORTS: bundle.taken,
                               M.WEIGHT_BOARD_SKIPS: sum(r.local.board_skips for r in weights),
                               M.NET_DROPPED: sum(r.upstream.dropped for r in weights) + gather.dropped})
            last_n, last_t = relayed, now
    gather.take_waiting()
    gather.send_due(float("inf"))  # the processes' last reports (final checkpoint, digests) go on


def run(rc: RoleContext, stop: StopFlag) -> None:
    """Relay every new version and bundle the host's control messages until stopped, with heartbeats."""
    set_torch_threads()
    tree = rc.binds.get("weights_tree")  # relays below this one take the weights from here
    # Each copy for a relay below goes out on its connection's I/O thread (encrypted there where not sealed), as on
    # learner rank 0.
    net = wire.SecureContext(rc.keys, PUBLISHER_IO_THREADS if tree else 1)
    control = ControlClient(net, rc)
    gather = ControlGather(net, rc.binds["control"], control)
    model = build_model(rc.job, probe_space_info(rc.job.env))
    relay = WeightRelay(net, rc.endpoints["weights"], [rc.binds["weights"], *([tree] if tree else [])], rc.name,
                        rc.weight_board, model, root=rc.endpoints.get("weights_root"), say=rc.say,
                        bulk=SealedLinks(rc.endpoints.get("weights_bulk"), rc.endpoints.get("weights_root_bulk"),
                                         rc.binds.get("weights_tree_bulk")))
    bulk = relay.upstream.bulk
    rc.say(f"relaying weights from {rc.endpoints['weights']}"
           f"{' (sealed, ciphertexts from ' + rc.endpoints['weights_bulk'] + ')' if bulk is not None else ''}"
           f" to this host's processes "
           f"{'through shared memory ' + rc.weight_board if rc.weight_board else 'over a local socket'}"
           f"{', and to relays below at ' + tree if tree else ''}"
           f"{' (each chunk on as it comes, unopened)' if relay.forwarding else ''}, "
           f"and their control messages to the supervisor, pid {os.getpid()}")
    try:
        serve([relay], gather, control, stop)
        control.last_metrics_line()
        relay.close()
    finally:
        net.close()


if __name__ == "__main__":
    role_main(run)
