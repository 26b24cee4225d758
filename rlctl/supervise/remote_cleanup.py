"""What a run leaves on its remote hosts, dealt with at its end: checkpoints brought home, leftover processes killed.

The supervisor does it at shutdown (`finish_remote`); `rlctl stop` checks again, and does it all when the
supervisor died (`confirm_remote_hosts`). The job schema, SSH and Slurm modules are imported where used: `rlctl stop`
of a local run imports none of them (the watching commands stay light).
"""

from __future__ import annotations

import sys
import time

from rlctl.rundir import RunDir


def finish_remote(plan, rundir: RunDir, hosts: list, processes: list | None = None) -> dict[str, dict]:
    """Bring remote checkpoints home, then make sure nothing of the run is left on any remote host. Returns, per
    host, what the sweep found (and the checkpoints fetched), for state.json's host rows. `processes`: where the
    plan's processes are now (one moved off a lost host writes its checkpoints on its new one)."""
    from rlctl.launch.hosts import pull_directory, sweep_hosts
    from rlctl.launch.plan import CHECKPOINT_ROLES
    from rlctl.launch.remote import remote_checkpoint_dir

    writers = {p.host for p in (processes or plan.processes) if p.remote and p.role in CHECKPOINT_ROLES}
    fetched = pull_directory([h for h in hosts if h.name in writers], remote_checkpoint_dir(plan.run_id),
                             rundir.checkpoints_dir)
    for name, files in fetched.items():
        if isinstance(files, str):  # the files stay on the host: say where, they are the run's to keep
            print(f"rlctl: could not fetch checkpoints from host {name}: {files}; they remain there in "
                  f"{remote_checkpoint_dir(plan.run_id)} under its working directory", file=sys.stderr)
    return {name: {**result, **({"checkpoints": fetched[name]} if name in fetched else {})}
            for name, result in sweep_hosts(hosts, plan.run_id, kill=True).items()}


def confirm_remote_hosts(rd: RunDir, fetch_checkpoints: bool = False) -> bool:
    """Check on every remote host of the run, at once, that none of its processes is left (killing any that are).

    With fetch_checkpoints (the supervisor died, so it could not), remote processes first get a few seconds to
    end by themselves (their sessions are closed: they write a final checkpoint), then their checkpoints come home.
    """
    plan = rd.read_plan() or {}
    remote = {h["name"] for h in plan.get("hosts", []) if not h.get("local", True)}
    if not remote:
        return True
    from rlctl.launch.hosts import sweep_hosts
    from rlctl.job.load import load_job

    hosts = [h for h in load_job(rd.job_toml).hosts if h.name in remote]
    slurm_jobs = {h.slurm_job for h in hosts if h.slurm_job is not None}
    if slurm_jobs:
        from rlctl.launch.slurm import job_nodes

        if all(job_nodes(job) is None for job in slurm_jobs):
            print(f"  Slurm job {', '.join(map(str, sorted(slurm_jobs)))} has ended: Slurm ended every step of it")
            return True
    if fetch_checkpoints:
        _fetch_after_lost_supervisor(rd, plan, hosts)
    clean = True
    for name, result in sweep_hosts(hosts, rd.run_id, kill=True).items():
        if "error" in result:
            clean = False
            print(f"  host {name}: could not check: {result['error']}", file=sys.stderr)
        elif result["killed"]:
            print(f"  host {name}: killed {len(result['killed'])} leftover processes (pids "
                  f"{', '.join(map(str, result['killed']))})" + (f"; {len(result['left'])} still there" if result['left'] else ""))
            clean = clean and not result["left"]
        else:
            print(f"  host {name}: nothing of the run left")
    return clean


def _fetch_after_lost_supervisor(rd: RunDir, plan: dict, hosts: list) -> None:
    """Give the remote processes of a run whose supervisor died time to end (and checkpoint), then fetch their
    checkpoints, saying per host what came home."""
    from rlctl.launch.hosts import pull_directory, sweep_hosts
    from rlctl.launch.plan import CHECKPOINT_ROLES
    from rlctl.launch.remote import SESSION_LOST_GRACE_S, remote_checkpoint_dir

    deadline = time.time() + SESSION_LOST_GRACE_S + 3
    while time.time() < deadline and any(r.get("left") for r in sweep_hosts(hosts, rd.run_id, kill=False).values()):
        time.sleep(0.5)
    writers = {p["host"] for p in plan.get("processes", []) if p.get("remote") and p["role"] in CHECKPOINT_ROLES}
    fetched = pull_directory([h for h in hosts if h.name in writers], remote_checkpoint_dir(rd.run_id),
                             rd.checkpoints_dir)
    for name, files in fetched.items():
        print(f"  host {name}: " + (f"fetched {', '.join(files) or 'no checkpoints'}" if isinstance(files, list)
                                    else f"could not fetch checkpoints: {files}"))
