"""The metrics sink: the processes' heartbeat figures gathered (MetricsHub), written as TensorBoard points, mirrored
to W&B when the job asks, and the recent mean training return kept for `rlctl status`'s sparkline."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable

from rlctl import metric_names as M
from rlctl.net.control import ControlMessage
from rlctl.metrics import MetricsHub, TensorBoardWriter, flatten, hyperparameter_table, last_step
from rlctl.rundir import RunDir
from rlctl.sweep_dir import sweep_hparams
from rlctl.job.applicable import applicable_settings
from rlctl.job.resolved import resolved_dict
from rlctl.job.spec import JobSpec
from rlctl.role_names import Role

RETURN_HISTORY = 40  # points of the mean training return kept in state.json, one per metrics interval
PROGRESS_HISTORY = 120  # [time, env steps, mean return, eval return] points: the rates and ETAs of rlctl status

# The scalars TensorBoard's HParams tab shows for each run (their last values: the run's final figures).
HPARAM_METRICS = [M.EPISODE_RETURN_MEAN, M.EPISODE_RETURN_BEST, M.EVAL_RETURN_MEAN, M.ENV_STEPS, M.ENV_STEPS_PER_S,
                  M.SAMPLES_PER_S]


class MetricsSink:
    """Where the run's figures go: the hub (run-level figures), TensorBoard, W&B and the return history."""

    def __init__(self, spec: JobSpec, run_id: str, rundir: RunDir, hub: MetricsHub, resumed: dict | None,
                 own_losses: Callable[[], tuple[int, int]]):
        self.spec, self.run_id, self.rundir, self.hub = spec, run_id, rundir, hub
        self.own_losses = own_losses  # (dropped, refused) of the supervisor's own control socket
        self.return_history: deque[float] = deque(maxlen=RETURN_HISTORY)  # the sparkline of rlctl status
        self.progress_history: deque[list] = deque(maxlen=PROGRESS_HISTORY)  # rlctl.supervise.stop_progress reads it
        self.wandb = None  # rlctl.supervise.wandb_mirror.WandbMirror when the job asks for one
        self.tb: TensorBoardWriter | None = None
        self.tb_floor = -1  # TensorBoard points of this segment come after this step
        self.best_return = _figure(resumed or {}, "best_return")  # M.EPISODE_RETURN_BEST, over every segment
        if resumed:
            # A resumed run continues the counters (and TensorBoard's step axis) of the segments before it;
            # state.json lags the event files by up to half a second after a kill: whichever is further wins.
            self.tb_floor = last_step(str(rundir.tb_dir))
            hub.continue_from(max(int(resumed.get("env_steps", 0)), self.tb_floor), int(resumed.get("episodes", 0)))

    def take(self, name: str, role: str, msg: ControlMessage) -> dict | None:
        """One heartbeat's figures into the hub; the process's merged figures (None for a learner rank other than
        0, which the hub keeps per rank)."""
        metrics = {**msg.metrics, **msg.episodes}
        if msg.role == Role.LEARNER:
            metrics["rank"] = msg.rank
            if msg.rank != 0:
                self.hub.on_heartbeat(f"learner-rank{msg.rank}", Role.LEARNER, metrics)
                return None
        self.hub.on_heartbeat(name, role, metrics)
        return self.hub.latest.get(name, {})

    def figures(self) -> dict:
        """The run's figures: the processes' (the hub's), with what the supervisor's own control socket dropped and
        refused added to theirs."""
        metrics = self.hub.snapshot()
        dropped, refused = self.own_losses()
        metrics[M.NET_DROPPED] = metrics.get(M.NET_DROPPED, 0) + dropped
        metrics[M.NET_REFUSED] = metrics.get(M.NET_REFUSED, 0) + refused
        now = _figure(metrics, M.EPISODE_RETURN_MEAN)
        if now is not None and (self.best_return is None or now > self.best_return):
            self.best_return = now
        if self.best_return is not None:
            metrics[M.EPISODE_RETURN_BEST] = self.best_return
        return metrics

    def open_wandb(self) -> None:
        """The W&B mirror, when the job asks for one."""
        if self.spec.logging.wandb is not None:
            from rlctl.supervise.wandb_mirror import open_mirror

            self.wandb = open_mirror(self.spec.logging.wandb, self.run_id, str(self.rundir.path),
                                     flatten(resolved_dict(self.spec)))

    def open_tensorboard(self, started_at: float) -> TensorBoardWriter:
        """This segment's event file, with the job's hyperparameters (a sweep's trial: its experiment, what
        TensorBoard's HParams tab shows of the sweep's folder, names the sweep's parameters only)."""
        self.tb = TensorBoardWriter(str(self.rundir.tb_dir), after_step=self.tb_floor)
        hparams = applicable_settings(self.spec)  # the sections the job uses (rlctl.job.applicable)
        swept = sweep_hparams(self.rundir.path, hparams)  # {} outside a sweep
        self.tb.text("hyperparameters", hyperparameter_table(hparams))
        self.tb.hparams_start({**hparams, **swept}, HPARAM_METRICS, started_at, list(swept) or None)
        return self.tb

    def write_point(self) -> None:
        """One point of every figure, at the current env step (and the episodes that ended since the last)."""
        snap = self.figures()
        step = int(snap.get(M.ENV_STEPS, 0))
        episodes = self.hub.drain_episodes()
        values = {k: v for k, v in snap.items() if isinstance(v, (int, float))}
        if episodes:
            values[M.EPISODE_RETURN] = sum(episodes) / len(episodes)
        if isinstance(snap.get(M.EPISODE_RETURN_MEAN), (int, float)):
            self.return_history.append(float(snap[M.EPISODE_RETURN_MEAN]))
        self.progress_history.append([round(time.time(), 3), step, _figure(snap, M.EPISODE_RETURN_MEAN),
                                      _figure(snap, M.EVAL_RETURN_MEAN)])
        self.tb.scalars(values, step)
        self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(values, step)

    def finish(self, ok: bool, started_at: float) -> None:
        """The last point, the run's outcome in the HParams tab; TensorBoard and W&B closed."""
        tb = self.tb or self.open_tensorboard(started_at)
        try:
            self.write_point()
            tb.hparams_end(ok, time.time())
        finally:
            tb.close()
            if self.wandb is not None:
                self.wandb.finish(ok)


def _figure(snap: dict, key: str) -> float | None:
    """A figure of the snapshot as a float, None when it has none."""
    value = snap.get(key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None
