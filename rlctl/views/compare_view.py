"""`rlctl compare`: the job keys that differ between runs, and how and when each ended (time and env steps to its
target), as a table that fits the terminal or as JSON. Imports only the standard library at module level (the CLI
path stays light).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rlctl import metric_names as M
from rlctl.rundir import RunDir
from rlctl.run_status import RunStatus
from rlctl.run_reading import elapsed_s, real_number
from rlctl.views.console import (build_table, fit_parts, format_count, format_duration, format_float, format_rate,
                                 metrics_of)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rich.console import RenderableType


def target_reached(state: dict) -> bool:
    """True for a run that finished on its target: a stop criterion other than a limit (wall time; env steps beside
    a return target)."""
    if state.get("status") != RunStatus.FINISHED or not state.get("exit_reason"):
        return False
    by = state.get("stopped_by") if isinstance(state.get("stopped_by"), dict) else {}
    stop = state.get("stop") if isinstance(state.get("stop"), dict) else {}
    if by.get("criterion") == "env_steps" and any(stop.get(k) is not None for k in ("eval_return", "train_return")):
        return False  # a limit beside the return it was for
    return by.get("criterion") != "wall_s" and not str(state["exit_reason"]).startswith("wall time")


def compare_data(runs: list[RunDir]) -> dict[str, dict]:
    """`rlctl compare --json`: per run, the job keys whose values differ between the runs (raw values), the time and
    env steps to the stop target (null unless the run finished on a target other than wall time) and its final
    figures, as raw numbers."""
    import tomllib

    from rlctl.metrics import flatten

    jobs, states = [], []
    for rd in runs:
        try:
            jobs.append(flatten(tomllib.loads(rd.job_toml.read_text())))
        except (OSError, ValueError):
            jobs.append({})
        states.append(rd.read_state() or {})
    missing = object()
    differ = [k for k in sorted({k for job in jobs for k in job})
              if len({json.dumps(job.get(k, missing), default=str) for job in jobs}) > 1]
    out = {}
    for rd, job, s in zip(runs, jobs, states):
        m = metrics_of(s)
        reached = target_reached(s)
        steps = real_number(m.get(M.ENV_STEPS))
        out[rd.run_id] = {
            "job": {k: job.get(k) for k in differ},
            "status": rd.effective_status(s) if s else RunStatus.UNKNOWN, "exit_reason": s.get("exit_reason"),
            "time_to_target_s": elapsed_s(s) if reached else None,
            "env_steps_to_target": int(steps) if reached and steps is not None else None,
            "elapsed_s": elapsed_s(s), "env_steps": int(steps) if steps is not None else None,
            "env_steps_per_s": real_number(m.get(M.ENV_STEPS_PER_S)), "return_mean": real_number(m.get(M.EPISODE_RETURN_MEAN)),
            "eval_return_mean": real_number(m.get(M.EVAL_RETURN_MEAN)),
        }
    return out


def compare_rows(runs: list[RunDir], data: dict | None = None) -> tuple[list[str], list[list]]:
    """`rlctl compare`'s wide table: one column per run; the differing job keys, then how and when each run ended."""
    data = compare_data(runs) if data is None else data
    first = next(iter(data.values()), {"job": {}})
    rows = [[k, *(_cell(d["job"][k]) for d in data.values())] for k in first["job"]]
    rows += [[label, *(fmt(d[key]) for d in data.values())] for label, key, fmt in COMPARE_FIGURES]
    return ["", *data], rows


def _to_target(v: Any) -> str:
    return format_duration(v) if v is not None else "not reached"


COMPARE_FIGURES = [  # (label, compare_data key, format), in the wide table's order
    ("status", "status", str), ("stopped because", "exit_reason", lambda v: v or "-"),
    ("time to target", "time_to_target_s", _to_target),
    ("env steps to target", "env_steps_to_target", lambda v: format_count(v) if v is not None else "not reached"),
    ("elapsed", "elapsed_s", format_duration), ("env steps", "env_steps", format_count),
    ("env steps/s", "env_steps_per_s", format_rate), ("return", "return_mean", format_float),
    ("eval return", "eval_return_mean", format_float)]
# At narrow widths, one row per run under shorter headings; these columns give way, in this order; the run and its
# time to target never.
COMPARE_NARROW = {"time to target": "to target", "env steps to target": "steps to target", "eval return": "eval",
                  "env steps": "steps", "env steps/s": "steps/s"}
COMPARE_DROP = ["steps/s", "steps", "elapsed", "status", "return", "eval", "steps to target"]


def compare_view(runs: list[RunDir]) -> "RenderableType":
    """`rlctl compare`, laid out for the width it is rendered at: one column per run where that fits, else one row
    per run (columns giving way by COMPARE_DROP, saying which) with the differing job keys under it."""
    return _CompareView(compare_data(runs), runs)


class _CompareView:
    def __init__(self, data: dict, runs: list[RunDir]):
        self.data, self.runs = data, runs

    def __rich_console__(self, console, options):
        from rich.text import Text

        width = options.max_width
        wide = build_table(None, *compare_rows(self.runs, self.data))
        if wide.least_width() <= width:
            yield wide
            return
        data = list(self.data.values())
        order = ["time to target", "env steps to target", "eval return", "return", "status", "elapsed", "env steps",
                 "env steps/s"]
        figures = sorted((f for f in COMPARE_FIGURES if f[0] in order), key=lambda f: order.index(f[0]))
        columns = ["#", "run", *(COMPARE_NARROW.get(label, label) for label, _, _ in figures)]
        rows = [[i + 1, run_id, *(fmt(d[key]) for _, key, fmt in figures)] for i, (run_id, d) in enumerate(self.data.items())]
        table = build_table(None, columns, rows, width, COMPARE_DROP)
        yield table
        left = [c for c in columns if c not in table.columns]
        if left:
            for line in fit_parts([f"left out at {width} columns: {', '.join(left)}:", "use a wider terminal or --json"],
                                  width, " "):
                yield Text(line, style="dim")
        for i, d in enumerate(data):
            if d["exit_reason"]:
                yield Text(f"{i + 1} stopped because {d['exit_reason']}")
        if data and data[0]["job"]:
            yield from self._keys(data, width)

    def _keys(self, data: list[dict], width: int):
        """The differing job keys, one column per run (numbered as above); runs that do not fit are named."""
        from rich.text import Text

        keys = list(data[0]["job"])
        shown = len(data)
        while True:
            table = build_table(None, ["job key", *(str(i + 1) for i in range(shown))],
                                [[k, *(_cell(d["job"][k]) for d in data[:shown])] for k in keys])
            if table.least_width() <= width or shown == 1:
                break
            shown -= 1
        yield Text("")
        yield table
        if shown < len(data):
            yield Text(f"+{len(data) - shown} runs: use a wider terminal or --json", style="dim")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return json.dumps(value) if isinstance(value, (list, dict, bool)) else str(value)
