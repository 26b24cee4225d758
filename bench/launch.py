"""Launch time over SSH and Slurm: from invoking `rlctl run` to every process of the job running.

The same job (an APPO learner and 7 collectors: 8 processes) runs once with every process on one SSH host and
once spread over 8 SSH hosts (learner on the first, a collector on each of the others), and, for reference, all on
this machine without SSH. Hosts are real sshds on this machine, each in its own network namespace where the
machine allows it (tests/hostlab.py; needs root, openssh-server and iproute2). "Running" means the supervisor
has heard from the process on the control channel (its session's forwarded socket), as `rlctl status` shows.
Median of --repeats launches each; every launch is stopped with Ctrl-C once all processes run.

Then the same 8 processes over 3 nodes of a real Slurm cluster (tests/slurmlab.py; needs slurm-wlm and munge):
`salloc --nodes=3 rlctl run` with `cluster.scheduler = "slurm"` (every process a job step started by srun), against
the same layout over SSH to the same 3 hosts (a learner on the first, 4 and 3 collectors on the others). The Slurm
figure includes salloc's own allocation.

    python bench/launch.py [--repeats 3]

Target: 8 hosts take no more than twice as long as 1. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import _children as children  # noqa: E402
import slurmlab  # noqa: E402
from hostlab import HostLab  # noqa: E402

PROCESSES = 8  # a learner and 7 collectors
SPREAD_3 = [0, 4, 3]  # collectors on each of 3 hosts or nodes (the first runs the learner)


def job_text(lab: HostLab | None, hosts: int, workdir: Path) -> str:
    """The APPO job with its 8 processes on `hosts` lab hosts (or on this machine when lab is None)."""
    text = (REPO / "jobs" / "appo.toml").read_text()
    text = re.sub(r"(?m)^(collectors|evaluator) = .*\n", "", text)
    text = re.sub(r"(?m)^train_return = .*$", "train_return = 1e9", text)
    text = re.sub(r"(?m)^wall_s = .*$", "wall_s = 120", text)
    text = re.sub(r"(?m)^envs_per_collector = .*$", "envs_per_collector = 2", text)
    if lab is None:
        return text.replace("[topology]\n", f"[topology]\ncollectors = {PROCESSES - 1}\nevaluator = false\n")
    collectors = PROCESSES - 1
    for i in range(hosts):
        here = collectors if hosts == 1 else 1 if i > 0 else 0
        counts = {"learner": True} if i == 0 else {}
        if here:
            counts["collectors"] = here
        wd = workdir / f"h{i + 1}"
        wd.mkdir(exist_ok=True)
        text += "\n" + lab.host_toml(lab.hosts[i], sys.executable, str(wd), **counts)
    return text


def three_host_text(lab: HostLab, workdir: Path) -> str:
    """The job with its 8 processes over the first 3 lab hosts, reached over SSH (SPREAD_3)."""
    text = job_text(None, 0, workdir)
    text = re.sub(r"(?m)^(collectors|evaluator) = .*\n", "", text)
    for i, collectors in enumerate(SPREAD_3):
        counts = {"learner": True} if i == 0 else {"collectors": collectors}
        wd = workdir / f"h{i + 1}"
        wd.mkdir(exist_ok=True)
        text += "\n" + lab.host_toml(lab.hosts[i], sys.executable, str(wd), **counts)
    return text


def slurm_text(lab: "slurmlab.SlurmLab", workdir: Path) -> str:
    """The same layout as three_host_text, placed by Slurm on the allocation's 3 nodes."""
    text = re.sub(r"(?m)^(collectors|evaluator) = .*\n", "", job_text(None, 0, workdir))
    text += (f'\n[cluster]\nscheduler = "slurm"\ncollectors_per_node = {SPREAD_3[1]}\nevaluator = "none"\n'
             f"[cluster.nodes.{lab.nodes[2]}]\ncollectors = {SPREAD_3[2]}\n")
    return text


def launch_once(job: Path, runs: Path, prefix: list[str] = (), env: dict | None = None) -> tuple[float, float | None]:
    """Seconds from `rlctl run` (behind `prefix`, e.g. salloc) to every process running, and the preflight's own
    seconds (None when local)."""
    started = time.perf_counter()
    # Its own session (Ctrl-C reaches this bench only) and registered: if the bench is killed or fails, the
    # supervisor gets one SIGTERM and stops its processes (on the lab hosts too) before the lab goes.
    proc = children.spawn([*prefix, sys.executable, "-m", "rlctl", "run", str(job), "--runs-dir", str(runs)],
                          grace=children.SUPERVISOR_GRACE_S, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, env=env, cwd=REPO)
    try:
        elapsed = None
        deadline = started + 120
        while time.perf_counter() < deadline and proc.poll() is None:
            for state_file in runs.glob("*/state.json"):
                try:
                    state = json.loads(state_file.read_text())
                except (OSError, ValueError):
                    continue
                procs = state.get("processes", [])
                if len(procs) == PROCESSES and all(p["state"] == "running" for p in procs):
                    elapsed = time.perf_counter() - started
            if elapsed is not None:
                break
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: to salloc and the supervisor it started alike
        _, err = proc.communicate(timeout=120)
    finally:
        children.stop([proc])  # nothing left to do once it has exited; else SIGTERM, grace, SIGKILL
    if elapsed is None:
        raise SystemExit(f"the job never had all {PROCESSES} processes running:\n{err[-3000:]}")
    checked = re.search(r"remote hosts checked in ([\d.]+)s", err)
    return elapsed, float(checked.group(1)) if checked else None


def main() -> None:
    """Measure and print; last line JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    children.install()  # killed or failing: the running `rlctl run` stops, then the lab's sshds go
    results: dict[str, list[float]] = {}
    preflight: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, HostLab(Path(tmp), 8).start() as lab:
        print(f"hosts: {len(lab.hosts)} sshds, {'network namespaces' if lab.netns else 'loopback addresses'}")
        layouts = {"local": (None, 0), "1_host": (lab, 1), "8_hosts": (lab, 8)}
        for rep in range(args.repeats):
            for name, (which, hosts) in layouts.items():
                work = Path(tmp) / f"{name}-{rep}"
                work.mkdir()
                job = work / "job.toml"
                job.write_text(job_text(which, hosts, work))
                seconds, checked = launch_once(job, work / "runs")
                results.setdefault(name, []).append(seconds)
                if checked is not None:
                    preflight.setdefault(name, []).append(checked)
                print(f"  {name:8s} run {rep + 1}: every process running after {seconds:5.2f} s"
                      + (f" (host check {checked:.2f} s)" if checked is not None else ""))
    missing = slurmlab.unavailable()
    if missing:
        print(f"Slurm row skipped: {missing}")
    else:
        with tempfile.TemporaryDirectory() as tmp, slurmlab.SlurmLab(Path(tmp), 3).start() as lab:
            print(f"Slurm: 3 nodes ({', '.join(lab.nodes)}), slurmctld and one slurmd each")
            for rep in range(args.repeats):
                for name in ("ssh_3_hosts", "slurm_3_nodes"):
                    work = Path(tmp) / f"{name}-{rep}"
                    work.mkdir()
                    job = work / "job.toml"
                    slurm = name.startswith("slurm")
                    job.write_text(slurm_text(lab, work) if slurm else three_host_text(lab.hostlab, work))
                    prefix = ["salloc", "--no-kill", "--nodes=3"] if slurm else []
                    seconds, checked = launch_once(job, work / "runs", prefix, lab.env)
                    results.setdefault(name, []).append(seconds)
                    print(f"  {name:13s} run {rep + 1}: every process running after {seconds:5.2f} s"
                          + (f" (host check {checked:.2f} s)" if checked is not None else ""))
    med = {k: statistics.median(v) for k, v in results.items()}
    ratio = med["8_hosts"] / med["1_host"]
    print(f"\n{PROCESSES} processes, median of {args.repeats}: local {med['local']:.2f} s, 1 SSH host "
          f"{med['1_host']:.2f} s, 8 SSH hosts {med['8_hosts']:.2f} s; 8 hosts / 1 host = {ratio:.2f} "
          f"(target <= 2: {'met' if ratio <= 2 else 'MISSED'})")
    slurm = {}
    if "slurm_3_nodes" in med:
        slurm = {"launch_s_ssh_3_hosts": round(med["ssh_3_hosts"], 3),
                 "launch_s_slurm_3_nodes": round(med["slurm_3_nodes"], 3),
                 "slurm_over_ssh": round(med["slurm_3_nodes"] / med["ssh_3_hosts"], 3)}
        print(f"over 3 nodes: SSH {med['ssh_3_hosts']:.2f} s, Slurm (salloc + srun steps) "
              f"{med['slurm_3_nodes']:.2f} s; Slurm / SSH = {slurm['slurm_over_ssh']:.2f}")
    print(json.dumps({"bench": "launch", "processes": PROCESSES, "launch_s_local": round(med["local"], 3),
                      "launch_s_1_host": round(med["1_host"], 3), "launch_s_8_hosts": round(med["8_hosts"], 3),
                      "preflight_s_1_host": round(statistics.median(preflight["1_host"]), 3),
                      "preflight_s_8_hosts": round(statistics.median(preflight["8_hosts"]), 3),
                      "ratio": round(ratio, 3), **slurm}))


if __name__ == "__main__":
    main()
