"""What a role process knows about itself, read in one place from the environment the plan gave it."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass

import zmq

from rlctl import events
from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.roles.metrics_line import MetricsLine
from rlctl.roles.supervisor_watch import SupervisorWatch, watch_supervisor
from rlctl.job.load import load_job
from rlctl.launch.hosts import CONTROL_VIA_ENV, WEIGHTS_BULK_VIA_ENV, WEIGHTS_VIA_ENV
from rlctl.job.spec import JobSpec
from rlctl.role_names import Role


@dataclass
class RoleContext:
    """Role, rank, job and endpoints of this process (from RLCTL_* and torchrun's variables)."""

    role: str
    rank: int
    host: str
    run_id: str
    job: JobSpec
    endpoints: dict
    checkpoint_dir: str
    keys: wire.CurveKeys
    binds: dict
    world_size: int = 1
    local_rank: int = 0
    learner_node: int = 0  # a learner rank's node in the plan (its place in an elastic world's round may differ)
    weight_board: str | None = None  # on learner rank 0's host, or a relay's: weights come through this shared file

    @classmethod
    def from_env(cls) -> "RoleContext":
        """Build from the environment; learners take their rank from torchrun (RANK, WORLD_SIZE)."""
        env = os.environ
        role = env["RLCTL_ROLE"]
        rank = int(env["RANK"]) if role == Role.LEARNER else int(env["RLCTL_RANK"])
        endpoints = json.loads(env["RLCTL_ENDPOINTS"])
        if env.get("RLCTL_CONTROL"):  # on a remote host: the SSH session's forward of the supervisor's socket
            endpoints["control"] = env["RLCTL_CONTROL"]
        if env.get(WEIGHTS_VIA_ENV):  # a host with a relay: its processes subscribe there (a relay: to one above it)
            endpoints["weights_root"], endpoints["weights"] = endpoints["weights"], env[WEIGHTS_VIA_ENV]
            # Sealed versions (rlctl.net.sealed) cross hosts only: a relay takes them from the one above it (rank 0
            # its fallback); the processes behind a relay take its board or its Unix socket.
            endpoints["weights_root_bulk"] = endpoints.pop("weights_bulk", None)
            if env.get(WEIGHTS_BULK_VIA_ENV):
                endpoints["weights_bulk"] = env[WEIGHTS_BULK_VIA_ENV]
        if env.get(CONTROL_VIA_ENV):  # ... and send it their hellos and heartbeats, which it bundles
            endpoints["control"] = env[CONTROL_VIA_ENV]
        return cls(
            role=role, rank=rank, host=env.get("RLCTL_HOST", "localhost"), run_id=env["RLCTL_RUN_ID"],
            job=load_job(env["RLCTL_JOB"]), endpoints=endpoints,
            checkpoint_dir=env.get("RLCTL_CHECKPOINT_DIR", ""), keys=wire.CurveKeys.from_env(),
            binds=json.loads(env.get("RLCTL_BINDS", "{}")),
            world_size=int(env.get("WORLD_SIZE", "1")), local_rank=int(env.get("LOCAL_RANK", "0")),
            learner_node=int(env["RLCTL_RANK"]) if role == Role.LEARNER else 0,
            weight_board=_weight_board(env.get("RLCTL_WEIGHT_BOARD")),
        )

    @property
    def name(self) -> str:
        """`role-rank`, as in logs and status."""
        return f"{self.role}-{self.rank}"

    def say(self, text: str) -> None:
        """A line of this process's log, flushed. The log file and `rlctl logs` name the process already; only a
        learner's ranks, which share one log, say which rank speaks."""
        who = f"rank {self.rank}: " if self.role == Role.LEARNER and self.world_size > 1 else ""
        print(f"{who}{text}", flush=True)

    @property
    def seed(self) -> int:
        """This process's seed (`process_seed`)."""
        return process_seed(self.job.job.seed, self.role, self.rank)


ROLE_SEED_INDEX = {Role.LEARNER: 0, Role.REPLAY_SHARD: 1, Role.COLLECTOR: 2, Role.INFERENCE: 3, Role.EVALUATOR: 4,
                   Role.RELAY: 5}  # at most 7: the index takes 3 bits of the seed


def process_seed(job_seed: int, role: str, rank: int) -> int:
    """A process's seed, derived from the job seed so processes differ but runs repeat. Each process owns the 2**32
    seeds from its own on: gymnasium's vector reset seeds sub-env i `seed + i`, the evaluator's round k from
    `seed + k * episodes`. Seeds one apart (job seed * 1000 + role offset + rank) gave collector r's sub-envs 1..N-1 the
    streams of collector r+1's 0..N-2. numpy and gymnasium take seeds of any size; torch's take `seed % 2**63`."""
    return ((job_seed * 8 + ROLE_SEED_INDEX[role]) << 24 | rank) << 32


def _weight_board(path: str | None) -> str | None:
    """The plan's weight board file, if this host has its directory (/dev/shm: Linux); else weights come over
    the network, for the learner and its subscribers alike, since they share the host."""
    return path if path and os.path.isdir(os.path.dirname(path)) else None


class StopFlag:
    """SIGTERM/SIGINT turn into a flag that role loops check; the loop decides where it is safe to stop."""

    def __init__(self) -> None:
        self.requested = False
        self.signalled = False  # the stop was asked by SIGTERM/SIGINT
        self.orphaned = False  # the stop was asked by the supervisor's watch: nobody waits on this process
        self.watch: SupervisorWatch | None = None
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, signum, frame) -> None:
        self.requested = self.signalled = True
        if self.watch is not None:
            self.watch.notice_if_gone()  # a signal caused by the supervisor's death: stop as its orphan

    def orphan(self) -> None:
        """Stop because the supervisor is gone."""
        self.orphaned = self.requested = True

    def __bool__(self) -> bool:
        return self.requested


class ControlClient:
    """DEALER to the supervisor's control ROUTER: hello, then heartbeats that carry metrics (and, every
    `logging.log_interval_s`, the same figures as a line of the process's log)."""

    def __init__(self, net: wire.SecureContext, rc: RoleContext):
        self.rc = rc
        self.interval = rc.job.logging.metrics_interval_s
        self.metrics_line = MetricsLine(rc.job.logging.log_interval_s)  # the log's periodic line of these figures
        # Linger so the final heartbeat (checkpoint, digest) leaves before the process exits.
        self.sock = net.client(zmq.DEALER, rc.endpoints["control"], linger=2000, sndhwm=100)
        self.next_at = 0.0
        self.net = net
        self.stopping = False
        self.send("hello", {"pid": os.getpid(), "role": rc.role, "rank": rc.rank, "host": rc.host})

    def send(self, kind: str, meta: dict, arrays: dict | None = None) -> None:
        """Send without ever blocking the role loop (dropped if the supervisor is gone)."""
        try:
            wire.send(self.sock, kind, self.rc.name, 0, meta, arrays, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def stop_requested(self) -> bool:
        """True once the supervisor has sent `stop` (checked without blocking)."""
        while self.sock.poll(0):
            try:
                _, msg = wire.recv(self.sock, zmq.NOBLOCK)
            except (zmq.Again, wire.WireError):
                break
            if msg.kind == "stop":
                self.stopping = True
        return self.stopping

    def due(self, now: float | None = None) -> bool:
        """True when the next heartbeat is due."""
        return (now or time.monotonic()) >= self.next_at

    def heartbeat(self, metrics: dict) -> None:
        """Send metrics now and schedule the next heartbeat."""
        self.next_at = time.monotonic() + self.interval
        metrics.setdefault(M.NET_REFUSED, self.net.refused)
        self.send("heartbeat", {"pid": os.getpid(), "rank": self.rc.rank, "metrics": metrics})
        line = self.metrics_line.offer(metrics)
        if line is not None:
            self.rc.say(line)

    def last_metrics_line(self) -> None:
        """Log the figures of the heartbeats since the last metrics line, if any (called once the role stops)."""
        line = self.metrics_line.flush()
        if line is not None:
            self.rc.say(line)


def set_torch_threads() -> int:
    """Set this process's torch threads from the plan's RLCTL_TORCH_THREADS (1 unless it is a learner rank);
    returns the count."""
    import torch

    from rlctl.launch.plan import torch_threads

    n = torch_threads(os.environ.get("RLCTL_TORCH_THREADS"), int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    torch.set_num_threads(n)
    return n


def each_thread(apply) -> None:
    """Call apply(tid) for every thread of this process (one that ends meanwhile is skipped)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            apply(int(tid))
        except OSError:  # a thread that just ended
            pass


def pin_cores() -> list[int] | None:
    """Pin every thread of this process to the cores the plan's RLCTL_LEARNER_CORES gives its role (threads made
    later inherit them); returns them, or None where nothing is pinned."""
    from rlctl.launch.plan import pinned_cores, usable_cpu_ids

    env = os.environ
    if not env.get("RLCTL_LEARNER_CORES") or not hasattr(os, "sched_setaffinity"):
        return None
    local_rank = env.get("LOCAL_RANK", "0")
    sets = pinned_cores(env["RLCTL_LEARNER_CORES"], env.get("RLCTL_ROLE", ""),
                        int(local_rank) if local_rank.isdigit() else 0, usable_cpu_ids())
    if not sets:
        return None
    each_thread(lambda tid: os.sched_setaffinity(tid, sets[0]))
    return sets[0]


def schedule_as_batch() -> bool:
    """Put every thread of this process (and so the threads it makes later) under SCHED_BATCH, Linux's policy for
    CPU-bound work that nobody waits on: the same share of CPU as before, but its wake-ups never preempt a running
    thread. Collectors that step their own envs use it: two of them sharing a core ran 8% faster (no preempting
    each other mid-step), and a learner on the same cores is never preempted by a collector's wake-up. False where
    the platform has no such policy."""
    if not hasattr(os, "SCHED_BATCH"):
        return False
    each_thread(lambda tid: os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0)))
    return True


def role_main(run) -> None:
    """A role's entry point: install the stop flag first (so an early SIGTERM is not lost), then run the loop.

    After a clean return (sockets closed, checkpoints written and renamed) the process exits at once: the
    interpreter's teardown of torch and friends takes 0.3-1 s under load, which every stop would wait for
    (torchrun only notices a worker's exit after it). A worker forked by torchrun's agent (`rlctl.launch.torchrun`)
    returns instead: the agent waits for its return value, and multiprocessing then exits it without teardown.
    Unless the supervisor is gone or a signal stopped it: the agent is shutting down then (the kernel's SIGTERM once
    the supervisor is gone, the supervisor's SIGTERM to the whole group, Slurm's to every process, or its own to its
    workers) and never reads the value, and the worker would wait for it until killed: 4 s after a killed
    supervisor, and 21 s of a Slurm preemption's stop (the supervisor's SIGKILL) in a clean-clone CI, a stop that
    then counted against the run's wall time. A signalled worker exits 143 (128 + SIGTERM): should the agent be
    alive after all (the rank alone signalled), it takes that as a failed worker and restarts it from its
    checkpoint, where exit 0 without a return value would leave it waiting forever.
    """
    stop = StopFlag()
    cores = pin_cores()
    if cores is not None:
        from rlctl.launch.plan import core_ranges

        print(f"pinned to CPU cores {core_ranges(cores)} (pid {os.getpid()})", flush=True)
    stop.watch = watch_supervisor(stop.orphan)
    try:
        run(RoleContext.from_env(), stop)
    except Exception as exc:
        if not recurs(exc):
            raise
        startup_failed(exc)
    sys.stdout.flush()
    sys.stderr.flush()
    if multiprocessing.parent_process() is None or stop.orphaned:
        os._exit(0)
    if stop.signalled:
        os._exit(128 + signal.SIGTERM)


def recurs(exc: BaseException) -> bool:
    """Whether an error would recur on every start of the process: its env cannot be made, or code cannot be
    imported. Restarting such a process only repeats it."""
    from rlctl.envs import EnvStartError

    return isinstance(exc, (ImportError, EnvStartError))


def startup_failed(exc: BaseException) -> None:
    """Stop for good on an error that recurs: its traceback into the log, then the `exit` event with the cause on
    one line (the supervisor fails the run on it, naming the cause, and restarts nothing), then exit."""
    from rlctl.envs import EnvStartError
    from rlctl.job.entry_points import one_line

    traceback.print_exception(exc)
    cause = str(exc) if isinstance(exc, EnvStartError) else one_line(exc)
    sys.stderr.flush()
    events.emit("exit", reason=events.EXIT_STARTUP_FAILED, detail=" ".join(cause.split())[:2000])
    os._exit(events.STARTUP_FAILED_CODE)
