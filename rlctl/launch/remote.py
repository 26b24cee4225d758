"""The remote side of rlctl's SSH sessions: `python -m rlctl.launch.remote COMMAND` on a job's host.

`run` ties a process group to its SSH session: it reads the session's setup
(secrets, the job file) from the first line of stdin, so neither ever appears on
a command line; starts the role in its own process group with stdout going
straight back over the session; then obeys `TERM`/`KILL` lines on stdin, and
ends the group when stdin closes (the session, or the supervisor, is gone).
`check` reports what the launcher's preflight needs, `sweep` finds (and ends)
whatever of a run is left on the host, `pull` streams a directory back as
tar and `push` writes one sent. Imports nothing heavy: it must answer in well under a second.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import io
import json
import os
import select
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
import zlib
from pathlib import Path

import rlctl
from rlctl import events

# Seconds a group gets between SIGTERM and SIGKILL when its session closes.
SESSION_LOST_GRACE_S = 5.0
DEFAULT_SESSION_TIMEOUT_S = 30.0  # network.session_timeout_s, sent in the session's setup line
SETUP_TIMEOUT_S = 60.0
RUN_ID_ENV = "RLCTL_RUN_ID"
HOST_ENV = "RLCTL_HOST"  # the plan's name of the host a process was placed on
WEIGHT_BOARD_DIR = "/dev/shm"  # memory, not disk (Linux); a host without it sends weights over the network


def remote_run_dir(run_id: str) -> str:
    """Where a run keeps its files on a remote host, relative to the host's working directory."""
    return f".rlctl/runs/{run_id}"


def remote_checkpoint_dir(run_id: str) -> str:
    """Where a run's learner and evaluator write checkpoints on a remote host (relative to its working directory)."""
    return f"{remote_run_dir(run_id)}/checkpoints"


def weight_board_file(run_id: str, run_dir: str, token: str = "", relay: int | None = None) -> str:
    """The shared-memory file through which learner rank 0 hands weights to subscribers on its host (rlctl.net.weights),
    or the one weights relay `relay` writes for the processes on its host (rlctl.roles.relay).

    Named by a random token `rlctl run` draws (no one can plant a file at a name they cannot guess); without one,
    by the run's directory (run ids are unique within one runs directory only).
    """
    mark = token or format(zlib.crc32(run_dir.encode()), '08x')
    return f"{WEIGHT_BOARD_DIR}/rlctl-{run_id}-{mark}{'' if relay is None else f'-relay{relay}'}-weights"


def remove_weight_boards(run_id: str) -> None:
    """Remove the run's weight board on this host, if a learner that was killed left it behind."""
    for path in Path(WEIGHT_BOARD_DIR).glob(f"rlctl-{glob.escape(run_id)}-*-weights"):
        remove_own_file(path)


def remove_own_file(path: Path) -> None:
    """Unlink `path` if it is this user's (another user's file of the same name is left alone, never an error)."""
    try:
        if path.lstat().st_uid == os.getuid():
            path.unlink()
    except OSError:
        pass


class SessionInput:
    """Lines from the session's stdin (unbuffered fd reads, so a timeout can be put on waiting for the next one)."""

    def __init__(self, fd: int = 0):
        self.fd, self.pending = fd, b""

    def line(self, timeout: float | None = None) -> bytes | None:
        """The next line (b"" at end of input), or None when nothing complete arrived within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return b""
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line + b"\n"


class TetheredGroup:
    """A child process group whose life is bound to this process's stdin (the SSH session)."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        self.pgid = self.child.pid

    def send_signal(self, sig: int) -> None:
        """Signal every process of the group (torchrun's workers too)."""
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def alive(self) -> bool:
        """True while any process of the group exists."""
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def end(self, grace: float) -> None:
        """SIGTERM, then SIGKILL whatever is left after `grace` seconds."""
        self.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.alive() and time.monotonic() < deadline:
            self.child.poll()
            time.sleep(0.05)
        self.send_signal(signal.SIGKILL)

    def obey(self, session: SessionInput, timeout: float) -> None:
        """Act on the session's lines (PING, TERM, KILL) until it closes or stays silent for `timeout` seconds;
        either ends the group: nothing runs on unsupervised."""
        while True:
            line = session.line(timeout)
            if line is None:
                events.emit("exit", reason=events.EXIT_SUPERVISOR_SILENT,
                            detail=f"rlctl.launch.remote: no word from the supervisor for {timeout:g}s: stopping")
                break
            if not line:
                break
            word = line.strip()
            if word == b"TERM":
                self.send_signal(signal.SIGTERM)
            elif word == b"KILL":
                self.send_signal(signal.SIGKILL)
        self.end(SESSION_LOST_GRACE_S)


def _write_files(files: dict) -> None:
    for rel, text in files.items():
        path = Path(rel)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError(f"refusing to write {rel!r} outside the working directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)


def command_run(argv: list[str]) -> int:
    """Start argv tethered to this session; returns its exit status (128+N when a signal ended it)."""
    session = SessionInput()
    try:
        setup = json.loads(session.line(SETUP_TIMEOUT_S) or b"null")
        if not isinstance(setup, dict):
            raise ValueError("no setup line on stdin")
        timeout = float(setup.get("session_timeout_s", DEFAULT_SESSION_TIMEOUT_S))
        _write_files(setup.get("files", {}))
    except (ValueError, TypeError) as exc:
        print(f"rlctl.launch.remote: bad session setup: {exc}", file=sys.stderr, flush=True)
        return 2
    # The first line also tells the supervisor that this session is past its login; the event, that its host answered.
    print(f"rlctl.launch.remote: on {socket.gethostname()}: {shlex.join(argv)}", flush=True)
    events.emit("remote_session", host=socket.gethostname())
    group = TetheredGroup(argv, {**os.environ, **setup.get("env", {})})
    # The session's own signals (sshd's SIGHUP, a local Ctrl-C) mean the same as a TERM line.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: group.send_signal(signal.SIGTERM))
    threading.Thread(target=group.obey, args=(session, timeout), daemon=True).start()
    code = group.child.wait()
    # Workers outlive a crashed leader: the group ends with its leader.
    group.end(SESSION_LOST_GRACE_S if code == 0 else 1.0)
    control = os.environ.get("RLCTL_CONTROL", "")
    if control.startswith("ipc://"):
        Path(control[len("ipc://"):]).unlink(missing_ok=True)  # the forwarded control socket sshd made for us
    return 128 - code if code < 0 else code


def port_free(host: str, port: int) -> bool:
    """True when `port` can be bound on `host` now (as ZeroMQ binds: TIME_WAIT leftovers don't count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def command_check(ports: list[int], bind: str, private: str = "") -> int:
    """One JSON line of facts for the launcher's preflight: versions, torch, busy ports; and the run's private
    folder made (`private_error` says why it could not be)."""
    print(json.dumps({
        "rlctl": rlctl.__version__, "python": sys.version.split()[0], "executable": sys.executable,
        "torch": importlib.util.find_spec("torch") is not None, "hostname": socket.gethostname(),
        "busy": [p for p in ports if not port_free(bind, p)],
        **({"private_error": make_private_dir(private)} if private else {}),
    }))
    return 0


def make_private_dir(path: str) -> str | None:
    """Make `path` a folder only this user can enter (0700); an error text if something else is there."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot make {path}: {exc.strerror}"
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
        return f"{path} exists and is not a private folder of this user"
    return None


def run_processes(run_id: str, host: str = "") -> list[int]:
    """Pids on this host whose environment names the run (every process rlctl started for it, workers included);
    with `host`, only those the plan placed on that host (RLCTL_HOST): hosts that share one process table, as
    containers and network namespaces of one machine do, each see only their own."""
    needle = f"{RUN_ID_ENV}={run_id}".encode()
    placed = f"{HOST_ENV}={host}".encode() if host else None
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        items = environ.split(b"\0")
        if needle in items and (placed is None or placed in items):
            found.append(int(entry))
    return found


def command_sweep(run_id: str, kill: bool, host: str = "") -> int:
    """Report (and with kill, SIGKILL) the run's processes left on this host (`host`: placed on it); one JSON line."""
    left = run_processes(run_id, host)
    killed = []
    if kill and left:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and run_processes(run_id, host):
            time.sleep(0.05)
        left = run_processes(run_id, host)
    if kill and not left and not host:
        remove_weight_boards(run_id)
    print(json.dumps({"hostname": socket.gethostname(), "left": left, "killed": killed}))
    return 0


# The first member of every file stream (`pull`'s output, `push`'s input): each file's name, size and modification
# time, so the receiver can tell a complete transfer from one that lost its tail on the way (a tar reader stops
# quietly at a broken header), and a newer copy from an older one.
PULL_MANIFEST = ".manifest.json"


class FileStreamError(Exception):
    """A file stream that is not a complete, well-formed copy of a folder's files."""


def folder_files(root: Path) -> list[Path]:
    """The regular files directly in `root` (hidden files, a writer's temporaries, left out); none if it is not a
    folder."""
    return [p for p in (sorted(root.iterdir()) if root.is_dir() else []) if p.is_file() and not p.name.startswith(".")]


def write_file_stream(out, files: list[Path], since: float = -1.0) -> None:
    """Write those of `files` modified after `since` to `out` as an uncompressed tar, a manifest first."""
    with tarfile.open(fileobj=out, mode="w|") as tar:
        opened = [(p, open(p, "rb")) for p in files]  # open first: a file replaced meanwhile keeps these bytes
        try:
            stats = [os.fstat(f.fileno()) for _, f in opened]
            chosen = [(p, f, st) for (p, f), st in zip(opened, stats) if st.st_mtime > since]
            manifest = json.dumps({"files": {p.name: st.st_size for p, _, st in chosen},
                                   "mtimes": {p.name: st.st_mtime for p, _, st in chosen}}).encode()
            info = tarfile.TarInfo(PULL_MANIFEST)
            info.size = len(manifest)
            tar.addfile(info, io.BytesIO(manifest))
            for p, f, st in chosen:
                info = tarfile.TarInfo(p.name)
                info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), 0o600
                tar.addfile(info, f)
        finally:
            for _, f in opened:
                f.close()


def read_file_stream(data: bytes) -> dict[str, tuple[bytes, float]]:
    """The files of a stream `write_file_stream` wrote: name -> (content, modification time). Plain names only
    (nothing a stream says may land outside the folder it is written to); FileStreamError unless every file its
    manifest lists arrived whole."""
    files: dict[str, bytes] = {}
    manifest = None
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                if member.name == PULL_MANIFEST and manifest is None and member.isfile():
                    manifest = json.loads(tar.extractfile(member).read())
                elif member.isfile() and "/" not in member.name and not member.name.startswith("."):
                    files[member.name] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise FileStreamError(f"unreadable transfer: {exc}") from None
    expected = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(expected, dict):
        raise FileStreamError("transfer without its manifest")
    got = {name: len(content) for name, content in files.items()}
    if got != expected:
        wrong = sorted(str(n) for n in set(expected) | set(got) if expected.get(n) != got.get(n))
        raise FileStreamError(f"incomplete transfer ({', '.join(wrong)})")
    mtimes = manifest.get("mtimes") if isinstance(manifest.get("mtimes"), dict) else {}
    return {name: (content, _mtime(mtimes.get(name))) for name, content in files.items()}


def _mtime(value: object) -> float:
    """A manifest's modification time; 0 (older than any file) for a stream without one (an older rlctl's)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0.0


def keep_newer(files: dict[str, tuple[bytes, float]], directory: Path) -> list[str]:
    """Write each file into `directory` (whole or not at all) unless the one there is as new; it keeps its
    modification time, so the next comparison, here or where it is sent on, compares the writer's clock alone.
    The names written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (content, mtime) in sorted(files.items()):
        target = directory / name
        try:
            if target.stat().st_mtime >= mtime and mtime > 0:
                continue
        except FileNotFoundError:
            pass
        tmp = directory / f".{name}.pull"
        tmp.write_bytes(content)
        if mtime > 0:
            os.utime(tmp, (mtime, mtime))
        tmp.replace(target)
        written.append(name)
    return written


def command_pull(directory: str, since: float = -1.0, suffix: str = "") -> int:
    """Stream the regular files directly in `directory` (those modified after `since`, named ...`suffix`) to stdout
    as a file stream."""
    files = [p for p in folder_files(Path(directory)) if p.name.endswith(suffix)]
    write_file_stream(sys.stdout.buffer, files, since)
    sys.stdout.buffer.flush()
    return 0


def command_push(directory: str) -> int:
    """Write a file stream from stdin into `directory`, keeping any file there that is as new; print which were
    written."""
    os.umask(0o077)  # a run's files on this host: folders 0700, files 0600
    try:
        written = keep_newer(read_file_stream(sys.stdin.buffer.read()), Path(directory))
    except (FileStreamError, OSError) as exc:
        print(f"push into {directory}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"written": written}))
    return 0


def main(args: list[str] | None = None) -> int:
    """Entry point of `python -m rlctl.launch.remote`."""
    parser = argparse.ArgumentParser(prog="python -m rlctl.launch.remote", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="start a command tethered to this session (setup JSON on stdin's first line)")
    p_run.add_argument("argv", nargs=argparse.REMAINDER)
    p_check = sub.add_parser("check", help="print versions and which of the given ports are busy")
    p_check.add_argument("--ports", default="")
    p_check.add_argument("--bind", default="0.0.0.0")
    p_check.add_argument("--private-dir", default="")
    p_sweep = sub.add_parser("sweep", help="list (and with --kill end) a run's processes on this host")
    p_sweep.add_argument("run_id")
    p_sweep.add_argument("--kill", action="store_true")
    p_sweep.add_argument("--host", default="", help="only the processes the plan placed on this host (RLCTL_HOST)")
    p_pull = sub.add_parser("pull", help="write a directory's files to stdout as tar")
    p_pull.add_argument("directory")
    p_pull.add_argument("--since", type=float, default=-1.0, help="only files modified after this (epoch seconds)")
    p_pull.add_argument("--suffix", default="", help="only files whose names end so")
    p_push = sub.add_parser("push", help="write the files of a tar on stdin into a directory, unless as new there")
    p_push.add_argument("directory")
    ns = parser.parse_args(args)
    if ns.command == "run":
        os.umask(0o077)  # the run's files on this host (.rlctl/runs/<run>): folders 0700, files 0600
        argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
        if not argv:
            parser.error("run needs a command")
        code = command_run(argv)
        # Exit at once: interpreter shutdown would wait on the stdin thread's lock (a fatal error in 3.11).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if ns.command == "check":
        return command_check([int(p) for p in ns.ports.split(",") if p], ns.bind, ns.private_dir)
    if ns.command == "sweep":
        return command_sweep(ns.run_id, ns.kill, ns.host)
    if ns.command == "push":
        return command_push(ns.directory)
    return command_pull(ns.directory, ns.since, ns.suffix)


if __name__ == "__main__":
    sys.exit(main())
