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

from rlctl.hosts import SECRET_ENV, control_socket, launcher_for
from rlctl.remote import port_free, remote_checkpoint_dir, remote_run_dir, weight_board_file
from rlctl.spec import AUTO_PORTS, SECRET_MASK, HostSpec, JobSpec

ROLE_MODULES = {
    "learner": "rlctl.roles.learner",
    "replay": "rlctl.roles.replay",
    "collector": "rlctl.roles.collector",
    "evaluator": "rlctl.roles.evaluator",
    "inference": "rlctl.roles.inference",
}
# With central inference collectors run this module instead: it steps envs only and imports no torch.
CENTRAL_COLLECTOR_MODULE = "rlctl.roles.central_collector"
# Roles the supervisor does not restart: learner ranks are restarted by torchrun (topology.learner_max_restarts),
# and the end of torchrun ends the run. The others are restarted up to topology.max_restarts within a window.
CRITICAL_ROLES = frozenset({"learner"})
# Roles that write checkpoints (latest.pt and ckpt-N.pt; best.pt): on a remote host they are fetched at the end.
CHECKPOINT_ROLES = frozenset({"learner", "evaluator"})
LOCAL_HOST = HostSpec(name="localhost", learner=True, evaluator=True)


@dataclass(frozen=True)
class ProcessSpec:
    """Blueprint of one process ("as a class is to an object"): the running one is a supervise.ProcessHandle."""

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
        return sorted({int(ep.rsplit(":", 1)[1]) for p in self.processes for ep in p.binds.values()})


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


def choose_base_port(spec: JobSpec, host: str = "127.0.0.1") -> int:
    """The job's base port: the configured one, else the first range that is free now, from the per-job default."""
    if spec.network.base_port:
        return spec.network.base_port
    need, bases = ports_needed(spec), auto_bases(spec)
    first = bases.index(default_base_port(spec))
    for i in range(len(bases)):
        base = bases[(first + i) % len(bases)]
        if all(port_free(host, base + k) for k in range(need)):
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
        fewer = max(cpus, 1 if spec.algo.uses_replay else spec.learner_ranks)
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
    algo = spec.algorithm
    per_update = getattr(algo, "rollouts_per_update", None)
    if per_update is None or spec.algo.synchronous:
        return []
    # While a collector takes one rollout, its rank receives one from each of its collectors and so makes this many
    # updates: the lag a rollout arrives with, about.
    per_rank = -(-spec.collector_count // spec.learner_ranks)
    lag = per_rank / per_update(spec.env.envs_per_collector)
    if lag <= algo.max_policy_lag:
        return []
    return [f"{per_rank} collectors per learner rank and {per_update(spec.env.envs_per_collector)} rollouts per update: "
            f"rollouts arrive about {lag:.0f} versions old, past algorithm.max_policy_lag = {algo.max_policy_lag}, "
            f"so most would be dropped; raise max_policy_lag to {int(lag + 0.999) + 2} or algorithm.batch_steps"]


def make_plan(spec: JobSpec, run_id: str, run_dir: str, base_port: int, python: str | None = None,
              keys_env: str = SECRET_MASK, addresses: dict[str, str] | None = None,
              board_token: str = "", control_address: str = "127.0.0.1") -> LaunchPlan:
    """Render the launch plan. Pure: the same inputs give the same plan.

    `addresses` (host name -> address) says where hosts without an `advertise_address` are reached, e.g. what
    their SSH destinations resolve to (`hosts.ssh_hostnames`); default: the destination itself.
    `control_address`: where Slurm steps reach the supervisor's control socket (an SSH session forwards it instead).
    """
    hosts = placement(spec)
    all_local = all(h.is_local for h in hosts)
    bind_host = "127.0.0.1" if all_local else "0.0.0.0"

    def addr(h: HostSpec) -> str:
        if all_local:
            return "127.0.0.1"
        return h.advertise_address or (addresses or {}).get(h.name) or h.destination

    head = next(h for h in hosts if h.learner)
    shards = [h for h in hosts for _ in range(h.replay_shards)]
    port = iter(range(base_port, base_port + ports_needed(spec)))
    control_port, weights_port, rdzv_port = next(port), next(port), next(port)
    replay_eps = []
    for h in shards:
        exp, smp = next(port), next(port)
        replay_eps.append({"host": h.name, "experience": f"tcp://{addr(h)}:{exp}", "sample": f"tcp://{addr(h)}:{smp}",
                           "bind_experience": f"tcp://{_bind(h, all_local)}:{exp}",
                           "bind_sample": f"tcp://{_bind(h, all_local)}:{smp}"})
    # Rollout algorithms: one PULL socket per learner rank; collector c sends to rank c % ranks.
    learner_nodes = [h for h in hosts if h.learner]
    rollout_ports = [] if spec.algo.uses_replay else [next(port) for _ in range(spec.learner_ranks)]
    node_procs = spec.learner_node_procs
    # Central inference: servers on the learner hosts, each with its request port; collector c asks server c % n.
    servers = [h for h in learner_nodes for _ in range(spec.inference.servers_per_host if spec.central_inference else 0)]
    inference_ports = [next(port) for _ in servers]
    # The supervisor's control socket lives on the launching machine: on loopback, where SSH sessions forward it;
    # Slurm steps connect to it (as srun's own steps do to srun) at the address the nodes route to.
    slurm = any(h.slurm_job is not None for h in hosts)
    control = f"tcp://{control_address if slurm else '127.0.0.1'}:{control_port}"
    endpoints: dict[str, object] = {
        "control": control,
        "weights": f"tcp://{addr(head)}:{weights_port}",
        "rendezvous": f"{addr(head)}:{rdzv_port}",
        "replay": [{"experience": r["experience"], "sample": r["sample"]} for r in replay_eps],
    }
    if servers:
        endpoints["inference"] = [f"tcp://{addr(h)}:{p}" for h, p in zip(servers, inference_ports)]
    if rollout_ports:
        endpoints["rollouts"] = [f"tcp://{addr(learner_nodes[spec.learner_node_of(r)])}:{p}"
                                 for r, p in enumerate(rollout_ports)]
    base_env = {
        "RLCTL_RUN_ID": run_id,
        "RLCTL_JOB": f"{run_dir}/job.toml",
        "RLCTL_CHECKPOINT_DIR": f"{run_dir}/checkpoints",
        "RLCTL_ENDPOINTS": json.dumps(endpoints, sort_keys=True, separators=(",", ":")),
        "RLCTL_CURVE_KEYS": keys_env,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    procs: list[ProcessSpec] = []
    # Weights reach subscribers on learner rank 0's host through shared memory (rlctl.weights), when there are any.
    # (Inference servers, when there are any, are the subscribers in collectors' stead, one on this host.)
    subscribers = {"evaluator", "inference"} if servers else {"evaluator", "collector"}
    board = weight_board_file(run_id, run_dir, board_token) if head.evaluator or head.collectors or servers else None

    def add(role: str, rank: int, h: HostSpec, argv: list[str], binds: dict[str, str]) -> None:
        name = f"{role}-{rank}"
        env = {**base_env, **h.env, "RLCTL_ROLE": role, "RLCTL_RANK": str(rank), "RLCTL_HOST": h.name,
               "RLCTL_BINDS": json.dumps(binds, sort_keys=True, separators=(",", ":")),
               "RLCTL_TORCH_THREADS": learner_threads(h, node_procs[rank]) if role == "learner" else "1"}
        if spec.topology.learner_cores == "dedicated" and h.learner:
            node = next(i for i, n in enumerate(learner_nodes) if n is h)
            env["RLCTL_LEARNER_CORES"] = f"{node_procs[node]}:{learner_threads(h, node_procs[node])}"
        if board and h is head and (role == "learner" or role in subscribers):
            env["RLCTL_WEIGHT_BOARD"] = board
        # Learners pick the network interface for gloo/nccl from it; all-local jobs get loopback (gloo would
        # otherwise listen on whatever the host name resolves to).
        env["RLCTL_ADVERTISE"] = addr(h)
        if not h.is_local:
            # The job file arrives on the session's stdin; the run's files live under the host's workdir.
            remote_dir = remote_run_dir(run_id)
            env.update(RLCTL_JOB=f"{remote_dir}/job.toml", RLCTL_CHECKPOINT_DIR=remote_checkpoint_dir(run_id),
                       RLCTL_CONTROL=control if h.slurm_job is not None
                       else f"ipc://{control_socket(run_id, name, board_token)}")
        py = python if (python and h.is_local) else h.python
        secret = tuple(sorted(h.env))
        command = [py if a == "{python}" else a for a in argv]
        full = launcher_for(h).argv(h, command, env, control_port, frozenset(secret))
        procs.append(ProcessSpec(name, role, rank, h.name, full, env, binds, role in CRITICAL_ROLES, not h.is_local,
                                 secret, tuple(command)))

    def learner_threads(h: HostSpec, ranks: int) -> str:
        """torch threads of each learner rank on `h`: the job's number, or the cores left after the host's other
        processes (one thread each) shared by its ranks: counted here for this machine, on the host for others."""
        if spec.topology.learner_threads:
            return str(spec.topology.learner_threads)
        others = other_processes(spec, h)
        return str(auto_threads(usable_cpus(), others, ranks)) if h.is_local else f"auto:{others}"

    for rank, (h, r) in enumerate(zip(shards, replay_eps)):
        add("replay", rank, h, ["{python}", "-m", ROLE_MODULES["replay"]],
            {"experience": r["bind_experience"], "sample": r["bind_sample"]})
    for node, h in enumerate(learner_nodes):
        # Static rendezvous: ranks are numbered node after node in node-rank order, so the plan knows which node
        # holds each rank (rank 0 binds the weights port, rank r its rollout port) before anything starts.
        # rlctl.torchrun is torchrun with its workers forked from the agent (torch imported once, not twice).
        argv = ["{python}", "-m", "rlctl.torchrun",
                "--nnodes", str(len(learner_nodes)), "--nproc-per-node", str(node_procs[node]),
                "--node-rank", str(node), "--rdzv-backend", "static", "--rdzv-endpoint", str(endpoints["rendezvous"]),
                "--rdzv-id", run_id, "--max-restarts", str(spec.topology.learner_max_restarts),
                "--monitor-interval", "0.02",
                "--start-method", "fork",
                "-m", ROLE_MODULES["learner"]]
        binds = {"weights": f"tcp://{_bind(h, all_local)}:{weights_port}",
                 "rendezvous": f"{_bind(h, all_local)}:{rdzv_port}"}
        first = sum(node_procs[:node])
        for rank in range(first, first + node_procs[node]) if rollout_ports else ():
            binds[f"rollouts-{rank}"] = f"tcp://{_bind(h, all_local)}:{rollout_ports[rank]}"
        add("learner", node, h, argv, binds)
    evaluators = [h for h in hosts if h.evaluator]
    for rank, h in enumerate(evaluators):
        add("evaluator", rank, h, ["{python}", "-m", ROLE_MODULES["evaluator"]], {})
    for rank, (h, p) in enumerate(zip(servers, inference_ports)):
        add("inference", rank, h, ["{python}", "-m", ROLE_MODULES["inference"]],
            {"inference": f"tcp://{_bind(h, all_local)}:{p}"})
    collector_module = CENTRAL_COLLECTOR_MODULE if servers else ROLE_MODULES["collector"]
    for rank, h in enumerate(h for h in hosts for _ in range(h.collectors)):
        add("collector", rank, h, ["{python}", "-m", collector_module], {})

    host_rows = [{"name": h.name, "destination": h.destination, "local": h.is_local, "address": addr(h),
                  "via": "local" if h.is_local else "slurm" if h.slurm_job is not None else "ssh",
                  "learner": h.learner, "collectors": h.collectors, "replay_shards": h.replay_shards,
                  "evaluator": h.evaluator} for h in hosts]
    return LaunchPlan(spec.job.name, spec.algorithm.name, run_id, run_dir, bind_host, base_port,
                      endpoints, host_rows, procs, board_token)


def moved(proc: ProcessSpec, host: HostSpec, address: str) -> ProcessSpec:
    """A collector of a lost Slurm node, placed on another node of the allocation (reached at `address`): the same
    process and keys, weights over the network (the head's shared-memory board is for its own host)."""
    env = {k: v for k, v in proc.env.items() if k != "RLCTL_WEIGHT_BOARD"}
    env.update(RLCTL_HOST=host.name, RLCTL_ADVERTISE=address)
    argv = launcher_for(host).argv(host, list(proc.command), env, 0, frozenset(proc.secret_keys))
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
    collectors = 0 if spec.algo.synchronous else h.collectors
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
    if role != "learner":
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


def _bind(h: HostSpec, all_local: bool) -> str:
    return "127.0.0.1" if all_local else (h.advertise_address or "0.0.0.0")


def local_python() -> str:
    """The interpreter running rlctl (local processes use the same one)."""
    return sys.executable
