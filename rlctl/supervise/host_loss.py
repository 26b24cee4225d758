"""SSH hosts that stop answering: noticed by their silence, given up, and taken back once they answer again.

A host is lost when none of its processes has been heard from, no SSH session has begun there and none still
starts there over a live session, for `logging.heartbeat_timeout_s` (its processes gone, its network down: either
way nothing arrives), after something of it was heard once. The process table then moves its collectors and
evaluator elsewhere (launch.plan.re_placement, the rule a lost Slurm node's follow), and
from here a thread per lost host asks it, every PROBE_INTERVAL_S, to end whatever of the run it still runs
(`rlctl.launch.remote sweep --kill --host`). The first answer re-admits it: nothing of the run is left there, so
it may take new processes, and no copy of a moved process can outlive a partition that heals.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from rlctl.launch.remote import SESSION_LOST_GRACE_S
from rlctl.job.spec import HostSpec, JobSpec
from rlctl.supervise.restart_policy import ProcState, clock

PROBE_INTERVAL_S = 2.0  # between tries to reach a lost host
PROBE_TIMEOUT_S = 15.0  # one try (ssh's ConnectTimeout is 10 s)


def restart_delay(spec: JobSpec) -> float:
    """Seconds after a host's sessions were cut before its processes start elsewhere: by then a copy that still runs
    there has heard nothing from the supervisor for network.session_timeout_s and ended itself (rlctl.launch.remote:
    TERM, then KILL after SESSION_LOST_GRACE_S), so no process of the run ever runs twice."""
    return spec.network.session_timeout_s + SESSION_LOST_GRACE_S


@dataclass
class HostLoss:
    """What happened to one lost host: when, where its processes went, when it answered again."""

    lost_at: float
    silent_s: float
    moved: dict[str, str] = field(default_factory=dict)  # process name -> the host it moved to
    back_at: float | None = None
    leftovers: int = 0  # processes of the run the re-admitting sweep found (and killed) there
    unreachable: bool = False  # lost because ssh could not reach it, not for its silence

    def record(self) -> dict:
        """The host row's `loss` entry in state.json."""
        return {"lost_at": self.lost_at, "silent_s": round(self.silent_s, 1), "moved": dict(self.moved),
                "back_at": self.back_at, "leftovers": self.leftovers}

    def lost_line(self, host: str, start_at: float) -> str:
        """The supervisor's log line on the loss."""
        moves = ", ".join(f"{n} re-placed on {t}" for n, t in self.moved.items())
        why = "ssh cannot reach it" if self.unreachable else f"no word from its processes for {self.silent_s:.0f}s"
        return f"host {host} lost at {clock(self.lost_at)}: {why}" + (f"; {moves}, starting at {clock(start_at)}"
                                                                      if moves else "")

    def back_line(self, host: str) -> str:
        """The supervisor's log line on the host's return."""
        return (f"host {host} back at {clock(self.back_at)}: re-admitted ({self.leftovers} leftover processes of "
                "the run ended there)")

    def note(self, clock=clock) -> str:
        """What `rlctl status` and the live view say of the host."""
        text = f"lost at {clock(self.lost_at)}"
        for target in sorted(set(self.moved.values())):
            text += f"; {', '.join(n for n, h in self.moved.items() if h == target)} re-placed on {target}"
        if self.back_at is not None:
            text += f"; back at {clock(self.back_at)}"
        return text


class HostWatch:
    """The SSH hosts of a run: when each was last heard from, which are lost, and their re-admission probes."""

    def __init__(self, spec: JobSpec, run_id: str):
        self.run_id = run_id
        self.timeout = spec.logging.heartbeat_timeout_s
        self.ssh_hosts = {h.name: h for h in spec.hosts if not h.is_local and h.slurm_job is None}
        self.last_heard: dict[str, float] = {}
        self.losses: dict[str, HostLoss] = {}  # every loss of each host, the newest kept
        self.lost: set[str] = set()  # lost now (not answered since)
        self._answers: queue.Queue = queue.Queue()
        self._stop = threading.Event()

    def heard(self, host: str, now: float) -> None:
        """A process on `host` was heard from."""
        if host in self.ssh_hosts:
            self.last_heard[host] = now

    def sessions_begun(self, handles, now: float) -> None:
        """Processes whose SSH session's far side began (their log pump's `session_at`): each one's host answered
        then, and answers now while that process still starts over a live session (ssh ends a session whose host is
        gone within its keep-alives, 15-20 s). So a host is not lost while a process there starts slowly: a learner
        node importing torch and joining its rendezvous on a loaded machine took more than 15 s. A session from
        before the host's last loss says nothing of it now."""
        for h in handles:
            at, host = h.pump.session_at if h.pump is not None else None, h.spec.host
            if at is not None and h.life.state is ProcState.STARTING and h.popen is not None \
                    and h.popen.poll() is None:
                at = now
            loss = self.losses.get(host)
            if at is not None and host in self.ssh_hosts and at > self.last_heard.get(host, 0.0) \
                    and (loss is None or at > loss.lost_at):
                self.last_heard[host] = at

    def silent(self, now: float) -> list[tuple[str, float]]:
        """Hosts heard from once, not lost yet, silent past the heartbeat timeout, with their silence."""
        return [(h, now - t) for h, t in self.last_heard.items()
                if h not in self.lost and now - t > self.timeout]

    def lose(self, host: str, now: float, silent_s: float, unreachable: bool = False) -> HostLoss:
        """`host` is lost (silent, or `unreachable` over ssh): recorded, and probed until it answers."""
        self.lost.add(host)
        self.last_heard.pop(host, None)  # armed again by the next process heard there
        loss = self.losses[host] = HostLoss(now, silent_s, unreachable=unreachable)
        threading.Thread(target=self._probe, args=(self.ssh_hosts[host],), daemon=True,
                         name=f"rlctl-probe-{host}").start()
        return loss

    def answered(self) -> list[tuple[str, HostLoss]]:
        """Lost hosts that answered since the last look (and had what was left of the run there ended): now
        re-admitted."""
        back = []
        while True:
            try:
                host, result, at = self._answers.get_nowait()
            except queue.Empty:
                return back
            loss = self.losses[host]
            loss.back_at, loss.leftovers = at, len(result.get("killed", []))
            self.lost.discard(host)
            back.append((host, loss))

    def close(self) -> None:
        """Stop probing (the run is over)."""
        self._stop.set()

    def _probe(self, host: HostSpec) -> None:
        from rlctl.launch.hosts import sweep_hosts

        while not self._stop.is_set():
            result = sweep_hosts([host], self.run_id, kill=True, placed=True, timeout=PROBE_TIMEOUT_S)[host.name]
            if "error" not in result and not result.get("left"):
                self._answers.put((host.name, result, time.time()))
                return
            self._stop.wait(PROBE_INTERVAL_S)
