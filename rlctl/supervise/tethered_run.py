"""`python -m rlctl.supervise.tethered_run PARENT_PID RUN_DIR`: a prepared run's supervisor that ends with the
process that started it (a sweep's scheduler): when that process exits, however it ends, the kernel sends this one
SIGTERM, which the supervisor takes as `rlctl stop` (a last checkpoint, every process gone, the run `stopped`)."""

from __future__ import annotations

import sys

from rlctl.tether import tether_to

if __name__ == "__main__":
    tether_to(int(sys.argv[1]))  # first: a scheduler killed during this start-up must not leave a run behind
    from rlctl.supervise.loop import supervise_rundir
    from rlctl.views.console import progress_printer

    sys.exit(supervise_rundir(sys.argv[2], display=progress_printer()))
