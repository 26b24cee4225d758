"""`rlctl stop`: a run ended gracefully through its supervisor (SIGTERM, as Ctrl-C), or, its supervisor gone, its
processes ended here; then every remote host is checked for leftovers. A run submitted with --sbatch is stopped
through Slurm. Imports stay light (no torch, numpy or pydantic on a local run's stop).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from rlctl.supervise.remote_cleanup import confirm_remote_hosts
from rlctl.liveness import group_alive, pid_alive, same_process
from rlctl.rundir import OVER_STATES, TERMINAL_STATES, RunDir, remove_weight_board
from rlctl.run_status import RunStatus



def stop_run(rd: RunDir, timeout: float) -> bool:
    """Stop one run and wait for it (at most `timeout` seconds before its processes are killed); False when
    something of it had to be killed or could not be checked. RunBusy while another command changes the run."""
    with rd.lock():  # a resume does not start in the middle of a stop
        state = rd.read_state() or {}
        status = rd.effective_status(state)
        if status in TERMINAL_STATES:
            print(f"{rd.run_id} is already {status}")
            reap(state)
            confirm_remote_hosts(rd)
            return True
        if supervised_by_batch_job(state):
            return stop_batch_job(rd, state, timeout)
        pid = state.get("supervisor_pid")
        if status != RunStatus.LOST and same_process(pid, state.get("supervisor_start")):
            return _stop_through_supervisor(rd, pid, timeout)
        return _stop_orphans(rd, state)


def _stop_through_supervisor(rd: RunDir, pid: int, timeout: float) -> bool:
    """SIGTERM to the supervisor, which stops the run as Ctrl-C does; its processes killed here if it takes longer
    than `timeout`."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + timeout
    while time.time() < deadline and rd.effective_status() not in OVER_STATES:
        time.sleep(0.1)
    while time.time() < deadline and pid_alive(pid):  # the supervisor itself exits just after writing its state
        time.sleep(0.05)
    state = rd.read_state() or {}
    if rd.effective_status(state) not in TERMINAL_STATES or pid_alive(pid):
        print(f"{rd.run_id} did not stop within {timeout:g}s (status {rd.effective_status(state)}); "
              f"killing its processes", file=sys.stderr)
        reap(state)
        remove_weight_board(rd.read_plan() or {})
        confirm_remote_hosts(rd)
        return False
    left = reap(state)
    print(f"{rd.run_id} {rd.effective_status()}" + (f"; {left} process groups had to be killed" if left else ""))
    return confirm_remote_hosts(rd)


def _stop_orphans(rd: RunDir, state: dict) -> bool:
    """The supervisor is gone: end its processes here (closing remote sessions too), bring home what it would have,
    and record the run as stopped."""
    reap(state)
    remove_weight_board(rd.read_plan() or {})
    clean = confirm_remote_hosts(rd, fetch_checkpoints=True)
    state.update(status=RunStatus.STOPPED, ended_at=time.time(), exit_reason="supervisor lost; processes ended by rlctl stop")
    rd.write_state(state)
    print(f"{rd.run_id} {rd.effective_status()}")
    return clean


def stop_sweep(sweep, timeout: float) -> bool:
    """Stop a sweep: its scheduler (SIGTERM: it stops every trial, each keeping its checkpoints, and ends), then any
    trial still live without it (a scheduler that died); False when something had to be killed."""
    data = sweep.read()
    pid = data.get("supervisor_pid")
    clean = True
    if sweep.status(data) not in OVER_STATES and same_process(pid, data.get("supervisor_start")):
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + timeout
        while time.time() < deadline and (sweep.status() not in OVER_STATES or pid_alive(pid)):
            time.sleep(0.1)
        clean = not pid_alive(pid)
    for trial in sweep.trials():
        rd = sweep.trial_dir(trial["id"])
        state = rd.read_state()
        if state is not None and rd.effective_status(state) not in TERMINAL_STATES | {RunStatus.CREATED}:
            clean = stop_run(rd, timeout) and clean
    if sweep.status() not in TERMINAL_STATES:
        sweep.update(status=RunStatus.STOPPED, ended_at=time.time())
    print(f"{sweep.sweep_id} {sweep.status()}")
    return clean


def supervised_by_batch_job(state: dict) -> bool:
    """A run submitted with --sbatch whose supervisor is (or will be) a batch job on another machine, or on this one
    in a later allocation (queued, or a preempted batch run: its job may be pending again)."""
    job = state.get("slurm_job_id")
    host = state.get("supervisor_host")
    return (isinstance(job, int) and not isinstance(job, bool) and job > 0
            and (state.get("status") == RunStatus.QUEUED
                 or (state.get("status") == RunStatus.PREEMPTED and state.get("slurm_batch") is True)
                 or (isinstance(host, str) and host != socket.gethostname())))


def stop_batch_job(rd: RunDir, state: dict, timeout: float) -> bool:
    """Stop a batch-job run: SIGTERM to its supervisor through Slurm (a graceful stop, as Ctrl-C), then `scancel`
    of the job if it has not ended within `timeout`. False when it had to be cancelled or Slurm failed."""
    from rlctl.launch.slurm import SlurmError, job_nodes, slurm_command

    job = state["slurm_job_id"]
    try:
        waiting = (RunStatus.QUEUED, RunStatus.PREEMPTED)  # no supervisor: the job is pending (or gone)
        if state.get("status") in waiting:
            try:
                slurm_command("scancel", str(job))
            except SlurmError:
                if state.get("status") == RunStatus.QUEUED:
                    raise  # a preempted run's job may be gone already: not requeued
            state = rd.read_state() or state
            if state.get("status") in waiting:  # it never started (again)
                state.update(status=RunStatus.STOPPED, ended_at=time.time(),
                             exit_reason=f"Slurm job {job} cancelled" + (
                                 " while preempted" if state.get("status") == RunStatus.PREEMPTED else ""))
                rd.write_state(state)
        else:
            slurm_command("scancel", "--signal=TERM", "--batch", str(job))
        deadline = time.time() + timeout
        while time.time() < deadline and rd.effective_status() not in OVER_STATES:
            time.sleep(0.2)
        while time.time() < deadline and job_nodes(job) is not None:  # the batch job ends once its supervisor has
            time.sleep(0.2)
        if job_nodes(job) is not None:
            print(f"{rd.run_id} did not stop within {timeout:g}s: cancelling Slurm job {job}", file=sys.stderr)
            slurm_command("scancel", str(job))
            return False
    except SlurmError as exc:
        print(f"rlctl: {exc}", file=sys.stderr)
        return False
    print(f"{rd.run_id} {rd.effective_status()} (Slurm job {job} ended)")
    return True


def reap(state: dict) -> int:
    """End every process group of the run still alive (SIGTERM, SIGKILL after 3 s); returns how many were."""
    # A group whose leader lives on as another process (its pid reused: another start time) is not the run's.
    alive = [p["pgid"] for p in state.get("processes", []) if isinstance(p.get("pgid"), int) and p["pgid"] > 1
             and group_alive(p["pgid"]) and (not pid_alive(p["pgid"]) or same_process(p["pgid"], p.get("start_time")))]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in alive:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 3
        while time.time() < deadline and any(group_alive(g) for g in alive):
            time.sleep(0.05)
    return len(alive)
