"""The launch plan as `rlctl plan` prints it: every process with its host, threads, cores, ports and command, then
the environment every process shares."""

from __future__ import annotations

import shlex

from rlctl.launch.plan import LaunchPlan, ProcessSpec, core_ranges, pinned_cores, usable_cpu_ids
from rlctl.job.spec import JobSpec
from rlctl.role_names import Role

OWN_ENV = ("RLCTL_ROLE", "RLCTL_RANK", "RLCTL_HOST", "RLCTL_BINDS", "RLCTL_TORCH_THREADS", "RLCTL_LEARNER_CORES")


def plan_text(p: LaunchPlan, spec: JobSpec) -> str:
    """The plan, one line per process and its command under it."""
    out = [f"job {p.job} ({p.algorithm})  run dir {p.run_dir}  binds {p.bind_host}  ports {', '.join(map(str, p.ports()))}",
           f"hosts: {', '.join(h['name'] + reached(h, spec) for h in p.hosts)}", ""]
    for x in p.processes:
        binds = "  ".join(f"{k}={v}" for k, v in x.binds.items())
        threads = x.env.get("RLCTL_TORCH_THREADS", "1")
        if threads.startswith("auto:"):
            threads = f"the cores left there after {threads[5:]} other processes"
        out.append(f"{x.name}  role={x.role} rank={x.rank} host={x.host} torch threads={threads}"
                   + cores_text(x, p.hosts) + (f"  binds {binds}" if binds else ""))
        out.append("  $ " + shlex.join(x.argv))
    out.append("")
    out.append(f"environment of every process ({', '.join(OWN_ENV)} differ per process):")
    for k, v in p.to_dict()["processes"][0]["env"].items():
        if k not in OWN_ENV:
            out.append(f"  {k}={v}")
    return "\n".join(out)


def reached(host: dict, spec: JobSpec) -> str:
    """How a host is reached: nothing for this machine, else ssh or srun and where."""
    if host["local"]:
        return ""
    slurm = next((h.slurm_job for h in spec.hosts if h.name == host["name"]), None)
    return f" (srun, job {slurm})" if slurm else f" (ssh {host['destination']})"


def cores_text(proc: ProcessSpec, hosts: list[dict]) -> str:
    """`topology.learner_cores = "dedicated"` in a plan line: the cores themselves on this machine, the rule
    elsewhere."""
    value = proc.env.get("RLCTL_LEARNER_CORES")
    if not value:
        return ""
    if not next(h["local"] for h in hosts if h["name"] == proc.host):
        threads = value.partition(":")[2]
        mine = "one per torch thread" if ":" in threads else threads
        return "  cores=" + (f"{mine} of its own" if proc.role == Role.LEARNER else "those the learner ranks leave")
    sets = pinned_cores(value, proc.role, -1 if proc.role == Role.LEARNER else 0, usable_cpu_ids())
    return "  cores=" + (" | ".join(map(core_ranges, sets)) if sets else "all (too few to dedicate)")
