"""A warm interpreter that forks `python -m rlctl` processes for the tests' run_cli.

About 180 test calls run the CLI as a user would, each in a new process. A fresh interpreter spends 0.5-3 s importing
numpy, gymnasium, pydantic and (for `eval`, `run`, `plan`) torch before the command does anything; on this 2-core
machine that was over half of the quick tier. This process imports those once, then forks one child per call, as
rlctl's own fork server does for role processes. A child is a separate process from there on: it takes the caller's
stdin, stdout and stderr, environment, working directory and arguments, puts the caller's PYTHONPATH entries on
sys.path as start-up would, runs `rlctl` as `__main__` through runpy (what `python -m rlctl` does), and leaves as the
interpreter's exit does (non-daemon threads joined, atexit handlers run, streams flushed) short of tearing down the
modules it inherited. Whatever a fresh interpreter would show differently (which modules a command imports, start-up
itself) is tested with a real `python` elsewhere.

Protocol, over a SOCK_SEQPACKET socketpair: the caller sends one request per call, {"args", "env", "cwd"} with four
file descriptors attached (the call's own socket, stdin, stdout, stderr). On the call's socket the server answers
{"pid": p} after the fork and {"code": c} when the child ends (c as Popen's returncode: negative for a signal).
The server exits when its socket closes, or with its parent (rlctl.tether.tether_to: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

PRELOAD = ("numpy", "gymnasium", "pydantic", "zmq", "rich.console", "torch", "rlctl.cli", "rlctl.job.load",
           "rlctl.algos", "rlctl.checkpoint", "rlctl.launch.plan")
MAX_MESSAGE = 1 << 20


# --------------------------------------------------------------------------- caller side (the test process)

class CliZygote:
    """The caller's end: start the server once, then start(args, env, cwd) like subprocess.Popen."""

    def __init__(self):
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, __file__, str(theirs.fileno()), str(os.getpid())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        theirs.close()
        self._sock.settimeout(120)
        if json.loads(self._sock.recv(MAX_MESSAGE) or b"{}").get("ready") is not True:
            raise RuntimeError("the CLI zygote did not start")

    def start(self, args: list[str], env: dict, cwd: str | None) -> "ForkedCli":
        """Start `python -m rlctl ARGS` in a forked child, its stdout and stderr piped (text), like subprocess.Popen."""
        call, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            request = {"args": list(args), "env": dict(env), "cwd": os.path.abspath(cwd or os.getcwd())}
            with self._lock:
                socket.send_fds(self._sock, [json.dumps(request).encode()], [theirs.fileno(), stdin, out_w, err_w])
        finally:
            for fd in (theirs.fileno(), stdin, out_w, err_w):
                os.close(fd)
            theirs.detach()
        call.settimeout(60)
        pid = json.loads(call.recv(MAX_MESSAGE))["pid"]
        return ForkedCli(call, pid, out_r, err_r, [sys.executable, "-m", "rlctl", *args])


class ForkedCli:
    """Popen's interface (pid, args, stdout, stderr, returncode, poll, wait, send_signal, kill, communicate) for a
    child of the zygote; its end is what the server reports on the call's socket."""

    def __init__(self, call: socket.socket, pid: int, out_r: int, err_r: int, args: list[str]):
        self._call, self.pid, self.args = call, pid, args
        self.stdout = open(out_r, errors="replace")
        self.stderr = open(err_r, errors="replace")
        self.returncode: int | None = None

    def _take_end(self, timeout: float | None) -> None:
        self._call.settimeout(timeout)
        self.returncode = json.loads(self._call.recv(MAX_MESSAGE))["code"]
        self._call.close()

    def poll(self) -> int | None:
        """The exit code once the child has ended, else None."""
        if self.returncode is None:
            try:
                self._take_end(0)
            except (BlockingIOError, TimeoutError):
                pass
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, waiting for it; subprocess.TimeoutExpired past `timeout`."""
        if self.returncode is None:
            try:
                self._take_end(timeout)
            except (BlockingIOError, TimeoutError):
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the child, unless it has ended."""
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the child, unless it has ended."""
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Read both streams to their end, then wait for the exit: (stdout, stderr); TimeoutExpired past `timeout`."""
        end = None if timeout is None else time.monotonic() + timeout
        texts: dict[str, str] = {}
        readers = [threading.Thread(target=lambda k=k, f=f: texts.__setitem__(k, f.read()), daemon=True)
                   for k, f in (("out", self.stdout), ("err", self.stderr))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(None if end is None else max(0.0, end - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.stdout.close()
        self.stderr.close()
        self.wait(None if end is None else max(0.0, end - time.monotonic()))
        return texts["out"], texts["err"]


# --------------------------------------------------------------------------- server side

def _serve(sock: socket.socket) -> None:
    """Answer requests until the caller's socket closes; report each child's end on its call socket."""
    for name in PRELOAD:
        importlib.import_module(name)
    gc.freeze()  # the preloaded heap out of the collector's reach: a child's collections leave those pages shared
    sock.send(json.dumps({"ready": True}).encode())
    calls: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, call socket)
    while True:
        readable = select.select([sock, *calls], [], [])[0]
        for pidfd in [fd for fd in readable if fd in calls]:
            pid, call = calls.pop(pidfd)
            _, status = os.waitpid(pid, 0)
            os.close(pidfd)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            try:
                call.send(json.dumps({"code": code}).encode())
            except OSError:  # the caller gave up on this call (timeout)
                pass
            call.close()
        if sock in readable:
            message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
            if not message:
                return
            call = socket.socket(fileno=fds[0])
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                sock.close()
                call.close()
                for pidfd, (_, other) in calls.items():
                    os.close(pidfd)
                    other.close()
                _child(json.loads(message), fds[1:])  # never returns
            for fd in fds[1:]:
                os.close(fd)
            call.send(json.dumps({"pid": pid}).encode())
            calls[os.pidfd_open(pid)] = (pid, call)


def _child(request: dict, fds: list[int]) -> None:
    """Become `python -m rlctl ARGS` with the caller's streams, environment and directory; exit as it exits."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # What start-up would have done with this environment: PYTHONPATH entries after sys.path[0], the current
    # directory first for -m.
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:1] = [os.getcwd(), *extra]
    sys.argv = ["-m", *request["args"]]
    code: object = 0
    try:
        runpy.run_module("rlctl", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(_leave(code))


def _leave(code: object) -> int:
    """The interpreter's exit up to module teardown: join threads, run atexit, print a non-int code, flush streams.

    Teardown itself is left out: in a child of this large heap it took about 0.45 s per call with the heap frozen, 0.9 s
    without, freeing objects the child never made and that its exit frees anyway.
    """
    threading._shutdown()  # what Py_FinalizeEx does first: wait for non-daemon threads
    atexit._run_exitfuncs()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # as the interpreter does when the final flush fails
        code = 120
    return code & 0xFF


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # like -m, not this file's folder
    from rlctl.tether import tether_to

    tether_to(int(sys.argv[2]))
    _serve(socket.socket(fileno=int(sys.argv[1])))
