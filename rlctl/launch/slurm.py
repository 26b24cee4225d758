"""Slurm: the allocation a run is inside, its nodes as the job's hosts, and the batch script `--sbatch` submits.

Everything Slurm says (node lists, node addresses, job ids) is parsed here into typed values before anything
else sees it: `scontrol`'s output is as hostile as a socket's bytes. Imports nothing heavy.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
from dataclasses import dataclass

from rlctl.job.load import JobFileError, validate_job
from rlctl.job.resolved import resolved_dict
from rlctl.job.spec import JobSpec

NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # HostSpec.name's pattern
ADDRESS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,253}")
COMMAND_TIMEOUT_S = 30.0
LIVE_JOB_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED"})  # squeue's %T of a job whose steps may run


class SlurmError(Exception):
    """Slurm cannot give what the run needs (no allocation, a command failed, an answer that does not parse)."""


@dataclass(frozen=True)
class Allocation:
    """The Slurm job a run is inside: its id, its nodes in order, and the address each node is reached at."""

    job_id: int
    nodes: tuple[str, ...]
    addresses: dict[str, str]


def slurm_command(*argv: str, timeout: float = COMMAND_TIMEOUT_S, stdin: str | None = None) -> str:
    """Run a Slurm client command (`stdin`: its input); its stdout, or SlurmError with its own words."""
    try:
        proc = subprocess.run(list(argv), input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: Slurm's client commands must be on PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} gave no answer within {timeout:g}s") from None
    if proc.returncode != 0:
        words = proc.stderr.strip().splitlines()
        raise SlurmError(f"{' '.join(argv[:2])}: {words[-1] if words else f'exit code {proc.returncode}'}")
    return proc.stdout


def parse_job_id(text: str) -> int:
    """A Slurm job id (`sbatch --parsable` prints "ID" or "ID;cluster")."""
    match = re.fullmatch(r"(\d{1,10})(;[A-Za-z0-9_.-]+)?", text.strip())
    if match is None or not 0 < int(match[1]) < 1 << 32:
        raise SlurmError(f"not a Slurm job id: {text.strip()[:40]!r}")
    return int(match[1])


def parse_hostnames(text: str) -> tuple[str, ...]:
    """`scontrol show hostnames` output: one node name per line, each a valid host name."""
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    bad = [n for n in names if not NODE_NAME_RE.fullmatch(n)]
    if bad or not names:
        raise SlurmError(f"unexpected node names from scontrol: {bad[:3] or 'none'}")
    return names


def parse_node_addresses(text: str) -> dict[str, str]:
    """`scontrol -o show node` output: node name -> NodeAddr (where the other nodes reach it)."""
    out = {}
    for line in text.splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        name, addr = fields.get("NodeName", ""), fields.get("NodeAddr", "")
        if NODE_NAME_RE.fullmatch(name) and ADDRESS_RE.fullmatch(addr):
            out[name] = addr
    return out


def allocation_from_env(env: dict[str, str] | None = None) -> Allocation:
    """The allocation this process is inside (SLURM_JOB_ID and SLURM_JOB_NODELIST), nodes expanded by scontrol."""
    env = os.environ if env is None else env
    job, nodelist = env.get("SLURM_JOB_ID", ""), env.get("SLURM_JOB_NODELIST", "")
    if not job or not nodelist:
        raise SlurmError('cluster.scheduler = "slurm": not inside a Slurm allocation (SLURM_JOB_ID and '
                         "SLURM_JOB_NODELIST are unset); run inside `salloc`, or submit with `rlctl run --sbatch`")
    job_id = parse_job_id(job)
    nodes = parse_hostnames(slurm_command("scontrol", "show", "hostnames", nodelist))
    addresses = parse_node_addresses(slurm_command("scontrol", "-o", "show", "node", nodelist))
    return Allocation(job_id, nodes, {n: addresses.get(n, n) for n in nodes})


def job_nodes(job_id: int) -> tuple[str, ...] | None:
    """The nodes the job holds now (a node that failed leaves a `--no-kill` job's list); None when the job is gone
    or going (cancelled, completing, revoked) or Slurm does not answer."""
    try:
        state, _, nodelist = slurm_command("squeue", "-h", "-j", str(job_id), "-o", "%T|%N").strip().partition("|")
        if state not in LIVE_JOB_STATES or not nodelist:
            return None
        return parse_hostnames(slurm_command("scontrol", "show", "hostnames", nodelist))
    except SlurmError:
        return None


def route_address(peer: str) -> str:
    """This machine's address on the route to `peer` (a UDP socket's connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in peer else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer, 9))
            return s.getsockname()[0]
    except OSError as exc:
        raise SlurmError(f"no route from this machine to node address {peer}: {exc}") from None


def with_allocation(spec: JobSpec, alloc: Allocation, python: str, workdir: str) -> JobSpec:
    """The job with the allocation's nodes as its hosts, each reached by srun, roles placed by `[cluster]`."""
    cluster = spec.cluster
    count = cluster.node_count or len(alloc.nodes)
    if count > len(alloc.nodes):
        raise SlurmError(f"cluster.node_count = {count}, but allocation {alloc.job_id} has {len(alloc.nodes)} nodes")
    nodes = alloc.nodes[:count]
    unknown = sorted(set(cluster.nodes) - set(nodes))
    if unknown:
        raise SlurmError(f"cluster.nodes.{unknown[0]}: no such node in allocation {alloc.job_id} "
                         f"({', '.join(nodes)})")
    def chosen(node: str, key: str, default):
        value = getattr(cluster.nodes[node], key) if node in cluster.nodes else None
        return default if value is None else value

    learners = {n for i, n in enumerate(nodes) if chosen(n, "learner", i < cluster.learner_nodes)}
    evaluator = next((n for n in nodes if chosen(n, "evaluator", False)), None) or {
        "head": next((n for n in nodes if n in learners), None), "last": nodes[-1], "none": None}[cluster.evaluator]
    hosts = []
    for n in nodes:
        learner = n in learners
        shards = cluster.replay_shards_per_learner_node
        shards = (spec.topology.learner_procs if shards is None else shards) if spec.data_path.shard_role else 0
        hosts.append({
            "name": n, "address": n, "advertise_address": alloc.addresses.get(n, n), "python": cluster.python or python,
            "workdir": cluster.workdir or workdir, "slurm_job": alloc.job_id, "learner": learner,
            "collectors": chosen(n, "collectors", cluster.learner_node_collectors if learner
                                 else cluster.collectors_per_node),
            "replay_shards": chosen(n, "replay_shards", shards if learner else 0),
            "evaluator": n == evaluator,
        })
    data = resolved_dict(spec)
    data["hosts"] = hosts
    try:
        return validate_job(data, "the job placed on the allocation")
    except JobFileError as exc:
        raise SlurmError("; ".join(f"{k}: {r}" for k, r in exc.problems)) from None


def sbatch_script(run_dir: str, job: str, python: str, workdir: str, nodes: int,
                  options: dict[str, str], signal_grace_s: int = 0, requeue: bool = False) -> str:
    """The batch script `rlctl run --sbatch` submits: the allocation's first node runs the supervisor, whose
    processes are steps of the same job. `--no-kill`: a node lost mid-run ends its steps, not the job. With
    `signal_grace_s`, Slurm sends the supervisor (the batch shell, `B:`) SIGUSR1 that long before the time limit;
    `requeue` lets the job be requeued (each start appends to the same output file)."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={shlex.quote('rlctl-' + job)}", f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1", "#SBATCH --no-kill", f"#SBATCH --chdir={shlex.quote(workdir)}",
             f"#SBATCH --output={shlex.quote(run_dir + '/slurm-%j.out')}"]
    if signal_grace_s and "signal" not in options:
        lines.append(f"#SBATCH --signal=B:USR1@{signal_grace_s}")
    if "requeue" not in options and "no-requeue" not in options:
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"] if requeue else ["#SBATCH --no-requeue"]
    lines += [f"#SBATCH --{key}={shlex.quote(value)}" for key, value in sorted(options.items())]
    lines += ["", "# The keys of the job's sockets are made by the supervisor below, never by this script.",
              f"exec {shlex.quote(python)} -m rlctl run --slurm-run-dir {shlex.quote(run_dir)}", ""]
    return "\n".join(lines)


def submit(script: str) -> int:
    """Submit a batch script (on stdin, so its text is in no command line); the job id."""
    return parse_job_id(slurm_command("sbatch", "--parsable", stdin=script))
