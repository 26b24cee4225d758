"""Weights sealed once per version for other hosts: encrypted and hashed by learner rank 0 once, sent as ciphertext
in chunks over a socket without CURVE (and on through relays unopened), opened once by each host.

ZeroMQ's CURVE encrypts each subscriber's copy apart, about 0.1-0.2 s of CPU per 40 MB copy at each end here: a
10M-parameter version to 16 hosts cost 3-6 s of CPU, more than the whole 3 s a version may take to reach 1,000
collectors (issue 32). Sealed, the version is encrypted once (AES-256-CTR, ~6 ms per 40 MB with AES-NI) and hashed
once (SHA-256, ~23 ms), and every copy on the wire is the same bytes; each host hashes and decrypts it once.

A version travels as:

* the seal, on the CURVE weights socket (`SEALED`): the version's (generation, version), a fresh random key and
  IV, and the SHA-256 digest of each chunk of the ciphertext. CURVE authenticates it as the job's and keeps it secret;
* the ciphertext in chunks of at least 4 MiB (`chunk_bytes`), on the bulk socket (`BulkPublisher`, plain TCP): each
  one frame of the publisher's topic (`token`), then a wire message naming (generation, version) and the chunk's
  index, with the chunk as its one array.

A subscriber takes a chunk only with the seal of the same stamp, and only if its digest matches: bytes on the bulk
socket that anyone else wrote (it has no authentication) are dropped and counted, whoever knows a version's key
included, since the digests came over CURVE. It opens the version once every chunk has come. Chunks let a relay
with relays below it hand each one on as it arrives, unopened, with the seal it came with under the relay's own
token (`BulkSubscriber.forward`): a version crosses a tree of relays in the time of one copy plus a chunk per level,
not a whole copy, an opening and a sealing per level; and a host that lags loses chunks at its own queue, not the
others' time. The key is new for every version, so no key stream repeats. The bulk socket sends only to subscribers
of its topic (a random token that rides in the seals), and applies no other subscription (ZMQ_XPUB_MANUAL; an empty
one would match everything): a peer that did not take a seal over CURVE is sent nothing, nor does its subscribing
make the publisher send again.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, replace

import numpy as np
import zmq

from rlctl.net import wire

SEALED, BULK = "weights-sealed", "weights-bulk"
TOKEN_BYTES = 16  # the bulk socket's topic
# Inbound on the bulk publisher are only subscriptions: nothing longer than a topic's frame is taken.
_SUBSCRIPTION_MAXMSGSIZE = 64
_BUFFERS = 3  # ciphertext buffers kept: the newest (re-publications), one in flight, one to write
_BLOCK = 16  # AES's block: cryptography's update_into wants that much room past the input (older versions)
CHUNK_BYTES = 4 << 20  # the least chunk: a 10M-parameter version is 10 of them
MAX_CHUNKS = 256  # a seal's digests stay within a wire header (64 chars of hex each)
BULK_HWM = 4 * 10  # chunks queued per peer either way: a few versions of a 10M-parameter model

Stamp = tuple[int, int]
Key = tuple[Stamp, bytes]  # a version's stamp and the token of the publisher that sealed it


def chunk_bytes(size: int) -> int:
    """The bytes per chunk of a ciphertext of `size` bytes (the last chunk may be shorter): both ends compute it."""
    per = -(-size // MAX_CHUNKS)
    return max(CHUNK_BYTES, -(-per // _BLOCK) * _BLOCK)


def chunk_spans(size: int) -> list[tuple[int, int]]:
    """(start, stop) of each chunk of a ciphertext of `size` bytes; one (empty) chunk for 0 bytes."""
    step = chunk_bytes(size)
    return [(start, min(start + step, size)) for start in range(0, size, step)] or [(0, 0)]


@dataclass(frozen=True)
class Seal:
    """What opens one version's ciphertext: its stamp, key, IV and the SHA-256 digest of each of its chunks."""

    stamp: Stamp
    key: bytes
    iv: bytes
    digests: tuple[bytes, ...]
    token: bytes  # the bulk socket's topic at the publisher that sealed it

    @property
    def id(self) -> Key:
        """Its stamp and token: the chunks it opens carry both."""
        return self.stamp, self.token

    def meta(self) -> dict:
        """The seal as a SEALED message's metadata (hex strings: wire headers carry no raw bytes)."""
        return {"gen": self.stamp[0], "key": self.key.hex(), "iv": self.iv.hex(),
                "digests": b"".join(self.digests).hex(), "token": self.token.hex()}

    @classmethod
    def from_message(cls, msg: wire.Message) -> "Seal | None":
        """The seal a SEALED message carries; None for anything malformed."""
        meta = msg.meta or {}
        gen = meta.get("gen")
        if type(gen) is not int:
            return None
        fields = []
        for name, size in (("key", 32), ("iv", 16), ("digests", None), ("token", TOKEN_BYTES)):
            text = meta.get(name)
            if not isinstance(text, str) or (len(text) != 2 * size if size else
                                             not 0 < len(text) <= 64 * MAX_CHUNKS or len(text) % 64):
                return None
            try:
                fields.append(bytes.fromhex(text))
            except ValueError:
                return None
        key, iv, digests, token = fields
        return cls((gen, msg.version), key, iv, tuple(digests[k:k + 32] for k in range(0, len(digests), 32)), token)


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
    digests = tuple(hashlib.sha256(view[a:b]).digest() for a, b in chunk_spans(size))
    return Seal(stamp, key, iv, digests, token), out


def unseal(s: Seal, ciphertext: np.ndarray, out: np.ndarray) -> bool:
    """Decrypt `ciphertext` into `out` (same byte size) if every chunk's digest is the seal's; False, `out`
    untouched, if not."""
    data = memoryview(ciphertext).cast("B")
    spans = chunk_spans(len(data))
    if len(data) != out.nbytes or len(spans) != len(s.digests) \
            or any(hashlib.sha256(data[a:b]).digest() != d for (a, b), d in zip(spans, s.digests)):
        return False
    _decrypt_into(s, data, memoryview(out).cast("B"))
    return True


def _decrypt_into(s: Seal, data: memoryview, out: memoryview, offset: int = 0) -> None:
    """Decrypt `data`, the ciphertext from byte `offset` on (a multiple of the block: a chunk's start), into `out`."""
    counter = (int.from_bytes(s.iv, "big") + offset // _BLOCK) % (1 << 128)
    _crypt_into(_cipher(s.key, counter.to_bytes(16, "big")).decryptor(), data, out)


class BulkPublisher:
    """The bulk socket of a weights publisher: an XPUB without CURVE, sending ciphertexts in chunks to its topic's
    subscribers (its own, or chunks taken from a publisher above: a relay's)."""

    def __init__(self, net: wire.SecureContext, endpoints: str | list[str]):
        self.token = secrets.token_bytes(TOKEN_BYTES)
        # Manual: a subscription takes effect only when this side applies it, and only the token's is (an empty
        # one, which would match every message, is not).
        self.sock = net.plain_server(zmq.XPUB, endpoints, sndhwm=BULK_HWM, xpub_manual=1,
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
        """The ciphertext, chunk by chunk, to every subscriber of the token."""
        self.read_subscriptions()
        trackers = []
        for index, (a, b) in enumerate(chunk_spans(ciphertext.nbytes)):
            header, chunk = wire.encode(BULK, sender, s.stamp[1], {"gen": s.stamp[0], "chunk": index},
                                        {"sealed": ciphertext[a:b]})
            self.sock.send(self.token, zmq.SNDMORE)
            self.sock.send(header, zmq.SNDMORE)
            trackers.append(self.sock.send(chunk, copy=False, track=True))
        self._keep(ciphertext, zmq.MessageTracker(*trackers))

    def handed_on(self, s: Seal) -> Seal:
        """A seal from the publisher above as this one hands it on: the same version, key and digests, under this
        publisher's token (its subscribers subscribe to that one only, across versions and learner restarts)."""
        return replace(s, token=self.token)

    def forward(self, frames: list) -> None:
        """A chunk as it came from the publisher above (checked against its seal), under this publisher's token, to
        its subscribers: the chunk's frames themselves, no copy."""
        self.read_subscriptions()
        self.sock.send_multipart([self.token, *frames[1:]], copy=False)


@dataclass
class _Assembly:
    """One version's ciphertext as its chunks come, each checked against its seal and kept as it came (the chunk,
    a view of its frame; and the frames, for a relay that hands them on again): no copy until it is opened."""

    seal: Seal
    chunks: dict[int, tuple[np.ndarray, list]]


class BulkSubscriber:
    """A subscription to bulk sockets, to the token of each seal kept. Each chunk is checked against its seal's
    digest as it comes (one that comes before its seal waits for it) and kept as it came; the newest version whose
    chunks have all come opens. (Several tokens at once: a relay taking versions from the relay above
    and from rank 0 while the one above comes back, a restarted learner.) With `forward` a list, each chunk taken
    goes into it too, as (seal, frames), for a relay to hand on, and `opened` keeps the chunks of the version opened
    last, for a relay's newcomers (`kept`)."""

    SEALS_KEPT = 4
    ASSEMBLIES = 2  # versions coming at once: the newest, and one a second publisher (a restart) still sends

    def __init__(self, net: wire.SecureContext, endpoints: str | list[str], size_bytes: int):
        self.spans = chunk_spans(size_bytes)
        self.sock = net.plain_client(zmq.SUB, endpoints, rcvhwm=BULK_HWM,
                                     maxmsgsize=max(chunk_bytes(size_bytes), wire.CONTROL_MAXMSGSIZE))
        self.tokens: set[bytes] = set()
        self.seals: dict[Key, Seal] = {}  # by stamp and token: one version may come from rank 0 and from a relay
        self.waiting: dict[Key, list[tuple[int, np.ndarray, list]]] = {}  # chunks that came before their seal
        self.assemblies: dict[Key, _Assembly] = {}
        self.held: Stamp = (-1, -1)  # the newest stamp opened: chunks of it or older are late
        self.forward: list[tuple[Seal, list]] | None = None
        self.opened: _Assembly | None = None
        self.dropped = 0

    def take_seal(self, s: Seal) -> None:
        """Keep a seal (the newest few); subscribed to the tokens of the seals kept, and only those. A seal whose
        chunks do not fit the model's size is dropped and counted."""
        if len(s.digests) != len(self.spans):
            self.dropped += 1
            return
        if s.stamp <= self.held or s.id in self.seals:
            return
        self.seals[s.id] = s
        for old in sorted(self.seals)[:-self.SEALS_KEPT]:
            del self.seals[old]
            self.waiting.pop(old, None)
        tokens = {kept.token for kept in self.seals.values()}
        for token in tokens - self.tokens:
            self.sock.setsockopt(zmq.SUBSCRIBE, token)
        for token in self.tokens - tokens:
            self.sock.setsockopt(zmq.UNSUBSCRIBE, token)
        self.tokens = tokens
        for index, data, frames in self.waiting.pop(s.id, []):
            self._take_chunk(s, index, data, frames)

    def take_waiting(self) -> None:
        """Take the chunks that arrived."""
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            arrived = self._parse(frames)
            if arrived is None:
                self.dropped += 1
                continue
            key, index, data = arrived
            if key[0] <= self.held:
                continue  # late: a version as new was opened
            if key in self.seals:
                self._take_chunk(self.seals[key], index, data, frames)
            else:
                waiting = self.waiting.setdefault(key, [])
                if len(waiting) < len(self.spans):
                    waiting.append((index, data, frames))
                for old in sorted(self.waiting)[:-self.SEALS_KEPT]:
                    del self.waiting[old]

    def _parse(self, frames: list) -> tuple[Key, int, np.ndarray] | None:
        token = frames[0].bytes if frames else b""
        if len(frames) < 2 or token not in self.tokens:
            return None
        try:
            msg = wire.decode(frames[1:])
        except wire.WireError:
            return None
        meta = msg.meta or {}
        gen, index, data = meta.get("gen"), meta.get("chunk"), msg.arrays.get("sealed")
        if msg.kind != BULK or type(gen) is not int or type(index) is not int or not 0 <= index < len(self.spans) \
                or data is None or data.dtype != np.uint8 or data.nbytes != self.spans[index][1] - self.spans[index][0]:
            return None
        return ((gen, msg.version), token), index, data

    def _take_chunk(self, s: Seal, index: int, data: np.ndarray, frames: list) -> None:
        """A chunk of a version whose seal is here: checked, kept, handed on."""
        assembly = self.assemblies.get(s.id)
        if assembly is not None and index in assembly.chunks:
            return  # a second copy (rank 0's and a relay's, while a relay below changes over)
        if assembly is None and len(self.assemblies) >= self.ASSEMBLIES and s.id < min(self.assemblies):
            return  # older than every version coming: it would only push one of them out
        if hashlib.sha256(data).digest() != s.digests[index]:
            self.dropped += 1
            return
        if assembly is None:
            while len(self.assemblies) >= self.ASSEMBLIES:
                del self.assemblies[min(self.assemblies)]
            assembly = self.assemblies[s.id] = _Assembly(s, {})
        assembly.chunks[index] = data, frames
        if self.forward is not None:
            self.forward.append((s, frames))

    def kept(self) -> list[tuple[Seal, dict[int, tuple[np.ndarray, list]]]]:
        """The version opened last and those coming, each with its chunks so far (by index), oldest first: what a
        relay hands a newcomer below (with `forward` on)."""
        kept = [self.opened] if self.opened is not None else []
        return [(a.seal, a.chunks) for a in kept + [self.assemblies[k] for k in sorted(self.assemblies)]]

    def _newest_whole(self, held: Stamp) -> _Assembly | None:
        whole = [a for a in self.assemblies.values() if len(a.chunks) == len(self.spans) and a.seal.stamp > held]
        return max(whole, key=lambda a: a.seal.id) if whole else None

    def ready(self, held: Stamp) -> bool:
        """Whether every chunk of a version newer than `held` has come."""
        return self._newest_whole(held) is not None

    def open_newest(self, out: np.ndarray, held: Stamp) -> Stamp | None:
        """Decrypt the newest version newer than `held` whose chunks have all come into `out`: its stamp, or None."""
        assembly = self._newest_whole(held)
        if assembly is None:
            return None
        view = memoryview(out).cast("B")
        for index, (a, b) in enumerate(self.spans):
            _decrypt_into(assembly.seal, memoryview(assembly.chunks[index][0]), view[a:b], a)
        self.held = assembly.seal.stamp
        self.opened = assembly if self.forward is not None else None
        for key in [k for k in self.assemblies if k[0] <= self.held]:
            del self.assemblies[key]
        for key in [k for k in self.waiting if k[0] <= self.held]:
            del self.waiting[key]
        return self.held
