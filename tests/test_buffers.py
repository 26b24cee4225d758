"""Tests for rlctl.data.buffers against brute-force references (plain lists / np.cumsum)."""

from __future__ import annotations

import json
import os
import pickle
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples
from rlctl.data.buffers import PrioritizedReplay, SnapshotError, SumTree, load_snapshot, save_snapshot

FAST = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])

# 0 = pure level-by-level descent, 1-3 = mixed, 30 = pure searchsorted over the leaves.
search_levels = st.sampled_from([0, 1, 2, 3, 30])


def ref_find(p: list[float], v: float) -> int:
    """Brute force: slot whose half-open cumulative range [cum[i-1], cum[i]) contains v."""
    return int(np.searchsorted(np.cumsum(p), v, side="right"))


# ---------------------------------------------------------------- SumTree


@st.composite
def tree_ops(draw):
    cap = draw(st.integers(1, 40))
    prio = st.integers(0, 9).map(float)  # small ints: every sum is exact, so equality is exact
    ops = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            k = draw(st.integers(0, 2 * cap))  # duplicates likely
            slots = draw(st.lists(st.integers(0, cap - 1), min_size=k, max_size=k))
            ops.append(("update", slots, draw(st.lists(prio, min_size=k, max_size=k))))
        else:
            start = draw(st.integers(0, cap - 1))
            n = draw(st.integers(0, cap - start))
            ops.append(("range", start, draw(st.lists(prio, min_size=n, max_size=n))))
    return cap, ops


@FAST
@given(tree_ops(), search_levels, st.lists(st.floats(0, 1, exclude_max=True), max_size=20), st.data())
def test_sumtree_matches_bruteforce(cap_ops, level, fracs, data):
    cap, ops = cap_ops
    tree = SumTree(cap)
    tree._search_level = level
    ref = [0.0] * cap
    for kind, a, prios in ops:
        if kind == "update":
            tree.update(np.array(a, dtype=np.int64), np.array(prios))
            for s, p in zip(a, prios):  # sequential: with duplicates the last one wins
                ref[s] = p
        else:
            tree.update_range(a, np.array(prios))
            ref[a:a + len(prios)] = prios
        assert tree.total() == sum(ref)
        np.testing.assert_array_equal(tree.get(np.arange(cap)), ref)
    total = sum(ref)
    if total == 0:
        with pytest.raises(ValueError):
            tree.find(np.array([0.0]))
        return
    # Random values plus every exact boundary, the float just below it and half-way points
    # (exact arithmetic, so even boundary values must match exactly).
    cum = np.cumsum(ref)
    vals = [f * total for f in fracs] + [data.draw(st.integers(0, int(total) - 1)) + 0.25]
    vals += [c for c in cum if c < total] + [c + 0.5 for c in cum if c + 0.5 < total]
    vals += [0.0] + [np.nextafter(c, 0) for c in cum if 0 < c <= total]
    got = tree.find(np.array(vals))
    assert got.dtype == np.int64
    assert [int(g) for g in got] == [ref_find(ref, v) for v in vals]
    assert all(ref[g] > 0 for g in got)


def test_sumtree_duplicate_slots_last_wins():
    tree = SumTree(5)
    tree.update(np.array([3, 1, 3, 3]), np.array([1.0, 2.0, 7.0, 5.0]))
    np.testing.assert_array_equal(tree.get(np.arange(5)), [0, 2, 0, 5, 0])
    assert tree.total() == 7.0


wide_prio = st.one_of(st.just(0.0), st.floats(1e-30, 1e30), st.floats(0.0, 1.0))


@FAST
@given(st.lists(wide_prio, min_size=1, max_size=40), search_levels, st.lists(st.floats(0, 1), max_size=10))
def test_sumtree_find_never_returns_zero_leaf(prios, level, fracs):
    cap = len(prios)
    tree = SumTree(cap)
    tree._search_level = level
    tree.update(np.arange(cap), np.array(prios))
    total = tree.total()
    if total == 0:
        return
    cum = np.cumsum(prios)
    # Stress float rounding: values at/just below every boundary, the total, and beyond it.
    vals = np.concatenate([
        cum, np.nextafter(cum, 0), np.nextafter(cum, np.inf), np.array(fracs) * total,
        [np.nextafter(total, 0), total, 2 * total, -1.0],
    ])
    got = tree.find(vals)
    assert ((0 <= got) & (got < cap)).all()
    assert (np.array(prios)[got] > 0).all()
    # Away from boundaries (relative 1e-9), the answer is the brute-force one.
    ok = (vals >= 0) & (vals < total)
    for v, g in zip(vals[ok], got[ok]):
        if np.all(np.abs(cum - v) > 1e-9 * total):
            assert g == ref_find(prios, v)


def test_sumtree_find_rounding_fallback(monkeypatch):
    # Level-by-level descent: root's right child is 1e16 but v - 3 rounds to >= 1e16,
    # so the descent walks onto the zero padding leaf 3; the fallback must pick slot 2.
    calls = []
    orig = SumTree._nearest_positive
    monkeypatch.setattr(SumTree, "_nearest_positive", lambda self, s: calls.append(s.copy()) or orig(self, s))
    tree = SumTree(3)
    tree._search_level = 0
    tree.update(np.arange(3), np.array([0.0, 3.0, 1e16]))
    v = 1.0000000000000002e16
    assert v < tree.total()
    assert tree.find(np.array([v, 0.0, 2.5])).tolist() == [2, 1, 1]
    assert len(calls) == 1  # the fallback really was exercised
    # Fallback with no positive leaf to the left goes right.
    tree.update(np.arange(3), np.array([0.0, 0.0, 1.0]))
    assert tree._nearest_positive(np.array([0, 3])).tolist() == [2, 2]


def test_sumtree_larger_tree_default_levels():
    # 5000 leaves -> 13 levels: exercises the searchsorted top part and the descent together.
    rng = np.random.default_rng(0)
    p = rng.integers(0, 5, 5000).astype(float)
    tree = SumTree(5000)
    tree.update_range(0, p[:3000])
    tree.update(np.arange(3000, 5000), p[3000:])
    assert tree.total() == p.sum()
    vals = rng.random(2000) * p.sum()
    np.testing.assert_array_equal(tree.find(vals), np.searchsorted(np.cumsum(p), vals, side="right"))


def test_sumtree_rejects_bad_input():
    tree = SumTree(4)
    for exc, call in [
        (IndexError, lambda: tree.update(np.array([4]), np.array([1.0]))),
        (IndexError, lambda: tree.update_range(3, np.array([1.0, 1.0]))),
        (ValueError, lambda: tree.update(np.array([0]), np.array([-1.0]))),
        (ValueError, lambda: tree.update(np.array([0]), np.array([np.nan]))),
    ]:
        with pytest.raises(exc):
            call()


# ---------------------------------------------------------------- PrioritizedReplay

FIELDS = {"obs": ((2,), np.float32), "action": ((), np.int64), "done": ((), np.bool_)}


def make_batch(first_key: int, b: int) -> dict[str, np.ndarray]:
    """Contents derived from the key, so any row can be checked against the key it claims."""
    k = np.arange(first_key, first_key + b)
    return {"obs": np.stack([k, -k], axis=1).astype(np.float32), "action": k * 3, "done": k % 2 == 0}


def check_row(batch, i, key):
    assert batch["obs"][i].tolist() == [key, -key]
    assert batch["action"][i] == key * 3
    assert batch["done"][i] == (key % 2 == 0)


@FAST
@given(st.integers(1, 12), st.lists(st.integers(0, 30), min_size=1, max_size=8))
def test_replay_fifo_eviction_and_sampled_keys(cap, sizes):
    buf = PrioritizedReplay(cap, FIELDS, seed=1)
    ref: deque[int] = deque(maxlen=cap)
    for b in sizes:
        buf.add(make_batch(buf.inserted, b), priorities=np.full(b, 2.0) if b % 2 else None)
        ref.extend(range(buf.inserted - b, buf.inserted))
        assert buf.size == len(ref)
        for key in ref:  # each live key sits in slot key % cap with its own contents
            slot = key % cap
            assert buf._keys[slot] == key
            check_row(buf._storage, slot, key)
        if buf.size:
            batch, keys, w = buf.sample(7)
            assert keys.dtype == np.int64 and w.dtype == np.float32 and len(keys) == 7
            assert set(keys.tolist()) <= set(ref)
            for i, key in enumerate(keys):
                check_row(batch, i, int(key))
    assert buf.inserted == sum(sizes)


def test_replay_batch_larger_than_capacity_keeps_last():
    buf = PrioritizedReplay(4, FIELDS)
    buf.add(make_batch(0, 3))
    buf.add(make_batch(3, 10))  # keys 3..12, only 9..12 survive
    assert buf.inserted == 13 and buf.size == 4
    assert sorted(buf._keys.tolist()) == [9, 10, 11, 12]
    for key in range(9, 13):
        check_row(buf._storage, key % 4, key)
    # A mostly empty big buffer never samples its unfilled slots.
    buf = PrioritizedReplay(1000, FIELDS, seed=0)
    buf.add(make_batch(0, 3))
    assert set(np.concatenate([buf.sample(32)[1] for _ in range(50)]).tolist()) <= {0, 1, 2}


@pytest.mark.parametrize("level", [0, 10])  # level-by-level descent / pure searchsorted
def test_replay_sampling_frequencies_match_priorities(level):
    cap, alpha, eps = 10, 0.6, 1e-6
    buf = PrioritizedReplay(cap, FIELDS, alpha=alpha, eps=eps, seed=123)
    buf._tree._search_level = level
    raw = np.array([0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 0.1, 3.0, 0.0, 6.0, 5.0, 0.2])
    buf.add(make_batch(0, 12), priorities=raw)  # wraps: keys 2..11 survive
    live = raw[2:]
    expect = np.zeros(12)
    expect[2:] = (live + eps) ** alpha / ((live + eps) ** alpha).sum()
    counts = np.zeros(12)
    for _ in range(500):
        _, keys, _ = buf.sample(64)
        counts += np.bincount(keys, minlength=12)
    freq = counts / counts.sum()
    assert counts[:2].sum() == 0  # evicted keys are never sampled
    assert np.abs(freq - expect).max() < 0.005  # stratified draws: observed error ~1e-3


def test_replay_importance_weights_formula():
    alpha, beta, eps = 0.7, 0.5, 1e-3
    buf = PrioritizedReplay(8, FIELDS, alpha=alpha, beta=beta, beta_steps=4, eps=eps, seed=5)
    raw = np.array([0.1, 1.0, 2.0, 0.0, 5.0, 3.0])
    buf.add(make_batch(0, 6), priorities=raw)
    prob = (raw + eps) ** alpha / ((raw + eps) ** alpha).sum()
    for step in range(6):
        b = buf.beta_now()
        assert b == pytest.approx(min(1.0, beta + (1 - beta) * step / 4))
        _, keys, w = buf.sample(16)
        expect = (6 * prob[keys]) ** (-b)
        np.testing.assert_allclose(w, expect / expect.max(), rtol=1e-5)
        assert w.max() == 1.0
    assert buf.sampled_batches == 6


def test_replay_beta_anneals_to_exactly_one():
    buf = PrioritizedReplay(4, FIELDS, beta=0.3, beta_steps=7)
    buf.add(make_batch(0, 4))
    assert buf.beta_now() == 0.3
    seen = []
    for _ in range(10):
        seen.append(buf.beta_now())
        buf.sample(2)
    assert all(a < b for a, b in zip(seen[:8], seen[1:8]))
    assert seen[7:] == [1.0, 1.0, 1.0] and buf.beta_now() == 1.0
    assert PrioritizedReplay(4, FIELDS, beta_steps=0).beta_now() == 1.0


def test_replay_stale_priority_updates_ignored():
    alpha, eps = 0.5, 1e-6
    buf = PrioritizedReplay(4, FIELDS, alpha=alpha, eps=eps)
    buf.add(make_batch(0, 6), priorities=np.ones(6))  # keys 2..5 live; 4, 5 overwrote 0, 1
    leaf = lambda p: (p + eps) ** alpha  # noqa: E731
    # Stale keys (0, 1) come *after* the live ones for the same slots; future, negative keys too.
    keys, prios = np.array([4, 5, 2, 0, 1, 3, 99, -1]), np.array([9.0, 8, 7, 100, 100, 6, 100, 100])
    assert buf.update_priorities(keys, prios) == 4
    np.testing.assert_allclose(buf._tree.get(np.arange(4)), leaf(np.array([9.0, 8, 7, 6])))
    assert buf.max_priority == 9.0  # ignored updates don't raise the max
    assert buf.update_priorities(np.array([0, 1]), np.array([5.0, 5.0])) == 0
    assert buf.update_priorities(np.array([], dtype=np.int64), np.array([])) == 0
    # Key -1 maps to slot 3, whose "never filled" sentinel is -1: must not match.
    buf = PrioritizedReplay(4, FIELDS)
    buf.add(make_batch(0, 2))
    assert buf.update_priorities(np.array([-1, 3, -4]), np.array([5.0, 5.0, 5.0])) == 0
    assert buf._tree.get(np.arange(2, 4)).tolist() == [0.0, 0.0]


@FAST
@given(st.integers(1, 8), st.lists(st.tuples(st.integers(0, 9), st.lists(st.integers(-2, 30), max_size=6)), max_size=8))
def test_replay_updates_match_reference(cap, steps):
    eps, alpha = 1e-6, 0.6
    buf = PrioritizedReplay(cap, FIELDS, alpha=alpha, eps=eps)
    ref: dict[int, float] = {}  # live key -> raw priority
    maxp = 1.0
    for b, upd_keys in steps:
        buf.add(make_batch(buf.inserted, b))
        for k in range(buf.inserted - b, buf.inserted):
            ref[k] = maxp
        ref = {k: p for k, p in ref.items() if k >= buf.inserted - cap}
        prios = [float((3 * k) % 11) for k in upd_keys]
        applied = buf.update_priorities(np.array(upd_keys, dtype=np.int64), np.array(prios))
        n_ref = 0
        for k, p in zip(upd_keys, prios):
            if k in ref:
                ref[k] = p
                maxp = max(maxp, p)
                n_ref += 1
        assert applied == n_ref
        assert buf.max_priority == maxp
        for k, p in ref.items():
            assert buf._tree.get(np.array([k % cap]))[0] == pytest.approx((p + eps) ** alpha)


def test_replay_none_priority_uses_running_max():
    alpha, eps = 0.6, 1e-6
    leaf = lambda p: (p + eps) ** alpha  # noqa: E731
    buf = PrioritizedReplay(10, FIELDS, alpha=alpha, eps=eps)
    buf.add(make_batch(0, 2))
    assert buf._tree.get(np.array([0, 1])) == pytest.approx(leaf(1.0))  # starts at 1.0
    buf.add(make_batch(2, 2), priorities=np.array([5.0, 0.5]))
    buf.add(make_batch(4, 1))
    assert buf._tree.get(np.array([4]))[0] == pytest.approx(leaf(5.0))
    buf.update_priorities(np.array([0]), np.array([7.0]))
    buf.add(make_batch(5, 1))
    assert buf._tree.get(np.array([5]))[0] == pytest.approx(leaf(7.0))
    buf.update_priorities(np.array([0]), np.array([0.1]))  # a running max never decreases
    buf.add(make_batch(6, 1))
    assert buf._tree.get(np.array([6]))[0] == pytest.approx(leaf(7.0))


def test_replay_errors():
    buf = PrioritizedReplay(4, FIELDS)
    with pytest.raises(ValueError):
        buf.sample(1)
    with pytest.raises(KeyError):
        buf.add({"obs": np.zeros((1, 2), np.float32)})
    with pytest.raises(ValueError):
        buf.add({**make_batch(0, 2), "action": np.zeros(3, np.int64)})
    with pytest.raises(ValueError):
        buf.add({**make_batch(0, 2), "obs": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError):
        buf.add(make_batch(0, 2), priorities=np.array([1.0, -1.0]))
    buf.add(make_batch(0, 0))  # empty batch is a no-op
    assert buf.size == 0 and buf.inserted == 0


def test_replay_sample_returns_copies_and_storage_layout():
    buf = PrioritizedReplay(4, FIELDS)
    buf.add(make_batch(0, 4))
    batch, keys, _ = buf.sample(3)
    for name, (shape, dtype) in FIELDS.items():
        assert batch[name].shape == (3, *shape) and batch[name].dtype == np.dtype(dtype)
        assert batch[name].flags.c_contiguous and batch[name].flags.owndata
        assert buf._storage[name].shape == (4, *shape) and buf._storage[name].dtype == np.dtype(dtype)
    batch["action"][:] = -7
    assert (buf._storage["action"] >= 0).all()


# ---------------------------------------------------------------- snapshots

SNAPSHOT_NAMES = {
    "layout", "rng_state", "keys", "priorities", "field_0", "field_1", "field_2", "capacity", "size", "inserted",
    "sampled_batches", "beta_steps", "next_slot", "max_priority", "alpha", "beta", "eps",
}


def assert_same_state(a: PrioritizedReplay, b: PrioritizedReplay) -> None:
    """Everything that affects future behaviour is identical (the tree bit for bit)."""
    for attr in ("capacity", "size", "inserted", "sampled_batches", "max_priority", "alpha", "beta", "beta_steps",
                 "eps"):
        assert getattr(a, attr) == getattr(b, attr), attr
    assert list(a._storage) == list(b._storage) and a._record_dtype == b._record_dtype
    np.testing.assert_array_equal(a._keys, b._keys)
    np.testing.assert_array_equal(a._tree._tree, b._tree._tree)
    for name in a._storage:
        np.testing.assert_array_equal(a._storage[name][:a.size], b._storage[name][:b.size])
    assert a._rng.bit_generator.state == b._rng.bit_generator.state


def assert_same_sample(a: PrioritizedReplay, b: PrioritizedReplay, n: int) -> None:
    (ba, ka, wa), (bb, kb, wb) = a.sample(n), b.sample(n)
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_array_equal(wa, wb)
    for name in ba:
        np.testing.assert_array_equal(ba[name], bb[name])


def wrapped_buffer() -> PrioritizedReplay:
    """Capacity 8, 13 inserted (wrapped: next insert goes to slot 5), varied priorities, some samples taken."""
    buf = PrioritizedReplay(8, FIELDS, alpha=0.7, beta=0.5, beta_steps=9, eps=1e-3, seed=11)
    buf.add(make_batch(0, 5), priorities=np.arange(5) + 0.5)
    buf.add(make_batch(5, 8))
    buf.update_priorities(np.array([9, 10, 2]), np.array([3.0, 0.0, 9.0]))  # key 2 is stale
    buf.sample(4)
    buf.sample(3)
    return buf


@pytest.mark.parametrize("inserts", [[], [3], [8], [5, 8], [30], [3, 4, 5, 6]])
def test_snapshot_file_round_trip_then_identical_future(tmp_path, inserts):
    buf = PrioritizedReplay(8, FIELDS, alpha=0.7, beta=0.5, beta_steps=9, eps=1e-3, seed=11)
    for i, b in enumerate(inserts):
        buf.add(make_batch(buf.inserted, b), priorities=(np.arange(b) % 4 + 0.25) if i % 2 else None)
        if buf.size:
            buf.sample(5)
    path = tmp_path / "replay.npz"
    assert save_snapshot(buf, path) == path
    assert os.listdir(tmp_path) == ["replay.npz"]  # no temporary left behind
    got = load_snapshot(path, capacity=8)
    assert type(got) is PrioritizedReplay
    assert_same_state(buf, got)
    assert got.size == min(8, sum(inserts)) and got.inserted == sum(inserts)
    for key in range(max(0, buf.inserted - 8), buf.inserted):
        check_row(got._storage, key % 8, key)
    # Same future: the restored RNG draws the same batches/keys/weights, inserts land in the same slots.
    if buf.size:
        assert_same_sample(buf, got, 6)
    next_key = buf.inserted
    for b, prios in [(3, None), (1, np.array([7.0])), (11, None)]:
        for r in (buf, got):
            r.add(make_batch(r.inserted, b), priorities=prios)
        next_key += b
        assert got._keys[(next_key - 1) % 8] == next_key - 1
        assert_same_state(buf, got)
        assert_same_sample(buf, got, 9)
    for r in (buf, got):
        assert r.update_priorities(np.arange(next_key - 10, next_key), np.arange(10.0)) == 8
    assert_same_state(buf, got)
    assert_same_sample(buf, got, 16)


ops = st.lists(st.tuples(st.sampled_from(["add", "add_p", "sample", "update"]), st.integers(0, 12)), max_size=8)


def run_ops(buf: PrioritizedReplay, steps) -> list:
    out = []
    for op, n in steps:
        if op in ("add", "add_p"):
            buf.add(make_batch(buf.inserted, n), priorities=np.arange(n) % 3 * 0.5 if op == "add_p" else None)
        elif op == "sample" and buf.size:
            batch, keys, w = buf.sample(n + 1)
            out += [keys, w, *batch.values()]
        elif op == "update":
            keys = np.arange(buf.inserted - 2 * buf.capacity, buf.inserted + 2)[::n + 1]
            out.append(buf.update_priorities(keys, (keys % 5).astype(float)))
    return out


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 9), ops, ops)
def test_snapshot_restore_continues_exactly(cap, before, after):
    buf = PrioritizedReplay(cap, FIELDS, alpha=0.6, beta=0.4, beta_steps=5, seed=7)
    run_ops(buf, before)
    twin = PrioritizedReplay.from_snapshot(buf.snapshot_arrays(), cap)
    assert_same_state(buf, twin)
    for x, y in zip(run_ops(buf, after), run_ops(twin, after), strict=True):
        np.testing.assert_array_equal(x, y)
    assert_same_state(buf, twin)


def test_snapshot_arrays_plain_copies():
    buf = wrapped_buffer()
    arrays = buf.snapshot_arrays()
    assert set(arrays) == SNAPSHOT_NAMES
    assert all(isinstance(a, np.ndarray) and not a.dtype.hasobject for a in arrays.values())
    assert arrays["next_slot"] == 5 and arrays["size"] == 8 and arrays["inserted"] == 13
    assert arrays["field_0"].shape == (8, 2) and arrays["field_0"].dtype == np.float32
    layout = json.loads(arrays["layout"].tobytes())
    assert [(f["name"], f["shape"], f["dtype"]) for f in layout["fields"]] == [
        ("obs", [2], "<f4"), ("action", [], "<i8"), ("done", [], "|b1")]
    # Copies, not views: later activity must not change a snapshot already taken.
    before = {k: a.copy() for k, a in arrays.items()}
    buf.add(make_batch(13, 8), priorities=np.full(8, 50.0))
    buf.sample(4)
    for k, a in arrays.items():
        np.testing.assert_array_equal(a, before[k], err_msg=k)
    # 1-element scalars are accepted as well as 0-d ones.
    arrays = {k: (a.reshape(1) if a.ndim == 0 else a) for k, a in before.items()}
    assert_same_state(PrioritizedReplay.from_snapshot(arrays), PrioritizedReplay.from_snapshot(before))


def test_snapshot_other_bit_generators_round_trip():
    for bit_generator in (np.random.MT19937(3), np.random.Philox(4), np.random.SFC64(5)):
        buf = wrapped_buffer()
        buf._rng = np.random.Generator(bit_generator)
        buf.sample(2)
        got = PrioritizedReplay.from_snapshot(buf.snapshot_arrays())
        assert_same_sample(buf, got, 8)


def test_snapshot_rejects_unsupported_field_dtype():
    buf = PrioritizedReplay(4, {"x": ((), object)})
    with pytest.raises(SnapshotError, match="cannot be snapshotted"):
        buf.snapshot_arrays()


def test_save_snapshot_failure_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "replay.npz"
    buf = wrapped_buffer()
    save_snapshot(buf, path)
    old = path.read_bytes()

    def half_then_crash(f, **arrays):
        f.write(b"PK\x03\x04 partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", half_then_crash)
    buf.add(make_batch(13, 2))
    with pytest.raises(OSError, match="disk full"):
        save_snapshot(buf, path)
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["replay.npz"]
    monkeypatch.undo()
    assert load_snapshot(path).inserted == 13


# ---------------------------------------------------------------- hostile snapshots


def _layout(fn):
    """Mutation that rewrites the decoded layout JSON with fn(layout)."""
    def mutate(a):
        layout = json.loads(a["layout"].tobytes())
        fn(layout)
        a["layout"] = np.frombuffer(json.dumps(layout).encode(), dtype=np.uint8)
    return mutate


def _set(**values):
    def mutate(a):
        a.update({k: np.asarray(v) for k, v in values.items()})
    return mutate


def _set_prio(slot, value):
    def mutate(a):
        a["priorities"] = a["priorities"].copy()
        a["priorities"][slot] = value
    return mutate


CORRUPTIONS = [
    ("missing-keys", lambda a: a.pop("keys"), "missing array 'keys'"),
    ("missing-field", lambda a: a.pop("field_1"), "missing array 'field_1'"),
    ("missing-layout", lambda a: a.pop("layout"), "missing array 'layout'"),
    ("missing-rng", lambda a: a.pop("rng_state"), "missing array 'rng_state'"),
    ("missing-scalar", lambda a: a.pop("max_priority"), "missing array 'max_priority'"),
    ("extra-array", _set(extra=np.zeros(3)), r"unexpected arrays \['extra'\]"),
    ("keys-int32", lambda a: a.update(keys=a["keys"].astype(np.int32)), "'keys' must be int64"),
    ("keys-short", lambda a: a.update(keys=a["keys"][:-1]), r"'keys' must be int64 of shape \(8,\)"),
    ("keys-swapped", lambda a: a.update(keys=a["keys"][[1, 0, 2, 3, 4, 5, 6, 7]]), "keys inconsistent"),
    ("prio-float32", lambda a: a.update(priorities=a["priorities"].astype(np.float32)), "'priorities' must be float64"),
    ("prio-negative", _set_prio(3, -1.0), "slot 3 has -1.0"),
    ("prio-nan", _set_prio(0, np.nan), "slot 0 has nan"),
    ("prio-inf", _set_prio(7, np.inf), "slot 7 has inf"),
    ("prio-sum-overflows", _set(priorities=np.full(8, 1e308)), "sum to infinity"),
    ("size-float", _set(size=np.float64(8)), "'size' must be a 0-d or 1-element int64 array"),
    ("size-2-elements", _set(size=np.array([8, 8])), "'size' must be a 0-d or 1-element int64 array"),
    ("alpha-int", _set(alpha=np.int64(1)), "'alpha' must be a 0-d or 1-element float64 array"),
    ("size-gt-capacity", _set(size=np.int64(9)), r"size 9 outside \[0, capacity=8\]"),
    ("size-negative", _set(size=np.int64(-1)), r"size -1 outside"),
    ("size-vs-inserted", _set(size=np.int64(7)), r"size 7 != min\(capacity=8, inserted=13\)"),
    ("inserted-negative", _set(inserted=np.int64(-3)), "counters must be non-negative"),
    ("sampled-negative", _set(sampled_batches=np.int64(-1)), "counters must be non-negative"),
    ("next-slot", _set(next_slot=np.int64(0)), r"next_slot 0 != inserted % capacity = 5"),
    ("capacity-zero", _set(capacity=np.int64(0)), "capacity must be >= 1"),
    ("capacity-huge", _set(capacity=np.int64(1 << 40), inserted=np.int64(8), next_slot=np.int64(8)), "max_bytes"),
    ("alpha-nan", _set(alpha=np.float64(np.nan)), "alpha must be finite"),
    ("beta-inf", _set(beta=np.float64(np.inf)), "beta must be finite"),
    ("eps-negative", _set(eps=np.float64(-1e-3)), "must be >= 0"),
    ("max-priority-overflow", _set(max_priority=np.float64(1e300), alpha=np.float64(3.0)), "overflows"),
    ("field-shape", lambda a: a.update(field_0=a["field_0"][:, :1].copy()), r"'field_0' \('obs'\) is float32 \(8, 1\)"),
    ("field-dtype", lambda a: a.update(field_1=a["field_1"].astype(np.int32)), r"'field_1' \('action'\) is int32"),
    ("field-rows", lambda a: a.update(field_2=a["field_2"][:5]), r"'field_2' \('done'\) is bool \(5,\)"),
    ("layout-shape", _layout(lambda l: l["fields"][0].update(shape=[3])), r"layout says <f4 \(8, 3\)"),
    ("layout-dtype", _layout(lambda l: l["fields"][1].update(dtype="<f8")), r"layout says <f8"),
    ("layout-object-dtype", _layout(lambda l: l["fields"][1].update(dtype="|O")), "unsupported dtype '|O'"),
    ("layout-void-dtype", _layout(lambda l: l["fields"][1].update(dtype="|V8")), "unsupported dtype '|V8'"),
    ("layout-struct-dtype", _layout(lambda l: l["fields"][1].update(dtype="i8,O")), "unsupported dtype 'i8,O'"),
    ("layout-junk-dtype", _layout(lambda l: l["fields"][1].update(dtype="no-such-type")), "unsupported dtype"),
    ("layout-noncanonical-dtype", _layout(lambda l: l["fields"][1].update(dtype="int64")), "unsupported dtype 'int64'"),
    ("layout-fewer-fields", _layout(lambda l: l["fields"].pop()), r"unexpected arrays \['field_2'\]"),
    ("layout-duplicate-name", _layout(lambda l: l["fields"][1].update(name="obs")), "unique non-empty string"),
    ("layout-empty-name", _layout(lambda l: l["fields"][1].update(name="")), "unique non-empty string"),
    ("layout-bad-shape", _layout(lambda l: l["fields"][0].update(shape=[-2])), "shape must be a list"),
    ("layout-bool-shape", _layout(lambda l: l["fields"][0].update(shape=[True, 2])), "shape must be a list"),
    ("layout-extra-key", _layout(lambda l: l["fields"][0].update(pickle="x")), "exactly name, shape and dtype"),
    ("layout-no-fields", _layout(lambda l: l.update(fields=[])), "non-empty list"),
    ("layout-format", _layout(lambda l: l.update(format="other")), "not a rlctl.PrioritizedReplay snapshot"),
    ("layout-version", _layout(lambda l: l.update(version=99)), "unsupported version 99"),
    ("layout-not-json", _set(layout=np.frombuffer(b"{not json", dtype=np.uint8)), "not valid UTF-8 JSON"),
    ("layout-not-utf8", _set(layout=np.frombuffer(b"\xff\xfe", dtype=np.uint8)), "not valid UTF-8 JSON"),
    ("layout-int8", lambda a: a.update(layout=a["layout"].view(np.int8)), "must be a 1-D uint8 array"),
    ("rng-generator", _set(rng_state=np.frombuffer(b'{"bit_generator": "os.system"}', np.uint8)),
     "unsupported bit generator 'os.system'"),
    ("rng-state", _set(rng_state=np.frombuffer(b'{"bit_generator": "PCG64", "state": 1}', np.uint8)),
     "invalid PCG64 state"),
    ("rng-not-dict", _set(rng_state=np.frombuffer(b"[1, 2]", np.uint8)), "unsupported bit generator None"),
]


@pytest.mark.parametrize("mutate,match", [c[1:] for c in CORRUPTIONS], ids=[c[0] for c in CORRUPTIONS])
def test_load_snapshot_rejects_corrupt_arrays(tmp_path, mutate, match):
    arrays = wrapped_buffer().snapshot_arrays()
    mutate(arrays)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(SnapshotError, match=match):
        load_snapshot(path)
    with pytest.raises(SnapshotError, match=match):  # the in-memory entry point checks the same things
        PrioritizedReplay.from_snapshot(arrays)


def test_load_snapshot_capacity_must_match(tmp_path):
    path = tmp_path / "replay.npz"
    save_snapshot(wrapped_buffer(), path)
    assert load_snapshot(path, capacity=8).capacity == 8
    with pytest.raises(SnapshotError, match="snapshot capacity 8 != requested capacity 16"):
        load_snapshot(path, capacity=16)
    with pytest.raises(SnapshotError, match="max_bytes"):
        load_snapshot(path, max_bytes=100)


@pytest.mark.parametrize("keep", [0, 3, 100, 0.5, -22])
def test_load_snapshot_truncated_file(tmp_path, keep):
    path = tmp_path / "replay.npz"
    save_snapshot(wrapped_buffer(), path)
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    path.write_bytes(data[:cut])
    with pytest.raises(SnapshotError, match=str(path)):
        load_snapshot(path)


def test_load_snapshot_flipped_data_byte_fails_crc(tmp_path):
    buf = wrapped_buffer()
    path = tmp_path / "replay.npz"
    save_snapshot(buf, path)
    data = bytearray(path.read_bytes())
    at = data.find(buf._tree._leaves[:8].tobytes())
    assert at > 0
    data[at + 3] ^= 0x40  # still a finite positive double: only the zip CRC can notice
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="CRC"):
        load_snapshot(path)


def test_load_snapshot_rejects_non_npz_files(tmp_path):
    npy = tmp_path / "bare.npy"
    np.save(npy, np.zeros(4))
    with pytest.raises(SnapshotError, match="not an .npz"):
        load_snapshot(npy)
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(SnapshotError, match="not an .npz"):
        load_snapshot(tmp_path / "empty.npz")
    packed = tmp_path / "packed.npz"
    np.savez_compressed(packed, **wrapped_buffer().snapshot_arrays())
    with pytest.raises(SnapshotError, match="compressed members"):
        load_snapshot(packed)
    with pytest.raises(SnapshotError, match="cannot read snapshot"):
        load_snapshot(tmp_path)  # a directory
    with pytest.raises(FileNotFoundError):  # absent (first start) stays distinguishable from corrupt
        load_snapshot(tmp_path / "missing.npz")


class _MakeDir:
    """Unpickling this runs os.mkdir(path): the test payload that must never execute."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.mark.parametrize("where", ["keys", "field_1", "unknown_member"])
def test_load_snapshot_never_unpickles(tmp_path, where):
    marker = tmp_path / "pwned"
    arrays = wrapped_buffer().snapshot_arrays()
    arrays[where] = np.array([_MakeDir(marker), 1], dtype=object)
    path = tmp_path / "evil.npz"
    np.savez(path, **arrays)  # allow_pickle defaults to True when saving: stored as a pickle
    with pytest.raises(SnapshotError, match="cannot read snapshot: ValueError: Object arrays cannot be loaded"):
        load_snapshot(path)
    assert not marker.exists()
    # The payload is live: loading with pickles allowed would have run it.
    with np.load(path, allow_pickle=True) as z:
        z[where]
    assert marker.is_dir()


def test_load_snapshot_rejects_bare_pickle(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.npz"
    path.write_bytes(pickle.dumps(_MakeDir(marker)))
    with pytest.raises(SnapshotError, match="not an .npz"):
        load_snapshot(path)
    assert not marker.exists()


def test_from_snapshot_rejects_non_arrays_and_object_arrays():
    arrays = wrapped_buffer().snapshot_arrays()
    with pytest.raises(SnapshotError, match="'keys' is a list, not a numpy array"):
        PrioritizedReplay.from_snapshot({**arrays, "keys": arrays["keys"].tolist()})
    with pytest.raises(SnapshotError, match="'size' has object dtype"):
        PrioritizedReplay.from_snapshot({**arrays, "size": np.array(8, dtype=object)})
