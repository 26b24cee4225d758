"""Benchmark rlctl.data.buffers.PrioritizedReplay on CartPole-sized transitions, and rlctl.data.frames.FrameReplay on Atari ones.

Usage: python bench/replay.py [--quick]

Measures (1) insert throughput with add() in batches of 1000 into a 1M-capacity
buffer, wrapping around at least once, and (2) the time of one learner step's
buffer work, sample(512) + update_priorities(keys, new_p), on a full 1M buffer.
The Atari row (run first, on a fresh heap): replay memory per stored 4 x 84 x 84
transition from the process's RSS growth over 100k inserts of the messages Ape-X
collectors send (a gymnasium FrameStackObservation over random frames, cut by the
collectors' chunker), insert and sample rates, each against a PrioritizedReplay
that stores whole obs / next_obs stacks (10k inserts).
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

from rlctl.data.buffers import PrioritizedReplay  # noqa: E402
from rlctl.data.frames import MIN_FRAME_CHUNK_STEPS, FrameReplay, parse_frame_items  # noqa: E402

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


ATARI_INSERTS = 100_000
ATARI_BASELINE_INSERTS = 10_000
ATARI_BATCH = 64  # the Pong Ape-X job's learner batch
ATARI_TARGET_BYTES = 8 * 1024
ATARI_STACK, ATARI_FRAME = 4, (84, 84)


def _rss_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _atari_messages(count: int) -> list[tuple[dict, dict, np.ndarray]]:
    """`count` Ape-X chunks of 4 envs as collectors cut them: (frame message arrays, whole-stack arrays, priority)."""
    import gymnasium as gym
    from gymnasium.wrappers import FrameStackObservation

    from rlctl.algos.apex.dqn import ChunkedNStep

    class RandomFrames(gym.Env):
        observation_space = gym.spaces.Box(0, 255, ATARI_FRAME, np.uint8)
        action_space = gym.spaces.Discrete(6)

        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)

        def reset(self, *, seed=None, options=None):
            self.t = 0
            return self.rng.integers(0, 256, ATARI_FRAME, dtype=np.uint8), {}

        def step(self, action):  # episodes of ~2000 agent steps, like Pong's
            self.t += 1
            return self.rng.integers(0, 256, ATARI_FRAME, dtype=np.uint8), 0.0, self.rng.random() < 5e-4, False, {}

    envs = 4
    env = gym.vector.SyncVectorEnv([lambda i=i: FrameStackObservation(RandomFrames(i), ATARI_STACK)
                                    for i in range(envs)])
    shape = (ATARI_STACK, *ATARI_FRAME)
    framed = ChunkedNStep(envs, 3, 0.99, shape, np.uint8, MIN_FRAME_CHUNK_STEPS, n_actions=6, frame_stack=ATARI_STACK)
    whole = ChunkedNStep(envs, 3, 0.99, shape, np.uint8, MIN_FRAME_CHUNK_STEPS, n_actions=6)
    rng = np.random.default_rng(0)
    out = []
    obs, _ = env.reset(seed=0)
    while len(out) < count:
        actions = rng.integers(0, 6, envs)
        q = rng.normal(size=(envs, 6)).astype(np.float32)
        nxt, rew, term, trunc, _ = env.step(actions)
        whole.add(obs, actions, rew, nxt, term, trunc, q=q)
        if framed.add(obs, actions, rew, nxt, term, trunc, q=q):
            a, b = framed.take(), whole.take()
            prio = a.pop("priority")
            b.pop("priority")
            out.append((a, b, prio))
        obs = nxt
    env.close()
    return out


def bench_atari(iters: int) -> dict:
    """Bytes per stored transition (RSS growth), insert and sample rates: FrameReplay against whole stacks."""
    stack = ((ATARI_STACK, *ATARI_FRAME), np.dtype(np.uint8))
    layout = {"obs": stack, "action": ((), np.dtype(np.int64)), "reward": ((), np.dtype(np.float32)),
              "next_obs": stack, "discount": ((), np.dtype(np.float32))}
    messages = _atari_messages(24)
    per_message = len(messages[0][2])

    def fill(make, inserts, convert):
        before = _rss_bytes()
        buf = make()
        t0, done, i = time.perf_counter(), 0, 0
        while done < inserts:
            framed, whole, prio = messages[i % len(messages)]
            buf.add(convert(framed, whole), prio)
            done, i = done + len(prio), i + 1
        elapsed = time.perf_counter() - t0
        return buf, (_rss_bytes() - before) / done, done / elapsed

    frame_buf, frame_bytes, frame_insert = fill(
        lambda: FrameReplay(ATARI_INSERTS, layout, seed=1), ATARI_INSERTS,
        lambda framed, _: parse_frame_items(framed, layout, len(framed["action"]), 1 << 30))

    def sample_rate(buf):
        for _ in range(20):
            buf.sample(ATARI_BATCH)
        t0 = time.perf_counter()
        for _ in range(iters):
            buf.sample(ATARI_BATCH)
        return iters * ATARI_BATCH / (time.perf_counter() - t0)

    frame_sample = sample_rate(frame_buf)
    frames_per_item = frame_buf.frames_per_item()
    reserved = frame_buf.bytes_per_item()
    del frame_buf
    plain_buf, plain_bytes, plain_insert = fill(lambda: PrioritizedReplay(ATARI_BASELINE_INSERTS, layout, seed=1),
                                                ATARI_BASELINE_INSERTS, lambda _, whole: whole)
    plain_sample = sample_rate(plain_buf)
    del plain_buf
    return {"atari_bytes_per_transition": round(frame_bytes), "atari_reserved_bytes_per_transition": round(reserved),
            "atari_frames_per_transition": round(frames_per_item, 4),
            "atari_baseline_bytes_per_transition": round(plain_bytes),
            "atari_insert_per_s": round(frame_insert), "atari_baseline_insert_per_s": round(plain_insert),
            "atari_sample_per_s": round(frame_sample), "atari_baseline_sample_per_s": round(plain_sample),
            "atari_bytes_ratio": round(frame_bytes / plain_bytes, 4), "atari_message_items": per_message}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions/iterations")
    args = parser.parse_args(argv)
    reps, total, iters = (3, 1_200_000, 300) if args.quick else (5, 2_500_000, 2000)

    atari = bench_atari(200 if args.quick else 1000)  # first: its RSS figures want a heap no bench has used yet
    insert_per_s = bench_insert(reps, total)
    sample_update_ms = bench_sample_update(iters)

    ok_i = insert_per_s >= INSERT_TARGET_PER_S
    ok_s = sample_update_ms <= SAMPLE_UPDATE_TARGET_MS
    print(f"PrioritizedReplay, capacity {CAPACITY:,}, CartPole-sized transitions{' (quick)' if args.quick else ''}")
    print(f"  insert (add, batch {INSERT_BATCH}, median of {reps}): {insert_per_s:,.0f} transitions/s"
          f"  target >= {INSERT_TARGET_PER_S:,}/s  [{'met' if ok_i else 'MISSED'}]")
    print(f"  sample({SAMPLE_N}) + update_priorities (median of {iters}): {sample_update_ms:.3f} ms"
          f"  target <= {SAMPLE_UPDATE_TARGET_MS} ms  [{'met' if ok_s else 'MISSED'}]")
    ok_a = atari["atari_bytes_per_transition"] <= ATARI_TARGET_BYTES
    print(f"FrameReplay, Atari 4 x 84 x 84 uint8 stacks (Ape-X chunks of {atari['atari_message_items']} transitions), "
          f"against PrioritizedReplay storing whole obs / next_obs stacks")
    print(f"  memory per stored transition (RSS growth over {ATARI_INSERTS:,} inserts): "
          f"{atari['atari_bytes_per_transition']:,} B ({atari['atari_frames_per_transition']:.3f} frames; "
          f"{atari['atari_reserved_bytes_per_transition']:,} B reserved per slot)  target <= {ATARI_TARGET_BYTES:,} B  "
          f"[{'met' if ok_a else 'MISSED'}]; whole stacks: {atari['atari_baseline_bytes_per_transition']:,} B "
          f"(ratio {atari['atari_bytes_ratio']:.3f})")
    print(f"  insert: {atari['atari_insert_per_s']:,} transitions/s (whole stacks {atari['atari_baseline_insert_per_s']:,}/s)")
    print(f"  sample({ATARI_BATCH}), stacks rebuilt: {atari['atari_sample_per_s']:,} transitions/s "
          f"(whole stacks {atari['atari_baseline_sample_per_s']:,}/s)")
    result = {"bench": "replay", "insert_per_s": round(insert_per_s), "sample_update_ms": round(sample_update_ms, 4),
              **atari}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
