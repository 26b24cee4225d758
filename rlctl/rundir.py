"""Run directories: where a run keeps its job, plan, state, logs and checkpoints.

Layout (run id = folder name)::

    <runs_dir>/<job-name>-<YYYYmmdd-HHMMSS>/
        job.toml  plan.json  state.json  logs/<role>-<rank>.log  tb/  checkpoints/

This module is on the fast CLI path (`rlctl status/logs/stop`): standard library only.
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import re
import socket
import time
from datetime import datetime
from pathlib import Path
from typing import Iterator

from rlctl.durable import replace_bytes
from rlctl.run_status import RunStatus

TERMINAL_STATES = frozenset({RunStatus.FINISHED, RunStatus.STOPPED, RunStatus.FAILED})
# Statuses after which nothing new will be written to the run directory.
OVER_STATES = TERMINAL_STATES | {RunStatus.LOST}
REMOTE_SUPERVISOR_STALE_S = 30.0  # a supervisor on another host that has not written state.json for this long is lost

RUNS_DIR_ENV = "RLCTL_RUNS_DIR"
_ID_TIME_FORMAT = "%Y%m%d-%H%M%S"
_ID_TIME_RE = re.compile(r"-(\d{8}-\d{6})(?:-(\d+))?$")
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_LOG_NAME_RE = re.compile(r"^(?P<role>.+)-(?P<rank>\d+)$")
RUN_LOCK_WAIT_S = 5.0  # how long a command waits for another one changing the same run before it gives up
_FOLLOW_CHUNK = 8 << 20  # bytes read per file per round, so a huge backlog cannot blow up memory

LogEntry = tuple[float, str, str]  # (timestamp, source such as "collector-0", text)


class RunNotFound(Exception):
    """No run (or no unique run) matches what the user asked for."""


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


def pid_alive(pid: int | None) -> bool:
    """True if a process with this pid exists on this host (it may belong to another user)."""
    try:
        pid = int(pid)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False  # 0 and negatives address process groups, not one process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return not _is_zombie(pid)


def process_start_time(pid: int | None) -> int | None:
    """When a process started (clock ticks since boot, /proc/<pid>/stat field 22); None if unknown or gone. With the
    pid it names one process for good: a pid the kernel reused has another start time."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:  # type: ignore[arg-type]
            return int(f.read().rsplit(b") ", 1)[1].split()[19])
    except (OSError, ValueError, IndexError, TypeError):
        return None


def same_process(pid: int | None, start_time: object) -> bool:
    """True while `pid` is alive and still the process recorded with `start_time`. Without a start time nothing
    says it is (a state.json planted, or written by hand): False, so that no command signals it."""
    return pid_alive(pid) and isinstance(start_time, int) and process_start_time(pid) == start_time


def group_alive(pgid: int) -> bool:
    """True while any process of the process group exists on this host, zombies aside: a process whose parent
    (a killed supervisor) is gone may wait as a zombie for a reaper that never comes."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _group_has_living_member(pgid)


def _group_has_living_member(pgid: int) -> bool:
    """Whether a non-zombie process of the group exists (Linux /proc; True where it cannot be told)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b"Z":
            return True
    return False


def _is_zombie(pid: int) -> bool:
    """An exited process its parent has not reaped yet counts as gone (Linux /proc; False elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b") ", 1)[1][:1] == b"Z"
    except (OSError, IndexError):
        return False


def status_of(state: dict | None) -> str:
    """Effective status of a state dict: its status, "lost" if its supervisor died, "unknown" if none."""
    if not isinstance(state, dict):
        return RunStatus.UNKNOWN
    status = state.get("status") or RunStatus.UNKNOWN
    if status in TERMINAL_STATES or status == RunStatus.UNKNOWN:
        return status
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
        root.mkdir(parents=True, exist_ok=True)
        base = new_run_id(job_name, now)
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
        raise FileExistsError(f"could not find a free run id for {base!r} in {root}")

    def lock(self, wait_s: float = RUN_LOCK_WAIT_S) -> RunLock:
        """This run's lock (RunBusy if another command keeps it past `wait_s`)."""
        return RunLock(self.path, wait_s)

    def read_state(self) -> dict | None:
        """The run's state.json, or None if missing or unreadable (never raises)."""
        return _read_json(self.state_json)

    def read_secrets(self) -> dict:
        """The run's host secrets (`spec.host_secrets`), {} when it has none."""
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
        if in_place:
            # Only the blocks the file already has are sure to be there (truncating first freed them for whichever
            # process wrote next, and a state larger than one page came back cut): compact text over the old bytes,
            # padded with spaces, which JSON ignores, to the old length.
            data = (json.dumps(state, separators=(",", ":"), default=str) + "\n").encode()
            with open(self.state_json, "r+b" if self.state_json.exists() else "wb") as f:
                old = f.seek(0, os.SEEK_END)
                f.seek(0)
                f.write(data + b" " * max(0, old - len(data)))
            return
        replace_bytes(self.state_json, (json.dumps(state, indent=1, default=str) + "\n").encode())

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
        if proc.get("role") == "learner" and not proc.get("remote") and isinstance(board, str) and board:
            try:
                if os.lstat(board).st_uid == os.getuid():  # never another user's file of that name
                    os.unlink(board)
            except OSError:
                pass


def parse_log_line(line: str) -> tuple[float | None, str]:
    """(epoch seconds, text) from "2026-11-29T22:01:11.123 text"; (None, line) if no timestamp."""
    line = line.rstrip("\r\n")
    stamp, sep, text = line.partition(" ")
    # Cheap shape check first: fromisoformat would also accept bare dates like "2026-11-29".
    if len(stamp) < 19 or stamp[4] != "-" or stamp[10] != "T":
        return None, line
    try:
        return datetime.fromisoformat(stamp).timestamp(), text
    except ValueError:
        return None, line


def _decode(raw: bytes) -> str:
    """Text of one raw log line (bad bytes replaced, trailing CR removed)."""
    return raw.decode("utf-8", errors="replace").rstrip("\r")


def _to_entries(lines: list[str], source: str, prev_ts: float | None, fallback_ts: float) -> list[LogEntry]:
    """Timestamped entries; lines without a timestamp take the previous line's one."""
    parsed = [parse_log_line(line) for line in lines]
    if prev_ts is None:
        # Leading untimestamped lines: borrow the first real timestamp so the file stays ordered.
        prev_ts = next((ts for ts, _ in parsed if ts is not None), fallback_ts)
    entries = []
    for ts, text in parsed:
        prev_ts = prev_ts if ts is None else ts
        entries.append((prev_ts, source, text))
    return entries


def _read_lines(path: Path, tail: int | None = None) -> list[str]:
    """All lines of a file, or only its last `tail`, reading backwards so big logs stay cheap."""
    with open(path, "rb") as f:
        if tail is None:
            data = f.read()
        else:
            pos = f.seek(0, os.SEEK_END)
            data = b""
            while pos > 0 and data.count(b"\n") <= tail:
                step = min(1 << 16, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    return [_decode(raw) for raw in lines]


def _mtime(path: Path) -> float:
    """File mtime, or now if it vanished."""
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def _merge(per_file: list[list[LogEntry]]) -> Iterator[LogEntry]:
    """Entries of several files merged by timestamp (stable: ties keep file order)."""
    return heapq.merge(*per_file, key=lambda entry: entry[0])


def merged_log_lines(
    rundir: RunDir, role: str | None = None, rank: int | None = None, tail: int | None = None
) -> list[LogEntry]:
    """(timestamp, source, text) of the run's log lines, ordered by time across files; last `tail` only if given."""
    per_file = []
    for path in rundir.log_files(role, rank):
        try:
            lines = _read_lines(path, tail)
        except OSError:
            continue
        per_file.append(_to_entries(lines, path.stem, None, _mtime(path)))
    merged = list(_merge(per_file))
    if tail is not None:
        merged = merged[-tail:] if tail > 0 else []
    return merged


class _LogCursor:
    """Read position of one followed log file, with its unfinished last line and last timestamp."""

    def __init__(self, path: Path, offset: int = 0):
        self.path = path
        self.source = path.stem
        self.offset = offset
        self.partial = b""
        self.last_ts: float | None = None
        self.pending = False  # more bytes on disk than this round read

    def read_new(self) -> list[LogEntry]:
        """Complete lines appended since the last call (an unfinished last line is kept for later)."""
        try:
            stat = self.path.stat()
        except OSError:
            return []
        if stat.st_size < self.offset:  # truncated: start over
            self.offset, self.partial = 0, b""
        if stat.st_size == self.offset:
            self.pending = False
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(min(stat.st_size - self.offset, _FOLLOW_CHUNK))
        except OSError:
            return []
        self.offset += len(data)
        self.pending = self.offset < stat.st_size
        *complete, self.partial = (self.partial + data).split(b"\n")
        return self._entries([_decode(raw) for raw in complete], stat.st_mtime)

    def flush(self) -> list[LogEntry]:
        """The unfinished last line, if any (used once the run is over and it will not be completed)."""
        if not self.partial:
            return []
        text, self.partial = _decode(self.partial), b""
        return self._entries([text], _mtime(self.path))

    def _entries(self, lines: list[str], mtime: float) -> list[LogEntry]:
        entries = _to_entries(lines, self.source, self.last_ts, mtime)
        if entries:
            self.last_ts = entries[-1][0]
        return entries


def _offset_after_last_line(path: Path) -> int:
    """Byte offset just after the file's last complete line (where "start at end" begins)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - (1 << 16))
            f.seek(start)
            newline = f.read(size - start).rfind(b"\n")
    except OSError:
        return 0
    return size if newline < 0 else start + newline + 1


def follow_logs(
    rundir: RunDir,
    role: str | None = None,
    rank: int | None = None,
    poll_s: float = 0.2,
    start_at_end: bool = False,
) -> Iterator[LogEntry]:
    """Yield new log lines as they appear (also from files created later); stop when the run is over.

    Only complete lines are yielded while the run is live. Each poll round yields the new lines of
    all files merged by timestamp. Returns once the run's effective status is terminal or lost and
    every file has been read to its end (then unfinished last lines are yielded too).
    """
    cursors: dict[Path, _LogCursor] = {}
    first_round = True
    while True:
        # Status first, then read: everything written before the run ended is read below.
        over = rundir.effective_status() in OVER_STATES
        for path in rundir.log_files(role, rank):
            if path not in cursors:
                # Files existing when following starts may be skipped; files appearing later never are.
                offset = _offset_after_last_line(path) if (start_at_end and first_round) else 0
                cursors[path] = _LogCursor(path, offset)
        first_round = False
        while True:
            yield from _merge([cursor.read_new() for cursor in cursors.values()])
            if not any(cursor.pending for cursor in cursors.values()):
                break
        if over:
            yield from _merge([cursor.flush() for cursor in cursors.values()])
            return
        time.sleep(poll_s)
