"""The points of `rlctl plot`: runs' curves read back from their TensorBoard files (tensorboard's own reader),
smoothed, aggregated per job (mean and a band over runs) and written as CSV. rlctl.views.curves draws them.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

BANDS = {"minmax": "min-max band", "std": "mean ± std band"}


class CurveError(ValueError):
    """A run without the asked-for curve: `run` names it, `tags` are the scalar tags it has."""

    def __init__(self, run: str, message: str, tags: list[str]):
        super().__init__(f"{run}: {message}")
        self.run, self.tags = run, tags


@dataclass
class Curve:
    """One run's points of one scalar; an aggregated curve also has its band (low and high at each x)."""

    label: str
    xs: list[float]
    ys: list[float]
    band: tuple[list[float], list[float]] | None = None


def read_curve(run_dir: Path, metric: str, x: str = "env_steps", label: str | None = None) -> Curve:
    """`metric`'s points in a run's tb/ folder against env steps (the events' step) or seconds since the run
    started (the events' wall time)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = Path(run_dir)
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = sorted(acc.Tags().get("scalars", []))
    if metric not in tags:
        raise CurveError(run_dir.name, f"no scalar {metric!r} in its TensorBoard files", tags)
    events = [e for e in acc.Scalars(metric) if math.isfinite(e.value)]
    if not events:
        raise CurveError(run_dir.name, f"{metric!r} has no finite points yet", tags)
    t0 = min(min(e.wall_time for e in acc.Scalars(tag)) for tag in tags)
    xs = [float(e.step) for e in events] if x == "env_steps" else [e.wall_time - t0 for e in events]
    return Curve(label or run_dir.name, xs, [float(e.value) for e in events])


def read_curves(run_dirs: list[Path], metric: str, x: str) -> tuple[list[Curve], list[CurveError]]:
    """The curves of the runs that have `metric`, and why each of the others has none."""
    curves, missing = [], []
    for run_dir in run_dirs:
        try:
            curves.append(read_curve(run_dir, metric, x))
        except CurveError as exc:
            missing.append(exc)
    return curves, missing


def smoothed(curve: Curve, window: int) -> Curve:
    """The curve as a trailing moving average: each point the mean of itself and the `window` - 1 before it."""
    if window <= 1:
        return curve
    ys, total = [], 0.0
    for i, y in enumerate(curve.ys):
        total += y - (curve.ys[i - window] if i >= window else 0.0)
        ys.append(total / min(i + 1, window))
    return Curve(curve.label, curve.xs, ys, curve.band)


def _at(curve: Curve, xv: float) -> float:
    """The curve's value at xv, linear between its points (xv within its range)."""
    xs, ys = curve.xs, curve.ys
    lo, hi = 0, len(xs) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if xs[mid] <= xv else (lo, mid)
    if xs[hi] == xs[lo] or xv <= xs[lo]:
        return ys[lo] if xv <= xs[lo] else ys[hi]
    return ys[lo] + (ys[hi] - ys[lo]) * (xv - xs[lo]) / (xs[hi] - xs[lo])


def aggregate(label: str, curves: list[Curve], band: str = "minmax") -> Curve:
    """The mean of the curves with a band (min-max, or mean ± std) at each x any of them has, over the x range they
    all cover (where that is empty: each x over the runs that reach it), the runs' curves interpolated linearly."""
    import statistics

    lo, hi = max(c.xs[0] for c in curves), min(c.xs[-1] for c in curves)
    grid = sorted({xv for c in curves for xv in c.xs if lo <= xv <= hi or lo > hi})
    xs, mean, low, high = [], [], [], []
    for xv in grid:
        vals = [_at(c, xv) for c in curves if c.xs[0] <= xv <= c.xs[-1]]
        m = sum(vals) / len(vals)
        spread = statistics.pstdev(vals)
        xs.append(xv)
        mean.append(m)
        low.append(m - spread if band == "std" else min(vals))
        high.append(m + spread if band == "std" else max(vals))
    runs = f"{len(curves)} run" + ("s" if len(curves) > 1 else "")
    return Curve(f"{label} (mean of {runs}, {BANDS[band]})", xs, mean, (low, high))


def grouped(curves: list[Curve], jobs: list[str], band: str = "minmax") -> list[Curve]:
    """One aggregated curve per job (in the order jobs first appear), from the runs' curves and their jobs."""
    by_job: dict[str, list[Curve]] = {}
    for curve, job in zip(curves, jobs):
        by_job.setdefault(job, []).append(curve)
    return [aggregate(job, members, band) for job, members in by_job.items()]


def write_csv(curves: list[Curve], out: TextIO) -> None:
    """The curves' points as CSV: run, x, value (with aggregated curves also low and high: the band)."""
    banded = any(c.band is not None for c in curves)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["run", "x", "value"] + (["low", "high"] if banded else []))
    for c in curves:
        for i, (xv, yv) in enumerate(zip(c.xs, c.ys)):
            band = [_number(c.band[0][i]), _number(c.band[1][i])] if c.band is not None else ["", ""]
            writer.writerow([c.label, _number(xv), _number(yv)] + (band if banded else []))


def _number(v: float) -> str:
    """A CSV number: whole numbers without ".0", others in full (repr)."""
    return str(int(v)) if v.is_integer() and abs(v) < 2 ** 53 else repr(v)


class NoCurves(ValueError):
    """None of the runs has the asked-for curve (the message lists every scalar tag they have)."""


def plot_curves(runs: list, metric: str, x: str, smooth: int = 1, band: str | None = None,
                group_of: dict[str, str] | None = None) -> tuple[list[Curve], list[str]]:
    """The curves `rlctl plot` draws for these RunDirs: each run's (smoothed over `smooth` points), or with `band`
    one per job (aggregate), or per group where `group_of` gives each run id's; and a line for each run skipped for
    lacking the metric. NoCurves if none has it."""
    from rlctl.run_reading import job_of_run_id

    curves, missing = read_curves([rd.path for rd in runs], metric, x)
    if not curves:
        tags = sorted({t for exc in missing for t in exc.tags})
        where = str(missing[0]) if len(missing) == 1 else f"none of the {len(missing)} runs has a scalar {metric!r}"
        raise NoCurves(f"{where}; {'its' if len(missing) == 1 else 'their'} {len(tags)} scalar tags: "
                       f"{', '.join(tags) or 'none'}")
    curves = [smoothed(c, smooth) for c in curves]
    if band is not None:
        lacking = {exc.run for exc in missing}
        jobs = [(group_of or {}).get(rd.run_id) or (rd.read_state() or {}).get("job") or job_of_run_id(rd.run_id)
                for rd in runs if rd.run_id not in lacking]
        curves = grouped(curves, jobs, band)
    return curves, [f"skipped {exc}" for exc in missing]
