"""How far a run is from each of its `[job.stop]` criteria, and how soon it gets there: the supervisor's stop rule and
the progress lines of the live table and `rlctl status` are the same computation, so a bar shows 100% exactly when its
criterion stops the run.

A bar is where the criterion's value stands against its target (value / target, clipped; a return criterion still
short of its rounds in a row or of its episodes shows 99% at most). An ETA comes from the criterion's own recent trend
in the run's progress history (state.json's `progress_history`: [time, env steps, mean return, eval return] points),
and never for a run that is over.

Plain data in, plain data out (no rich, no torch): the CLI path imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlctl import metric_names as M

# Columns of a progress_history point.
T, STEPS, RETURN, EVAL = range(4)
RATE_WINDOW_S = 10.0  # rates are counts over the last this many seconds: a slow heartbeat never reads as 0.0/s
TREND_MIN_POINTS, TREND_MIN_SPAN_S = 3, 5.0  # fewer or shorter and a return's trend says nothing


@dataclass(frozen=True)
class StopProgress:
    """One criterion: where the run stands, the target, the fraction done (None where the value is no fraction of
    the target), seconds to go estimated from its recent trend (None where no estimate makes sense) and whether it
    is met (the run stops). A limit (wall time; env steps beside a return target) caps the run rather than being
    its goal; `exact` says eta_s is not an estimate (the time left of a wall-time limit)."""

    criterion: str  # env_steps | wall_s | eval_return | train_return
    label: str
    current: str
    target: str
    fraction: float | None
    eta_s: float | None
    met: bool
    reason: str  # why the run stopped, when met
    note: str = ""  # what else counts (rounds in a row, the episodes averaged), or "limit"
    value: float | None = None  # `current` as a number (None before the run has one)
    threshold: float | None = None  # `target` as a number
    limit: bool = False
    exact: bool = False

    def text(self) -> str:
        """"current / target"."""
        return f"{self.current} / {self.target}"

    def record(self) -> dict:
        """What state.json keeps of the criterion that stopped a run ("stopped_by"): code reads this, not `reason`."""
        return {"criterion": self.criterion, "value": self.value, "threshold": self.threshold}


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _points(history, column: int) -> list[tuple[float, float]]:
    """(time, value) of the history's points that have the column."""
    out = []
    for point in history if isinstance(history, list) else []:
        if isinstance(point, (list, tuple)) and len(point) > column:
            t, v = _num(point[T]), _num(point[column])
            if t is not None and v is not None:
                out.append((t, v))
    return out


def window_rate(history, column: int = STEPS, window_s: float = RATE_WINDOW_S) -> float | None:
    """Growth per second of a count over the last window_s of the history (None with under 2 points)."""
    points = _points(history, column)
    if len(points) < 2:
        return None
    t1, v1 = points[-1]
    t0, v0 = next(((t, v) for t, v in points if t1 - t <= window_s and t < t1), points[-2])
    return (v1 - v0) / (t1 - t0) if t1 > t0 else None


def trend_slope(history, column: int) -> float | None:
    """Least-squares slope (per second) of a figure over the history; None over too few points or seconds."""
    points = _points(history, column)
    if len(points) < TREND_MIN_POINTS or points[-1][0] - points[0][0] < TREND_MIN_SPAN_S:
        return None
    mt = sum(t for t, _ in points) / len(points)
    mv = sum(v for _, v in points) / len(points)
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (v - mv) for t, v in points) / var if var > 0 else None


def _eta(gap: float, slope: float | None) -> float | None:
    """Seconds to close `gap` at `slope` per second, None when it does not close."""
    return gap / slope if slope is not None and slope > 0 and gap > 0 else None


def _fraction(value: float | None, target: float, met: bool) -> float | None:
    """value / target clipped to [0, 1], below 1 until met; None where the target is no positive amount."""
    if met:
        return 1.0
    if value is None:
        return 0.0 if target > 0 else None
    return min(0.999, max(0.0, value / target)) if target > 0 else None


def _return_row(criterion: str, stop: dict, metrics: dict, history, episodes_seen) -> StopProgress | None:
    """An eval_return or train_return criterion."""
    target = _num(stop.get(criterion))
    if target is None:
        return None
    if criterion == "eval_return":
        rounds = int(_num(stop.get("eval_rounds")) or 1)
        value = _num(metrics.get(M.EVAL_RETURN_MEAN))
        streak = int(_num(metrics.get(M.EVAL_STREAK)) or 0)
        met = value is not None and value >= target and streak >= rounds
        label, key, column = "eval return", M.EVAL_RETURN_MEAN, EVAL
        note = f"{min(streak, rounds)} of {rounds} in a row" if rounds > 1 else ""
        why = f" ({rounds} rounds in a row)" if rounds > 1 else ""
    else:
        window = int(_num(stop.get("train_return_window")) or 1)
        value = _num(metrics.get(M.EPISODE_RETURN_MEAN))
        seen = episodes_seen if episodes_seen is not None else int(_num(metrics.get(M.EPISODES)) or 0)
        met = value is not None and seen >= window and value >= target
        label, key, column, note, why = "train return", M.EPISODE_RETURN_MEAN, RETURN, f"last {window} episodes", ""
    eta = None if met or value is None else _eta(target - value, trend_slope(history, column))
    return StopProgress(criterion, label, f"{value:.1f}" if value is not None else "-", f"{target:g}",
                        _fraction(value, target, met), eta, met,
                        f"{key} {value if value is not None else 0:.1f} >= {target:g}{why}", note,
                        value=value, threshold=target)


def stop_progress(stop: dict, metrics: dict, elapsed_s: float | None, episodes_seen: int | None = None,
                  history: list | None = None, over: bool = False) -> list[StopProgress]:
    """Each set criterion of a `[job.stop]` table (as a dict) against the run-level metrics, in the order the
    supervisor checks them (the first met one is why the run stopped). With the run's progress history, ETAs from
    each criterion's recent trend; none when the run is `over`."""
    stop = stop if isinstance(stop, dict) else {}
    metrics = metrics if isinstance(metrics, dict) else {}
    out = [row for c in ("eval_return", "train_return") if (row := _return_row(c, stop, metrics, history,
                                                                              episodes_seen))]
    has_goal = bool(out)
    target = _num(stop.get("env_steps"))
    if target is not None:
        steps = _num(metrics.get(M.ENV_STEPS)) or 0.0
        rate = window_rate(history)
        rate = _num(metrics.get(M.ENV_STEPS_PER_S)) if rate is None else rate
        met = steps >= target
        out.append(StopProgress("env_steps", "env steps", f"{steps:,.0f}", f"{target:,.0f}", min(1.0, steps / target),
                                None if met else _eta(target - steps, rate), met,
                                f"charts/env_steps {int(steps)} >= {int(target)}", "limit" if has_goal else "",
                                value=steps, threshold=target, limit=has_goal))
    target = _num(stop.get("wall_s"))
    if target is not None and elapsed_s is not None:
        met = elapsed_s >= target
        out.append(StopProgress("wall_s", "wall time", _clock(elapsed_s), _clock(target),
                                min(1.0, elapsed_s / target), None if met else target - elapsed_s, met,
                                f"wall time {elapsed_s:.0f}s >= {target:g}s", "limit", value=elapsed_s,
                                threshold=target, limit=True, exact=True))
    if over:
        out = [StopProgress(**{**p.__dict__, "eta_s": None}) for p in out]
    return out


def _clock(seconds: float) -> str:
    """Whole seconds as "42s", "9m52s" or "2h03m" (a wall-time criterion's figures)."""
    total = int(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"


def run_eta(rows: list[StopProgress]) -> tuple[float, str, bool] | None:
    """When the run ends: the soonest ETA among its criteria, the criterion's label and whether it is only an upper
    bound (another criterion, with no estimate, may be met sooner). None when no criterion has an ETA."""
    timed = [(p.eta_s, p.label) for p in rows if p.eta_s is not None]
    if not timed:
        return None
    eta, label = min(timed)
    return eta, label, any(p.eta_s is None and not p.met for p in rows)


def percent(fraction: float) -> int:
    """A fraction as a whole percentage, rounded down: 100 only when the criterion is met."""
    return 100 if fraction >= 1.0 else min(99, int(fraction * 100))
