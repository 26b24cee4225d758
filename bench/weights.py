"""Latency from the learner publishing weights to all 4 real collectors acting with them.

Usage: python bench/weights.py [--quick] [--publishes N] [--only small|10m] [--diagnose]

The bench publishes as learner rank 0 does (`rlctl.net.weights.WeightPublisher`, CURVE) and
starts 4 real collector processes (`python -m rlctl.roles.collector`) whose job has
`send_batch = 1` and `n_step = 1`, so every env step's transitions leave at once, tagged
with the collector's policy version (`msg.version`). The bench's PULL sink (where the
replay shard would be) records, per collector (`msg.sender`), the first arrival of a
batch with version >= v. Latency of version v = max over collectors of (that arrival -
publish time, which includes flattening the parameters). Publishes are spaced (the next one
goes out once every collector acts with the previous one, plus a short random gap), so each
one is measured alone.

Three paths: the headline is the local one (the collectors share learner rank 0's host and
read a shared-memory weight board, RLCTL_WEIGHT_BOARD, as the plan arranges for a local job);
beside it, the network one (each version to each collector from another host, here over
loopback: sealed once, rlctl.net.sealed, as a collector alone on its host takes it now), and the
relay one (one sealed copy to a weights relay process, rlctl.roles.relay, which hands it to the 4
collectors through its own board, as the plan arranges on every other host with more than one
collector). The network and relay paths run again with every copy over CURVE (`..._curve`: the
design before sealing), in the same invocation, as their baseline.

Two networks: jobs/apex.toml's [model] (CartPole net) and a ~10M-parameter QNetwork.
Targets: median <= 5 ms (small), <= 100 ms (10M).

With --diagnose (or automatically on a miss of the network path) the same publishes go to 4
idle subscriber processes that PUSH the version back as soon as a message arrives: plain
TCP, CURVE, and CURVE + load_flat_parameters, which splits the network path's latency into
transport, encryption, loading, and (the rest) the collectors' own loop and CPU scheduling.

Last line: {"bench": "weights", "latency_ms_small": ..., "latency_ms_10m": ...,
"latency_ms_small_network": ..., "latency_ms_10m_network": ..., "latency_ms_small_relay": ...,
"latency_ms_10m_relay": ..., "relay_vs_network_10m": ..., "latency_ms_10m_network_curve": ...,
"latency_ms_10m_relay_curve": ..., "sealed_vs_curve_10m_network": ..., "sealed_vs_curve_10m_relay": ...}
(medians; the ratios are relay over network, and sealed over CURVE).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

import msgpack  # noqa: E402
import zmq  # noqa: E402

from rlctl.launch.hosts import WEIGHTS_VIA_ENV  # noqa: E402
from rlctl.net import wire  # noqa: E402

N_COLLECTORS = 4
HIDDEN_10M = [3158, 3158]  # QNetwork(4 -> 3158 -> 3158 -> dueling 1 + 2) = 10,001,389 parameters
TARGET_MS = {"small": 5.0, "10m": 100.0}


def qnet(hidden: list[int], dueling: bool = True) -> "object":
    """A fresh CartPole QNetwork with these hidden widths (what learner rank 0 would publish)."""
    import torch

    from rlctl.models import QNetwork

    torch.manual_seed(0)
    return QNetwork((4,), 2, hidden, "relu", dueling)


class Sink:
    """PULL where the replay shard would be: per sender, the newest version seen and when it first appeared."""

    def __init__(self, net: wire.SecureContext, endpoint: str, curve: bool = True):
        if curve:
            self.sock = net.server(zmq.PULL, endpoint, rcvhwm=10000)
        else:
            self.sock = net.ctx.socket(zmq.PULL)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.bind(endpoint)
        self.first_seen: dict[str, dict[int, float]] = {}  # sender -> version -> first arrival
        self.newest: dict[str, int] = {}
        self.messages = 0
        self.max_drain = 0  # most messages read in one wake-up (a backlog indicator)

    def drain(self, timeout_ms: int) -> None:
        """Wait up to timeout_ms for data, then read everything queued (header only: sender and version)."""
        if not self.sock.poll(timeout_ms):
            return
        n = 0
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            now = time.perf_counter()
            head = msgpack.unpackb(frames[0].buffer, raw=False)
            sender, version = head["s"], head["v"]
            n += 1
            if version > self.newest.get(sender, -2):
                self.newest[sender] = version
                self.first_seen.setdefault(sender, {})[version] = now
        self.messages += n
        self.max_drain = max(self.max_drain, n)

    def arrival(self, sender: str, version: int) -> float | None:
        """First arrival time of a batch from `sender` with version >= `version`."""
        seen = self.first_seen.get(sender, {})
        times = [t for v, t in seen.items() if v >= version]
        return min(times) if times else None


def child_echo() -> None:
    """Diagnostic subscriber: SUB as WeightSubscriber does; on each weights message (optionally loaded into a
    QNetwork with load_flat_parameters) PUSH a header-only message carrying its version to the sink."""
    import json

    mode = os.environ["RLCTL_BENCH_ECHO"]  # "recv", "load" or "plain" (no CURVE, recv only)
    endpoints = json.loads(os.environ["RLCTL_ENDPOINTS"])
    name = f"collector-{os.environ['RLCTL_RANK']}"
    net = wire.SecureContext(wire.CurveKeys.from_env())
    if mode == "plain":
        sub = net.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVHWM, 2)
        sub.connect(endpoints["weights"])
        push = net.ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(endpoints["replay"][0]["experience"])
    else:
        # No size limit: a client's default (wire.CONTROL_MAXMSGSIZE, 1 MiB) refused the 10M vector, and the
        # diagnostic never heard a version.
        sub = net.client(zmq.SUB, endpoints["weights"], subscribe=b"", rcvhwm=2, maxmsgsize=-1)
        push = net.client(zmq.PUSH, endpoints["replay"][0]["experience"], sndhwm=16)
    model = None
    if mode == "load":
        import torch

        from rlctl.models import QNetwork, load_flat_parameters
        from rlctl.job.load import load_job

        torch.set_num_threads(1)
        job = load_job(os.environ["RLCTL_JOB"])
        model = QNetwork((4,), 2, job.model.hidden, job.model.activation, job.algorithm.dueling)
    while True:
        _, msg = wire.recv(sub)
        if model is not None:
            load_flat_parameters(model, msg.arrays["params"])
        wire.send(push, "experience", name, msg.version)


def run_case(label: str, hidden: list[int], publishes: int, gap_s: tuple[float, float], timeout_s: float,
             tmp, echo: str | None = None, path: str = "local") -> dict:
    """Publish `publishes` times to 4 collectors (or, with `echo`, to 4 diagnostic subscribers) and time them.

    `path` "local": the collectors share learner rank 0's host as in a local job (RLCTL_WEIGHT_BOARD: shared memory);
    "network": they take each version from rank 0 sealed (rlctl.net.sealed), as a collector alone on another host;
    "relay": as collectors on another host with more do, through their host's weights relay (rlctl.roles.relay, one
    sealed subscriber of rank 0) and its board. "network_curve", "relay_curve": the same with every copy over CURVE.
    """
    from rlctl.models import flat_parameters
    from rlctl.launch.remote import weight_board_file
    from rlctl.net.weights import WeightPublisher

    model = qnet(hidden)
    params = flat_parameters(model).numpy()
    job_path = H.write_job(tmp, {"model": {"hidden": hidden}, "topology": {"collectors": N_COLLECTORS},
                                 "algorithm": {"send_batch": 1, "n_step": 1}},
                           name=f"weights-{label}.toml")
    keys = H.generate_keys()
    endpoints, _ = H.make_endpoints(replay_shards=1)
    path, curve = path.removesuffix("_curve"), path.endswith("_curve")
    if path != "local" and not curve and not echo:  # as the plan gives rank 0 and every subscriber
        endpoints["weights_bulk"] = f"tcp://127.0.0.1:{H.free_ports(1)[0]}"
    control = H.ControlRouter(keys, endpoints["control"])
    net = wire.SecureContext(keys)
    if echo == "plain":
        pub = net.ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 2)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(endpoints["weights"])
        sink = Sink(net, endpoints["replay"][0]["experience"], curve=False)
    elif echo:
        pub = net.server(zmq.PUB, endpoints["weights"], sndhwm=2)
        sink = Sink(net, endpoints["replay"][0]["experience"])
    else:
        board_file = weight_board_file(f"bench-{label}", str(tmp)) if path == "local" else None  # as the plan does
        publisher = WeightPublisher(net, endpoints["weights"], "learner-0", board_file,  # as learner rank 0
                                    bulk=endpoints.get("weights_bulk"))
        sink = Sink(net, endpoints["replay"][0]["experience"])
    names = [f"collector-{r}" for r in range(N_COLLECTORS)]
    procs = []
    version = 0

    def publish() -> float:
        nonlocal version
        version += 1
        t = time.perf_counter()
        if echo:
            wire.send(pub, "weights", "learner-0", version, None, {"params": params})
        else:
            publisher.publish(version, model)  # flattening the parameters counts, as on the learner
        return t

    def wait_all(v: int, deadline: float) -> bool:
        while time.perf_counter() < deadline:
            if all(sink.arrival(n, v) is not None for n in names):
                return True
            sink.drain(5)
        return False

    try:
        if echo:
            procs = [H.Proc(f"echo-{r}", [sys.executable, os.path.abspath(__file__), "--child-echo"],
                            H.role_env("collector", r, job_path, endpoints, keys, "bench-echo",
                                       extra={"RLCTL_BENCH_ECHO": echo}), tmp) for r in range(N_COLLECTORS)]
        else:
            extra = {"RLCTL_WEIGHT_BOARD": board_file} if board_file else None
            if path == "relay":
                via = f"ipc://{tmp}/relay-{label}.sock"
                extra = {"RLCTL_WEIGHT_BOARD": weight_board_file(f"bench-{label}", str(tmp), relay=0),
                         WEIGHTS_VIA_ENV: via}
                # Its control socket goes unused: the collectors report to the bench's control stand-in themselves.
                binds = {"weights": via, "control": f"ipc://{tmp}/relay-{label}-control.sock"}
                procs.append(H.start_role("relay", 0, job_path, endpoints, keys, f"bench-weights-{label}", tmp,
                                          binds=binds, extra_env={"RLCTL_WEIGHT_BOARD": extra["RLCTL_WEIGHT_BOARD"]}))
            procs += [H.start_role("collector", r, job_path, endpoints, keys, f"bench-weights-{label}", tmp,
                                   extra_env=extra) for r in range(N_COLLECTORS)]
            control.wait_hello(names + ["relay-0"] * (path == "relay"), 120, procs)
        # Subscriptions propagate asynchronously (slow joiner): republish until every collector acts with one.
        deadline = time.perf_counter() + 120
        while True:
            publish()
            if wait_all(version, time.perf_counter() + max(0.5, timeout_s / 4)):
                break
            for p in procs:
                p.check()
            if time.perf_counter() > deadline:
                raise TimeoutError("collectors never acted with published weights")
        for _ in range(3):  # warm-up publishes, not measured
            wait_all(publish(), time.perf_counter() + timeout_s)
            sink.drain(int(gap_s[1] * 1000))
        lat, per_collector, lost = [], {n: [] for n in names}, 0
        for i in range(publishes):
            end_gap = time.perf_counter() + random.uniform(*gap_s)
            while time.perf_counter() < end_gap:
                sink.drain(1)
            t_pub = publish()
            if not wait_all(version, t_pub + timeout_s):
                lost += 1
                for p in procs:
                    p.check()
                continue
            arrivals = {n: sink.arrival(n, version) - t_pub for n in names}
            for n, d in arrivals.items():
                per_collector[n].append(d * 1e3)
            lat.append(max(arrivals.values()) * 1e3)
        for p in procs:
            p.check()
        return {"params": int(params.size), "mbytes": params.nbytes / 1e6, "latencies_ms": lat, "lost": lost,
                "median_ms": H.median(lat), "p90_ms": H.percentile(lat, 90), "min_ms": min(lat) if lat else None,
                "max_ms": max(lat) if lat else None,
                "per_collector_median_ms": {n: H.median(v) for n, v in per_collector.items()},
                "sink_messages": sink.messages, "sink_max_drain": sink.max_drain}
    finally:
        H.stop_all(procs)
        if not echo:
            publisher.close()
        control.close()
        net.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer publishes")
    ap.add_argument("--publishes", type=int, default=None, help="measured publishes per network")
    ap.add_argument("--only", choices=["small", "10m"], default=None)
    ap.add_argument("--diagnose", action="store_true", help="always run the transport/load breakdown")
    ap.add_argument("--child-echo", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_echo:
        child_echo()
        return
    H.children.install()  # killed (timeout's SIGTERM, Ctrl-C) or failing: no collector or echo process outlives it
    small_hidden = list(H.load_toml()["model"].get("hidden", [64, 64]))
    cases = [("small", small_hidden, args.publishes or (40 if args.quick else 200), (0.01, 0.03), 2.0),
             ("10m", HIDDEN_10M, args.publishes or (8 if args.quick else 30), (0.05, 0.15), 20.0)]
    if args.only:
        cases = [c for c in cases if c[0] == args.only]
    print(f"weights bench: {N_COLLECTORS} collectors (send_batch 1, n_step 1, 8 envs each), over loopback; "
          f"{os.cpu_count()} CPUs (shared)")
    out = {}
    with H.TempDir() as tmp:
        for label, hidden, n_pub, gap, timeout in cases:
            print(f"  {label:5s} hidden {hidden}:")
            for path in ("local", "network", "relay", "network_curve", "relay_curve"):
                r = run_case(label, hidden, n_pub, gap, timeout, tmp, path=path)
                out[label if path == "local" else f"{label}_{path}"] = r
                target = TARGET_MS[label]
                how = {"local": "shared-memory board, as on learner rank 0's host",
                       "network": "sealed once, to each collector, as to a collector alone on another host",
                       "relay": "one sealed copy to the host's relay, then its board, as to other hosts",
                       "network_curve": "the parameter vector over CURVE to each collector (before sealing)",
                       "relay_curve": "one CURVE copy to the host's relay, then its board (before sealing)"}[path]
                print(f"    {path} ({how}): {r['params']:,} parameters ({r['mbytes']:.2f} MB float32)")
                print(f"        latency over {len(r['latencies_ms'])} publishes: median {r['median_ms']:.2f} ms, "
                      f"p90 {r['p90_ms']:.2f} ms (min {r['min_ms']:.2f}, max {r['max_ms']:.2f}); lost {r['lost']}")
                print("        per-collector medians: " + ", ".join(f"{n} {v:.2f}" for n, v in
                                                                 r["per_collector_median_ms"].items()) + " ms")
                print(f"        target median <= {target:g} ms: "
                      f"{H.verdict(r['median_ms'], target, higher_is_better=False)}"
                      f"   (sink read {r['sink_messages']} batches, at most {r['sink_max_drain']} per wake-up)")
            r = out[f"{label}_network"]
            if args.diagnose or not r["median_ms"] <= TARGET_MS[label]:
                n_diag = max(5, n_pub // 4)
                print(f"        network path breakdown ({n_diag} publishes each, 4 idle subscriber processes that "
                      f"PUSH the version back at once):")
                for echo, what in (("plain", "transport, plain TCP (no CURVE)"),
                                   ("recv", "transport, CURVE (as deployed)"),
                                   ("load", "transport, CURVE + load_flat_parameters")):
                    d = run_case(label, hidden, n_diag, gap, timeout, tmp, echo=echo)
                    r.setdefault("breakdown_ms", {})[echo] = d["median_ms"]
                    print(f"          {what:42s} median {d['median_ms']:8.2f} ms, p90 {d['p90_ms']:8.2f} ms")
    def figure(key: str, field: str):
        return round(out[key][field], 3) if key in out else None

    H.emit_json({"bench": "weights",
                 "latency_ms_small": figure("small", "median_ms"), "latency_ms_10m": figure("10m", "median_ms"),
                 "latency_ms_small_network": figure("small_network", "median_ms"),
                 "latency_ms_10m_network": figure("10m_network", "median_ms"),
                 "latency_ms_small_relay": figure("small_relay", "median_ms"),
                 "latency_ms_10m_relay": figure("10m_relay", "median_ms"),
                 "relay_vs_network_10m": (round(out["10m_relay"]["median_ms"] / out["10m_network"]["median_ms"], 3)
                                          if "10m_relay" in out and out["10m_network"]["median_ms"] else None),
                 "latency_ms_10m_network_curve": figure("10m_network_curve", "median_ms"),
                 "latency_ms_10m_relay_curve": figure("10m_relay_curve", "median_ms"),
                 **{f"sealed_vs_curve_10m_{path}": (round(out[f"10m_{path}"]["median_ms"]
                                                          / out[f"10m_{path}_curve"]["median_ms"], 3)
                                                    if f"10m_{path}_curve" in out else None)
                    for path in ("network", "relay")},
                 "p90_ms_small": figure("small", "p90_ms"), "p90_ms_10m": figure("10m", "p90_ms"),
                 "params_10m": out["10m"]["params"] if "10m" in out else None,
                 **{f"breakdown_ms_{k}": {e: round(v, 3) for e, v in r["breakdown_ms"].items()}
                    for k, r in out.items() if "breakdown_ms" in r}})


if __name__ == "__main__":
    main()
