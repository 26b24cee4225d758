"""A sweep's scheduler: starts its trials, at most `max_concurrent` at once and the next as one ends, each an
ordinary run supervised by a process of its own (rlctl.launch.sweep.start_trial), and records the sweep in
sweep.json (its pid, status, what was refused). A trial that fails or cannot start does not stop the others.

Every trial supervisor ends with the scheduler: a signal (Ctrl-C, `rlctl stop`) is passed on to each, which stops its
run as `rlctl stop` does (a second one forces it); if the scheduler is killed, the kernel sends them SIGTERM
(rlctl.supervise.tethered_run). Run with `python -m rlctl.supervise.sweep_scheduler SWEEP_DIR` (`--detach`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from rlctl.job.load import JobFileError
from rlctl.launch.pipeline import LaunchRefused, PreflightFailed
from rlctl.launch.resume import ResumeRefused
from rlctl.launch.sweep import StartedTrial, allocation_nodes, start_trial, trial_input, trial_winding_down
from rlctl.liveness import process_start_time
from rlctl.supervise.early_stop import EarlyStopper
from rlctl.rundir import RunBusy, RunLock, status_of
from rlctl.supervise.pbt import PopulationTrainer
from rlctl.run_status import RunStatus
from rlctl.sweep_dir import SweepDir

POLL_S = 0.5
WIND_DOWN_WAIT_S = 90.0  # how long a resumed sweep waits for trials still stopping after their scheduler died
TRIAL_REFUSALS = (JobFileError, LaunchRefused, PreflightFailed, ResumeRefused, RunBusy, OSError, RuntimeError)


def trial_ended_well(code: int, state: dict) -> bool:
    """Whether a trial whose supervisor exited with `code` ended as a run should: exit 0 or 130, or its run's own
    record says it finished or stopped. An exploit's or early stop's SIGTERM that reaches a supervisor already exiting
    after its run finished ends it by the signal (exit -15: a PBT test's trial met its env-step budget in the same
    second), yet the run did not fail."""
    return code in (0, 130) or status_of(state) in (RunStatus.FINISHED, RunStatus.STOPPED)


class SweepScheduler:
    """Runs one sweep's trials to their ends, or until it is stopped."""

    def __init__(self, sweep: SweepDir, display=None):
        self.sweep, self.display = sweep, display
        self.running: dict[str, StartedTrial] = {}
        self.slots = HostSlots({})
        self.refused: dict[str, str] = {}  # trial id -> why it could not start
        self.failed: list[str] = []
        self.stop_signals = 0
        self.pbt = PopulationTrainer.of(sweep, self._log)  # None without [sweep.pbt]
        self.early_stop = EarlyStopper.of(sweep)  # None: no [sweep.early_stop]

    def _on_signal(self, signum, frame) -> None:
        self.stop_signals += 1
        for started in self.running.values():  # the first asks each trial to stop, a second forces it
            _signal(started, signal.SIGTERM if self.stop_signals == 1 else signal.SIGINT)

    def run(self) -> int:
        """Schedule every trial; 0 when each ended finished (or was done already), 1 when one failed or could
        not start, 130 when stopped."""
        lock = RunLock(self.sweep.path)  # one scheduler per sweep, for as long as it lives
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self._record(RunStatus.RUNNING, supervisor_pid=os.getpid(), supervisor_start=process_start_time(os.getpid()),
                     started_at=time.time(), ended_at=None)
        status = RunStatus.FAILED
        try:
            self._wait_for_winding_down()
            self._schedule([t["id"] for t in self.sweep.trials()])
            status = RunStatus.STOPPED if self.stop_signals else RunStatus.FINISHED
        except LaunchRefused as exc:  # place = "nodes" outside an allocation (a resume after it ended)
            self._log(str(exc))
            print(exc, file=sys.stderr)
            return 1
        finally:
            self._wait_all()
            self._record(status, ended_at=time.time())
            for s, h in old.items():
                signal.signal(s, h)
            lock.release()
        if self.stop_signals:
            return 130
        return 1 if self.failed or self.refused else 0

    def _wait_for_winding_down(self) -> None:
        """Trials of an earlier scheduler that are still stopping (told so when it died) end before any resumes."""
        deadline = time.time() + WIND_DOWN_WAIT_S
        ids = [t["id"] for t in self.sweep.trials()]
        while time.time() < deadline and not self.stop_signals and any(trial_winding_down(self.sweep, i) for i in ids):
            time.sleep(POLL_S)

    def _schedule(self, queue: list[str]) -> None:
        """Start trials as slots free up, until every one has ended or a stop is asked."""
        data = self.sweep.read()
        limit = max(1, int(data.get("max_concurrent") or 1))
        slots = self.slots = HostSlots(data, allocation_nodes() if data.get("place") == "nodes" else ())
        while not self.stop_signals and (queue or self.running):
            self._reap()
            self._stop_losers()
            if self.pbt is not None:  # exploits: losers stopped, then resumed first from a donor's checkpoint
                queue[:0] = self.pbt.step(self.running, lambda t: _signal(self.running[t], signal.SIGTERM))
            while len(self.running) < limit and not self.stop_signals:
                trial_id = slots.next_startable(queue, self.running)
                if trial_id is None:
                    break
                queue.remove(trial_id)
                self._start(trial_id)
            self._record(RunStatus.RUNNING)
            time.sleep(POLL_S)

    def _start(self, trial_id: str) -> None:
        """Start one trial (or note why it cannot start, or that it is done)."""
        if self.early_stop is not None and trial_id in self.early_stop.stopped:
            return  # judged a loser once: a resumed sweep does not continue it
        reserved = frozenset(p for started in self.running.values() for p in started.ports)
        try:
            given = trial_input(self.sweep, trial_id)
            if given is None:
                return
            node = self.slots.node_for(self.running)
            self.running[trial_id] = start_trial(self.sweep, given, trial_id, reserved, node)
        except TRIAL_REFUSALS as exc:
            self.refused[trial_id] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self._log(f"{trial_id} not started: {self.refused[trial_id]}")
            return
        self._log(f"{trial_id} started (supervisor pid {self.running[trial_id].proc.pid})")

    def _reap(self) -> None:
        """Trials whose supervisor has exited leave their slot."""
        for trial_id, started in list(self.running.items()):
            code = started.proc.poll()
            if code is None:
                continue
            del self.running[trial_id]
            state = started.rundir.read_state() or {}
            if not trial_ended_well(code, state) and not self.stop_signals:
                self.failed.append(trial_id)
            if self.early_stop is not None:
                self.early_stop.ended(trial_id)
            self._log(f"{trial_id} {state.get('status')}: {state.get('exit_reason')} (exit {code})")

    def _stop_losers(self) -> None:
        """Trials the early-stopping rule judges clearly losing stop as `rlctl stop` stops a run (checkpoint kept)."""
        if self.early_stop is None or self.stop_signals:
            return
        for trial_id, why in self.early_stop.judge(list(self.running)).items():
            self._log(f"{trial_id} early-stopped: {why}")
            _signal(self.running[trial_id], signal.SIGTERM)

    def _wait_all(self) -> None:
        """Wait for every trial supervisor still running (each has been told to stop when the sweep stops)."""
        while self.running:
            self._reap()
            self._record(RunStatus.STOPPING)
            time.sleep(POLL_S / 5)

    def _record(self, status: str, **more) -> None:
        data = self.sweep.update(status=status, updated_at=time.time(), refused=self.refused, **more)
        if self.display is not None:
            self.display(self.sweep, data)

    def _log(self, line: str) -> None:
        with open(self.sweep.log, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


class HostSlots:
    """Where trials may start: with `place = "hosts"`, each on its own host, at most `trials_per_host` there at
    once; with `place = "nodes"`, on whichever of the allocation's `nodes` has the fewest trials (at most
    `trials_per_host`); on this machine, any."""

    def __init__(self, sweep_data: dict, nodes: tuple[str, ...] = ()):
        trials = sweep_data.get("trials") if isinstance(sweep_data.get("trials"), list) else []
        self.host = {t.get("id"): t.get("host") for t in trials if isinstance(t, dict)}
        self.per_host = max(1, int(sweep_data.get("trials_per_host") or 1))
        self.nodes = nodes

    def next_startable(self, queue: list[str], running: dict) -> str | None:
        """The first queued trial whose host has room, or None."""
        if self.nodes:
            return queue[0] if queue and self.node_for(running) is not None else None
        busy = Counter(self.host.get(t) for t in running)
        return next((t for t in queue if self.host.get(t) is None or busy[self.host[t]] < self.per_host), None)

    def node_for(self, running: dict) -> str | None:
        """`place = "nodes"`: the node with the fewest running trials, if it has room (None otherwise)."""
        if not self.nodes:
            return None
        busy = Counter(getattr(started, "node", None) for started in running.values())
        node = min(self.nodes, key=lambda n: busy[n])
        return node if busy[node] < self.per_host else None


def _signal(started: StartedTrial, sig: int) -> None:
    try:
        started.proc.send_signal(sig)
    except ProcessLookupError:
        pass


def schedule_sweep(path: str | Path, display=None) -> int:
    """Run a prepared sweep directory's scheduler in this process; its exit code."""
    os.umask(0o077)
    return SweepScheduler(SweepDir(Path(path)), display).run()


if __name__ == "__main__":
    # `rlctl sweep --detach` starts this; its output is the sweep's scheduler.out.
    sys.exit(schedule_sweep(sys.argv[1]))
