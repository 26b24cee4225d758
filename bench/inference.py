"""Central (SEED RL style) inference against local inference: env steps/s and the server's latency, by collectors.

    python bench/inference.py [--collectors 1,4,16] [--envs 2] [--window 5] [--warmup 2] [--device cpu] [--hidden 512,512]

For each number of collector processes N the bench runs the same N collectors twice, each with `--envs` CartPole-v1
envs and the model and algorithm of jobs/apex.toml (the shipped Ape-X job; its actor core cuts n-step transitions
and initial priorities in both modes):

* local: N real `python -m rlctl.roles.collector` processes, each running the Q-network on its own envs;
* central: N real `python -m rlctl.roles.central_collector` processes sending real observations to one real
  `python -m rlctl.roles.inference` server, which batches their requests into one forward (inference.deadline_ms
  from the job) and runs each collector's actor core.

The bench plays the other peers over CURVE sockets, as bench/collector.py does: the supervisor's control ROUTER
(heartbeats give env steps, the server's requests/s, batch and p50/p99 latency from a request's arrival to its
answer) and the replay shard's experience PULL, which drains everything as it comes. No learner publishes weights
(both modes act on the initial network), so neither pays for weight loads. After `--warmup` seconds, the rates are
taken over `--window` seconds from the heartbeats' counters. Actions/s = env steps/s (one action per env step).

`--hidden` widens the Q-network (the forward that central inference batches grows; the messages do not).
The crossover is the smallest N where central beats local in env steps/s on this machine (None if it never does).
On a machine with a GPU the central rows run again with the server on the GPU (`central_gpu_*` keys).

Last line: one JSON object with `central_steps_per_s_<N>`, `local_steps_per_s_<N>`, `latency_ms_p50_<N>`,
`latency_ms_p99_<N>`, `batch_size_<N>`, `crossover_collectors` (and the GPU ones where measured).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402
import zmq  # noqa: E402

from rlctl import metric_names as M  # noqa: E402
from rlctl.net import wire  # noqa: E402
from rlctl.launch.plan import CENTRAL_COLLECTOR_MODULE  # noqa: E402

METRICS_INTERVAL_S = 0.25


class ExperienceSink(threading.Thread):
    """The replay shard's experience PULL, played by the bench: receives and discards, counting transitions."""

    def __init__(self, keys: wire.CurveKeys, endpoint: str):
        super().__init__(daemon=True)
        self.net = wire.SecureContext(keys)
        self.sock = self.net.server(zmq.PULL, endpoint, rcvhwm=1000, maxmsgsize=-1)
        self.messages = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            if self.sock.poll(50):
                while True:
                    try:
                        self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self.messages += 1

    def close(self) -> None:
        self.stop_event.set()
        self.join(2)
        self.net.close()


def measure(mode: str, collectors: int, envs: int, args, device: str = "cpu") -> dict:
    """Env steps/s of `collectors` collectors (and the server's figures in central mode) over a steady window."""
    central = mode == "central"
    with H.TempDir() as tmp:
        overrides = {"env": {"envs_per_collector": envs},
                     "topology": {"collectors": collectors, "inference": "central" if central else "local"},
                     "logging": {"metrics_interval_s": METRICS_INTERVAL_S},
                     "inference": {"device": device}}
        if args.hidden:
            overrides["model"] = {"hidden": [int(w) for w in args.hidden.split(",")]}
        job = H.write_job(tmp, overrides)
        endpoints, binds = H.make_endpoints(1)
        [inference_port] = H.free_ports(1)
        endpoints["inference"] = [f"tcp://127.0.0.1:{inference_port}"]
        keys = H.generate_keys()
        control = H.ControlRouter(keys, binds["control"])
        sink = ExperienceSink(keys, binds["replay"][0]["experience"])
        sink.start()
        procs: list[H.Proc] = []
        try:
            names = [f"collector-{i}" for i in range(collectors)]
            if central:
                env = H.role_env("inference", 0, job, endpoints, keys, "bench-inference",
                                 {"inference": endpoints["inference"][0]})
                procs.append(H.Proc("inference-0", [sys.executable, "-m", "rlctl.roles.inference"], env, tmp))
                names.append("inference-0")
            for i in range(collectors):
                if central:
                    env = H.role_env("collector", i, job, endpoints, keys, "bench-inference")
                    procs.append(H.Proc(f"collector-{i}", [sys.executable, "-m", CENTRAL_COLLECTOR_MODULE], env, tmp))
                else:
                    procs.append(H.start_role("collector", i, job, endpoints, keys, "bench-inference", tmp))
            control.wait_hello(names, 120, procs)
            for name in names:
                control.wait_beats(name, 2, 120, procs)
            time.sleep(args.warmup)
            cpu0 = [H.process_cpu_s(p.pid) for p in procs]
            t0 = time.monotonic()
            time.sleep(args.window)
            t1 = time.monotonic()
            cpu = [(H.process_cpu_s(p.pid) - c) / (t1 - t0) for p, c in zip(procs, cpu0)]
            for p in procs:
                p.check()
            steps = sum(control.rate(f"collector-{i}", M.COLLECTOR_ENV_STEPS, t0, t1)[0] for i in range(collectors))
            # CPU (cores busy) of the server and of all collectors together over the window.
            out = {"steps_per_s": steps, "server_cpu": cpu[0] if central else 0.0,
                   "collectors_cpu": sum(cpu[1:] if central else cpu)}
            if central:
                values = {k: control.values("inference-0", k, t0, t1)
                          for k in (M.INFERENCE_LATENCY_P50, M.INFERENCE_LATENCY_P99, M.INFERENCE_BATCH_SIZE_MEAN,
                                    M.INFERENCE_REQUESTS_PER_S)}
                out.update(p50_ms=H.median(values[M.INFERENCE_LATENCY_P50]),
                           p99_ms=H.median(values[M.INFERENCE_LATENCY_P99]),
                           batch=H.median(values[M.INFERENCE_BATCH_SIZE_MEAN]),
                           requests_per_s=H.median(values[M.INFERENCE_REQUESTS_PER_S]),
                           round_trip_ms=H.median([v for i in range(collectors) for v in
                                                   control.values(f"collector-{i}", M.COLLECTOR_INFERENCE_MS, t0, t1)]))
            return out
        finally:
            H.stop_all(procs)
            sink.close()
            control.close()


def gpu_available() -> bool:
    """Whether torch sees a GPU here (asked in a child: this process never imports torch)."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
    return probe.stdout.strip() == "True"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collectors", default="1,4,16")
    ap.add_argument("--envs", type=int, default=2, help="envs per collector (the same in both modes)")
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--device", default="cpu", help="the server's device for the main rows")
    ap.add_argument("--hidden", default="", help="hidden layer widths of the Q-network, e.g. 512,512 (default: the job's)")
    args = ap.parse_args()
    H.children.install()  # killed or failing: no collector or server outlives the bench
    counts = [int(x) for x in args.collectors.split(",")]
    devices = [args.device] + (["cuda"] if args.device == "cpu" and gpu_available() else [])
    result: dict = {"bench": "inference", "envs_per_collector": args.envs, "hidden": args.hidden or "job"}
    print(f"{'collectors':>10s} {'envs':>5s} {'local steps/s':>14s} {'central steps/s':>16s} {'ratio':>6s} "
          f"{'batch':>6s} {'p50 ms':>7s} {'p99 ms':>7s} {'round trip ms':>14s} {'CPU local/central+server':>25s}  server")
    crossover = None
    for n in counts:
        local = measure("local", n, args.envs, args)
        result[f"local_steps_per_s_{n}"] = round(local["steps_per_s"], 1)
        for device in devices:
            central = measure("central", n, args.envs, args, device)
            tag = "central" if device == args.device else f"central_{device.replace('cuda', 'gpu')}"
            result[f"{tag}_steps_per_s_{n}"] = round(central["steps_per_s"], 1)
            suffix = "" if device == args.device else "_gpu"
            for key, name in (("p50_ms", "latency_ms_p50"), ("p99_ms", "latency_ms_p99"), ("batch", "batch_size")):
                result[f"{name}{suffix}_{n}"] = round(central[key], 3)
            ratio = central["steps_per_s"] / local["steps_per_s"]
            if device == args.device and crossover is None and ratio > 1:
                crossover = n
            print(f"{n:>10d} {n * args.envs:>5d} {local['steps_per_s']:>14,.0f} {central['steps_per_s']:>16,.0f} "
                  f"{ratio:>6.2f} {central['batch']:>6.2f} {central['p50_ms']:>7.2f} {central['p99_ms']:>7.2f} "
                  f"{central['round_trip_ms']:>14.2f} {local['collectors_cpu']:>11.2f} / "
                  f"{central['collectors_cpu']:.2f} + {central['server_cpu']:.2f}  {device}", flush=True)
    result["crossover_collectors"] = crossover
    print(f"crossover (central beats local in env steps/s): {crossover or 'none'} of {counts} collectors per server "
          f"on this machine; GPU rows: {'measured' if len(devices) > 1 else 'no GPU here'}")
    H.emit_json(result)


if __name__ == "__main__":
    main()
