"""Starting the plan's processes: local ones forked from one fork server where they can be, remote ones as SSH (or
srun) sessions whose stdin carries their keys, secrets and the job file. Keys and secrets go into a process's
environment or session only, never onto a command line."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from typing import Callable

from rlctl.net import wire
from rlctl.launch.forkserver import FORKED_MODULES, ForkServer
from rlctl.launch.hosts import SECRET_ENV
from rlctl.launch.plan import LaunchPlan
from rlctl.supervise.process_table import ProcessHandle
from rlctl.supervise.restart_policy import ProcState
from rlctl.roles.supervisor_watch import LOG_FILE_ENV
from rlctl.tether import SUPERVISOR_PID_ENV
from rlctl.rundir import RunDir
from rlctl.job.spec import JobSpec

SESSIONS_OPENING_PER_HOST = 8
SESSION_LOGIN_TIMEOUT_S = 15.0  # a session silent this long no longer holds back the host's next ones


def inherited_env(h: ProcessHandle) -> dict[str, str]:
    """What a local process's environment holds besides its own RLCTL_* settings (and the keys)."""
    return {**os.environ, **{k: v for k, v in h.spec.env.items() if not k.startswith("RLCTL_")}}


class ProcessStarter:
    """Starts (and restarts) the processes of one run."""

    def __init__(self, spec: JobSpec, plan: LaunchPlan, rundir: RunDir, process_keys: dict[str, wire.CurveKeys],
                 slurm_job: int | None):
        self.spec, self.rundir, self.process_keys, self.slurm_job = spec, rundir, process_keys, slurm_job
        self.job_text = rundir.job_toml.read_text() if any(p.remote for p in plan.processes) else ""
        self.forkserver: ForkServer | None = None

    def _forkable(self, h: ProcessHandle) -> bool:
        """A local collector, evaluator or replay shard that the fork server's interpreter can become."""
        argv = h.spec.argv
        return (not h.spec.remote and len(argv) == 3 and argv[0] == sys.executable and argv[1] == "-m"
                and argv[2] in FORKED_MODULES
                and (self.forkserver is None or inherited_env(h) == self.forkserver.env))

    def open_forkserver(self, handles: list[ProcessHandle]) -> None:
        """The fork server, when two or more local processes can come from it (one import of torch, not N)."""
        forkable = [h for h in handles if self._forkable(h)]
        if len(forkable) >= 2:
            self.forkserver = ForkServer(sys.executable, inherited_env(forkable[0]),
                                         str(self.rundir.path / "forkserver.out"))

    def start_all(self, handles: list[ProcessHandle], stopping: Callable[[], bool],
                  meanwhile: Callable[[], None]) -> None:
        """Start every process at once, except that at most SESSIONS_OPENING_PER_HOST SSH sessions to one host are
        logging in at a time: sshd's default MaxStartups (10:30:100) drops connections beyond 10 unauthenticated.
        Processes from the fork server come last: the first of them waits for the server's imports. `meanwhile`
        runs while sessions wait; `stopping` ends the wait. A process held back (a spare learner node, not
        STARTING) starts later, when the table says it is due."""
        waiting: dict[str, deque[ProcessHandle]] = {}
        ready = [h for h in handles if h.life.state is ProcState.STARTING]
        for h in sorted(ready, key=lambda h: self.forkserver is not None and self._forkable(h)):
            if h.spec.remote:
                waiting.setdefault(h.spec.host, deque()).append(h)
            else:
                self.start(h)
        opening: dict[str, list[ProcessHandle]] = {host: [] for host in waiting}
        while any(waiting.values()) and not stopping():
            for host, queue in waiting.items():
                now = time.time()
                opening[host] = [h for h in opening[host] if not h.pump.spoke.is_set() and h.popen.poll() is None
                                 and now - h.started_at < SESSION_LOGIN_TIMEOUT_S]
                while queue and len(opening[host]) < SESSIONS_OPENING_PER_HOST:
                    h = queue.popleft()
                    self.start(h)
                    opening[host].append(h)
            if any(waiting.values()):
                meanwhile()

    def start(self, h: ProcessHandle) -> None:
        """Start (or restart) one process."""
        if not h.spec.remote:
            forkserver = self.forkserver if self.forkserver is not None and self._forkable(h) else None
            # The supervisor's pid: a local process stops by itself once this supervisor is gone (context.py).
            own = {SUPERVISOR_PID_ENV: str(os.getpid()), LOG_FILE_ENV: str(self.rundir.logs_dir / f"{h.spec.name}.log")}
            h.start({**os.environ, **h.spec.env, wire.KEYS_ENV: self.process_keys[h.spec.name].to_env(), **own},
                    self.rundir.logs_dir, forkserver=forkserver)
            return
        # Remote: the local ssh gets this machine's environment; the process's own arrives in the session (srun
        # hands its own environment to the step: the process's settings travel there, never on a command line).
        secrets = {k: h.spec.env[k] for k in h.spec.secret_keys if k in h.spec.env}
        setup = {"env": {wire.KEYS_ENV: self.process_keys[h.spec.name].to_env(), **secrets},
                 "files": {h.spec.env["RLCTL_JOB"]: self.job_text},
                 "session_timeout_s": self.spec.network.session_timeout_s}
        env = dict(os.environ)
        if self.slurm_job is not None:
            env.update({k: v for k, v in h.spec.env.items() if k not in SECRET_ENV and k not in h.spec.secret_keys})
        h.start(env, self.rundir.logs_dir, json.dumps(setup).encode() + b"\n")

    def close(self) -> None:
        """End the fork server (its children live on in their own sessions until they are stopped)."""
        if self.forkserver is not None:
            self.forkserver.close()
