"""Every process a benchmark starts ends with the benchmark: killed (SIGTERM, SIGINT, SIGHUP), failed or done.

A bench calls `install()` first thing in main(), then starts every child through `spawn()` (a `subprocess.Popen`
that is registered here) or `run()` (`subprocess.run`'s equivalent), and stops them with `stop()`.

- `install()` makes SIGTERM and SIGHUP raise SystemExit(128 + signal) and SIGINT KeyboardInterrupt in the main
  thread, so the bench's own `finally` blocks run, and registers `stop_all()` with atexit, which stops whatever
  is still registered. A repeated signal does not interrupt that clean-up; one more than a second after the
  first (a second Ctrl-C) cuts the grace short (SIGKILL at once). `timeout` delivers its signal twice within
  microseconds (to the bench, then to its process group): that counts as one.
- `stop()` sends SIGTERM (and SIGCONT, for a child paused with SIGSTOP) to each child's process group (or the child
  alone when it shares the bench's group), waits up to the child's grace for the group and every descendant seen
  meanwhile (processes in other sessions too: an `rlctl run` supervisor's roles) to be gone, then SIGKILLs what is
  left. An `rlctl run` supervisor stops its own processes cleanly on SIGTERM; give it SUPERVISOR_GRACE_S.
- Children also get PR_SET_PDEATHSIG = SIGTERM (Linux), a backstop for a bench that is SIGKILLed; only when
  started from the main thread (the signal fires when the *thread* that forked exits).

Stdlib only.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

GRACE_S = 10.0  # a role process or a plain child: SIGTERM, then SIGKILL after this
SUPERVISOR_GRACE_S = 25.0  # an `rlctl run` supervisor: it stops its own processes first
KILL_WAIT_S = 5.0  # after SIGKILL: how long to wait for the processes to be gone
REPEAT_S = 1.0  # a repeated signal later than this after the first hurries the clean-up
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(eq=False)
class _Child:
    popen: subprocess.Popen
    group: bool  # in its own process group (signal the group) or in the bench's (signal the pid)
    grace: float
    family: dict[int, int] = field(default_factory=dict)  # descendants seen: pid -> start time (against pid reuse)


_children: list[_Child] = []
_lock = threading.RLock()
_installed = False
_spawning = 0  # > 0 while a Popen is being created and registered: a signal waits for it
_pending: int | None = None  # a signal that arrived while _spawning
_first_signal: float | None = None
_hurry = False


# --------------------------------------------------------------------------- signals

def install() -> None:
    """Signals stop the bench through its `finally` blocks; at exit every registered child is stopped."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    atexit.register(stop_all)


def _on_signal(signum, frame) -> None:
    global _pending, _hurry
    if _first_signal is not None or _pending is not None:
        first = _first_signal if _first_signal is not None else time.monotonic()
        if time.monotonic() - first > REPEAT_S:
            _hurry = True  # a second Ctrl-C: SIGKILL what is left now
        return
    if _spawning:
        _pending = signum  # raised once the child being started is registered
        return
    _raise(signum)


def _raise(signum: int) -> None:
    global _first_signal
    _first_signal = time.monotonic()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


# --------------------------------------------------------------------------- starting

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the forked child only calls it
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with(parent: int):
    """A preexec_fn: SIGTERM when the parent dies (already dead: now)."""
    def setup() -> None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
    return setup


def spawn(argv, *, grace: float = GRACE_S, new_session: bool = True, pdeathsig: bool = True,
          **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(argv, **popen_kwargs)`, in a new session unless told, registered to be stopped with the bench.

    pdeathsig=False leaves Popen's fast path (vfork) alone, for children whose start is timed.
    """
    global _spawning, _pending
    install()
    if pdeathsig and _prctl is not None and threading.current_thread() is threading.main_thread():
        popen_kwargs["preexec_fn"] = _die_with(os.getpid())
    with _lock:
        _spawning += 1
    try:
        p = subprocess.Popen(argv, start_new_session=new_session, **popen_kwargs)
        with _lock:
            _children.append(_Child(p, new_session, grace))
    finally:
        with _lock:
            _spawning -= 1
            pending, _pending = (_pending, None) if not _spawning else (None, _pending)
        if pending is not None:
            _raise(pending)
    return p


def run(argv, *, input=None, capture_output: bool = False, timeout: float | None = None,
        grace: float = GRACE_S, new_session: bool = True, pdeathsig: bool = True,
        **popen_kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run` through spawn(): on a timeout or an exception (a signal) the child is stopped with stop()
    (SIGTERM, grace, SIGKILL) rather than SIGKILLed alone, so a child with children of its own can stop them."""
    if capture_output:
        popen_kwargs["stdout"] = popen_kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        popen_kwargs["stdin"] = subprocess.PIPE
    p = spawn(argv, grace=grace, new_session=new_session, pdeathsig=pdeathsig, **popen_kwargs)
    try:
        out, err = p.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        stop([p])
        raise subprocess.TimeoutExpired(p.args, timeout, e.output, e.stderr) from None
    except BaseException:
        stop([p])
        raise
    _forget(p)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


# --------------------------------------------------------------------------- stopping

def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, pgid, start time) of every live (non-zombie) process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] in (b"Z", b"X"):
            continue
        table[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    return table


def _descendants(root: int, table: dict) -> dict[int, int]:
    """Every live descendant of `root` (pid -> start time)."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = {}, list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in out:
            out[pid] = table[pid][2]
            todo.extend(kids.get(pid, []))
    return out


def _signal(c: _Child, sig: int, table: dict) -> None:
    """`sig` to the child's group (or the child), and to every descendant seen that still is the same process."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if c.group:
            os.killpg(c.popen.pid, sig)
        elif c.popen.returncode is None:
            os.kill(c.popen.pid, sig)
    if sig == signal.SIGKILL:  # SIGTERM goes to the child alone: it stops its own processes in order
        for pid, start in c.family.items():
            if pid in table and table[pid][2] == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)


def _alive(c: _Child, table: dict) -> bool:
    """True while the child, a member of its group or a descendant seen runs."""
    c.popen.poll()  # reap the child so it does not count as alive
    if c.popen.returncode is None:
        return True
    if c.group and any(pgid == c.popen.pid for _, pgid, _ in table.values()):
        return True
    return any(pid in table and table[pid][2] == start for pid, start in c.family.items())


def _drain(p: subprocess.Popen) -> None:
    """Read (and drop) a child's output pipes, so a child that talks while it stops does not block on a full pipe."""
    for pipe in (p.stdout, p.stderr):
        if pipe is not None and not pipe.closed:
            def read(f=pipe) -> None:
                with contextlib.suppress(Exception):
                    while f.read(65536):
                        pass
            threading.Thread(target=read, daemon=True).start()


def _forget(p: subprocess.Popen) -> None:
    with _lock:
        _children[:] = [c for c in _children if c.popen is not p]


def stop(popens, grace: float | None = None) -> None:
    """Stop these children (spawned here) in parallel: SIGTERM, up to `grace` (default: each one's own) for them
    and their descendants to be gone, then SIGKILL. Returns when they are gone (or SIGKILL did not help within
    KILL_WAIT_S). Children not started by spawn() are stopped as their own process group when they lead one."""
    popens = list(popens)
    with _lock:
        known = {id(c.popen): c for c in _children}
    todo = []
    for p in popens:
        c = known.get(id(p))
        if c is None:
            with contextlib.suppress(OSError):
                c = _Child(p, os.getpgid(p.pid) == p.pid, GRACE_S)
        if c is not None:
            todo.append(c)
    table = _proc_table()
    start = time.monotonic()
    deadline = {}
    for c in todo:
        c.family.update(_descendants(c.popen.pid, table))
        if _alive(c, table):
            _drain(c.popen)
            _signal(c, signal.SIGTERM, table)
            _signal(c, signal.SIGCONT, table)  # a child paused with SIGSTOP only sees SIGTERM once resumed
            deadline[id(c)] = start + (c.grace if grace is None else grace)
    killed: dict[int, float] = {}
    while deadline:
        time.sleep(0.05)
        table = _proc_table()
        now = time.monotonic()
        for c in todo:
            if id(c) not in deadline:
                continue
            if c.popen.returncode is None:
                c.family.update(_descendants(c.popen.pid, table))
            if not _alive(c, table):
                del deadline[id(c)]
            elif id(c) not in killed and (_hurry or now >= deadline[id(c)]):
                _signal(c, signal.SIGKILL, table)
                killed[id(c)] = now
            elif id(c) in killed:
                if now - killed[id(c)] > KILL_WAIT_S:
                    del deadline[id(c)]  # unkillable (uninterruptible sleep): give up
                else:
                    _signal(c, signal.SIGKILL, table)  # members that joined meanwhile
    for p in popens:
        _forget(p)


def stop_all(grace: float | None = None) -> None:
    """Stop every registered child that still runs (atexit)."""
    with _lock:
        todo = [c.popen for c in _children]
    if todo:
        stop(todo, grace)


def children() -> list[subprocess.Popen]:
    """The registered children (for tests and diagnostics)."""
    with _lock:
        return [c.popen for c in _children]


if __name__ == "__main__":
    sys.exit("bench/_children.py is a library for the bench scripts")
