"""Policy weights from learner rank 0 to collectors and evaluators: over the network, or through shared memory.

Learner rank 0 publishes each new version in the forms its subscribers take, on one XPUB socket:

* "weights-sealed": for subscribers on other hosts, where the plan gives rank 0 a bulk socket: the version's seal
  (key, IV, chunk digests), its ciphertext sealed once for all of them on the bulk socket (rlctl.net.sealed);
* "weights": the flat float32 parameter vector over CURVE, a copy per subscriber (a relay's Unix socket; a
  publisher without a bulk socket);
* "weights-shared": a small notice naming version and slot of a `WeightBoard`, a file of SLOTS slots in /dev/shm
  that the learner writes each version into, for subscribers on its own host.

The plan names the board's file (RLCTL_WEIGHT_BOARD) for the processes on learner rank 0's host when any of them
subscribes; a host without /dev/shm uses the network for everyone. Subscribers subscribe to the leading header
bytes of one kind (`wire.kind_prefix`), and the publisher produces a form only while someone subscribes to it
(XPUB reports subscriptions). For a 10M-parameter net and 4 local collectors this replaces 4 x 40 MB of CURVE
encryption, TCP and decryption (about 0.4 s on 2 cores) with one 40 MB write (and a 40 MB copy for each reader
that copies; collectors hold the slot instead, below).

A slot's header holds the version its payload is (-1 while being written) and the publisher's generation: a
restarted learner continues from its checkpoint, so its versions repeat or go back, and subscribers order weights by
(generation, version) instead of version alone. A notice only wakes a reader: it takes whichever slot holds the
newest version. A reader that falls behind (a busy collector among many on few cores finds its small queue full
of old notices, whose slots were long rewritten) still gets the newest version: it once stayed on the weights it
started with, 1,800 versions behind a 24-collector Ape-X job's learner.

Readers take a slot in one of two ways:

* copied (evaluator, inference servers): into their own parameters, the header checked before and after, retried
  once if the writer overtook the copy;
* held (collectors, `zero_copy`): their parameters become views of the slot itself, kept under a shared lock on
  its bytes (an open-file-description lock, released when the reader moves on or dies) until they take a newer
  one. The writer rewrites only a slot that no reader holds and that is not the newest (it skips a version when
  every other slot is held, and writes the next one), so a held slot never changes under a collector's block.
  A host's 62 collectors then hold one copy of a 10M-parameter net, not 62 (2.5 GB), and take a version in
  microseconds instead of a 40 MB copy each.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat
import struct
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import zmq

from rlctl.net import wire
from rlctl.net.sealed import SEALED, BulkPublisher, BulkSubscriber, Seal
from rlctl.models import flat_parameters, load_flat_parameters, share_flat_storage

FULL, NOTICE = "weights", "weights-shared"
_HEADER = 64  # bytes before each slot's payload: int64 version, element count, generation; keeps payloads aligned
# The newest version, one that collectors still hold while they finish a block with it, and one to write.
SLOTS = 3
# Open-file-description locks (Linux): held per open file, not per process, so two readers in one process (the
# control-plane bench's simulated hosts) hold their slots apart; elsewhere readers copy.
_OFD_LOCKS = hasattr(fcntl, "F_OFD_SETLK")

# ZeroMQ encrypts each subscriber's copy on the I/O thread its connection belongs to, the whole version at once:
# with one thread rank 0 sent a 10M-parameter version to 16 hosts' relays in turn (~0.09 s each, 2.8 s in all here;
# 1.7 s with 4 threads on 2 cores). More threads than cores buy nothing.
PUBLISHER_IO_THREADS = min(4, os.cpu_count() or 1)

Stamp = tuple[int, int]  # (generation, version): the order of weights across learner restarts
NO_WEIGHTS: Stamp = (-1, -1)


def _open_board(path: str, writable: bool) -> int:
    """The board file's descriptor. The writer creates it exclusively (mode 0600, never through a symlink) or
    reuses one its own killed predecessor left (no O_TRUNC: readers that mapped it would fault on pages past a
    truncated end); readers open only a regular file of their own user that nobody else may write."""
    # A symlink planted at the name is refused (ELOOP), never followed; O_NONBLOCK: a FIFO planted there would block
    # open() until someone wrote to it, before the check below could refuse it (no effect on a regular file).
    nofollow = os.O_NOFOLLOW | os.O_NONBLOCK
    if writable:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | nofollow, 0o600)
        except FileExistsError:
            fd = os.open(path, os.O_RDWR | nofollow)
    else:
        fd = os.open(path, os.O_RDONLY | nofollow)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        os.close(fd)
        raise PermissionError(f"{path}: not a private file of this user (mode {st.st_mode & 0o777:o}, uid "
                              f"{st.st_uid}); refusing it")
    return fd


class WeightBoard:
    """A file of SLOTS float32 parameter vectors in shared memory, each slot tagged with its version."""

    def __init__(self, path: str, size: int, writable: bool):
        self.path, self.size = path, size
        fd = _open_board(path, writable)
        try:
            self.inode = os.fstat(fd).st_ino
            self.slot_bytes = slot_bytes = _HEADER + -(-size * 4 // _HEADER) * _HEADER
            if writable and os.fstat(fd).st_size != SLOTS * slot_bytes:
                os.ftruncate(fd, SLOTS * slot_bytes)
            elif os.fstat(fd).st_size != SLOTS * slot_bytes:
                raise ValueError(f"{path}: sized for another parameter count")
            self._map = mmap.mmap(fd, SLOTS * slot_bytes,
                                  prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd  # kept open: the slots' locks belong to it
        self.headers = [np.ndarray((3,), np.int64, self._map, k * slot_bytes) for k in range(SLOTS)]
        self.payloads = [np.ndarray((size,), np.float32, self._map, k * slot_bytes + _HEADER) for k in range(SLOTS)]
        self.held: int | None = None  # the slot this reader holds (hold_newest)
        if writable:
            for k, header in enumerate(self.headers):
                if self._lock(k, fcntl.F_WRLCK):  # a slot a reader holds keeps its version (a restarted writer)
                    header[:] = (-1, size, -1)
                    self._lock(k, fcntl.F_UNLCK)
        elif any(header[1] != size for header in self.headers):
            raise ValueError(f"{path}: holds {self.headers[0][1]} parameters, not {size}")

    @classmethod
    def create(cls, path: str, size: int) -> "WeightBoard":
        """A new board for `size` parameters (replacing any file at `path`)."""
        return cls(path, size, writable=True)

    @classmethod
    def open(cls, path: str, size: int) -> "WeightBoard":
        """An existing board, read-only; ValueError if it holds another parameter count, OSError if missing."""
        return cls(path, size, writable=False)

    def _lock(self, slot: int, kind: int) -> bool:
        """Take (F_RDLCK shared, F_WRLCK exclusive) or release (F_UNLCK) the lock on a slot's bytes without
        waiting; False when another open file holds it the other way. Always True without OFD locks."""
        if not _OFD_LOCKS:
            return True
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)
        request = struct.pack("hhqqi", kind, os.SEEK_SET, slot * self.slot_bytes, self.slot_bytes, 0)
        try:
            fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, request)
        except (BlockingIOError, PermissionError):
            return False
        return True

    def stamps(self) -> list[Stamp]:
        """Each slot's (generation, version); NO_WEIGHTS for one empty or being written."""
        return [(int(h[2]), int(h[0])) if h[0] >= 0 else NO_WEIGHTS for h in self.headers]

    def newest(self) -> tuple[int, Stamp]:
        """The slot of the newest complete weights and their stamp (NO_WEIGHTS: none yet)."""
        stamps = self.stamps()
        slot = max(range(SLOTS), key=lambda k: stamps[k])
        return slot, stamps[slot]

    def write(self, version: int, params, generation: int = 0) -> int | None:
        """Store parameters (tensors, in flat_parameters order, or one flat float32 vector) as `version` of
        `generation`, copied straight into the oldest slot that is neither the newest nor held by a reader; readers
        of that slot see -1 until it is complete. The slot written, or None when every other slot is held."""
        stamps, newest = self.stamps(), self.newest()[0]
        for slot in sorted((k for k in range(SLOTS) if k != newest), key=lambda k: stamps[k]):
            if self._lock(slot, fcntl.F_WRLCK):
                try:
                    self._write_slot(slot, version, params, generation)
                finally:
                    self._lock(slot, fcntl.F_UNLCK)
                return slot
        return None

    def _write_slot(self, slot: int, version: int, params, generation: int) -> None:
        header, payload = self.headers[slot], self.payloads[slot]
        header[0] = -1
        if isinstance(params, np.ndarray):
            np.copyto(payload, params)
        else:
            offset = 0
            for a in _arrays(params):
                payload[offset:offset + a.size] = a
                offset += a.size
        header[2] = generation
        header[0] = version

    def read_newest(self, out: np.ndarray) -> Stamp | None:
        """Copy the newest complete weights into `out` and return their (generation, version); None if none are
        there yet, or if the writer overtook the copy twice (then `out` holds a mix, and the caller keeps its old
        stamp: the next notice brings newer weights)."""
        for _ in range(2):
            slot, stamp = self.newest()
            if stamp == NO_WEIGHTS:
                return None
            np.copyto(out, self.payloads[slot])
            if (int(self.headers[slot][2]), int(self.headers[slot][0])) == stamp:
                return stamp
        return None

    def hold_newest(self) -> Stamp | None:
        """Hold the slot of the newest complete weights (a shared lock on it, the slot held before released):
        `payloads[held]` stays as it is until the next call. Its stamp, or None if none is complete (or the writer
        overtook the choice twice), the slot held before then kept."""
        for _ in range(2):
            slot, stamp = self.newest()
            if stamp == NO_WEIGHTS:
                return None
            if slot == self.held:
                return stamp
            if not self._lock(slot, fcntl.F_RDLCK):
                continue  # the writer is inside it: it has become the oldest since
            stamp = self.stamps()[slot]  # what it holds now that nobody can rewrite it
            if stamp == NO_WEIGHTS:
                self._lock(slot, fcntl.F_UNLCK)
                continue
            if self.held is not None:
                self._lock(self.held, fcntl.F_UNLCK)
            self.held = slot
            return stamp
        return None

    def close(self) -> None:
        """Release the slot held and the file (mappings that parameters still view stay valid)."""
        if self.fd >= 0:
            if self.held is not None:  # explicitly: the mapping holds a duplicate of the file, and with it the lock
                self._lock(self.held, fcntl.F_UNLCK)
            os.close(self.fd)
            self.fd, self.held = -1, None


class WeightPublisher:
    """Learner rank 0's side: an XPUB socket, and a board when subscribers may share this host.

    XPUB reports which prefixes are subscribed, so each form is produced only while someone reads it: no vector
    is flattened for the network when every subscriber reads the board, and the board is written only for them.
    """

    def __init__(self, net: wire.SecureContext, endpoint: str | list[str], sender: str, board: str | None = None,
                 generation: int | None = None, bulk: str | list[str] | None = None):
        # Verbose: every subscription is reported, not only a prefix's first, so each newcomer can be welcomed.
        self.sock = net.server(zmq.XPUB, endpoint, sndhwm=2, xpub_verbose=1)
        # Other hosts' subscribers take each version sealed once (rlctl.net.sealed): ciphertext on this socket.
        self.bulk = BulkPublisher(net, bulk) if bulk else None
        self.sender, self.board_file = sender, board
        self.board: WeightBoard | None = None
        self.topics: set[bytes] = set()
        self.joins = 0
        self.written: Stamp = NO_WEIGHTS  # (generation, version) in the board's newest slot
        self.slot = 0
        self.board_skips = 0  # versions not written to the board: every slot but the newest held by readers
        # Milliseconds since the epoch at start: each (re)start of the learner orders after the one before it.
        self.generation = time.time_ns() // 1_000_000 if generation is None else generation

    def _read_subscriptions(self) -> None:
        while True:
            try:
                event = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if event[:1] == b"\x01":
                self.topics.add(event[1:])
                self.joins += 1
            elif event[:1] == b"\x00":  # sent once the last subscriber of that prefix has gone
                self.topics.discard(event[1:])

    def wanted(self, kind: str) -> bool:
        """Whether any subscription matches messages of this kind (b"" matches every message)."""
        self._read_subscriptions()
        prefix = wire.kind_prefix(kind)
        return any(prefix.startswith(topic) for topic in self.topics)

    def joined(self) -> bool:
        """Whether a subscriber arrived since the last call: it missed what was published before, so the caller
        publishes the current version again at once (a collector starting after the learner waited up to 0.2 s
        for the next timed re-publication)."""
        self._read_subscriptions()
        joins, self.joins = self.joins, 0
        if self.bulk is not None:  # a subscriber that took a seal has subscribed to the ciphertexts since
            self.bulk.read_subscriptions()
            joins, self.bulk.joins = joins + self.bulk.joins, 0
        return joins > 0

    def publish(self, version: int, model: torch.nn.Module) -> None:
        """Send `version` of the model's parameters: a notice for board readers, the vector for everyone else."""
        self._send(version, self.generation, list(model.parameters()), lambda: flat_parameters(model).cpu().numpy())

    def relay(self, version: int, generation: int, flat: np.ndarray, forwarded: bool = False) -> None:
        """Hand on a version that learner rank 0 published (a host's relay, rlctl.roles.relay): its generation
        kept, so subscribers order it as they would rank 0's own. `forwarded`: its seal and chunks go on as they
        came (`forward_seal`, `forward_chunk`), so it is not sealed here."""
        self._send(version, generation, flat, lambda: flat, seal=not forwarded)

    def forward_seal(self, s: Seal) -> None:
        """Hand on the seal of a version from the publisher above (a relay with relays below it), under this
        publisher's token: its chunks follow as they come (`forward_chunk`), unopened and not sealed again."""
        if self.bulk is not None and self.wanted(SEALED):
            wire.send(self.sock, SEALED, self.sender, s.stamp[1], self.bulk.handed_on(s).meta())

    def forward_chunk(self, frames: list) -> None:
        """Hand on a chunk of the version whose seal went last (`forward_seal`)."""
        if self.bulk is not None and self.wanted(SEALED):
            self.bulk.forward(frames)

    def _send(self, version: int, generation: int, params, vector, seal: bool = True) -> None:
        if self.board_file is not None and self.wanted(NOTICE):
            if self.board is None:
                size = params.size if isinstance(params, np.ndarray) else sum(p.numel() for p in params)
                self.board = WeightBoard.create(self.board_file, size)
            if (generation, version) != self.written:  # a re-publication of the same version rewrites nothing
                slot = self.board.write(version, params, generation)
                if slot is None:  # every other slot held by a collector: the next version goes in
                    self.board_skips += 1
                else:
                    self.slot, self.written = slot, (generation, version)
            if self.written == (generation, version):
                wire.send(self.sock, NOTICE, self.sender, version, {"slot": self.slot, "gen": generation})
        if self.bulk is not None and seal and self.wanted(SEALED):
            sealed, ciphertext = self.bulk.sealed((generation, version), lambda: _arrays(params))
            wire.send(self.sock, SEALED, self.sender, version, sealed.meta())
            self.bulk.send(self.sender, sealed, ciphertext)
        if self.wanted(FULL):
            wire.send(self.sock, FULL, self.sender, version, {"gen": generation}, {"params": vector()})

    def close(self) -> None:
        """Remove the board's file (readers that mapped it keep their mapping)."""
        if self.board is not None:
            Path(self.board.path).unlink(missing_ok=True)


def _arrays(params) -> np.ndarray | list[np.ndarray]:
    """Parameters as float32 arrays on the CPU, in flat_parameters order, without a flat copy (a flat vector as is)."""
    if isinstance(params, np.ndarray):
        return params
    with torch.no_grad():
        return [p.detach().reshape(-1).to("cpu", torch.float32).numpy() for p in params]


class WeightSubscriber:
    """SUB socket on the learner's weight publications; keeps only the newest, never blocks.

    With `board` (the board's path on this host) it subscribes to notices only and copies from the board, or with
    `zero_copy` (where the board's slots can be locked and the parameters are float32 on the CPU) holds the newest
    slot and makes the model's parameters views of it: they are then read-only, and change only in `poll`.
    """

    def __init__(self, net: wire.SecureContext, endpoint: str | list[str], model: torch.nn.Module,
                 board: str | None = None, zero_copy: bool = False, bulk: str | list[str] | None = None):
        params = list(model.parameters())
        self.size = sum(p.numel() for p in params)
        self.zero_copy = bool(zero_copy and board and _OFD_LOCKS and params
                              and all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params))
        # Sealed (rlctl.net.sealed) where the publisher has a bulk socket and no board serves this host: seals over
        # CURVE, ciphertexts over `bulk` (a list, possibly empty: connected later, as a relay's upstream is).
        self.bulk = BulkSubscriber(net, bulk, 4 * self.size) if bulk is not None and not board else None
        kind = NOTICE if board else SEALED if self.bulk is not None else FULL
        # No frame past one parameter vector of this model is received at all (seals and notices are small).
        self.sock = net.client(zmq.SUB, endpoint, subscribe=wire.kind_prefix(kind), rcvhwm=2,
                               maxmsgsize=wire.CONTROL_MAXMSGSIZE + (4 * self.size if kind == FULL else 0))
        self.model = model
        # None: load parameter by parameter (or, zero-copy, view the slot held)
        self.flat = None if self.zero_copy else share_flat_storage(model)
        self.board_file = board
        self.board: WeightBoard | None = None
        self.stamp: Stamp = NO_WEIGHTS
        self.serial = 0  # weights loaded so far: changes with every new policy, also one from a restarted learner
        self.dropped = 0

    @property
    def sockets(self) -> list[zmq.Socket]:
        """The sockets a new version arrives on, for a poller."""
        return [self.sock] if self.bulk is None else [self.sock, self.bulk.sock]

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to `timeout_ms` for something to arrive on the sockets (`poll` then takes it)."""
        if self.bulk is None:
            return bool(self.sock.poll(timeout_ms))
        return bool(zmq.select(self.sockets, [], [], timeout_ms / 1000)[0])

    @property
    def version(self) -> int:
        """The learner's version of the weights held (-1: none yet)."""
        return self.stamp[1]

    def poll(self) -> bool:
        """Load the newest weights that have arrived, if any; True when the policy changed."""
        if self.bulk is not None:
            return self._accept(self._poll_sealed())
        if not self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # the usual case: nothing arrived
            return False
        newest = None
        for _, msg in wire.receive_waiting(self.sock):
            if msg is None or msg.kind not in (FULL, NOTICE):
                self.dropped += 1
            else:
                newest = msg
        if newest is None:
            return False
        if newest.kind == NOTICE:  # a wake-up: the board's newest weights are read, whichever the notice named
            stamp = self._load_shared()
        else:
            gen = (newest.meta or {}).get("gen", 0)
            stamp = (gen, newest.version) if isinstance(gen, int) and not isinstance(gen, bool) else None
            if stamp is None or stamp <= self.stamp:
                if stamp is None:
                    self.dropped += 1
                return False
            if not self._load(newest.arrays.get("params")):
                stamp = None
        if stamp is None:
            self.dropped += 1
            return False
        return self._accept(stamp)

    def _accept(self, stamp: Stamp | None) -> bool:
        """Hold `stamp` as the weights loaded, if it is newer."""
        if stamp is None or stamp <= self.stamp:
            return False
        self.stamp = stamp
        self.serial += 1
        return True

    def _poll_sealed(self) -> Stamp | None:
        """Take the seals and ciphertexts that arrived; the stamp of the newest version opened into the model."""
        if self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            for _, msg in wire.receive_waiting(self.sock):
                seal = Seal.from_message(msg) if msg is not None and msg.kind == SEALED else None
                if seal is None:
                    self.dropped += 1
                else:
                    self.bulk.take_seal(seal)
        self.bulk.take_waiting()
        stamp = None
        if self.bulk.ready(self.stamp):  # a scratch vector (no flat storage) only for a version to open
            out = self.flat if self.flat is not None else np.empty(self.size, dtype=np.float32)
            stamp = self.bulk.open_newest(out, self.stamp)
            if stamp is not None and self.flat is None and not self._load(out):
                stamp = None
        self.dropped, self.bulk.dropped = self.dropped + self.bulk.dropped, 0
        return stamp

    def _load(self, params: np.ndarray | None) -> bool:
        if params is None:
            return False
        if self.flat is None:
            try:
                load_flat_parameters(self.model, params)
            except ValueError:
                return False
            return True
        if params.shape != self.flat.shape or params.dtype != self.flat.dtype:
            return False
        np.copyto(self.flat, params)
        return True

    def _load_shared(self) -> Stamp | None:
        """The board's newest weights into the model; their stamp, or None."""
        if self.board_file is None:
            return None
        stamp = self._read_board()
        if stamp is None or stamp <= self.stamp:
            # A learner that restarted after a clean stop made a new file at the same path: map that one.
            try:
                moved = self.board is not None and os.stat(self.board_file).st_ino != self.board.inode
            except OSError:
                moved = False
            if moved:
                self.board.close()  # parameters viewing its slot keep the mapping
                self.board = None
                stamp = self._read_board()
        return stamp

    def _read_board(self) -> Stamp | None:
        if self.board is None:
            try:
                self.board = WeightBoard.open(self.board_file, self.size)
            except (OSError, ValueError):
                return None
        if self.zero_copy:
            stamp = self.board.hold_newest()
            if stamp is not None and stamp > self.stamp:
                self._view(self.board.payloads[self.board.held])
            return stamp
        if self.flat is not None:
            return self.board.read_newest(self.flat)
        scratch = np.empty(self.size, dtype=np.float32)
        stamp = self.board.read_newest(scratch)
        return stamp if stamp is not None and self._load(scratch) else None

    def _view(self, payload: np.ndarray) -> None:
        """Make the model's parameters views of a held slot's payload (flat_parameters order)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only memory: nothing here writes parameters
            flat = torch.from_numpy(payload)
        offset = 0
        for p in self.model.parameters():
            p.data = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
