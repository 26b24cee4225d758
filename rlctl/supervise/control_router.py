"""The control router: the supervisor's end of the control channel (a CURVE ROUTER socket).

Each message is parsed (control.parse_control), authenticated (its sender is the process whose key CURVE
authenticated, never what its header claims) and dispatched to the handler of its kind; what fails any step is
dropped and counted (`net/dropped`), and the supervisor goes on. The router also remembers each sender's ROUTER
identity, so that learner ranks can be told to stop.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Callable

import zmq

from rlctl.launch.hosts import CONTROL_VIA_ENV
from rlctl.net import wire
from rlctl.net.control import BUNDLE, ControlError, ControlMessage, parse_bundle, parse_control
from rlctl.role_names import Role

if TYPE_CHECKING:
    from rlctl.launch.plan import ProcessSpec
    from rlctl.supervise.process_table import ProcessHandle
    from rlctl.job.spec import JobSpec

BINDING_ROLES = frozenset({Role.LEARNER, Role.REPLAY_SHARD, Role.INFERENCE, Role.RELAY})  # processes that bind sockets, and so hold the server secret

Handler = Callable[["ProcessHandle", ControlMessage], None]
DRAIN_BUDGET_S = 0.5  # of handling control messages per pass of the supervisor's loop: a backlog is caught up
# while its other work (a state.json written durably takes up to a second on a loaded machine) still gets its turn


def issue_keys(keys: wire.CurveKeys, processes: list[ProcessSpec]) -> tuple[wire.CurveKeys, dict[str, wire.CurveKeys]]:
    """(the supervisor's keys, each process's keys): every process gets a client key pair of its own, and the server
    secret only if it binds a socket; servers admit exactly these keys, and a control message counts only from the
    process its key was given to."""
    pairs = {p.name: zmq.curve_keypair() for p in processes}
    owners = {keys.client_public: "supervisor", **{cp: name for name, (cp, _) in pairs.items()}}
    own = dataclasses.replace(keys, allowed=tuple(owners), owners=tuple(owners.values()))
    return own, {p.name: keys.for_process(pairs[p.name], p.role in BINDING_ROLES, owners) for p in processes}


class ControlRouter:
    """Receives, authenticates and dispatches control messages; counts what it drops."""

    def __init__(self, keys: wire.CurveKeys, endpoint: str, spec: JobSpec, by_name: dict[str, ProcessHandle],
                 handlers: dict[str, Handler]):
        self.keys, self.endpoint, self.spec, self.by_name, self.handlers = keys, endpoint, spec, by_name, handlers
        self.net: wire.SecureContext | None = None
        self.socket: zmq.Socket | None = None
        self.dropped = 0
        self.received = 0  # messages taken off the socket (a relay's bundle is one)
        self.identities: dict[str, list] = {}  # control-channel sender -> ROUTER identity, for `stop`

    def open(self) -> None:
        """Bind the control socket."""
        self.net = wire.SecureContext(self.keys)
        self.socket = self.net.server(zmq.ROUTER, self.endpoint, rcvhwm=10000)

    def losses(self) -> tuple[int, int]:
        """(messages dropped, handshakes refused) on the control socket."""
        return self.dropped, (self.net.refused if self.net is not None else 0)

    def drain(self, timeout_ms: int) -> None:
        """Handle the control messages that arrive within timeout_ms, for at most DRAIN_BUDGET_S: messages that come
        faster than they are handled must not hold up the supervisor's loop (reaping, state.json, stop rules); the
        rest wait for the next call. Malformed ones are dropped and counted."""
        if self.socket is None or not self.socket.poll(timeout_ms):
            return
        until = time.monotonic() + DRAIN_BUDGET_S
        for identity, msg in wire.receive_waiting(self.socket, routed=True):
            self.received += 1
            self._handle(identity, msg)
            if self.received % 64 == 0 and time.monotonic() > until:
                return

    def _handle(self, identity: list, msg: wire.Message | None) -> None:
        try:
            if msg is None:
                raise ControlError("undecodable")
            if msg.kind == BUNDLE:
                self._dispatch_bundle(msg)
            else:
                self._dispatch(parse_control(msg.kind, msg.sender, msg.meta), identity, msg.peer)
        except ControlError:
            self.dropped += 1

    def _dispatch_bundle(self, msg: wire.Message) -> None:
        """A relay's bundle: each report parsed and dispatched on its own, if its process reports through that relay
        (its host's: the relay's key speaks for those processes only); a bad report is dropped, not its bundle."""
        relay = self.by_name.get(msg.sender)
        if relay is None or relay.spec.role != Role.RELAY or self.keys.owner(msg.peer) != relay.spec.name:
            raise ControlError(f"a bundle from {msg.sender}, which is not a relay sending with its own key")
        reports, bad = parse_bundle(msg.arrays)
        self.dropped += bad
        via = relay.spec.binds.get("control")
        for kind, sender, meta in reports:
            try:
                report = parse_control(kind, sender, meta)
                handle = self.by_name.get(report.sender)
                if handle is None or via is None or handle.spec.env.get(CONTROL_VIA_ENV) != via:
                    raise ControlError(f"{report.sender} does not report through {relay.spec.name}")
                self.handlers[report.kind](handle, report)
            except ControlError:
                self.dropped += 1

    def _dispatch(self, msg: ControlMessage, identity: list, peer: str | None) -> None:
        handler = self.handlers.get(msg.kind)
        if handler is None:
            raise ControlError(f"no handler for {msg.kind}")
        handle = self._sender(msg, peer)
        self.identities[msg.sender] = identity
        handler(handle, msg)

    def _sender(self, msg: ControlMessage, peer: str | None) -> ProcessHandle:
        """The process a message is from: the one its claimed name resolves to, if CURVE authenticated its key."""
        owner = self.keys.owner(peer)
        if msg.role == Role.LEARNER:
            # Learner senders are named by torchrun rank. A static rendezvous fixes each rank's node; an elastic one
            # numbers the nodes of each round (a spare's, or those after a node that left), so there the node is
            # the learner node whose key sent it.
            if msg.rank >= self.spec.learner_ranks:
                raise ControlError(f"no learner rank {msg.rank}")
            node = (owner if self.spec.elastic_learners and owner and owner.startswith(f"{Role.LEARNER}-")
                    else f"{Role.LEARNER}-{self.spec.learner_node_of(msg.rank)}")
            handle = self.by_name.get(node)
        else:
            handle = self.by_name.get(msg.sender)
        if handle is None:
            raise ControlError(f"no process {msg.sender} in the plan")
        if owner != handle.spec.name:  # a sender is who CURVE says, not what it claims
            raise ControlError(f"{msg.sender} sent with the key of {owner or 'nobody'}")
        return handle

    def stop_learners(self) -> bool:
        """Send `stop` to every learner rank that has spoken: they agree on a last update, checkpoint and exit 0.
        False when none has (then only signals reach them)."""
        told = [ident for sender, ident in self.identities.items() if sender.startswith("learner-")]
        for identity in told:
            wire.send(self.socket, "stop", "supervisor", prefix=identity, flags=zmq.NOBLOCK)
        return bool(told)

    def close(self) -> None:
        """Close the socket and its context."""
        if self.net is not None:
            self.net.close()
