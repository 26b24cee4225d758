"""All terminal output of the CLI: one rich Console, tables, run headers and log lines.

On the fast CLI path: imports only the standard library at module level; rich is imported
inside the functions that render, so `import rlctl.views.console` stays cheap.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from rlctl.views import bottleneck
from rlctl import metric_names as M
from rlctl import run_reading
from rlctl.run_reading import elapsed_s, real_number
from rlctl.rundir import OVER_STATES, RunDir, status_of
from rlctl.run_status import RunStatus
from rlctl.views.role_fold import RoleSummary, fold_roles

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rich.console import Console, RenderableType
    from rich.text import Text

    from rlctl.views.text_table import TextTable

_consoles: dict[bool, "Console"] = {}

STATUS_STYLES = {
    RunStatus.CREATED: "cyan",
    RunStatus.QUEUED: "cyan",
    RunStatus.STARTING: "cyan",
    RunStatus.RUNNING: "green",
    "restarting": "yellow",
    RunStatus.STOPPING: "yellow",
    RunStatus.FINISHED: "bold green",
    "exited": "dim",
    RunStatus.STOPPED: "yellow",
    RunStatus.FAILED: "bold red",
    RunStatus.LOST: "magenta",
    RunStatus.PREEMPTED: "yellow",
    RunStatus.UNKNOWN: "dim",
    RunStatus.PENDING: "dim",
}
# Colours for log sources; picked by a stable hash of the role so a role keeps its colour across runs.

RUNS_COLUMNS = ["run", "job", "algorithm", "state", "started", "elapsed", "env steps", "mean return", "hosts"]
PROCESS_COLUMNS = ["process", "role", "rank", "host", "pid", "state", "restarts", "rate", "heartbeat", "note"]


def get_console(stderr: bool = False) -> "Console":
    """The shared rich Console (one for stdout, one for stderr)."""
    if stderr not in _consoles:
        from rich.console import Console

        # No auto-highlighting: output is styled explicitly, numbers in log text stay as written.
        con = Console(stderr=stderr, highlight=False)
        if not con.is_terminal:
            # Pipes and files (scripts, tests, `| grep`) get whole values, never "…"-truncated cells, unless
            # COLUMNS says how wide (`COLUMNS=120 rlctl logs RUN | less`).
            columns = os.environ.get("COLUMNS", "")
            width = int(columns) if columns.isdigit() and int(columns) > 0 else max(con.width, 240)
            con = Console(stderr=stderr, highlight=False, width=width)
        _consoles[stderr] = con
    return _consoles[stderr]


def print_json(obj: Any) -> None:
    """Write obj as plain JSON (no rich markup or colour) to stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def format_duration(seconds: float | None) -> str:
    """Compact duration: "12.3s", "4m05s", "2h03m"; "-" if unknown."""
    s = real_number(seconds)
    if s is None or math.isnan(s):
        return "-"
    if math.isinf(s):
        return "inf"
    s = max(0.0, s)
    if round(s, 1) < 60:
        return f"{s:.1f}s"
    total = int(round(s))
    if total < 3600:
        minutes, secs = divmod(total, 60)
        return f"{minutes}m{secs:02d}s"
    hours, rest = divmod(total, 3600)
    return f"{hours}h{rest // 60:02d}m"


def format_eta(seconds: float) -> str:
    """Seconds to go, to the second at most ("57s", "4m05s", "2h03m"): an estimate has no tenths."""
    return f"{max(0, round(seconds))}s" if round(seconds) < 60 else format_duration(seconds)


def format_rate(x: float | None) -> str:
    """Compact number with SI suffix: "12.3", "12.3k", "1.2M"; "-" for None."""
    value = real_number(x)
    if value is None:
        return "-" if x is None else str(x)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    for suffix in ("", "k", "M", "G", "T"):
        if round(abs(value), 1) < 1000 or suffix == "T":
            return f"{value:.1f}{suffix}"
        value /= 1000
    return f"{value:.1f}T"  # pragma: no cover - loop always returns


def _format_count(x: Any) -> str:
    """Whole-number count ("123456"), "-" if missing."""
    value = real_number(x)
    return "-" if value is None or not math.isfinite(value) else str(int(value))


def format_float(x: Any, digits: int = 1) -> str:
    """Fixed-point number, "-" if missing."""
    value = real_number(x)
    return "-" if value is None else f"{value:.{digits}f}"


def metrics_of(state: dict) -> dict:
    """The state's metrics dict (empty if missing or malformed)."""
    metrics = state.get("metrics") if isinstance(state, dict) else None
    return metrics if isinstance(metrics, dict) else {}


def _styled(status: str) -> "Text":
    """Status word coloured by STATUS_STYLES."""
    from rich.text import Text

    return Text(status, style=STATUS_STYLES.get(status, ""))


def _local_time(ts: Any) -> str:
    """Local "YYYY-mm-dd HH:MM:SS" of an epoch time, "-" if missing."""
    value = real_number(ts)
    if value is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    except (OverflowError, OSError, ValueError):
        return "-"


def _plain_cell(cell: Any) -> Any:
    """A table cell as a JSON value: rich Text -> its plain string, numbers/str/None unchanged."""
    if cell is None or isinstance(cell, (str, int, float, bool)):
        return cell
    plain = getattr(cell, "plain", None)
    return plain if isinstance(plain, str) else str(cell)


FREE_TEXT_COLUMNS = ("note",)


def _plain_text(cell: Any) -> str:
    plain = _plain_cell(cell)
    return "-" if plain is None else str(plain)


def build_table(title: str | None, columns: list[str], rows: list[list], width: int | None = None,
                drop: list[str] = ()) -> "TextTable":
    """A table of rows; numeric columns are right-aligned; cells never wrap (a free-text value too long for its
    column ends in an ellipsis). With `width`, the columns named in `drop` give way, in that order, until it fits."""
    from rlctl.views.text_table import TextTable, text_cell

    cells = [[text_cell(row[i] if i < len(row) else None) for i in range(len(columns))] for row in rows]
    right = []
    for i in range(len(columns)):
        values = [row[i] for row in rows if i < len(row) and row[i] is not None]
        right.append(bool(values) and all(real_number(v) is not None for v in values))
    keep = list(range(len(columns)))
    table = None
    for name in [None, *drop]:
        if name is not None and name in columns and columns.index(name) in keep:
            keep.remove(columns.index(name))
        table = TextTable(title, [columns[i] for i in keep], [[row[i] for i in keep] for row in cells],
                          [right[i] for i in keep], [columns[i] in FREE_TEXT_COLUMNS for i in keep])
        if width is None or table.least_width() <= width:
            break
    return table


def _job_from_run_id(run_id: str) -> str:
    """Job name part of a run id ("apex-cartpole-20261129-220111" -> "apex-cartpole")."""
    return run_reading.job_of_run_id(run_id)


def _run_row(rundir: RunDir) -> list:
    """One row of the runs table."""
    state = rundir.read_state() or {}
    metrics = metrics_of(state)
    hosts = state.get("hosts")
    return [
        rundir.run_id,
        state.get("job") or _job_from_run_id(rundir.run_id),
        state.get("algorithm") or "-",
        _styled(rundir.effective_status(state) if state else RunStatus.UNKNOWN),
        _local_time(run_reading.first_started(state)),
        format_duration(elapsed_s(state)),
        format_count(metrics.get(M.ENV_STEPS)),
        format_float(metrics.get(M.EPISODE_RETURN_MEAN)),
        ", ".join(map(str, hosts)) if isinstance(hosts, list) and hosts else "-",
    ]


def runs_json(runs: list[RunDir]) -> list[dict]:
    """`rlctl status --json` without a run: one object per run, newest first, raw numbers under snake_case keys
    (null where a figure is unknown; rlctl.views.run_json.run_summary)."""
    from rlctl.views.run_json import run_summary

    return [run_summary(rundir) for rundir in reversed(runs)]


def runs_table_rows(runs: list[RunDir]) -> tuple[list[str], list[list]]:
    """Columns and rows for `rlctl status` without a run: one row per run."""
    return list(RUNS_COLUMNS), [_run_row(r) for r in runs]


def _process_row(proc: dict, now: float) -> list:
    """One row of the processes table."""
    rate = real_number(proc.get("rate"))
    unit = proc.get("rate_unit") or ""
    heartbeat = real_number(proc.get("last_heartbeat"))
    return [
        proc.get("name") or "-",
        proc.get("role") or "-",
        proc.get("rank"),
        proc.get("host") or "-",
        proc.get("pid"),
        _styled(str(proc.get("state") or RunStatus.UNKNOWN)),
        proc.get("restarts"),
        f"{format_rate(rate)} {unit}".strip() if rate is not None else "-",
        f"{format_duration(now - heartbeat)} ago" if heartbeat is not None else "-",
        str(proc.get("note") or ""),  # why it was last restarted or killed (a hang)
    ]


def _role_row(s: RoleSummary, now: float) -> list:
    """The row of a folded role: counts by state, its ranks and hosts, the sum of its rates (their minimum and median
    in the note, which gives way first), the oldest heartbeat."""
    from rich.text import Text

    figures = s.rate_figures()
    rate = "-" if figures is None else f"{format_rate(figures[0])} {s.rate_unit}".strip()
    spread = "" if figures is None else f"rates: min {format_rate(figures[1])}, median {format_rate(figures[2])}"
    ranks = f"{s.ranks[0]}-{s.ranks[-1]}" if s.ranks else None
    return [
        f"{s.role} x{s.count}",
        s.role,
        ranks,
        s.hosts[0] if len(s.hosts) == 1 else f"{len(s.hosts)} hosts",
        None,
        Text(", ".join(f"{n} {state}" for state, n in s.states),
             style=STATUS_STYLES.get(RunStatus.RUNNING, "") if s.all_running else "yellow"),
        s.restarts,
        rate,
        f"oldest {format_duration(now - s.oldest_heartbeat)} ago" if s.oldest_heartbeat is not None else "-",
        spread,
    ]


def processes_table_rows(state: dict, now: float | None = None, every: bool = False) -> tuple[list[str], list[list]]:
    """Columns and rows for the processes of one run (robust to missing fields): a role of many processes as one row
    and its processes that are not running (views/role_fold.py), or with `every` one row per process."""
    now = time.time() if now is None else now
    procs = _processes(state)
    items = procs if every else fold_roles(procs)
    return list(PROCESS_COLUMNS), [_role_row(i, now) if isinstance(i, RoleSummary) else _process_row(i, now)
                                   for i in items]


def _processes(state: dict) -> list[dict]:
    procs = state.get("processes") if isinstance(state, dict) else None
    return [p for p in procs if isinstance(p, dict)] if isinstance(procs, list) else []


def processes_table(state: dict, width: int | None, now: float | None = None, every: bool = False) -> "TextTable":
    """The processes table, fitted to `width`: the note column only when a process has a note; then pid, host (when
    every process is local), heartbeat age, rank and role give way, in that order, until it fits. A role of many
    processes is one row unless `every`."""
    columns, rows = processes_table_rows(state, now, every)
    procs = _processes(state)
    drop = ["pid", *(["host"] if not any(p.get("remote") for p in procs) else []), "heartbeat", "rank", "role"]
    if not any(row[-1] for row in rows):
        columns, rows = columns[:-1], [r[:-1] for r in rows]
    return build_table(None, columns, rows, width, drop)


def runs_table(runs: list[RunDir], width: int | None) -> "TextTable":
    """The runs table of `rlctl status`, fitted to `width` (hosts when every run is local, then start time,
    algorithm and job give way)."""
    columns, rows = runs_table_rows(runs)
    local = all(r[-1] in ("localhost", "-") for r in rows)
    return build_table("runs", columns, rows, width, [*(["hosts"] if local else []), "started", "algorithm", "job"])


HOST_COLUMNS = ["host", "where", "state", "processes", "restarts", "sessions lost"]


def hosts_table_rows(state: dict) -> tuple[list[str], list[list]] | None:
    """One row per host of a job that has remote hosts (None for a job all on this machine)."""
    from rich.text import Text

    rows = state.get("host_rows") or []
    if not any(r.get("remote") for r in rows):
        return None
    out = []
    for r in rows:
        st = str(r.get("state", "-"))
        style = "bold red" if st == RunStatus.LOST else ("green" if st == "ok" else "yellow")
        where = r.get("via") if r.get("via") in ("local", "ssh", "slurm") else "ssh" if r.get("remote") else "local"
        out.append([r.get("name"), where, Text(st, style=style),
                    f"{r.get('running', 0)}/{r.get('processes', 0)}", r.get("restarts", 0), r.get("lost_sessions", 0),
                    str(r.get("note") or "")])
    if not any(r.get("note") for r in rows):  # a host lost and re-placed, or back: said in its note
        return HOST_COLUMNS, [r[:-1] for r in out]
    return [*HOST_COLUMNS, "note"], out


def header_lines(state: dict, now: float | None = None, width: int | None = None) -> list[str]:
    """The run's summary, one line per concern: what and where it is, its figures (env steps and their rate, returns,
    the ETA), then (where they apply) rollout lag, central inference and divergence. With `width`, a line that does
    not fit first drops the sparkline, then breaks between its " | " parts: no figure is cut."""
    state = state if isinstance(state, dict) else {}
    metrics = metrics_of(state)
    # The run id begins with the job's name: the first line stays short enough for 80 columns.
    run_id = str(state.get("run_id") or state.get("job") or "-")
    lines = fit_parts([f"{run_id} ({state.get('algorithm') or '-'})", status_of(state),
                       format_duration(elapsed_s(state, now))], width)
    figures = [_steps_text(state, now), f"return {format_float(metrics.get(M.EPISODE_RETURN_MEAN))}",
               f"eval {format_float(metrics.get(M.EVAL_RETURN_MEAN))}"]
    eta = _eta_text(state, now)
    if eta:
        figures.append(eta)
    lag = _rollout_figures(metrics)
    if lag:
        figures += [f"policy lag {lag[0]}", f"rollouts dropped {lag[1]}"]
    sparked = [figures[0], figures[1] + _spark(state), *figures[2:]]
    lines += fit_parts(sparked if width is None or len(" | ".join(sparked)) <= width else figures, width)
    inference = _inference_figures(metrics)
    if inference:
        lines.append(f"inference {inference[0]} req/s, batch {inference[1]}, p50 {inference[2]} p99 {inference[3]} ms")
    verdict = bottleneck.verdict(metrics) if status_of(state) == RunStatus.RUNNING else None
    concerns = (verdict, divergence_text(metrics), world_text(state), head_moves_text(state),
                checkpoints_home_text(state))
    return lines + [line for line in concerns if line]


def head_moves_text(state: dict) -> str | None:
    """Where an elastic run's learner head went as its hosts were lost, or None while it never moved:
    "learner head h1 -> h2 (h1 lost 10:02:03) -> h1 (h2 lost 10:09:41)"."""
    moves = [m for m in state.get("head_moves") or [] if isinstance(m, dict)]
    if not moves:
        return None
    return "learner head " + " -> ".join([str(moves[0].get("lost"))] + [
        f"{m.get('head')} ({m.get('lost')} lost {_local_time(m.get('at'))[-8:]})" for m in moves])


def checkpoints_home_text(state: dict) -> str | None:
    """When the checkpoints of SSH hosts last came home, and hosts whose last try failed: "checkpoints home 10:02:03
    from h1 (latest.pt) | not from h2: ssh: connect ... timed out"; None for a run that has none there."""
    record = state.get("checkpoints_home")
    if not isinstance(record, dict):
        return None
    parts = []
    if isinstance(record.get("at"), (int, float)):
        files = record.get("files") if isinstance(record.get("files"), list) else []
        parts.append(f"checkpoints home {_local_time(record['at'])[-8:]} from {record.get('host')}"
                     + (f" ({', '.join(map(str, files))})" if files else ""))
    errors = record.get("errors") if isinstance(record.get("errors"), dict) else {}
    parts += [f"checkpoints not from {host}: {str(why).splitlines()[0][:80] if why else '?'}"
              for host, why in sorted(errors.items())]
    return " | ".join(parts) or None


def world_text(state: dict) -> str | None:
    """How the learner group's size changed (an elastic world that lost and took back nodes), or None while it
    never did: "learner world 2 -> 1 (10:02:03) -> 2 (10:03:10)"."""
    worlds = [w for w in state.get("learner_worlds") or [] if isinstance(w, list) and len(w) == 2]
    if len(worlds) < 2:
        return None
    return "learner world " + " -> ".join([str(worlds[0][1])]
                                          + [f"{w} ({_local_time(t)[-8:]})" for t, w in worlds[1:]])


def fit_parts(parts: list[str], width: int | None, sep: str = " | ") -> list[str]:
    """Parts joined by sep into lines of at most `width` characters, broken only between parts (one line without a
    width; a part longer than the width alone on its line)."""
    lines: list[str] = []
    for part in parts:
        if lines and (width is None or len(lines[-1]) + len(sep) + len(part) <= width):
            lines[-1] += sep + part
        else:
            lines.append(part)
    return lines


def format_count(x: Any) -> str:
    """A count as a whole number with thousands separators ("169,199", "0"); "-" if missing."""
    value = real_number(x)
    return "-" if value is None or not math.isfinite(value) else f"{int(value):,}"


def _steps_text(state: dict, now: float | None) -> str:
    """"env steps 169,199 (2.0k/s)": the rate over the last seconds while the run goes, the run's average once it
    is over."""
    metrics = metrics_of(state)
    steps = real_number(metrics.get(M.ENV_STEPS))
    text = f"env steps {format_count(steps if steps is not None else 0)}"
    if status_of(state) in OVER_STATES:
        elapsed = elapsed_s(state, now)
        return text + (f" (avg {format_rate(steps / elapsed)}/s)" if steps and elapsed else "")
    rate = _steps_rate(state)
    return text + (f" ({format_rate(rate)}/s)" if rate is not None else "")


def _steps_rate(state: dict) -> float | None:
    """Env steps per second over the last seconds of the progress history (a collector that reports late never
    reads as 0.0/s), else as the collectors last reported it."""
    from rlctl.supervise.stop_progress import window_rate

    rate = window_rate(state.get("progress_history"))
    return real_number(metrics_of(state).get(M.ENV_STEPS_PER_S)) if rate is None else rate


def stop_rows(state: dict, now: float | None = None) -> list:
    """The run's stop criteria (rlctl.supervise.stop_progress.StopProgress), with ETAs only while it runs."""
    from rlctl.supervise.stop_progress import stop_progress

    return stop_progress(state.get("stop"), metrics_of(state), elapsed_s(state, now), state.get("episodes_seen"),
                         state.get("progress_history"), over=status_of(state) != RunStatus.RUNNING)


def _eta_text(state: dict, now: float | None) -> str | None:
    """"ETA 1m05s (env steps)": when the run should end, from the criterion expected first ("≤" when another,
    with no estimate, may come sooner; "—" when none has one). None for a run that is not running or has no
    criteria."""
    from rlctl.supervise.stop_progress import run_eta

    if status_of(state) != RunStatus.RUNNING:
        return None
    rows = stop_rows(state, now)
    if not rows:
        return None
    eta = run_eta(rows)
    if eta is None:
        return "ETA —"
    seconds, label, bound = eta
    return f"ETA {'≤' if bound else ''}{format_eta(seconds)} ({label})"


def _spark(state: dict) -> str:
    """" ▁▃▅▇" of the recent mean training returns (state.json's return_history), or ""."""
    from rlctl.views.curves import sparkline

    history = state.get("return_history")
    line = sparkline(history if isinstance(history, list) else [])
    return f" {line}" if len(line) > 1 else ""


def _eta_cell(p, running: bool) -> str:
    """A criterion's ETA: "8m35s left" of a wall-time limit, "ETA 1m05s", "ETA —" where nothing can be estimated;
    nothing once it is met or the run is not running."""
    if not running or p.met:
        return ""
    if p.eta_s is None:
        return "ETA —"
    return f"{format_eta(p.eta_s)} left" if p.exact else f"ETA {format_eta(p.eta_s)}"


def progress_lines(state: dict, width: int, now: float | None = None) -> list["Text"]:
    """One line per stop criterion: a bar of where its value stands against its target, the percentage, the value
    and target, what else counts (rounds in a row, the episodes averaged, "limit") and the ETA. Fitted to `width`:
    the bar shrinks (to 10 columns), then the note ends in "…", then the bar goes; numbers are never cut."""
    from rich.text import Text

    from rlctl.supervise.stop_progress import percent

    rows = stop_rows(state, now)
    if not rows:
        return []
    running = status_of(state) == RunStatus.RUNNING
    cells = [(p.label, f"{percent(p.fraction)}%" if p.fraction is not None else "", p.text(), _eta_cell(p, running),
              p.note) for p in rows]
    w = [max(len(c[i]) for c in cells) for i in range(5)]
    fixed = w[0] + 1 + w[1] + 1 + w[2] + (1 + w[3] if w[3] else 0)
    note_w = w[4]
    bar = min(30, width - fixed - (1 + note_w if note_w else 0) - 1)
    if bar < 10:
        bar = 10
        note_w = max(0, width - fixed - 1 - bar - 1)
        if note_w < 4:
            note_w = 0
            bar = width - fixed - 1
            bar = bar if bar >= 4 else 0
    out = []
    for p, (label, pct, words, eta, note) in zip(rows, cells):
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"{label:<{w[0]}} ")
        if bar:
            line.append_text(_bar(p.fraction, bar))
            line.append(" ")
        line.append(f"{pct:>{w[1]}} {words:<{w[2]}}")
        if note_w:
            cut = note if len(note) <= note_w else note[:note_w - 1] + "…"
            line.append(f" {cut:<{note_w}}", style="dim")
        if w[3]:
            line.append(f" {eta:>{w[3]}}")
        out.append(line)
    return out


def _bar(fraction: float | None, width: int) -> "Text":
    """A bar of `width` columns, the fraction of it drawn heavy ("━") and the rest light ("─"); blank without one."""
    from rich.text import Text

    if fraction is None:
        return Text(" " * width)
    done = int(round(max(0.0, min(1.0, fraction)) * width))
    if done == width and fraction < 1.0:
        done = width - 1  # full only when the criterion is met
    bar = Text("━" * done, style="green" if fraction >= 1.0 else "magenta")
    bar.append("─" * (width - done), style="dim")
    return bar


def run_view(state: dict, now: float | None = None, live: bool = True, every: bool = False) -> "RenderableType":
    """Header, stop progress and the tables of one run, laid out for the width it is rendered at (the live display
    and `rlctl status RUN`). The live display leaves out the exit reason and the failed process's last lines: the
    attached `rlctl run` prints them once, after the display ends. `every`: one row per process of a large role."""
    return _RunView(state, now, live, every)


class _RunView:
    def __init__(self, state: dict, now: float | None, live: bool, every: bool = False):
        self.state, self.now, self.live, self.every = (state if isinstance(state, dict) else {}), now, live, every

    def __rich_console__(self, console, options):
        from rich.console import Group
        from rich.panel import Panel
        from rich.text import Text

        state, width = self.state, options.max_width
        status = status_of(state)
        inner = width - 4 if self.live else width  # the panel's borders and padding
        lines: list = [Text(line) for line in header_lines(state, self.now, inner)]  # wraps between words
        lines += progress_lines(state, inner, self.now)
        header = Group(*lines)
        yield Panel(header, border_style=STATUS_STYLES.get(status, ""), expand=True) if self.live else header
        yield processes_table(state, width, self.now, self.every)
        hosts = hosts_table_rows(state)
        if hosts is not None:
            yield build_table(None, *hosts, width=width)
        if self.live:
            return
        if state.get("exit_reason"):
            yield Text(f"exit: {state['exit_reason']}", style=STATUS_STYLES.get(status, ""))
        failure = _failure_text(state)
        if failure is not None:
            yield failure


def divergence_text(metrics: dict) -> str | None:
    """"DIVERGING: ..." while the learner reports runaway or non-finite values, else None."""
    if not real_number(metrics.get(M.DIVERGING)):
        return None
    q, bound = real_number(metrics.get(M.Q_ABS_MAX)), real_number(metrics.get(M.Q_BOUND))
    if q is not None and bound is not None and math.isfinite(q):
        return f"DIVERGING: |Q| {q:.3g} against a bound of {bound:.3g} (max reward / (1 - gamma))"
    return "DIVERGING: non-finite losses or values"


def _rollout_figures(metrics: dict) -> tuple[str, str] | None:
    """(policy lag, dropped rollouts) as text for the rollout algorithms; None for the others."""
    lag = real_number(metrics.get(M.POLICY_LAG_MEAN))
    if lag is None:
        return None
    return f"{lag:.1f}", _format_count(metrics.get(M.ROLLOUTS_DROPPED, 0))


def _inference_figures(metrics: dict) -> tuple[str, str, str, str] | None:
    """(requests/s, mean batch, p50 ms, p99 ms) of the central inference servers as text; None without them."""
    rate = real_number(metrics.get(M.INFERENCE_REQUESTS_PER_S))
    if rate is None:
        return None
    batch, p50, p99 = (real_number(metrics.get(k)) or 0.0 for k in (M.INFERENCE_BATCH_SIZE_MEAN, M.INFERENCE_LATENCY_P50,
                                                              M.INFERENCE_LATENCY_P99))
    return format_rate(rate), f"{batch:.1f}", f"{p50:.2f}", f"{p99:.2f}"


def _failure_text(state: dict) -> "Text | None":
    """Red block of the failed process's last log lines (and how it ended, unless the exit reason says so), if the
    run failed."""
    from rich.text import Text

    failure = state.get("failure")
    if not isinstance(failure, dict):
        return None
    if "cause" in failure:  # a start-up failure: its cause is the exit line, its traceback in its log, not shown again
        return Text(f"{failure.get('process', '?')} cannot start; its traceback: logs/{failure.get('process')}.log\n",
                    style="bold red")
    said = f"{failure.get('process', '?')} exited with code {failure.get('exit_code', '?')}"
    # The exit line above already says which process ended how: the block adds only what it does not.
    told = str(state.get("exit_reason") or "").startswith(said) or "exit_code" not in failure  # (a supervisor fault)
    text = Text("" if told else said + "\n", style="bold red")
    tail = failure.get("log_tail")
    for line in tail if isinstance(tail, list) else []:
        text.append(f"  {line}\n", style="red")
    return text if text.plain else None


def live_renderable(state: dict) -> "RenderableType":
    """Header panel + stop progress + processes table (+ failure/exit reason) for the supervisor's rich Live display."""
    return run_view(state)


def progress_line(state: dict, now: float | None = None) -> str:
    """Plain single status line for non-TTY output, e.g. "[  12.3s] running env_steps=123456 (20.0k/s) ..."."""
    state = state if isinstance(state, dict) else {}
    metrics = metrics_of(state)
    parts = [f"[{format_duration(elapsed_s(state, now)):>7}]", status_of(state)]
    steps = real_number(metrics.get(M.ENV_STEPS))
    steps_per_s = _steps_rate(state)
    if steps is not None:
        parts.append(f"env_steps={_format_count(steps)}" + (f" ({format_rate(steps_per_s)}/s)" if steps_per_s is not None else ""))
    elif steps_per_s is not None:
        parts.append(f"env_steps/s={format_rate(steps_per_s)}")
    for label, key in (("return", M.EPISODE_RETURN_MEAN), ("eval", M.EVAL_RETURN_MEAN)):
        if real_number(metrics.get(key)) is not None:
            parts.append(f"{label}={format_float(metrics[key])}")
    updates = real_number(metrics.get(M.UPDATES_PER_S))
    if updates is not None:
        parts.append(f"updates/s={updates:.0f}" if abs(updates) < 1000 else f"updates/s={format_rate(updates)}")
    samples = real_number(metrics.get(M.SAMPLES_PER_S))
    if samples is not None:
        parts.append(f"samples/s={format_rate(samples)}")
    lag = _rollout_figures(metrics)
    if lag:
        parts += [f"lag={lag[0]}", f"dropped={lag[1]}"]
    inference = _inference_figures(metrics)
    if inference:
        parts += [f"inference={inference[0]}/s", f"batch={inference[1]}", f"p99={inference[3]}ms"]
    diverging = divergence_text(metrics)
    if diverging:
        parts.append(diverging)
    return " ".join(parts)


def progress_printer(interval_s: float = 5.0):
    """A display callback for non-TTY output: a progress line every interval_s and at the end."""
    last = [0.0]

    def show(state: dict) -> None:
        now = time.time()
        if now - last[0] >= interval_s or state.get("status") in OVER_STATES:
            last[0] = now
            print(progress_line(state), flush=True)

    return show
