"""The supervisor: starts every process of a LaunchPlan, watches, restarts and stops them.

It is the only writer of the run directory: logs (one pump thread per process
timestamps each line), state.json (atomically, twice a second), TensorBoard
event files. Metrics and heartbeats arrive on the control ROUTER. Signals turn
into flags checked by the loop; shutdown always runs in `finally`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from rlctl import metric_names as M
from rlctl import wire
from rlctl.control import ControlError, ControlMessage, parse_control
from rlctl.durable import remove_temporaries
from rlctl.forkserver import FORKED_MODULES, ForkedProcess, ForkServer
from rlctl.hosts import ATTEMPT, SECRET_ENV, pull_directory, sweep_hosts
from rlctl.metrics import MetricsHub, TensorBoardWriter, flatten, hyperparameter_table, last_step
from rlctl.plan import CHECKPOINT_ROLES, LaunchPlan, ProcessSpec, make_plan, moved
from rlctl.remote import remote_checkpoint_dir
from rlctl.roles.context import LOG_FILE_ENV, SUPERVISOR_PID_ENV
from rlctl.rundir import RunDir, group_alive, process_start_time, remove_weight_board
from rlctl.slurm import job_nodes
from rlctl.spec import JobSpec, load_job, resolved_dict, with_host_secrets
from rlctl.stop_progress import StopProgress, stop_progress

STATE_INTERVAL_S = 0.5
REMOTE_KILL_WAIT_S = 2.0  # after KILL went down a session, how long before the session itself is cut
SSH_FAILED = 255
SESSIONS_OPENING_PER_HOST = 8
SESSION_LOGIN_TIMEOUT_S = 15.0  # a session silent this long no longer holds back the host's next ones
STOP_GRACE_S = 20.0
BINDING_ROLES = frozenset({"learner", "replay", "inference"})  # processes that bind sockets, and so hold the server secret
MAX_BACKOFF_S = 30.0
RANK_RESTART_GRACE_S = 60.0  # after hung ranks were killed: how long torchrun may take to start new ones
LOG_TAIL_LINES = 20
RATE_KEYS = {  # the one figure shown per process in the live table
    "collector": (M.ENV_STEPS_PER_S, "env steps/s"),
    "learner": (M.SAMPLES_PER_S, "samples/s"),
    "replay": (M.REPLAY_INSERT_PER_S, "inserts/s"),
    "evaluator": (M.EVAL_RETURN_MEAN, "eval return"),
    "inference": (M.INFERENCE_REQUESTS_PER_S, "requests/s"),
}


def agent_killed(code: int | None) -> bool:
    """Whether a learner node's exit code says its torchrun agent was killed (a signal, locally or as a shell
    reports it, or the SSH session lost), rather than torchrun giving up on ranks that kept failing (code 1)."""
    return code is not None and (code < 0 or code >= 128)


class ProcState(str, enum.Enum):
    """Health of one process, as `rlctl status` shows it."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    EXITED = "exited"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"  # a collector whose host stopped answering SSH; the run goes on without it


class LogPump(threading.Thread):
    """Copies a child's output into logs/<name>.log, one timestamped line at a time."""

    def __init__(self, stream, path: Path):
        super().__init__(daemon=True)
        self.stream, self.path = stream, path
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.spoke = threading.Event()  # the first line (or the end) arrived: an SSH session is past its login
        self.error: OSError | None = None  # why the log file could not be written (the run fails on it)

    def run(self) -> None:
        out = None
        try:
            out = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            self.error = exc
        for raw in iter(self.stream.readline, b""):
            self.spoke.set()
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            if out is None:
                continue  # the log is lost (self.error says why), but the child must never block on a full pipe
            now = time.time()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
            try:
                out.write(f"{stamp} {line}\n")
                out.flush()
            except OSError as exc:
                self.error = exc
                out = None
        self.spoke.set()


@dataclass
class ProcessHandle:
    """A running (or ended) process of the plan: the object to ProcessSpec's class."""

    spec: ProcessSpec
    popen: subprocess.Popen | ForkedProcess | None = None
    pump: LogPump | None = None
    state: ProcState = ProcState.STARTING
    restarts: int = 0
    exit_code: int | None = None
    last_heartbeat: float | None = None
    metrics: dict = field(default_factory=dict)
    kill_sent_at: float | None = None  # remote: when KILL went down the session
    started_at: float = 0.0
    lost_sessions: int = 0  # remote: sessions that ssh itself ended (exit 255: host unreachable, connection lost)
    last_exit: int | None = None  # exit code of the previous start, kept across restarts
    restart_times: deque = field(default_factory=deque)  # when each restart within the window happened
    start_at: float | None = None  # a restart waiting out its backoff
    note: str | None = None  # why it was last restarted or killed, for `rlctl status`
    rank_pids: dict = field(default_factory=dict)  # learner: torchrun rank -> pid (a hung rank is killed by pid)
    ranks_killed_at: float | None = None  # learner: hung ranks were killed then; torchrun is restarting them
    killed_ranks: set = field(default_factory=set)  # their pids: a message of theirs still queued is no new rank
    start_time: int | None = None  # the group leader's start time (rundir.process_start_time), against pid reuse

    def start(self, env: dict[str, str], logs_dir: Path, session_setup: bytes = b"",
              forkserver: ForkServer | None = None) -> None:
        """Spawn in a new process group, output piped to a LogPump; forked by `forkserver` where one is given.

        A remote process's argv is its `ssh` session: `session_setup` (secrets, the job file) goes down the
        session's stdin, which then stays open for TERM/KILL lines.
        """
        argv = [a.replace(ATTEMPT, str(self.restarts)) for a in self.spec.argv]  # a fresh control socket per start
        forked = forkserver.spawn(argv[2], env) if forkserver is not None else None
        self.popen = forked or subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE if self.spec.remote else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        if self.spec.remote:
            self.tell(session_setup)
        self.pump = LogPump(self.popen.stdout, logs_dir / f"{self.spec.name}.log")
        self.pump.start()
        self.state, self.exit_code, self.last_heartbeat = ProcState.STARTING, None, None
        self.kill_sent_at, self.started_at = None, time.time()
        self.start_time = None if self.spec.remote else process_start_time(self.popen.pid)

    def forget_ranks(self) -> None:
        """A learner's ranks are gone (its group killed): no pids, no restart of theirs being waited for."""
        self.rank_pids.clear()
        self.killed_ranks.clear()
        self.ranks_killed_at = None

    def tell(self, data: bytes, close: bool = False) -> None:
        """Write to a remote session's stdin (gone sessions are ignored: their end is noticed by poll)."""
        try:
            self.popen.stdin.write(data)
            self.popen.stdin.flush()
            if close:
                self.popen.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass

    @property
    def pid(self) -> int | None:
        """OS pid (also the process group id)."""
        return self.popen.pid if self.popen else None

    def signal_group(self, sig: int) -> None:
        """Signal the whole process group (torchrun's workers included); a remote one through its session."""
        if self.popen is None:
            return
        if self.spec.remote and self.popen.poll() is None:
            if sig == signal.SIGTERM:
                self.tell(b"TERM\n")
                return
            if sig == signal.SIGKILL and self.kill_sent_at is None:
                self.kill_sent_at = time.time()
                self.tell(b"KILL\n", close=True)  # the remote side kills the group, then the session ends
                return
            if sig == signal.SIGKILL and time.time() - self.kill_sent_at < REMOTE_KILL_WAIT_S:
                return
            # A session that does not end by itself (a dead host): closing ours makes the remote side end its group.
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self) -> bool:
        """True while any process of the group exists (for a remote one: while its session lasts)."""
        if self.popen is None:
            return False
        if self.spec.remote:
            return self.popen.poll() is None
        self.popen.poll()  # reap the leader so a dead group is not kept alive by a zombie
        return group_alive(self.popen.pid)

    def row(self) -> dict:
        """This process's entry in state.json."""
        key, unit = RATE_KEYS.get(self.spec.role, ("", ""))
        return {
            "name": self.spec.name, "role": self.spec.role, "rank": self.spec.rank, "host": self.spec.host,
            "pid": self.pid, "pgid": self.pid, "start_time": self.start_time, "state": self.state.value,
            "restarts": self.restarts + int(self.metrics.get(M.LEARNER_RESTARTS, 0) or 0),
            "exit_code": self.exit_code, "rate": self.metrics.get(key), "rate_unit": unit,
            "last_heartbeat": self.last_heartbeat, "remote": self.spec.remote, "note": self.note,
        }


RETURN_HISTORY = 40  # points of the mean training return kept in state.json, one per metrics interval

# The scalars TensorBoard's HParams tab shows for each run (their last values: the run's final figures).
HPARAM_METRICS = [M.EPISODE_RETURN_MEAN, M.EVAL_RETURN_MEAN, M.ENV_STEPS, M.ENV_STEPS_PER_S, M.SAMPLES_PER_S]


class StopCriteria:
    """The job's stop rules over the run-level metrics; returns the reason once one is met (rlctl.stop_progress:
    the same computation the progress lines show)."""

    def __init__(self, spec: JobSpec, started: float):
        self.stop, self.started = spec.job.stop.model_dump(), started

    def met(self, m: dict, episodes_seen: int, now: float) -> StopProgress | None:
        """The first criterion met, or None."""
        return next((p for p in stop_progress(self.stop, m, now - self.started, episodes_seen) if p.met), None)

    def reached(self, m: dict, episodes_seen: int, now: float) -> str | None:
        """A human-readable reason, or None."""
        met = self.met(m, episodes_seen, now)
        return met.reason if met else None


class Supervisor:
    """Runs one plan to its end: finished, stopped or failed."""

    def __init__(self, spec: JobSpec, plan: LaunchPlan, rundir: RunDir, keys: wire.CurveKeys,
                 display=None, resumed: dict | None = None):
        self.spec, self.plan, self.rundir = spec, plan, rundir
        # Every process gets a client key pair of its own, and the server secret only if it binds a socket; servers
        # admit exactly these keys, and a control message counts only from the process its key was given to.
        pairs = {p.name: zmq.curve_keypair() for p in plan.processes}
        owners = {keys.client_public: "supervisor", **{cp: name for name, (cp, _) in pairs.items()}}
        self.keys = dataclasses.replace(keys, allowed=tuple(owners), owners=tuple(owners.values()))
        self.process_keys = {p.name: keys.for_process(pairs[p.name], p.role in BINDING_ROLES, owners)
                             for p in plan.processes}
        self.display = display  # callable(state) for the live table / progress line, or None
        self.handles = [ProcessHandle(p) for p in plan.processes]
        self.by_name = {h.spec.name: h for h in self.handles}
        self.hub = MetricsHub(spec.job.stop.train_return_window)
        self.return_history: deque[float] = deque(maxlen=RETURN_HISTORY)  # the sparkline of rlctl status
        self.wandb = None  # rlctl.wandb_mirror.WandbMirror when the job asks for one
        # A resumed run continues the counters (and TensorBoard's step axis) of the segments before it.
        self.segments: list[dict] = list((resumed or {}).get("segments", []))
        self.tb_floor = -1  # TensorBoard points of this segment come after this step
        if resumed:
            # state.json lags the event files by up to half a second after a kill: whichever is further wins.
            self.tb_floor = last_step(str(rundir.tb_dir))
            self.hub.continue_from(max(int(resumed.get("env_steps", 0)), self.tb_floor),
                                   int(resumed.get("episodes", 0)))
        self.status = "created"
        self.exit_reason: str | None = None  # for people; code reads stopped_by and failure
        self.stopped_by: dict | None = None  # the [job.stop] criterion met (StopProgress.record)
        self.failure: dict | None = None
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.stop_signals = 0
        self.control: zmq.Socket | None = None
        self.net: wire.SecureContext | None = None
        self.control_dropped = 0
        self.identities: dict[str, list] = {}  # control-channel sender -> ROUTER identity, for `stop`
        self.job_text = rundir.job_toml.read_text() if any(p.remote for p in plan.processes) else ""
        self.remote_hosts = [h for h in spec.hosts if not h.is_local]
        # The Slurm job whose steps this run's processes are (None over SSH), and the nodes that left it mid-run.
        self.slurm_job = next((h.slurm_job for h in spec.hosts if h.slurm_job is not None), None)
        self.lost_nodes: set[str] = set()
        self.remote_cleanup: dict[str, dict] = {}  # host -> what shutdown found and fetched there
        self.next_ping = 0.0
        self.forkserver: ForkServer | None = None
        self.own_start = process_start_time(os.getpid())  # with the pid: `rlctl stop` never signals a reused pid

    # -- signals -------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        self.stop_signals += 1
        if self.exit_reason is None:
            self.exit_reason = f"stopped by {signal.Signals(signum).name}"

    # -- state ---------------------------------------------------------------
    def state(self) -> dict:
        """The state.json document."""
        metrics = self._metrics()
        return {
            "run_id": self.plan.run_id, "job": self.plan.job, "algorithm": self.plan.algorithm,
            "status": self.status, "supervisor_pid": os.getpid(), "supervisor_start": self.own_start,
            "supervisor_host": socket.gethostname(), "slurm_job_id": self.slurm_job,
            "started_at": self.started_at,
            "ended_at": self.ended_at, "updated_at": time.time(), "exit_reason": self.exit_reason,
            "stopped_by": self.stopped_by,
            "failure": self.failure, "hosts": [h["name"] for h in self.plan.hosts], "host_rows": self.host_rows(),
            "processes": [h.row() for h in self.handles], "metrics": metrics,
            "learner_ranks": {str(r): v for r, v in sorted(self.hub.learner_ranks.items())},
            "segments": self.segments + [{"started_at": self.started_at, "ended_at": self.ended_at}],
            "stop": self.spec.job.stop.model_dump(), "episodes_seen": self.hub.episodes,
            "return_history": list(self.return_history),
        }

    def host_rows(self) -> list[dict]:
        """Per host: its processes, how many run, restarts, sessions lost, and its state (ok, lost, stopped, k/n up)."""
        rows = []
        for host in self.plan.hosts:
            mine = [h for h in self.handles if h.spec.host == host["name"]]
            running = sum(h.state == ProcState.RUNNING for h in mine)
            if host["name"] in self.lost_nodes or (
                    not host["local"] and running == 0 and any(h.last_exit == SSH_FAILED for h in mine)):
                state = "lost"
            elif running == len(mine):
                state = "ok"
            elif all(h.state in (ProcState.STOPPED, ProcState.EXITED) for h in mine):
                state = "stopped"
            else:
                state = f"{running}/{len(mine)} up"
            rows.append({"name": host["name"], "remote": not host["local"], "via": host.get("via"), "state": state,
                         "processes": len(mine),
                         "running": running, "restarts": sum(h.restarts for h in mine),
                         "lost_sessions": sum(h.lost_sessions for h in mine),
                         "cleanup": self.remote_cleanup.get(host["name"])})
        return rows

    def _publish(self) -> dict:
        state = self.state()
        self.rundir.write_state(state)
        if self.display is not None:
            self.display(state)
        return state

    # -- main ----------------------------------------------------------------
    def run(self) -> int:
        """Start everything, supervise until a stop, shut down. Returns the exit code (0 ok, 1 failed)."""
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        remove_temporaries(self.rundir.path)  # what a killed supervisor was writing
        net = self.net = wire.SecureContext(self.keys)
        tb: TensorBoardWriter | None = None
        try:
            self.control = net.server(zmq.ROUTER, str(self.plan.endpoints["control"]), rcvhwm=10000)
            self.status = "starting"
            self._publish()
            # W&B's start-up (its service process) takes seconds: paid before any process runs, not in the middle
            # of the run, where it held up reading heartbeats and the stop rules (a 40k-step stop ended at 59k).
            self._open_wandb()
            self.forkserver = self._start_forkserver()
            self._start_all()
            tb = self._open_tb()  # TensorBoard's import takes ~0.2 s: only once every process is on its way
            self.status = "running"
            self._loop(tb)
        except Exception as exc:  # a fault of the supervisor itself: the run fails, and shutdown still runs
            self._fail_self(exc)
        finally:
            # A finished run says so only once shutdown is done (final checkpoints written, every process gone):
            # whoever waits for "finished" may then read the run's files.
            reached = self.status == "finished"
            if self.status in ("starting", "running", "finished"):
                self.status = "stopping"
            self._guarded(self._publish)
            try:
                self._shutdown()
            except Exception as exc:
                self._fail_self(exc)
                self._kill_everything()
            self.ended_at = time.time()
            if self.status == "stopping":
                self.status = "finished" if reached else "stopped"
            self._guarded(lambda: self._final_tb(tb))
            if self.forkserver is not None:
                self.forkserver.close()
            self._publish_final()
            net.close()
            for s, h in old.items():
                signal.signal(s, h)
        return 1 if self.status == "failed" else 0

    def _fail_self(self, exc: BaseException) -> None:
        """Record a fault of the supervisor's own (a full disk, a bug) as the run's failure, once."""
        traceback.print_exception(exc, file=sys.stderr)
        if self.status != "failed":
            self.status = "failed"
            self.exit_reason = f"supervisor error: {type(exc).__name__}: {exc}"
            self.failure = {"process": "supervisor", "error": f"{type(exc).__name__}: {exc}"}

    def _guarded(self, step) -> None:
        """Run one shutdown step; a failure is recorded and the next steps still run."""
        try:
            step()
        except Exception as exc:
            self._fail_self(exc)

    def _final_tb(self, tb: TensorBoardWriter | None) -> None:
        tb = tb or self._open_tb()
        try:
            self._write_tb(tb)
            tb.hparams_end(self.status != "failed", time.time())
        finally:
            tb.close()
            if self.wandb is not None:
                self.wandb.finish(self.status != "failed")

    def _publish_final(self) -> None:
        """The last state.json; on a full disk, in place over the old one (whose blocks that frees), so `status`
        still says how the run ended."""
        state = self.state()
        try:
            self.rundir.write_state(state)
        except OSError as exc:
            self._fail_self(exc)
            state = self.state()
            try:
                self.rundir.write_state(state, in_place=True)
            except OSError as again:
                print(f"rlctl: could not write {self.rundir.state_json}: {again}", file=sys.stderr)
        if self.display is not None:
            self.display(state)
        if self.status == "failed" and self.failure and self.failure.get("process") == "supervisor":
            print(f"rlctl: run {self.plan.run_id} failed: {self.exit_reason}", file=sys.stderr)

    def _kill_everything(self) -> None:
        """Last resort when shutdown itself failed: SIGKILL every process group, so none is orphaned."""
        for h in self.handles:
            h.signal_group(signal.SIGKILL)

    def _open_tb(self) -> TensorBoardWriter:
        tb = TensorBoardWriter(str(self.rundir.tb_dir), after_step=self.tb_floor)
        hparams = flatten(resolved_dict(self.spec))
        tb.text("hyperparameters", hyperparameter_table(hparams))
        tb.hparams_start(hparams, HPARAM_METRICS, self.started_at)
        return tb

    def _open_wandb(self) -> None:
        if self.spec.logging.wandb is not None:
            from rlctl.wandb_mirror import open_mirror

            self.wandb = open_mirror(self.spec.logging.wandb, self.plan.run_id, str(self.rundir.path),
                                     flatten(resolved_dict(self.spec)))

    def _loop(self, tb: TensorBoardWriter) -> None:
        criteria = StopCriteria(self.spec, self.started_at)
        next_state = next_tb = 0.0
        tb_interval = self.spec.logging.metrics_interval_s
        while True:
            if self.stop_signals:
                return
            self._ping_sessions()
            self._drain_control(100)
            if self._check_children() or self._check_pumps():
                return
            now = time.time()
            self._check_hung(now)
            self._start_due(now)
            if now >= next_tb:
                next_tb = now + tb_interval
                self._write_tb(tb)
            if now >= next_state:
                next_state = now + STATE_INTERVAL_S
                self._publish()
            # Checked on every pass (not only with state.json): a run that is done stops within 0.1 s.
            met = criteria.met(self.hub.snapshot(), self.hub.episodes, now)
            if met:
                self.status, self.exit_reason, self.stopped_by = "finished", met.reason, met.record()
                return

    def _ping_sessions(self) -> None:
        """Every third of network.session_timeout_s, a line down each remote session: its process keeps running
        only while it hears from this supervisor."""
        now = time.time()
        if now < self.next_ping:
            return
        self.next_ping = now + self.spec.network.session_timeout_s / 3
        for h in self.handles:
            if h.spec.remote and h.popen is not None and h.popen.poll() is None and h.kill_sent_at is None:
                h.tell(b"PING\n")

    @staticmethod
    def _inherited_env(h: ProcessHandle) -> dict[str, str]:
        """What a local process's environment holds besides its own RLCTL_* settings (and the keys)."""
        return {**os.environ, **{k: v for k, v in h.spec.env.items() if not k.startswith("RLCTL_")}}

    def _forkable(self, h: ProcessHandle) -> bool:
        """A local collector, evaluator or replay shard that the fork server's interpreter can become."""
        argv = h.spec.argv
        return (not h.spec.remote and len(argv) == 3 and argv[0] == sys.executable and argv[1] == "-m"
                and argv[2] in FORKED_MODULES
                and (self.forkserver is None or self._inherited_env(h) == self.forkserver.env))

    def _start_forkserver(self) -> ForkServer | None:
        """The fork server, when two or more local processes can come from it (one import of torch, not N)."""
        forkable = [h for h in self.handles if self._forkable(h)]
        if len(forkable) < 2:
            return None
        return ForkServer(sys.executable, self._inherited_env(forkable[0]), str(self.rundir.path / "forkserver.out"))

    def _start_all(self) -> None:
        """Start every process at once, except that at most SESSIONS_OPENING_PER_HOST SSH sessions to one host are
        logging in at a time: sshd's default MaxStartups (10:30:100) drops connections beyond 10 unauthenticated.
        Processes from the fork server come last: the first of them waits for the server's imports."""
        waiting: dict[str, deque[ProcessHandle]] = {}
        for h in sorted(self.handles, key=lambda h: self.forkserver is not None and self._forkable(h)):
            if h.spec.remote:
                waiting.setdefault(h.spec.host, deque()).append(h)
            else:
                self._start(h)
        opening: dict[str, list[ProcessHandle]] = {host: [] for host in waiting}
        while any(waiting.values()) and not self.stop_signals:
            for host, queue in waiting.items():
                now = time.time()
                opening[host] = [h for h in opening[host] if not h.pump.spoke.is_set() and h.popen.poll() is None
                                 and now - h.started_at < SESSION_LOGIN_TIMEOUT_S]
                while queue and len(opening[host]) < SESSIONS_OPENING_PER_HOST:
                    h = queue.popleft()
                    self._start(h)
                    opening[host].append(h)
            if any(waiting.values()):
                self._ping_sessions()
                self._drain_control(20)

    def _start(self, h: ProcessHandle) -> None:
        """Start (or restart) one process; the keys go into its environment only, never onto a command line."""
        if not h.spec.remote:
            forkserver = self.forkserver if self.forkserver is not None and self._forkable(h) else None
            # The supervisor's pid: a local process stops by itself once this supervisor is gone (context.py).
            own = {SUPERVISOR_PID_ENV: str(os.getpid()), LOG_FILE_ENV: str(self.rundir.logs_dir / f"{h.spec.name}.log")}
            h.start({**os.environ, **h.spec.env, wire.KEYS_ENV: self.process_keys[h.spec.name].to_env(), **own},
                    self.rundir.logs_dir,
                    forkserver=forkserver)
            return
        # Remote: the local ssh gets this machine's environment; the process's own arrives in the session (srun
        # hands its own environment to the step: the process's settings travel there, never on a command line).
        secrets = {k: h.spec.env[k] for k in h.spec.secret_keys if k in h.spec.env}  # never on a command line
        setup = {"env": {wire.KEYS_ENV: self.process_keys[h.spec.name].to_env(), **secrets}, "files": {h.spec.env["RLCTL_JOB"]: self.job_text},
                 "session_timeout_s": self.spec.network.session_timeout_s}
        env = dict(os.environ)
        if self.slurm_job is not None:
            env.update({k: v for k, v in h.spec.env.items() if k not in SECRET_ENV and k not in h.spec.secret_keys})
        h.start(env, self.rundir.logs_dir, json.dumps(setup).encode() + b"\n")

    def _drain_control(self, timeout_ms: int) -> None:
        """Handle every control message that arrives within timeout_ms (malformed ones are dropped and counted)."""
        if self.control is None or not self.control.poll(timeout_ms):
            return
        for identity, msg in wire.receive_waiting(self.control, routed=True):
            try:
                if msg is None:
                    raise ControlError("undecodable")
                self._on_message(parse_control(msg.kind, msg.sender, msg.meta), identity, msg.peer)
            except ControlError:
                self.control_dropped += 1

    def _on_message(self, msg: ControlMessage, identity: list, peer: str | None) -> None:
        """A validated hello or heartbeat: the sender is alive; its figures go to the hub."""
        if msg.role == "learner":
            # Learner senders are named by torchrun rank; the plan's static rendezvous fixes each rank's node.
            if msg.rank >= self.spec.learner_ranks:
                raise ControlError(f"no learner rank {msg.rank}")
            handle = self.by_name.get(f"learner-{self.spec.learner_node_of(msg.rank)}")
        else:
            handle = self.by_name.get(msg.sender)
        if handle is None:
            raise ControlError(f"no process {msg.sender} in the plan")
        owner = self.keys.owner(peer)
        if owner != handle.spec.name:  # a sender is who CURVE says, not what it claims
            raise ControlError(f"{msg.sender} sent with the key of {owner or 'nobody'}")
        self.identities[msg.sender] = identity
        handle.last_heartbeat = time.time()
        if handle.state == ProcState.STARTING:
            handle.state = ProcState.RUNNING
        if msg.role == "learner" and msg.pid is not None and msg.pid not in handle.killed_ranks:
            handle.rank_pids[msg.rank] = msg.pid
        if msg.kind != "heartbeat":
            return
        metrics = {**msg.metrics, **msg.episodes}
        if msg.role == "learner":
            metrics["rank"] = msg.rank
            if msg.rank != 0:
                self.hub.on_heartbeat(f"learner-rank{msg.rank}", "learner", metrics)
                return
        self.hub.on_heartbeat(handle.spec.name, handle.spec.role, metrics)
        handle.metrics = self.hub.latest.get(handle.spec.name, {})

    def _check_children(self) -> bool:
        """Reap exited children; restart or fail. True when the run must end."""
        for h in self.handles:
            if (h.popen is None or h.start_at is not None  # ended already, waiting out its backoff
                    or h.state in (ProcState.FAILED, ProcState.EXITED, ProcState.STOPPED, ProcState.LOST)):
                continue
            code = h.popen.poll()
            if code is None:
                continue
            h.exit_code = h.last_exit = code
            if h.spec.remote and code == SSH_FAILED:
                h.lost_sessions += 1
            if h.pump:
                h.pump.join(timeout=2)
            if self.slurm_job is not None and h.spec.remote:
                ended = self._slurm_exit(h)
                if ended:
                    return True
                if ended is False:
                    continue
            if self._schedule_restart(h):
                continue
            if self._can_lose(h):
                h.state, h.metrics = ProcState.LOST, {}
                continue
            h.state = ProcState.FAILED
            topo = self.spec.topology
            why = ("torchrun gave up restarting its ranks" if h.spec.critical and not agent_killed(code) else
                   f"exceeded {topo.max_restarts} restarts within {topo.restart_window_s:g}s")
            self.status = "failed"
            self.exit_reason = f"{h.spec.name} exited with code {code} ({why})"
            self.failure = {"process": h.spec.name, "exit_code": code,
                            "log_tail": list(h.pump.tail) if h.pump else []}
            return True
        return False

    def _slurm_exit(self, h: ProcessHandle) -> bool | None:
        """A step ended: whether its node (or the whole job) left the allocation. A collector of a lost node starts
        again on the node with the fewest processes; any other role lost ends the run. None: an ordinary exit."""
        nodes = job_nodes(self.slurm_job)
        if nodes is None:
            self.status = "stopped"
            self.exit_reason = f"Slurm job {self.slurm_job} ended (scancel, its time limit or a failed node)"
            return True
        if h.spec.host in nodes:
            return None
        if h.spec.host not in self.lost_nodes:
            self.lost_nodes.add(h.spec.host)
            print(f"rlctl: node {h.spec.host} left Slurm job {self.slurm_job}", file=sys.stderr, flush=True)
        if h.spec.role != "collector":
            self.status = "failed"
            self.exit_reason = f"{h.spec.name}'s node {h.spec.host} left Slurm job {self.slurm_job}"
            self.failure = {"process": h.spec.name, "exit_code": h.exit_code,
                            "log_tail": list(h.pump.tail) if h.pump else []}
            h.state = ProcState.LOST
            return True
        load = {n: sum(o.spec.host == n and o.state != ProcState.LOST for o in self.handles) for n in nodes}
        target = min((host for host in self.spec.hosts if host.name in load), key=lambda x: (x.learner, load[x.name]))
        old = h.spec.host
        h.spec = moved(h.spec, target, target.advertise_address or target.name)
        h.note = f"node {old} lost at {time.strftime('%H:%M:%S')}; moved to {target.name}"
        h.restarts += 1
        h.state, h.start_at = ProcState.RESTARTING, time.time()
        self.hub.on_restart(h.spec.name)
        return False

    def _schedule_restart(self, h: ProcessHandle) -> bool:
        """Restart an ended process after its backoff, unless it used up its restarts within the window (or may
        not be restarted here: learner ranks are restarted by torchrun). True when a restart is scheduled."""
        topo, now = self.spec.topology, time.time()
        while h.restart_times and now - h.restart_times[0] > topo.restart_window_s:
            h.restart_times.popleft()
        if (h.spec.critical and not agent_killed(h.exit_code)) or len(h.restart_times) >= topo.max_restarts:
            return False
        delay = min(topo.restart_backoff_s * 2 ** len(h.restart_times), MAX_BACKOFF_S)
        if not (h.note or "").startswith("hung") or h.exit_code not in (-signal.SIGKILL, 128 + signal.SIGKILL):
            h.note = f"exited with code {h.exit_code} at {time.strftime('%H:%M:%S')}; restarted after {delay:.1f}s"
        h.restart_times.append(now)
        h.restarts += 1
        h.state, h.start_at = ProcState.RESTARTING, now + delay
        self.hub.on_restart(h.spec.name)
        if h.spec.critical:
            self._restart_learner_nodes(h)
        return True

    def _restart_learner_nodes(self, dead: ProcessHandle) -> None:
        """A learner node's torchrun agent was killed: what is left of its group goes too (its ranks would keep the
        ports), and so do the other learner nodes, which start again with it (a static rendezvous is joined by
        every node at once); all continue from the newest checkpoint."""
        dead.forget_ranks()
        dead.signal_group(signal.SIGKILL)
        for h in self.handles:
            if h.spec.critical and h is not dead and h.state in (ProcState.STARTING, ProcState.RUNNING):
                h.signal_group(signal.SIGKILL)
                if h.popen is not None and not h.spec.remote:
                    h.popen.wait()
                h.note = f"restarted with {dead.spec.name} at {time.strftime('%H:%M:%S')}"
                h.forget_ranks()
                h.restarts += 1
                h.state, h.start_at = ProcState.RESTARTING, dead.start_at

    def _start_due(self, now: float) -> None:
        """Start the restarts whose backoff has passed."""
        for h in self.handles:
            if h.state == ProcState.RESTARTING and h.start_at is not None and now >= h.start_at:
                h.start_at = None
                self._start(h)

    def _check_hung(self, now: float) -> None:
        """A running process silent for heartbeat_timeout_s is hung: killed, then restarted as if it had died (a
        learner's ranks are killed by pid and torchrun restarts them)."""
        timeout = self.spec.logging.heartbeat_timeout_s
        for h in self.handles:
            if h.ranks_killed_at is not None:
                # torchrun is restarting the ranks killed below (importing, rendezvous, checkpoint: ~10 s): their
                # first hello ends the wait; only a restart that never comes kills the agent (then it is restarted).
                if h.rank_pids:  # a new rank said hello
                    h.ranks_killed_at = None
                    h.killed_ranks.clear()
                elif now - h.ranks_killed_at <= max(RANK_RESTART_GRACE_S, 3 * timeout):
                    continue
                else:
                    h.ranks_killed_at = None
                    h.note = f"hung: torchrun did not restart its ranks; killed at {time.strftime('%H:%M:%S')}"
                    print(f"rlctl: {h.spec.name} {h.note}", file=sys.stderr, flush=True)
                    h.signal_group(signal.SIGKILL)
                    continue
            if h.state != ProcState.RUNNING or h.last_heartbeat is None or now - h.last_heartbeat <= timeout:
                continue
            h.note = f"hung: no heartbeat for {now - h.last_heartbeat:.0f}s; killed at {time.strftime('%H:%M:%S')}"
            print(f"rlctl: {h.spec.name} {h.note}", file=sys.stderr, flush=True)
            h.last_heartbeat = now  # one kill per silence; the restart (or torchrun's) gives it a fresh start
            if h.spec.role == "learner" and h.rank_pids and not h.spec.remote:
                for pid in h.rank_pids.values():
                    try:
                        os.kill(pid, signal.SIGCONT)  # a frozen rank must run to die of SIGKILL's successor
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                h.killed_ranks.update(h.rank_pids.values())
                h.rank_pids.clear()
                h.ranks_killed_at = now
            else:
                h.signal_group(signal.SIGKILL)

    def _check_pumps(self) -> bool:
        """A log that can no longer be written (a full disk) ends the run: nothing of a run may go unrecorded."""
        for h in self.handles:
            if h.pump is not None and h.pump.error is not None:
                self.status = "failed"
                self.exit_reason = f"cannot write {h.spec.name}'s log: {h.pump.error}"
                self.failure = {"process": "supervisor", "error": str(h.pump.error)}
                return True
        return False

    def _can_lose(self, h: ProcessHandle) -> bool:
        """A collector on a host that SSH no longer reaches is given up, not the run, while other collectors
        remain; synchronous PPO waits for every collector's rollout each round, so it cannot go on without one."""
        others = [o for o in self.handles if o.spec.role == "collector" and o is not h]
        return (h.spec.role == "collector" and h.spec.remote and h.last_exit == SSH_FAILED
                and not self.spec.algo.synchronous
                and any(o.state not in (ProcState.FAILED, ProcState.LOST) for o in others))

    def _metrics(self) -> dict:
        """The run's figures: the processes' (the hub's), with what the supervisor's own control socket dropped and
        refused added to theirs."""
        metrics = self.hub.snapshot()
        metrics[M.NET_DROPPED] = metrics.get(M.NET_DROPPED, 0) + self.control_dropped
        metrics[M.NET_REFUSED] = metrics.get(M.NET_REFUSED, 0) + (self.net.refused if self.net is not None else 0)
        return metrics

    def _write_tb(self, tb: TensorBoardWriter) -> None:
        snap = self._metrics()
        step = int(snap.get(M.ENV_STEPS, 0))
        episodes = self.hub.drain_episodes()
        values = {k: v for k, v in snap.items() if isinstance(v, (int, float))}
        if episodes:  # the episodes that ended since the last point
            values[M.EPISODE_RETURN] = sum(episodes) / len(episodes)
        if isinstance(snap.get(M.EPISODE_RETURN_MEAN), (int, float)):
            self.return_history.append(float(snap[M.EPISODE_RETURN_MEAN]))
        tb.scalars(values, step)
        tb.flush()
        if self.wandb is not None:
            self.wandb.log(values, step)

    # -- shutdown ------------------------------------------------------------
    def _shutdown(self) -> None:
        """Everything at once, except replay shards, which outlive the learners (a last update samples from them);
        SIGKILL after the grace."""
        learners = [h for h in self.handles if h.spec.role == "learner"]
        shards = [h for h in self.handles if h.spec.role == "replay"]
        others = [h for h in self.handles if h.spec.role not in ("learner", "replay")]
        self._signals_at_shutdown = self.stop_signals
        # Learner ranks get `stop` on the control channel: they agree on a last update, checkpoint and exit 0, so
        # torchrun ends cleanly. SIGTERM remains the fallback for ranks that never said hello.
        told = [ident for sender, ident in self.identities.items() if sender.startswith("learner-")]
        for identity in told:
            wire.send(self.control, "stop", "supervisor", prefix=identity, flags=zmq.NOBLOCK)
        # Collectors and the evaluator stop meanwhile: nothing waits on them (shutdown in parallel, not in turn).
        for h in others:
            h.signal_group(signal.SIGTERM)
        self._wait_gone(learners, STOP_GRACE_S, term_after=5.0 if told else 0.0)
        for h in shards:
            h.signal_group(signal.SIGTERM)
        self._wait_gone(shards + others, STOP_GRACE_S)
        for h in self.handles:
            if h.popen is not None:
                try:
                    h.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    h.signal_group(signal.SIGKILL)
                    h.popen.wait()
                if h.exit_code is None:
                    h.exit_code = h.popen.returncode
                if h.state != ProcState.LOST:
                    h.last_exit = h.popen.returncode
                if h.state not in (ProcState.FAILED, ProcState.LOST):
                    h.state = ProcState.STOPPED
            if h.pump:
                h.pump.join(timeout=2)
        self._drain_control(0)
        remove_weight_board(self.plan.to_dict())
        if self.remote_hosts:
            self._finish_remote()

    def _finish_remote(self) -> None:
        """Bring remote checkpoints home, then make sure nothing of the run is left on any remote host."""
        writers = {p.host for p in self.plan.processes if p.remote and p.role in CHECKPOINT_ROLES}
        fetched = pull_directory([h for h in self.remote_hosts if h.name in writers],
                                 remote_checkpoint_dir(self.plan.run_id), self.rundir.checkpoints_dir)
        for name, files in fetched.items():
            if isinstance(files, str):  # the files stay on the host: say where, they are the run's to keep
                print(f"rlctl: could not fetch checkpoints from host {name}: {files}; they remain there in "
                      f"{remote_checkpoint_dir(self.plan.run_id)} under its working directory", file=sys.stderr)
        for name, result in sweep_hosts(self.remote_hosts, self.plan.run_id, kill=True).items():
            self.remote_cleanup[name] = {**result, **({"checkpoints": fetched[name]} if name in fetched else {})}

    def _wait_gone(self, group: list[ProcessHandle], grace: float, term_after: float = -1.0) -> None:
        """Wait for the groups to exit: SIGTERM at term_after seconds (if >= 0), SIGKILL at the grace."""
        start = time.time()
        deadline = start + grace
        termed = term_after < 0
        while any(h.group_alive() for h in group):
            if not termed and time.time() >= start + term_after:
                termed = True
                for h in group:
                    h.signal_group(signal.SIGTERM)
            # Another Ctrl-C during shutdown (or the grace running out) forces.
            if time.time() > deadline or self.stop_signals > self._signals_at_shutdown:
                for h in group:
                    h.signal_group(signal.SIGKILL)
            self._ping_sessions()
            self._drain_control(10)  # final heartbeats (checkpoint, parameter digests) arrive now


def supervise_rundir(path: str, display=None) -> int:
    """Run the job stored in a prepared run directory (job.toml + plan.json); used by `run` and `run --detach`."""
    os.umask(0o077)  # everything the run writes, here and in the processes it starts: folders 0700, files 0600
    rundir = RunDir(Path(path))
    spec = with_host_secrets(load_job(rundir.job_toml), rundir.read_secrets())
    saved = rundir.read_plan() or {}
    # The addresses `rlctl run` resolved for the hosts are part of the saved plan: the same plan is rendered again.
    addresses = {h["name"]: h["address"] for h in saved.get("hosts", []) if "address" in h}
    control = str((saved.get("endpoints") or {}).get("control", ""))  # where Slurm steps reach this supervisor
    plan = make_plan(spec, rundir.run_id, str(rundir.path), int(saved.get("base_port", 0)), python=sys.executable,
                     addresses=addresses, board_token=str(saved.get("board_token", "")),
                     control_address=control.removeprefix("tcp://").rsplit(":", 1)[0] or "127.0.0.1")
    resumed = (rundir.read_state() or {}).get("resumed")  # `rlctl run --resume` left what to continue from
    return Supervisor(spec, plan, rundir, wire.CurveKeys.generate(), display,
                      resumed if isinstance(resumed, dict) else None).run()


if __name__ == "__main__":
    # `rlctl run --detach` starts this; its stdout is the run's supervisor.out.
    from rlctl.console import progress_printer

    sys.exit(supervise_rundir(sys.argv[1], display=progress_printer()))
