"""Proportional prioritized experience replay over preallocated numpy arrays.

Everything on the hot paths (add / sample / update_priorities) is vectorized:
there is no Python loop per transition, only loops over tree levels
(log2(capacity) iterations of small numpy operations). At 1M capacity the
sampling path is bound by memory latency (random rows of 16 MB+ arrays), which
is what the layout choices below (one record array for all fields, a flat heap
tree read level by level) are tuned for; see bench/replay.py.

Snapshots (`save_snapshot` / `load_snapshot`) let a replay shard survive a
SIGKILL: plain arrays in an uncompressed .npz, written atomically, read back with
pickling disabled and every array validated before anything is allocated (the
format and its parser: rlctl.data.replay_snapshot).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from rlctl.data.replay_snapshot import (DEFAULT_MAX_SNAPSHOT_BYTES, ReplaySnapshot, SnapshotError, read_snapshot_arrays,
                                   save_snapshot)

__all__ = ["SumTree", "PrioritizedReplay", "SnapshotError", "save_snapshot", "load_snapshot",
           "DEFAULT_MAX_SNAPSHOT_BYTES"]


def _valid_priorities(priorities) -> np.ndarray:
    """Priorities as a flat float64 array; raises unless all are finite and non-negative."""
    p = np.asarray(priorities, dtype=np.float64).ravel()
    # `not (x >= 0)` also rejects NaN; inf would poison every ancestor sum.
    if p.size and not (p.min() >= 0.0 and np.isfinite(p.max())):
        raise ValueError("priorities must be finite and non-negative")
    return p


class SumTree:
    """Binary sum-tree over `capacity` leaves in one flat float64 array (leaves padded to a power of two).

    Layout: ``tree[1]`` is the root, node ``i`` has children ``2i`` and ``2i+1``,
    and leaf ``slot`` lives at ``tree[L + slot]`` with ``L`` the next power of two
    >= capacity. Padding leaves (``slot >= capacity``) stay 0 forever. Inner nodes
    are always recomputed from their children (never patched with deltas), so
    sums cannot drift however many updates are applied.
    """

    # `find` resolves the top `_search_level` levels with one cumsum+searchsorted
    # over that level's nodes (cheaper than 5 numpy calls per level while the
    # level is small), then descends the rest level by level. Instance attribute
    # so tests can force the pure-descent path (0) or the pure-search path.
    _SEARCH_LEVEL = 10
    # `update` recomputes a whole level with two strided slices once the level
    # has at most max(_DENSE_WIDTH, 8 * n_updated) nodes: measured no slower than a
    # gather/scatter of n nodes there, and far fewer calls for tiny updates.
    _DENSE_WIDTH = 1024

    def __init__(self, capacity: int):
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._levels = max(0, (capacity - 1).bit_length())  # leaves are at depth _levels
        self._L = 1 << self._levels
        self._tree = np.zeros(2 * self._L, dtype=np.float64)
        # Pair view: _pairs[i] == tree[2i] + 1j*tree[2i+1], so one gather fetches
        # both children of node i (about half the cost of two gathers).
        self._pairs = self._tree.view(np.complex128)
        self._leaves = self._tree[self._L:]
        self._search_level = self._SEARCH_LEVEL

    def total(self) -> float:
        """Sum of all leaf priorities."""
        return float(self._tree[1])

    def get(self, slots: np.ndarray) -> np.ndarray:
        """Leaf priorities at `slots` (a copy)."""
        return self._leaves[np.asarray(slots, dtype=np.int64)]

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaf priorities at arbitrary `slots`; with duplicate slots the last one wins."""
        slots = np.asarray(slots, dtype=np.int64).ravel()
        priorities = _valid_priorities(priorities)
        if slots.shape != priorities.shape:
            raise ValueError("slots and priorities must have the same length")
        if slots.size == 0:
            return
        if slots.min() < 0 or slots.max() >= self.capacity:
            raise IndexError(f"slot out of range [0, {self.capacity})")
        self._update(slots, priorities)

    def _update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """`update` without input validation, for callers that guarantee int64 in-range slots and valid priorities."""
        tree, pairs = self._tree, self._pairs
        idx = slots + self._L
        # NumPy applies 1-D integer-array assignment in index order, so for a
        # repeated slot the last value remains (long-standing behaviour rather
        # than a documented promise; pinned by the tests). Avoids np.unique.
        tree[idx] = priorities
        width = self._L
        # Sparse levels: recompute only the touched parents. Duplicate parents
        # all write the same (children-derived) value, so no np.unique needed.
        dense_width = max(self._DENSE_WIDTH, 8 * idx.size)
        while width > dense_width:
            idx >>= 1
            width >>= 1
            c = pairs[idx]
            tree[idx] = c.real + c.imag
        # Dense levels (few nodes): recompute each whole level with slices.
        while width > 1:
            width >>= 1
            np.add(tree[2 * width:4 * width:2], tree[2 * width + 1:4 * width:2], out=tree[width:2 * width])

    def update_range(self, start: int, priorities: np.ndarray) -> None:
        """Set leaves start..start+len-1 (no wrap; caller splits) — the fast path for FIFO inserts."""
        priorities = _valid_priorities(priorities)
        n = priorities.size
        if n == 0:
            return
        start = int(start)
        if start < 0 or start + n > self.capacity:
            raise IndexError(f"range [{start}, {start + n}) outside [0, {self.capacity})")
        tree = self._tree
        lo = self._L + start
        hi = lo + n - 1  # inclusive
        tree[lo:hi + 1] = priorities
        while lo > 1:
            lo >>= 1
            hi >>= 1
            # Parents and children are on different levels, so no overlap.
            np.add(tree[2 * lo:2 * hi + 2:2], tree[2 * lo + 1:2 * hi + 2:2], out=tree[lo:hi + 1])

    def find(self, values: np.ndarray) -> np.ndarray:
        """For each value in [0, total) the slot whose cumulative range [cum_{i-1}, cum_i) contains it.

        Out-of-range values are clamped into [0, total). Never returns a zero-priority or padding
        leaf: if float rounding steers a value onto one, the nearest positive slot to its left
        (or, if none, to its right) is used instead.
        """
        v = np.array(values, dtype=np.float64, copy=True).ravel()
        tree = self._tree
        if not tree[1] > 0.0:
            raise ValueError("cannot sample from a sum-tree whose total is 0")
        k = min(self._search_level, self._levels)
        # Top k levels at once: prefix sums of depth-k nodes + binary search.
        cum = np.cumsum(tree[1 << k:2 << k])
        # Clamp below the *cumsum's* total (may differ from tree[1] by rounding),
        # so searchsorted always lands inside the level.
        np.minimum(v, np.nextafter(cum[-1], 0.0), out=v)  # (np.clip is several times slower)
        np.maximum(v, 0.0, out=v)
        j = np.searchsorted(cum, v, side="right")
        # side='right' gives cum[j-1] <= v < cum[j], so node j has positive mass
        # in cumsum arithmetic; subtract what lies to its left.
        np.subtract(v, cum[j - 1], out=v, where=j > 0)
        idx = j
        idx += 1 << k
        for _ in range(self._levels - k):
            np.add(idx, idx, out=idx)  # -> left child (cheaper than idx <<= 1)
            left = tree[idx]
            go_right = v >= left  # a zero-mass left child is always skipped
            np.subtract(v, left, out=v, where=go_right)
            idx += go_right
        slots = idx - self._L
        bad = self._leaves[slots] <= 0.0
        if bad.any():
            slots[bad] = self._nearest_positive(slots[bad])
        return slots

    def _nearest_positive(self, slots: np.ndarray) -> np.ndarray:
        """Rare rounding fallback: replace each slot with the closest positive leaf to its left, else right."""
        # O(capacity), but only reached when float rounding pushed a value past its leaf.
        valid = np.flatnonzero(self._leaves[:self.capacity] > 0.0)
        pos = np.searchsorted(valid, slots, side="left")
        # Rounding overshoots to the right, so prefer the positive leaf just left of `slot`.
        return valid[np.where(pos > 0, pos - 1, 0)]


class PrioritizedReplay:
    """Fixed-capacity FIFO ring of transitions with proportional prioritized sampling (Schaul et al. 2016).

    Every inserted transition gets a global key (the insert counter's value when it
    was added); it lives in slot ``key % capacity`` until overwritten. Leaf priority
    is ``(|td| + eps) ** alpha``; new transitions without an explicit priority get
    the largest raw priority seen so far (initially 1.0), as in the PER paper.
    """

    def __init__(
        self,
        capacity: int,
        fields: dict[str, tuple[tuple[int, ...], np.dtype | str]],
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
        seed: int = 0,
    ):
        capacity = int(capacity)
        if capacity < 1 or not fields or alpha < 0 or eps < 0:
            raise ValueError("need capacity >= 1, at least one field, alpha >= 0 and eps >= 0")
        self.capacity = capacity
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.beta_steps = int(beta_steps)
        self.eps = float(eps)
        self.size = 0
        self.inserted = 0
        self.sampled_batches = 0
        self.max_priority = 1.0  # raw (pre-alpha) running max; starts at 1.0 per the paper
        self._shapes = {name: tuple(int(d) for d in shape) for name, (shape, _) in fields.items()}
        # All fields of a transition are interleaved in one preallocated record
        # array, so gathering a random row costs ~1 cache miss instead of one per
        # field (sampling 1M-slot buffers is memory-latency bound: measured ~83 -> ~22 us
        # for 512 CartPole rows). `_storage[name]`
        # is the (capacity, *shape) view of one field. Largest alignment first
        # keeps padding minimal.
        order = sorted(fields, key=lambda f: -np.dtype(fields[f][1]).alignment)
        self._record_dtype = np.dtype(
            [(name, np.dtype(fields[name][1]), self._shapes[name]) for name in order], align=True
        )
        self._records = np.empty(capacity, dtype=self._record_dtype)
        self._storage = {name: self._records[name] for name in fields}
        self._keys = np.full(capacity, -1, dtype=np.int64)  # -1 = never filled
        self._tree = SumTree(capacity)
        self._rng = np.random.default_rng(seed)

    def bytes_per_item(self) -> float:
        """Memory the buffer reserves per transition slot: the record, its key and its share of the sum-tree."""
        return self._record_dtype.itemsize + self._keys.itemsize + self._tree._tree.nbytes / self.capacity

    def layout(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Field name -> (per-item shape, dtype), as the buffer was built with."""
        return {name: (self._shapes[name], self._storage[name].dtype) for name in self._storage}

    def snapshot_arrays(self) -> dict[str, np.ndarray]:
        """Copies of everything `from_snapshot` needs to rebuild this buffer exactly, as plain (non-object) arrays."""
        size = self.size
        return ReplaySnapshot(
            fields=[(name, self._shapes[name], a.dtype) for name, a in self._storage.items()],
            capacity=self.capacity, size=size, inserted=self.inserted, sampled_batches=self.sampled_batches,
            beta_steps=self.beta_steps, max_priority=self.max_priority, alpha=self.alpha, beta=self.beta,
            eps=self.eps, keys=self._keys[:size], priorities=self._tree._leaves[:size],
            data=[a[:size] for a in self._storage.values()], rng=self._rng,
        ).to_arrays()

    @classmethod
    def from_snapshot(
        cls,
        arrays: Mapping[str, np.ndarray],
        capacity: int | None = None,
        *,
        max_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
    ) -> PrioritizedReplay:
        """Rebuild a buffer from `snapshot_arrays` output, validating all of it first (SnapshotError if not valid)."""
        snap = ReplaySnapshot.from_arrays(arrays, capacity, max_bytes=max_bytes)
        try:
            buf = cls(snap.capacity, {name: (shape, dt) for name, shape, dt in snap.fields},
                      alpha=snap.alpha, beta=snap.beta, beta_steps=snap.beta_steps, eps=snap.eps)
        except (ValueError, TypeError, MemoryError) as e:
            raise SnapshotError(f"cannot allocate a buffer for this snapshot: {e}") from e
        buf._restore(snap)
        return buf

    def _restore(self, snap: ReplaySnapshot) -> None:
        """Fill this fresh buffer (built with the snapshot's capacity and layout) with a parsed snapshot."""
        size = snap.size
        for (name, _, _), a in zip(snap.fields, snap.data):
            self._storage[name][:size] = a
        self._keys[:size] = snap.keys
        with np.errstate(over="ignore"):  # finite leaves can still sum past float64 max: reported just below
            self._tree.update_range(0, snap.priorities)
        if not math.isfinite(self._tree.total()):
            raise SnapshotError("priorities sum to infinity")
        self.size, self.inserted, self.sampled_batches = size, snap.inserted, snap.sampled_batches
        self.max_priority = snap.max_priority
        self._rng = snap.rng

    def beta_now(self) -> float:
        """Importance-sampling exponent, annealed linearly from `beta` to exactly 1.0 over `beta_steps` samples."""
        if self.beta_steps <= 0 or self.sampled_batches >= self.beta_steps:
            return 1.0
        return self.beta + (1.0 - self.beta) * (self.sampled_batches / self.beta_steps)

    def _leaf(self, raw: np.ndarray) -> np.ndarray:
        """Raw priority -> stored leaf value (p + eps) ** alpha (new array)."""
        leaf = raw + self.eps
        if self.alpha != 1.0:
            np.power(leaf, self.alpha, out=leaf)
        return leaf

    def add(self, batch: dict[str, np.ndarray], priorities: np.ndarray | None = None) -> None:
        """Append a batch (all fields, one leading length B) FIFO; if B > capacity keep only the last `capacity`."""
        if batch.keys() != self._storage.keys():
            raise KeyError(f"batch fields {sorted(batch)} != buffer fields {sorted(self._storage)}")
        arrays = {name: np.asarray(a) for name, a in batch.items()}
        first = next(iter(arrays.values()))
        b = first.shape[0] if first.ndim else -1  # -1: a 0-d field fails the check below
        for name, a in arrays.items():
            if a.shape != (b, *self._shapes[name]):
                raise ValueError(f"field {name!r}: shape {a.shape} != (B={b}, *{self._shapes[name]})")
        if priorities is None:
            leaf = np.full(b, (self.max_priority + self.eps) ** self.alpha)
        else:
            raw = _valid_priorities(priorities)
            if raw.size != b:
                raise ValueError(f"got {raw.size} priorities for {b} transitions")
            if b:
                self.max_priority = max(self.max_priority, float(raw.max()))
            leaf = self._leaf(raw)
        if b == 0:
            return
        cap = self.capacity
        drop = max(0, b - cap)  # items older than the last `capacity` would be overwritten anyway
        n = b - drop
        first_key = self.inserted + drop
        start = first_key % cap
        n1 = min(n, cap - start)  # first contiguous piece; the rest wraps to slot 0
        n2 = n - n1
        for name, a in arrays.items():
            dst = self._storage[name]
            dst[start:start + n1] = a[drop:drop + n1]
            if n2:
                dst[:n2] = a[drop + n1:]
        keys = np.arange(first_key, first_key + n, dtype=np.int64)
        self._keys[start:start + n1] = keys[:n1]
        self._tree.update_range(start, leaf[drop:drop + n1])
        if n2:
            self._keys[:n2] = keys[n1:]
            self._tree.update_range(0, leaf[drop + n1:])
        self.inserted += b
        self.size = min(cap, self.size + b)

    def sample(self, n: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Stratified proportional sample of `n` transitions -> (batch copies, int64 keys, float32 IS weights).

        Weights are w_i = (size * P(i)) ** -beta_now, normalized by the max weight *within this
        batch* (as in the PER paper's Algorithm 1), so they lie in (0, 1] and only ever scale
        updates down. Since size and the total cancel, this equals (p_min / p_i) ** beta_now.
        """
        n = int(n)
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        # One uniform draw in each of n equal segments of [0, total).
        values = self._rng.random(n)
        values += np.arange(n)
        values *= self._tree.total() / n
        slots = self._tree.find(values)
        beta = self.beta_now()
        leaf = self._tree.get(slots)
        # (p_min / p_i) ** beta == (size*P(i))**-beta / max_j (size*P(j))**-beta
        w = np.divide(leaf.min(), leaf, out=leaf)
        np.power(w, beta, out=w)
        rows = np.take(self._records, slots)  # one gather of whole transitions
        batch = {name: np.ascontiguousarray(rows[name]) for name in self._storage}
        self.sampled_batches += 1
        return batch, self._keys[slots], w.astype(np.float32)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Set raw priorities for `keys`, ignoring keys whose slot was since overwritten; returns how many applied."""
        keys = np.asarray(keys, dtype=np.int64).ravel()
        raw = _valid_priorities(priorities)
        if keys.size != raw.size:
            raise ValueError("keys and priorities must have the same length")
        if keys.size == 0:
            return 0
        slots = keys % self.capacity
        # A key is live iff its slot still holds it; keys >= 0 excludes the -1
        # "never filled" sentinel (e.g. key -1 maps to slot capacity-1).
        live = self._keys[slots] == keys
        live &= keys >= 0
        if live.all():  # common case: skip the masking copies
            applied = keys.size
        else:
            applied = int(np.count_nonzero(live))
            if applied == 0:
                return 0
            slots, raw = slots[live], raw[live]
        raw_max = float(raw.max())
        # slots come from `% capacity` and raw was validated: skip re-checking.
        self._tree._update(slots, self._leaf(raw))
        if raw_max > self.max_priority:
            self.max_priority = raw_max
        return applied


def load_snapshot(
    path: str | Path, capacity: int | None = None, *, max_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
    replay_class=PrioritizedReplay,
):
    """Rebuild a buffer written by `save_snapshot` (through `replay_class.from_snapshot`); SnapshotError if
    unreadable/invalid, FileNotFoundError if absent."""
    path = Path(path)
    arrays = read_snapshot_arrays(path)
    try:
        return replay_class.from_snapshot(arrays, capacity, max_bytes=max_bytes)
    except SnapshotError as e:
        raise SnapshotError(f"{path}: {e}") from None
