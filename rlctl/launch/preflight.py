"""Before anything starts: every remote host of a plan checked at once, each failure named with its host and cause.

A host passes when SSH (or, on a Slurm node, srun) reaches it, its Python runs rlctl at this version (and has
torch where a torch role runs), and the ports the plan binds there are free. Nothing is started anywhere, so a
failed check leaves nothing to clean up. One exception: a host that SSH cannot reach and that runs only an elastic
world's learner node (not the head's) is warned of, not failed: the run starts without it, and the node joins once the
host answers.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import rlctl
from rlctl.launch.hosts import last_json_line, on_hosts, private_dir, ssh_failure
from rlctl.launch.plan import LaunchPlan, placement, tcp_port
from rlctl.job.spec import HostSpec, JobSpec
from rlctl.role_names import Role

PREFLIGHT_TIMEOUT_S = 30.0
TORCH_ROLES = frozenset({Role.LEARNER, Role.COLLECTOR, Role.EVALUATOR, Role.INFERENCE, Role.RELAY})


def host_ports(plan: LaunchPlan, host: str) -> list[int]:
    """Ports the plan binds on one host."""
    return sorted({port for p in plan.processes if p.host == host for ep in p.binds.values()
                   if (port := tcp_port(ep)) is not None})


def diagnose(h: HostSpec, proc: subprocess.CompletedProcess, needs_torch: bool) -> str | None:
    """What is wrong with one host, from its `rlctl.launch.remote check` run; None when it is fit."""
    where = f"host {h.name} ({h.destination}{':' + str(h.port) if h.port else ''})"
    err = proc.stderr.decode("utf-8", "replace")
    if h.slurm_job is not None:
        where = f"node {h.name} (Slurm job {h.slurm_job})"
        if proc.returncode != 0 and "srun: error" in err:
            return f"{where}: srun could not start a step there: {ssh_failure(proc)}"
    if proc.returncode == 255:
        return f"{where}: cannot connect over SSH: {ssh_failure(proc)}"
    if proc.returncode == 124:
        return f"{where}: {ssh_failure(proc)}"
    if proc.returncode == 127 or ("not found" in err and "rlctl" not in err):
        return f"{where}: python {h.python!r} not found there: {ssh_failure(proc)}"
    if "No module named" in err:
        return f"{where}: rlctl is not installed for {h.python} there ({ssh_failure(proc)}); install rlctl {rlctl.__version__}"
    facts = last_json_line(proc.stdout)
    if proc.returncode != 0 or facts is None:
        return f"{where}: check failed: {ssh_failure(proc)}"
    if facts.get("rlctl") != rlctl.__version__:
        return f"{where}: rlctl {facts.get('rlctl')} there, {rlctl.__version__} here; install the same version"
    if needs_torch and not facts.get("torch"):
        return f"{where}: torch is not importable by {h.python} there"
    if facts.get("private_error"):
        return f"{where}: {facts['private_error']}"
    if facts.get("busy"):
        return (f"{where}: ports {', '.join(map(str, facts['busy']))} are in use there; set network.base_port "
                "to a free range")
    return None


@dataclass(frozen=True)
class HostProblem:
    """Why one host is not fit: `unreachable` when SSH could not connect to it (or timed out)."""

    host: str
    text: str
    unreachable: bool


def joins_later(spec: JobSpec, plan: LaunchPlan) -> set[str]:
    """Hosts that run only an elastic world's learner node other than the head's: the run may start without one
    that is unreachable (its node joins the learner group once the host answers: supervise.host_loss)."""
    if not spec.elastic_learners:
        return set()
    runs: dict[str, set] = {}
    for p in plan.processes:
        runs.setdefault(p.host, set()).add((p.role, p.critical))
    return {host for host, what in runs.items() if what == {(Role.LEARNER, False)}}


def check_hosts(spec: JobSpec, plan: LaunchPlan, timeout: float = PREFLIGHT_TIMEOUT_S) -> list[HostProblem]:
    """Check every remote host in parallel; one problem per failing host (empty when all are fit)."""
    remote = [h for h in placement(spec) if not h.is_local]
    # Collectors of central inference load no torch: a host of only those needs none.
    roles = {h.name: {p.role for p in plan.processes if p.host == h.name
                      and not (p.role == Role.COLLECTOR and spec.central_inference)} for h in remote}

    def args(h: HostSpec) -> list[str]:
        bind = h.advertise_address or "0.0.0.0"
        private = ["--private-dir", private_dir(plan.board_token)] if plan.board_token else []
        return ["check", "--ports", ",".join(map(str, host_ports(plan, h.name))), "--bind", bind, *private]

    results = on_hosts(remote, args, timeout=timeout)
    problems = []
    for h in remote:
        text = diagnose(h, results[h.name], bool(roles[h.name] & TORCH_ROLES))
        if text:
            unreachable = results[h.name].returncode in (124, 255) and h.slurm_job is None
            problems.append(HostProblem(h.name, text, unreachable))
    return problems
