"""Run directories: where a run keeps its job, plan, state, logs and checkpoints.

Layout (run id = folder name)::

    <runs_dir>/<job-name>-<YYYYmmdd-HHMMSS>/
        job.toml  plan.json  state.json  logs/<role>-<rank>.log  tb/  checkpoints/

This module is on the fast CLI path (`rlctl status/logs/stop`): standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path

from rlctl.durable import replace_bytes
from rlctl.liveness import same_process
from rlctl.run_status import RunStatus
from rlctl.role_names import Role

TERMINAL_STATES = frozenset({RunStatus.FINISHED, RunStatus.STOPPED, RunStatus.FAILED})
# Statuses after which nothing new will be written to the run directory by the supervisor that wrote them (a
# preempted run's next allocation, or `run --resume`, starts a new segment).
OVER_STATES = TERMINAL_STATES | {RunStatus.LOST, RunStatus.PREEMPTED}
REMOTE_SUPERVISOR_STALE_S = 30.0  # a supervisor on another host that has not written state.json for this long is lost

RUNS_DIR_ENV = "RLCTL_RUNS_DIR"
_ID_TIME_FORMAT = "%Y%m%d-%H%M%S"
_ID_TIME_RE = re.compile(r"-(\d{8}-\d{6})(?:-(\d+))?$")
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_LOG_NAME_RE = re.compile(r"^(?P<role>.+)-(?P<rank>\d+)$")
RUN_LOCK_WAIT_S = 5.0  # how long a command waits for another one changing the same run before it gives up


class RunNotFound(Exception):
    """No run (or no unique run) matches what the user asked for."""


class RunsDirUnusable(Exception):
    """The runs directory cannot hold a new run (read-only, not a folder, no permission); the message is one line
    with the way out (--runs-dir, RLCTL_RUNS_DIR)."""


class RunBusy(Exception):
    """Another rlctl command holds the run directory's lock."""


class RunLock:
    """The lock of one run directory (flock of its `.lock`), held by a command that decides from the run's files and
    then rewrites them (`run --resume`, `stop` of a lost run): two such commands never interleave. The system drops
    it when the holder exits, however it ends."""

    def __init__(self, directory: Path, wait_s: float = RUN_LOCK_WAIT_S):
        self.fd: int | None = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self.release()
                    raise RunBusy(f"another rlctl command is changing run {directory.name} (waited {wait_s:g}s); "
                                  "try again once it is done") from None
                time.sleep(0.05)

    def release(self) -> None:
        """Let the next command in."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def runs_root(runs_dir: str | Path | None = None) -> Path:
    """Directory holding all runs: the argument, else $RLCTL_RUNS_DIR, else ./runs."""
    chosen = runs_dir if runs_dir not in (None, "") else os.environ.get(RUNS_DIR_ENV) or "runs"
    return Path(chosen).expanduser()


def new_run_id(job_name: str, now: float | None = None) -> str:
    """Run id "<job>-<YYYYmmdd-HHMMSS>" in local time; unsafe characters of the job name become "-"."""
    safe_name = _UNSAFE_NAME_CHARS.sub("-", job_name).strip("-") or "job"
    stamp = time.strftime(_ID_TIME_FORMAT, time.localtime(time.time() if now is None else now))
    return f"{safe_name}-{stamp}"


def status_of(state: dict | None) -> str:
    """Effective status of a state dict: its status, "lost" if its supervisor died, "unknown" if none."""
    if not isinstance(state, dict):
        return RunStatus.UNKNOWN
    status = state.get("status") or RunStatus.UNKNOWN
    if status in TERMINAL_STATES or status in (RunStatus.UNKNOWN, RunStatus.PREEMPTED):
        return status  # a supervisor's last word (preempted: it is gone, and meant to be)
    pid = state.get("supervisor_pid")
    host = state.get("supervisor_host")
    if isinstance(host, str) and host != socket.gethostname():
        # A supervisor on another machine (a Slurm batch job's first node): its pid means nothing here, but it
        # rewrites state.json twice a second while it lives.
        updated = state.get("updated_at")
        stale = isinstance(updated, (int, float)) and time.time() - updated > REMOTE_SUPERVISOR_STALE_S
        return RunStatus.LOST if stale else status
    # Without a pid (e.g. "created" before the supervisor started) we cannot tell; trust the file. A pid reused by
    # another process (another start time) is a dead supervisor too.
    if pid is not None and not same_process(pid, state.get("supervisor_start")):
        return RunStatus.LOST
    return status


def _read_json(path: Path) -> dict | None:
    """Parsed JSON object from path, or None when missing, half-written or not an object."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RunDir:
    """Paths and state of one run directory."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.run_id = self.path.name
        self.job_toml = self.path / "job.toml"
        self.plan_json = self.path / "plan.json"
        self.state_json = self.path / "state.json"
        self.logs_dir = self.path / "logs"
        self.tb_dir = self.path / "tb"
        self.checkpoints_dir = self.path / "checkpoints"
        self.secrets_json = self.path / "secrets.json"  # hosts[].env values, masked everywhere else (0600)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and self.path == other.path

    def __hash__(self) -> int:
        return hash(self.path)

    @classmethod
    def create(cls, root: Path, job_name: str, now: float | None = None) -> "RunDir":
        """Make a new run folder tree under root with a unique id (suffix -2, -3... on collision), private to its
        owner: this process and all it starts create folders 0700 and files 0600 from here on (umask 077)."""
        os.umask(0o077)
        root = Path(root)
        base = new_run_id(job_name, now)
        try:
            root.mkdir(parents=True, exist_ok=True)
            for n in range(1, 10_000):
                path = root / (base if n == 1 else f"{base}-{n}")
                try:
                    path.mkdir(mode=0o700)  # exclusive: two runs starting in the same second cannot share it
                except FileExistsError:
                    continue
                rundir = cls(path)
                for sub in (rundir.logs_dir, rundir.tb_dir, rundir.checkpoints_dir):
                    sub.mkdir()
                return rundir
        except OSError as exc:
            why = "it is not a folder" if root.exists() and not root.is_dir() else exc.strerror or str(exc)
            raise RunsDirUnusable(f"rlctl: cannot create a run directory in {root}: {why}; give a "
                                  f"folder you can write with --runs-dir or {RUNS_DIR_ENV}") from None
        raise FileExistsError(f"could not find a free run id for {base!r} in {root}")

    def lock(self, wait_s: float = RUN_LOCK_WAIT_S) -> RunLock:
        """This run's lock (RunBusy if another command keeps it past `wait_s`)."""
        return RunLock(self.path, wait_s)

    def read_state(self) -> dict | None:
        """The run's state.json, or None if missing or unreadable (never raises)."""
        return _read_json(self.state_json)

    def read_secrets(self) -> dict:
        """The run's host secrets (`rlctl.job.resolved.host_secrets`), {} when it has none."""
        return _read_json(self.secrets_json) or {}

    def write_secrets(self, secrets: dict) -> None:
        """Keep the host secrets apart from job.toml, readable by the owner only."""
        replace_bytes(self.secrets_json, json.dumps(secrets).encode())

    def write_job(self, text: str) -> None:
        """job.toml, durably (a resume rewrites it: a kill midway leaves the old one whole)."""
        replace_bytes(self.job_toml, text.encode())

    def write_plan(self, text: str) -> None:
        """plan.json, durably."""
        replace_bytes(self.plan_json, text.encode())

    def read_plan(self) -> dict | None:
        """The run's plan.json, or None if missing or unreadable (never raises)."""
        return _read_json(self.plan_json)

    def write_state(self, state: dict, in_place: bool = False) -> None:
        """Write state.json durably (temporary file, fsync, rename, fsync of the folder). `in_place`: overwrite the
        file itself, the last resort on a full disk (truncating it frees the blocks the new text needs)."""
        # Compact: twice a second with a row per process, indenting (pure-Python encoding) cost 3x as much.
        # `rlctl status RUN --json` prints it for people.
        data = (json.dumps(state, separators=(",", ":"), default=str) + "\n").encode()
        if in_place:
            # Only the blocks the file already has are sure to be there (truncating first freed them for whichever
            # process wrote next, and a state larger than one page came back cut): the text over the old bytes,
            # padded with spaces, which JSON ignores, to the old length.
            with open(self.state_json, "r+b" if self.state_json.exists() else "wb") as f:
                old = f.seek(0, os.SEEK_END)
                f.seek(0)
                f.write(data + b" " * max(0, old - len(data)))
            return
        replace_bytes(self.state_json, data)

    def checkpoint(self, which: str) -> Path | None:
        """The `best` or `latest` checkpoint file, or None; `best` is `latest` when no evaluator ran."""
        path = self.checkpoints_dir / f"{which}.pt"
        if which == "best" and not path.is_file():
            path = self.checkpoints_dir / "latest.pt"  # no evaluator ran: the learner's checkpoint is all there is
        return path if path.is_file() else None

    def effective_status(self, state: dict | None = None) -> str:
        """Status from state (read from disk if not given); "lost" if the supervisor died, "unknown" if no state."""
        return status_of(state if state is not None else self.read_state())

    def log_files(self, role: str | None = None, rank: int | None = None) -> list[Path]:
        """Log files logs/<role>-<rank>.log, optionally filtered, sorted by role then rank."""
        try:
            paths = [p for p in self.logs_dir.iterdir() if p.suffix == ".log" and p.is_file()]
        except OSError:
            return []
        chosen = []
        for path in paths:
            file_role, file_rank = parse_log_name(path)
            if role is not None and file_role != role:
                continue
            if rank is not None and file_rank != int(rank):
                continue
            chosen.append((file_role, -1 if file_rank is None else file_rank, path.name, path))
        return [entry[-1] for entry in sorted(chosen)]


def parse_log_name(path: Path) -> tuple[str, int | None]:
    """(role, rank) from a log file name "<role>-<rank>.log"; rank None if the name has none."""
    match = _LOG_NAME_RE.match(Path(path).stem)
    if match is None:
        return Path(path).stem, None
    return match["role"], int(match["rank"])


def _id_time(run_id: str) -> float | None:
    """Start time encoded in a run id, or None if it has none."""
    match = _ID_TIME_RE.search(run_id)
    if match is None:
        return None
    try:
        return time.mktime(time.strptime(match[1], _ID_TIME_FORMAT))
    except (ValueError, OverflowError):
        return None


def _start_time(rundir: RunDir) -> float:
    """When a run started: state's started_at, else the time in its id, else the folder's mtime."""
    state = rundir.read_state() or {}
    started = state.get("started_at")
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        return float(started)
    # Not the folder mtime first: it changes every time state.json is replaced.
    from_id = _id_time(rundir.run_id)
    if from_id is not None:
        return from_id
    try:
        return rundir.path.stat().st_mtime
    except OSError:
        return 0.0


def _id_suffix(run_id: str) -> int:
    """Collision suffix of a run id ("-2" -> 2), 1 if none; orders same-second runs."""
    match = _ID_TIME_RE.search(run_id)
    return int(match[2]) if match and match[2] else 1


def list_runs(root: Path) -> list[RunDir]:
    """Every run folder under root (one with state.json or plan.json), oldest to newest."""
    try:
        children = [p for p in Path(root).iterdir() if p.is_dir()]
    except OSError:
        return []
    runs = [RunDir(p) for p in children if (p / "state.json").exists() or (p / "plan.json").exists()]
    keyed = [(_start_time(r), _id_suffix(r.run_id), r.run_id, r) for r in runs]
    return [entry[-1] for entry in sorted(keyed, key=lambda e: e[:3])]


def _some_ids(runs: list[RunDir], limit: int = 5) -> str:
    """The newest few run ids, for error messages."""
    ids = [r.run_id for r in reversed(runs[-limit:])]
    more = f" (and {len(runs) - limit} older)" if len(runs) > limit else ""
    return ", ".join(ids) + more


def resolve_run(root: Path, run: str | None) -> RunDir:
    """Find a run: None -> newest; exact id; unique id prefix; or a path to a run folder."""
    root = Path(root)
    runs = list_runs(root)
    if not run:
        if not runs:
            raise RunNotFound(f"no runs in {root}")
        return runs[-1]
    if "/" not in run and run not in (".", "..") and (root / run).is_dir():
        return RunDir(root / run)
    if os.sep in run and Path(run).is_dir():
        return RunDir(Path(run))
    matches = [r for r in runs if r.run_id.startswith(run)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise RunNotFound(f"{run!r} matches {len(matches)} runs: {_some_ids(matches)}; give more of the run id")
    if not runs:
        raise RunNotFound(f"no run {run!r}: there are no runs in {root}")
    raise RunNotFound(f"no run {run!r} in {root}; recent runs: {_some_ids(runs)}")


def remove_weight_board(plan: dict) -> None:
    """Remove the shared-memory weight board (rlctl.net.weights) of a local learner, if one was left behind: its
    learner removes it on the way out, but not when it is killed."""
    for proc in plan.get("processes", []):
        board = proc.get("env", {}).get("RLCTL_WEIGHT_BOARD")
        if proc.get("role") == Role.LEARNER and not proc.get("remote") and isinstance(board, str) and board:
            try:
                if os.lstat(board).st_uid == os.getuid():  # never another user's file of that name
                    os.unlink(board)
            except OSError:
                pass
