"""Sweeps as library calls: a validated sweep file -> its sweep directory (every trial's job.toml written before
anything starts); a trial started through the launch pipeline `rlctl run` uses (prepare, then a supervisor process
of its own, tethered to the scheduler so that it stops when the scheduler ends); the scheduler in the background.

Which way a trial starts follows from its run directory: no state yet (or "created", never supervised) -> a fresh
start in that folder; stopped, failed or lost -> `rlctl run --resume` of it (from its checkpoint, nothing from
zero); finished -> nothing to do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlctl.job.load import load_job
from rlctl.job.resolved import resolved_dict
from rlctl.job.sweep_spec import SweepSpec
from rlctl.job.toml_writer import dumps_toml
from rlctl.launch.pipeline import LaunchInput, LaunchRefused, launch_input, prepare
from rlctl.launch.plan import usable_cpus
from rlctl.rundir import OVER_STATES, RunDir, RunNotFound, new_run_id, runs_root, status_of
from rlctl.run_reading import live_processes
from rlctl.run_status import RunStatus
from rlctl.sweep_dir import SweepDir, find_sweep


def create_sweep(spec: SweepSpec, runs_dir: Path | None = None) -> SweepDir:
    """The sweep's directory under the runs folder: sweep.json and a folder per trial holding its job.toml.
    LaunchRefused for a base job the sweep cannot place (Slurm unless `place = "nodes"` inside an allocation; other
    hosts unless `place = "hosts"`)."""
    if spec.place == "nodes":
        allocation_nodes()  # LaunchRefused outside an allocation, before anything is made
    elif spec.jobs[0].cluster.scheduler == "slurm":
        raise LaunchRefused(f"rlctl sweep: {spec.path}: the base job runs in a Slurm allocation; set "
                            'place = "nodes" in [sweep] to run each trial on one of its nodes')
    if spec.place == "local" and any(not h.is_local for h in spec.jobs[0].hosts):
        raise LaunchRefused(f"rlctl sweep: {spec.path}: the base job runs on other hosts ([[hosts]]); set "
                            'place = "hosts" in [sweep] to run each trial on one of them')
    os.umask(0o077)
    root = runs_root(runs_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    base = new_run_id(spec.name)
    for n in range(1, 1000):
        path = root / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir(mode=0o700)  # exclusive: two sweeps started in the same second get two folders
            break
        except FileExistsError:
            continue
    sweep = SweepDir(path)
    threads = shared_learner_threads(spec)
    for trial, job in zip(spec.trials, spec.jobs):
        rundir = sweep.trial_dir(trial.id)
        for sub in (rundir.path, rundir.logs_dir, rundir.tb_dir, rundir.checkpoints_dir):
            sub.mkdir()
        data = resolved_dict(job)
        if threads is not None and not job.topology.learner_threads:
            data["topology"]["learner_threads"] = threads
        rundir.write_job(dumps_toml(data))
    sweep.write({"sweep_id": sweep.sweep_id, "name": spec.name, "source": str(spec.path), "base": str(spec.base),
                 "created_at": time.time(), "max_concurrent": spec.max_concurrent, "place": spec.place,
                 "trials_per_host": spec.trials_per_host, "params": [p.key for p in spec.params],
                 "status": RunStatus.CREATED, "early_stop": spec.early_stop.record() if spec.early_stop else None,
                 "trials": [{"id": t.id, "values": t.values, "seed": t.seed, "host": t.host} for t in spec.trials],
                 **({"pbt": spec.pbt.to_json()} if spec.pbt is not None else {})})
    return sweep


def shared_learner_threads(spec: SweepSpec) -> int | None:
    """torch threads for each trial's learner where `max_concurrent` trials share this machine's cores (those whose
    job leaves `topology.learner_threads` to rlctl): each run alone would take every core it sees, and two PPO runs
    at 2 threads each on 2 cores took 143 s to solve CartPole where one thread each took 7.6 s (OpenMP's threads
    spinning at their barriers while the other run's hold the cores). None: trials are on hosts of their own."""
    if spec.place != "local" or spec.max_concurrent < 2:
        return None
    return max(1, usable_cpus() // spec.max_concurrent)


def allocation_nodes() -> tuple[str, ...]:
    """The nodes of the Slurm allocation this process is inside (`place = "nodes"`); LaunchRefused outside one."""
    from rlctl.launch.slurm import SlurmError, allocation_from_env

    try:
        return allocation_from_env().nodes
    except SlurmError as exc:
        raise LaunchRefused(f"rlctl sweep: place = \"nodes\": {exc}") from None


def sweep_to_resume(runs_dir: Path | None, name: str | None) -> SweepDir:
    """The sweep `name` names, once its scheduler is gone; LaunchRefused (or RunNotFound) saying why not."""
    sweep = find_sweep(runs_root(runs_dir), name)
    if sweep is None:
        raise RunNotFound(f"no sweep {name!r} in {runs_root(runs_dir)}")
    data = sweep.read()
    status = sweep.status(data)
    if status not in OVER_STATES and status != RunStatus.CREATED:
        raise LaunchRefused(f"rlctl sweep --resume: {sweep.sweep_id} is {status} (scheduler pid "
                            f"{data.get('supervisor_pid')}); stop it first: rlctl stop {sweep.sweep_id}")
    return sweep


def trial_input(sweep: SweepDir, trial_id: str) -> LaunchInput | None:
    """How a trial starts now (see the module's docstring); None when it is done. ResumeRefused, JobFileError or
    RunBusy when it cannot."""
    rundir = sweep.trial_dir(trial_id)
    state = rundir.read_state()
    if state is None or (status_of(state) == RunStatus.CREATED and not live_processes(state)):
        return LaunchInput(load_job(rundir.job_toml), rundir)
    if status_of(state) == RunStatus.FINISHED:
        return None
    return launch_input(Path(trial_id), sweep.path, resume=True)


def trial_winding_down(sweep: SweepDir, trial_id: str) -> bool:
    """True while a trial's run is not over (its supervisor, told to stop when the scheduler ended, still stops)."""
    state = sweep.trial_dir(trial_id).read_state()
    return state is not None and status_of(state) not in OVER_STATES and status_of(state) != RunStatus.CREATED


@dataclass
class StartedTrial:
    """A trial whose supervisor runs: its process, the ports its plan binds (reserved from the next trials) and, with
    `place = "nodes"`, the Slurm node it runs on."""

    trial_id: str
    rundir: RunDir
    proc: subprocess.Popen
    ports: frozenset[int]
    node: str | None = None


def start_trial(sweep: SweepDir, given: LaunchInput, trial_id: str, reserved: frozenset[int],
                node: str | None = None) -> StartedTrial:
    """Prepare the trial's run (the launch pipeline's `prepare`: plan, run directory) on ports none of `reserved`
    (on the allocation's one `node` when given), and start its supervisor, tethered to this process."""
    spec = given.spec
    rundir = prepare(given, sweep.path, reserved=reserved, node=node)
    base = int((rundir.read_plan() or {}).get("base_port", 0))
    with open(rundir.path / "supervisor.out", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rlctl.supervise.tethered_run", str(os.getpid()),
                                 str(rundir.path)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own session: a terminal's Ctrl-C reaches the scheduler
    return StartedTrial(trial_id, rundir, proc, frozenset(range(base, base + spec.port_count)), node)


def start_detached(sweep: SweepDir) -> int:
    """Run the sweep's scheduler in a background process of its own (its output: scheduler.out); its pid."""
    with open(sweep.path / "scheduler.out", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rlctl.supervise.sweep_scheduler", str(sweep.path)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc.pid
