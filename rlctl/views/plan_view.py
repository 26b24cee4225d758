"""The launch plan as `rlctl plan` prints it: a few lines on the job, its hosts and ports, then a table of every
process (role, rank, host, threads, cores, ports, what it runs); with `--verbose`, each process's full command and
the environment every process shares."""

from __future__ import annotations

import os
import shlex
import textwrap
from typing import TYPE_CHECKING

from rlctl.launch.plan import LaunchPlan, ProcessSpec, core_ranges, pinned_cores, usable_cpu_ids
from rlctl.job.spec import JobSpec
from rlctl.role_names import Role

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rich.console import RenderableType

OWN_ENV = ("RLCTL_ROLE", "RLCTL_RANK", "RLCTL_HOST", "RLCTL_BINDS", "RLCTL_TORCH_THREADS", "RLCTL_LEARNER_CORES")
PLAN_COLUMNS = ["process", "role", "rank", "host", "threads", "cores", "ports", "runs"]
# At narrow widths these give way, in this order (the process name is its role and rank).
PLAN_DROP = ["process", "threads", "cores"]
GAP = "  "


def plan_view(p: LaunchPlan, spec: JobSpec, verbose: bool = False) -> "RenderableType":
    """The plan for a terminal: lines that wrap between words and a table whose cells wrap between words (no value
    is split across lines); without `verbose`, a pointer to verbose_lines."""
    return _PlanView(p, spec, verbose)


class _PlanView:
    def __init__(self, p: LaunchPlan, spec: JobSpec, verbose: bool):
        self.p, self.spec, self.verbose = p, spec, verbose

    def __rich_console__(self, console, options):
        from rich.text import Text

        p, width = self.p, options.max_width
        yield Text(f"job {p.job} ({p.algorithm})")
        # The run id and its folder apart: a long path alone on its line, nothing after it.
        yield Text(f"run {p.run_id} in")
        yield Text(f"  {os.path.dirname(p.run_dir) or '.'}")
        yield Text(f"binds {p.bind_host}, ports {', '.join(map(str, p.ports()))}")
        yield Text(f"hosts: {', '.join(h['name'] + reached(h, self.spec) for h in p.hosts)}")
        yield Text("")
        yield process_table(p, width)
        if not self.verbose:
            yield Text("")
            yield Text("rlctl plan --verbose: every command and the environment; --json: all of it", style="dim")


def process_table(p: LaunchPlan, width: int) -> "RenderableType":
    """One row per process; columns give way by PLAN_DROP until the longest word of each fits, and cells wrap
    between words."""
    from rich.console import Group
    from rich.text import Text

    rows = [[x.name, f"{x.role} (spare)" if x.spare else x.role, str(x.rank), x.host, threads_text(x), cores_text(x, p.hosts), ports_text(x),
             runs_text(x)] for x in p.processes]
    keep = [i for i, name in enumerate(PLAN_COLUMNS) if name != "cores" or any(r[i] for r in rows)]
    for name in [None, *PLAN_DROP]:
        if name is not None and PLAN_COLUMNS.index(name) in keep:
            keep.remove(PLAN_COLUMNS.index(name))
        if _line_width([_longest_word([PLAN_COLUMNS[i], *(r[i] for r in rows)]) for i in keep]) <= width:
            break
    columns = [PLAN_COLUMNS[i] for i in keep]
    cells = [[r[i] or "-" for i in keep] for r in rows]
    widths = _fitted_widths(columns, cells, width)
    lines = [Text(_row_line(columns, widths), style="bold"), Text("─" * min(width, _line_width(widths)))]
    for row in cells:
        wrapped = [textwrap.wrap(c, w, break_long_words=False, break_on_hyphens=False) or [""]
                   for c, w in zip(row, widths)]
        for k in range(max(map(len, wrapped))):
            lines.append(Text(_row_line([w[k] if k < len(w) else "" for w in wrapped], widths)))
    return Group(*lines)


def _longest_word(cells: list[str]) -> int:
    return max((len(w) for c in cells for w in c.split()), default=1)


def _line_width(widths: list[int]) -> int:
    return sum(widths) + len(GAP) * (len(widths) - 1)


def _fitted_widths(columns: list[str], cells: list[list[str]], width: int) -> list[int]:
    """Each column as wide as its widest cell, the widest narrowed (no lower than its longest word) until the line
    fits."""
    widths = [max(len(c) for c in [name, *(r[i] for r in cells)]) for i, name in enumerate(columns)]
    least = [_longest_word([name, *(r[i] for r in cells)]) for i, name in enumerate(columns)]
    while _line_width(widths) > width:
        i = max(range(len(widths)), key=lambda j: widths[j] - least[j])
        if widths[i] <= least[i]:
            break
        widths[i] -= 1
    return widths


def _row_line(cells: list[str], widths: list[int]) -> str:
    return GAP.join(f"{c:<{w}}" for c, w in zip(cells, widths)).rstrip()


def verbose_lines(p: LaunchPlan) -> list[str]:
    """Each process's full command, then the environment every process shares (`rlctl plan --verbose` prints them
    whole, one a line, for copying)."""
    out = [""]
    for x in p.processes:
        out.append(f"{x.name} on {x.host}:")
        out.append("  $ " + shlex.join(x.argv))
    out.append("")
    out.append(f"environment of every process ({', '.join(OWN_ENV)} differ per process):")
    for k, v in p.to_dict()["processes"][0]["env"].items():
        if k not in OWN_ENV:
            out.append(f"  {k}={v}")
    return out


def threads_text(proc: ProcessSpec) -> str:
    """Torch threads: a number, or what the host's cores leave ("auto: cores - 4")."""
    threads = proc.env.get("RLCTL_TORCH_THREADS", "1")
    return f"auto: cores - {threads[5:]}" if threads.startswith("auto:") else threads


def ports_text(proc: ProcessSpec) -> str:
    """The ports a process binds, each with its name ("weights:41001 rendezvous:41002"; a Unix socket by its path)."""
    return " ".join(f"{name}:{address[len('ipc://'):] if address.startswith('ipc://') else address.rpartition(':')[2]}"
                    for name, address in proc.binds.items())


def runs_text(proc: ProcessSpec) -> str:
    """What a process runs: its module, and what starts it where that is not plain python (torchrun, ssh, srun)."""
    argv = list(proc.command or proc.argv)
    modules = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"]
    what = modules[-1] if modules else os.path.basename(argv[0]) if argv else "-"
    via = [m.rpartition(".")[2] for m in modules[:-1]]  # rlctl.launch.torchrun -> torchrun
    if proc.argv and proc.argv[0] in ("ssh", "srun"):
        via.append(proc.argv[0])
    return what + (f" via {', '.join(via)}" if via else "")


def reached(host: dict, spec: JobSpec) -> str:
    """How a host is reached: nothing for this machine, else ssh or srun and where."""
    if host["local"]:
        return ""
    slurm = next((h.slurm_job for h in spec.hosts if h.name == host["name"]), None)
    return f" (srun, job {slurm})" if slurm else f" (ssh {host['destination']})"


def cores_text(proc: ProcessSpec, hosts: list[dict]) -> str:
    """`topology.learner_cores = "dedicated"`: the cores themselves on this machine, the rule elsewhere ("" when
    the job does not pin)."""
    value = proc.env.get("RLCTL_LEARNER_CORES")
    if not value:
        return ""
    if not next(h["local"] for h in hosts if h["name"] == proc.host):
        threads = value.partition(":")[2]
        mine = "one per torch thread" if ":" in threads else threads
        return f"{mine} of its own" if proc.role == Role.LEARNER else "those the learner ranks leave"
    sets = pinned_cores(value, proc.role, -1 if proc.role == Role.LEARNER else 0, usable_cpu_ids())
    return " | ".join(map(core_ranges, sets)) if sets else "all (too few to dedicate)"
