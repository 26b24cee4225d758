"""The `rlctl` command line: each command a thin function over the library.

Imports here stay light (typer + the standard library): `--help`, `status`,
`watch`, `logs`, `stop`, `rm` and `prune` never import torch, numpy or pydantic.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from rlctl import __version__
from rlctl.algos import ALGORITHMS

app = typer.Typer(
    name="rlctl",
    help="Run distributed reinforcement-learning jobs from declarative TOML job files.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _complete_run(incomplete: str) -> list[str]:
    from rlctl.rundir import list_runs, runs_root
    from rlctl.sweep_dir import list_sweeps

    ids = [r.run_id for r in list_runs(runs_root())] + [s.sweep_id for s in list_sweeps(runs_root())]
    return [i for i in ids if i.startswith(incomplete)]


SbatchNodesOpt = typer.Option(None, "--nodes", min=1, help="With --sbatch: nodes to ask for [default: "
                              "cluster.node_count, else the learner nodes and one more].")
PartitionOpt = typer.Option(None, "--partition", help="With --sbatch: the Slurm partition.")
TimeOpt = typer.Option(None, "--time", help="With --sbatch: the time limit (Slurm's format, e.g. 2:00:00).")
AccountOpt = typer.Option(None, "--account", help="With --sbatch: the Slurm account.")
RunsDirOpt = typer.Option(None, "--runs-dir", help="Parent folder of run directories [env: RLCTL_RUNS_DIR; default ./runs].")
RunArg = typer.Argument(None, help="Run id or unique prefix; default the newest run.", autocompletion=_complete_run)
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a table.")


def _bad_input(message: str) -> "typer.Exit":
    from rlctl.views.console import get_console

    get_console(stderr=True).print(message, markup=False, soft_wrap=True)  # a long line stays one line
    return typer.Exit(EXIT_BAD_INPUT)


def _load(path: Path):
    from rlctl.job.load import JobFileError, load_job

    try:
        return load_job(path)
    except JobFileError as exc:
        raise _bad_input(exc.render()) from None


def _resolve(runs_dir: Optional[Path], run: Optional[str]):
    from rlctl.rundir import RunNotFound, resolve_run, runs_root

    try:
        return resolve_run(runs_root(runs_dir), run)
    except RunNotFound as exc:
        raise _bad_input(str(exc)) from None


def _sweep_named(runs_dir: Optional[Path], name: Optional[str]):
    """The sweep a RUN argument names (id, unique prefix or path), or None when it names none."""
    from rlctl.rundir import RunNotFound, runs_root
    from rlctl.sweep_dir import find_sweep

    try:
        return find_sweep(runs_root(runs_dir), name)
    except RunNotFound as exc:
        raise _bad_input(str(exc)) from None


def _version(value: bool) -> None:
    if value:
        print(f"rlctl {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version.")) -> None:
    """Run distributed reinforcement-learning jobs from declarative TOML job files."""


@app.command()
def init(algo: Optional[str] = typer.Option(None, "--algo", help=f"Algorithm ({', '.join(ALGORITHMS)}); "
                                           "default the first of them."),
         env: str = typer.Option("CartPole-v1", "--env", help="gymnasium id or `module:attr` entry point."),
         hosts: Optional[str] = typer.Option(None, "--hosts", help="Comma-separated SSH destinations: the first runs "
                                             "the learner, its replay shard and the evaluator, the others collectors.")
         ) -> None:
    """Print a commented job file with every key at its default, valid as written: rlctl init > job.toml."""
    import tomllib

    from rlctl.job.jobinit import render_job_file
    from rlctl.job.load import JobFileError, validate_job

    destinations = [h.strip() for h in hosts.split(",")] if hosts is not None else None
    if destinations is not None and not all(destinations):
        raise _bad_input(f"--hosts {hosts!r}: an empty host name")
    try:
        text = render_job_file(algo, env, destinations)
    except ValueError as exc:
        raise _bad_input(f"--algo: {exc}") from None
    try:  # what is printed validates: a bad --env or host is reported here, by the job file's own rules
        validate_job(tomllib.loads(text), "<rlctl init>")
    except JobFileError as exc:
        raise _bad_input(exc.render()) from None
    sys.stdout.write(text)


@app.command()
def validate(files: List[Path] = typer.Argument(..., help="Job files to check (`-`: read one from stdin).")) -> None:
    """Check job files against the schema and load the env and wrapper entry points they name; exit 2 naming the
    file, key path and reason on error."""
    from rlctl.job.load import JobFileError, check_entry_points, load_job, source_name
    from rlctl.job.sweep_spec import SweepFileError, is_sweep_file, load_sweep

    bad = 0
    for f in files:
        if str(f) != "-" and is_sweep_file(f):  # a sweep: every trial's job checked
            try:
                found = load_sweep(f)
            except SweepFileError as exc:
                bad += 1
                print(exc.render(), file=sys.stderr)
                continue
            print(f"{f}: OK (sweep of {len(found.trials)} trials of {found.base.name})")
            continue
        try:
            spec = check_entry_points(load_job(f), f)
        except JobFileError as exc:
            bad += 1
            print(exc.render(), file=sys.stderr)
            continue
        print(f"{source_name(f)}: OK ({spec.algorithm.name}, {spec.env.id})")
    if bad:
        raise typer.Exit(EXIT_BAD_INPUT)


@app.command()
def plan(job_file: Path = typer.Argument(..., help="Job file."), as_json: bool = JsonOpt,
         sbatch: bool = typer.Option(False, "--sbatch", help="Print the batch script `rlctl run --sbatch` would "
                                     "submit (cluster.scheduler = \"slurm\"); submit nothing."),
         nodes: Optional[int] = SbatchNodesOpt, partition: Optional[str] = PartitionOpt,
         time_limit: Optional[str] = TimeOpt, account: Optional[str] = AccountOpt,
         runs_dir: Optional[Path] = RunsDirOpt,
         verbose: bool = typer.Option(False, "--verbose", "-v", help="Also every process's full command and the "
                                      "environment they share.")) -> None:
    """Render the launch plan (every process, host, port, what it runs); start nothing."""
    from rlctl.views.console import get_console, print_json
    from rlctl.job.sweep_spec import is_sweep_file

    if is_sweep_file(job_file):
        _print_sweep_plan(_load_sweep(job_file), as_json)
        return
    spec = _load(job_file)
    with _launch_errors():
        if sbatch:
            from rlctl.launch.sbatch import script_to_show

            options = {"partition": partition, "time": time_limit, "account": account}
            sys.stdout.write(script_to_show(spec, runs_dir, nodes, options))
            return
        from rlctl.launch.pipeline import plan_to_show

        spec, p = plan_to_show(spec, runs_dir)
    if as_json:
        print_json(p.to_dict())
        return
    from rlctl.views.plan_view import plan_view, verbose_lines

    con = get_console()
    con.print(plan_view(p, spec, verbose))
    for line in verbose_lines(p) if verbose else []:
        con.print(line, markup=False, soft_wrap=True)  # whole, however long: the terminal wraps it


@app.command()
def run(job_file: Optional[Path] = typer.Argument(
            None, help="Job file; with --resume, the run to continue (id or prefix; default the newest)."),
        detach: bool = typer.Option(False, "--detach", "-d", help="Run in the background; print the run id."),
        resume: bool = typer.Option(False, "--resume", help="Continue a stopped, failed, lost or finished run in its "
                                    "own directory: learner, replay contents and counters go on where they were."),
        job: Optional[Path] = typer.Option(None, "--job", help="With --resume: continue with this job file (only its "
                                           "stop criteria, topology counts and hosts may differ)."),
        until: List[str] = typer.Option([], "--until", help="With --resume: new stop criteria replacing the old "
                                        "ones, e.g. --until env_steps=500000 (repeatable)."),
        sbatch: bool = typer.Option(False, "--sbatch", help="Submit the job to Slurm as a batch job "
                                    "(cluster.scheduler = \"slurm\") and print its run id; see `rlctl plan --sbatch`."),
        nodes: Optional[int] = SbatchNodesOpt, partition: Optional[str] = PartitionOpt,
        time_limit: Optional[str] = TimeOpt, account: Optional[str] = AccountOpt,
        slurm_run_dir: Optional[Path] = typer.Option(None, "--slurm-run-dir", hidden=True,
                                                     help="The run directory --sbatch made (its batch script)."),
        runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Start a job: render its plan, start and supervise every process, until it finishes or is stopped."""
    from rlctl.launch import pipeline as launch

    os.umask(0o077)  # a run's folders 0700 and files 0600: logs, job, plan, state, checkpoints
    if resume and job_file is not None and _sweep_named(runs_dir, str(job_file)) is not None:
        with _launch_errors():
            from rlctl.launch.sweep import sweep_to_resume

            found = sweep_to_resume(runs_dir, str(job_file))
        raise typer.Exit(_run_sweep(found, detach))
    with _launch_errors():
        given = launch.launch_input(job_file, runs_dir, resume, job, until, slurm_run_dir)
        if sbatch:
            raise typer.Exit(_submit(given.spec, runs_dir, nodes, {"partition": partition, "time": time_limit,
                                                                   "account": account}))
        rundir = launch.prepare(given, runs_dir, detach)
    if detach:
        launch.start_detached(rundir)
        print(rundir.run_id)
        print(f"  rlctl watch {rundir.run_id}\n  rlctl logs --follow {rundir.run_id}\n  rlctl stop {rundir.run_id}",
              file=sys.stderr)
        return
    try:
        code = _run_attached(rundir)
    except KeyboardInterrupt:  # Ctrl-C before the supervisor took it over: nothing had been started
        launch.abandon_unstarted(rundir, "stopped by SIGINT before anything started")
        print(f"rlctl: interrupted; {rundir.run_id} stopped before anything started", file=sys.stderr)
        raise typer.Exit(130)
    raise typer.Exit(code)


@contextlib.contextmanager
def _launch_errors():
    """The launch library's refusals as exit codes: bad input 2 (the message as the library words it), remote
    hosts that failed the check 1."""
    from rlctl.launch.pipeline import LaunchRefused, PreflightFailed
    from rlctl.launch.resume import ResumeRefused, RunAlreadyOver
    from rlctl.rundir import RunNotFound, RunsDirUnusable
    from rlctl.job.load import JobFileError

    try:
        yield
    except RunAlreadyOver as exc:
        print(f"rlctl: {exc}", file=sys.stderr)
        raise typer.Exit(0) from None
    except JobFileError as exc:
        raise _bad_input(exc.render()) from None
    except ResumeRefused as exc:
        raise _bad_input(f"rlctl run --resume: {exc}") from None
    except (LaunchRefused, RunNotFound, RunsDirUnusable) as exc:
        raise _bad_input(str(exc)) from None
    except PreflightFailed as exc:
        print(exc, file=sys.stderr)
        raise typer.Exit(EXIT_FAILED) from None


def _submit(spec, runs_dir: Optional[Path], nodes: Optional[int], options: dict) -> int:
    """`rlctl run --sbatch`: submit, print the run id; the exit code."""
    from rlctl.launch.sbatch import submit_run
    from rlctl.launch.slurm import SlurmError

    try:
        rundir, job_id = submit_run(spec, runs_dir, nodes, options)
    except SlurmError as exc:
        print(f"rlctl: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(rundir.run_id)
    print(f"  Slurm job {job_id}\n  rlctl status {rundir.run_id}\n  rlctl logs --follow {rundir.run_id}\n"
          f"  rlctl stop {rundir.run_id}", file=sys.stderr)
    return 0


def _run_attached(rundir) -> int:
    """Supervise in this process: a live table on a terminal, else a progress line every few seconds."""
    from rlctl.views.console import get_console, live_renderable, progress_printer
    from rlctl.launch.pipeline import supervise

    con = get_console()
    if con.is_terminal:
        from rich.live import Live

        with Live(console=con, refresh_per_second=4, transient=False) as live:
            code = supervise(rundir, display=lambda st: live.update(live_renderable(st)))
    else:
        code = supervise(rundir, display=progress_printer())
    state = rundir.read_state() or {}
    con.print(f"run {rundir.run_id} {state.get('status')}: {state.get('exit_reason')}", markup=False, soft_wrap=True)
    failure = state.get("failure")
    if failure and "cause" not in failure:  # a start-up failure's cause is the line above; its traceback is in the log
        con.print(f"--- last lines of {failure.get('process')} ---", markup=False)
        for line in failure.get("log_tail", []):
            con.print(line, markup=False)
    from rlctl.run_reading import as_read
    from rlctl.views.next_steps import next_steps_text

    con.print(next_steps_text(rundir, as_read(state)["status"]), markup=False)
    return code


@app.command()
def sweep(target: str = typer.Argument(..., help="Sweep file; with --resume, the sweep to continue (id or prefix)."),
          detach: bool = typer.Option(False, "--detach", "-d", help="Schedule in the background; print the sweep id."),
          plan_only: bool = typer.Option(False, "--plan", help="List the trials (as `rlctl plan`); start nothing."),
          resume: bool = typer.Option(False, "--resume", help="Continue a stopped or lost sweep: unfinished trials "
                                      "from their checkpoints, then the trials not begun."),
          runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Run every trial of a sweep file (a base job, parameters by key path, seeds), at most max_concurrent at once,
    each an ordinary run under the sweep's directory."""
    from rlctl.launch import sweep as sweeps

    os.umask(0o077)
    with _launch_errors():
        if resume:
            found = sweeps.sweep_to_resume(runs_dir, target)
        else:
            spec = _load_sweep(Path(target))
            if plan_only:
                _print_sweep_plan(spec, False)
                return
            found = sweeps.create_sweep(spec, runs_dir)
    raise typer.Exit(_run_sweep(found, detach))


def _load_sweep(path: Path):
    from rlctl.job.sweep_spec import SweepFileError, load_sweep

    try:
        return load_sweep(path)
    except SweepFileError as exc:
        raise _bad_input(exc.render()) from None


def _print_sweep_plan(spec, as_json: bool) -> None:
    """`rlctl plan SWEEP.toml`: the trials, each with its values and seed."""
    from rlctl.views.console import build_table, get_console, print_json
    from rlctl.views.sweep_view import plan_rows

    trials = [{"id": t.id, "values": t.values, "seed": t.seed, "host": t.host} for t in spec.trials]
    if as_json:
        print_json({"name": spec.name, "base": str(spec.base), "max_concurrent": spec.max_concurrent,
                    "place": spec.place, "trials_per_host": spec.trials_per_host, "trials": trials})
        return
    con = get_console()
    where = f", each on one host, {spec.trials_per_host} per host at most" if spec.place == "hosts" else ""
    con.print(f"sweep {spec.name}: {len(trials)} trials of {spec.base}, {spec.max_concurrent} at once{where}",
              markup=False)
    con.print(build_table(None, *plan_rows(trials, [p.key for p in spec.params])))


def _run_sweep(found, detach: bool) -> int:
    """Schedule a sweep here (its table live on a terminal) or in the background; the exit code."""
    from rlctl.launch.sweep import start_detached

    if detach:
        start_detached(found)
        print(found.sweep_id)
        print(f"  rlctl status {found.sweep_id}\n  rlctl compare {found.sweep_id}\n  rlctl stop {found.sweep_id}",
              file=sys.stderr)
        return 0
    from rlctl.supervise.sweep_scheduler import schedule_sweep
    from rlctl.views.console import get_console
    from rlctl.views.sweep_view import sweep_printer, sweep_view

    con = get_console()
    if con.is_terminal:
        from rich.console import Group
        from rich.live import Live

        with Live(console=con, refresh_per_second=2, transient=False) as live:
            code = schedule_sweep(found.path, display=lambda sw, _: live.update(Group(*sweep_view(sw, con.width))))
    else:
        code = schedule_sweep(found.path, display=sweep_printer())
        for part in sweep_view(found, con.width):
            con.print(part, markup=False, soft_wrap=True)
    return code


@app.command()
def status(run: Optional[str] = RunArg, as_json: bool = JsonOpt, runs_dir: Optional[Path] = RunsDirOpt,
           every: bool = typer.Option(False, "--all", help="One row per process, where a role of many processes is "
                                                          "otherwise one row (its counts by state, rates as sum, min "
                                                          "and median) and those of them not running.")) -> None:
    """All runs, or one run's processes and what to do next with it."""
    from rlctl.views.console import get_console, print_json, run_view, runs_json, runs_table
    from rlctl.rundir import list_runs, runs_root

    con = get_console()
    if every and run is None:
        raise _bad_input("rlctl status: --all lists one run's processes: name the run (rlctl status RUN --all)")
    if run is None:
        runs = list_runs(runs_root(runs_dir))
        if as_json:
            print_json(runs_json(runs))
            return
        con.print(runs_table(runs, con.width))
        _print_sweeps(con, runs_dir)
        return
    found = _sweep_named(runs_dir, run)
    if found is not None:
        from rlctl.views.sweep_view import sweep_json, sweep_view

        if as_json:
            print_json(sweep_json(found))
            return
        for part in sweep_view(found, con.width):
            con.print(part, markup=False, soft_wrap=True)
        return
    rd = _resolve(runs_dir, run)
    if as_json:
        from rlctl.views.run_json import run_json

        print_json(run_json(rd))
        return
    from rlctl.run_reading import as_read
    from rlctl.views.next_steps import next_steps_text

    state = as_read(rd.read_state())
    con.print(run_view(state, live=False, every=every))
    con.print(next_steps_text(rd, state["status"]), markup=False)


def _print_sweeps(con, runs_dir: Optional[Path]) -> None:
    """Under `rlctl status`'s runs table: a line per sweep (its trials are runs inside its folder)."""
    from rlctl.rundir import runs_root
    from rlctl.sweep_dir import list_sweeps
    from rlctl.views.sweep_view import sweep_header

    sweeps = list_sweeps(runs_root(runs_dir))
    if sweeps:
        con.print("\nsweeps (rlctl status SWEEP for its trials)", markup=False)
    for found in sweeps:
        con.print(sweep_header(found), markup=False, soft_wrap=True)


@app.command()
def watch(run: Optional[str] = RunArg,
          interval: float = typer.Option(1.0, "--interval", min=0.1, help="Seconds between looks at the run."),
          runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """The live view of a run started elsewhere (--detach, --sbatch, another terminal), read from its run directory;
    ends with the run. Ctrl-C leaves the watch and the run goes on."""
    from rlctl.run_status import RunStatus
    from rlctl.views.console import get_console
    from rlctl.views.next_steps import next_steps_text
    from rlctl.views.watch import exit_code, watch_run

    rd = _resolve(runs_dir, run)
    con = get_console()
    try:
        state = watch_run(rd, con, interval)
    except KeyboardInterrupt:
        print(f"rlctl: left the watch; {rd.run_id} goes on (rlctl stop {rd.run_id} stops it)", file=sys.stderr)
        raise typer.Exit(130)
    reason = state.get("exit_reason") or ("its supervisor ended without a word" if state["status"] == RunStatus.LOST
                                          else "-")
    con.print(f"run {rd.run_id} {state['status']}: {reason}", markup=False)
    con.print(next_steps_text(rd, state["status"]), markup=False)
    raise typer.Exit(exit_code(state["status"]))


FollowOpt = typer.Option(False, "--follow", "-f", help="Keep streaming until the run ends, then print its end line.")
LogRoleOpt = typer.Option(None, "--role", help="Only this role (learner, replay, collector, evaluator, inference, "
                                               "supervisor).")
LogJsonOpt = typer.Option(False, "--json", help="One JSON object per line: ts (epoch seconds), source, text.")


@app.command()
def logs(run: Optional[str] = RunArg, follow: bool = FollowOpt, role: Optional[str] = LogRoleOpt,
         rank: Optional[int] = typer.Option(None, "--rank", help="Only this rank."),
         tail: Optional[int] = typer.Option(None, "--tail", "-n", min=0, help="Only the last N lines (before following)."),
         as_json: bool = LogJsonOpt, runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Merged log lines of a run, prefixed by process, ordered by time."""
    from rlctl.role_names import LOG_SOURCES
    from rlctl.run_logs import follow_logs, merged_log_lines
    from rlctl.views.log_view import log_printer

    if role is not None and role not in LOG_SOURCES:
        raise _bad_input(f"rlctl logs: no role {role!r}; known roles: {', '.join(sorted(LOG_SOURCES))}")
    rd = _resolve(runs_dir, run)
    show = log_printer(as_json)
    try:
        for entry in (follow_logs if follow else merged_log_lines)(rd, role, rank, tail=tail):
            show(entry)
    except KeyboardInterrupt:
        raise typer.Exit(130)
    except BrokenPipeError:  # `rlctl logs | head`
        sys.stderr.close()


@app.command()
def stop(run: Optional[str] = RunArg, timeout: float = typer.Option(60.0, "--timeout", min=0, help="Seconds to wait."),
         runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Stop a run (or a sweep: its scheduler and every trial) gracefully (final checkpoint, every process gone) and
    wait for it."""
    from rlctl.rundir import RunBusy
    from rlctl.supervise.run_stop import stop_run, stop_sweep

    found = _sweep_named(runs_dir, run)
    if found is not None:
        if not stop_sweep(found, timeout):
            raise typer.Exit(EXIT_FAILED)
        return
    rd = _resolve(runs_dir, run)
    try:
        stopped = stop_run(rd, timeout)
    except RunBusy as exc:
        raise _bad_input(f"rlctl stop: {exc}") from None
    if not stopped:
        raise typer.Exit(EXIT_FAILED)


@app.command()
def compare(runs: List[str] = typer.Argument(..., help="Two or more runs (ids or prefixes), or one sweep.",
                                             autocompletion=_complete_run),
            as_json: bool = JsonOpt, runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Runs side by side: the job keys that differ, time and env steps to the stop target, final figures; a sweep's
    trials ranked by time to target."""
    from rlctl.views.compare_view import compare_data, compare_view
    from rlctl.views.console import get_console, print_json
    from rlctl.views.sweep_view import lineage_lines, ranked_trials

    found = _sweep_named(runs_dir, runs[0]) if len(runs) == 1 else None
    dirs = ranked_trials(found) if found is not None else [_resolve(runs_dir, r) for r in runs]
    if not dirs:
        raise _bad_input(f"rlctl compare: no trial of {found.sweep_id} has begun")
    if as_json:
        print_json(compare_data(dirs))
        return
    get_console().print(compare_view(dirs))
    for line in lineage_lines(found) if found is not None else []:
        get_console().print(line, markup=False, highlight=False)


@app.command()
def rm(runs: List[str] = typer.Argument(..., help="Runs to remove (ids or prefixes).", autocompletion=_complete_run),
       force: bool = typer.Option(False, "--force", help="Also a queued or preempted Slurm batch run whose pending job "
                                  "would start it (again)."),
       runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Remove run directories; refuses (removing none) while one of them still runs, or will in a pending Slurm
    job."""
    from rlctl.run_housekeeping import RunInUse, refusal, remove_run

    dirs = list(dict.fromkeys(_resolve(runs_dir, r) for r in runs))
    refused = [why for rd in dirs if (why := refusal(rd, rd.read_state(), force=force)) is not None]
    if refused:
        raise _bad_input("rlctl rm: " + "\nrlctl rm: ".join(refused) + "\nnothing was removed")
    for rd in dirs:
        try:
            remove_run(rd, force)
        except RunInUse as exc:
            raise _bad_input(f"rlctl rm: {exc}") from None
        print(f"removed {rd.run_id}")


@app.command()
def prune(older_than: str = typer.Option(..., "--older-than", help="Remove runs idle longer than this: 7d, 12h, 30m, "
                                         "45s, 2w (since they ended, or last wrote their state)."),
          keep_best: bool = typer.Option(False, "--keep-best", help="Keep, per job name, the run with the best final "
                                         "return (eval return, else training return), however old."),
          dry_run: bool = typer.Option(False, "--dry-run", help="List what would go; remove nothing."),
          runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Remove old run directories (never a live one)."""
    from rlctl.rundir import list_runs, runs_root
    from rlctl.run_housekeeping import RunInUse, parse_age, remove_run, to_prune

    try:
        age = parse_age(older_than)
    except ValueError as exc:
        raise _bad_input(f"--older-than: {exc}") from None
    chosen, awaiting = to_prune(list_runs(runs_root(runs_dir)), age, keep_best)
    for rd in chosen:
        if dry_run:
            print(f"would remove {rd.run_id}")
            continue
        try:
            remove_run(rd)
        except RunInUse as exc:  # it came back to life (a resume) since it was chosen
            print(f"rlctl prune: kept {rd.run_id}: {exc}", file=sys.stderr)
            continue
        print(f"removed {rd.run_id}")
    if not chosen and not awaiting:
        print(f"no run idle longer than {older_than}" + (" (besides each job's best)" if keep_best else ""))
    if awaiting:
        print(f"skipped {len(awaiting)} run{'s' if len(awaiting) > 1 else ''} that a pending Slurm job will start "
              f"(again): {', '.join(rd.run_id for rd in awaiting)}; rlctl stop RUN ends one")


@app.command()
def plot(runs: Optional[List[str]] = typer.Argument(None, help="Runs (ids or prefixes; default the newest).",
                                                     autocompletion=_complete_run),
         metric: str = typer.Option("charts/episode_return_mean", "--metric", help="TensorBoard scalar tag."),
         x: str = typer.Option("env_steps", "--x", help="x axis: env_steps or wall_s."),
         out: Optional[Path] = typer.Option(None, "--out", help="Write a PNG here (matplotlib) instead of drawing in "
                                            "the terminal."),
         smooth: int = typer.Option(1, "--smooth", min=1, help="Trailing moving average over this many points "
                                    "(each point the mean of itself and the W-1 before it)."),
         group: bool = typer.Option(False, "--group", help="One curve per job: the mean of its runs with a band."),
         group_by: Optional[str] = typer.Option(None, "--group-by", help="With one sweep: one curve per value of this "
                                                "parameter (key path or short name), the mean of its trials (seeds) "
                                                "with a band."),
         band: str = typer.Option("minmax", "--band", help="With --group or --group-by: minmax (min-max over the "
                                  "runs) or std (mean ± std)."),
         csv_file: Optional[Path] = typer.Option(None, "--csv", help="Write the points (run, x, value; with --group "
                                                 "also low, high) to this CSV file (- for stdout) instead of "
                                                 "drawing in the terminal."),
         runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Learning curves of one or more runs (or a sweep's trials), overlaid: in the terminal, or a PNG with --out, or
    CSV with --csv."""
    from rlctl.views.console import get_console
    from rlctl.views.curve_data import BANDS, NoCurves, plot_curves
    from rlctl.views.curves import X_AXES, PngError, png_out_problem, png_plot, terminal_plot

    if x not in X_AXES:
        raise _bad_input(f"--x must be one of {', '.join(X_AXES)}, not {x!r}")
    if band not in BANDS:
        raise _bad_input(f"--band must be one of {', '.join(BANDS)}, not {band!r}")
    problem = png_out_problem(out) if out is not None else None
    if problem:
        raise _bad_input(problem)
    dirs, group_of = _plot_runs(runs_dir, runs, group_by)
    try:
        curves, skipped = plot_curves(dirs, metric, x, smooth, band if group or group_by else None, group_of)
    except NoCurves as exc:
        raise _bad_input(str(exc)) from None
    for line in skipped:
        print(f"rlctl plot: warning: {line}", file=sys.stderr)
    if csv_file is not None:
        _write_csv(curves, csv_file)
    if out is None:
        if csv_file is None:
            con = get_console()
            con.print(terminal_plot(curves, metric, x, width=min(con.width, 160)))
        return
    try:
        print(png_plot(curves, metric, x, out))
    except PngError as exc:
        raise _bad_input(str(exc)) from None


def _plot_runs(runs_dir: Optional[Path], runs: Optional[List[str]], group_by: Optional[str]):
    """The run directories `rlctl plot` reads (one sweep: its trials that began) and, with --group-by, each one's
    group; exit 2 for --group-by without a sweep or with a key that is none of its parameters."""
    found = _sweep_named(runs_dir, runs[0]) if runs and len(runs) == 1 else None
    if found is None:
        if group_by is not None:
            raise _bad_input("rlctl plot: --group-by groups the trials of one sweep: rlctl plot SWEEP --group-by KEY")
        return [_resolve(runs_dir, r) for r in (runs or [None])], None
    from rlctl.views.sweep_view import trials_to_plot

    try:
        dirs, group_of = trials_to_plot(found, group_by)
    except ValueError as exc:
        raise _bad_input(f"rlctl plot: {exc}") from None
    if not dirs:
        raise _bad_input(f"rlctl plot: no trial of {found.sweep_id} has begun")
    return dirs, group_of


def _write_csv(curves, path: Path) -> None:
    """`rlctl plot --csv`: the points into a file (its path printed) or to stdout for `-`."""
    from rlctl.views.curve_data import write_csv

    if str(path) == "-":
        write_csv(curves, sys.stdout)
        return
    try:
        with open(path, "w", newline="") as f:
            write_csv(curves, f)
    except OSError as exc:
        raise _bad_input(f"rlctl plot: cannot write --csv {path}: {exc.strerror}") from None
    print(path)


@app.command("eval")
def eval_(target: str = typer.Argument(..., help="Run id/prefix or a checkpoint file.", autocompletion=_complete_run),
          episodes: int = typer.Option(10, "--episodes", min=1, help="Greedy episodes to run."),
          seed: int = typer.Option(12345, "--seed", help="Seed of the evaluation envs."),
          which: str = typer.Option("best", "--checkpoint",
                                    help="For a run: `best` (best evaluation so far; `latest` when the run had no "
                                         "evaluator) or `latest`."),
          job: Optional[Path] = typer.Option(None, "--job", help="Make the env and network from this job file "
                                             "(default: a run's own job.toml; for a checkpoint file, the job stored "
                                             "in it)."),
          trust_checkpoint: bool = typer.Option(False, "--trust-checkpoint", help="Let a checkpoint file's stored "
                                                "job import the code it names (`module:attr` env ids, wrappers); "
                                                "refused by default: only for files from a source you trust."),
          video: Optional[Path] = typer.Option(None, "--video", help="Record each episode as episode-<i>.mp4 into "
                                               "this folder (gymnasium's RecordVideo; needs pip install -e "
                                               "'.[video]')."),
          stochastic: bool = typer.Option(False, "--stochastic", help="Sample actions from the policy (ppo, appo, "
                                          "impala) instead of taking the most likely one."),
          as_json: bool = JsonOpt, runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Run greedy episodes with a run's checkpoint (or a checkpoint file) and print the mean return."""
    if which not in ("best", "latest"):
        raise _bad_input(f"--checkpoint must be best or latest, not {which!r}")
    path = Path(target)
    spec = _load(job) if job is not None else None
    if not path.is_file():
        rd = _resolve(runs_dir, target)
        path = rd.checkpoint(which)
        if path is None:
            raise _bad_input(f"{rd.run_id} has no {which} checkpoint (in {rd.checkpoints_dir})")
        if spec is None and rd.job_toml.is_file():
            # The run directory is the user's own: its job.toml, not what its checkpoint file says, makes the env.
            spec = _load(rd.job_toml)
    from rlctl.checkpoint import CheckpointError, evaluate_checkpoint
    from rlctl.views.eval_progress import EpisodeProgress, print_eval_result

    progress = EpisodeProgress(episodes)
    try:
        result = evaluate_checkpoint(path, episodes, seed, job=spec, trust_checkpoint=trust_checkpoint,
                                     video_dir=str(video) if video is not None else None, stochastic=stochastic,
                                     progress=progress)
    except CheckpointError as exc:
        print(f"{path}: {exc}", file=sys.stderr)  # one line, however long
        raise typer.Exit(EXIT_BAD_INPUT) from None
    finally:
        progress.close()
    if as_json:
        from rlctl.views.console import print_json

        print_json(result)
    else:
        print_eval_result(path, result, episodes, stochastic)


def main() -> None:
    """Console-script entry point."""
    app()
