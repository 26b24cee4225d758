"""Tests for rlctl.buffers against brute-force references (plain lists / np.cumsum)."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlctl.buffers import PrioritizedReplay, SumTree

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

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
