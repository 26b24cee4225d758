"""Transitions/s that ONE real replay shard process accepts from 2 sender processes.

Usage: python bench/ingest.py [--quick] [--batches 256,2048]

The bench starts `python -m rlctl.roles.replay` with the environment the plan would give
it (job: jobs/apex.toml with `replay.samples_per_insert = 0`, no rate limit, and a large
capacity), plays the supervisor's control ROUTER, and starts 2 sender processes (this
script with --child-sender, sending through rlctl.datapaths.sender.ExperienceSender, so with
the collector's socket options) that PUSH ready-made CartPole-sized "experience" batches
(obs (B,4) f32, action (B,) i64, reward (B,) f32, next_obs (B,4) f32, discount (B,) f32,
priority (B,) f32) over CURVE loopback as fast as the shard takes them. The rate is the
delta of the shard's own heartbeat counter `replay/inserted` over a steady window after a
warm-up. Target: >= 1,000,000 transitions/s (best batch size is the headline).

Last line: {"bench": "ingest", "transitions_per_s": ..., "by_batch": {...}}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from rlctl.net import wire  # noqa: E402

TARGET = 1_000_000
N_SENDERS = 2
CAPACITY = 1_000_000  # 20x jobs/apex.toml's; the window starts once it is full (every page touched)
METRICS_INTERVAL_S = 0.5


def make_batches(batch: int, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Distinct ready-made CartPole-sized experience batches."""
    rng = np.random.default_rng(seed)
    return [{
        "obs": rng.standard_normal((batch, 4), dtype=np.float32),
        "action": rng.integers(0, 2, batch, dtype=np.int64),
        "reward": np.ones(batch, dtype=np.float32),
        "next_obs": rng.standard_normal((batch, 4), dtype=np.float32),
        "discount": np.full(batch, 0.99 ** 3, dtype=np.float32),
        "priority": rng.exponential(1.0, batch).astype(np.float32),
    } for _ in range(count)]


def child_sender() -> None:
    """PUSH batches to the shard as fast as it takes them, through the collector's own ExperienceSender
    (same socket options), waiting for room the way the collector does when the shard pushes back."""
    import signal

    from rlctl.datapaths.sender import ExperienceSender

    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    endpoints = json.loads(os.environ["RLCTL_ENDPOINTS"])
    batch = int(os.environ["RLCTL_BENCH_BATCH"])
    name = f"collector-{os.environ['RLCTL_RANK']}"
    batches = make_batches(batch, 16, int(os.environ["RLCTL_RANK"]))
    net = wire.SecureContext(wire.CurveKeys.from_env())
    sender = ExperienceSender(net, [r["experience"] for r in endpoints["replay"]], name, "experience",
                              wire.experience_buffer_bytes(4 * 4))  # CartPole's 4 float32
    i = 0
    while not stop:
        if sender.try_send(batches[i % len(batches)], 0):
            i += 1
        else:
            sender.sock.poll(20, zmq.POLLOUT)
    net.close()


def measure(batch: int, warmup: float, window: float, tmp) -> dict:
    job_path = H.write_job(tmp, {"replay": {"samples_per_insert": 0.0, "capacity": CAPACITY, "min_size": 1000},
                                 "logging": {"metrics_interval_s": METRICS_INTERVAL_S}},
                           name=f"ingest-{batch}.toml")
    keys = H.generate_keys()
    endpoints, binds = H.make_endpoints(replay_shards=1)
    control = H.ControlRouter(keys, endpoints["control"])
    procs = []
    try:
        shard = H.start_role("replay", 0, job_path, endpoints, keys, "bench-ingest", tmp, binds=binds["replay"][0])
        procs.append(shard)
        control.wait_hello(["replay-0"], 60, procs)
        for r in range(N_SENDERS):
            env = H.role_env("collector", r, job_path, endpoints, keys, "bench-ingest",
                             extra={"RLCTL_BENCH_BATCH": str(batch)})
            procs.append(H.Proc(f"sender-{r}", [sys.executable, os.path.abspath(__file__), "--child-sender"], env, tmp))
        # Warm-up: `warmup` seconds of inserts and until the buffer is full (steady state: the first lap's
        # page faults on the preallocated storage are not in the window), at most 60 s.
        deadline = time.monotonic() + 60
        started = None
        while time.monotonic() < deadline:
            beats = control.series("replay-0")
            m = beats[-1][1] if beats else {}
            if started is None and m.get("replay/inserted", 0) > 0:
                started = time.monotonic()
            if started and time.monotonic() - started >= warmup and m.get("replay/size", 0) >= CAPACITY:
                break
            for p in procs:
                p.check()
            time.sleep(0.1)
        t0 = time.monotonic()
        time.sleep(window)
        t1 = time.monotonic() + 0.01
        for p in procs:
            p.check()
        rate, n_beats = control.rate("replay-0", "replay/inserted", t0, t1)
        reported = control.values("replay-0", "replay/insert_per_s", t0, t1)
        dropped = control.values("replay-0", "net/dropped", t0, t1)
        size = control.values("replay-0", "replay/size", t0, t1)
        return {"batch": batch, "transitions_per_s": rate, "heartbeats": n_beats,
                "reported_per_s": reported, "dropped": dropped[-1] if dropped else None,
                "size": size[-1] if size else None}
    finally:
        H.stop_all(procs)
        control.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short windows")
    ap.add_argument("--batches", default="256,2048", help="comma-separated batch sizes")
    ap.add_argument("--child-sender", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_sender:
        child_sender()
        return
    H.children.install()  # killed or failing: the shard and the senders end with the bench
    sizes = [int(x) for x in args.batches.split(",")]
    warmup, window = (1.5, 3.0) if args.quick else (3.0, 8.0)
    print(f"ingest bench: 1 replay shard (capacity {CAPACITY:,}, samples_per_insert 0), {N_SENDERS} sender processes, "
          f"CURVE loopback, warm-up {warmup:g}s, window {window:g}s; {os.cpu_count()} CPUs (shared)")
    res = {}
    with H.TempDir() as tmp:
        for b in sizes:
            r = measure(b, warmup, window, tmp)
            res[b] = r
            per_beat = ", ".join(f"{x / 1e6:.2f}" for x in r["reported_per_s"])
            print(f"  batch {b:5d}: {r['transitions_per_s']:12,.0f} transitions/s over {r['heartbeats']} heartbeats "
                  f"(per-heartbeat M/s: {per_beat}; dropped {r['dropped']}, size {r['size']:,.0f})  "
                  f"target >= {TARGET:,}: {H.verdict(r['transitions_per_s'], TARGET)}")
    best = max(res.values(), key=lambda r: r["transitions_per_s"] if r["transitions_per_s"] == r["transitions_per_s"] else -1)
    print(f"best: batch {best['batch']}, {best['transitions_per_s']:,.0f} transitions/s "
          f"(target >= {TARGET:,}: {H.verdict(best['transitions_per_s'], TARGET)})")
    H.emit_json({"bench": "ingest", "transitions_per_s": round(best["transitions_per_s"], 1),
                 "best_batch": best["batch"],
                 "by_batch": {str(b): round(r["transitions_per_s"], 1) for b, r in res.items()}})


if __name__ == "__main__":
    main()
