"""Env steps/s of ONE real collector process versus a bare in-process act/step loop.

Usage: python bench/collector.py [--quick] [--envs 8,64] [--profile]

For each vector width the bench starts `python -m rlctl.roles.collector` (CartPole-v1,
native vector env, the model and algorithm of jobs/apex.toml) with the environment the
plan would give it, and plays its peers over CURVE-secured loopback sockets: a control
ROUTER that reads its heartbeats, a weights PUB that publishes fresh weights at a
learner-like rate, and a PULL sink (where the replay shard would be) that receives and
discards experience as fast as it comes. After a warm-up, the collector's rate is the
delta of its heartbeat counter `env_steps` over a steady window (cross-checked with the
transitions the sink received and the heartbeat's `charts/env_steps_per_s`).

The reference is a bare loop in this process doing the same vector-env steps and the same
batched forward pass (same QNetwork, torch 1 thread, Ape-X epsilon-greedy over argmax),
counting env steps the same way (the autoreset step after an episode end is not a step).
The two are interleaved in rounds within the same run (the collector is paused with
SIGSTOP while the bare loop runs, resumed with SIGCONT for its own window) so both see
the same background load; the figures are medians over rounds. Target: ratio >= 0.9.
Also shown: the same ratio per CPU-second (collector process CPU time read from /proc at
each heartbeat, the bare loop's thread time), which a busy shared machine disturbs less.

With --profile (or automatically when a width misses) the real collector runs once more
as collector-0 against the same peers, but started through this script (--child-profile),
which wraps the callees that `rlctl.roles.collector.run` looks up in its module (weights
poll, QNetwork.forward, the epsilon-greedy, env.step, the n-step accumulator, initial
priorities, send, heartbeat) with timers, then calls that same `run`. It prints each
section's time per loop iteration next to the bare loop's: whatever the collector spends
beyond forward + epsilon-greedy + env.step is what the ratio loses. (Each timed call adds
about a microsecond.)

Last line: {"bench": "collector", "collector_steps_per_s", "bare_steps_per_s", "ratio", "configs": {...}}
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from rlctl.net import wire  # noqa: E402

TARGET_RATIO = 0.9
PUBLISH_HZ = 30.0  # ~ a learner at 300 updates/s with apex.toml's publish_interval = 10
METRICS_INTERVAL_S = 0.5


# --------------------------------------------------------------------------- the bare reference loop

class BareLoop:
    """Same vector env, forward, epsilon-greedy and step as the collector; nothing else. Kept warm across rounds."""

    def __init__(self, job_path: Path, rank: int = 0):
        import torch

        from rlctl.algos.apex import dqn as apex
        from rlctl.envs import env_space_info, make_vec_env
        from rlctl.algos import build_model
        from rlctl.job.load import load_job
        from rlctl.role_names import Role
        from rlctl.roles.context import process_seed

        torch.set_num_threads(1)
        self.torch = torch
        job = load_job(job_path)
        algo = job.algorithm
        seed = process_seed(job.job.seed, Role.COLLECTOR, rank)  # RoleContext.seed of collector-<rank>
        self.rng = np.random.default_rng(seed)
        torch.manual_seed(seed % 2**63)
        self.env = make_vec_env(job.env)
        info = env_space_info(self.env)
        n_actions = info.n_actions
        self.n = n = self.env.num_envs
        self.model = build_model(job, info)
        self.model.eval()
        self.eps = apex.epsilon_ladder(job.collector_count * n, algo.epsilon, algo.epsilon_alpha)[rank * n:(rank + 1) * n]
        self.explore = apex.EpsilonGreedy(self.eps, n_actions, self.rng)  # the collector's own epsilon-greedy
        self.obs, _ = self.env.reset(seed=seed)
        self.prev_done = np.zeros(n, dtype=bool)
        self.run(0.5)  # warm-up

    def run(self, seconds: float) -> dict:
        torch, model, env, explore, n = self.torch, self.model, self.env, self.explore, self.n
        obs, prev_done = self.obs, self.prev_done
        steps = iters = 0
        t0 = time.perf_counter()
        c0 = time.thread_time()
        end = t0 + seconds
        while True:
            for _ in range(50):
                with torch.no_grad():
                    actions = explore(model(torch.from_numpy(obs)))
                obs, _, terminated, truncated, _ = env.step(actions)
                steps += n - int(prev_done.sum())  # the collector's count: valid (non-autoreset) steps
                prev_done = terminated | truncated
            iters += 50
            now = time.perf_counter()
            if now >= end:
                break
        cpu = time.thread_time() - c0
        self.obs, self.prev_done = obs, prev_done
        dt = now - t0
        return {"steps_per_s": steps / dt, "us_per_iter": dt / iters * 1e6, "steps_per_cpu_s": steps / cpu}

    def close(self) -> None:
        self.env.close()


# --------------------------------------------------------------------------- the collector under test

class Peers:
    """Control ROUTER (thread), weights PUB and experience PULL sink, bound where the plan puts them."""

    def __init__(self, keys: wire.CurveKeys, endpoints: dict, job_path: Path):
        import torch

        from rlctl.envs import probe_space_info
        from rlctl.algos import build_model
        from rlctl.models import flat_parameters
        from rlctl.job.load import load_job

        self.control = H.ControlRouter(keys, endpoints["control"])
        self.net = wire.SecureContext(keys)
        self.pub = self.net.server(zmq.PUB, endpoints["weights"], sndhwm=2)
        self.sink = self.net.server(zmq.PULL, endpoints["replay"][0]["experience"], rcvhwm=1000)
        job = load_job(job_path)
        torch.manual_seed(0)
        net = build_model(job, probe_space_info(job.env))
        self.params = flat_parameters(net).numpy()
        self.version = 0
        self.next_pub = 0.0
        self.received = 0  # transitions
        self.batches = 0

    def pump(self, seconds: float) -> None:
        """Drain the sink (and publish weights on schedule) for `seconds`."""
        end = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            if now >= end:
                return
            if now >= self.next_pub:
                self.version += 1
                wire.send(self.pub, "weights", "learner-0", self.version, None, {"params": self.params})
                self.next_pub = now + 1.0 / PUBLISH_HZ
            if self.sink.poll(max(1, int((min(end, self.next_pub) - now) * 1000))):
                while True:
                    try:
                        _, msg = wire.recv(self.sink, zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.received += len(msg.arrays["reward"])
                    self.batches += 1

    def close(self) -> None:
        self.control.close()
        self.net.close()


def measure_interleaved(job_path: Path, tmp: Path, warmup: float, window: float, rounds: int, bare: BareLoop) -> dict:
    """Start one real collector; then `rounds` times: pause it (SIGSTOP) and run the bare loop for `window`,
    resume it (SIGCONT) and measure it for `window`. Interleaving keeps both under the same background load."""
    keys = H.generate_keys()
    endpoints, _ = H.make_endpoints(replay_shards=1)
    peers = Peers(keys, endpoints, job_path)
    proc = None
    out = []
    try:
        proc = H.start_role("collector", 0, job_path, endpoints, keys, "bench-collector", tmp)
        peers.control.cpu_pids["collector-0"] = proc.pid
        peers.control.wait_hello(["collector-0"], 60, [proc])
        peers.pump(warmup)
        proc.check()
        for _ in range(rounds):
            os.kill(proc.pid, signal.SIGSTOP)
            b = bare.run(window)
            os.kill(proc.pid, signal.SIGCONT)
            peers.pump(2.5 * METRICS_INTERVAL_S)  # settle: heartbeats resume
            got0, t0 = peers.received, time.monotonic()
            peers.pump(window)
            got1, t1 = peers.received, time.monotonic()
            proc.check()
            rate, beats = peers.control.rate("collector-0", "env_steps", t0, t1)
            out.append({"collector": rate, "bare": b["steps_per_s"], "bare_us_per_iter": b["us_per_iter"],
                        "collector_cpu": peers.control.cpu_rate("collector-0", "env_steps", t0, t1),
                        "bare_cpu": b["steps_per_cpu_s"],
                        "sink": (got1 - got0) / (t1 - t0), "heartbeats": beats,
                        "reported": H.median(peers.control.values("collector-0", "charts/env_steps_per_s", t0, t1))})
        versions = peers.control.values("collector-0", "collector/weight_version", 0, time.monotonic())
        return {"rounds": out, "weights_published": peers.version, "weight_version_seen": versions[-1] if versions else None}
    finally:
        if proc is not None:
            try:
                os.kill(proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            proc.stop()
        peers.close()


def measure_profile(job_path: Path, tmp: Path, warmup: float, window: float) -> dict:
    """Run the real collector loop with timed callees (--child-profile) as collector-0 against the same peers."""
    keys = H.generate_keys()
    endpoints, _ = H.make_endpoints(replay_shards=1)
    peers = Peers(keys, endpoints, job_path)
    out_path = tmp / "profile.json"
    proc = None
    try:
        env = H.role_env("collector", 0, job_path, endpoints, keys, "bench-collector",
                         extra={"RLCTL_BENCH_PROFILE_OUT": str(out_path)})
        proc = H.Proc("collector-0", [sys.executable, os.path.abspath(__file__), "--child-profile"], env, tmp)
        peers.control.wait_hello(["collector-0"], 60, [proc])
        peers.pump(warmup + window)
        proc.check()
    finally:
        if proc is not None:
            proc.stop()
        peers.close()
    return json.loads(out_path.read_text())


class _Sections:
    """Inclusive wall time of the outermost timed call (a forward inside initial_priorities counts there)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.depth = 0

    def wrap(self, name: str, fn):
        import functools

        pc = time.perf_counter

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            self.depth = 1
            t0 = pc()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[name] = self.total.get(name, 0.0) + pc() - t0
                self.calls[name] = self.calls.get(name, 0) + 1
                self.depth = 0
        return timed

    def subclass(self, cls: type, methods: list[str]) -> type:
        attrs = {m: self.wrap(f"{cls.__name__}.{m.strip('_') or m}", getattr(cls, m)) for m in methods if hasattr(cls, m)}
        return type(cls.__name__, (cls,), attrs)


BARE_SECTIONS = ("QNetwork.forward", "EpsilonGreedy.call", "env.step")


def child_profile() -> None:
    """The real rlctl.roles.collector.run, with the callees it looks up in its module wrapped by timers."""
    import rlctl.algos.apex.actor as A
    import rlctl.datapaths.sender as S
    import rlctl.roles.collector as C
    from rlctl.roles.context import RoleContext, StopFlag

    stop = StopFlag()  # first, as role_main does
    sec = _Sections()
    # The shell's parts in the collector module (its sender in the data path's), Ape-X's in its actor core's module.
    for module, names in ((C, {"WeightSubscriber": ["poll"], "ControlClient": ["heartbeat"]}),
                          (S, {"ExperienceSender": ["try_send"]}),
                          (A, {"QNetwork": ["forward"], "EpsilonGreedy": ["__call__"], "ChunkedNStep": ["add", "take"]})):
        for name, methods in names.items():
            if hasattr(module, name):
                setattr(module, name, sec.subclass(getattr(module, name), methods))
    snap = {}
    warm_iters = 2000
    iters = [0]
    real_make = C.make_vec_env

    class TimedEnv:
        """The vector env with a timed `step`; its step count is the loop's iteration count."""

        def __init__(self, env):
            self._env = env
            self._step = sec.wrap("env.step", env.step)

        def step(self, actions):
            iters[0] += 1
            if iters[0] == warm_iters:
                snap.update(t=time.perf_counter(), cpu=time.process_time(), total=dict(sec.total))
            return self._step(actions)

        def __getattr__(self, name):
            return getattr(self._env, name)

    C.make_vec_env = lambda *a, **k: TimedEnv(real_make(*a, **k))
    C.run(RoleContext.from_env(), stop)
    wall, cpu = time.perf_counter() - snap["t"], time.process_time() - snap["cpu"]
    n = iters[0] - warm_iters
    per = {k: (v - snap["total"].get(k, 0.0)) / n * 1e6 for k, v in sec.total.items()}
    per_wall = wall / n * 1e6
    per["(loop glue: bookkeeping, torch/numpy call overhead)"] = per_wall - sum(per.values())
    Path(os.environ["RLCTL_BENCH_PROFILE_OUT"]).write_text(json.dumps(
        {"iters": n, "us_per_iter_wall": per_wall, "us_per_iter": per, "cpu_frac": cpu / wall}))


def print_profile(prof: dict, bare_us: float) -> None:
    per = prof["us_per_iter"]
    bare_part = sum(v for k, v in per.items() if k in BARE_SECTIONS)
    print(f"    real collector loop, timed: {prof['iters']} iterations, {prof['us_per_iter_wall']:.1f} us/iteration; "
          f"bare loop {bare_us:.1f} us/iteration (forward + epsilon-greedy + env.step + its own glue)")
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        tag = "" if k in BARE_SECTIONS else "   <- not in the bare loop"
        print(f"      {k:52s} {v:8.1f} us  {100 * v / prof['us_per_iter_wall']:5.1f}%{tag}")
    print(f"      beyond the bare loop: {prof['us_per_iter_wall'] - bare_us:.1f} us/iteration "
          f"({100 * (1 - bare_us / prof['us_per_iter_wall']):.0f}% of the collector's iteration; "
          f"timed bare-loop sections {bare_part:.1f} us)")


# --------------------------------------------------------------------------- main

def run_config(n_envs: int, warmup: float, window: float, rounds: int, tmp: Path) -> dict:
    job_path = H.write_job(tmp, {"env": {"envs_per_collector": n_envs},
                                 "logging": {"metrics_interval_s": METRICS_INTERVAL_S}},
                           name=f"collector-{n_envs}.toml")
    bare = BareLoop(job_path)
    try:
        m = measure_interleaved(job_path, tmp, warmup, window, rounds, bare)
    finally:
        bare.close()
    rs = m["rounds"]
    coll = H.median([r["collector"] for r in rs])
    bare_rate = H.median([r["bare"] for r in rs])
    ratios = [r["collector"] / r["bare"] for r in rs]
    coll_cpu = H.median([r["collector_cpu"] for r in rs])
    bare_cpu = H.median([r["bare_cpu"] for r in rs])
    return {"envs": n_envs, "collector_steps_per_s": coll, "bare_steps_per_s": bare_rate,
            "ratio": H.median(ratios), "ratios": ratios, "rounds": rs,
            "collector_steps_per_cpu_s": coll_cpu, "bare_steps_per_cpu_s": bare_cpu, "cpu_ratio": coll_cpu / bare_cpu,
            "bare_us_per_iter": H.median([r["bare_us_per_iter"] for r in rs]),
            "weights": (m["weight_version_seen"], m["weights_published"]), "job_path": str(job_path)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short windows (about 30 s in all)")
    ap.add_argument("--envs", default=None, help="comma-separated vector widths; default apex.toml's and 64")
    ap.add_argument("--profile", action="store_true", help="always time the sections of the real collector loop")
    ap.add_argument("--child-profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_profile:
        child_profile()
        return
    H.children.install()  # killed or failing: the collector (even one paused with SIGSTOP) ends with the bench
    headline_envs = H.load_toml()["env"].get("envs_per_collector", 8)
    widths = [int(x) for x in args.envs.split(",")] if args.envs else [headline_envs, 64]
    if headline_envs not in widths:
        widths.insert(0, headline_envs)
    warmup, window, rounds = (2.0, 2.0, 3) if args.quick else (3.0, 2.0, 8)
    print(f"collector bench: CartPole-v1, model {H.load_toml()['model']}, n_step/send_batch from jobs/apex.toml, "
          f"weights published at {PUBLISH_HZ:g} Hz; warm-up {warmup:g}s, then {rounds} rounds of "
          f"[bare loop {window:g}s while the collector is paused | collector {window:g}s]; "
          f"{os.cpu_count()} CPUs (shared)")
    results = {}
    with H.TempDir() as tmp:
        for n in widths:
            r = run_config(n, warmup, window, rounds, tmp)
            results[n] = r
            print(f"  {n:3d} envs:")
            for i, x in enumerate(r["rounds"]):
                print(f"    round {i + 1}: collector {x['collector']:9.0f} env steps/s (sink {x['sink']:.0f} transitions/s, "
                      f"heartbeat says {x['reported']:.0f}; {x['heartbeats']} heartbeats) | bare {x['bare']:9.0f} "
                      f"({x['bare_us_per_iter']:.0f} us/iteration) | ratio {x['collector'] / x['bare']:.3f}")
            print(f"    median: collector {r['collector_steps_per_s']:.0f}, bare {r['bare_steps_per_s']:.0f}, "
                  f"ratio {r['ratio']:.3f} (per round {', '.join(f'{q:.3f}' for q in r['ratios'])}); "
                  f"weights v{r['weights'][0]} of {r['weights'][1]} published")
            print(f"    per CPU-second (robust to other load): collector {r['collector_steps_per_cpu_s']:.0f}, "
                  f"bare {r['bare_steps_per_cpu_s']:.0f} env steps per CPU-s, ratio {r['cpu_ratio']:.3f}")
            print(f"    target ratio >= {TARGET_RATIO}: {H.verdict(r['ratio'], TARGET_RATIO)}")
        head = results[headline_envs]
        missed = [n for n in widths if not results[n]["ratio"] >= TARGET_RATIO]
        if args.profile or missed:
            print("  profile (the real collector loop with timed callees, same peers):")
            for n in (widths if args.profile else missed):
                prof = measure_profile(Path(results[n]["job_path"]), tmp, warmup, 3 * window)
                print(f"    {n} envs:")
                print_profile(prof, results[n]["bare_us_per_iter"])
                results[n]["profile_us_per_iter"] = prof["us_per_iter"]
    print(f"headline ({headline_envs} envs, jobs/apex.toml): collector {head['collector_steps_per_s']:.0f} / bare "
          f"{head['bare_steps_per_s']:.0f} = {head['ratio']:.3f} (target >= {TARGET_RATIO}: "
          f"{H.verdict(head['ratio'], TARGET_RATIO)}); per CPU-second ratio {head['cpu_ratio']:.3f} "
          f"({H.verdict(head['cpu_ratio'], TARGET_RATIO)})")
    H.emit_json({
        "bench": "collector", "collector_steps_per_s": round(head["collector_steps_per_s"], 1),
        "bare_steps_per_s": round(head["bare_steps_per_s"], 1), "ratio": round(head["ratio"], 4),
        "cpu_ratio": round(head["cpu_ratio"], 4),
        "configs": {str(n): {"collector_steps_per_s": round(r["collector_steps_per_s"], 1),
                             "bare_steps_per_s": round(r["bare_steps_per_s"], 1), "ratio": round(r["ratio"], 4),
                             "cpu_ratio": round(r["cpu_ratio"], 4),
                             **({"profile_us_per_iter": {k: round(v, 2) for k, v in r["profile_us_per_iter"].items()}}
                                if "profile_us_per_iter" in r else {})}
                    for n, r in results.items()},
    })


if __name__ == "__main__":
    main()
