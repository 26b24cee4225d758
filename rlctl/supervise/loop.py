"""The supervisor: starts every process of a LaunchPlan, watches, restarts and stops them.

It is the only writer of the run directory. Its parts, each a module: the process table and its restart policy
(process_table.py, restart_policy.py), starting processes (process_start.py), the control router
(control_router.py), the run-state writer (run_state.py: state.json, twice a second) and the metrics sink
(metrics_sink.py: TensorBoard, W&B). What is here is the loop that drives them. Signals turn into flags checked by
the loop; shutdown always runs in `finally`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.net.control import ControlMessage
from rlctl.supervise.control_router import ControlRouter, issue_keys
from rlctl.durable import remove_temporaries
from rlctl.metrics import MetricsHub
from rlctl.supervise.metrics_sink import MetricsSink
from rlctl.launch.plan import LaunchPlan, make_plan
from rlctl.supervise.checkpoint_mirror import CheckpointMirror
from rlctl.supervise.head_failover import StopBetweenSegments, prepare_next_segment, stop_between_segments
from rlctl.supervise.process_start import ProcessStarter
from rlctl.supervise import spares
from rlctl.supervise.preemption import Preemption
from rlctl.supervise.process_table import ProcessHandle, ProcessTable, wait_gone
from rlctl.supervise.remote_cleanup import finish_remote
from rlctl.supervise.run_state import RunEnd, RunState, note_rate
from rlctl.supervise.supervisor_log import SupervisorLog
from rlctl.rundir import RunDir, remove_weight_board
from rlctl.job.load import load_job
from rlctl.job.resolved import with_host_secrets
from rlctl.job.spec import JobSpec
from rlctl.supervise.stop_progress import StopProgress, stop_progress
from rlctl.run_status import RunStatus
from rlctl.role_names import Role

STATE_INTERVAL_S = 0.5
# The loop's checks (exits, silence, restarts due, stop rules) walk every process: they run this often, and control
# messages are handled in between. Once per arriving message, 1,000 collectors' relays made ~50 walks a second.
PASS_INTERVAL_S = 0.1
STOP_GRACE_S = 20.0


class StopCriteria:
    """The job's stop rules over the run-level metrics; returns the reason once one is met (rlctl.supervise.stop_progress:
    the same computation the progress lines show). Wall time counts every segment of a resumed run."""

    def __init__(self, spec: JobSpec, started: float, elapsed_before: float = 0.0):
        self.stop, self.started, self.elapsed_before = spec.job.stop.model_dump(), started, elapsed_before

    def met(self, m: dict, episodes_seen: int, now: float) -> StopProgress | None:
        """The first criterion met, or None."""
        elapsed = self.elapsed_before + now - self.started
        return next((p for p in stop_progress(self.stop, m, elapsed, episodes_seen) if p.met), None)

    def reached(self, m: dict, episodes_seen: int, now: float) -> str | None:
        """A human-readable reason, or None."""
        met = self.met(m, episodes_seen, now)
        return met.reason if met else None


class Supervisor:
    """Runs one plan to its end: finished, stopped or failed."""

    def __init__(self, spec: JobSpec, plan: LaunchPlan, rundir: RunDir, keys: wire.CurveKeys,
                 display=None, resumed: dict | None = None, batch: bool = False):
        self.spec, self.plan, self.rundir = spec, plan, rundir
        self.keys, self.process_keys = issue_keys(keys, plan.processes)
        hub = MetricsHub(spec.job.stop.train_return_window)
        self.table = ProcessTable(spec, plan, on_restart=hub.on_restart)
        self.spares = [h for h in self.table.handles if h.spec.spare]  # released once the learner group forms
        self.router = ControlRouter(self.keys, str(plan.endpoints["control"]), spec, self.table.by_name,
                                    {"hello": self._on_hello, "heartbeat": self._on_heartbeat})
        self.sink = MetricsSink(spec, plan.run_id, rundir, hub, resumed, own_losses=self.router.losses)
        self.run_state = RunState(spec, plan, rundir, self.table, self.sink, resumed, display)
        # A Slurm allocation ending under the run (time limit, preemption): rlctl.supervise.preemption.
        self.preemption = Preemption(self.table.slurm_job, batch, spec.cluster.requeue,
                                     (resumed or {}).get("preemptions"))
        # Checkpoints of SSH hosts, home as they are written; sent to the hosts that read them at the start.
        self.mirror = CheckpointMirror(spec, plan.run_id, rundir.checkpoints_dir)
        self.run_state.annotations = lambda: {**self.preemption.document(), **self.mirror.document()}
        self.starter = ProcessStarter(spec, plan, rundir, self.process_keys, self.table.slurm_job)
        self.log = SupervisorLog(rundir)
        self.remote_hosts = [h for h in spec.hosts if not h.is_local]
        self.stop_signals = 0
        self.head_lost: str | None = None  # an elastic run's head host, lost: the run goes on in a next segment
        self.head_lost_at = 0.0
        self.shutting_down = False
        self.forced = False  # processes are SIGKILLed now, not after the grace

    def _on_signal(self, signum, frame) -> None:
        self.stop_signals += 1
        self.preemption.on_signal(signum)
        # Ctrl-C on a stop already under way (a second Ctrl-C, during start-up too; or one after `rlctl stop`, or
        # while the run's own end shuts it down) forces it. SIGTERM never does: one process may get several for
        # one cause (PR_SET_PDEATHSIG sends one as each thread of a dying parent exits: a sweep scheduler's trials
        # got two), and `rlctl stop`, Slurm and timeout(1) escalate to SIGKILL themselves.
        if signum == signal.SIGINT and (self.stop_signals >= 2 or self.shutting_down):
            self.forced = True
        if self.run_state.exit_reason is None:
            self.run_state.exit_reason = f"stopped by {signal.Signals(signum).name}"

    def run(self) -> int:
        """Start everything, supervise until a stop, shut down. Returns the exit code (0 ok, 1 failed)."""
        stops = (signal.SIGINT, signal.SIGTERM, *self.preemption.signals())
        old = {s: signal.signal(s, self._on_signal) for s in stops}
        remove_temporaries(self.rundir.path)  # what a killed supervisor was writing
        try:
            self._start_and_watch()
        except Exception as exc:  # a fault of the supervisor itself: the run fails, and shutdown still runs
            self.run_state.fail_self(exc)
        finally:
            self._wind_down()
            for s, h in old.items():
                signal.signal(s, h)
        return 1 if self.run_state.status == RunStatus.FAILED else 0

    def _start_and_watch(self) -> None:
        """Bind the control socket, start every process, then watch them until the run ends."""
        self.router.open()
        hosts = ", ".join(h["name"] for h in self.plan.hosts)
        self.log.write(f"starting {len(self.table.handles)} processes ({self.plan.algorithm}) on {hosts}")
        self.run_state.status = RunStatus.STARTING
        self.run_state.publish()
        # W&B's start-up (its service process) takes seconds: paid before any process runs, not in the middle
        # of the run, where it held up reading heartbeats and the stop rules (a 40k-step stop ended at 59k).
        self.sink.open_wandb()
        if self.mirror.hosts:
            self.mirror.seed(self.plan.processes, self._say)
        self.starter.open_forkserver(self.table.handles)
        self.starter.start_all(self.table.handles, stopping=lambda: self.stop_signals > 0,
                               meanwhile=lambda: self._keep_in_touch(20))
        # TensorBoard's import takes ~0.2 s: only once every process is on its way.
        self.sink.open_tensorboard(self.run_state.segment_started_at)
        self.run_state.status = RunStatus.RUNNING
        self._loop()

    def _loop(self) -> None:
        """Watch until a signal, the end of the run (a process that failed, a stop rule met) or a fault."""
        criteria = StopCriteria(self.spec, self.run_state.segment_started_at, self.run_state.elapsed_before)
        next_state = next_point = 0.0
        while not self.stop_signals:
            self._listen_until(time.monotonic() + PASS_INTERVAL_S)
            ending = self.table.reap() or self.table.log_failure()
            if ending is not None and ending.head_lost:
                # Stopped like a run told to stop; supervise_rundir starts the next segment, its head elsewhere.
                self.head_lost, self.head_lost_at = ending.head_lost, time.time()
                self.run_state.exit_reason = ending.reason
                self._say(f"{ending.reason}: this segment stops, and the run goes on with its learner head on "
                          "another host")
                return
            if ending is not None:
                self.run_state.end(ending)
                return
            now = time.time()
            for line in self.table.check_hosts(now):  # before check_hung: a whole host's silence is the host's
                self._say(line)
            self.table.check_hung(now)
            if self.spares and self.sink.hub.learner_worlds:
                spares.release(self.spares, now)
            for h in self.table.due(now):
                self.starter.start(h)
            if self.mirror.due(now):
                self.mirror.pull(now, [h.spec for h in self.table.handles], self.table.watch.lost)
            if now >= next_point:
                next_point = now + self.spec.logging.metrics_interval_s
                self.sink.write_point()
            if now >= next_state:
                next_state = now + STATE_INTERVAL_S
                self.run_state.publish()
            # Checked on every pass (not only with state.json): a run that is done stops within 0.1 s.
            met = criteria.met(self.sink.hub.snapshot(), self.sink.hub.episodes, now)
            if met:
                self.run_state.end(RunEnd(RunStatus.FINISHED, met.reason, stopped_by=met.record()))
                return

    def _say(self, line: str) -> None:
        """A line of the supervisor's log, shown on stderr too."""
        self.log.write(line)
        print(f"rlctl: {line}", file=sys.stderr, flush=True)

    def _keep_in_touch(self, drain_ms: int) -> None:
        """Ping the remote sessions that are due, and handle the control messages that arrive within drain_ms."""
        self.table.ping_sessions()
        self.router.drain(drain_ms)

    def _listen_until(self, until: float) -> None:
        """Ping the remote sessions that are due, then handle control messages until `until` (monotonic) or a
        signal."""
        self.table.ping_sessions()
        while not self.stop_signals and (left := until - time.monotonic()) > 0:
            self.router.drain(max(1, round(1000 * left)))

    def _heard(self, h: ProcessHandle, msg: ControlMessage) -> None:
        now = time.time()
        spares.heard(h, now)  # before the table's: a spare's first word since it started
        self.table.heard(h, msg, now)

    def _on_hello(self, h: ProcessHandle, msg: ControlMessage) -> None:
        self._heard(h, msg)

    def _on_heartbeat(self, h: ProcessHandle, msg: ControlMessage) -> None:
        self._heard(h, msg)
        figures = self.sink.take(h.spec.name, h.spec.role, msg)
        if figures is not None:
            h.metrics = figures
            note_rate(h, time.time())

    def _wind_down(self) -> None:
        """Stop everything and write the run's end; each step runs whatever the one before it did."""
        state = self.run_state
        # A run says it is over (finished, failed, stopped) only once shutdown is done (final checkpoints written,
        # every process gone, all their output in the logs): whoever waits for that may then read the run's files.
        ending = state.status
        preempted = ending not in (RunStatus.FINISHED, RunStatus.FAILED) and self.preemption.decide(
            self.sink.figures().get(M.ENV_STEPS))
        if preempted:
            state.exit_reason = f"preempted: {preempted}"
        if preempted and self.preemption.job_ending:
            # Slurm kills every process of the job KillWait (30 s by default) after its SIGTERM: the run says how it
            # stands now, not after a shutdown that may be cut short (the processes checkpoint on that SIGTERM).
            state.status, state.ended_at = RunStatus.PREEMPTED, time.time()
        elif ending in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.FINISHED, RunStatus.FAILED):
            state.status = RunStatus.STOPPING
        self.log.write(f"stopping: {state.exit_reason or 'the run ended'}")
        self.table.watch.close()
        self._guarded(state.publish)
        try:
            self._shutdown()
        except Exception as exc:
            state.fail_self(exc)
            self.table.kill_everything()
        state.ended_at = time.time()
        # A head host lost: the run goes on in a next segment, started by supervise_rundir in this process, so it
        # says starting, not stopped, between the two (whoever waits for the run's end, `logs --follow` too, waits on).
        moving = self.head_lost is not None and not self.stop_signals
        if state.status == RunStatus.STOPPING:
            state.status = ending if ending in (RunStatus.FINISHED, RunStatus.FAILED) else (
                RunStatus.PREEMPTED if preempted else RunStatus.STARTING if moving else RunStatus.STOPPED)
        self._guarded(lambda: self.sink.finish(state.status != RunStatus.FAILED, state.segment_started_at))
        self.starter.close()
        for name in self.table.undrained():
            self.log.write(f"{name}'s output is still open after its process ended: its last lines may follow")
        elapsed = state.elapsed_before + state.ended_at - state.segment_started_at
        if state.status == RunStatus.STARTING:
            self.log.write(f"segment ended after {elapsed:.1f}s: {state.exit_reason}; the next one starts")
        else:
            self.log.end(state.status, state.exit_reason, elapsed)
        state.publish_final()
        self.router.close()
        if self.preemption.requeue_job() is not None:  # Slurm refused: resumed by hand (`rlctl run --resume`)
            state.exit_reason += f"; not requeued: {self.preemption.record['requeue_error']}"
            state.publish_final()

    def _guarded(self, step) -> None:
        """Run one shutdown step; a failure is recorded and the next steps still run."""
        try:
            step()
        except Exception as exc:
            self.run_state.fail_self(exc)

    def _shutdown(self) -> None:
        """Everything at once, except replay shards, which outlive the learners (a last update samples from them),
        and relays, which outlive the processes whose last reports they carry; SIGKILL after the grace."""
        learners, shards = self.table.of_role(Role.LEARNER), self.table.of_role(self.spec.data_path.shard_role)
        relays = self.table.of_role(Role.RELAY)
        others = [h for h in self.table.handles if h not in learners and h not in shards and h not in relays]
        self.shutting_down = True
        # Learner ranks get `stop` on the control channel: they agree on a last update, checkpoint and exit 0, so
        # torchrun ends cleanly. SIGTERM remains the fallback for ranks that never said hello.
        told = self.router.stop_learners()
        # Collectors and the evaluator stop meanwhile: nothing waits on them (shutdown in parallel, not in turn).
        for h in others:
            h.signal_group(signal.SIGTERM)
        self._wait_gone(learners, term_after=5.0 if told else 0.0)
        for h in shards:
            h.signal_group(signal.SIGTERM)
        self._wait_gone(shards + others)
        for h in relays:
            h.signal_group(signal.SIGTERM)
        self._wait_gone(relays)
        self.table.reap_all()
        self.router.drain(0)
        remove_weight_board(self.plan.to_dict())
        self.mirror.close()  # a pull under way ends before the last fetch
        # A lost head's host is left to the next segment, which probes it (its checkpoints came home meanwhile).
        hosts = [h for h in self.remote_hosts if h.name != self.head_lost]
        if hosts and not self.preemption.job_ending:  # an ending job starts no step to fetch with
            self.run_state.remote_cleanup = finish_remote(self.plan, self.rundir, hosts,
                                                          [h.spec for h in self.table.handles])

    def _wait_gone(self, group: list[ProcessHandle], term_after: float = -1.0) -> None:
        """Wait for the groups to exit: SIGTERM at term_after seconds (if >= 0), SIGKILL at the grace or at
        another Ctrl-C; final heartbeats (checkpoint, parameter digests) are read meanwhile."""
        wait_gone(group, STOP_GRACE_S, forced=lambda: self.forced,
                  meanwhile=lambda: self._keep_in_touch(10), term_after=term_after)


def supervise_rundir(path: str, display=None) -> int:
    """Run the job stored in a prepared run directory (job.toml + plan.json); used by `run` and `run --detach`. An
    elastic run whose head host was lost goes on in a next segment, its head on another learner host."""
    os.umask(0o077)  # everything the run writes, here and in the processes it starts: folders 0700, files 0600
    rundir = RunDir(Path(path))
    with StopBetweenSegments() as gap:
        while True:
            supervisor = prepared_supervisor(rundir, display)
            code = supervisor.run()
            if supervisor.head_lost is None or supervisor.stop_signals:
                return code
            ended = rundir.read_state() or {}  # the segment's end, counters and all: what a stop now keeps
            if gap.signum is None and prepare_next_segment(rundir, supervisor.spec, supervisor.head_lost,
                                                           supervisor.head_lost_at) is not None:
                return 1
            if gap.signum is not None:
                return stop_between_segments(rundir, ended, gap.signum)


def prepared_supervisor(rundir: RunDir, display=None) -> Supervisor:
    """The supervisor of the segment a run directory holds ready (its job, plan and first state)."""
    spec = with_host_secrets(load_job(rundir.job_toml), rundir.read_secrets())
    saved = rundir.read_plan() or {}
    # The addresses `rlctl run` resolved for the hosts are part of the saved plan: the same plan is rendered again.
    addresses = {h["name"]: h["address"] for h in saved.get("hosts", []) if "address" in h}
    control = str((saved.get("endpoints") or {}).get("control", ""))  # where Slurm steps reach this supervisor
    plan = make_plan(spec, rundir.run_id, str(rundir.path), int(saved.get("base_port", 0)), python=sys.executable,
                     addresses=addresses, board_token=str(saved.get("board_token", "")),
                     control_address=control.removeprefix("tcp://").rsplit(":", 1)[0] or "127.0.0.1")
    first = rundir.read_state() or {}
    resumed = first.get("resumed")  # `rlctl run --resume` (or a requeued batch job) left what to continue from
    return Supervisor(spec, plan, rundir, wire.CurveKeys.generate(), display,
                      resumed if isinstance(resumed, dict) else None, batch=first.get("slurm_batch") is True)


if __name__ == "__main__":
    # `rlctl run --detach` starts this; its stdout is the run's supervisor.out.
    from rlctl.views.console import progress_printer

    sys.exit(supervise_rundir(sys.argv[1], display=progress_printer()))
