"""The process table: every process of a run, and what the restart policy makes of their exits and silences.

A ProcessHandle is one process of the plan as it runs here (its group, its log pump, the session of a remote one);
its Lifecycle (restart_policy.py) says where it is in its life. The table notices ends, silences and lost Slurm
nodes, fires the policy's events and carries out what it decides (kills now; starts are the caller's, through
process_start.py). What ends the run comes back as a RunEnd.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rlctl import events
from rlctl.net.control import ControlMessage
from rlctl.launch.forkserver import ForkedProcess, ForkServer
from rlctl.launch.hosts import ATTEMPT, CONTROL_VIA_ENV
from rlctl.launch.plan import LaunchPlan, ProcessSpec, moved, re_placement
from rlctl.supervise.host_loss import HostWatch, restart_delay
from rlctl.supervise import spares
from rlctl.supervise.restart_policy import SSH_FAILED, Lifecycle, ProcState, RestartPolicy
from rlctl.supervise.run_state import RunEnd
from rlctl.liveness import group_alive, process_start_time
from rlctl.run_logs import stamp
from rlctl.launch.slurm import job_nodes
from rlctl.job.spec import JobSpec
from rlctl.run_status import RunStatus
from rlctl.role_names import Role

REMOTE_KILL_WAIT_S = 2.0  # after KILL went down a session, how long before the session itself is cut
LOG_TAIL_LINES = 20
# After the stop, how long the supervisor waits for the processes' output to reach their logs (the pipes to close)
# before it writes the run's end: a pipe stays open past its process only if something outside the group holds it.
LOG_DRAIN_S = 10.0
# An elastic head whose host this many starts in a row did not reach is lost with it: the run goes on elsewhere.
HEAD_UNREACHED_STARTS = 2


class LogPump(threading.Thread):
    """Copies a child's output into logs/<name>.log, one timestamped line at a time."""

    def __init__(self, stream, path: Path):
        super().__init__(daemon=True)
        self.stream, self.path = stream, path
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.spoke = threading.Event()  # the first line (or the end) arrived: an SSH session is past its login
        self.error: OSError | None = None  # why the log file could not be written (the run fails on it)
        self.startup_failure: str | None = None  # the cause, once the process said it cannot start (rlctl.events)
        self.session_at: float | None = None  # when an SSH session's far side began: its host answered then

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
            if events.PREFIX in line:
                self._note_event(line)
            if out is None:
                continue  # the log is lost (self.error says why), but the child must never block on a full pipe
            try:
                out.write(f"{stamp()} {line}\n")
                out.flush()
            except OSError as exc:
                self.error = exc
                out = None
        self.spoke.set()

    def _note_event(self, line: str) -> None:
        event = events.parse(line)
        if event is not None and event.name == "exit" and event["reason"] == events.EXIT_STARTUP_FAILED:
            self.startup_failure = event["detail"]
        elif event is not None and event.name == "remote_session":
            self.session_at = time.time()


@dataclass
class ProcessHandle:
    """A running (or ended) process of the plan: the object to ProcessSpec's class."""

    spec: ProcessSpec
    life: Lifecycle
    popen: subprocess.Popen | ForkedProcess | None = None
    pump: LogPump | None = None
    exit_code: int | None = None
    last_heartbeat: float | None = None
    metrics: dict = field(default_factory=dict)
    rate_samples: deque = field(default_factory=lambda: deque(maxlen=256))  # (time, rate) of its heartbeats
    kill_sent_at: float | None = None  # remote: when KILL went down the session
    started_at: float = 0.0
    lost_sessions: int = 0  # remote: sessions that ssh itself ended (exit 255: host unreachable, connection lost)
    unreached: int = 0  # remote: starts in a row whose ssh never reached the host (exit 255, no session began)
    last_exit: int | None = None  # exit code of the previous start, kept across restarts
    rank_pids: dict = field(default_factory=dict)  # learner: torchrun rank -> pid (a hung rank is killed by pid)
    killed_ranks: set = field(default_factory=set)  # their pids: a message of theirs still queued is no new rank
    start_time: int | None = None  # the group leader's start time (rundir.process_start_time), against pid reuse

    def start(self, env: dict[str, str], logs_dir: Path, session_setup: bytes = b"",
              forkserver: ForkServer | None = None) -> None:
        """Spawn in a new process group, output piped to a LogPump; forked by `forkserver` where one is given.

        A remote process's argv is its `ssh` session: `session_setup` (secrets, the job file) goes down the
        session's stdin, which then stays open for TERM/KILL lines.
        """
        argv = [a.replace(ATTEMPT, str(self.life.restarts)) for a in self.spec.argv]  # a fresh socket per start
        forked = forkserver.spawn(argv[2], env) if forkserver is not None else None
        self.popen = forked or subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE if self.spec.remote else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        if self.spec.remote:
            self.tell(session_setup)
        self.pump = LogPump(self.popen.stdout, logs_dir / f"{self.spec.name}.log")
        self.pump.start()
        self.exit_code, self.last_heartbeat = None, None
        self.rate_samples.clear()  # a new process: the last one's rates are not its own
        self.kill_sent_at, self.started_at = None, time.time()
        self.start_time = None if self.spec.remote else process_start_time(self.popen.pid)

    def forget_ranks(self) -> None:
        """A learner's ranks are gone (its group killed): no pids of theirs are kept."""
        self.rank_pids.clear()
        self.killed_ranks.clear()

    def kill_ranks(self) -> None:
        """Kill a local learner's ranks by pid (torchrun starts new ones); messages of theirs still queued then
        name no new rank."""
        for pid in self.rank_pids.values():
            try:
                os.kill(pid, signal.SIGCONT)  # a frozen rank must run to die of SIGKILL's successor
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.killed_ranks.update(self.rank_pids.values())
        self.rank_pids.clear()

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

    def failure_record(self) -> dict:
        """What state.json's `failure` says of this process when it ends the run."""
        return {"process": self.spec.name, "exit_code": self.exit_code,
                "log_tail": list(self.pump.tail) if self.pump else []}


DONE = (ProcState.FAILED, ProcState.STOPPED)


def cut_session(h: ProcessHandle) -> None:
    """End a remote process's session here at once, its host being lost (a KILL line may still reach it); its end is
    kept as the exit of that start."""
    if h.popen is None or h.popen.poll() is not None:
        return
    h.tell(b"KILL\n", close=True)
    try:
        os.killpg(h.popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    h.exit_code = h.last_exit = h.popen.wait()
    if h.pump is not None:
        h.pump.join(timeout=2)


def restart_learner_nodes(handles: list[ProcessHandle], dead: ProcessHandle, now: float) -> None:
    """A learner node's torchrun agent was killed: what is left of its group goes too (its ranks would keep the
    ports), and so do the other learner nodes, which start again with it (a static rendezvous is joined by
    every node at once); all continue from the newest checkpoint."""
    dead.forget_ranks()
    dead.signal_group(signal.SIGKILL)
    for h in handles:
        if h.spec.critical and h is not dead and h.life.alive:
            h.signal_group(signal.SIGKILL)
            if h.popen is not None and not h.spec.remote:
                h.popen.wait()
            h.forget_ranks()
            h.life.restart_with(dead.spec.name, dead.life.start_at, now)


def wait_gone(group: list[ProcessHandle], grace: float, forced: Callable[[], bool],
              meanwhile: Callable[[], None], term_after: float = -1.0) -> None:
    """Wait for the groups to exit: SIGTERM at term_after seconds (if >= 0), SIGKILL at the grace or once
    `forced` says so; `meanwhile` runs between looks."""
    start = time.time()
    deadline = start + grace
    termed = term_after < 0
    while any(h.group_alive() for h in group):
        if not termed and time.time() >= start + term_after:
            termed = True
            for h in group:
                h.signal_group(signal.SIGTERM)
        if time.time() > deadline or forced():
            for h in group:
                h.signal_group(signal.SIGKILL)
        meanwhile()


def last_word(h: ProcessHandle, relay: ProcessHandle | None) -> float | None:
    """When `h` was last heard, as far as its silence counts: a process whose relay (`relay`) is down keeps working
    and its reports wait for the relay, so it is not silent meanwhile, nor before the relay's new start."""
    if relay is None or h.last_heartbeat is None:
        return h.last_heartbeat
    return max(h.last_heartbeat, relay.started_at) if relay.life.state is ProcState.RUNNING else None


def host_bound(h: ProcessHandle) -> bool:
    """A process that goes with its host, never moved: a weights relay (the processes moved take weights from
    learner rank 0), and a learner node of an elastic world other than the head's (the group goes on without it)."""
    return h.spec.role == Role.RELAY or (h.spec.role == Role.LEARNER and not h.spec.critical)


def head_host_gone(h: ProcessHandle, spec: JobSpec, slurm_job: int | None,
                   starts: int = HEAD_UNREACHED_STARTS) -> bool:
    """An elastic world's head whose SSH host `starts` starts in a row did not reach: its host is lost (the run goes
    on in a next segment with its head elsewhere, rlctl.supervise.head_failover), without waiting for the restarts
    to run out (a job may allow a hundred, 30 s apart)."""
    return (spec.elastic_learners and h.spec.role == Role.LEARNER and h.spec.critical and h.spec.remote
            and slurm_job is None and h.last_exit == SSH_FAILED and h.unreached >= starts)


def head_lost(h: ProcessHandle) -> RunEnd:
    """The segment's end for a head whose host is lost: the head lost with it."""
    h.life.lose()
    h.metrics = {}
    return RunEnd(RunStatus.STOPPED, f"head host {h.spec.host} lost: ssh could not reach it ({h.unreached} starts of "
                  f"{h.spec.name} in a row)", head_lost=h.spec.host)


def can_lose(h: ProcessHandle, handles: list[ProcessHandle], spec: JobSpec) -> bool:
    """Given up, not the run: a collector on a host SSH no longer reaches while other collectors remain (synchronous
    PPO needs each one's rollout every round), a relay or the evaluator there (its restarts run out in seconds; it
    moves once the host is lost), and an elastic world's learner node (not the head's) whatever ended it."""
    if h.spec.role in (Role.RELAY, Role.EVALUATOR):
        return h.spec.remote and h.last_exit == SSH_FAILED
    if h.spec.role == Role.LEARNER:
        return not h.spec.critical  # a node of an elastic world: the others go on without it
    others = [o for o in handles if o.spec.role == Role.COLLECTOR and o is not h]
    return (h.spec.role == Role.COLLECTOR and h.spec.remote and h.last_exit == SSH_FAILED
            and not spec.algorithm_entry.synchronous
            and any(o.life.state not in (ProcState.FAILED, ProcState.LOST) for o in others))


def unreached_note(h: ProcessHandle, handles: list[ProcessHandle]) -> str:
    """For a run that fails because ssh no longer reaches `h`'s host: that host, and every process of the run there.
    A host taken down ends each of its processes' restarts at about the same time, and whichever runs out first ends
    the run; the reason names the host and its learner either way."""
    if not h.unreached:  # counted only for a remote start that exited 255 before its session began (reap)
        return ""
    there = ", ".join(o.spec.name for o in handles if o.spec.host == h.spec.host)
    return f"; ssh could not reach {h.spec.host} ({h.unreached} starts in a row), where {there} ran"


def lose_with_host(bound: list[ProcessHandle]) -> None:
    """The host-bound processes of a lost host: their sessions cut, and lost with it."""
    for h in bound:
        if h.life.state is not ProcState.LOST:
            cut_session(h)
            h.life.lose()
            h.metrics = {}


class ProcessTable:
    """Every process of the plan, and what the restart policy makes of their ends, silences and lost hosts or nodes."""

    def __init__(self, spec: JobSpec, plan: LaunchPlan, on_restart: Callable[[str], None]):
        self.spec = spec
        self.policy = RestartPolicy.of(spec)
        self.handles = [ProcessHandle(p, spares.lifecycle(p, self.policy)) for p in plan.processes]
        self.by_name = {h.spec.name: h for h in self.handles}
        self.on_restart = on_restart  # a process of the plan restarts (told to the metrics: its env steps stay)
        # The Slurm job whose steps this run's processes are (None over SSH), and the nodes that left it mid-run.
        self.slurm_job = next((h.slurm_job for h in spec.hosts if h.slurm_job is not None), None)
        self.lost_nodes: set[str] = set()  # and the SSH hosts lost now (self.watch)
        self.watch, self.control_port = HostWatch(spec, plan.run_id), int(plan.endpoints["control"].rsplit(":")[-1])
        self.next_ping, self.said = 0.0, []  # said: lines for the supervisor's log, from between two check_hosts
        # Relays by the control socket they bind: a process whose CONTROL_VIA names one reports through it.
        self.relays = {h.spec.binds["control"]: h for h in self.of_role(Role.RELAY) if "control" in h.spec.binds}

    def relay_of(self, h: ProcessHandle) -> ProcessHandle | None:
        """The relay that `h`'s hellos and heartbeats go through (its host's), None when they go to the supervisor."""
        return self.relays.get(h.spec.env.get(CONTROL_VIA_ENV, ""))

    def of_role(self, role: str) -> list[ProcessHandle]:
        """The processes of one role."""
        return [h for h in self.handles if h.spec.role == role]

    def heard(self, h: ProcessHandle, msg: ControlMessage, now: float) -> None:
        """A validated hello or heartbeat from `h`: it is alive; a learner's new rank is noted by its pid."""
        h.last_heartbeat = now
        h.life.heard()
        self.watch.heard(h.spec.host, now)
        if msg.role == Role.LEARNER and msg.pid is not None and msg.pid not in h.killed_ranks:
            h.rank_pids[msg.rank] = msg.pid
            if h.life.state is ProcState.RANKS_RESTARTING:  # torchrun started new ranks for the killed ones
                h.life.ranks_back()
                h.killed_ranks.clear()

    def reap(self) -> RunEnd | None:
        """Notice the processes that ended, or said they cannot start: restart, lose or fail each. A RunEnd when the
        run must end."""
        for h in self.handles:
            if h.popen is None or not h.life.alive:
                continue
            code = h.popen.poll()
            if code is None:
                if h.pump is not None and h.pump.startup_failure is not None:
                    # Said so and still running: a learner's torchrun agent, which would start its ranks again.
                    return self._cannot_start(h, h.pump.startup_failure)
                continue
            h.exit_code = h.last_exit = code
            h.lost_sessions += int(h.spec.remote and code == SSH_FAILED)
            never_began = h.spec.remote and code == SSH_FAILED and (h.pump is None or h.pump.session_at is None)
            h.unreached = h.unreached + 1 if never_began else 0
            if h.pump:
                h.pump.join(timeout=2)
            cause = h.pump.startup_failure if h.pump is not None else None
            end = self._cannot_start(h, cause) if cause is not None else self._ended(h, code)
            if end is not None:
                return end
        return None

    def _cannot_start(self, h: ProcessHandle, cause: str) -> RunEnd:
        """`h` cannot start, and would not on any restart: the run fails at once, naming the cause first."""
        h.life.cannot_start(cause)
        # It, and any other that said so too, is done: killed now (a learner's torchrun agent would start its ranks
        # again), nothing to wait for at the shutdown.
        for other in self.handles:
            if other.pump is not None and other.pump.startup_failure is not None and other.popen is not None \
                    and other.popen.poll() is None:
                other.signal_group(signal.SIGKILL)
        return RunEnd(RunStatus.FAILED, f"{h.spec.name} cannot start: {cause}", {**h.failure_record(), "cause": cause})

    def _ended(self, h: ProcessHandle, code: int) -> RunEnd | None:
        if self.slurm_job is not None and h.spec.remote:
            nodes = job_nodes(self.slurm_job)
            if nodes is None:
                return RunEnd(RunStatus.STOPPED, f"Slurm job {self.slurm_job} ended (scancel, its time limit or a failed node)")
            if h.spec.host not in nodes:
                return self._node_lost(h, nodes)
        now = time.time()
        if head_host_gone(h, self.spec, self.slurm_job):
            return head_lost(h)
        if h.life.ended(code, h.spec.critical, now):
            self.on_restart(h.spec.name)
            if h.spec.critical:
                restart_learner_nodes(self.handles, h, now)
            return None
        if can_lose(h, self.handles, self.spec):
            h.life.lose()
            h.metrics = {}
            h.rate_samples.clear()
            if h.spec.role == Role.LEARNER and h.last_exit == SSH_FAILED:
                self._lose_unreachable(h.spec.host, now)
            return None
        if head_host_gone(h, self.spec, self.slurm_job, starts=1):  # out of restarts sooner
            return head_lost(h)
        h.life.give_up()
        why = self.policy.why_not_restarted(h.spec.critical, code)
        reason = f"{h.spec.name} exited with code {code} ({why}){unreached_note(h, self.handles)}"
        return RunEnd(RunStatus.FAILED, reason, h.failure_record())

    def _node_lost(self, h: ProcessHandle, nodes: list[str]) -> RunEnd | None:
        """`h`'s node left the Slurm job: a collector starts again on the node with the fewest processes; any other
        role lost ends the run."""
        if h.spec.host not in self.lost_nodes:
            self.lost_nodes.add(h.spec.host)
            print(f"rlctl: node {h.spec.host} left Slurm job {self.slurm_job}", file=sys.stderr, flush=True)
        if h.spec.role == Role.RELAY:  # its node's own: gone with it (the processes moved take weights from rank 0)
            h.life.lose()
            return None
        gone = {x.name for x in self.spec.hosts if x.name not in nodes}
        where = re_placement(self.spec.hosts, [o.spec for o in self.handles
                                               if o.life.state is not ProcState.LOST or o is h], gone)
        if h.spec.name not in where:
            failure = h.failure_record()
            h.life.lose()
            return RunEnd(RunStatus.FAILED, f"{h.spec.name}'s node {h.spec.host} left Slurm job {self.slurm_job}", failure)
        target = next(x for x in self.spec.hosts if x.name == where[h.spec.name])
        old = h.spec.host
        h.spec = moved(h.spec, target, target.advertise_address or target.name)
        h.life.moved(old, target.name, time.time())
        self.on_restart(h.spec.name)
        return None

    def check_hosts(self, now: float) -> list[str]:
        """An SSH host silent past the heartbeat timeout is lost: its collectors and evaluator start on the hosts
        left once a copy still running there has ended itself (its relay and elastic learner node are lost with it);
        a lost host that answers again is re-admitted, and that learner node starts there again. Log lines."""
        said, self.said = self.said, []
        self.watch.sessions_begun(self.handles, now)
        silent = self.watch.silent(now)
        for host, silence in silent:
            mine = [h for h in self.handles if h.spec.host == host and h.life.state not in DONE]
            bound = [h for h in mine if host_bound(h)]
            mine = [h for h in mine if not host_bound(h)]
            live = [h.spec for h in self.handles if h.life.state not in DONE
                    and (h.life.state is not ProcState.LOST or h.spec.host == host)]
            # Only hosts heard from lately take them: when every host is silent, the fault is on this side.
            where = re_placement(self.spec.hosts, live, self.lost_nodes | {name for name, _ in silent})
            elastic = any(h.spec.role == Role.LEARNER for h in bound)
            if not (mine or elastic) or any(h.spec.name not in where for h in mine):
                continue  # a learner or replay shard there, or no host left: the rules for each process apply
            loss = self.watch.lose(host, now, silence)
            self.lost_nodes.add(host)
            start_at = now + restart_delay(self.spec)
            for h in mine:
                cut_session(h)
                target = next(x for x in self.spec.hosts if x.name == where[h.spec.name])
                h.spec = moved(h.spec, target, target.advertise_address or target.destination, self.control_port)
                h.life.moved(host, target.name, now, start_at, what="host")
                h.metrics = {}
                self.on_restart(h.spec.name)
                loss.moved[h.spec.name] = target.name
            lose_with_host(bound)
            said.append(loss.lost_line(host, start_at))
        for host, loss in self.watch.answered():
            self.lost_nodes.discard(host)
            said.append(loss.back_line(host))
            for h in self.handles:  # an elastic learner node rejoins the group from its host
                if h.spec.host == host and h.spec.role == Role.LEARNER and h.life.state is ProcState.LOST:
                    h.life.readmitted(host, loss.back_at)
                    said.append(f"{h.spec.name} starts again on {host} and rejoins the learner group")
        return said

    def _lose_unreachable(self, host: str, now: float) -> None:
        """An elastic learner node's host, unreachable over SSH and running nothing else of the run: lost now, not
        after the heartbeat timeout, so that it is probed (and the node rejoins as soon as it answers) at once."""
        others = any(o.spec.host == host and o.life.alive and not host_bound(o) for o in self.handles)
        if host not in self.watch.lost and not others:
            self.lost_nodes.add(host)
            loss = self.watch.lose(host, now, now - self.watch.last_heard.get(host, now), unreachable=True)
            self.said.append(loss.lost_line(host, now))

    def due(self, now: float) -> list[ProcessHandle]:
        """The restarts whose backoff has passed, each now starting: the caller starts them."""
        ready = [h for h in self.handles if h.life.due(now)]
        for h in ready:
            h.life.start()
        return ready

    def check_hung(self, now: float) -> None:
        """A running process silent for heartbeat_timeout_s is hung: killed, then restarted as if it had died (a
        local learner's ranks are killed by pid and torchrun restarts them; if it never does, its agent is killed)."""
        for h in self.handles:
            if h.life.ranks_overdue(now):
                h.life.ranks_late(now)
            else:
                silence = h.life.silent_for(last_word(h, self.relay_of(h)), now)
                if silence is None:
                    continue
                by_ranks = h.spec.role == Role.LEARNER and bool(h.rank_pids) and not h.spec.remote
                h.life.silent(silence, now, by_ranks)
            print(f"rlctl: {h.spec.name} {h.life.note}", file=sys.stderr, flush=True)
            h.last_heartbeat = now  # one kill per silence; the restart (or torchrun's) gives it a fresh start
            if h.life.state is ProcState.RANKS_RESTARTING:
                h.kill_ranks()
            else:
                h.signal_group(signal.SIGKILL)

    def log_failure(self) -> RunEnd | None:
        """A log that can no longer be written (a full disk) ends the run: nothing of a run may go unrecorded."""
        for h in self.handles:
            if h.pump is not None and h.pump.error is not None:
                return RunEnd(RunStatus.FAILED, f"cannot write {h.spec.name}'s log: {h.pump.error}",
                              {"process": "supervisor", "error": str(h.pump.error)})
        return None

    def ping_sessions(self) -> None:
        """Every third of network.session_timeout_s, a line down each remote session: its process keeps running
        only while it hears from this supervisor."""
        now = time.time()
        if now < self.next_ping:
            return
        self.next_ping = now + self.spec.network.session_timeout_s / 3
        for h in self.handles:
            if h.spec.remote and h.popen is not None and h.popen.poll() is None and h.kill_sent_at is None:
                h.tell(b"PING\n")

    def reap_all(self) -> None:
        """After the stop: wait for every process (SIGKILL after 5 s more), keep its exit code, mark it stopped."""
        for h in self.handles:
            if h.popen is not None:
                try:
                    h.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    h.signal_group(signal.SIGKILL)
                    h.popen.wait()
                if h.exit_code is None:
                    h.exit_code = h.popen.returncode
                if h.life.state is not ProcState.LOST:
                    h.last_exit = h.popen.returncode
                h.life.stop()
        deadline = time.monotonic() + LOG_DRAIN_S
        for h in self.handles:
            if h.pump:
                h.pump.join(timeout=max(0.0, deadline - time.monotonic()))

    def undrained(self) -> list[str]:
        """Processes whose output pipe is still open after reap_all (their last lines may come after the run's end)."""
        return [h.spec.name for h in self.handles if h.pump is not None and h.pump.is_alive()]

    def kill_everything(self) -> None:
        """Last resort when shutdown itself failed: SIGKILL every process group, so none is orphaned."""
        for h in self.handles:
            h.signal_group(signal.SIGKILL)
