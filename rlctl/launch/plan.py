"""JobSpec -> LaunchPlan: every process, host, argv, environment and port, as pure data.

`make_plan` is a pure function of its inputs (the job, the run directory and
the base port), so `rlctl plan` shows exactly what `rlctl run` will start.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import zlib
from dataclasses import asdict, dataclass, field

from rlctl.datapaths import DATA_PATHS
from rlctl.launch.hosts import (CONTROL_VIA_ENV, SECRET_ENV, WEIGHTS_BULK_VIA_ENV, WEIGHTS_VIA_ENV, control_socket,
                                launcher_for, relay_socket)
from rlctl.launch.port_claims import port_claims
from rlctl.launch.ports import PortLayout
from rlctl.launch.remote import port_free, remote_checkpoint_dir, remote_run_dir, weight_board_file
from rlctl.job.resolved import SECRET_MASK
from rlctl.job.spec import AUTO_PORTS, HostSpec, JobSpec
from rlctl.role_names import Role

ROLE_MODULES = {
    **{path.shard_role: path.shard_module for path in DATA_PATHS.values() if path.shard_role},
    Role.LEARNER: "rlctl.roles.learner",
    Role.COLLECTOR: "rlctl.roles.collector",
    Role.EVALUATOR: "rlctl.roles.evaluator",
    Role.INFERENCE: "rlctl.roles.inference",
    Role.RELAY: "rlctl.roles.relay",
}
# With central inference collectors run this module instead: it steps envs only and imports no torch.
CENTRAL_COLLECTOR_MODULE = "rlctl.roles.central_collector"
# Roles the supervisor does not restart: learner ranks are restarted by torchrun (topology.learner_max_restarts),
# and the end of torchrun ends the run. The others are restarted up to topology.max_restarts within a window.
CRITICAL_ROLES = frozenset({Role.LEARNER})
# Roles that write checkpoints (latest.pt and ckpt-N.pt; best.pt): on a remote host they are fetched at the end.
CHECKPOINT_ROLES = frozenset({Role.LEARNER, Role.EVALUATOR})
# Roles that start again on another host when theirs is lost (re_placement): they bind nothing and keep no data.
MOVABLE_ROLES = frozenset({Role.COLLECTOR, Role.EVALUATOR})
# Elastic learners: how long a rendezvous that has its minimum of nodes waits for the others (at the start, and
# after a node left), and the seconds between an agent's keep-alives (3 missed: the node is taken for dead).
ELASTIC_LAST_CALL_S, ELASTIC_KEEP_ALIVE_S = 5, 1
LOCAL_HOST = HostSpec(name="localhost", learner=True, evaluator=True)


@dataclass(frozen=True)
class ProcessSpec:
    """Blueprint of one process ("as a class is to an object"): the running one is a process_table.ProcessHandle."""

    name: str
    role: str
    rank: int
    host: str
    argv: list[str]
    env: dict[str, str]
    binds: dict[str, str] = field(default_factory=dict)
    critical: bool = False
    remote: bool = False  # started over SSH: argv is the `ssh` command, env is what the remote side gets
    secret_keys: tuple[str, ...] = ()  # env keys whose values are secrets (the host's own env): never shown or on argv
    command: tuple[str, ...] = ()  # what runs on the host, before its launcher (ssh, srun) wraps it into argv
    spare: bool = False  # a spare learner host's node: started once the learner group has formed


@dataclass(frozen=True)
class LaunchPlan:
    """Everything `rlctl run` will start, rendered before anything starts."""

    job: str
    algorithm: str
    run_id: str
    run_dir: str
    bind_host: str
    base_port: int
    endpoints: dict[str, object]
    hosts: list[dict]
    processes: list[ProcessSpec]
    board_token: str = ""  # random part of the names others must not guess: weight board, remote control sockets

    def to_dict(self, mask_secrets: bool = True) -> dict:
        """Plain data (for plan.json and `rlctl plan --json`), secrets masked."""
        data = asdict(self)
        for proc in data["processes"]:
            proc["secret_keys"], proc["command"] = list(proc["secret_keys"]), list(proc["command"])  # as JSON has them
            for key in proc["env"]:
                if mask_secrets and (key in SECRET_ENV or key in proc["secret_keys"]):
                    proc["env"][key] = SECRET_MASK
        return data

    def to_json(self, mask_secrets: bool = True) -> str:
        """JSON text of to_dict()."""
        return json.dumps(self.to_dict(mask_secrets), indent=1)

    def ports(self) -> list[int]:
        """Every port the job binds."""
        return sorted({port for p in self.processes for ep in p.binds.values() if (port := tcp_port(ep)) is not None})


def tcp_port(endpoint: str) -> int | None:
    """The port of a bound endpoint ("tcp://host:port", "host:port"); None for a Unix socket ("ipc://path")."""
    return None if endpoint.startswith("ipc://") else int(endpoint.rsplit(":", 1)[1])


def ports_needed(spec: JobSpec) -> int:
    """Size of the job's contiguous port range (JobSpec.port_count, which validation checks against 65535)."""
    return spec.port_count


def auto_bases(spec: JobSpec) -> range:
    """The bases `network.base_port = 0` may pick: every 16th port from which the job's range fits in AUTO_PORTS."""
    low, high = AUTO_PORTS
    return range(low, high - ports_needed(spec) + 1, 16)


def default_base_port(spec: JobSpec) -> int:
    """A per-job default port, stable for the same job name (so plans are reproducible)."""
    bases = auto_bases(spec)
    return bases[zlib.crc32(spec.job.name.encode()) % len(bases)]


def choose_base_port(spec: JobSpec, host: str = "127.0.0.1", reserved: frozenset[int] = frozenset(),
                     claim: bool = False) -> int:
    """The job's base port: the configured one, else the first range that is free now, from the per-job default,
    holding none of the `reserved` ports (promised to runs that have not bound them yet: a sweep's trials) nor any
    another run on this machine claimed (rlctl.launch.port_claims). With `claim`, the range chosen is claimed."""
    if spec.network.base_port:
        return spec.network.base_port
    need, bases = ports_needed(spec), auto_bases(spec)
    first = bases.index(default_base_port(spec))
    with port_claims() as book:
        taken = reserved | (book.ports if book is not None else frozenset())
        for i in range(len(bases)):
            base = bases[(first + i) % len(bases)]
            if all(base + k not in taken and port_free(host, base + k) for k in range(need)):
                if claim and book is not None:
                    book.claim(range(base, base + need))
                return base
    raise RuntimeError(f"no free range of {need} ports within {AUTO_PORTS[0]}-{AUTO_PORTS[1] - 1}; set "
                       "network.base_port")


def placement(spec: JobSpec) -> list[HostSpec]:
    """The hosts and what runs on each; without [[hosts]] everything runs on localhost."""
    if spec.hosts:
        return list(spec.hosts)
    topo = spec.topology
    return [LOCAL_HOST.model_copy(update={
        "collectors": topo.collectors,
        "replay_shards": spec.replay_shard_count,
        "evaluator": topo.evaluator,
    })]


def machine_warnings(spec: JobSpec, cpus: int) -> list[str]:
    """What the launching machine (`cpus` cores) cannot run well, each with its cause and a suggestion. Pure."""
    local = [h for h in placement(spec) if h.is_local]
    if not local:
        return []
    node_procs = dict(zip([h.name for h in placement(spec) if h.learner], spec.learner_node_procs))
    learners = sum(node_procs.get(h.name, 0) for h in local)
    collectors = sum(h.collectors for h in local)
    procs = learners + collectors + sum(h.replay_shards for h in local) + sum(h.evaluator for h in local)
    out = []
    if learners > cpus:
        out.append(f"{learners} learner processes on this machine's {cpus} cores: DDP ranks wait for the slowest, "
                   f"so each update runs at a fraction of a core; give learner_procs at most {cpus}")
    if procs > 2 * cpus and collectors > cpus:
        envs = collectors * spec.env.envs_per_collector
        fewer = max(cpus, spec.data_path.min_collectors(spec))
        out.append(f"{procs} processes on this machine's {cpus} cores: {collectors} collectors take CPU from the "
                   f"learner and switch among themselves. The same {envs} envs step as fast as collectors = {fewer}, "
                   f"envs_per_collector = {-(-envs // fewer)} (one batched forward per step serves every env of a "
                   "collector)")
    if spec.topology.learner_cores == "dedicated":
        for h in local:
            ranks = node_procs.get(h.name, 0)
            threads = spec.topology.learner_threads or auto_threads(cpus, other_processes(spec, h), ranks)
            if ranks and ranks * threads >= cpus:
                out.append(f"topology.learner_cores = \"dedicated\": {ranks} learner rank(s) x {threads} torch "
                           f"thread(s) would take all of this machine's {cpus} cores, so nothing is pinned; give "
                           "fewer learner_procs or learner_threads")
    return out


def job_warnings(spec: JobSpec) -> list[str]:
    """What in the job itself works against learning, each with its cause and a suggestion. Pure."""
    return spec.data_path.warnings(spec)


class Addressing:
    """Where each host is reached and what it binds: loopback for an all-local job, else each host's advertised
    address (or what `addresses` resolved its destination to), binding it or every interface."""

    def __init__(self, hosts: list[HostSpec], addresses: dict[str, str] | None):
        self.all_local = all(h.is_local for h in hosts)
        self.addresses = addresses or {}

    def addr(self, h: HostSpec) -> str:
        """The address other hosts reach `h` at."""
        if self.all_local:
            return "127.0.0.1"
        return h.advertise_address or self.addresses.get(h.name) or h.destination

    def bind(self, h: HostSpec) -> str:
        """The address `h`'s servers bind."""
        return "127.0.0.1" if self.all_local else (h.advertise_address or "0.0.0.0")


class ProcessBuilder:
    """Renders ProcessSpecs: the environment every process gets, the host's launcher around the command."""

    def __init__(self, spec: JobSpec, hosts: list[HostSpec], run_id: str, net: Addressing, base_env: dict[str, str],
                 control: str, control_port: int, board: str | None, subscribers: set[str], python: str | None,
                 board_token: str, relays: dict[str, tuple[str, dict[str, str]]],
                 upstreams: dict[str, tuple[str, str]]):
        self.spec, self.run_id, self.net, self.base_env = spec, run_id, net, base_env
        self.control, self.control_port, self.board, self.subscribers = control, control_port, board, subscribers
        self.python, self.board_token = python, board_token
        self.relays = relays  # host name -> its relay's board and binds (weights, control; weights_tree above others)
        # host name -> the relay endpoints (weights, bulk) its relay takes weights from (rank 0 if absent)
        self.upstreams = upstreams
        self.learner_nodes = [h for h in hosts if h.learner]
        self.head = self.learner_nodes[0]
        self.processes: list[ProcessSpec] = []

    def add(self, role: str, rank: int, h: HostSpec, module: str, binds: dict[str, str],
            argv: list[str] | None = None) -> None:
        """One process of `role` on `h` running `python -m module` (or `argv`), binding `binds`."""
        name, spec = f"{role}-{rank}", self.spec
        node_procs = spec.learner_node_procs
        env = {**self.base_env, **h.env, "RLCTL_ROLE": role, "RLCTL_RANK": str(rank), "RLCTL_HOST": h.name,
               "RLCTL_BINDS": json.dumps(binds, sort_keys=True, separators=(",", ":")),
               "RLCTL_TORCH_THREADS": self.learner_threads(h, node_procs[rank]) if role == Role.LEARNER else "1"}
        if spec.topology.learner_cores == "dedicated" and h.learner:
            node = next(i for i, n in enumerate(self.learner_nodes) if n is h)
            env["RLCTL_LEARNER_CORES"] = f"{node_procs[node]}:{self.learner_threads(h, node_procs[node])}"
        if self.board and h is self.head and (role == Role.LEARNER or role in self.subscribers):
            env["RLCTL_WEIGHT_BOARD"] = self.board
        elif h.name in self.relays and (role == Role.RELAY or role in self.subscribers):
            env["RLCTL_WEIGHT_BOARD"], via = self.relays[h.name]
            if role != Role.RELAY:
                env[WEIGHTS_VIA_ENV], env[CONTROL_VIA_ENV] = via["weights"], via["control"]
            elif h.name in self.upstreams:
                env[WEIGHTS_VIA_ENV], env[WEIGHTS_BULK_VIA_ENV] = self.upstreams[h.name]
        # Learners pick the network interface for gloo/nccl from it; all-local jobs get loopback (gloo would
        # otherwise listen on whatever the host name resolves to).
        env["RLCTL_ADVERTISE"] = self.net.addr(h)
        if not h.is_local:
            # The job file arrives on the session's stdin; the run's files live under the host's workdir.
            remote_dir = remote_run_dir(self.run_id)
            env.update(RLCTL_JOB=f"{remote_dir}/job.toml", RLCTL_CHECKPOINT_DIR=remote_checkpoint_dir(self.run_id),
                       RLCTL_CONTROL=self.control if h.slurm_job is not None
                       else f"ipc://{control_socket(self.run_id, name, self.board_token)}")
        py = self.python if (self.python and h.is_local) else h.python
        secret = tuple(sorted(h.env))
        command = [py if a == "{python}" else a for a in (argv or ["{python}", "-m", module])]
        full = launcher_for(h).argv(h, command, env, self.control_port, frozenset(secret))
        # An elastic world goes on without a node other than the head's: only the head's end ends the run.
        critical = role in CRITICAL_ROLES and (h is self.head or not spec.elastic_learners)
        self.processes.append(ProcessSpec(name, role, rank, h.name, full, env, binds, critical, not h.is_local,
                                          secret, tuple(command), spare=role == Role.LEARNER and h.spare))

    def learner_threads(self, h: HostSpec, ranks: int) -> str:
        """torch threads of each learner rank on `h`: the job's number, or the cores left after the host's other
        processes (one thread each) shared by its ranks: counted here for this machine, on the host for others."""
        if self.spec.topology.learner_threads:
            return str(self.spec.topology.learner_threads)
        others = other_processes(self.spec, h)
        return str(auto_threads(usable_cpus(), others, ranks)) if h.is_local else f"auto:{others}"

    def add_learners(self, ports: PortLayout, rendezvous: str, rank_binds: dict[int, dict[str, str]]) -> None:
        """One torchrun agent per learner node. Static rendezvous: ranks are numbered node after node in node-rank
        order, so the plan knows which node holds each rank (rank 0 binds the weights port) before anything starts.
        rlctl.launch.torchrun is torchrun with its workers forked from the agent (torch imported once, not twice)."""
        spec, node_procs = self.spec, self.spec.learner_node_procs
        for node, h in enumerate(self.learner_nodes):
            argv = ["{python}", "-m", "rlctl.launch.torchrun",
                    "--nproc-per-node", str(node_procs[node]), *self.rendezvous_args(node, h, rendezvous),
                    "--rdzv-id", self.run_id, "--max-restarts", str(spec.topology.learner_max_restarts),
                    "--monitor-interval", "0.02",
                    "--start-method", "fork",
                    "-m", ROLE_MODULES[Role.LEARNER]]
            bind = self.net.bind(h)
            binds = {"weights": f"tcp://{bind}:{ports.weights}", "weights_bulk": f"tcp://{bind}:{ports.weights_bulk}",
                     "rendezvous": f"{bind}:{ports.rendezvous}"}
            first = spec.first_rank_of(node)
            for rank in range(first, first + node_procs[node]):
                binds.update(rank_binds.get(rank, {}))
            self.add(Role.LEARNER, node, h, ROLE_MODULES[Role.LEARNER], binds, argv)

    def rendezvous_args(self, node: int, h: HostSpec, rendezvous: str) -> list[str]:
        """torchrun's rendezvous options for learner node `node`: static (node ranks fixed), or elastic (c10d,
        hosted by the head's agent; rlctl.launch.elastic numbers nodes in plan order, so rank 0 stays on the head
        while it takes part)."""
        nodes = len(self.learner_nodes)
        if not self.spec.elastic_learners:
            return ["--nnodes", str(nodes), "--node-rank", str(node), "--rdzv-backend", "static",
                    "--rdzv-endpoint", rendezvous]
        conf = {"is_host": int(node == 0), "last_call_timeout": ELASTIC_LAST_CALL_S,
                "keep_alive_interval": ELASTIC_KEEP_ALIVE_S, "keep_alive_max_attempt": 3}
        # At most the nodes of the plan but its spares: a spare's agent waits in torchrun's redundancy list until
        # the group is short of a node (it starts after the group first formed, so it never takes the head's place).
        most = sum(1 for n in self.learner_nodes if not n.spare)
        return ["--nnodes", f"{self.spec.topology.min_learner_nodes}:{most}", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", rendezvous, "--local-addr", self.net.addr(h),
                "--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items())]


def make_plan(spec: JobSpec, run_id: str, run_dir: str, base_port: int, python: str | None = None,
              keys_env: str = SECRET_MASK, addresses: dict[str, str] | None = None,
              board_token: str = "", control_address: str = "127.0.0.1") -> LaunchPlan:
    """Render the launch plan. Pure: the same inputs give the same plan.

    `addresses` (host name -> address) says where hosts without an `advertise_address` are reached, e.g. what
    their SSH destinations resolve to (`hosts.ssh_hostnames`); default: the destination itself.
    `control_address`: where Slurm steps reach the supervisor's control socket (an SSH session forwards it instead).
    """
    hosts = placement(spec)
    net = Addressing(hosts, addresses)
    ports = PortLayout(spec, base_port)
    head = next(h for h in hosts if h.learner)
    data = spec.data_path.plan(spec, hosts, ports.data, net.addr, net.bind)
    # Central inference: servers on the learner hosts, each with its request port; collector c asks server c % n.
    servers = [h for h in hosts if h.learner for _ in range(spec.inference.servers_per_host if spec.central_inference
                                                            else 0)]
    # The supervisor's control socket lives on the launching machine: on loopback, where SSH sessions forward it;
    # Slurm steps connect to it (as srun's own steps do to srun) at the address the nodes route to.
    slurm = any(h.slurm_job is not None for h in hosts)
    control = f"tcp://{control_address if slurm else '127.0.0.1'}:{ports.control}"
    endpoints: dict[str, object] = {"control": control, "weights": f"tcp://{net.addr(head)}:{ports.weights}",
                                    "weights_bulk": f"tcp://{net.addr(head)}:{ports.weights_bulk}",
                                    "rendezvous": f"{net.addr(head)}:{ports.rendezvous}", **data.endpoints}
    if servers:
        endpoints[Role.INFERENCE] = [f"tcp://{net.addr(h)}:{p}" for h, p in zip(servers, ports.inference)]
    base_env = {
        "RLCTL_RUN_ID": run_id,
        "RLCTL_JOB": f"{run_dir}/job.toml",
        "RLCTL_CHECKPOINT_DIR": f"{run_dir}/checkpoints",
        "RLCTL_ENDPOINTS": json.dumps(endpoints, sort_keys=True, separators=(",", ":")),
        "RLCTL_CURVE_KEYS": keys_env,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    # Weights reach subscribers on learner rank 0's host through shared memory (rlctl.net.weights), when there are any.
    # (Inference servers, when there are any, are the subscribers in collectors' stead, one on this host.)
    subscribers = {Role.EVALUATOR, Role.INFERENCE} if servers else {Role.EVALUATOR, Role.COLLECTOR}
    board = weight_board_file(run_id, run_dir, board_token) if head.evaluator or head.collectors or servers else None
    # Every other host with more than one subscriber takes each version once, through a relay of its own, which also
    # bundles those processes' control messages: the supervisor's work then grows with hosts, not processes.
    relay_hosts = [h for h in hosts if h is not head and weight_subscribers(h, servers) > 1]
    relays, upstreams = relay_tree(spec, relay_hosts, net, (ports.relay_tree, ports.relay_tree_bulk), run_id, run_dir,
                                   board_token)
    build = ProcessBuilder(spec, hosts, run_id, net, base_env, control, ports.control, board, subscribers, python,
                           board_token, relays, upstreams)
    for p in data.processes:
        build.add(p.role, p.rank, p.host, p.module, p.binds)
    build.add_learners(ports, str(endpoints["rendezvous"]), data.rank_binds)
    for rank, h in enumerate(h for h in hosts if h.evaluator):
        build.add(Role.EVALUATOR, rank, h, ROLE_MODULES[Role.EVALUATOR], {})
    for rank, (h, p) in enumerate(zip(servers, ports.inference)):
        build.add(Role.INFERENCE, rank, h, ROLE_MODULES[Role.INFERENCE], {Role.INFERENCE: f"tcp://{net.bind(h)}:{p}"})
    for rank, h in enumerate(relay_hosts):
        build.add(Role.RELAY, rank, h, ROLE_MODULES[Role.RELAY], relays[h.name][1])
    collector_module = CENTRAL_COLLECTOR_MODULE if servers else ROLE_MODULES[Role.COLLECTOR]
    for rank, h in enumerate(h for h in hosts for _ in range(h.collectors)):
        build.add(Role.COLLECTOR, rank, h, collector_module, {})
    return LaunchPlan(spec.job.name, spec.algorithm.name, run_id, run_dir, "127.0.0.1" if net.all_local else "0.0.0.0",
                      base_port, endpoints, host_rows(hosts, net), build.processes, board_token)


def relay_tree(spec: JobSpec, relay_hosts: list[HostSpec], net: Addressing, ports: tuple[int, int], run_id: str,
               run_dir: str, token: str) -> tuple[dict[str, tuple[str, dict[str, str]]], dict[str, tuple[str, str]]]:
    """Each relay host's board and binds, and (host name -> endpoints, weights and sealed bulk) where the relays
    below the first `network.relay_fanout` take the weights: a relay with relays below it binds `ports` on its own
    host, so no tree where the hosts are all this machine."""
    port, bulk = ports
    relays = {h.name: relay_board_and_binds(run_id, run_dir, token, k) for k, h in enumerate(relay_hosts)}
    upstreams = {}
    for h, parent in zip(relay_hosts, relay_parents(len(relay_hosts), spec.network.relay_fanout)):
        if parent is not None and not net.all_local:
            above = relay_hosts[parent]
            relays[above.name][1].update(weights_tree=f"tcp://{net.bind(above)}:{port}",
                                         weights_tree_bulk=f"tcp://{net.bind(above)}:{bulk}")
            upstreams[h.name] = (f"tcp://{net.addr(above)}:{port}", f"tcp://{net.addr(above)}:{bulk}")
    return relays, upstreams


def relay_parents(relays: int, fanout: int) -> list[int | None]:
    """Where each of `relays` relays takes the weights from: None for learner rank 0 (the first `fanout`), else the
    index of a relay above it. Each sender has at most `fanout` relays below it; depth grows as log_fanout(relays)."""
    return [None if k < fanout else (k - fanout) // fanout for k in range(relays)]


def relay_board_and_binds(run_id: str, run_dir: str, token: str, rank: int) -> tuple[str, dict[str, str]]:
    """Relay `rank`'s weights board, and the Unix sockets it binds for its host's processes (weights, control)."""
    return weight_board_file(run_id, run_dir, token, rank), {
        "weights": f"ipc://{relay_socket(run_id, rank, token)}",
        "control": f"ipc://{relay_socket(run_id, rank, token, 'control')}"}


def weight_subscribers(h: HostSpec, servers: list[HostSpec]) -> int:
    """The processes on `h` that take the policy's weights: its evaluator, and its collectors, or with central
    inference (`servers`: an entry per server) its inference servers in their stead."""
    return int(h.evaluator) + (sum(s is h for s in servers) if servers else h.collectors)


def host_rows(hosts: list[HostSpec], net: Addressing) -> list[dict]:
    """The plan's table of hosts: where each is reached, how, and what runs there."""
    return [{"name": h.name, "destination": h.destination, "local": h.is_local, "address": net.addr(h),
             "via": "local" if h.is_local else "slurm" if h.slurm_job is not None else "ssh",
             "learner": h.learner, "collectors": h.collectors, "replay_shards": h.replay_shards,
             "evaluator": h.evaluator} for h in hosts]


def re_placement(hosts: list[HostSpec], processes: list[ProcessSpec], lost: set[str]) -> dict[str, str]:
    """Where the collectors and evaluator on `lost` hosts (a Slurm node that left the job, an SSH host that stopped
    answering) start again, as process name -> host name. Pure. Each, in plan order, goes to the remote host left
    that runs the fewest of `processes` (the ones that run on; weights relays not counted), hosts without a learner
    first, counting those placed before it; a process with no host left is not in the result, nor is any other role
    (a learner, a replay shard: their ports and data are their host's; a weights relay goes with its host)."""
    # Remote hosts only: a moved process keeps its remote form (its job file and checkpoints under the host's workdir).
    left = [h for h in hosts if not h.is_local and h.name not in lost]
    load = {h.name: 0 for h in left}
    for p in processes:
        if p.host in load and p.role != Role.RELAY:  # a relay (a host's own, mostly idle) takes no place
            load[p.host] += 1
    out: dict[str, str] = {}
    for p in processes:
        if p.host in lost and p.role in MOVABLE_ROLES and left:
            target = min(left, key=lambda h: (h.learner, load[h.name]))
            out[p.name] = target.name
            load[target.name] += 1
    return out


def moved(proc: ProcessSpec, host: HostSpec, address: str, control_port: int = 0) -> ProcessSpec:
    """A collector or evaluator of a lost host, placed on another host (reached at `address`): the same process and
    keys, weights over the network from learner rank 0 and control messages to the supervisor (a host's board and
    relay are for the processes placed there);
    `control_port`: the supervisor's, which an SSH session forwards (a Slurm step connects to it)."""
    env = {k: v for k, v in proc.env.items()
           if k not in ("RLCTL_WEIGHT_BOARD", WEIGHTS_VIA_ENV, WEIGHTS_BULK_VIA_ENV, CONTROL_VIA_ENV)}
    env.update(RLCTL_HOST=host.name, RLCTL_ADVERTISE=address)
    argv = launcher_for(host).argv(host, list(proc.command), env, control_port, frozenset(proc.secret_keys))
    return dataclasses.replace(proc, host=host.name, argv=argv, env=env)


def usable_cpu_ids() -> list[int]:
    """The CPUs this process may run on, in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def usable_cpus() -> int:
    """How many CPUs this process may run on."""
    return len(usable_cpu_ids())


def other_processes(spec: JobSpec, h: HostSpec) -> int:
    """The rlctl processes on host `h` that run while its learner ranks update (one torch thread each): a synchronous
    algorithm's collectors wait for the next weights meanwhile, so they leave the learner their cores (a PPO update
    on MinAtar with 2 threads instead of 1: 145 ms instead of 192 here)."""
    servers = spec.inference.servers_per_host if spec.central_inference and h.learner else 0
    collectors = 0 if spec.algorithm_entry.synchronous else h.collectors
    return collectors + h.replay_shards + int(h.evaluator) + servers


def auto_threads(cpus: int, others: int, ranks: int) -> int:
    """torch threads per learner rank: the CPUs left after `others` single-threaded processes, over `ranks`."""
    return max(1, (cpus - others) // max(1, ranks))


def torch_threads(value: str | None, local_ranks: int = 1, cpus: int | None = None) -> int:
    """A process's RLCTL_TORCH_THREADS ("N", or "auto:OTHERS" to count on this host, of `cpus` or its usable CPUs)
    as a thread count."""
    value = value or "1"
    if value.startswith("auto:") and value[5:].isdigit():
        return auto_threads(usable_cpus() if cpus is None else cpus, int(value[5:]), local_ranks)
    return int(value) if value.isdigit() and int(value) > 0 else 1


def pinned_cores(value: str | None, role: str, local_rank: int, usable: list[int]) -> list[list[int]] | None:
    """The CPU sets of `topology.learner_cores = "dedicated"` for one process, out of the host's `usable` CPUs.

    `value` is the plan's RLCTL_LEARNER_CORES, "RANKS:THREADS" (THREADS as in RLCTL_TORCH_THREADS), given to every
    process on a learner host. Learner rank i takes THREADS cores of its own, usable[i*THREADS:(i+1)*THREADS]; the
    host's other processes share the rest. One set per local learner rank for role "learner" with local_rank < 0
    (how the plan shows a node's ranks), else one set. None: nothing pinned (too few cores, or a malformed value).
    """
    ranks, colon, threads_value = (value or "").partition(":")
    if not colon or not ranks.isdigit() or int(ranks) < 1:
        return None
    ranks_n = int(ranks)
    threads = torch_threads(threads_value, ranks_n, len(usable))
    reserved = ranks_n * threads
    if reserved >= len(usable):
        return None
    if role != Role.LEARNER:
        return [usable[reserved:]]
    sets = [usable[i * threads:(i + 1) * threads] for i in range(ranks_n)]
    return sets if local_rank < 0 else [sets[local_rank]] if local_rank < ranks_n else None


def core_ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (as taskset and /proc/self/status write CPU lists)."""
    spans: list[list[int]] = []
    for c in sorted(cpus):
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def local_python() -> str:
    """The interpreter running rlctl (local processes use the same one)."""
    return sys.executable
