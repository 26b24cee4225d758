"""The launch pipeline as a library call: validate -> plan -> preflight -> start -> supervise.

`rlctl run` is a thin front-end over it; tests and other front-ends call the same functions (`launch` does it all
in one call). Refusals are exceptions, raised before anything has started: LaunchRefused for bad input (its
message is the whole line to show), the spec's JobFileError for a bad job file, the rundir's RunNotFound and
resume's ResumeRefused for a run that cannot be resumed, PreflightFailed for remote hosts that are not fit.
Progress lines (warnings, the host check, a resume) go to stderr.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from rlctl.launch.plan import LaunchPlan, choose_base_port, job_warnings, local_python, machine_warnings, make_plan
from rlctl.rundir import RunDir, RunLock, new_run_id, runs_root
from rlctl.job.load import check_entry_points, load_job
from rlctl.job.resolved import host_secrets, resolved_dict
from rlctl.job.spec import JobSpec
from rlctl.job.toml_writer import dumps_toml
from rlctl.run_status import RunStatus


class LaunchRefused(Exception):
    """Bad input: nothing was started (the message says what, as the line to show)."""


class PreflightFailed(Exception):
    """Remote hosts failed the check before the start: nothing was started."""

    def __init__(self, problems: list[str], remote: int):
        super().__init__("\n".join([f"rlctl: {len(problems)} of {remote} remote hosts failed the check; nothing was "
                                    "started:"] + [f"  {line}" for line in problems]))
        self.problems = problems


@dataclass
class LaunchInput:
    """What a run starts from: its job and, for a resumed run or a Slurm batch job, the run directory it has."""

    spec: JobSpec
    rundir: RunDir | None = None
    resumed: dict | None = None  # what a resumed run continues from (resume.previous_segment)
    lock: RunLock | None = None  # a resumed run's lock, held until its state says "created"
    batch: bool = False  # the supervisor is a Slurm batch job's (`--sbatch`): a preemption may requeue it


def launch_input(job_file: Path | None, runs_dir: Path | None = None, resume: bool = False, job: Path | None = None,
                 until: list[str] = (), slurm_run_dir: Path | None = None) -> LaunchInput:
    """Which job to start, and where: a job file; with `resume`, the run `job_file` names (id or prefix, default
    the newest), continued with `job` and `until`; or the run directory a batch job was submitted with."""
    if resume:
        from rlctl.launch.resume import prepare_resume

        rundir, spec, resumed, lock = prepare_resume(runs_dir, str(job_file) if job_file else None, job, list(until))
        return LaunchInput(spec, rundir, resumed, lock)
    if slurm_run_dir is not None:
        rundir = RunDir(slurm_run_dir.resolve())
        if (rundir.read_state() or {}).get("status", RunStatus.QUEUED) == RunStatus.QUEUED:
            return LaunchInput(load_job(rundir.job_toml), rundir, batch=True)
        from rlctl.launch.resume import prepare_batch_restart  # a requeued job's next allocation

        spec, resumed, lock = prepare_batch_restart(rundir)
        return LaunchInput(spec, rundir, resumed, lock, batch=True)
    if job_file is None:
        raise LaunchRefused("rlctl run: give a job file (or --resume [RUN])")
    if job is not None or until:
        raise LaunchRefused("rlctl run: --job and --until go with --resume")
    spec = load_job(job_file)
    if spec.cluster.scheduler != "slurm" and all(h.is_local for h in spec.hosts):
        # Every process runs here: an env or wrapper that cannot be imported is refused now, as `validate` does,
        # not by each process at its start.
        spec = check_entry_points(spec, job_file)
    return LaunchInput(spec)


def on_allocation(spec: JobSpec, node: str | None = None) -> tuple[JobSpec, str]:
    """(job, where Slurm steps reach this process): a cluster.scheduler = "slurm" job placed on the allocation this
    process is inside, or on its one `node` (a sweep's trial), LaunchRefused naming why it cannot be; any other job
    as it is."""
    if spec.cluster.scheduler != "slurm":
        return spec, "127.0.0.1"
    from rlctl.launch.slurm import SlurmError, allocation_from_env, route_address, with_allocation

    try:
        alloc = allocation_from_env()
        if node is not None:
            if node not in alloc.nodes:
                raise SlurmError(f"node {node} is not in allocation {alloc.job_id} ({', '.join(alloc.nodes)})")
            alloc = replace(alloc, nodes=(node,))
        placed = with_allocation(spec, alloc, local_python(), os.getcwd())
        return placed, route_address(alloc.addresses[alloc.nodes[0]])
    except SlurmError as exc:
        raise LaunchRefused(f"rlctl: {exc}") from None


def host_addresses(spec: JobSpec) -> dict[str, str]:
    """Where remote hosts without an advertise_address are reached: what their SSH destinations resolve to."""
    from rlctl.launch.hosts import ssh_hostnames

    return ssh_hostnames([h for h in spec.hosts if not h.is_local and not h.advertise_address])


def warn_machine(spec: JobSpec) -> None:
    """Say on stderr what this machine cannot run well (the job still runs)."""
    for line in machine_warnings(spec, os.cpu_count() or 1) + job_warnings(spec):
        print(f"rlctl: warning: {line}", file=sys.stderr)


def preflight(spec: JobSpec, plan: LaunchPlan) -> None:
    """Check every remote host at once before anything starts; PreflightFailed naming each host that is not fit
    (but an unreachable host of an elastic learner node alone, which joins later: preflight.joins_later)."""
    from rlctl.launch.preflight import check_hosts, joins_later

    started = time.time()
    problems = check_hosts(spec, plan)
    remote = sum(not h["local"] for h in plan.hosts)
    later = joins_later(spec, plan)
    waiting = [p for p in problems if p.unreachable and p.host in later]
    fatal = [p.text for p in problems if p not in waiting]
    if fatal:
        raise PreflightFailed(fatal, remote)
    spares = {x.host for x in plan.processes if x.spare}
    for p in waiting:
        then = "waits as a spare" if p.host in spares else "joins the learner group"
        print(f"rlctl: warning: {p.text}; its learner node {then} once it answers", file=sys.stderr)
    print(f"rlctl: {remote} remote hosts checked in {time.time() - started:.1f}s", file=sys.stderr)


def plan_to_show(spec: JobSpec, runs_dir: Path | None = None) -> tuple[JobSpec, LaunchPlan]:
    """(the job as placed, its plan) for `rlctl plan`: a new run id, nothing started or written."""
    run_id = new_run_id(spec.job.name)
    spec, control_address = on_allocation(spec)
    plan = make_plan(spec, run_id, str(runs_root(runs_dir) / run_id), choose_base_port(spec, control_address),
                     python=local_python(), addresses=host_addresses(spec), control_address=control_address)
    warn_machine(spec)
    return spec, plan


def prepare(given: LaunchInput, runs_dir: Path | None = None, detach: bool = False,
            reserved: frozenset[int] = frozenset(), node: str | None = None) -> RunDir:
    """Plan the run, check its remote hosts, and write its directory (job, secrets, plan, state "created"): what
    `supervise` or `start_detached` then runs; its ports none of `reserved`; a Slurm job on the allocation's one
    `node` when given. A resumed run's lock is let go here, however this ends."""
    try:
        spec = given.spec
        if detach and spec.cluster.scheduler == "slurm":
            raise LaunchRefused("rlctl run: --detach with cluster.scheduler = \"slurm\": the allocation ends with the "
                                "command salloc runs, and the run with it; submit a background run with --sbatch")
        spec, control_address = on_allocation(spec, node)
        warn_machine(spec)
        # Free where the supervisor binds (preflight checks the hosts), and claimed until the run's servers bind it.
        base_port = choose_base_port(spec, control_address, reserved, claim=True)
        addresses = host_addresses(spec)
        token = secrets.token_hex(8)  # names others must not guess: weight board, remote private folder

        def plan_in(run_id: str, run_dir: str) -> LaunchPlan:
            return make_plan(spec, run_id, run_dir, base_port, python=local_python(), addresses=addresses,
                             board_token=token, control_address=control_address)

        if any(not h.is_local for h in spec.hosts):
            preflight(spec, plan_in("preflight", "preflight"))
        rundir = given.rundir or RunDir.create(runs_root(runs_dir).resolve(), spec.job.name)
        _write_run(rundir, spec, plan_in(rundir.run_id, str(rundir.path)), given.resumed, given.batch)
        return rundir
    finally:
        if given.lock is not None:
            given.lock.release()


def _write_run(rundir: RunDir, spec: JobSpec, plan: LaunchPlan, resumed: dict | None, batch: bool = False) -> None:
    """The run directory's job, secrets, plan and first state."""
    rundir.write_job(dumps_toml(resolved_dict(spec)))  # hosts[].env values masked
    secrets_of_hosts = host_secrets(spec)
    if secrets_of_hosts:
        rundir.write_secrets(secrets_of_hosts)
    rundir.write_plan(plan.to_json())
    slurm_job = next((h.slurm_job for h in spec.hosts if h.slurm_job is not None), None)
    # A resumed run keeps its first start and the segments before this one from the start: `rlctl status` never
    # shows it younger than it is.
    earlier = list(resumed.get("segments", [])) if resumed else []
    rundir.write_state({"run_id": rundir.run_id, "job": spec.job.name, "algorithm": spec.algorithm.name,
                        "status": RunStatus.CREATED, "started_at": earlier[0]["started_at"] if earlier else time.time(),
                        "processes": [], "metrics": {}, "hosts": [h["name"] for h in plan.hosts],
                        **({"resumed": resumed, "segments": earlier} if resumed else {}),
                        **({"slurm_job_id": slurm_job} if slurm_job else {}),
                        **({"slurm_batch": True} if batch else {})})


def abandon_unstarted(rundir: RunDir, reason: str) -> None:
    """A run interrupted before its supervisor started anything: its state "created" becomes "stopped" (with
    `reason`), so that it does not look as if it were about to start; a run past "created" is left as it is."""
    state = rundir.read_state()
    if state and state.get("status") == RunStatus.CREATED:
        rundir.write_state({**state, "status": RunStatus.STOPPED, "exit_reason": reason, "ended_at": time.time()})


def start_detached(rundir: RunDir) -> int:
    """Supervise a prepared run in a background process of its own (its output: supervisor.out); its pid."""
    with open(rundir.path / "supervisor.out", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rlctl.supervise.loop", str(rundir.path)], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc.pid


def supervise(rundir: RunDir, display: Callable[[dict], None] | None = None) -> int:
    """Supervise a prepared run in this process until it ends; 0 finished or stopped, 1 failed."""
    from rlctl.supervise.loop import supervise_rundir  # the supervisor's imports (zmq, the fork server) only to run

    return supervise_rundir(str(rundir.path), display=display)


def launch(job_file: Path, runs_dir: Path | None = None, display: Callable[[dict], None] | None = None) -> int:
    """The whole pipeline in one call: validate, plan, preflight, start and supervise a job file here."""
    os.umask(0o077)  # a run's folders 0700 and files 0600: logs, job, plan, state, checkpoints
    return supervise(prepare(launch_input(job_file, runs_dir)), display)
