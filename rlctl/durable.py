"""Durable file replacement: a kill or power loss at any moment leaves either the old file or the new one.

Write to a temporary file in the same directory, fsync it, rename it over the target, fsync the directory. Temporary
files are named `.<name>.<pid>.<thread>.tmp` (concurrent writers never share one), so the ones a killed writer left
behind are found and removed at the next start (`remove_temporaries`). Standard library only: `rlctl status` and the supervisor use it too.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path
from typing import Callable, BinaryIO

# Tests kill a writer between its fsync and its rename, the window a crash would hit:
# RLCTL_FAULT=kill-before-rename:<file name>:<k> kills the process at its k-th write of that file.
FAULT_ENV = "RLCTL_FAULT"
_writes: dict[str, int] = {}
_TEMPORARY = re.compile(r"^\..+\.(\d+)\.(\d+)\.tmp$")


def temporary_for(path: Path) -> Path:
    """The temporary file this process writes `path` through."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_file(path: str | Path, write: Callable[[BinaryIO], None], link_also: Path | None = None) -> Path:
    """Write `path` durably through `write(file)`; also hard-link the same bytes as `link_also` (a numbered copy).
    On any error the temporary file is removed and the previous `path` stays as it was. The file is private (0600)
    whatever the umask: everything written this way belongs to a run."""
    path = Path(path)
    tmp = temporary_for(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if os.environ.get(FAULT_ENV, "").startswith(f"kill-before-rename:{path.name}:"):
            _writes[path.name] = _writes.get(path.name, 0) + 1
            if str(_writes[path.name]) == os.environ[FAULT_ENV].rsplit(":", 1)[1]:
                os.kill(os.getpid(), signal.SIGKILL)
        if link_also is not None and not link_also.exists():
            os.link(tmp, link_also)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
    return path


def replace_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` durably."""
    return replace_file(path, lambda f: f.write(data))


def remove_temporaries(directory: str | Path) -> list[Path]:
    """Remove the temporary files that killed writers left in `directory` (not those of live writers)."""
    from rlctl.liveness import pid_alive  # here: rundir writes state.json through this module

    removed = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for p in entries:
        match = _TEMPORARY.match(p.name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and pid_alive(pid):
            continue
        try:
            p.unlink()
            removed.append(p)
        except OSError:
            pass
    return removed
