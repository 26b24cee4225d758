"""Spare learner hosts (`hosts[].spare`): their nodes are held back until the learner group has formed, so that
torchrun's rendezvous, which holds at most the other learner nodes, keeps each spare waiting in its redundancy list
(never in the head's place in the first round) until the group is short of a node."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlctl.supervise.restart_policy import Lifecycle, ProcState, RestartPolicy, clock

if TYPE_CHECKING:
    from rlctl.launch.plan import ProcessSpec
    from rlctl.supervise.process_table import ProcessHandle

HELD = "spare: starts once the learner group has formed"
WAITING = "spare: waits in the rendezvous to take the place of a node that leaves"


def lifecycle(p: ProcessSpec, policy: RestartPolicy) -> Lifecycle:
    """A process's life at the start: a spare's is held (waiting to be released), every other one starting."""
    return Lifecycle(policy, ProcState.RESTARTING, note=HELD) if p.spare else Lifecycle(policy)


def release(handles: list[ProcessHandle], now: float) -> None:
    """The learner group has formed: the held spares among `handles` start now (ProcessTable.due), to wait in the
    rendezvous."""
    for h in handles:
        if h.life.note == HELD and h.life.state is ProcState.RESTARTING and h.life.start_at is None:
            h.life.start_at, h.life.note = now, WAITING


def heard(h: ProcessHandle, now: float) -> None:
    """A spare's ranks speak for the first time since it started: it took a place in the group."""
    if h.spec.spare and h.life.state is ProcState.STARTING:
        h.life.note = f"spare: in the learner group since {clock(now)}"
