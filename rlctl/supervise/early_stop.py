"""Early stopping of a sweep's clearly losing trials (`[sweep.early_stop]`), the median rule of Ray Tune's
MedianStoppingRule and Optuna's MedianPruner: at each check point (every `interval_env_steps` from
`grace_env_steps` on), a running trial whose best training return by then is below the median of the other trials'
best returns by the same env step is stopped (as `rlctl stop`: its checkpoint kept).

`median_stops` is the decision, a pure function of the trials' curves (env steps -> mean training return);
`TrialCurves` gathers those curves from the trials' state.json files (the progress history, and the current figures
each time the scheduler looks, so that a long run's history, which state.json keeps only the end of, is not lost).
Standard library only.
"""

from __future__ import annotations

import math
import statistics

from rlctl import metric_names as M
from rlctl.job.early_stop_spec import EarlyStopRule
from rlctl.run_status import RunStatus

STEPS, RETURN = 1, 2  # columns of a progress_history point (rlctl.supervise.stop_progress)


Curve = list  # [(env steps, mean training return)], any order


def best_by(curve: Curve, steps: float) -> float | None:
    """The best mean return of the curve at env steps up to `steps` (None when it has none there)."""
    seen = [r for s, r in curve if s <= steps]
    return max(seen) if seen else None


def reached(curve: Curve) -> float:
    """The most env steps the curve has a point at (0 for none)."""
    return max((s for s, _ in curve), default=0.0)


def median_stops(curves: dict[str, Curve], running: list[str], rule: EarlyStopRule) -> dict[str, str]:
    """Which running trials to stop and why (trial id -> reason): each is judged at its last check point, its best
    return so far against the median of the others' best by that check point (only others that had a return by
    then and got that far, or ended sooner: a trial that met its target early counts with its best; and only with
    at least `min_trials` of them). Its best so far, not by the check point: a trial is seen every half second, and
    a fast one may first be seen well past its check point."""
    stops = {}
    for trial in running:
        curve = curves.get(trial) or []
        point = rule.check_point(reached(curve))
        if point is None or not curve:
            continue
        mine = best_by(curve, reached(curve))
        others = [best_by(c, point) for t, c in curves.items()
                  if t != trial and (reached(c) >= point or t not in running)]
        others = [v for v in others if v is not None]
        if len(others) < rule.min_trials:
            continue
        median = statistics.median(others)
        if mine < median:
            stops[trial] = (f"best return {mine:.4g} by {reached(curve):.0f} env steps, below the median "
                            f"{median:.4g} of {len(others)} other trials by {point}")
    return stops


def _point(steps: object, value: object) -> tuple[float, float] | None:
    """(steps, return) when both are finite numbers."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (steps, value)):
        return None
    return float(steps), float(value)


class TrialCurves:
    """Each trial's curve, gathered from its state.json over the sweep's life (one point per env-step count)."""

    def __init__(self):
        self.points: dict[str, dict[float, float]] = {}

    def observe(self, trial: str, state: dict | None) -> None:
        """Add what a trial's state.json shows: its progress history and its current figures."""
        if not isinstance(state, dict):
            return
        known = self.points.setdefault(trial, {})
        history = state.get("progress_history")
        rows = [p for p in history if isinstance(p, list) and len(p) > RETURN] if isinstance(history, list) else []
        metrics = state.get("metrics") if isinstance(state.get("metrics"), dict) else {}
        found = [_point(p[STEPS], p[RETURN]) for p in rows]
        found.append(_point(metrics.get(M.ENV_STEPS), metrics.get(M.EPISODE_RETURN_MEAN)))
        for point in found:
            if point is not None:
                known[point[0]] = point[1]

    def seen(self, trial: str) -> bool:
        """True once a trial's state has been looked at."""
        return trial in self.points

    def curves(self) -> dict[str, Curve]:
        """Every trial's curve, for median_stops."""
        return {t: sorted(p.items()) for t, p in self.points.items()}


class EarlyStopper:
    """The scheduler's part: judges its running trials (median_stops), records each one stopped early in
    sweep.json (`early_stopped`: trial id -> why) and, once its run has ended, in the run's own exit reason."""

    def __init__(self, sweep, rule: EarlyStopRule):
        self.sweep, self.rule = sweep, rule
        self.curves = TrialCurves()
        told = sweep.read().get("early_stopped")
        self.stopped: dict[str, str] = dict(told) if isinstance(told, dict) else {}

    @classmethod
    def of(cls, sweep) -> EarlyStopper | None:
        """The sweep's early stopper, or None when its sweep.json has no rule."""
        rule = EarlyStopRule.from_record(sweep.read().get("early_stop"))
        return cls(sweep, rule) if rule is not None else None

    def judge(self, running: list[str]) -> dict[str, str]:
        """The running trials to stop now and why (each told once), after a fresh look at the trials' states."""
        for trial in (t["id"] for t in self.sweep.trials()):
            if trial in running or not self.curves.seen(trial):  # the others' curves do not change
                self.curves.observe(trial, self.sweep.trial_dir(trial).read_state())
        stops = median_stops(self.curves.curves(), [t for t in running if t not in self.stopped], self.rule)
        if stops:
            self.stopped.update(stops)
            self.sweep.update(early_stopped=self.stopped)
        return stops

    def ended(self, trial: str) -> None:
        """A trial's run ended: its last figures kept, and, stopped early, its exit reason saying why."""
        rundir = self.sweep.trial_dir(trial)
        state = rundir.read_state()
        self.curves.observe(trial, state)
        if trial not in self.stopped or not isinstance(state, dict):
            return
        if state.get("status") == RunStatus.STOPPED:
            state["exit_reason"] = f"early-stopped: {self.stopped[trial]}"
            rundir.write_state(state)
        else:  # it ended by itself (its target met) before the stop reached it
            del self.stopped[trial]
            self.sweep.update(early_stopped=self.stopped)
