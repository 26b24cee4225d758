"""A real Slurm cluster on this one machine, for tests and benchmarks: the hosts of a HostLab as its nodes.

One `munged` (its own key and socket), one `slurmctld` in the root network namespace on the lab's bridge address,
and one `slurmd` per lab host inside that host's network namespace and its own UTS namespace (so `hostname` on a
node prints the node's name, as on a real cluster). The root namespace plays the login node: `salloc`, `sbatch`,
`squeue` and `scontrol` run there with SLURM_CONF pointing at the lab's slurm.conf. The file system is shared by
every node, as a cluster's home directories are.

Processes are tracked by Slurm's `proctrack/linuxproc` (the process tree; cgroups are not available inside the
namespaces), and `--overlap` steps may share a node's CPUs.
The main scheduling loop runs every second (`sched_interval=1`; Slurm's default is 60 s): a job submitted while
the last one's nodes were still completing would otherwise wait up to a minute for the next pass.

Usage::

    with SlurmLab(tmp_path, 3) as lab:
        out = subprocess.run(["salloc", "-N3", "srun", "hostname"], env=lab.env, ...)

Needs root, network namespaces, and Debian's `slurm-wlm` and `munge` (installed by .ci/run).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from hostlab import MARKER_ENV, HostLab, _set_pdeathsig

START_TIMEOUT_S = 30.0
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "srun", "salloc", "sbatch", "scontrol", "squeue", "scancel")


def unavailable() -> str | None:
    """Why a SlurmLab cannot run here (None when it can)."""
    missing = [b for b in SLURM_BINARIES if not shutil.which(b)]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; .ci/run installs slurm-wlm and munge)"
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter") or not shutil.which("unshare"):
        return "a Slurm lab needs root, iproute2 and util-linux (network and UTS namespaces)"
    return None


class SlurmLab:
    """slurmctld + one slurmd per HostLab host; `env` is the environment for Slurm's commands on the login node."""

    def __init__(self, root: Path, count: int, cpus_per_node: int = 8, cred_expire_s: int | None = None):
        self.hostlab = HostLab(root, count)
        # A step credential's lifetime, which is also how long a requeued job waits before it may start again
        # (Slurm's default: 120 s).
        self.cred_expire_s = cred_expire_s
        self.root = self.hostlab.root / "slurm"
        self.cpus = cpus_per_node
        self.nodes: list[str] = []
        self.env: dict[str, str] = {}
        self._procs: list[subprocess.Popen] = []
        self._started = False

    @property
    def hosts(self):
        """The lab hosts (each one a Slurm node of the same name)."""
        return self.hostlab.hosts

    def start(self) -> "SlurmLab":
        """Start the hosts, munged, slurmctld and every slurmd; wait until every node is idle (once)."""
        if self._started:
            return self
        self._started = True
        try:
            self.hostlab.start()
            if not self.hostlab.netns:
                raise RuntimeError(f"a Slurm lab needs network namespaces ({self.hostlab.netns_error})")
            self._configure()
            self._start_daemons()
            self._wait_idle()
        except BaseException:
            self.close()
            raise
        return self

    def _configure(self) -> None:
        d = self.root
        shutil.rmtree(d, ignore_errors=True)
        (d / "munge").mkdir(parents=True, mode=0o700)
        d.chmod(0o755)
        for sub in ("state", *(f"spool/{h.name}" for h in self.hosts)):
            (d / sub).mkdir(parents=True)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.controller = f"198.18.{self.hostlab.subnet}.1"
        with socket.socket() as s:
            s.bind((self.controller, 0))
            port = s.getsockname()[1]
        self.nodes = [h.name for h in self.hosts]
        nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={self.cpus} RealMemory=4000 State=UNKNOWN"
                          for h in self.hosts)
        (d / "slurm.conf").write_text(f"""\
ClusterName=rlctllab{self.hostlab.index}
SlurmctldHost=ctl({self.controller})
SlurmctldPort={port}
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket{f",cred_expire={self.cred_expire_s}" if self.cred_expire_s else ""}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmdPidFile={d}/%n.pid
SlurmctldPidFile={d}/slurmctld.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/linear
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MessageTimeout=10
{nodes}
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self.env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
        for key in [k for k in self.env if k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))]:
            if key != "SLURM_CONF":
                del self.env[key]  # an allocation this process may be in is not the lab's

    def _daemon(self, argv: list[str], log: str) -> None:
        with open(self.root / log, "ab") as out:
            self._procs.append(subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**self.env, MARKER_ENV: self.hostlab.tag}, preexec_fn=_set_pdeathsig))

    def _start_daemons(self) -> None:
        d = self.root
        self._daemon(["munged", "-F", "-f", f"--socket={d}/munge/munge.socket", f"--key-file={d}/munge/munge.key",
                      f"--pid-file={d}/munge/munged.pid", f"--log-file={d}/munge/munged.log",
                      f"--seed-file={d}/munge/munged.seed"], "munged.out")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (d / "munge" / "munge.socket").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {(d / 'munged.out').read_text()[-2000:]}")
            time.sleep(0.01)
        conf = d / "slurm.conf"
        # slurmctld checks that its host name is the SlurmctldHost's: a UTS namespace of its own gives it that.
        self._daemon(["unshare", "--uts", "sh", "-c", f"hostname ctl && exec slurmctld -D -i -f {conf}"],
                     "slurmctld.out")
        for h in self.hosts:
            # nsenter, not `ip netns exec`: the latter remounts /sys, which hides the cgroup mounts slurmd reads.
            self._daemon(["nsenter", f"--net=/run/netns/{h.netns}", "unshare", "--uts", "sh", "-c",
                          f"hostname {h.name} && exec slurmd -D -f {conf} -N {h.name}"], f"{h.name}.out")

    def _wait_idle(self) -> None:
        for proc in self._procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}: {self.logs()}")
        if not self._idle_within(START_TIMEOUT_S):
            raise RuntimeError(f"Slurm nodes not idle after {START_TIMEOUT_S:.0f}s: {self.diagnosis()}")

    def node_states(self) -> dict[str, str]:
        """Node -> its short state as sinfo prints it (idle, alloc, comp, drain, down*, ...)."""
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %t").stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def _idle_within(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.node_states()
            if states and all(states.get(n) == "idle" for n in self.nodes):
                return True
            time.sleep(0.1)
        return False

    def settle(self, timeout: float = 90.0) -> str | None:
        """Cancel every job left in the queue and wait for idle nodes; None, or why the nodes did not come back
        (which then are resumed, so that the next test starts on a working cluster)."""
        self.slurm("scancel", "--partition=lab")
        if self._idle_within(timeout):
            return None
        why = self.diagnosis()
        for node in self.nodes:
            self.slurm("scontrol", "update", f"nodename={node}", "state=resume")
        self._idle_within(timeout)
        return why

    def diagnosis(self) -> str:
        """The nodes' states and reasons, the queue, and the daemons' logs: for a failure message."""
        parts = [self.slurm("sinfo", "-N", "-o", "%N %T %E %H").stdout,
                 self.slurm("squeue", "-a", "-t", "all", "-o", "%i %T %r %N %e").stdout, self.logs()]
        return "\n".join(parts)

    def logs(self) -> str:
        """The tail of every daemon's log, for a failure message."""
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(parts)

    def slurm(self, *argv: str, timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        """Run a Slurm command on the login node (text output captured; never raises on exit code)."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs)

    def node_pids(self, name: str) -> list[int]:
        """Pids inside node `name`'s network namespace, its slurmd and slurmstepds left out."""
        ns = next(h.netns for h in self.hosts if h.name == name)
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        pids = []
        for pid in (int(p) for p in out.split() if p.isdigit()):
            with contextlib.suppress(OSError):
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if comm not in ("slurmd", "slurmstepd", "sshd"):
                    pids.append(pid)
        return pids

    def close(self) -> None:
        """Stop every daemon, then the hosts (which kills whatever is left inside their namespaces)."""
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.kill()
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        self.hostlab.close()

    def __enter__(self) -> "SlurmLab":
        """Start the lab and return it."""
        return self.start()

    def __exit__(self, *exc) -> None:
        """Close the lab."""
        self.close()


def module_lab(tmp_path_factory, count: int, **options):
    """A module fixture's body: `count` nodes started (the module skipped where network namespaces are missing),
    yielded, and torn down after the module."""
    try:
        lab = SlurmLab(tmp_path_factory.mktemp("slurm"), count, **options).start()
    except RuntimeError as exc:
        if "network namespaces" in str(exc):
            pytest.skip(str(exc))
        raise
    with lab:
        yield lab
