"""Learning curves of runs, read back from their TensorBoard files with tensorboard's own reader, drawn in the
terminal (rich) or into a PNG (matplotlib), for `rlctl plot`; and the sparkline of `rlctl status RUN`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

SPARK = "▁▂▃▄▅▆▇█"
MARKERS = ("●", "▲", "■", "◆", "✚", "○", "△", "□")
COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")
X_AXES = {"env_steps": "env steps", "wall_s": "wall time (s)"}


class CurveError(ValueError):
    """A run without the asked-for curve (the message names the run and what it has)."""


@dataclass
class Curve:
    """One run's points of one scalar."""

    label: str
    xs: list[float]
    ys: list[float]


def read_curve(run_dir: Path, metric: str, x: str = "env_steps", label: str | None = None) -> Curve:
    """`metric`'s points in a run's tb/ folder against env steps (the events' step) or seconds since the run
    started (the events' wall time)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = Path(run_dir)
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    if metric not in tags:
        shown = ", ".join(sorted(t for t in tags if t.startswith(("charts/", "eval/"))))
        raise CurveError(f"{run_dir.name}: no scalar {metric!r} in its TensorBoard files (it has: {shown or 'none'})")
    events = [e for e in acc.Scalars(metric) if math.isfinite(e.value)]
    if not events:
        raise CurveError(f"{run_dir.name}: {metric!r} has no finite points yet")
    t0 = min(e.wall_time for e in acc.Scalars(tags[0])) if tags else events[0].wall_time
    xs = [float(e.step) for e in events] if x == "env_steps" else [e.wall_time - t0 for e in events]
    return Curve(label or run_dir.name, xs, [float(e.value) for e in events])


def sparkline(values: list[float], width: int = 24) -> str:
    """The last `width` values as block characters, scaled between their min and max."""
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)][-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo
    return "".join(SPARK[int((v - lo) / span * (len(SPARK) - 1)) if span > 0 else len(SPARK) // 2] for v in vals)


def _ticks(lo: float, hi: float) -> str:
    return f"{lo:.4g}" if lo == hi else f"{lo:.4g} … {hi:.4g}"


def terminal_plot(curves: list[Curve], metric: str, x: str, width: int = 80, height: int = 16):
    """The curves on one character grid (a marker and colour per run, the y range on the left, the x range
    below, a legend): a rich renderable `width` columns wide."""
    from rich.text import Text

    ys = [y for c in curves for y in c.ys]
    xs = [v for c in curves for v in c.xs]
    y_lo, y_hi, x_lo, x_hi = min(ys), max(ys), min(xs), max(xs)
    labels = [f"{y_hi:.4g}", f"{(y_lo + y_hi) / 2:.4g}", f"{y_lo:.4g}"]
    gutter = max(map(len, labels)) + 1
    cols, rows = max(10, width - gutter - 1), max(4, height)
    grid: list[list[tuple[str, str] | None]] = [[None] * cols for _ in range(rows)]

    def cell(xv: float, yv: float) -> tuple[int, int]:
        c = 0 if x_hi == x_lo else round((xv - x_lo) / (x_hi - x_lo) * (cols - 1))
        r = rows // 2 if y_hi == y_lo else round((y_hi - yv) / (y_hi - y_lo) * (rows - 1))
        return r, c

    for i, curve in enumerate(curves):
        mark, colour = MARKERS[i % len(MARKERS)], COLOURS[i % len(COLOURS)]
        prev = None
        for xv, yv in zip(curve.xs, curve.ys):
            r, c = cell(xv, yv)
            if prev is not None and c > prev[1] + 1:  # join distant points with a straight run of dots
                for k in range(prev[1] + 1, c):
                    t = (k - prev[1]) / (c - prev[1])
                    rr = round(prev[0] + t * (r - prev[0]))
                    if grid[rr][k] is None:
                        grid[rr][k] = ("·", colour)
            grid[r][c] = (mark, colour)
            prev = (r, c)
    out = Text(no_wrap=True, overflow="crop")
    out.append(f"{metric} against {X_AXES.get(x, x)}\n", style="bold")
    for r in range(rows):
        label = labels[0] if r == 0 else labels[2] if r == rows - 1 else labels[1] if r == rows // 2 else ""
        out.append(f"{label:>{gutter - 1}} │")
        for c in range(cols):
            ch = grid[r][c]
            out.append(ch[0] if ch else " ", style=ch[1] if ch else "")
        out.append("\n")
    out.append(" " * (gutter - 1) + " └" + "─" * cols + "\n")
    x_left, x_right = f"{x_lo:.4g}", f"{x_hi:.4g}"
    out.append(" " * (gutter + 1) + x_left + " " * max(1, cols - len(x_left) - len(x_right)) + x_right + "\n")
    for i, curve in enumerate(curves):
        last = curve.ys[-1]
        out.append(f"  {MARKERS[i % len(MARKERS)]} ", style=COLOURS[i % len(COLOURS)])
        out.append(f"{curve.label}  (last {last:.4g}, {len(curve.ys)} points)\n")
    return out


def png_out_problem(out: Path) -> str | None:
    """Why no PNG can be written at `out` (checked before any run is read), or None."""
    out = Path(out)
    if out.is_dir():
        return f"--out {out}: a folder; give a file name (e.g. {out / 'curves.png'})"
    if not out.parent.is_dir():
        return f"--out {out}: there is no folder {out.parent}"
    return None


def png_plot(curves: list[Curve], metric: str, x: str, out: Path) -> Path:
    """The curves into a PNG (matplotlib, no display needed), one line per run with a legend; CurveError when the
    file cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        for curve in curves:
            ax.plot(curve.xs, curve.ys, label=curve.label, linewidth=1.6)
        ax.set_xlabel(X_AXES.get(x, x))
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        fig.savefig(out)
    except OSError as exc:
        raise CurveError(f"--out {out}: cannot write it ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
    return Path(out)
