"""Benchmark rlctl.buffers.PrioritizedReplay on CartPole-sized transitions.

Usage: python bench/replay.py [--quick]

Measures (1) insert throughput with add() in batches of 1000 into a 1M-capacity
buffer, wrapping around at least once, and (2) the time of one learner step's
buffer work, sample(512) + update_priorities(keys, new_p), on a full 1M buffer.
The last line of output is one JSON object for machine consumption.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

# Allow `python bench/replay.py` from a checkout without installing the package.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from rlctl.buffers import PrioritizedReplay  # noqa: E402

CAPACITY = 1_000_000
INSERT_BATCH = 1000
SAMPLE_N = 512
INSERT_TARGET_PER_S = 2_000_000
SAMPLE_UPDATE_TARGET_MS = 0.3

FIELDS = {
    "obs": ((4,), np.float32),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "next_obs": ((4,), np.float32),
    "discount": ((), np.float32),
}


def make_batches(rng: np.random.Generator, count: int, size: int) -> list[tuple[dict, np.ndarray]]:
    """Pre-generate distinct input batches so data generation is not timed."""
    out = []
    for _ in range(count):
        batch = {
            "obs": rng.standard_normal((size, 4), dtype=np.float32),
            "action": rng.integers(0, 2, size, dtype=np.int64),
            "reward": np.ones(size, dtype=np.float32),
            "next_obs": rng.standard_normal((size, 4), dtype=np.float32),
            "discount": np.full(size, 0.99, dtype=np.float32),
        }
        out.append((batch, rng.exponential(1.0, size)))
    return out


def bench_insert(reps: int, total_inserts: int) -> float:
    """Median transitions/s over `reps` fresh buffers, each receiving `total_inserts` transitions."""
    rng = np.random.default_rng(1)
    batches = make_batches(rng, 64, INSERT_BATCH)
    n_calls = total_inserts // INSERT_BATCH
    rates = []
    for _ in range(reps):
        # Timed from a fresh (empty) buffer, so the first lap's page faults on the
        # preallocated storage are included: a conservative figure.
        buf = PrioritizedReplay(CAPACITY, FIELDS)
        t0 = time.perf_counter()
        for i in range(n_calls):
            batch, prio = batches[i % len(batches)]
            buf.add(batch, prio)
        rates.append(n_calls * INSERT_BATCH / (time.perf_counter() - t0))
        assert buf.inserted > CAPACITY, "insert benchmark must wrap around"
    return statistics.median(rates)


def bench_sample_update(iters: int) -> float:
    """Median milliseconds of sample(512) + update_priorities on a full 1M buffer."""
    rng = np.random.default_rng(2)
    buf = PrioritizedReplay(CAPACITY, FIELDS, seed=3)
    big = make_batches(rng, 1, CAPACITY)[0]
    buf.add(*big)
    assert buf.size == CAPACITY
    new_ps = [rng.exponential(1.0, SAMPLE_N) for _ in range(16)]
    for i in range(50):  # warm-up
        _, keys, _ = buf.sample(SAMPLE_N)
        buf.update_priorities(keys, new_ps[i % 16])
    times = np.empty(iters)
    clock = time.perf_counter
    for i in range(iters):
        t0 = clock()
        _, keys, _ = buf.sample(SAMPLE_N)
        buf.update_priorities(keys, new_ps[i % 16])
        times[i] = clock() - t0
    return float(np.median(times) * 1e3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions/iterations")
    args = parser.parse_args(argv)
    reps, total, iters = (3, 1_200_000, 300) if args.quick else (5, 2_500_000, 2000)

    insert_per_s = bench_insert(reps, total)
    sample_update_ms = bench_sample_update(iters)

    ok_i = insert_per_s >= INSERT_TARGET_PER_S
    ok_s = sample_update_ms <= SAMPLE_UPDATE_TARGET_MS
    print(f"PrioritizedReplay, capacity {CAPACITY:,}, CartPole-sized transitions{' (quick)' if args.quick else ''}")
    print(f"  insert (add, batch {INSERT_BATCH}, median of {reps}): {insert_per_s:,.0f} transitions/s"
          f"  target >= {INSERT_TARGET_PER_S:,}/s  [{'met' if ok_i else 'MISSED'}]")
    print(f"  sample({SAMPLE_N}) + update_priorities (median of {iters}): {sample_update_ms:.3f} ms"
          f"  target <= {SAMPLE_UPDATE_TARGET_MS} ms  [{'met' if ok_s else 'MISSED'}]")
    result = {"bench": "replay", "insert_per_s": round(insert_per_s), "sample_update_ms": round(sample_update_ms, 4)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
