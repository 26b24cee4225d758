"""Env steps/s of ONE real collector process versus a bare in-process act/step loop.

Usage: python bench/collector.py [--quick] [--envs 8,64] [--profile] [--what-if]

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

With --profile (or automatically when the headline misses) an instrumented copy of the
collector loop runs as a role process against the same peers and reports where its time
goes per loop iteration, beyond the bare loop's forward/act/env-step. With --what-if the same
copy also runs with the changes recommended for rlctl (bench/_collector_whatif.py) and both
are compared with the bare loop per CPU-second.

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

from rlctl import wire  # noqa: E402

TARGET_RATIO = 0.9
PUBLISH_HZ = 30.0  # ~ a learner at 300 updates/s with apex.toml's publish_interval = 10
METRICS_INTERVAL_S = 0.5


# --------------------------------------------------------------------------- the bare reference loop

class BareLoop:
    """Same vector env, forward, epsilon-greedy and step as the collector; nothing else. Kept warm across rounds."""

    def __init__(self, job_path: Path, rank: int = 0):
        import torch

        from rlctl.algos.apex import epsilon_ladder, greedy_epsilon_actions
        from rlctl.envs import make_vec_env, space_info
        from rlctl.models import QNetwork
        from rlctl.spec import load_job

        torch.set_num_threads(1)
        self.torch, self.greedy = torch, greedy_epsilon_actions
        job = load_job(job_path)
        algo = job.algorithm
        seed = job.job.seed * 1000 + 200 + rank  # RoleContext.seed of collector-<rank>
        self.rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        self.env = make_vec_env(job.env)
        obs_shape, _, n_actions = space_info(self.env)
        self.n = n = self.env.num_envs
        self.model = QNetwork(obs_shape, n_actions, job.model.hidden, job.model.activation, algo.dueling)
        self.model.eval()
        self.eps = epsilon_ladder(job.collector_count * n, algo.epsilon, algo.epsilon_alpha)[rank * n:(rank + 1) * n]
        self.obs, _ = self.env.reset(seed=seed)
        self.prev_done = np.zeros(n, dtype=bool)
        self.run(0.5)  # warm-up

    def run(self, seconds: float) -> dict:
        torch, model, env, eps, rng, n = self.torch, self.model, self.env, self.eps, self.rng, self.n
        greedy = self.greedy
        obs, prev_done = self.obs, self.prev_done
        steps = iters = 0
        t0 = time.perf_counter()
        c0 = time.thread_time()
        end = t0 + seconds
        while True:
            for _ in range(50):
                with torch.no_grad():
                    q = model(torch.from_numpy(obs))
                actions = greedy(q, eps, rng)
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

        from rlctl.envs import make_vec_env, space_info
        from rlctl.models import QNetwork, flat_parameters
        from rlctl.spec import load_job

        self.control = H.ControlRouter(keys, endpoints["control"])
        self.net = wire.SecureContext(keys)
        self.pub = self.net.server(zmq.PUB, endpoints["weights"], sndhwm=2)
        self.sink = self.net.server(zmq.PULL, endpoints["replay"][0]["experience"], rcvhwm=1000)
        job = load_job(job_path)
        probe = make_vec_env(job.env, num_envs=1)
        obs_shape, _, n_actions = space_info(probe)
        probe.close()
        torch.manual_seed(0)
        net = QNetwork(obs_shape, n_actions, job.model.hidden, job.model.activation, job.algorithm.dueling)
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


def measure_sections(job_path: Path, tmp: Path, warmup: float, window: float, variant: str = "baseline") -> dict:
    """Run the instrumented copy of the collector loop as collector-0 against the same peers; its section times."""
    keys = H.generate_keys()
    endpoints, _ = H.make_endpoints(replay_shards=1)
    peers = Peers(keys, endpoints, job_path)
    out_path = tmp / "sections.json"
    proc = None
    try:
        env = H.role_env("collector", 0, job_path, endpoints, keys, "bench-collector",
                         extra={"RLCTL_BENCH_SECTIONS_OUT": str(out_path), "RLCTL_BENCH_VARIANT": variant,
                                "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)),
                                                                            os.environ.get("PYTHONPATH")]))})
        proc = H.Proc("collector-0", [sys.executable, os.path.abspath(__file__), "--child-sections"], env, tmp)
        peers.control.wait_hello(["collector-0"], 60, [proc])
        peers.pump(warmup + window)
        proc.check()
    finally:
        if proc is not None:
            proc.stop()
        peers.close()
    return json.loads(out_path.read_text())


# --------------------------------------------------------------------------- instrumented copy (profile)

def child_sections() -> None:
    """A copy of rlctl.roles.collector.run with section timers; writes per-iteration means at exit.

    RLCTL_BENCH_VARIANT=optimized applies the changes recommended in the report (what-if): the weights
    SUB is read only when ZMQ_EVENTS says a message is waiting, and n-step transitions and their initial
    priorities come from _collector_whatif.BlockNStep (one flush per send batch, priorities from the
    Q-values computed to act) instead of NStepAccumulator.step per step + initial_priorities' forward.
    """
    import torch

    from rlctl.algos.apex import NStepAccumulator, epsilon_ladder, greedy_epsilon_actions, initial_priorities
    from rlctl.envs import make_vec_env, space_info
    from rlctl.models import QNetwork
    from rlctl.roles.collector import ExperienceSender, WeightSubscriber
    from rlctl.roles.context import ControlClient, RoleContext, StopFlag

    optimized = os.environ.get("RLCTL_BENCH_VARIANT") == "optimized"
    stop = StopFlag()
    rc = RoleContext.from_env()
    torch.set_num_threads(1)
    job, algo = rc.job, rc.job.algorithm
    rng = np.random.default_rng(rc.seed)
    torch.manual_seed(rc.seed)
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    env = make_vec_env(job.env)
    obs_shape, obs_dtype, n_actions = space_info(env)
    n_envs = env.num_envs
    model = QNetwork(obs_shape, n_actions, job.model.hidden, job.model.activation, algo.dueling)
    model.eval()
    weights = WeightSubscriber(net, rc.endpoints["weights"], model)
    sender = ExperienceSender(net, [r["experience"] for r in rc.endpoints["replay"]], rc.name)
    ladder = epsilon_ladder(job.collector_count * n_envs, algo.epsilon, algo.epsilon_alpha)
    eps = ladder[rc.rank * n_envs:(rc.rank + 1) * n_envs]
    if optimized:
        from _collector_whatif import BlockNStep

        acc = BlockNStep(n_envs, algo.n_step, algo.gamma, obs_shape, obs_dtype,
                         block=-(-algo.send_batch // n_envs), n_actions=n_actions, q_priorities=True)
        wsock = weights.sock
    else:
        acc = NStepAccumulator(n_envs, algo.n_step, algo.gamma, obs_shape, obs_dtype)
    obs, _ = env.reset(seed=rc.seed)
    prev_done = np.zeros(n_envs, dtype=bool)
    ep_return = np.zeros(n_envs, dtype=np.float64)
    ep_length = np.zeros(n_envs, dtype=np.int64)
    finished_returns: list[float] = []
    finished_lengths: list[int] = []
    chunks: list[dict[str, np.ndarray]] = []
    chunk_rows = 0
    ready = None
    env_steps = 0
    last_steps, last_t = 0, time.monotonic()
    names = ["weights.poll", "forward", "greedy_epsilon_actions", "env.step", "NStepAccumulator.step",
             "episode bookkeeping", "batch concat", "initial_priorities", "send", "heartbeat"]
    tot = dict.fromkeys(names, 0.0)
    iters = 0
    pc = time.perf_counter
    t_start = None
    while not stop:
        if iters == 2000:  # warm-up excluded
            tot = dict.fromkeys(names, 0.0)
            t_start, c_start, iters_start, steps_start = pc(), time.process_time(), iters, env_steps
        a = pc()
        if not optimized or wsock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            weights.poll()
        b = pc(); tot["weights.poll"] += b - a
        with torch.no_grad():
            q = model(torch.from_numpy(obs))
        a = pc(); tot["forward"] += a - b
        actions = greedy_epsilon_actions(q, eps, rng)
        b = pc(); tot["greedy_epsilon_actions"] += b - a
        next_obs, rewards, terminated, truncated, _ = env.step(actions)
        a = pc(); tot["env.step"] += a - b
        valid = ~prev_done
        if optimized:
            acc.record(obs, actions, rewards, next_obs, terminated, truncated, valid, q.numpy())
            out = acc.flush() if acc.full() else None
        else:
            out = acc.step(obs, actions, rewards, next_obs, terminated, truncated, valid)
        b = pc(); tot["NStepAccumulator.step"] += b - a
        done = (terminated | truncated) & valid
        ep_return += rewards * valid
        ep_length += valid
        if done.any():
            finished_returns.extend(ep_return[done].tolist())
            finished_lengths.extend(ep_length[done].tolist())
            ep_return[done] = 0.0
            ep_length[done] = 0
        prev_done = terminated | truncated
        obs = next_obs
        env_steps += int(valid.sum())
        if out is not None and len(out["reward"]):
            chunks.append(out)
            chunk_rows += len(out["reward"])
        a = pc(); tot["episode bookkeeping"] += a - b
        if ready is None and chunk_rows >= algo.send_batch:
            if optimized and len(chunks) == 1:
                ready = chunks[0]
            else:
                ready = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
            b = pc(); tot["batch concat"] += b - a
            if not optimized:
                ready["priority"] = initial_priorities(model, ready)
            a = pc(); tot["initial_priorities"] += a - b
            chunks, chunk_rows = [], 0
        if ready is not None and sender.try_send(ready, weights.version):
            ready = None
        elif ready is not None and chunk_rows >= 4 * algo.send_batch:
            sender.sock.poll(50, zmq.POLLOUT)
        b = pc(); tot["send"] += b - a
        now = time.monotonic()
        if control.due(now):
            rate = (env_steps - last_steps) / max(now - last_t, 1e-9)
            last_steps, last_t = env_steps, now
            control.heartbeat({
                "env_steps": env_steps, "charts/env_steps_per_s": rate, "env_steps_per_s": rate,
                "collector/weight_version": weights.version, "collector/sent": sender.sent,
                "episode_returns": finished_returns[-1000:], "episode_lengths": finished_lengths[-1000:],
                "net/dropped": weights.dropped,
            })
            finished_returns, finished_lengths = [], []
        tot["heartbeat"] += pc() - b
        iters += 1
    wall = pc() - t_start if t_start else float("nan")
    cpu = time.process_time() - c_start if t_start else float("nan")  # all threads of this process
    n_it = iters - iters_start if t_start else 0
    n_steps = env_steps - steps_start if t_start else 0
    Path(os.environ["RLCTL_BENCH_SECTIONS_OUT"]).write_text(json.dumps({
        "variant": "optimized" if optimized else "baseline",
        "iters": n_it, "wall_s": wall, "env_steps": n_steps,
        "us_per_iter": {k: v / max(n_it, 1) * 1e6 for k, v in tot.items()},
        "us_per_iter_wall": wall / max(n_it, 1) * 1e6,
        "steps_per_s": n_steps / wall if n_it else float("nan"),
        "steps_per_cpu_s": n_steps / cpu if n_it else float("nan"),
        "weight_version": weights.version,
    }))
    env.close()
    net.close()


def print_sections(prof: dict, bare: dict) -> None:
    per = prof["us_per_iter"]
    total = sum(per.values())
    print(f"    instrumented collector: {prof['iters']} iterations, {prof['us_per_iter_wall']:.1f} us/iteration wall, "
          f"{total:.1f} us in timed sections; bare loop {bare['us_per_iter']:.1f} us/iteration")
    core = per["forward"] + per["greedy_epsilon_actions"] + per["env.step"]
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        tag = "" if k in ("forward", "greedy_epsilon_actions", "env.step") else "   <- beyond the bare loop"
        print(f"      {k:24s} {v:8.1f} us  {100 * v / total:5.1f}%{tag}")
    print(f"      (bare-loop work {core:.1f} us, extra {total - core:.1f} us = {100 * (total - core) / total:.0f}% "
          f"of the collector's iteration)")


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
    ap.add_argument("--profile", action="store_true", help="always run the instrumented collector copy")
    ap.add_argument("--what-if", action="store_true",
                    help="also time the instrumented loop with the recommended changes (per CPU-second vs bare)")
    ap.add_argument("--child-sections", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_sections:
        child_sections()
        return
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
            print("  profile (instrumented copy of the collector loop, same peers):")
            for n in (missed or widths):
                job_path = Path(results[n]["job_path"])
                prof = measure_sections(job_path, tmp, warmup, 2 * window)
                print(f"    {n} envs:")
                bare = {"us_per_iter": results[n]["bare_us_per_iter"]}
                print_sections(prof, bare)
                results[n]["sections_us_per_iter"] = prof["us_per_iter"]
        if args.what_if:
            print("  what-if (instrumented copies of the loop; env steps per CPU-second of the whole process, "
                  "bare loop per CPU-second of its thread, alternating):")
            for n in widths:
                job_path = Path(results[n]["job_path"])
                bare = BareLoop(job_path)
                rows = {"baseline": [], "optimized": [], "bare": []}
                try:
                    for _ in range(2):
                        for variant in ("baseline", "optimized"):
                            rows["bare"].append(bare.run(window)["steps_per_cpu_s"])
                            prof = measure_sections(job_path, tmp, warmup, 2 * window, variant)
                            rows[variant].append(prof["steps_per_cpu_s"])
                finally:
                    bare.close()
                b = H.median(rows["bare"])
                base, opt = H.median(rows["baseline"]), H.median(rows["optimized"])
                results[n]["what_if"] = {"bare_cpu": b, "baseline_cpu": base, "optimized_cpu": opt,
                                         "baseline_cpu_ratio": base / b, "optimized_cpu_ratio": opt / b}
                print(f"    {n} envs: bare {b:.0f}, current loop {base:.0f} (ratio {base / b:.3f}), with the changes "
                      f"{opt:.0f} (ratio {opt / b:.3f}) env steps per CPU-s")
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
                             **({"sections_us_per_iter": {k: round(v, 2) for k, v in r["sections_us_per_iter"].items()}}
                                if "sections_us_per_iter" in r else {}),
                             **({"what_if": {k: round(v, 4) for k, v in r["what_if"].items()}} if "what_if" in r else {})}
                    for n, r in results.items()},
    })


if __name__ == "__main__":
    main()
