"""A local process's watch on the supervisor that started it: when that supervisor dies, the process says so in its
log and stops by itself."""

from __future__ import annotations

import os
import select
import threading
import time

from rlctl import events
from rlctl.liveness import pid_alive
from rlctl.net import wire
from rlctl.run_logs import stamp
from rlctl.tether import SUPERVISOR_PID_ENV

LOG_FILE_ENV = "RLCTL_LOG_FILE"
ORPHAN_GRACE_S = 4.0  # a process whose supervisor died stops by itself; past this it exits at once


class SupervisorWatch:
    """Notices the death of the local supervisor (SIGKILL, OOM) once, from whichever comes first: its own thread,
    woken the moment the supervisor exits, or a stop signal that the death caused (`notice_if_gone`). A learner rank
    hears both at once: torchrun's agent, tethered to the supervisor, is SIGTERMed by the kernel and SIGTERMs its
    ranks; a rank that stopped on that signal before its watch thread ran left no word of why in its log."""

    def __init__(self, pid: int, on_gone, grace_s: float = ORPHAN_GRACE_S):
        self.pid = pid
        self.on_gone = on_gone
        self.grace_s = grace_s
        self.log_file = os.environ.get(LOG_FILE_ENV)
        self.noticed = False
        self._lock = threading.RLock()  # re-entrant: a second signal may arrive while the first one's notice runs
        try:
            self._fd: int | None = os.pidfd_open(pid)  # race-free: readable the moment that very process exits
            self._polled = False
        except ProcessLookupError:
            self._fd, self._polled = None, False  # gone already
        except OSError:  # no pidfd (old kernel): look by pid
            self._fd, self._polled = None, True

    def gone(self) -> bool:
        """True once the supervisor has exited, or its main thread has (checked without blocking)."""
        if self._fd is not None:
            return bool(select.select([self._fd], [], [], 0)[0]) or self._leader_exited()
        return not (self._polled and pid_alive(self.pid))

    def _leader_exited(self) -> bool:
        """The supervisor's main thread has exited (a zombie leader). The kernel sends a child's PR_SET_PDEATHSIG when
        the thread that started it exits, while the pidfd turns readable only after the last thread: a SIGKILLed
        supervisor whose other threads took a while to die (one inside an fsync) SIGTERMed the fork server, the
        agent and through them every rank and collector while it still looked alive."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:  # the pid is ours until reaped: the pidfd is not readable
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state in (b"Z", b"X")

    def notice_if_gone(self) -> None:
        """Notice now if the supervisor has exited (for a signal handler: the signal may be the death's echo)."""
        if self.gone():
            self.notice()  # waits for the watch thread's notice, if that one began first

    def notice(self) -> None:
        """Once: output into the log file (the pipe to the supervisor died with it), the `exit` event saying why,
        then `on_gone()`."""
        with self._lock:
            if self.noticed:
                return
            self.noticed = True
            if self.log_file:
                try:
                    out = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                    os.dup2(out, 1)
                    os.dup2(out, 2)
                    os.close(out)
                except OSError:
                    pass
            why = f"supervisor (pid {self.pid}) is gone: stopping"
            line = events.line("exit", reason=events.EXIT_SUPERVISOR_GONE, detail=why)
            # Past sys.stdout's buffer: a signal handler's print into a write it interrupted raises RuntimeError.
            try:
                os.write(1, f"{stamp()} {line}\n".encode())
            except OSError:  # no log file to turn to: the dead pipe
                pass
            wire.drop_unsent_on_close()
            self.on_gone()

    def start(self) -> threading.Thread:
        """Watch from a daemon thread: notice the death, then exit the process after the grace if it has not."""
        thread = threading.Thread(target=self._wait, name="supervisor-watch", daemon=True)
        thread.start()
        return thread

    def _wait(self) -> None:
        if self._fd is not None:
            select.select([self._fd], [], [])
        while self._polled and pid_alive(self.pid):
            time.sleep(0.25)
        self.notice()
        time.sleep(self.grace_s)
        os._exit(3)


def watch_supervisor(on_gone, grace_s: float = ORPHAN_GRACE_S) -> SupervisorWatch | None:
    """When the local supervisor that started this process dies, call `on_gone()` so the process stops by itself
    (final checkpoint, snapshot), and exit it after `grace_s` if it has not. From then on its stdout and stderr go
    to its log file. None where no supervisor is named."""
    try:
        pid = int(os.environ.get(SUPERVISOR_PID_ENV, ""))
    except ValueError:
        return None
    watch = SupervisorWatch(pid, on_gone, grace_s)
    watch.start()
    return watch
