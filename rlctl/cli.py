"""The `rlctl` command line: each command a thin function over the library.

Imports here stay light (typer + the standard library): `--help`, `status`,
`logs` and `stop` never import torch, numpy or pydantic.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
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

    return [r.run_id for r in list_runs(runs_root()) if r.run_id.startswith(incomplete)]


SbatchNodesOpt = typer.Option(None, "--nodes", min=1, help="With --sbatch: nodes to ask for [default: "
                              "cluster.node_count, else the learner nodes and one more].")
PartitionOpt = typer.Option(None, "--partition", help="With --sbatch: the Slurm partition.")
TimeOpt = typer.Option(None, "--time", help="With --sbatch: the time limit (Slurm's format, e.g. 2:00:00).")
AccountOpt = typer.Option(None, "--account", help="With --sbatch: the Slurm account.")
RunsDirOpt = typer.Option(None, "--runs-dir", help="Parent folder of run directories [env: RLCTL_RUNS_DIR; default ./runs].")
RunArg = typer.Argument(None, help="Run id or unique prefix; default the newest run.", autocompletion=_complete_run)
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a table.")


def _bad_input(message: str) -> "typer.Exit":
    from rlctl.console import get_console

    get_console(stderr=True).print(message, markup=False)
    return typer.Exit(EXIT_BAD_INPUT)


def _load(path: Path):
    from rlctl.spec import JobFileError, load_job

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

    from rlctl.jobinit import render_job_file
    from rlctl.spec import JobFileError, validate_job

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
def validate(files: List[Path] = typer.Argument(..., help="Job files to check.")) -> None:
    """Check job files against the schema; exit 2 naming the key path on error."""
    from rlctl.spec import JobFileError, load_job

    bad = 0
    for f in files:
        try:
            spec = load_job(f)
        except JobFileError as exc:
            bad += 1
            print(exc.render(), file=sys.stderr)
            continue
        print(f"{f}: OK ({spec.algorithm.name}, {spec.env.id})")
    if bad:
        raise typer.Exit(EXIT_BAD_INPUT)


@app.command()
def plan(job_file: Path = typer.Argument(..., help="Job file."), as_json: bool = JsonOpt,
         sbatch: bool = typer.Option(False, "--sbatch", help="Print the batch script `rlctl run --sbatch` would "
                                     "submit (cluster.scheduler = \"slurm\"); submit nothing."),
         nodes: Optional[int] = SbatchNodesOpt, partition: Optional[str] = PartitionOpt,
         time_limit: Optional[str] = TimeOpt, account: Optional[str] = AccountOpt,
         runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Render the launch plan (every process, host, command, port); start nothing."""
    from rlctl.console import get_console, print_json
    from rlctl.plan import choose_base_port, local_python, make_plan
    from rlctl.rundir import new_run_id, runs_root

    spec = _load(job_file)
    run_id = new_run_id(spec.job.name)
    if sbatch:
        options = _sbatch_options(spec, {"partition": partition, "time": time_limit, "account": account})
        sys.stdout.write(_sbatch_script(spec, str((runs_root(runs_dir) / run_id).resolve()), nodes, options))
        return
    spec, control_address = _on_allocation(spec)
    p = make_plan(spec, run_id, str(runs_root(runs_dir) / run_id), choose_base_port(spec, control_address),
                  python=local_python(),
                  addresses=_host_addresses(spec), control_address=control_address)
    _warn_machine(spec)
    if as_json:
        print_json(p.to_dict())
        return
    con = get_console()
    out = [f"job {p.job} ({p.algorithm})  run dir {p.run_dir}  binds {p.bind_host}  ports {', '.join(map(str, p.ports()))}",
           f"hosts: {', '.join(h['name'] + _reached(h, spec) for h in p.hosts)}", ""]
    for x in p.processes:
        binds = "  ".join(f"{k}={v}" for k, v in x.binds.items())
        threads = x.env.get("RLCTL_TORCH_THREADS", "1")
        if threads.startswith("auto:"):
            threads = f"the cores left there after {threads[5:]} other processes"
        out.append(f"{x.name}  role={x.role} rank={x.rank} host={x.host} torch threads={threads}"
                   + _cores_text(x, p.hosts) + (f"  binds {binds}" if binds else ""))
        out.append("  $ " + shlex.join(x.argv))
    out.append("")
    own = ("RLCTL_ROLE", "RLCTL_RANK", "RLCTL_HOST", "RLCTL_BINDS", "RLCTL_TORCH_THREADS", "RLCTL_LEARNER_CORES")
    out.append(f"environment of every process ({', '.join(own)} differ per process):")
    for k, v in p.to_dict()["processes"][0]["env"].items():
        if k not in own:
            out.append(f"  {k}={v}")
    con.print("\n".join(out), markup=False, soft_wrap=True)


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
    from rlctl.plan import choose_base_port, local_python, make_plan
    from rlctl.rundir import RunDir, runs_root
    from rlctl.spec import dumps_toml, host_secrets, resolved_dict

    os.umask(0o077)  # a run's folders 0700 and files 0600: logs, job, plan, state, checkpoints
    rundir = lock = None
    if resume:
        rundir, spec, resumed, lock = _prepare_resume(runs_dir, str(job_file) if job_file else None, job, until)
    elif slurm_run_dir is not None:
        rundir, resumed = RunDir(slurm_run_dir.resolve()), None
        spec = _load(rundir.job_toml)
    else:
        if job_file is None:
            raise _bad_input("rlctl run: give a job file (or --resume [RUN])")
        if job is not None or until:
            raise _bad_input("rlctl run: --job and --until go with --resume")
        spec, resumed = _load(job_file), None
    if sbatch:
        raise typer.Exit(_submit(spec, runs_dir, nodes, {"partition": partition, "time": time_limit,
                                                         "account": account}))
    if detach and spec.cluster.scheduler == "slurm":
        raise _bad_input("rlctl run: --detach with cluster.scheduler = \"slurm\": the allocation ends with the command "
                         "salloc runs, and the run with it; submit a background run with --sbatch")
    spec, control_address = _on_allocation(spec)
    _warn_machine(spec)
    base_port = choose_base_port(spec, control_address)  # free where the supervisor binds (preflight: on the hosts)
    addresses = _host_addresses(spec)
    token = secrets.token_hex(8)  # names others must not guess: weight board, remote private folder
    if any(not h.is_local for h in spec.hosts):
        _preflight(spec, make_plan(spec, "preflight", "preflight", base_port, python=local_python(), addresses=addresses,
                                   board_token=token, control_address=control_address))
    if rundir is None:
        rundir = RunDir.create(runs_root(runs_dir).resolve(), spec.job.name)
    rundir.write_job(dumps_toml(resolved_dict(spec)))  # hosts[].env values masked
    secrets_of_hosts = host_secrets(spec)
    if secrets_of_hosts:
        rundir.write_secrets(secrets_of_hosts)
    p = make_plan(spec, rundir.run_id, str(rundir.path), base_port, python=local_python(), addresses=addresses,
                  board_token=token, control_address=control_address)
    rundir.write_plan(p.to_json())
    slurm_job = next((h.slurm_job for h in spec.hosts if h.slurm_job is not None), None)
    rundir.write_state({"run_id": rundir.run_id, "job": spec.job.name, "algorithm": spec.algorithm.name,
                        "status": "created", "started_at": time.time(), "processes": [], "metrics": {},
                        "hosts": [h["name"] for h in p.hosts], **({"resumed": resumed} if resumed else {}),
                        **({"slurm_job_id": slurm_job} if slurm_job else {})})
    if lock is not None:
        lock.release()
    if detach:
        out = open(rundir.path / "supervisor.out", "ab")
        subprocess.Popen([sys.executable, "-m", "rlctl.supervise", str(rundir.path)], stdin=subprocess.DEVNULL,
                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        print(rundir.run_id)
        print(f"  rlctl status {rundir.run_id}\n  rlctl logs --follow {rundir.run_id}\n  rlctl stop {rundir.run_id}",
              file=sys.stderr)
        return
    raise typer.Exit(_run_attached(rundir))


def _on_allocation(spec):
    """(job, where Slurm steps reach this process): a cluster.scheduler = "slurm" job placed on the allocation this
    process is inside (exit 2 naming why it cannot be); any other job as it is."""
    if spec.cluster.scheduler != "slurm":
        return spec, "127.0.0.1"
    from rlctl.plan import local_python
    from rlctl.slurm import SlurmError, allocation_from_env, route_address, with_allocation

    try:
        alloc = allocation_from_env()
        placed = with_allocation(spec, alloc, local_python(), os.getcwd())
        return placed, route_address(alloc.addresses[alloc.nodes[0]])
    except SlurmError as exc:
        raise _bad_input(f"rlctl: {exc}") from None


def _reached(host: dict, spec) -> str:
    """How `rlctl plan` says a host is reached: nothing for this machine, else ssh or srun and where."""
    if host["local"]:
        return ""
    slurm = next((h.slurm_job for h in spec.hosts if h.name == host["name"]), None)
    return f" (srun, job {slurm})" if slurm else f" (ssh {host['destination']})"


def _sbatch_options(spec, options: dict) -> dict[str, str]:
    """The job's sbatch_options with the command line's --partition/--time/--account over them (exit 2 for a value
    that is not a plain word, or a job that is not a Slurm one)."""
    if spec.cluster.scheduler != "slurm":
        raise _bad_input('rlctl: --sbatch needs cluster.scheduler = "slurm" in the job file')
    given = {k: v for k, v in options.items() if v is not None}
    for key, value in given.items():
        if not re.fullmatch(r"[A-Za-z0-9_.:,+-]{1,128}", value):
            raise _bad_input(f"rlctl: --{key} {value!r}: letters, digits and _.:,+- only")
    return {**spec.cluster.sbatch_options, **given}


def _sbatch_script(spec, run_dir: str, nodes: Optional[int], options: dict[str, str]) -> str:
    """The batch script of a Slurm job (options as _sbatch_options made them)."""
    from rlctl.plan import local_python
    from rlctl.slurm import sbatch_script

    count = nodes or spec.cluster.node_count or spec.cluster.learner_nodes + 1
    return sbatch_script(run_dir, spec.job.name, local_python(), os.getcwd(), count, options)


def _submit(spec, runs_dir: Optional[Path], nodes: Optional[int], options: dict) -> int:
    """`rlctl run --sbatch`: the run directory made (status queued), its batch script submitted; prints the run id."""
    from rlctl.rundir import RunDir, runs_root
    from rlctl.slurm import SlurmError, submit
    from rlctl.spec import dumps_toml, host_secrets, resolved_dict

    options = _sbatch_options(spec, options)  # bad input is refused before the run directory is made
    if host_secrets(spec):
        raise _bad_input("rlctl: --sbatch: hosts[].env is not used with Slurm")
    rundir = RunDir.create(runs_root(runs_dir).resolve(), spec.job.name)
    script = _sbatch_script(spec, str(rundir.path), nodes, options)
    rundir.write_job(dumps_toml(resolved_dict(spec)))
    (rundir.path / "sbatch.sh").write_text(script)
    try:
        job_id = submit(script)
    except SlurmError as exc:
        rundir.write_state({"run_id": rundir.run_id, "job": spec.job.name, "algorithm": spec.algorithm.name,
                            "status": "failed", "exit_reason": f"not submitted: {exc}", "started_at": time.time(),
                            "ended_at": time.time(), "processes": [], "metrics": {}})
        print(f"rlctl: {exc}", file=sys.stderr)
        return EXIT_FAILED
    rundir.write_state({"run_id": rundir.run_id, "job": spec.job.name, "algorithm": spec.algorithm.name,
                        "status": "queued", "slurm_job_id": job_id, "started_at": time.time(), "processes": [],
                        "metrics": {}})
    print(rundir.run_id)
    print(f"  Slurm job {job_id}\n  rlctl status {rundir.run_id}\n  rlctl logs --follow {rundir.run_id}\n"
          f"  rlctl stop {rundir.run_id}", file=sys.stderr)
    return 0


def _prepare_resume(runs_dir: Optional[Path], run: Optional[str], job: Optional[Path], until: List[str]):
    """(run dir, job, what the next segment continues from, the run's lock: the caller lets it go once the run's
    state says "created") for `run --resume`; exit 2 naming what is refused."""
    from rlctl.resume import ResumeRefused, job_for_resume, parse_until, previous_segment
    from rlctl.rundir import RunBusy
    from rlctl.spec import JobFileError, with_host_secrets

    rundir = _resolve(runs_dir, run)
    try:
        lock = rundir.lock()  # until its state says "created": a second resume then finds the run taken
    except RunBusy as exc:
        raise _bad_input(f"rlctl run --resume: {exc}") from None
    try:
        resumed = previous_segment(rundir)
        old = with_host_secrets(_load(rundir.job_toml), rundir.read_secrets())
        new = _load(job) if job is not None else None
        spec = job_for_resume(old, new, parse_until(until), str(job or "--until"))
    except ResumeRefused as exc:
        raise _bad_input(f"rlctl run --resume: {exc}") from None
    except JobFileError as exc:
        raise _bad_input(exc.render()) from None
    print(f"rlctl: resuming {rundir.run_id} ({resumed['status']}) from {resumed['env_steps']} env steps",
          file=sys.stderr)
    return rundir, spec, resumed, lock


def _cores_text(proc, hosts: list[dict]) -> str:
    """`topology.learner_cores = "dedicated"` in a plan line: the cores themselves on this machine, the rule elsewhere."""
    from rlctl.plan import core_ranges, pinned_cores, usable_cpu_ids

    value = proc.env.get("RLCTL_LEARNER_CORES")
    if not value:
        return ""
    if not next(h["local"] for h in hosts if h["name"] == proc.host):
        threads = value.partition(":")[2]
        mine = "one per torch thread" if ":" in threads else threads
        return "  cores=" + (f"{mine} of its own" if proc.role == "learner" else "those the learner ranks leave")
    sets = pinned_cores(value, proc.role, -1 if proc.role == "learner" else 0, usable_cpu_ids())
    return "  cores=" + (" | ".join(map(core_ranges, sets)) if sets else "all (too few to dedicate)")


def _warn_machine(spec) -> None:
    """Say on stderr what this machine cannot run well (the job still runs)."""
    from rlctl.plan import job_warnings, machine_warnings

    for line in machine_warnings(spec, os.cpu_count() or 1) + job_warnings(spec):
        print(f"rlctl: warning: {line}", file=sys.stderr)


def _host_addresses(spec) -> dict[str, str]:
    """Where remote hosts without an advertise_address are reached: what their SSH destinations resolve to."""
    from rlctl.hosts import ssh_hostnames

    return ssh_hostnames([h for h in spec.hosts if not h.is_local and not h.advertise_address])


def _preflight(spec, plan) -> None:
    """Check every remote host at once before anything starts; exit 1 naming each host that is not fit."""
    from rlctl.preflight import check_hosts

    started = time.time()
    problems = check_hosts(spec, plan)
    remote = sum(not h["local"] for h in plan.hosts)
    if problems:
        print(f"rlctl: {len(problems)} of {remote} remote hosts failed the check; nothing was started:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        raise typer.Exit(EXIT_FAILED)
    print(f"rlctl: {remote} remote hosts checked in {time.time() - started:.1f}s", file=sys.stderr)


def _run_attached(rundir) -> int:
    """Supervise in this process: a live table on a terminal, else a progress line every few seconds."""
    from rlctl.console import get_console, live_renderable, progress_printer
    from rlctl.supervise import supervise_rundir

    con = get_console()
    if con.is_terminal:
        from rich.live import Live

        with Live(console=con, refresh_per_second=4, transient=False) as live:
            code = supervise_rundir(str(rundir.path), display=lambda st: live.update(live_renderable(st)))
    else:
        code = supervise_rundir(str(rundir.path), display=progress_printer())
    state = rundir.read_state() or {}
    con.print(f"run {rundir.run_id} {state.get('status')}: {state.get('exit_reason')}", markup=False)
    failure = state.get("failure")
    if failure:
        con.print(f"--- last lines of {failure.get('process')} ---", markup=False)
        for line in failure.get("log_tail", []):
            con.print(line, markup=False)
    con.print(f"  rlctl status {rundir.run_id}\n  rlctl logs {rundir.run_id}\n  rlctl eval {rundir.run_id}", markup=False)
    return code


@app.command()
def status(run: Optional[str] = RunArg, as_json: bool = JsonOpt, runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """All runs, or one run's processes."""
    from rlctl.console import get_console, print_json, run_view, runs_json, runs_table
    from rlctl.rundir import list_runs, runs_root

    con = get_console()
    if run is None:
        runs = list_runs(runs_root(runs_dir))
        if as_json:
            print_json(runs_json(runs))
            return
        con.print(runs_table(runs, con.width))
        return
    rd = _resolve(runs_dir, run)
    state = rd.read_state() or {}
    if as_json:
        print_json({**state, "status": rd.effective_status(state)})
        return
    con.print(run_view({**state, "status": rd.effective_status(state)}, live=False))


@app.command()
def logs(run: Optional[str] = RunArg, follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the run ends."),
         role: Optional[str] = typer.Option(None, "--role", help="Only this role (learner, replay, collector, evaluator, inference)."),
         rank: Optional[int] = typer.Option(None, "--rank", help="Only this rank."),
         tail: Optional[int] = typer.Option(None, "--tail", "-n", min=0, help="Only the last N lines (before following)."),
         runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Merged log lines of a run, prefixed by process, ordered by time."""
    from rlctl.console import get_console, log_line_markup
    from rlctl.rundir import follow_logs, merged_log_lines

    rd = _resolve(runs_dir, run)
    con = get_console()
    try:
        if follow:
            if tail is not None:
                for ts, src, text in merged_log_lines(rd, role, rank, tail=tail):
                    con.print(log_line_markup(src, text, ts))
            for ts, src, text in follow_logs(rd, role, rank, start_at_end=tail is not None):
                con.print(log_line_markup(src, text, ts))
        else:
            for ts, src, text in merged_log_lines(rd, role, rank, tail=tail):
                con.print(log_line_markup(src, text, ts))
    except KeyboardInterrupt:
        raise typer.Exit(130)
    except BrokenPipeError:  # `rlctl logs | head`
        sys.stderr.close()


@app.command()
def stop(run: Optional[str] = RunArg, timeout: float = typer.Option(60.0, "--timeout", min=0, help="Seconds to wait."),
         runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Stop a run gracefully (final checkpoint, every process gone) and wait for it."""
    from rlctl.rundir import RunBusy

    rd = _resolve(runs_dir, run)
    try:
        lock = rd.lock()
    except RunBusy as exc:
        raise _bad_input(f"rlctl stop: {exc}") from None
    with lock:  # a resume does not start in the middle of a stop
        _stop_run(rd, timeout)


def _stop_run(rd, timeout: float) -> None:
    """`rlctl stop` of one run, its lock held."""
    from rlctl.rundir import TERMINAL_STATES, pid_alive, remove_weight_board, same_process

    state = rd.read_state() or {}
    status_now = rd.effective_status(state)
    if status_now in TERMINAL_STATES:
        print(f"{rd.run_id} is already {status_now}")
        _reap(state)
        _confirm_remote_hosts(rd)
        return
    if _supervised_by_batch_job(state):
        raise typer.Exit(_stop_batch_job(rd, state, timeout))
    pid = state.get("supervisor_pid")
    if status_now != "lost" and same_process(pid, state.get("supervisor_start")):
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + timeout
        while time.time() < deadline and rd.effective_status() not in TERMINAL_STATES | {"lost"}:
            time.sleep(0.1)
        while time.time() < deadline and pid_alive(pid):  # the supervisor itself exits just after writing its state
            time.sleep(0.05)
        state = rd.read_state() or {}
        if rd.effective_status(state) not in TERMINAL_STATES or pid_alive(pid):
            print(f"{rd.run_id} did not stop within {timeout:g}s (status {rd.effective_status(state)}); "
                  f"killing its processes", file=sys.stderr)
            _reap(state)
            remove_weight_board(rd.read_plan() or {})
            _confirm_remote_hosts(rd)
            raise typer.Exit(EXIT_FAILED)
    else:
        # The supervisor is gone: end its processes ourselves (closing remote sessions too), then bring home what it
        # would have, and record it.
        _reap(state)
        remove_weight_board(rd.read_plan() or {})
        clean = _confirm_remote_hosts(rd, fetch_checkpoints=True)
        state.update(status="stopped", ended_at=time.time(), exit_reason="supervisor lost; processes ended by rlctl stop")
        rd.write_state(state)
        print(f"{rd.run_id} {rd.effective_status()}")
        if not clean:
            raise typer.Exit(EXIT_FAILED)
        return
    left = _reap(state)
    print(f"{rd.run_id} {rd.effective_status()}" + (f"; {left} process groups had to be killed" if left else ""))
    if not _confirm_remote_hosts(rd):
        raise typer.Exit(EXIT_FAILED)


def _supervised_by_batch_job(state: dict) -> bool:
    """A run submitted with --sbatch whose supervisor is (or will be) a batch job on another machine."""
    import socket

    job = state.get("slurm_job_id")
    host = state.get("supervisor_host")
    return (isinstance(job, int) and not isinstance(job, bool) and job > 0
            and (state.get("status") == "queued" or (isinstance(host, str) and host != socket.gethostname())))


def _stop_batch_job(rd, state: dict, timeout: float) -> int:
    """Stop a batch-job run: SIGTERM to its supervisor through Slurm (a graceful stop, as Ctrl-C), then `scancel`
    of the job if it has not ended within `timeout`. Returns the exit code."""
    from rlctl.rundir import TERMINAL_STATES
    from rlctl.slurm import SlurmError, job_nodes, slurm_command

    job = state["slurm_job_id"]
    try:
        if state.get("status") == "queued":
            slurm_command("scancel", str(job))
            state = rd.read_state() or state
            if state.get("status") == "queued":  # it never started
                state.update(status="stopped", ended_at=time.time(), exit_reason=f"Slurm job {job} cancelled")
                rd.write_state(state)
        else:
            slurm_command("scancel", "--signal=TERM", "--batch", str(job))
        deadline = time.time() + timeout
        while time.time() < deadline and rd.effective_status() not in TERMINAL_STATES | {"lost"}:
            time.sleep(0.2)
        while time.time() < deadline and job_nodes(job) is not None:  # the batch job ends once its supervisor has
            time.sleep(0.2)
        if job_nodes(job) is not None:
            print(f"{rd.run_id} did not stop within {timeout:g}s: cancelling Slurm job {job}", file=sys.stderr)
            slurm_command("scancel", str(job))
            return EXIT_FAILED
    except SlurmError as exc:
        print(f"rlctl: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{rd.run_id} {rd.effective_status()} (Slurm job {job} ended)")
    return 0


def _confirm_remote_hosts(rd, fetch_checkpoints: bool = False) -> bool:
    """Check on every remote host of the run, at once, that none of its processes is left (killing any that are).

    With fetch_checkpoints (the supervisor died, so it could not), remote processes first get a few seconds to
    end by themselves (their sessions are closed: they write a final checkpoint), then their checkpoints come home.
    """
    plan = rd.read_plan() or {}
    remote = {h["name"] for h in plan.get("hosts", []) if not h.get("local", True)}
    if not remote:
        return True
    from rlctl.hosts import pull_directory, sweep_hosts
    from rlctl.plan import CHECKPOINT_ROLES
    from rlctl.remote import SESSION_LOST_GRACE_S, remote_checkpoint_dir
    from rlctl.spec import load_job

    hosts = [h for h in load_job(rd.job_toml).hosts if h.name in remote]
    slurm_jobs = {h.slurm_job for h in hosts if h.slurm_job is not None}
    if slurm_jobs:
        from rlctl.slurm import job_nodes

        if all(job_nodes(job) is None for job in slurm_jobs):
            print(f"  Slurm job {', '.join(map(str, sorted(slurm_jobs)))} has ended: Slurm ended every step of it")
            return True
    if fetch_checkpoints:
        deadline = time.time() + SESSION_LOST_GRACE_S + 3
        while time.time() < deadline and any(r.get("left") for r in sweep_hosts(hosts, rd.run_id, kill=False).values()):
            time.sleep(0.5)
        writers = {p["host"] for p in plan.get("processes", []) if p.get("remote") and p["role"] in CHECKPOINT_ROLES}
        fetched = pull_directory([h for h in hosts if h.name in writers], remote_checkpoint_dir(rd.run_id),
                                 rd.checkpoints_dir)
        for name, files in fetched.items():
            print(f"  host {name}: " + (f"fetched {', '.join(files) or 'no checkpoints'}" if isinstance(files, list)
                                        else f"could not fetch checkpoints: {files}"))
    clean = True
    for name, result in sweep_hosts(hosts, rd.run_id, kill=True).items():
        if "error" in result:
            clean = False
            print(f"  host {name}: could not check: {result['error']}", file=sys.stderr)
        elif result["killed"]:
            print(f"  host {name}: killed {len(result['killed'])} leftover processes (pids "
                  f"{', '.join(map(str, result['killed']))})" + (f"; {len(result['left'])} still there" if result['left'] else ""))
            clean = clean and not result["left"]
        else:
            print(f"  host {name}: nothing of the run left")
    return clean


def _reap(state: dict) -> int:
    """End every process group of the run still alive (SIGTERM, SIGKILL after 3 s); returns how many were."""
    from rlctl.rundir import group_alive, pid_alive, same_process

    # A group whose leader lives on as another process (its pid reused: another start time) is not the run's.
    alive = [p["pgid"] for p in state.get("processes", []) if isinstance(p.get("pgid"), int) and p["pgid"] > 1
             and group_alive(p["pgid"]) and (not pid_alive(p["pgid"]) or same_process(p["pgid"], p.get("start_time")))]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in alive:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 3
        while time.time() < deadline and any(group_alive(g) for g in alive):
            time.sleep(0.05)
    return len(alive)


@app.command()
def compare(runs: List[str] = typer.Argument(..., help="Two or more runs (ids or prefixes).",
                                             autocompletion=_complete_run),
            as_json: bool = JsonOpt, runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Runs side by side: the job keys that differ, time and env steps to the stop target, final figures."""
    from rlctl.console import build_table, compare_data, compare_rows, get_console, print_json

    dirs = [_resolve(runs_dir, r) for r in runs]
    if as_json:
        print_json(compare_data(dirs))
        return
    get_console().print(build_table(None, *compare_rows(dirs)))


@app.command()
def plot(runs: Optional[List[str]] = typer.Argument(None, help="Runs (ids or prefixes; default the newest).",
                                                     autocompletion=_complete_run),
         metric: str = typer.Option("charts/episode_return_mean", "--metric", help="TensorBoard scalar tag."),
         x: str = typer.Option("env_steps", "--x", help="x axis: env_steps or wall_s."),
         out: Optional[Path] = typer.Option(None, "--out", help="Write a PNG here (matplotlib) instead of drawing in "
                                            "the terminal."),
         runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Learning curves of one or more runs, overlaid: in the terminal, or a PNG with --out."""
    from rlctl.console import get_console
    from rlctl.curves import X_AXES, CurveError, png_plot, read_curve, terminal_plot

    if x not in X_AXES:
        raise _bad_input(f"--x must be one of {', '.join(X_AXES)}, not {x!r}")
    dirs = [_resolve(runs_dir, r) for r in (runs or [None])]
    try:
        curves = [read_curve(rd.path, metric, x) for rd in dirs]
    except CurveError as exc:
        raise _bad_input(str(exc)) from None
    if out is None:
        con = get_console()
        con.print(terminal_plot(curves, metric, x, width=min(con.width, 160)))
        return
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise _bad_input("--out needs matplotlib: pip install -e '.[plot]'")
    print(png_plot(curves, metric, x, out))


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
          video: Optional[Path] = typer.Option(None, "--video", help="Record each episode as an MP4 into this folder "
                                               "(gymnasium's RecordVideo; needs pip install -e '.[video]')."),
          as_json: bool = JsonOpt, runs_dir: Optional[Path] = RunsDirOpt) -> None:
    """Run greedy episodes with a run's checkpoint (or a checkpoint file) and print the mean return."""
    if which not in ("best", "latest"):
        raise _bad_input(f"--checkpoint must be best or latest, not {which!r}")
    path = Path(target)
    spec = _load(job) if job is not None else None
    if not path.is_file():
        rd = _resolve(runs_dir, target)
        path = rd.checkpoints_dir / f"{which}.pt"
        if which == "best" and not path.is_file():
            path = rd.checkpoints_dir / "latest.pt"  # no evaluator ran: the learner's checkpoint is all there is
        if not path.is_file():
            raise _bad_input(f"{rd.run_id} has no {which} checkpoint ({path})")
        if spec is None and rd.job_toml.is_file():
            # The run directory is the user's own: its job.toml, not what its checkpoint file says, makes the env.
            spec = _load(rd.job_toml)
    from rlctl.checkpoint import CheckpointError, evaluate_checkpoint

    try:
        result = evaluate_checkpoint(path, episodes, seed, job=spec, trust_checkpoint=trust_checkpoint,
                                     video_dir=str(video) if video is not None else None)
    except CheckpointError as exc:
        print(f"{path}: {exc}", file=sys.stderr)  # one line, however long: not wrapped like _bad_input's
        raise typer.Exit(EXIT_BAD_INPUT) from None
    if as_json:
        from rlctl.console import print_json

        print_json(result)
    else:
        print(f"{path}: mean return {result['return_mean']:.1f} over {episodes} episodes "
              f"(min {result['return_min']:.1f}, max {result['return_max']:.1f})")
        for i, (ret, length) in enumerate(zip(result["returns"], result["lengths"])):
            print(f"  episode {i}: return {ret:.1f}, {length} steps"
                  + (f", {result['videos'][i]}" if "videos" in result else ""))


def main() -> None:
    """Console-script entry point."""
    app()
