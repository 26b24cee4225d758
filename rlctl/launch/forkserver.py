"""One interpreter that has imported torch, gymnasium and the local roles, forking role processes on request.

Every collector, evaluator and replay shard imports the same 2 s of modules (torch alone is 1.5 s). On a 2-core
machine, starting them all at once is a CPU-bound queue that the learner waits in. The supervisor therefore starts
this server alongside the learners. The server imports the roles once and forks each local process of those roles
from itself; restarts come from it too. A forked child starts a new session, takes the output pipe the supervisor
passed along as its stdout and stderr, replaces its environment with the plan's, and runs the role module as
`__main__`. From there on it is the same process that `python -m rlctl.roles.<role>` would have been.

The protocol runs over a SOCK_SEQPACKET socketpair (the supervisor's end is ForkServer, used by process_start.py):
  supervisor -> server: {"module": ..., "env": {...}}, with the write end of the process's output pipe attached
  server -> supervisor: {"ready": true} once imported; {"pid": p} after each fork; {"exit": p, "code": c} when
                        a child ends (c as Popen's returncode: negative for a signal)
When the supervisor's end closes, the server exits and leaves its children be: like processes the supervisor had
spawned itself, each is in its own session.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import runpy
import select
import socket
import subprocess
import sys
import time
import traceback

from rlctl.liveness import pid_alive
from rlctl.tether import SUPERVISOR_PID_ENV, tether_to_supervisor

FORKED_MODULES = ("rlctl.roles.collector", "rlctl.roles.evaluator", "rlctl.roles.replay", "rlctl.roles.inference")  # they import torch, gymnasium
FD_ENV = "RLCTL_FORKSERVER_FD"
READY_TIMEOUT_S = 60.0


class ForkedProcess:
    """Popen's interface (pid, stdout, stdin, poll, wait, returncode) for a process the fork server started."""

    stdin = None

    def __init__(self, server: "ForkServer", pid: int, stdout):
        self.server, self.pid, self.stdout = server, pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once the server has reported it, else None."""
        if self.returncode is None:
            self.server.collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Block until the process has ended (subprocess.TimeoutExpired after `timeout`)."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode


class ForkServer:
    """The supervisor's end: starts `python -m rlctl.launch.forkserver`, asks it for processes, hears of their exits.

    `spawn` returns None when the server cannot start a process (it failed to import, or died): the caller
    then starts that process itself, as it would without a server.
    """

    def __init__(self, python: str, env: dict[str, str], output_path: str):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(output_path, "ab") as out:
            own = {FD_ENV: str(theirs.fileno()), SUPERVISOR_PID_ENV: str(os.getpid())}  # tethered to its caller
            self.proc = subprocess.Popen([python, "-m", "rlctl.launch.forkserver"], env={**env, **own},
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        theirs.close()
        self.env = env
        self.ready = False
        self.dead = False
        self.children: dict[int, ForkedProcess] = {}

    def _receive(self, timeout: float) -> dict | None:
        """The next message within `timeout` seconds (None if none); marks the server dead when it is gone."""
        if self.dead or not select.select([self.sock], [], [], timeout)[0]:
            return None
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._died()
            return None
        msg = json.loads(data)
        if msg.get("ready"):
            self.ready = True
        elif "exit" in msg and msg["exit"] in self.children:
            self.children.pop(msg["exit"]).returncode = int(msg["code"])
        return msg

    def _died(self) -> None:
        """No more reports will come: a child that no longer exists has ended (with an unknown code, -1)."""
        self.dead = True
        for pid, child in list(self.children.items()):
            if not pid_alive(pid):
                child.returncode = -1
                del self.children[pid]

    def collect(self) -> None:
        """Take every report that has arrived (exits set the children's return codes)."""
        if self.dead:
            self._died()
            return
        while self._receive(0) is not None:
            pass

    def spawn(self, module: str, env: dict[str, str]) -> ForkedProcess | None:
        """Fork `python -m module` with `env`; its output comes out of the returned process's stdout."""
        if self.dead:
            return None
        read, write = os.pipe()
        try:
            socket.send_fds(self.sock, [json.dumps({"module": module, "env": env}).encode()], [write])
        except OSError:
            os.close(read)
            self._died()
            return None
        finally:
            os.close(write)
        end = time.monotonic() + READY_TIMEOUT_S  # the first request waits for the server's imports
        while time.monotonic() < end and not self.dead:
            msg = self._receive(max(end - time.monotonic(), 0.0))
            if msg is not None and "pid" in msg:
                child = ForkedProcess(self, int(msg["pid"]), os.fdopen(read, "rb"))
                self.children[child.pid] = child
                return child
        os.close(read)
        self.close()
        return None

    def close(self) -> None:
        """End the server (its children are left running: they are ended one by one, by process group)."""
        if not self.dead:
            self.collect()
        self.dead = True
        self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _send(sock: socket.socket, msg: dict) -> None:
    try:
        sock.send(json.dumps(msg).encode())
    except OSError:
        pass  # the supervisor is gone; the loop ends on its next read


def _reap(sock: socket.socket) -> None:
    """Report every child that has ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _child(sock: socket.socket, request: dict, out_fd: int) -> None:
    """In the forked child: become the role process; never returns."""
    code = 1
    try:
        sock.close()
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(null)
        os.close(out_fd)
        os.environ.clear()
        os.environ.update(request["env"])
        tether_to_supervisor()  # a fork does not inherit it: SIGTERM once this server (so the supervisor) is gone
        # The module's file as __main__ (as torchrun's --run-path): run_module would warn that it is imported already.
        path = importlib.util.find_spec(request["module"]).origin
        sys.argv = [path]
        runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(sock: socket.socket) -> None:
    """Import the roles, then fork a process per request until the supervisor's end closes."""
    for name in FORKED_MODULES:
        importlib.import_module(name)
    # The imported heap out of the collector's reach: a child's full collection then neither scans it (120 ms) nor
    # writes to every page of it (about 45 MiB copied per child, measured with torch and the four roles).
    gc.freeze()
    _send(sock, {"ready": True})
    while True:
        readable, _, _ = select.select([sock], [], [], 0.05)
        _reap(sock)
        if not readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
        except OSError:
            data, fds = b"", []
        if not data:
            return
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            _child(sock, request, fds[0])
        for fd in fds:
            os.close(fd)
        _send(sock, {"pid": pid})


if __name__ == "__main__":
    tether_to_supervisor()  # ends with the supervisor even while it imports the roles
    serve(socket.socket(fileno=int(os.environ.pop(FD_ENV))))
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: unloading torch took 0.6 s of every run's stop
