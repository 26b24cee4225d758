"""The restart policy: one process's life as a state machine, with its backoff, restart window and hang rules.

Pure: no processes, sockets or clocks (times come in as arguments), so every rule is tested in-process
(tests/test_restart_policy.py). The process table (process_table.py) fires these events as it sees processes start,
speak, fall silent and end, and carries out what they decide: kills and starts.

    STARTING --heard--> RUNNING --silent--> HUNG              (killed for silence; its end is awaited)
    RUNNING --ranks killed--> RANKS_RESTARTING --ranks back--> RUNNING
    RANKS_RESTARTING --ranks late--> HUNG                     (torchrun never started new ranks: its agent killed)
    alive --ended--> RESTARTING --start--> STARTING           (alive: STARTING, RUNNING, HUNG, RANKS_RESTARTING)
    alive --moved / restarted with--> RESTARTING              (a lost Slurm node; another learner node's end)
    RESTARTING or LOST --moved--> RESTARTING                  (its host lost: starts on another one)
    LOST --readmitted--> RESTARTING                           (its host answers again: an elastic learner node)
    alive --gave up--> FAILED    alive --lose--> LOST         alive or RESTARTING --stop--> STOPPED
"""

from __future__ import annotations

import enum
import signal
import time
from collections import deque
from dataclasses import dataclass, field

from rlctl.events import STARTUP_FAILED_CODE

MAX_BACKOFF_S = 30.0
RANK_RESTART_GRACE_S = 60.0  # after hung ranks were killed: how long torchrun may take to start new ones
SSH_FAILED = 255  # what ssh exits with when it cannot reach the host or loses the connection
KILLED_CODES = (-signal.SIGKILL, 128 + signal.SIGKILL)  # SIGKILL as Popen reports it, and as a shell does


def agent_killed(code: int | None) -> bool:
    """Whether a learner node's exit code says its torchrun agent was killed (a signal, locally or as a shell
    reports it, or the SSH session lost), rather than torchrun giving up on ranks that kept failing (code 1)."""
    return code is not None and (code < 0 or code >= 128)


def clock(at: float) -> str:
    """A moment as notes show it: local time of day."""
    return time.strftime("%H:%M:%S", time.localtime(at))


class ProcState(enum.Enum):
    """Where one process is in its life."""

    STARTING = "starting"  # started; not heard from yet
    RUNNING = "running"  # has said hello or sent a heartbeat
    HUNG = "hung"  # silent past heartbeat_timeout_s and killed; its end is awaited
    RANKS_RESTARTING = "ranks restarting"  # a learner whose silent ranks were killed; torchrun starts new ones
    RESTARTING = "restarting"  # ended; starts again once its backoff has passed
    FAILED = "failed"  # ended and not to be restarted: the run fails
    LOST = "lost"  # a collector whose host stopped answering SSH (or a process of a lost Slurm node)
    STOPPED = "stopped"  # ended by the run's shutdown

    @property
    def shown(self) -> str:
        """The state as state.json and `rlctl status` name it: a hung process runs until the kill takes, and a
        learner whose ranks torchrun restarts keeps its agent running."""
        return ProcState.RUNNING.value if self in (ProcState.HUNG, ProcState.RANKS_RESTARTING) else self.value


class Event(enum.Enum):
    """What happens to a process."""

    HEARD = "heard"  # a hello or heartbeat arrived
    SILENT = "silent"  # no heartbeat for heartbeat_timeout_s: its group is killed
    RANKS_KILLED = "ranks killed"  # ... or, a local learner's, its ranks are killed by pid
    RANKS_BACK = "ranks back"  # a new rank of that learner said hello
    RANKS_LATE = "ranks late"  # torchrun did not start new ranks within the grace: its agent is killed
    ENDED = "ended"  # exited with restarts left: restarts after its backoff
    MOVED = "moved"  # its host was lost (a Slurm node left the job, an SSH host stopped answering): starts elsewhere
    RESTARTED_WITH = "restarted with"  # another learner node ended: this one is killed and restarts with it
    START = "start"  # its backoff has passed: started again
    GAVE_UP = "gave up"  # exited with no restart left
    LOSE = "lose"  # exited, and the run goes on without it
    READMITTED = "readmitted"  # lost with its host, which answers again: starts there again
    STOP = "stop"  # the run's shutdown ended it


ALIVE = (ProcState.STARTING, ProcState.RUNNING, ProcState.HUNG, ProcState.RANKS_RESTARTING)
_S, _E = ProcState, Event
TRANSITIONS: dict[tuple[ProcState, Event], ProcState] = {
    (_S.STARTING, _E.HEARD): _S.RUNNING,
    # A message still queued from an earlier start (or from a killed process) changes nothing.
    **{(state, _E.HEARD): state for state in _S if state is not _S.STARTING},
    (_S.RUNNING, _E.SILENT): _S.HUNG,
    (_S.HUNG, _E.SILENT): _S.HUNG,  # still silent a timeout later: killed again (a remote session is then cut)
    (_S.RUNNING, _E.RANKS_KILLED): _S.RANKS_RESTARTING,
    (_S.RANKS_RESTARTING, _E.RANKS_BACK): _S.RUNNING,
    (_S.RANKS_RESTARTING, _E.RANKS_LATE): _S.HUNG,
    **{(state, event): to for state in ALIVE for event, to in (
        (_E.ENDED, _S.RESTARTING), (_E.MOVED, _S.RESTARTING), (_E.RESTARTED_WITH, _S.RESTARTING),
        (_E.GAVE_UP, _S.FAILED), (_E.LOSE, _S.LOST), (_E.STOP, _S.STOPPED))},
    (_S.RESTARTING, _E.START): _S.STARTING,
    (_S.RESTARTING, _E.MOVED): _S.RESTARTING,  # its host was lost while it waited for its backoff
    (_S.RESTARTING, _E.LOSE): _S.LOST,  # the same, for a process that goes with its host (a weights relay)
    (_S.LOST, _E.MOVED): _S.RESTARTING,  # given up on its host (sessions failing), then that host was lost
    (_S.LOST, _E.READMITTED): _S.RESTARTING,
    (_S.RESTARTING, _E.STOP): _S.STOPPED,
    (_S.FAILED, _E.STOP): _S.FAILED,
    (_S.LOST, _E.STOP): _S.LOST,
}


class IllegalTransition(RuntimeError):
    """An event the state machine has no transition for in the current state: a bug, never bad input."""


@dataclass(frozen=True)
class RestartPolicy:
    """The numbers the policy applies (topology.max_restarts, restart_window_s, restart_backoff_s and
    logging.heartbeat_timeout_s of the job)."""

    max_restarts: int
    window_s: float
    backoff_s: float
    heartbeat_timeout_s: float
    max_backoff_s: float = MAX_BACKOFF_S
    rank_grace_s: float = RANK_RESTART_GRACE_S

    @classmethod
    def of(cls, spec) -> "RestartPolicy":
        """The policy of a job."""
        topo = spec.topology
        return cls(topo.max_restarts, topo.restart_window_s, topo.restart_backoff_s,
                   spec.logging.heartbeat_timeout_s)

    def why_not_restarted(self, critical: bool, code: int | None) -> str:
        """Why an ended process was not restarted, for the run's exit reason."""
        if code == STARTUP_FAILED_CODE:
            return "it cannot start, and would not on a restart either"
        if critical and not agent_killed(code):
            return "torchrun gave up restarting its ranks"
        return f"exceeded {self.max_restarts} restarts within {self.window_s:g}s"


@dataclass
class Lifecycle:
    """One process's state in the restart policy, its restarts, and why it last changed (for `rlctl status`)."""

    policy: RestartPolicy
    state: ProcState = ProcState.STARTING
    restarts: int = 0
    note: str | None = None  # why it was last restarted or killed
    start_at: float | None = None  # RESTARTING: when it starts again
    ranks_killed_at: float | None = None  # RANKS_RESTARTING: when its ranks were killed
    restart_times: deque = field(default_factory=deque)  # when each restart within the window happened

    def fire(self, event: Event) -> ProcState:
        """Take one transition of the machine; IllegalTransition where it has none."""
        try:
            self.state = TRANSITIONS[self.state, event]
        except KeyError:
            raise IllegalTransition(f"{event.value!r} in state {self.state.value!r}") from None
        return self.state

    @property
    def alive(self) -> bool:
        """Whether its process may be running (its end is to be noticed)."""
        return self.state in ALIVE

    def heard(self) -> None:
        """A hello or heartbeat arrived."""
        self.fire(Event.HEARD)

    def silent_for(self, last_heartbeat: float | None, now: float) -> float | None:
        """How long a running (or hung, not yet ended) process has been silent, if past the heartbeat timeout."""
        if self.state not in (ProcState.RUNNING, ProcState.HUNG) or last_heartbeat is None:
            return None
        silence = now - last_heartbeat
        return silence if silence > self.policy.heartbeat_timeout_s else None

    def silent(self, silence: float, now: float, by_ranks: bool) -> None:
        """Killed for silence: its group, or (`by_ranks`, a running learner's) its ranks, which torchrun restarts."""
        self.note = f"hung: no heartbeat for {silence:.0f}s; killed at {clock(now)}"
        if by_ranks and self.state is ProcState.RUNNING:
            self.ranks_killed_at = now
            self.fire(Event.RANKS_KILLED)
        else:
            self.fire(Event.SILENT)

    def ranks_overdue(self, now: float) -> bool:
        """Whether torchrun has had its time to start new ranks for the killed ones (importing, rendezvous and
        loading the checkpoint take ~10 s)."""
        grace = max(self.policy.rank_grace_s, 3 * self.policy.heartbeat_timeout_s)
        return self.state is ProcState.RANKS_RESTARTING and now - self.ranks_killed_at > grace

    def ranks_back(self) -> None:
        """A new rank said hello: the learner runs again."""
        self.ranks_killed_at = None
        self.fire(Event.RANKS_BACK)

    def ranks_late(self, now: float) -> None:
        """torchrun did not restart the killed ranks in time: its agent is killed (then restarted as it ends)."""
        self.ranks_killed_at = None
        self.note = f"hung: torchrun did not restart its ranks; killed at {clock(now)}"
        self.fire(Event.RANKS_LATE)

    def ended(self, code: int | None, critical: bool, now: float) -> bool:
        """It exited with `code`: True when a restart is scheduled after the backoff; False when it may not be
        restarted (used up its restarts within the window, learner ranks that torchrun gave up on, or a process that
        said it cannot start: STARTUP_FAILED_CODE): the caller then loses or fails it. A restart after a kill for
        silence keeps the note that says so."""
        while self.restart_times and now - self.restart_times[0] > self.policy.window_s:
            self.restart_times.popleft()
        if code == STARTUP_FAILED_CODE or (critical and not agent_killed(code)) \
                or len(self.restart_times) >= self.policy.max_restarts:
            return False
        delay = min(self.policy.backoff_s * 2 ** len(self.restart_times), self.policy.max_backoff_s)
        if not (self.state is ProcState.HUNG and code in KILLED_CODES):
            self.note = f"exited with code {code} at {clock(now)}; restarted after {delay:.1f}s"
        self.restart_times.append(now)
        self._restart(Event.ENDED, now + delay)
        return True

    def moved(self, old_host: str, new_host: str, now: float, start_at: float | None = None,
              what: str = "node") -> None:
        """Its host (a Slurm node, an SSH `host`) was lost: it starts again on `new_host` at `start_at` (default at
        once; no backoff, no restart counted against the window)."""
        self.note = f"{what} {old_host} lost at {clock(now)}; moved to {new_host}"
        self._restart(Event.MOVED, now if start_at is None else start_at)

    def restart_with(self, other: str, start_at: float, now: float) -> None:
        """Another learner node ended: this one was killed and starts again with it (a static rendezvous is joined
        by every node at once)."""
        self.note = f"restarted with {other} at {clock(now)}"
        self._restart(Event.RESTARTED_WITH, start_at)

    def readmitted(self, host: str, now: float) -> None:
        """It was lost with `host`, which answers again: it starts there at once (an elastic learner node, which
        rejoins the group)."""
        self.note = f"host {host} back at {clock(now)}; started there again"
        self._restart(Event.READMITTED, now)

    def _restart(self, event: Event, start_at: float) -> None:
        self.ranks_killed_at = None  # its ranks go with it
        self.restarts += 1
        self.start_at = start_at
        self.fire(event)

    def due(self, now: float) -> bool:
        """Whether its backoff has passed."""
        return self.state is ProcState.RESTARTING and self.start_at is not None and now >= self.start_at

    def start(self) -> None:
        """Started again."""
        self.start_at = None
        self.fire(Event.START)

    def cannot_start(self, cause: str) -> None:
        """It said it cannot start (its env cannot be made, code it needs cannot be imported): an error that every
        restart would repeat, so none is made and the run fails."""
        self.note = f"cannot start: {cause}"
        self.fire(Event.GAVE_UP)

    def give_up(self) -> None:
        """Not restarted: the run fails."""
        self.fire(Event.GAVE_UP)

    def lose(self) -> None:
        """Not restarted: the run goes on without it."""
        self.fire(Event.LOSE)

    def stop(self) -> None:
        """The run's shutdown ended it (a failed or lost one stays so)."""
        self.start_at = None
        self.fire(Event.STOP)
