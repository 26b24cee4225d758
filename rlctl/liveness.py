"""Is a process, or a process group, alive, and is a pid still the process it was: read from /proc and signal 0.

On the fast CLI path (`rlctl status/stop`): standard library only.
"""

from __future__ import annotations

import os


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
