"""A host's weights relay: takes each version of the policy once from learner rank 0 and hands it to the host's
collectors, evaluator or inference servers through a shared-memory board, and over a local socket to any that
cannot map it (rlctl.net.weights). Rank 0 then sends one copy of each version per host, not one per process.

The plan starts one on every host other than rank 0's with more than one process that takes weights. It binds
a Unix socket in the run's private folder; the host's processes subscribe there (RLCTL_WEIGHTS_VIA) and keep
the weights they hold while it is gone: a restarted relay reuses its board file, and the next version reaches
them as before. Each version keeps rank 0's generation, so subscribers order versions across learner restarts
as they would rank 0's own.
"""

from __future__ import annotations

import os
import time

from rlctl import metric_names as M
from rlctl.algos import build_model
from rlctl.envs import probe_space_info
from rlctl.net import wire
from rlctl.net.weights import WeightPublisher, WeightSubscriber
from rlctl.models import flat_parameters
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


def run(rc: RoleContext, stop: StopFlag) -> None:
    """Relay every new version until stopped, with heartbeats."""
    set_torch_threads()
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    model = build_model(rc.job, probe_space_info(rc.job.env))
    relay = WeightRelay(net, rc.endpoints["weights"], rc.binds["weights"], rc.name, rc.weight_board, model)
    rc.say(f"relaying weights from {rc.endpoints['weights']} to this host's processes "
           f"{'through shared memory ' + rc.weight_board if rc.weight_board else 'over a local socket'}, "
           f"pid {os.getpid()}")
    last_n, last_t = 0, time.monotonic()
    try:
        while not stop:
            relay.step(100)
            now = time.monotonic()
            if control.due(now):
                control.heartbeat({M.RELAY_VERSIONS_PER_S: (relay.relayed - last_n) / max(now - last_t, 1e-9),
                                   M.RELAY_WEIGHT_VERSION: relay.upstream.version,
                                   M.NET_DROPPED: relay.upstream.dropped})
                last_n, last_t = relay.relayed, now
        control.last_metrics_line()
        relay.close()
    finally:
        net.close()


if __name__ == "__main__":
    role_main(run)
