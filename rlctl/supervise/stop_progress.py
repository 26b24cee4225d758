"""How far a run is from each of its `[job.stop]` criteria: the supervisor's stop rule and the progress lines of the
live table and `rlctl status` are the same computation, so a bar shows 100% exactly when its criterion stops the run.

Plain data in, plain data out (no rich, no torch): the CLI path imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlctl import metric_names as M


@dataclass(frozen=True)
class StopProgress:
    """One criterion: where the run stands, the target, the fraction done (None where a return is no fraction),
    seconds to go at the recent rate (None where no rate makes sense) and whether it is met (the run stops)."""

    criterion: str  # env_steps | wall_s | eval_return | train_return
    label: str
    current: str
    target: str
    fraction: float | None
    eta_s: float | None
    met: bool
    reason: str  # why the run stopped, when met
    note: str = ""  # what else counts (rounds in a row, the episodes averaged)
    value: float | None = None  # `current` as a number (None before the run has one)
    threshold: float | None = None  # `target` as a number

    def text(self) -> str:
        """"current / target (note)"."""
        return f"{self.current} / {self.target}" + (f" ({self.note})" if self.note else "")

    def record(self) -> dict:
        """What state.json keeps of the criterion that stopped a run ("stopped_by"): code reads this, not `reason`."""
        return {"criterion": self.criterion, "value": self.value, "threshold": self.threshold}


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def stop_progress(stop: dict, metrics: dict, elapsed_s: float | None, episodes_seen: int | None = None
                  ) -> list[StopProgress]:
    """Each set criterion of a `[job.stop]` table (as a dict) against the run-level metrics, in the order the
    supervisor checks them (the first met one is why the run stopped)."""
    out = []
    stop = stop if isinstance(stop, dict) else {}
    metrics = metrics if isinstance(metrics, dict) else {}
    target = _num(stop.get("eval_return"))
    if target is not None:
        rounds = int(_num(stop.get("eval_rounds")) or 1)
        value = _num(metrics.get(M.EVAL_RETURN_MEAN))
        streak = int(_num(metrics.get(M.EVAL_STREAK)) or 0)
        met = value is not None and value >= target and streak >= rounds
        # Rounds in a row at the target are the fraction; short of them it never shows complete.
        fraction = 1.0 if met else min(streak, rounds - 1) / rounds if value is not None and value >= target else 0.0
        out.append(StopProgress("eval_return", "eval return", f"{value:.1f}" if value is not None else "-",
                                f"{target:g}", fraction, None, met,
                                f"eval/return_mean {value if value is not None else 0:.1f} >= {target:g}"
                                + (f" ({rounds} rounds in a row)" if rounds > 1 else ""),
                                f"{min(streak, rounds)} of {rounds} rounds in a row" if rounds > 1 else "",
                                value=value, threshold=target))
    target = _num(stop.get("train_return"))
    if target is not None:
        window = int(_num(stop.get("train_return_window")) or 1)
        value = _num(metrics.get(M.EPISODE_RETURN_MEAN))
        seen = episodes_seen if episodes_seen is not None else int(_num(metrics.get(M.EPISODES)) or 0)
        met = value is not None and seen >= window and value >= target
        out.append(StopProgress("train_return", "train return", f"{value:.1f}" if value is not None else "-",
                                f"{target:g}", 1.0 if met else None, None, met,
                                f"charts/episode_return_mean {value if value is not None else 0:.1f} >= {target:g}",
                                f"mean of the last {window} episodes", value=value, threshold=target))
    target = _num(stop.get("env_steps"))
    if target is not None:
        steps = _num(metrics.get(M.ENV_STEPS)) or 0.0
        rate = _num(metrics.get(M.ENV_STEPS_PER_S)) or 0.0
        met = steps >= target
        out.append(StopProgress("env_steps", "env steps", f"{steps:,.0f}", f"{target:,.0f}", min(1.0, steps / target),
                                None if met or rate <= 0 else (target - steps) / rate, met,
                                f"charts/env_steps {int(steps)} >= {int(target)}", value=steps, threshold=target))
    target = _num(stop.get("wall_s"))
    if target is not None and elapsed_s is not None:
        met = elapsed_s >= target
        out.append(StopProgress("wall_s", "wall time", f"{elapsed_s:,.0f}s", f"{target:,.0f}s",
                                min(1.0, elapsed_s / target), None if met else target - elapsed_s, met,
                                f"wall time {elapsed_s:.0f}s >= {target:g}s", value=elapsed_s, threshold=target))
    return out


def percent(fraction: float) -> int:
    """A fraction as a whole percentage, rounded down: 100 only when the criterion is met."""
    return 100 if fraction >= 1.0 else min(99, int(fraction * 100))
