"""The control plane at 10, 100 and 1,000 collectors over 1, 4 and 16 hosts: what the supervisor and learner rank 0
cost as collectors grow (issue 32). As the plan renders a job over many hosts, every simulated host runs a relay
(rlctl.roles.relay): its collectors take weights from it and send it their hellos and heartbeats, which it bundles
for the supervisor. `--no-relays` measures the design before relays: every collector talks to the supervisor and to
rank 0 itself. Versions cross simulated hosts sealed once (rlctl.net.sealed), as the plan arranges between hosts:
the learner stand-in's publishers and the tree's relays have bulk sockets; `--no-sealed` sends every copy over CURVE
instead (the design before sealing).

Usage: python bench/control_plane.py [--quick] [--cells c10_h1,c1000_h16,...] [--window S] [--publishes N]
       [--no-relays] [--no-sealed] [--relay-fanout F]

What runs, per cell (C collectors over H simulated hosts):

- The real supervisor (`rlctl.supervise.loop.Supervisor`: control router, metrics sink, TensorBoard points, the
  run-state writer of state.json, restart policy) in a process of its own, on a run prepared by the real launch path
  (`rlctl.launch.pipeline.prepare`: job.toml, plan.json, keys issued per process by `issue_keys`). Its plan keeps
  learner-0 and the C collectors (no replay shard, no evaluator: they add no control traffic that grows with
  collectors). Only how its processes start differs: a starter that starts, instead of one process per collector,
  H simulated-host processes (each the process of its block of collectors, as far as the supervisor's table goes:
  it reaps, signals and stops them as it would the collectors) and one learner stand-in.
- A simulated host: one process holding its collectors, each with its own CURVE client key pair (the one the
  supervisor issued it), its own `ControlClient` (hello, then heartbeats through the real `CollectorReport`: every
  `metrics_interval_s`, and within 0.1 s of an episode's end), and two real `WeightSubscriber`s (a ~1M and a
  ~10M-parameter QNetwork; without relays each subscriber copies every version it takes into the host's one model
  of that size: the CPU of every copy is real, the memory shared). Episodes end at random (Poisson, --episodes-per-s per
  collector), so heartbeats come as often as a collector's would. The host's sockets share one ZeroMQ context (one
  I/O thread per simulated host, not per collector) and connect from their own loopback address, 127.0.0.(k+2).
  The log lines the collectors print go to the supervisor's log pump, one pipe per simulated host.
- With relays, simulated host k also runs relay-k (a process with relay-k's keys, in the plan as make_plan renders
  a relay, its collectors' RLCTL_CONTROL_VIA naming its control socket): the product's relay loop
  (`rlctl.roles.relay.serve`) with one `WeightRelay` per model size (each its own board in /dev/shm and Unix
  socket) and its `ControlGather`. The host's collectors then take weights from its boards (a notice, then, as
  the product's collectors do, a hold on the newest slot: their parameters view it, no copy) and send their control messages to it. With more hosts than `--relay-fanout` (default
  `network.relay_fanout`'s, 16) the relays form the plan's tree (`rlctl.launch.plan.relay_parents`): the relays past the
  first F take each version from a relay above them, at its host's address, rank 0 their fallback.
- The learner stand-in (learner-0, with the learner's keys: it binds): `ControlClient` heartbeats, and two real
  `WeightPublisher`s (no shared-memory board: every collector is on another host than rank 0), publishing when the
  bench says so.

Figures, per cell:

- supervisor CPU: its process's utime + stime (/proc/<pid>/stat, all threads: ZeroMQ I/O, CURVE authenticator, log
  pumps) over the control window, as a share of one core;
- control messages per second at the supervisor: the messages its control router took off its socket (hellos,
  heartbeats, relays' bundles; `ControlRouter.received`, written into state.json by the bench) over the window;
- heartbeat-to-state.json delay: each heartbeat carries its send time (time.time()) as the collector's env-steps
  rate; the bench's supervisor adds each collector's latest (`bench_stamps`: a row's `rate` is a mean over 10 s of
  heartbeats) to state.json. The bench reads state.json whenever it changes (every 0.5 s) and, for each collector
  with a new stamp, takes updated_at (when the supervisor built that document) minus that stamp: how old the
  newest heartbeat is when it first shows. p50/p99 over the stamps sent in the window. It includes the up to
  0.5 s a heartbeat waits for the next state.json (and with relays up to 0.5 s at the relay), and a backlog at the
  control socket; a heartbeat overtaken by a newer one before the next document is not counted itself;
- weights published -> in use at every collector: the learner stand-in notes the time before `publish()`
  (flattening counts, as on the learner); each simulated collector notes when its subscriber's `poll()` loaded that
  version (or a newer one), which is when a real collector's next act uses it (the simulation polls at once: a
  real collector polls between env-step blocks). Per publish, the time until the last collector has it; p50/p99
  over the publishes (with a few publishes p99 is their maximum). A publish not at every collector within the
  deadline counts as missed: the size's figures are then None, it is the size's last publish in the cell (the
  next would queue behind the one in flight), and the printed lines say how many collectors had it and which did
  not (with the version each holds). A size whose copies in flight (about 2 x rank 0's subscribers x 4 bytes per
  parameter: CURVE encrypts each subscriber's copy apart, and each subscriber takes its message in whole) would need
  more than 40% of the free memory is skipped (`..._skipped` says why); the learner stand-in's peak memory is
  printed. With relays, also when the last relay had it from rank 0 (`weights_<size>_relays_p99_s`): rank 0's
  fan-out, apart from the hand-over at the simulated collectors (a copy of the whole vector each until they held
  the board's slot instead: 1,000 copies of 40 MB were ~4 s of CPU here).

Last line: one JSON object, `relays` (true unless --no-relays), `sealed` (true unless --no-sealed), `relay_fanout`,
keys `c<C>_h<H>_<figure>` (supervisor_cpu, control_msgs_per_s, heartbeat_p50_s, heartbeat_p99_s, weights_1m_p50_s, weights_1m_p99_s,
weights_10m_p50_s, weights_10m_p99_s, weights_<size>_relays_p99_s) and `c<C>_h<H>_met` (the issue's targets:
supervisor below 25% of one core, heartbeat p99 <= 2 s, 10M weights p99 <= 3 s).

On a small machine every simulated host, the learner and the supervisor share the same cores: the figures then
include their contention (a 1,000-collector cell on 2 cores measures an overloaded machine), and are noisy. The
processes run at the priority that gives each about the CPU it would have on a cluster: the supervisor and the
learner stand-in at nice 0 (machines of their own), the relays at nice 10 (about a core of their host's), the
simulated hosts at nice 19 (their collectors would each have a core); the weights figures still include the
simulation's wait for CPU.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

import zmq  # noqa: E402

from rlctl import metric_names as M  # noqa: E402
from rlctl.net import wire  # noqa: E402
from rlctl.role_names import Role  # noqa: E402

BENCH = os.path.abspath(__file__)
HIDDEN = {"1m": [996, 996], "10m": [3158, 3158]}  # QNetwork(4 -> h -> h -> dueling 1 + 2): 1,000,983 / 10,001,389
PARAMS = {"1m": 1_000_983, "10m": 10_001_389}
# Niceness (yield_to_supervisor), by the CPU each would have on a cluster: the learner stand-in, like the supervisor,
# a machine of its own; a relay, about a core of its host's; a simulated host, its collectors' load, which a cluster
# spreads over cores of their own.
NICE_LEARNER, NICE_RELAY, NICE_SIMULATED = 0, 10, 19
MEMORY_SHARE = 0.4  # a size is skipped in a cell whose weights in flight would need more of the free memory
TARGETS = {"supervisor_cpu": 0.25, "heartbeat_p99_s": 2.0, "weights_10m_p99_s": 3.0}
ALL_CELLS = [(10, 1), (10, 4), (100, 1), (100, 4), (100, 16), (1000, 1), (1000, 4), (1000, 16)]
QUICK_CELLS = [(10, 1), (10, 4)]
CONFIG = "bench-control-plane.json"  # in the runs folder: where the bench's sockets are, for the starter


def qnet(hidden: list[int]):
    """A CartPole QNetwork with these hidden widths (what learner rank 0 publishes, what a collector holds)."""
    from rlctl.models import QNetwork

    return QNetwork((4,), 2, hidden, "relu", True)


def die_with_parent() -> None:
    """SIGTERM when the parent (the supervisor) dies: the backstop of a simulated host or the learner stand-in."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        sys.exit(0)


def yield_to_supervisor(nice: int) -> None:
    """Run niced: on a cluster the simulated hosts are other machines, here they share the supervisor's cores, and
    with 16 hosts and their relays (33 busy processes on 2 cores) the supervisor got ~8% of a core, less than its
    work, and fell behind (heartbeats 10 s old in state.json) for want of CPU, not for its design. Each runs in a
    session of its own, so with the kernel's autogroups its group's nice is what counts, not only its own.

    The learner stand-in, rank 0 on a machine of its own on a cluster, runs at the supervisor's nice (0); a
    simulated host yields to the relays: it is 62 collectors' control traffic in one process (at 1,000 collectors on
    16 hosts, 1.2 of the 2 cores), where a cluster gives each collector a core of its own and a relay about one core
    of its host. At nice 10 for all, the learner stand-in got ~5% of a core, and encrypting a 10M-parameter version
    for 16 relays (~1.4 s of CPU) took 31 s."""
    if nice == 0:
        return
    os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass  # no autogroups (a kernel without them, or turned off): the process's nice counts


def raise_fd_limit() -> None:
    """Thousands of sockets in one process: the soft limit on open files up to the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class SharedContext(wire.SecureContext):
    """A SecureContext for one simulated collector's keys over its host's one zmq.Context (client sockets only)."""

    def __init__(self, keys: wire.CurveKeys, ctx: zmq.Context):
        self.keys, self.ctx = keys, ctx
        self._auth, self._watches, self._stop = None, [], threading.Event()


def from_address(endpoint: str, address: str) -> str:
    """`tcp://host:port` connected from `address` (ZeroMQ's `tcp://source;destination`)."""
    return f"tcp://{address}:0;{endpoint.removeprefix('tcp://')}"


# --------------------------------------------------------------------------- the simulated host

class Episodes:
    """Stands in for a collector's EpisodeTracker: episodes end at random (Poisson), as many per second as asked."""

    def __init__(self, per_s: float):
        self.per_s, self.last = per_s, time.monotonic()
        self.next_end = self.last + random.expovariate(per_s) if per_s > 0 else float("inf")
        self.returns: list[float] = []

    def advance(self, now: float) -> None:
        while now >= self.next_end:
            self.returns.append(float(random.randint(10, 500)))
            self.next_end += random.expovariate(self.per_s)

    @property
    def ended(self) -> bool:
        return bool(self.returns)

    def take(self) -> dict:
        out = {M.EPISODE_RETURNS: self.returns[-1000:], M.EPISODE_LENGTHS: [int(r) for r in self.returns[-1000:]]}
        self.returns = []
        return out


def child_setup(nice: int) -> dict:
    """A child's start: it ends with the supervisor, runs niced with one torch thread; its config, from stdin."""
    import torch

    die_with_parent()
    yield_to_supervisor(nice)
    raise_fd_limit()
    torch.set_num_threads(1)
    return json.loads(sys.stdin.readline())


def stop_on_sigterm() -> list:
    """The list SIGTERM fills: a child's loop runs while it is empty (before this, SIGTERM ends the child at once)."""
    stop: list = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    return stop


def child_host() -> None:
    """A simulated host: its collectors' control clients and weight subscribers in one poll loop."""
    from rlctl.job.load import load_job
    from rlctl.net import weights as weights_module
    from rlctl.net.weights import WeightSubscriber
    from rlctl.roles.collector_report import CollectorReport
    from rlctl.roles.context import ControlClient as Client, RoleContext

    cfg = child_setup(NICE_SIMULATED)
    job = load_job(cfg["job"])
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, 65536)
    address, relay = cfg["address"], cfg.get("relay")
    if relay:  # the host's relay: its control socket, and per size its weights socket and board
        endpoints = {**cfg["endpoints"], "control": relay["control"]}
        weight_eps, boards = relay["weights"], relay["boards"]
    else:
        endpoints = {**cfg["endpoints"], "control": from_address(cfg["endpoints"]["control"], address)}
        weight_eps = {"1m": from_address(cfg["endpoints"]["weights"], address),
                      "10m": from_address(cfg["weights_10m"], address)}
        boards = {"1m": None, "10m": None}
    bulk = {size: from_address(ep, address) for size, ep in cfg["bulk"].items()} if cfg["bulk"] and not relay else {}
    models = {size: qnet(hidden) for size, hidden in HIDDEN.items()}
    # Without relays every subscriber of a size loads into the host's one model of that size (each copy is made; the
    # memory of one model per collector, 40 MB at 10M parameters, is not): its flat buffer, made once.
    flats = {id(m): weights_module.share_flat_storage(m) for m in models.values()}
    weights_module.share_flat_storage = lambda model: flats[id(model)]
    report = ctx.socket(zmq.PUSH)
    report.setsockopt(zmq.LINGER, 0)
    report.connect(cfg["report"])
    poller, subscriber_of, queue = zmq.Poller(), {}, []
    members = []
    for name, rank, keys_env in cfg["collectors"]:  # subscriptions first: the hellos then go out together
        net = SharedContext(wire.CurveKeys.from_env(keys_env), ctx)
        # As a collector's own: on a board, zero-copy (the slot held is its policy).
        subs = {size: WeightSubscriber(net, ep, models[size], boards[size], zero_copy=True, bulk=bulk.get(size))
                for size, ep in weight_eps.items()}
        members.append((name, rank, net, subs))
    for name, rank, net, subs in members:
        rc = RoleContext(role=Role.COLLECTOR, rank=rank, host=cfg["host"], run_id=cfg["run_id"], job=job,
                         endpoints=endpoints, checkpoint_dir="", keys=net.keys, binds={})
        control = Client(net, rc)  # the hello goes out now
        episodes = Episodes(cfg["episodes_per_s"])
        collector = CollectorReport(control, episodes, lambda s=subs, e=episodes: {
            M.COLLECTOR_WEIGHT_VERSION: s["1m"].version, M.COLLECTOR_SENT: 0, M.NET_DROPPED: s["1m"].dropped,
            M.ENV_STEPS_PER_S: time.time()})  # the stamp rides in the one figure state.json shows per process
        control.next_at = time.monotonic() + random.random() * control.interval  # collectors start spread out
        for size, sub in subs.items():
            for sock in sub.sockets:
                poller.register(sock, zmq.POLLIN)
                subscriber_of[sock] = (name, size, sub)
        heapq.heappush(queue, (min(control.next_at, episodes.next_end), rank, collector))
    print(f"{cfg['host']}: {len(cfg['collectors'])} collectors from {address}", flush=True)
    stop = stop_on_sigterm()
    while not stop:
        now = time.monotonic()
        while queue and queue[0][0] <= now:  # the collectors whose heartbeat or episode end is due
            _, rank, collector = heapq.heappop(queue)
            collector.episodes.advance(now)
            collector.env_steps += 100
            collector()
            wake = min(collector.control.next_at, collector.episodes.next_end,
                       max(collector.last_sent + 0.1, now) if collector.episodes.ended else float("inf"))
            heapq.heappush(queue, (max(wake, now + 0.001), rank, collector))
        timeout = max(0.0, min(queue[0][0] - time.monotonic(), 0.05)) if queue else 0.05
        for sock, _ in poller.poll(timeout * 1000):
            name, size, sub = subscriber_of[sock]
            if sub.poll():
                report.send_json({"use": name, "size": size, "version": sub.version, "t": time.time()})
    ctx.destroy(linger=0)


# --------------------------------------------------------------------------- a simulated host's relay

def child_relay() -> None:
    """relay-k of a simulated host: the product's relay loop (rlctl.roles.relay.serve) with a WeightRelay per model
    size (each its own board and socket) and the host's control socket, under relay-k's keys."""
    from rlctl.job.load import load_job
    from rlctl.roles.context import ControlClient, RoleContext
    from rlctl.launch.plan import relay_parents
    from rlctl.net.weights import PUBLISHER_IO_THREADS
    from rlctl.roles.relay import ControlGather, SealedLinks, WeightRelay, serve

    cfg, stop = child_setup(NICE_RELAY), stop_on_sigterm()
    # A tree of relays (rlctl.launch.plan.relay_tree): past the fanout, from the relay above, rank 0 its fallback.
    parents = relay_parents(cfg["hosts"], cfg["relay_fanout"])
    above, below = parents[cfg["rank"]], cfg["rank"] in parents
    net = wire.SecureContext(wire.CurveKeys.from_env(cfg["keys"]), PUBLISHER_IO_THREADS if below else 1)
    address, relay = cfg["address"], cfg["relay"]
    rc = RoleContext(role=Role.RELAY, rank=cfg["rank"], host=cfg["host"], run_id=cfg["run_id"],
                     job=load_job(cfg["job"]), checkpoint_dir="", keys=net.keys, binds={},
                     endpoints={"control": from_address(cfg["endpoints"]["control"], address)})
    control = ControlClient(net, rc)
    gather = ControlGather(net, relay["control"], control)
    root = {"1m": cfg["endpoints"]["weights"], "10m": cfg["weights_10m"]}
    upstream = {size: from_address(ep if above is None else tree_endpoint(cfg, above, size), address)
                for size, ep in root.items()}
    report = net.ctx.socket(zmq.PUSH)
    report.setsockopt(zmq.LINGER, 0)
    report.connect(cfg["report"])

    class TimedRelay(WeightRelay):
        """The product's relay, telling the bench when a new version came in (from rank 0, or the relay above)."""

        def __init__(self, size: str, hidden: list[int]):
            binds = [relay["weights"][size], *([tree_endpoint(cfg, cfg["rank"], size)] if below else [])]
            bulk = None
            if cfg["bulk"]:
                bulk = SealedLinks(from_address(cfg["bulk"][size] if above is None
                                                else tree_endpoint(cfg, above, size, bulk=True), address),
                                   None if above is None else from_address(cfg["bulk"][size], address),
                                   tree_endpoint(cfg, cfg["rank"], size, bulk=True) if below else None)
            super().__init__(net, upstream[size], binds, rc.name, relay["boards"][size], qnet(hidden),
                             root=None if above is None else from_address(root[size], address), bulk=bulk)
            self.size = size

        def step(self, timeout_ms: int) -> bool:
            new = super().step(timeout_ms)
            if new:
                report.send_json({"relayed": self.size, "by": rc.name, "version": self.upstream.version,
                                  "t": time.time()})
            return new

    weights = [TimedRelay(size, hidden) for size, hidden in HIDDEN.items()]
    print(f"{cfg['host']}: relay-{cfg['rank']} from {address}", flush=True)
    try:
        serve(weights, gather, control, stop)
        for w in weights:
            w.close()
    finally:
        net.close()


# --------------------------------------------------------------------------- the learner stand-in

def child_learner() -> None:
    """learner-0: heartbeats, and the two publishers (1M, 10M), publishing when the bench says so."""
    from rlctl.job.load import load_job
    from rlctl.net.weights import FULL, PUBLISHER_IO_THREADS, WeightPublisher
    from rlctl.roles.context import ControlClient, RoleContext

    cfg, stop = child_setup(NICE_LEARNER), stop_on_sigterm()
    net = wire.SecureContext(wire.CurveKeys.from_env(cfg["keys"]), PUBLISHER_IO_THREADS)  # as rank 0's
    net.ctx.set(zmq.MAX_SOCKETS, 65536)
    rc = RoleContext(role=Role.LEARNER, rank=0, host="localhost", run_id=cfg["run_id"], job=load_job(cfg["job"]),
                     endpoints=cfg["endpoints"], checkpoint_dir="", keys=net.keys, binds={})
    control = ControlClient(net, rc)
    models = {size: qnet(hidden) for size, hidden in HIDDEN.items()}
    bulk = cfg["bulk"] or {}
    pubs = {"1m": WeightPublisher(net, cfg["endpoints"]["weights"], "learner-0", bulk=bulk.get("1m")),
            "10m": WeightPublisher(net, cfg["weights_10m"], "learner-0", bulk=bulk.get("10m"))}
    commands = net.ctx.socket(zmq.PULL)
    commands.connect(cfg["commands"])
    report = net.ctx.socket(zmq.PUSH)
    report.setsockopt(zmq.LINGER, 0)
    report.connect(cfg["report"])
    print(f"learner stand-in: {', '.join(f'{s} {sum(p.numel() for p in m.parameters()):,}' for s, m in models.items())}"
          " parameters", flush=True)
    joins = {size: 0 for size in pubs}
    # Sealed, as the learner does: the current version again to subscribers that joined (the seal names the bulk
    # socket's token, and a ciphertext reaches them once they subscribed to it), at most every 0.2 s.
    current, welcomed, republished = {size: 0 for size in pubs}, {size: 0 for size in pubs}, 0.0
    while not stop and not control.stop_requested():
        if control.due():
            control.heartbeat({M.UPDATES: 0, M.UPDATES_PER_S: 0.0, M.SAMPLES_PER_S: 0.0})
        for size, pub in pubs.items():
            pub.wanted(FULL)  # reads the subscriptions
            if pub.joins != joins[size]:
                joins[size] = pub.joins
                report.send_json({"joins": size, "n": pub.joins})
            if pub.bulk is not None and time.monotonic() >= republished + 0.2:
                pub.bulk.read_subscriptions()
                if pub.bulk.joins or pub.joins != welcomed[size]:
                    pub.bulk.joins, welcomed[size], republished = 0, pub.joins, time.monotonic()
                    pub.publish(current[size], models[size])
        if commands.poll(50):
            cmd = commands.recv_json()
            t = time.time()
            pubs[cmd["size"]].publish(cmd["version"], models[cmd["size"]])
            current[cmd["size"]] = cmd["version"]
            report.send_json({"published": cmd["size"], "version": cmd["version"], "t": t})
    net.close()


# --------------------------------------------------------------------------- the supervisor

def child_supervisor(job_path: str, runs_dir: str) -> int:
    """The real supervisor on a run prepared by the real launch path; its processes are the simulated ones."""
    import dataclasses

    from rlctl.job.load import load_job
    from rlctl.launch.pipeline import launch_input, prepare
    from rlctl.launch.plan import make_plan
    from rlctl.rundir import RunDir
    from rlctl.supervise.loop import Supervisor
    from rlctl.supervise.run_state import RunState

    rundir = prepare(launch_input(Path(job_path)), Path(runs_dir))
    cfg = json.loads((Path(runs_dir) / CONFIG).read_text())
    spec = load_job(rundir.job_toml)
    saved = rundir.read_plan()
    plan = make_plan(spec, rundir.run_id, str(rundir.path), int(saved["base_port"]), python=sys.executable,
                     board_token=str(saved.get("board_token", "")))
    plan = dataclasses.replace(plan, processes=[p for p in plan.processes
                                                if p.role == Role.COLLECTOR or p.name == "learner-0"])
    if cfg["relays"]:
        plan = with_relays(plan, cfg)

    class CountingState(RunState):
        """state.json with the control messages the router has taken off its socket, and the collectors' stamps."""

        def document(self) -> dict:
            # A row's rate is a mean over heartbeats (RATE_WINDOW_S): the stamps are read from each process's
            # latest figures, as the supervisor holds them when it builds this document.
            stamps = {h.spec.name: h.metrics.get(M.ENV_STEPS_PER_S) for h in sup.table.handles
                      if h.spec.role == Role.COLLECTOR}
            return {**super().document(), "bench_control_messages": sup.router.received, "bench_stamps": stamps}

    sup = Supervisor(spec, plan, RunDir(rundir.path), wire.CurveKeys.generate())
    sup.run_state = CountingState(spec, plan, sup.rundir, sup.table, sup.sink)
    sup.starter = SimulatedStarter(plan, sup.rundir, sup.process_keys, cfg, str(rundir.job_toml))
    return sup.run()


def host_of(rank: int, collectors: int, hosts: int) -> int:
    """The simulated host of collector `rank`: blocks of collectors in rank order."""
    return rank * hosts // collectors


def relay_endpoints(cfg: dict, k: int) -> dict:
    """Simulated host k's relay: its control socket, and per model size its weights socket and board."""
    folder = cfg["sockets"]
    return {"control": f"ipc://{folder}/r{k}-control.sock",
            "weights": {size: f"ipc://{folder}/r{k}-{size}.sock" for size in HIDDEN},
            "boards": {size: f"/dev/shm/{cfg['board_prefix']}-r{k}-{size}" for size in HIDDEN}}


def tree_endpoint(cfg: dict, k: int, size: str, bulk: bool = False) -> str:
    """Where relay k hands `size` on to the relays below it (at its simulated host's address); `bulk`: the sealed
    versions' bulk socket beside it."""
    return f"tcp://127.0.0.{k + 2}:{cfg['tree_bulk_ports' if bulk else 'tree_ports'][size]}"


def with_relays(plan, cfg: dict):
    """The plan as make_plan renders it for H hosts with relays: a relay per simulated host, each collector on its
    host and reporting through that host's relay (RLCTL_CONTROL_VIA), which the supervisor checks bundles by."""
    import dataclasses

    from rlctl.launch.hosts import CONTROL_VIA_ENV
    from rlctl.launch.plan import ProcessSpec

    n_hosts = cfg["hosts"]
    collectors = [p for p in plan.processes if p.role == Role.COLLECTOR]
    out = [p for p in plan.processes if p.role != Role.COLLECTOR]
    for k in range(n_hosts):
        r = relay_endpoints(cfg, k)
        out.append(ProcessSpec(f"relay-{k}", Role.RELAY, k, f"sim-host-{k}", [], {},
                               {"control": r["control"], "weights": r["weights"]["1m"]}))
    for p in collectors:
        k = host_of(p.rank, len(collectors), n_hosts)
        out.append(dataclasses.replace(p, host=f"sim-host-{k}",
                                       env={**p.env, CONTROL_VIA_ENV: relay_endpoints(cfg, k)["control"]}))
    return dataclasses.replace(plan, processes=out)


class SimulatedStarter:
    """Starts the simulated hosts (each the process of its block of collectors) and the learner stand-in, in place of
    one process per collector: the supervisor reaps, signals and stops them as it would those processes."""

    def __init__(self, plan, rundir, process_keys: dict, cfg: dict, job: str):
        self.plan, self.rundir, self.keys, self.cfg, self.job = plan, rundir, process_keys, cfg, job

    def open_forkserver(self, handles) -> None:
        pass

    def _spawn(self, mode: str, setup: dict, handles: list, log: str) -> None:
        from rlctl.liveness import process_start_time
        from rlctl.supervise.process_table import LogPump

        popen = subprocess.Popen([sys.executable, BENCH, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True, cwd=str(H.REPO))
        popen.stdin.write(json.dumps(setup).encode() + b"\n")  # keys never on a command line or in a file
        popen.stdin.close()
        for h in handles:
            h.popen, h.exit_code, h.last_heartbeat, h.started_at = popen, None, None, time.time()
            h.start_time = process_start_time(popen.pid)
        handles[0].pump = LogPump(popen.stdout, self.rundir.logs_dir / log)  # one pipe per simulated host
        handles[0].pump.start()

    def start_all(self, handles, stopping, meanwhile) -> None:
        common = {"job": self.job, "run_id": self.plan.run_id, "endpoints": self.plan.endpoints,
                  "weights_10m": self.cfg["weights_10m"], "report": self.cfg["report"], "hosts": self.cfg["hosts"],
                  "relay_fanout": self.cfg["relay_fanout"], "tree_ports": self.cfg["tree_ports"],
                  "bulk": self.cfg["bulk"], "tree_bulk_ports": self.cfg["tree_bulk_ports"]}
        learner = [h for h in handles if h.spec.role == Role.LEARNER]
        self._spawn("--child-learner", {**common, "keys": self.keys["learner-0"].to_env(),
                                        "commands": self.cfg["commands"]}, learner, "learner-0.log")
        collectors = sorted((h for h in handles if h.spec.role == Role.COLLECTOR), key=lambda h: h.spec.rank)
        n_hosts = self.cfg["hosts"]
        for k in range(n_hosts):
            host = {"host": f"sim-host-{k}", "address": f"127.0.0.{k + 2}"}
            if self.cfg["relays"]:
                host["relay"] = relay_endpoints(self.cfg, k)
                relay = [h for h in handles if h.spec.name == f"relay-{k}"]
                self._spawn("--child-relay", {**common, **host, "rank": k, "keys": self.keys[f"relay-{k}"].to_env()},
                            relay, f"relay-{k}.log")
            mine = [h for h in collectors if host_of(h.spec.rank, len(collectors), n_hosts) == k]
            self._spawn("--child-host", {**common, **host, "episodes_per_s": self.cfg["episodes_per_s"],
                                         "collectors": [[h.spec.name, h.spec.rank, self.keys[h.spec.name].to_env()]
                                                        for h in mine]}, mine, f"sim-host-{k}.log")

    def start(self, h) -> None:
        raise RuntimeError(f"{h.spec.name} ended: a simulated process is not restarted")

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- the bench

def write_cell_job(directory: Path, collectors: int) -> Path:
    """jobs/apex.toml with C collectors, no evaluator, and no stop rule but a day's wall time."""
    from rlctl.job.load import load_job
    from rlctl.job.toml_writer import dumps_toml

    data = H.load_toml()
    data["job"]["stop"] = {"wall_s": 86400}
    data["topology"].update({"collectors": collectors, "evaluator": False})
    path = directory / "job.toml"
    path.write_text(dumps_toml(data))
    load_job(path)
    return path


class StateWatch(threading.Thread):
    """Reads state.json each time it changes: heartbeat stamps -> delays, and the control-message count."""

    def __init__(self, runs: Path):
        super().__init__(daemon=True)
        self.runs, self.stop = runs, threading.Event()
        self.state: dict = {}
        self.seen: dict[str, float] = {}  # collector -> newest stamp seen
        self.delays: list[tuple[float, float]] = []  # (stamp, updated_at - stamp)
        self.lock = threading.Lock()

    def run(self) -> None:
        mtime = 0
        while not self.stop.wait(0.05):
            paths = list(self.runs.glob("*/state.json"))
            try:
                st = paths[0].stat().st_mtime_ns if paths else 0
                if st == mtime:
                    continue
                state = json.loads(paths[0].read_text())
                mtime = st
            except (OSError, ValueError):
                continue
            with self.lock:
                self.state = state
                for name, stamp in state.get("bench_stamps", {}).items():
                    if isinstance(stamp, float) and stamp > self.seen.get(name, 0.0):
                        self.seen[name] = stamp
                        self.delays.append((stamp, state["updated_at"] - stamp))

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.state)

    def delays_between(self, t0: float, t1: float) -> list[float]:
        with self.lock:
            return [d for stamp, d in self.delays if t0 <= stamp <= t1]


class Reports:
    """The bench's PULL: the learner's publish times and subscriptions, the collectors' versions in use."""

    def __init__(self, ctx: zmq.Context):
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.joins = {"1m": 0, "10m": 0}
        self.published: dict[tuple[str, int], float] = {}
        self.newest: dict[str, dict[str, tuple[int, float]]] = {"1m": {}, "10m": {}}  # size -> name -> (v, t)
        self.reached: dict[str, float] = {}  # for the publish being timed: collector -> when it had it
        self.relayed: dict[str, float] = {}  # for the publish being timed: relay -> when it had it from rank 0
        self.timing: tuple[str, int] | None = None

    def drain(self, timeout_ms: int) -> None:
        if not self.sock.poll(timeout_ms):
            return
        while True:
            try:
                r = self.sock.recv_json(zmq.NOBLOCK)
            except zmq.Again:
                return
            if "joins" in r:
                self.joins[r["joins"]] = max(self.joins[r["joins"]], r["n"])
            elif "published" in r:
                self.published[(r["published"], r["version"])] = r["t"]
            elif "relayed" in r:
                if self.timing and r["relayed"] == self.timing[0] and r["version"] >= self.timing[1]:
                    self.relayed.setdefault(r["by"], r["t"])
            elif "use" in r:
                self.newest[r["size"]][r["use"]] = (r["version"], r["t"])
                if self.timing and r["size"] == self.timing[0] and r["version"] >= self.timing[1]:
                    self.reached.setdefault(r["use"], r["t"])


def available_memory() -> float:
    """MemAvailable in bytes (/proc/meminfo)."""
    with open("/proc/meminfo") as f:
        return next(float(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def peak_rss(pid: int) -> float:
    """A process's peak resident memory in bytes (VmHWM), NaN if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(float(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return float("nan")


def tails(runs: Path) -> str:
    """The ends of the supervisor's output and of its processes' logs."""
    files = [runs / "supervisor.out", *sorted(runs.glob("*/logs/*.log"))]
    return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:] for p in files if p.exists())


def check_alive(sup: subprocess.Popen, runs: Path) -> None:
    """Raise with the logs' ends if the supervisor exited."""
    if sup.poll() is not None:
        raise RuntimeError(f"the supervisor exited with {sup.returncode}:\n" + tails(runs))


def time_weights(size: str, reports: Reports, commands: zmq.Socket, collectors: int, relays: int, publishes: int,
                 deadline_s: float, budget_s: float, version0: int, sup, runs) -> dict:
    """Publish `size` weights up to `publishes` times (within `budget_s`), each timed to every collector (and to
    every relay, when there are `relays`)."""
    every, relays_every, reached_counts, version = [], [], [], version0
    t_end = time.monotonic() + budget_s
    for _ in range(publishes):
        if time.monotonic() > t_end:
            break
        gap = time.monotonic() + random.uniform(0.1, 0.3)
        while time.monotonic() < gap:
            reports.drain(10)
        version += 1
        reports.timing, reports.reached, reports.relayed = (size, version), {}, {}
        commands.send_json({"size": size, "version": version})
        stop_at = time.monotonic() + min(deadline_s, max(1.0, t_end - time.monotonic()))
        while time.monotonic() < stop_at and len(reports.reached) < collectors:
            reports.drain(20)
            check_alive(sup, runs)
        while (size, version) not in reports.published and time.monotonic() < stop_at + 5:
            reports.drain(20)
        t_pub = reports.published.get((size, version))
        reached_counts.append(len(reports.reached))
        if t_pub is not None and len(reports.reached) == collectors:
            every.append(max(reports.reached.values()) - t_pub)
            if relays and len(reports.relayed) == relays:
                relays_every.append(max(reports.relayed.values()) - t_pub)
        else:
            every.append(None)
            late = sorted(set(reports.newest[size]) - set(reports.reached), key=lambda n: int(n.rpartition("-")[2]))
            never = collectors - len(reports.reached) - len(late)
            print(f"      {size} version {version} not at: " + ", ".join(
                f"{n} (holds v{reports.newest[size][n][0]})" for n in late[:10]) +
                (f" and {len(late) - 10} more" if len(late) > 10 else "") +
                (f"; {never} never held a version of this size" if never else ""), flush=True)
        reports.timing = None
        if every[-1] is None:
            break  # one miss says it; the next publish would queue behind the one still in flight
    done = [x for x in every if x is not None]
    missed = len(every) - len(done)
    return {"publishes": len(every), "missed": missed, "reached": min(reached_counts, default=0),
            "every_s": every, "version": version,
            "p50_s": H.percentile(done, 50) if done and not missed else None,
            "p99_s": H.percentile(done, 99) if done and not missed else None,
            "relays_p99_s": H.percentile(relays_every, 99) if relays_every and not missed else None}


def run_cell(collectors: int, hosts: int, args, tmp: Path) -> dict:
    """One cell: the supervisor, H simulated hosts, the learner stand-in; control window, then 1M and 10M weights."""
    cell_dir = tmp / f"c{collectors}_h{hosts}"
    runs = cell_dir / "runs"
    runs.mkdir(parents=True)
    job = write_cell_job(cell_dir, collectors)
    ctx = zmq.Context()
    reports = Reports(ctx)
    commands = ctx.socket(zmq.PUSH)
    commands.setsockopt(zmq.LINGER, 0)
    commands_ep = f"tcp://127.0.0.1:{commands.bind_to_random_port('tcp://127.0.0.1')}"
    board_prefix = f"rlctl-bench-{os.getpid()}-{cell_dir.name}"  # the relays' boards in /dev/shm
    # The relays' Unix sockets: a short folder of /tmp (sun_path holds 107 bytes; $TMPDIR may be deep).
    sockets = tempfile.mkdtemp(prefix="rlcp-", dir="/tmp")
    (runs / CONFIG).write_text(json.dumps({
        "report": reports.endpoint, "commands": commands_ep, "hosts": hosts, "relays": args.relays,
        "sockets": sockets, "board_prefix": board_prefix,
        "weights_10m": f"tcp://127.0.0.1:{H.free_ports(1)[0]}", "episodes_per_s": args.episodes_per_s,
        "relay_fanout": args.relay_fanout, "tree_ports": dict(zip(HIDDEN, H.free_ports(2))),
        # Sealed versions (rlctl.net.sealed): rank 0's and the tree's bulk sockets per size; None: CURVE copies.
        "bulk": {size: f"tcp://127.0.0.1:{port}" for size, port in zip(HIDDEN, H.free_ports(2))} if args.sealed
        else None, "tree_bulk_ports": dict(zip(HIDDEN, H.free_ports(2)))}))
    watch = StateWatch(runs)
    env = {**os.environ, "PYTHONPATH": str(H.REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(runs / "supervisor.out", "wb") as out:
        sup = H.children.spawn([sys.executable, BENCH, "--child-supervisor", str(job), str(runs)],
                               grace=H.children.SUPERVISOR_GRACE_S, env=env, stdin=subprocess.DEVNULL, stdout=out,
                               stderr=subprocess.STDOUT, cwd=str(H.REPO))
    out = {}
    try:
        watch.start()
        t_ready = time.monotonic()
        deadline = t_ready + 120 + collectors * 0.2
        processes = collectors + 1 + (hosts if args.relays else 0)
        while True:  # every process running (said hello), every subscription at the publishers
            reports.drain(100)
            check_alive(sup, runs)
            procs = watch.snapshot().get("processes", [])
            up = sum(p["state"] == "running" for p in procs)
            # Rank 0's subscribers: the collectors, or with relays the relays under it (the others' collectors
            # subscribe at their relays, those relays at the relays above them).
            # Sealed, also every collector holding the first version (its subscription to the ciphertexts made).
            if up == processes and min(reports.joins.values()) >= (
                    min(hosts, args.relay_fanout) if args.relays else collectors) and (
                    not args.sealed or min(len(held) for held in reports.newest.values()) == collectors):
                break
            if time.monotonic() > deadline:
                state = watch.snapshot()
                raise TimeoutError(f"{up} of {processes} processes running, subscriptions {reports.joins} "
                                   f"after {deadline - t_ready:.0f} s (run {state.get('status')}: "
                                   f"{state.get('exit_reason')}):\n" + tails(runs))
        out["ready_s"] = time.monotonic() - t_ready
        time.sleep(args.settle)  # the start-up's hellos and first heartbeats behind us
        s0, c0, w0, t0 = watch.snapshot(), H.process_cpu_s(sup.pid), time.time(), time.monotonic()
        while time.monotonic() < t0 + args.window:
            reports.drain(100)
            check_alive(sup, runs)
        s1, c1, w1 = watch.snapshot(), H.process_cpu_s(sup.pid), time.time()
        time.sleep(1.0)  # the window's last stamps reach state.json
        delays = watch.delays_between(w0, w1)
        out["supervisor_cpu"] = (c1 - c0) / (w1 - w0)
        updated = s1["updated_at"] - s0["updated_at"]
        out["control_msgs_per_s"] = ((s1["bench_control_messages"] - s0["bench_control_messages"]) / updated
                                     if updated > 0 else float("nan"))
        out["heartbeat_p50_s"], out["heartbeat_p99_s"] = H.percentile(delays, 50), H.percentile(delays, 99)
        out["heartbeats_seen"] = len(delays)
        version = 0
        learner_pid = next((p["pid"] for p in watch.snapshot().get("processes", []) if p["name"] == "learner-0"), 0)
        for size in ("1m", "10m"):
            # Over CURVE every subscriber's copy is encrypted (at the publisher) and taken in whole (at the
            # subscriber) on its own: about 2 x subscribers x 4 bytes per parameter in flight at once (rank 0's
            # subscribers: the collectors, or with relays one relay per host).
            need = 2 * (hosts if args.relays else collectors) * PARAMS[size] * 4
            if need > MEMORY_SHARE * available_memory():
                out[f"weights_{size}"] = {"skipped": f"needs ~{need / 1e9:.0f} GB in flight, "
                                                     f"{available_memory() / 1e9:.0f} GB available"}
                continue
            r = time_weights(size, reports, commands, collectors, hosts if args.relays else 0, args.publishes[size],
                             args.deadline, args.budget, version, sup, runs)
            version = r["version"]
            out[f"weights_{size}"] = r
        out["learner_peak_rss_gb"] = peak_rss(learner_pid) / 1e9
        return out
    finally:
        watch.stop.set()
        H.children.stop([sup])
        ctx.destroy(linger=0)
        for board in Path("/dev/shm").glob(f"{board_prefix}-*"):  # a relay killed before its own cleanup
            board.unlink(missing_ok=True)
        shutil.rmtree(sockets, ignore_errors=True)


def parse_cells(text: str) -> list[tuple[int, int]]:
    """`c10_h1,c1000_h16` -> [(10, 1), (1000, 16)]."""
    cells = []
    for part in text.split(","):
        try:
            c, h = part.strip().removeprefix("c").split("_h")
            cells.append((int(c), int(h)))
        except ValueError:
            raise SystemExit(f"control_plane.py: --cells takes c<collectors>_h<hosts>,...; not {part!r}") from None
    bad = [f"c{c}_h{h}" for c, h in cells if c < 1 or h < 1 or h > c or h > 200]
    if bad:
        raise SystemExit(f"control_plane.py: cells need 1 <= hosts <= collectors (and at most 200 hosts): {bad}")
    return cells


def show(key: str, r: dict) -> None:
    def f(x, unit="s"):
        return "missed" if x is None else f"{x:.3f} {unit}"

    print(f"  {key}: ready in {r['ready_s']:.1f} s; supervisor {100 * r['supervisor_cpu']:.1f}% of one core, "
          f"{r['control_msgs_per_s']:.0f} control messages/s; heartbeat -> state.json p50 "
          f"{f(r['heartbeat_p50_s'])}, p99 {f(r['heartbeat_p99_s'])} ({r['heartbeats_seen']} stamps)", flush=True)
    print(f"      learner stand-in peak memory {r['learner_peak_rss_gb']:.2f} GB", flush=True)
    for size in ("1m", "10m"):
        w = r[f"weights_{size}"]
        if "skipped" in w:
            print(f"      weights {size:3s}: skipped: {w['skipped']}", flush=True)
            continue
        each = ", ".join("missed" if x is None else f"{x:.2f}" for x in w["every_s"])
        print(f"      weights {size:3s}: at every collector p50 {f(w['p50_s'])}, p99 {f(w['p99_s'])} over "
              f"{w['publishes']} publishes ({each} s; {w['missed']} missed, fewest reached {w['reached']})"
              + (f"; at every relay p99 {f(w['relays_p99_s'])}" if w.get("relays_p99_s") is not None else ""),
              flush=True)


def figures(key: str, r: dict) -> dict:
    """The cell's keys of the last line."""
    def num(x):
        return None if x is None or x != x else round(x, 4)

    out = {f"{key}_{name}": num(r[name]) for name in ("supervisor_cpu", "control_msgs_per_s", "heartbeat_p50_s",
                                                      "heartbeat_p99_s")}
    for size in ("1m", "10m"):
        w = r[f"weights_{size}"]
        out[f"{key}_weights_{size}_p50_s"], out[f"{key}_weights_{size}_p99_s"] = num(w.get("p50_s")), num(w.get("p99_s"))
        out[f"{key}_weights_{size}_relays_p99_s"] = num(w.get("relays_p99_s"))
        if "skipped" in w:
            out[f"{key}_weights_{size}_skipped"] = w["skipped"]
    out[f"{key}_learner_peak_rss_gb"] = num(r["learner_peak_rss_gb"])
    def met(name: str, target: float) -> bool:  # the supervisor below its target; the delays within theirs
        value = out[f"{key}_{name}"]
        return value is not None and (value < target if name == "supervisor_cpu" else value <= target)

    out[f"{key}_met"] = {name: met(name, target) for name, target in TARGETS.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small cells, short windows, few publishes")
    ap.add_argument("--cells", default=None, help="c<collectors>_h<hosts>,... (default: all 8 cells)")
    ap.add_argument("--window", type=float, default=None, help="seconds of the control window (default 15, quick 6)")
    ap.add_argument("--publishes", type=int, default=None, help="timed publishes per size (default 4, quick 2)")
    ap.add_argument("--episodes-per-s", type=float, default=5.0, help="episode ends per collector and second")
    ap.add_argument("--child-supervisor", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--child-host", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-learner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-relay", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-relays", dest="relays", action="store_false",
                    help="every collector talks to the supervisor and learner rank 0 itself (the design before relays)")
    ap.add_argument("--no-sealed", dest="sealed", action="store_false",
                    help="every copy of a version over CURVE (the design before rlctl.net.sealed)")
    ap.add_argument("--relay-fanout", type=int, default=None,
                    help="relays that one sender hands a version to (default: network.relay_fanout's; past it, a "
                         "tree)")
    args = ap.parse_args()
    if args.relay_fanout is None:
        from rlctl.job.spec import NetworkSpec

        args.relay_fanout = NetworkSpec.model_fields["relay_fanout"].default
    if args.child_supervisor:
        sys.exit(child_supervisor(*args.child_supervisor))
    if args.child_host:
        return child_host()
    if args.child_learner:
        return child_learner()
    if args.child_relay:
        return child_relay()
    H.children.install()  # killed or failing: no supervisor, simulated host or learner stand-in outlives it
    cells = parse_cells(args.cells) if args.cells else (QUICK_CELLS if args.quick else ALL_CELLS)
    args.window = args.window or (6.0 if args.quick else 15.0)
    n = args.publishes or (2 if args.quick else 4)
    args.publishes = {"1m": n, "10m": n}
    args.settle = 2.0 if args.quick else 5.0
    args.deadline = 30.0 if args.quick else 45.0  # one publish: missed past this (and the size's last)
    args.budget = 40.0 if args.quick else 60.0  # one size's publishes in one cell: no new one past this
    tree = f", a tree past {args.relay_fanout}" if args.relays and args.relay_fanout < max(h for _, h in cells) else ""
    print(f"control plane bench ({'a relay per simulated host' + tree if args.relays else 'no relays'}): "
          f"cells {', '.join(f'c{c}_h{h}' for c, h in cells)}; {args.window:g} s control "
          f"window, {n} publishes per size, {args.episodes_per_s:g} episodes/s per collector; "
          f"{os.cpu_count()} CPUs (shared: figures include the simulation's own load)", flush=True)
    result = {"bench": "control_plane", "relays": args.relays, "sealed": args.sealed,
              "relay_fanout": args.relay_fanout,
              **{f"target_{k}": v for k, v in TARGETS.items()}}
    with H.TempDir() as tmp:
        for c, h in cells:
            key = f"c{c}_h{h}"
            try:
                r = run_cell(c, h, args, tmp)
            except (RuntimeError, TimeoutError) as exc:
                print(f"  {key}: FAILED: {exc}", flush=True)
                result[f"{key}_error"] = str(exc).splitlines()[0][:200]
                continue
            show(key, r)
            result.update(figures(key, r))
    H.emit_json(result)


if __name__ == "__main__":
    main()
