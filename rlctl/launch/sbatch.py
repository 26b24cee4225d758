"""`rlctl run --sbatch` and `rlctl plan --sbatch`: a run submitted to Slurm as a batch job. Its run directory is made
here (status queued); the batch script starts `rlctl run --slurm-run-dir` inside the allocation, whose supervisor
then runs the job there."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from rlctl.launch.pipeline import LaunchRefused
from rlctl.launch.plan import local_python
from rlctl.rundir import RunDir, new_run_id, runs_root
from rlctl.launch.slurm import SlurmError, sbatch_script, submit
from rlctl.job.resolved import host_secrets, resolved_dict
from rlctl.job.spec import JobSpec
from rlctl.job.toml_writer import dumps_toml
from rlctl.run_status import RunStatus


def sbatch_options(spec: JobSpec, options: dict) -> dict[str, str]:
    """The job's sbatch_options with the command line's (partition, time, account; None where not given) over
    them; LaunchRefused for a value that is not a plain word, or a job that is not a Slurm one."""
    if spec.cluster.scheduler != "slurm":
        raise LaunchRefused('rlctl: --sbatch needs cluster.scheduler = "slurm" in the job file')
    given = {k: v for k, v in options.items() if v is not None}
    for key, value in given.items():
        if not re.fullmatch(r"[A-Za-z0-9_.:,+-]{1,128}", value):
            raise LaunchRefused(f"rlctl: --{key} {value!r}: letters, digits and _.:,+- only")
    return {**spec.cluster.sbatch_options, **given}


def batch_script(spec: JobSpec, run_dir: str, nodes: int | None, options: dict[str, str]) -> str:
    """The batch script of a Slurm job (options as sbatch_options made them): `nodes` nodes, by default
    cluster.node_count, else the learner nodes and one more."""
    count = nodes or spec.cluster.node_count or spec.cluster.learner_nodes + 1
    return sbatch_script(run_dir, spec.job.name, local_python(), os.getcwd(), count, options,
                         spec.cluster.signal_grace_s, spec.cluster.requeue)


def script_to_show(spec: JobSpec, runs_dir: Path | None, nodes: int | None, options: dict) -> str:
    """The batch script `rlctl run --sbatch` would submit, for a new run id; nothing is made or submitted."""
    run_dir = str((runs_root(runs_dir) / new_run_id(spec.job.name)).resolve())
    return batch_script(spec, run_dir, nodes, sbatch_options(spec, options))


def submit_run(spec: JobSpec, runs_dir: Path | None, nodes: int | None, options: dict) -> tuple[RunDir, int]:
    """(the run directory, the Slurm job id): the run directory made (status queued), its batch script submitted.
    Bad input is refused (LaunchRefused) before the run directory is made; a refused submission (SlurmError) leaves
    it marked failed."""
    options = sbatch_options(spec, options)
    if host_secrets(spec):
        raise LaunchRefused("rlctl: --sbatch: hosts[].env is not used with Slurm")
    rundir = RunDir.create(runs_root(runs_dir).resolve(), spec.job.name)
    script = batch_script(spec, str(rundir.path), nodes, options)
    rundir.write_job(dumps_toml(resolved_dict(spec)))
    (rundir.path / "sbatch.sh").write_text(script)
    first = {"run_id": rundir.run_id, "job": spec.job.name, "algorithm": spec.algorithm.name}
    try:
        job_id = submit(script)
    except SlurmError as exc:
        rundir.write_state({**first, "status": RunStatus.FAILED, "exit_reason": f"not submitted: {exc}",
                            "started_at": time.time(), "ended_at": time.time(), "processes": [], "metrics": {}})
        raise
    rundir.write_state({**first, "status": RunStatus.QUEUED, "slurm_job_id": job_id, "started_at": time.time(),
                        "processes": [], "metrics": {}})
    return rundir, job_id
