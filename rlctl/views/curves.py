"""Learning curves drawn in the terminal (rich) or into a PNG (matplotlib), for `rlctl plot` (its points:
rlctl.views.curve_data); and the sparkline of `rlctl status RUN`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rlctl.views.curve_data import Curve

SPARK = "▁▂▃▄▅▆▇█"
BAND = "░"
MARKERS = ("●", "▲", "■", "◆", "✚", "○", "△", "□")
COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")
X_AXES = {"env_steps": "env steps", "wall_s": "wall time (s)"}


def sparkline(values: list[float], width: int = 24) -> str:
    """The last `width` values as block characters, scaled between their min and max."""
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)][-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo
    return "".join(SPARK[int((v - lo) / span * (len(SPARK) - 1)) if span > 0 else len(SPARK) // 2] for v in vals)


def tick_label(v: float) -> str:
    """A readable axis number: "490", "12.5", "0.0031", "210k", "1.2M" (never "2.104e+05")."""
    if not math.isfinite(v) or abs(v) < 1000:
        text = f"{v:.4g}"
        return "0" if text == "-0" else text
    for power, suffix in enumerate(("k", "M", "G", "T"), start=1):
        text = f"{v / 1000 ** power:.3g}"
        if "e" not in text and (abs(float(text)) < 1000 or suffix == "T"):
            return text + suffix
    return f"{v:.3g}"  # pragma: no cover - the loop always returns


def _bounds(curves: list[Curve]) -> tuple[float, float, float, float]:
    """(y low, y high, x low, x high) of the curves and their bands."""
    ys = [y for c in curves for y in c.ys + (c.band[0] + c.band[1] if c.band else [])]
    xs = [v for c in curves for v in c.xs]
    return min(ys), max(ys), min(xs), max(xs)


def _grid(curves: list[Curve], rows: int, cols: int) -> list[list[tuple[str, str] | None]]:
    """The curves on a rows x cols grid of (character, colour): markers joined by dots, bands shaded under them."""
    y_lo, y_hi, x_lo, x_hi = _bounds(curves)
    grid: list[list[tuple[str, str] | None]] = [[None] * cols for _ in range(rows)]

    def col(xv: float) -> int:
        return 0 if x_hi == x_lo else round((xv - x_lo) / (x_hi - x_lo) * (cols - 1))

    def row(yv: float) -> int:
        return rows // 2 if y_hi == y_lo else round((y_hi - yv) / (y_hi - y_lo) * (rows - 1))

    for i, curve in enumerate(curves):
        if curve.band is None:
            continue
        colour = f"dim {COLOURS[i % len(COLOURS)]}"
        points = list(zip(curve.xs, *curve.band))
        for (x0, lo0, hi0), (x1, lo1, hi1) in zip(points, points[1:] + points[-1:]):
            c0, c1 = col(x0), col(x1)
            for k in range(c0, max(c0, c1 - 1) + 1):  # each column up to the next point's, linearly between
                t = (k - c0) / (c1 - c0) if c1 > c0 else 0.0
                for r in range(row(hi0 + t * (hi1 - hi0)), row(lo0 + t * (lo1 - lo0)) + 1):
                    grid[r][k] = grid[r][k] or (BAND, colour)
    for i, curve in enumerate(curves):
        mark, colour = MARKERS[i % len(MARKERS)], COLOURS[i % len(COLOURS)]
        prev = None
        for xv, yv in zip(curve.xs, curve.ys):
            r, c = row(yv), col(xv)
            if prev is not None and c > prev[1] + 1:  # join distant points with a straight run of dots
                for k in range(prev[1] + 1, c):
                    rr = round(prev[0] + (k - prev[1]) / (c - prev[1]) * (r - prev[0]))
                    if grid[rr][k] is None or grid[rr][k][0] == BAND:
                        grid[rr][k] = ("·", colour)
            grid[r][c] = (mark, colour)
            prev = (r, c)
    return grid


def terminal_plot(curves: list[Curve], metric: str, x: str, width: int = 80, height: int = 16):
    """The curves on one character grid (a marker and colour per curve, a band shaded, the y range on the left,
    the x range below, a legend): a rich renderable `width` columns wide."""
    from rich.text import Text

    y_lo, y_hi, x_lo, x_hi = _bounds(curves)
    labels = [tick_label(y_hi), tick_label((y_lo + y_hi) / 2), tick_label(y_lo)]
    gutter = max(map(len, labels)) + 1
    cols, rows = max(10, width - gutter - 1), max(4, height)
    grid = _grid(curves, rows, cols)
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
    x_left, x_right = tick_label(x_lo), tick_label(x_hi)
    out.append(" " * (gutter + 1) + x_left + " " * max(1, cols - len(x_left) - len(x_right)) + x_right + "\n")
    for i, curve in enumerate(curves):
        out.append(f"  {MARKERS[i % len(MARKERS)]} ", style=COLOURS[i % len(COLOURS)])
        out.append(f"{curve.label}  (last {tick_label(curve.ys[-1])}, {len(curve.ys)} points)\n")
    return out


class PngError(ValueError):
    """The PNG could not be written (the message says where and why)."""


def png_out_problem(out: Path) -> str | None:
    """Why no PNG can be written at `out` (checked before any run is read), or None."""
    import importlib.util

    out = Path(out)
    if importlib.util.find_spec("matplotlib") is None:
        return "--out needs matplotlib: pip install -e '.[plot]'"
    if out.is_dir():
        return f"--out {out}: a folder; give a file name (e.g. {out / 'curves.png'})"
    if not out.parent.is_dir():
        return f"--out {out}: there is no folder {out.parent}"
    return None


def png_plot(curves: list[Curve], metric: str, x: str, out: Path) -> Path:
    """The curves into a PNG (matplotlib, no display needed), one line per curve (its band shaded) with a legend;
    PngError when the file cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        for curve in curves:
            (line,) = ax.plot(curve.xs, curve.ys, label=curve.label, linewidth=1.6)
            if curve.band is not None:
                ax.fill_between(curve.xs, *curve.band, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel(X_AXES.get(x, x))
        ax.set_ylabel(metric)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: tick_label(v)))
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        fig.savefig(out)
    except OSError as exc:
        raise PngError(f"--out {out}: cannot write it ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
    return Path(out)
