"""Weights sealed once per version for other hosts: encrypted and hashed by learner rank 0 (or a relay) once, sent
as ciphertext over a socket without CURVE, opened once by each host.

ZeroMQ's CURVE encrypts each subscriber's copy apart, about 0.1-0.2 s of CPU per 40 MB copy at each end here: a
10M-parameter version to 16 hosts cost 3-6 s of CPU, more than the whole 3 s a version may take to reach 1,000
collectors (issue 32). Sealed, the version is encrypted once (AES-256-CTR, ~6 ms per 40 MB with AES-NI) and hashed
once (SHA-256, ~23 ms), and every copy on the wire is the same bytes; each host hashes and decrypts it once.

Two messages make a version:

* the seal, on the CURVE weights socket (`SEALED`): the version's (generation, version), a fresh random key and
  IV, and the SHA-256 digest of the ciphertext. CURVE authenticates it as the job's and keeps it secret;
* the ciphertext, on the bulk socket (`BulkPublisher`, plain TCP): one frame of the publisher's topic (`token`),
  then a wire message naming (generation, version) with the ciphertext as its one array.

A subscriber opens a ciphertext only with the seal of the same stamp, and only if its digest matches: bytes on the
bulk socket that anyone else wrote (it has no authentication) are dropped and counted, whoever knows a version's key
included, since the digest came over CURVE. The key is new for every version, so no key stream repeats. The bulk
socket sends only to subscribers of its topic, a random token that rides in the seals, and applies no other
subscription (ZMQ_XPUB_MANUAL; an empty one would match everything): a peer that did not take a seal over CURVE is
sent nothing, nor does its subscribing make the publisher send again.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import numpy as np
import zmq

from rlctl.net import wire

SEALED, BULK = "weights-sealed", "weights-bulk"
TOKEN_BYTES = 16  # the bulk socket's topic
# Inbound on the bulk publisher are only subscriptions: nothing longer than a topic's frame is taken.
_SUBSCRIPTION_MAXMSGSIZE = 64
_BUFFERS = 3  # ciphertext buffers kept: the newest (re-publications), one in flight, one to write
_BLOCK = 16  # AES's block: cryptography's update_into wants that much room past the input (older versions)

Stamp = tuple[int, int]


@dataclass(frozen=True)
class Seal:
    """What opens one version's ciphertext: its stamp, key, IV and the ciphertext's SHA-256 digest."""

    stamp: Stamp
    key: bytes
    iv: bytes
    digest: bytes
    token: bytes  # the bulk socket's topic at the publisher that sealed it

    def meta(self) -> dict:
        """The seal as a SEALED message's metadata (hex strings: wire headers carry no raw bytes)."""
        return {"gen": self.stamp[0], "key": self.key.hex(), "iv": self.iv.hex(), "digest": self.digest.hex(),
                "token": self.token.hex()}

    @classmethod
    def from_message(cls, msg: wire.Message) -> "Seal | None":
        """The seal a SEALED message carries; None for anything malformed."""
        meta = msg.meta or {}
        gen = meta.get("gen")
        if type(gen) is not int:
            return None
        fields = []
        for name, size in (("key", 32), ("iv", 16), ("digest", 32), ("token", TOKEN_BYTES)):
            text = meta.get(name)
            if not isinstance(text, str) or len(text) != 2 * size:
                return None
            try:
                fields.append(bytes.fromhex(text))
            except ValueError:
                return None
        return cls((gen, msg.version), *fields)


def _cipher(key: bytes, iv: bytes):
    # Imported here: ~0.1 s at start-up, which a job on one host (every process on the board) never needs.
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    return Cipher(algorithms.AES(key), modes.CTR(iv))


def _crypt_into(stream, data: memoryview, out: memoryview) -> None:
    """Run `data` through a CTR stream into `out` (the same length): update_into wants room for a block more than
    its input in older cryptography releases, so the last block goes through update()."""
    head = max(0, len(data) - _BLOCK)
    if head:
        stream.update_into(data[:head], out)
    out[head:] = stream.update(data[head:])


def seal(params, stamp: Stamp, token: bytes, out: np.ndarray | None = None) -> tuple[Seal, np.ndarray]:
    """Encrypt parameters under a fresh key into `out` (a uint8 array of their byte size; a new one if None): its
    seal and the ciphertext. `params`: one flat float32 vector, or float32 arrays in flat_parameters order, one
    stream over all of them (no flat copy is made first)."""
    arrays = [params] if isinstance(params, np.ndarray) else params
    size = sum(a.nbytes for a in arrays)
    out = np.empty(size, dtype=np.uint8) if out is None else out
    key, iv = secrets.token_bytes(32), secrets.token_bytes(16)
    stream, view, offset = _cipher(key, iv).encryptor(), memoryview(out), 0
    for a in arrays:
        data = memoryview(np.ascontiguousarray(a, dtype=np.float32)).cast("B")
        _crypt_into(stream, data, view[offset:offset + len(data)])
        offset += len(data)
    return Seal(stamp, key, iv, hashlib.sha256(out).digest(), token), out


def unseal(s: Seal, ciphertext: np.ndarray, out: np.ndarray) -> bool:
    """Decrypt `ciphertext` into `out` (same byte size) if its digest is the seal's; False, `out` untouched, if not."""
    data = memoryview(ciphertext).cast("B")
    view = memoryview(out).cast("B")
    if len(data) != len(view) or hashlib.sha256(data).digest() != s.digest:
        return False
    _crypt_into(_cipher(s.key, s.iv).decryptor(), data, view)
    return True


class BulkPublisher:
    """The bulk socket of a weights publisher: an XPUB without CURVE, sending ciphertexts to its topic's subscribers."""

    def __init__(self, net: wire.SecureContext, endpoints: str | list[str]):
        self.token = secrets.token_bytes(TOKEN_BYTES)
        # Manual: a subscription takes effect only when this side applies it, and only the token's is (an empty
        # one, which would match every message, is not).
        self.sock = net.plain_server(zmq.XPUB, endpoints, sndhwm=2, xpub_manual=1,
                                     maxmsgsize=_SUBSCRIPTION_MAXMSGSIZE)
        self.joins = 0  # subscriptions to the token so far (a peer that resubscribes counts again)
        self.last: tuple[Seal, np.ndarray] | None = None  # the newest version sealed: a re-publication reuses it
        # Ciphertext buffers, each with the tracker of its last send: one is written again only once ZeroMQ has
        # let go of it (a fresh 40 MB array cost ~15 ms of page faults per version).
        self.buffers: list[tuple[np.ndarray, zmq.MessageTracker | None]] = []

    def read_subscriptions(self) -> None:
        """Take the subscriptions that arrived: the token's applied (to the peer that sent it) and counted,
        anything else ignored."""
        while True:
            try:
                event = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if event[1:] != self.token:
                continue
            if event[:1] == b"\x01":
                self.sock.setsockopt(zmq.SUBSCRIBE, self.token)
                self.joins += 1
            elif event[:1] == b"\x00":
                self.sock.setsockopt(zmq.UNSUBSCRIBE, self.token)

    def sealed(self, stamp: Stamp, params) -> tuple[Seal, np.ndarray]:
        """This stamp's seal and ciphertext, sealed now (`params()` gives what `seal` takes) unless it was the last
        one sealed."""
        if self.last is None or self.last[0].stamp != stamp:
            arrays = params()
            size = sum(a.nbytes for a in ([arrays] if isinstance(arrays, np.ndarray) else arrays))
            self.last = seal(arrays, stamp, self.token, self._free_buffer(size))
        return self.last

    def _free_buffer(self, size: int) -> np.ndarray | None:
        """A buffer of `size` bytes that neither ZeroMQ nor `last` holds; None (seal makes one) if all are held."""
        held = self.last[1] if self.last is not None else None
        for k, (buf, tracker) in enumerate(self.buffers):
            if buf is not held and buf.nbytes == size and (tracker is None or tracker.done):
                self.buffers[k] = (buf, None)
                return buf
        return None

    def _keep(self, buf: np.ndarray, tracker: zmq.MessageTracker) -> None:
        for k, (kept, _) in enumerate(self.buffers):
            if kept is buf:
                self.buffers[k] = (buf, tracker)
                return
        if len(self.buffers) < _BUFFERS:
            self.buffers.append((buf, tracker))

    def send(self, sender: str, s: Seal, ciphertext: np.ndarray) -> None:
        """The ciphertext to every subscriber of the token."""
        self.read_subscriptions()
        frames = [self.token, *wire.encode(BULK, sender, s.stamp[1], {"gen": s.stamp[0]}, {"sealed": ciphertext})]
        for frame in frames[:-1]:
            self.sock.send(frame, zmq.SNDMORE)
        self._keep(ciphertext, self.sock.send(frames[-1], copy=False, track=True))


class BulkSubscriber:
    """A subscription to bulk sockets, to the token of each seal kept; keeps the newest ciphertext and the newest
    seals, and gives the newest version whose seal and ciphertext have both come. (Several tokens at once: a relay
    taking versions from the relay above and from rank 0 while the one above comes back, a restarted learner.)"""

    SEALS_KEPT = 4

    def __init__(self, net: wire.SecureContext, endpoints: str | list[str], size_bytes: int):
        self.size_bytes = size_bytes
        self.sock = net.plain_client(zmq.SUB, endpoints, rcvhwm=2,
                                     maxmsgsize=max(size_bytes, wire.CONTROL_MAXMSGSIZE))
        self.tokens: set[bytes] = set()
        self.seals: dict[tuple[Stamp, bytes], Seal] = {}  # by stamp and token: a relay reseals rank 0's versions
        self.ciphertext: tuple[Stamp, bytes, np.ndarray] | None = None
        self.dropped = 0

    def take_seal(self, s: Seal) -> None:
        """Keep a seal (the newest few); subscribed to the tokens of the seals kept, and only those."""
        self.seals[s.stamp, s.token] = s
        for old in sorted(self.seals)[:-self.SEALS_KEPT]:
            del self.seals[old]
        tokens = {kept.token for kept in self.seals.values()}
        for token in tokens - self.tokens:
            self.sock.setsockopt(zmq.SUBSCRIBE, token)
        for token in self.tokens - tokens:
            self.sock.setsockopt(zmq.UNSUBSCRIBE, token)
        self.tokens = tokens

    def take_waiting(self) -> None:
        """Take the ciphertexts that arrived, keeping the newest well-formed one."""
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            arrived = self._parse(frames)
            if arrived is None:
                self.dropped += 1
            elif self.ciphertext is None or arrived[0] > self.ciphertext[0]:
                self.ciphertext = arrived

    def _parse(self, frames: list) -> tuple[Stamp, bytes, np.ndarray] | None:
        token = frames[0].bytes if frames else b""
        if len(frames) < 2 or token not in self.tokens:
            return None
        try:
            msg = wire.decode(frames[1:])
        except wire.WireError:
            return None
        gen, sealed = (msg.meta or {}).get("gen"), msg.arrays.get("sealed")
        if msg.kind != BULK or type(gen) is not int or sealed is None or sealed.dtype != np.uint8 \
                or sealed.shape != (self.size_bytes,):
            return None
        return (gen, msg.version), token, sealed

    def ready(self, held: Stamp) -> bool:
        """Whether a ciphertext newer than `held` and its seal have both come."""
        return self.ciphertext is not None and self.ciphertext[0] > held and self.ciphertext[:2] in self.seals

    def open_newest(self, out: np.ndarray, held: Stamp) -> Stamp | None:
        """Decrypt the newest ciphertext newer than `held` whose seal has come into `out`: its stamp, or None (no
        pair yet, or a ciphertext whose digest is not its seal's: dropped and counted)."""
        if not self.ready(held):
            return None
        stamp, token, ciphertext = self.ciphertext
        self.ciphertext = None
        if not unseal(self.seals[stamp, token], ciphertext, out):
            self.dropped += 1
            return None
        return stamp
