"""Shared test helpers: run the real CLI, write small job files, wait on run state."""

from __future__ import annotations

import json
import os
import socket
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


FRESH_CLI_ENV = "RLCTL_TEST_FRESH_CLI"  # set to 1: every run_cli call starts a new interpreter
_zygote = None
QUICK_TIER = "not slow"  # the -m expression of the quick tier (README)
_quick = False


def pytest_configure(config):
    """Note whether this is the quick tier, before any test module (and its @settings) is imported."""
    global _quick
    _quick = (config.getoption("markexpr") or "").strip() == QUICK_TIER


def examples(n: int) -> int:
    """A property test's example count: `n` in the whole suite, a fifth of it (at least 10) in the quick tier, which
    runs every property a little, as Hypothesis's own advice has a small "dev" profile beside a large "ci" one."""
    return max(10, n // 5) if _quick else n


def _cli_zygote():
    """The session's CLI zygote, started on first use."""
    global _zygote
    if _zygote is None:
        from cli_zygote import CliZygote

        _zygote = CliZygote()
    return _zygote


def run_cli(args: list[str], expected_exit: int | None = 0, env: dict | None = None, timeout: float = 120,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run `python -m rlctl ARGS` as a user would, in a new process (forked from a warm interpreter, cli_zygote.py);
    assert the exit code when given."""
    started = start_cli(args, env, cwd)
    try:
        out, err = started.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        started.kill()
        raise
    proc = subprocess.CompletedProcess(started.args, started.returncode, out, err)
    if expected_exit is not None:
        assert proc.returncode == expected_exit, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def start_cli(args: list[str], env: dict | None = None, cwd: str | Path | None = None):
    """Start `python -m rlctl ARGS` as a user would, without waiting: a subprocess.Popen (or, forked from the warm
    interpreter, its like: cli_zygote.ForkedCli) with text stdout and stderr pipes."""
    full_env = {**os.environ, **(env or {})}
    if os.environ.get(FRESH_CLI_ENV) == "1":
        return subprocess.Popen([sys.executable, "-m", "rlctl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=full_env, cwd=cwd)
    return _cli_zygote().start(args, full_env, None if cwd is None else str(cwd))


def missing_extra(extra: str, *modules: str) -> str | None:
    """Why a test cannot run without an optional extra (its missing modules, and the install command); None when
    every module is there."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"needs the [{extra}] extra ({', '.join(missing)} missing): pip install -e '.[{extra}]'" if missing else None


def needs_extra(extra: str, *modules: str):
    """A mark that skips a test, naming the extra, when that extra's modules are not installed."""
    reason = missing_extra(extra, *modules)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


SMALL_JOB = """
[job]
name = "{name}"
seed = 3
[job.stop]
{stop}
[env]
id = "CartPole-v1"
envs_per_collector = 4
[algorithm]
name = "apex"
batch_size = 32
publish_interval = 10
[replay]
capacity = 5000
min_size = 200
[topology]
collectors = {collectors}
evaluator = true
max_restarts = {max_restarts}
[evaluator]
interval_s = 0.5
episodes = 2
[logging]
metrics_interval_s = 0.3
checkpoint_interval_s = 2.0
"""


def small_job(path: Path, name: str = "tiny", stop: str = "wall_s = 60", collectors: int = 1,
              max_restarts: int = 3, extra: str = "") -> Path:
    """Write a small, fast Ape-X job (CartPole) for lifecycle tests."""
    f = path / f"{name}.toml"
    f.write_text(SMALL_JOB.format(name=name, stop=stop, collectors=collectors, max_restarts=max_restarts) + extra)
    return f


def read_state(run_dir: Path) -> dict:
    """state.json of a run (empty dict while missing or mid-write)."""
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def free_ports(n: int) -> list[int]:
    """n loopback ports that were free a moment ago."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_for(predicate, timeout: float = 60, interval: float = 0.1, what: str = "condition"):
    """Poll until predicate() is truthy; return its value or fail naming `what`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def only_run(runs_dir: Path) -> Path:
    """The single run directory under runs_dir."""
    runs = [p for p in runs_dir.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def pid_alive(pid: int) -> bool:
    """True while a process (not a zombie) with this pid exists."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process belongs to the process group."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().split(") ", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                return True
    return False


def marked_processes(mark: str) -> list[int]:
    """Pids of live processes whose environment holds RLCTL_TEST_MARK=mark (inherited by every descendant, forked
    ones included), other than this one."""
    needle = f"RLCTL_TEST_MARK={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def cmdline(pid: int) -> bytes | None:
    """A process's command line (NUL-separated), or None once it has ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def command_lines() -> list[bytes]:
    """The command line of every process on this machine (test hosts share its /proc)."""
    lines = (cmdline(int(entry)) for entry in os.listdir("/proc") if entry.isdigit())
    return [line for line in lines if line is not None]


def member_keys(run_id: str, role: str, rank: int):
    """The CURVE keys (wire.CurveKeys) of one process of a run, read from its environment as anyone on its host
    could: the learner's torchrun agent and central-inference collectors are started with them (forked processes
    show the fork server's environment)."""
    from rlctl.net import wire

    wanted = {f"RLCTL_RUN_ID={run_id}".encode(), f"RLCTL_ROLE={role}".encode(), f"RLCTL_RANK={rank}".encode()}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if wanted <= set(env):
                value = next(v for v in env if v.startswith(wire.KEYS_ENV.encode() + b"="))
                return wire.CurveKeys.from_env(value.split(b"=", 1)[1].decode())
    pytest.fail(f"no {role}-{rank} of {run_id} found")
