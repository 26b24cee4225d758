"""A host's relay: takes each version of the policy once from learner rank 0 and hands it to the host's collectors,
evaluator or inference servers through a shared-memory board, and over a local socket to any that cannot map it
(rlctl.net.weights); and gathers those processes' hellos and heartbeats into one bundle per interval for the
supervisor (rlctl.roles.report_bundle). Rank 0 then sends one copy of each version per host, and the supervisor
takes one message per host and interval, not one per process and heartbeat.

The plan starts one on every host other than rank 0's with more than one process that takes weights. It binds
two Unix sockets in the run's private folder; the host's processes subscribe to the first (RLCTL_WEIGHTS_VIA) and
send their control messages to the second (RLCTL_CONTROL_VIA). They keep working while it is gone: they hold their
weights (a restarted relay reuses its board file, and the next version reaches them as before), their reports
wait in their sockets for the relay's next start, and the supervisor does not count them silent meanwhile. Each
version keeps rank 0's generation, so subscribers order versions across learner restarts as they would rank 0's own.
"""

from __future__ import annotations

import os
import time

import zmq

from rlctl import metric_names as M
from rlctl.algos import build_model
from rlctl.envs import probe_space_info
from rlctl.net import wire
from rlctl.net.control import BUNDLE
from rlctl.net.weights import WeightPublisher, WeightSubscriber
from rlctl.models import flat_parameters
from rlctl.roles.report_bundle import ReportBundle
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main, set_torch_threads


class WeightRelay:
    """One version in from learner rank 0, handed on to this host's subscribers."""

    def __init__(self, net: wire.SecureContext, upstream: str, bind: str, name: str, board: str | None, model):
        # The model gives the vector's size and dtype (a frame past one vector is refused) and holds the newest.
        self.model = model
        self.upstream = WeightSubscriber(net, upstream, model)
        self.local = WeightPublisher(net, bind, name, board)
        self.relayed = 0

    def step(self, timeout_ms: int) -> bool:
        """Wait up to `timeout_ms` for a new version and hand it on (to newcomers too: the current one); True when
        a new version went out."""
        if self.upstream.sock.poll(timeout_ms) and self.upstream.poll():
            self._send()
            self.relayed += 1
            return True
        if self.local.joined() and self.upstream.version >= 0:
            self._send()
        return False

    def _send(self) -> None:
        flat = self.upstream.flat if self.upstream.flat is not None else flat_parameters(self.model).numpy()
        self.local.relay(self.upstream.version, self.upstream.stamp[0], flat)

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
        poller.register(relay.upstream.sock, zmq.POLLIN)
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
                               M.NET_DROPPED: sum(r.upstream.dropped for r in weights) + gather.dropped})
            last_n, last_t = relayed, now
    gather.take_waiting()
    gather.send_due(float("inf"))  # the processes' last reports (final checkpoint, digests) go on


def run(rc: RoleContext, stop: StopFlag) -> None:
    """Relay every new version and bundle the host's control messages until stopped, with heartbeats."""
    set_torch_threads()
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    gather = ControlGather(net, rc.binds["control"], control)
    model = build_model(rc.job, probe_space_info(rc.job.env))
    relay = WeightRelay(net, rc.endpoints["weights"], rc.binds["weights"], rc.name, rc.weight_board, model)
    rc.say(f"relaying weights from {rc.endpoints['weights']} to this host's processes "
           f"{'through shared memory ' + rc.weight_board if rc.weight_board else 'over a local socket'}, "
           f"and their control messages to the supervisor, pid {os.getpid()}")
    try:
        serve([relay], gather, control, stop)
        control.last_metrics_line()
        relay.close()
    finally:
        net.close()


if __name__ == "__main__":
    role_main(run)
