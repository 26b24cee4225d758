"""Data-plane messages, sockets and keys.

A message is multipart: frame 0 a small msgpack header (kind, sender, policy
version, metadata and, for each array, its name, dtype and shape); the next
frames the raw array buffers, sent and received without copies. Nothing
received is unpickled: a frame that does not decode to exactly what its header
promises raises `WireError`, and callers drop and count it.
"""

from __future__ import annotations

import math
import os
import re
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgpack
import numpy as np
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

MAX_HEADER_BYTES = 64 * 1024
MAX_ARRAYS = 64
# Only plain numeric dtypes cross the wire: nothing that could carry objects.
ALLOWED_DTYPES = frozenset(
    {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"}
)
KEYS_ENV = "RLCTL_CURVE_KEYS"


class WireError(ValueError):
    """A received message that does not match the protocol."""


@dataclass
class Message:
    """One decoded message: kind, sender, version, metadata and zero-copy arrays."""

    kind: str
    sender: str = ""
    version: int = 0
    meta: dict = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    peer: str | None = None  # the sender's client public key (z85) as CURVE authenticated it, where known


def encode(kind: str, sender: str = "", version: int = 0, meta: dict | None = None,
           arrays: dict[str, np.ndarray] | None = None) -> list:
    """Frames for one message; array frames are the arrays' own buffers (no copy when contiguous)."""
    specs, buffers = [], []
    for name, arr in (arrays or {}).items():
        arr = np.ascontiguousarray(arr)
        specs.append((name, arr.dtype.name, list(arr.shape)))
        buffers.append(memoryview(arr).cast("B") if arr.size else b"")
    header = msgpack.packb({"k": kind, "s": sender, "v": int(version), "m": meta or {}, "a": specs})
    return [header, *buffers]


def kind_prefix(kind: str) -> bytes:
    """The leading bytes of every header of this kind: a SUB socket subscribed to them receives only this kind."""
    return b"\x85" + msgpack.packb("k") + msgpack.packb(kind)  # encode packs a 5-key map, "k" first


def decode(frames: list) -> Message:
    """Parse and validate frames (bytes or zmq.Frame); arrays are read-only views of the frames. Total: whatever a
    peer sends either decodes or raises WireError, so a receive loop that drops WireError survives every message."""
    try:
        return _decode(frames)
    except WireError:
        raise
    except Exception as exc:  # a case the checks below missed must cost one message, never the receiving process
        raise WireError(f"malformed message: {type(exc).__name__}") from None


def _decode(frames: list) -> Message:
    if not frames:
        raise WireError("empty message")
    head = _buffer(frames[0])
    if len(head) > MAX_HEADER_BYTES:
        raise WireError("header too large")
    try:
        header = msgpack.unpackb(head, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"undecodable header: {type(exc).__name__}") from None
    if not isinstance(header, dict):
        raise WireError("header is not a map")
    kind, sender, version, meta, specs = (header.get(k) for k in ("k", "s", "v", "m", "a"))
    if not isinstance(kind, str) or not isinstance(sender, str) or type(version) is not int:  # bool is an int
        raise WireError("bad kind/sender/version")
    if not isinstance(meta, dict) or not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise WireError("bad meta/array list")
    if len(specs) != len(frames) - 1:
        raise WireError(f"header names {len(specs)} arrays, message has {len(frames) - 1}")
    arrays = {}
    for spec, frame in zip(specs, frames[1:]):
        arrays.update([_array(spec, frame)])
    return Message(kind, sender, version, meta, arrays)


def _array(spec: Any, frame: Any) -> tuple[str, np.ndarray]:
    if not (isinstance(spec, list) and len(spec) == 3):
        raise WireError("bad array spec")
    name, dtype, shape = spec
    if not isinstance(name, str) or not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise WireError(f"bad array name/dtype {dtype!r}")
    # type(d) is int: msgpack's true and false are ints to isinstance, and numpy refuses them as dimensions.
    if (not isinstance(shape, list) or len(shape) > 8 or not all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
            or math.prod(d for d in shape if d) >= 1 << 40):  # [2**39, 2**39, 0]: empty, yet no array numpy can make
        raise WireError("bad array shape")
    buf = _buffer(frame)
    dt = np.dtype(dtype)
    if math.prod(shape) * dt.itemsize != len(buf):  # exact integers: np.prod would wrap past 2**63
        raise WireError(f"array {name!r}: {len(buf)} bytes do not match {dtype}{shape}")
    return name, np.frombuffer(buf, dtype=dt).reshape(shape)


def all_finite(arrays) -> bool:
    """True when every floating-point array among `arrays` holds only finite values: a NaN or an infinity in
    experience reaches the loss, and one update with it makes every weight NaN."""
    return all(np.isfinite(a).all() for a in arrays if a.dtype.kind == "f")


def actions_in_range(actions: np.ndarray, n_actions: int) -> bool:
    """Discrete actions (n_actions > 0) within [0, n_actions); continuous ones finite."""
    if actions.size == 0:
        return True
    if n_actions:
        return bool(actions.min() >= 0 and actions.max() < n_actions)
    return bool(np.isfinite(actions).all())


def _buffer(frame: Any) -> memoryview:
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    return memoryview(frame)


def send(sock: zmq.Socket, kind: str, sender: str = "", version: int = 0, meta: dict | None = None,
         arrays: dict[str, np.ndarray] | None = None, flags: int = 0, prefix: list | None = None) -> None:
    """Send one message; `prefix` holds routing frames (ROUTER identities)."""
    frames = [*(prefix or []), *encode(kind, sender, version, meta, arrays)]
    # Zero-copy only pays for big frames: below zmq.COPY_THRESHOLD pyzmq copies anyway, after building a tracked
    # Frame (a 4 KB-per-array experience batch cost 53 us of CPU to send that way, 31 us copied).
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, flags if i == last else flags | zmq.SNDMORE, copy=len(frame) < zmq.COPY_THRESHOLD)


def recv(sock: zmq.Socket, flags: int = 0, routed: bool = False) -> tuple[list, Message]:
    """Receive one message without copying; returns (routing frames, message). Raises WireError."""
    frames = sock.recv_multipart(flags=flags, copy=False)
    prefix = []
    if routed:
        prefix, frames = frames[:1], frames[1:]
    msg = decode(frames)
    if frames and isinstance(frames[0], zmq.Frame):
        try:
            msg.peer = frames[0].get("User-Id")  # set by the ZAP handshake of a CURVE server socket
        except zmq.ZMQError:
            msg.peer = None
    return prefix, msg


def receive_waiting(sock: zmq.Socket, routed: bool = False, admission: "Admission | None" = None):
    """Yield (routing frames, message) for every message already queued; a malformed one, or one `admission`
    refuses (its sender or role), yields message None."""
    while True:
        try:
            prefix, msg = recv(sock, zmq.NOBLOCK, routed)
        except zmq.Again:
            return
        except WireError:
            yield [], None
            continue
        yield (prefix, msg) if admission is None or admission.admits(msg) else (prefix, None)


ANY_MEMBER = "*"  # the owner of keys made by CurveKeys.generate() (benches, tests): it may speak for any member


@dataclass(frozen=True)
class CurveKeys:
    """One process's CURVE keys: the job's server public key, the server secret only where the process binds a
    socket, its own client key pair, and (where it binds) the client public keys it admits (every process's), with
    the name of the process each was given to (`owners`, in the same order)."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    allowed: tuple[bytes, ...] = ()
    owners: tuple[str, ...] = ()

    @classmethod
    def generate(cls) -> "CurveKeys":
        """Fresh keys for one process that both binds and connects (tests, benches): its one client key may send
        as any member."""
        sp, ss = zmq.curve_keypair()
        cp, cs = zmq.curve_keypair()
        return cls(sp, ss, cp, cs, (cp,), (ANY_MEMBER,))

    def for_process(self, pair: tuple[bytes, bytes], binds: bool, owners: dict[bytes, str]) -> "CurveKeys":
        """Keys for one process of this job: its own client `pair`; the server secret and the admitted client keys
        (public key -> owning process) only if it `binds` a socket."""
        if not binds:
            return CurveKeys(self.server_public, b"", *pair)
        return CurveKeys(self.server_public, self.server_secret, *pair, tuple(owners), tuple(owners.values()))

    def owner(self, peer: str | None) -> str | None:
        """The process a client key (z85, as CURVE authenticated it) was given to; None for any other key."""
        return self._owner_of.get(peer or "")

    @cached_property
    def _owner_of(self) -> dict[str, str]:
        return {k.decode(): name for k, name in zip(self.allowed, self.owners)}

    def to_env(self) -> str:
        """One string for the child's environment (never its command line). z85 has no ',' and no ' '; a process
        name follows its 40-character key."""
        head = ",".join(k.decode() for k in (self.server_public, self.server_secret, self.client_public,
                                             self.client_secret))
        return head + "," + " ".join(k.decode() + name for k, name in zip(self.allowed, self.owners))

    @classmethod
    def from_env(cls, value: str | None = None) -> "CurveKeys":
        """Keys from $RLCTL_CURVE_KEYS."""
        value = value if value is not None else os.environ.get(KEYS_ENV, "")
        parts = value.split(",")
        ok = len(parts) == 5 and all(len(p) == 40 for p in (parts[0], parts[2], parts[3])) and len(parts[1]) in (0, 40)
        entries = parts[4].split() if ok else []
        if not ok or not all(len(e) > 40 for e in entries):
            raise RuntimeError(f"${KEYS_ENV} is missing or malformed: this process must be started by `rlctl run`")
        return cls(*(p.encode() for p in parts[:4]), tuple(e[:40].encode() for e in entries),
                   tuple(e[40:] for e in entries))


# How a role admitted to a server socket may name the sender in a message's header (Admission).
OWN_NAME = "own name"  # only as the process its key was given to
ANY_COLLECTOR = "any collector"  # as any collector (an inference server sends its collectors' experience)
ANY_RANK = "any rank"  # any name: a learner node's ranks share its torchrun agent's key; nothing routes by it
COLLECTOR_NAME = re.compile(r"collector-(0|[1-9][0-9]{0,8})")  # ASCII digits, as the plan names them


class Admission:
    """Who may send on one server socket: the roles admitted, and the sender every message is taken to come from,
    which is the process its CURVE key was given to, never the header's claim (headers that disagree are refused)."""

    def __init__(self, keys: CurveKeys, **roles: str):
        self.keys, self.roles = keys, roles

    def admits(self, msg: Message) -> bool:
        """True when `msg`'s key belongs to an admitted role and its header names a sender that key may use."""
        owner = self.keys.owner(msg.peer)
        if owner is None:
            return False
        if owner == ANY_MEMBER:
            return True
        rule = self.roles.get(owner.rpartition("-")[0])
        if rule == OWN_NAME:
            return msg.sender == owner
        if rule == ANY_COLLECTOR:
            return COLLECTOR_NAME.fullmatch(msg.sender) is not None
        return rule == ANY_RANK


class ClientKeyCheck:
    """ZAP credentials check: admits only the job's client keys (one per process)."""

    def __init__(self, allowed):
        self.allowed = frozenset([allowed] if isinstance(allowed, bytes) else allowed)

    def callback(self, domain: str, key: bytes) -> bool:
        """Called by the authenticator thread for each CURVE handshake (pyzmq passes the z85 key)."""
        return key in self.allowed


HANDSHAKE_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                      | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class HandshakeWatch(threading.Thread):
    """Counts refused handshakes (wrong server key, unknown client key) on one server socket's monitor."""

    def __init__(self, sock: zmq.Socket, stop: threading.Event):
        super().__init__(daemon=True)
        self.sock, self.stop_event = sock, stop
        # MONITOR_STOPPED too: disabling the monitor then wakes the thread (see wake).
        self.monitor = sock.get_monitor_socket(HANDSHAKE_FAILURES | zmq.EVENT_MONITOR_STOPPED)
        self.refused = 0

    def wake(self) -> None:
        """End the monitor now (its last event wakes the thread), rather than at the next poll timeout."""
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass  # the socket is closed already

    def run(self) -> None:
        while not self.stop_event.is_set():
            if self.monitor.poll(100):
                frames = self.monitor.recv_multipart()
                if len(frames[0]) >= 2 and int.from_bytes(frames[0][:2], "little") & HANDSHAKE_FAILURES:
                    self.refused += 1
        self.monitor.close(linger=0)


_unsent_dropped = threading.Event()


def drop_unsent_on_close() -> None:
    """Make every SecureContext.close of this process drop what its sockets have not sent yet, lingers regardless:
    called once the supervisor is gone, when the control socket's last heartbeat (linger 2 s) has nobody to reach
    and would only hold up the exit."""
    _unsent_dropped.set()


class SecureContext:
    """A zmq.Context whose sockets all use the job's CURVE keys; servers check clients through ZAP."""

    def __init__(self, keys: CurveKeys, io_threads: int = 1):
        self.keys = keys
        self.ctx = zmq.Context(io_threads=io_threads)  # each connection is encrypted on one of them
        self._auth: ThreadAuthenticator | None = None
        self._watches: list[HandshakeWatch] = []
        self._stop = threading.Event()

    def _ensure_auth(self) -> None:
        if self._auth is None:
            self._auth = ThreadAuthenticator(self.ctx)
            self._auth.start()
            self._auth.configure_curve_callback("*", credentials_provider=ClientKeyCheck(self.keys.allowed))

    def server(self, kind: int, endpoints: str | list[str], **opts: int) -> zmq.Socket:
        """A socket bound at `endpoints` (one or more) that only job members can talk to; refusals are counted."""
        if not self.keys.server_secret:
            raise RuntimeError("this process holds no server key: it may not bind sockets")
        self._ensure_auth()
        sock = self.ctx.socket(kind)
        sock.curve_server = True
        sock.curve_secretkey = self.keys.server_secret
        sock.curve_publickey = self.keys.server_public
        _apply(sock, opts)
        watch = HandshakeWatch(sock, self._stop)
        watch.start()
        self._watches.append(watch)
        for ep in _endpoint_list(endpoints):
            sock.bind(ep)
        return sock

    def client(self, kind: int, endpoints: str | list[str], **opts: int) -> zmq.Socket:
        """A socket connected to one or more job servers."""
        sock = self.ctx.socket(kind)
        sock.curve_serverkey = self.keys.server_public
        sock.curve_secretkey = self.keys.client_secret
        sock.curve_publickey = self.keys.client_public
        _apply(sock, opts)
        for ep in _endpoint_list(endpoints):
            sock.connect(ep)
        return sock

    def plain_server(self, kind: int, endpoints: str | list[str], **opts: int) -> zmq.Socket:
        """A socket bound at `endpoints` WITHOUT CURVE: anyone who reaches it may connect. Only for bytes sealed
        apart (rlctl.net.sealed), whose key and digest travel over a CURVE socket."""
        sock = self.ctx.socket(kind)
        _apply(sock, opts)
        for ep in _endpoint_list(endpoints):
            sock.bind(ep)
        return sock

    def plain_client(self, kind: int, endpoints: str | list[str], **opts: int) -> zmq.Socket:
        """A socket connected WITHOUT CURVE to `plain_server` sockets (sealed bytes only)."""
        sock = self.ctx.socket(kind)
        _apply(sock, opts)
        for ep in _endpoint_list(endpoints):
            sock.connect(ep)
        return sock

    @property
    def refused(self) -> int:
        """Handshakes refused on this process's server sockets."""
        return sum(w.refused for w in self._watches)

    def close(self) -> None:
        """Stop helper threads and close every socket, each with its own linger (control flushes its last heartbeat)."""
        self._stop.set()
        for w in self._watches:
            w.wake()
        for w in self._watches:
            w.join(timeout=1)
        if self._auth is not None:
            self._auth.stop()
        self.ctx.destroy(linger=0 if _unsent_dropped.is_set() else None)


# Experience socket buffers (kernel, each side) hold about this many transitions, whatever an observation's size.
# They bound what waits between a collector and a rate-limited shard: 64 KB buffers held ~1,300 CartPole
# transitions per collector and side, so with 24 collectors a shard inserted data ~5,000 updates old (older than
# its whole contents) and Ape-X's Q-values overshot to twice their bound; ~64 keep it as fresh as with 2 collectors.
BUFFERED_TRANSITIONS = 64
SOCKET_BUFFER_MIN, SOCKET_BUFFER_MAX = 4096, 4 << 20


def experience_buffer_bytes(obs_bytes: int) -> int:
    """Kernel buffer bytes of experience sockets (collector PUSH, shard PULL): BUFFERED_TRANSITIONS transitions of
    two observations, within [4 KB, 4 MB] (large observations keep the bandwidth they need)."""
    return min(max(BUFFERED_TRANSITIONS * 2 * int(obs_bytes), SOCKET_BUFFER_MIN), SOCKET_BUFFER_MAX)


# Frames larger than this are refused by ZeroMQ before they are allocated, unless a socket says otherwise (sockets
# that carry experience, samples, rollouts or weights set their limit from the job's layouts).
CONTROL_MAXMSGSIZE = 1 << 20


def _endpoint_list(endpoints: str | list[str]) -> list[str]:
    return [endpoints] if isinstance(endpoints, str) else endpoints


def _apply(sock: zmq.Socket, opts: dict[str, int]) -> None:
    sock.setsockopt(zmq.LINGER, opts.pop("linger", 0))
    sock.setsockopt(zmq.MAXMSGSIZE, opts.pop("maxmsgsize", CONTROL_MAXMSGSIZE))
    for name, value in opts.items():
        sock.setsockopt(getattr(zmq, name.upper()), value)
