"""Port ranges promised to runs started on this machine that have not bound them yet.

Two `rlctl run`s (or a run beside a sweep's trials) started at the same moment each found the same range free, and
the second's servers failed with "Address already in use". `choose_base_port` now claims the range it picks in a
small machine-wide file, under a lock, and skips ranges others claimed. A claim lapses after CLAIM_TTL_S: by then
the run's servers have bound their ports (or never will), and a bound port is not free anyway.

The file is read as hostile (another user's, or a broken one): anything that is not a map of port to expiry time
is ignored, and claims are skipped altogether where the folder is not this user's own.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CLAIM_TTL_S = 300.0


def claims_dir() -> Path:
    """This user's folder for the claims file (in the temp folder: machine-wide, gone after a reboot)."""
    return Path(tempfile.gettempdir()) / f"rlctl-{os.getuid()}"


def _own_private_dir(path: Path) -> bool:
    """Make `path` (mode 0700) if missing; True when it is a real folder of this user's, not a link."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


class ClaimBook:
    """The live claims: port -> when its claim lapses (epoch seconds)."""

    def __init__(self, raw: object, now: float):
        self.now = now
        entries = raw.items() if isinstance(raw, dict) else ()
        self.until = {int(p): float(t) for p, t in entries
                      if isinstance(p, str) and p.isdigit() and 0 < int(p) < 65536
                      and isinstance(t, (int, float)) and not isinstance(t, bool) and now < t < now + 2 * CLAIM_TTL_S}

    @property
    def ports(self) -> frozenset[int]:
        """Every port claimed now."""
        return frozenset(self.until)

    def claim(self, ports: range) -> None:
        """Claim `ports` for the next CLAIM_TTL_S."""
        for port in ports:
            self.until[port] = self.now + CLAIM_TTL_S

    def to_json(self) -> str:
        """The file's text."""
        return json.dumps({str(p): t for p, t in sorted(self.until.items())})


@contextmanager
def port_claims() -> Iterator[ClaimBook | None]:
    """The claims, held under the machine-wide lock until the block ends (then written back); None where they
    cannot be kept (the folder is not this user's), and choosing goes on without them."""
    folder = claims_dir()
    if not _own_private_dir(folder):
        yield None
        return
    path = folder / "port-claims.json"
    with open(folder / "port-claims.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            raw = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):
            raw = {}
        book = ClaimBook(raw, time.time())
        yield book
        tmp = path.with_suffix(".tmp")
        tmp.write_text(book.to_json())
        os.replace(tmp, path)
