"""A local process ends with the supervisor that started it, from its first line on.

The supervisor's watch in each role (roles/context.py) starts only once the role has imported torch: on a
2-core machine with every process starting at once that is 8-12 s, in which a supervisor killed during start-up
left its processes running (and a learner could still initialise after it was gone). Here the kernel is asked
first thing for SIGTERM when the parent exits (PR_SET_PDEATHSIG): before the role installs its stop flag that
ends the process at once; after, it is the same graceful stop as the watch's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

SUPERVISOR_PID_ENV = "RLCTL_SUPERVISOR_PID"  # set by the supervisor for local processes only
PR_SET_PDEATHSIG = 1


def tether_to_supervisor() -> None:
    """SIGTERM this process when its parent (the supervisor, or the fork server that lives as long as it) exits;
    exit now if the supervisor is gone already. A no-op outside Linux or without a supervisor."""
    try:
        supervisor = int(os.environ.get(SUPERVISOR_PID_ENV, ""))
    except ValueError:
        return
    tether_to(supervisor)


def tether_to(parent: int) -> None:
    """SIGTERM this process when its parent exits (PR_SET_PDEATHSIG); exit now if `parent` is gone already. A no-op
    outside Linux."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    try:
        os.kill(parent, 0)  # it may have died before the request above was in place
    except ProcessLookupError:
        os._exit(3)
    except PermissionError:
        pass
