"""torchrun whose workers are forked from its agent, so a learner imports torch once instead of twice.

`python -m rlctl.launch.torchrun [torchrun options] --start-method fork -m rlctl.roles.learner` is torchrun itself (its
argument parser, elastic agent, rendezvous and restarts). The one difference: with `--start-method fork` the
module is imported here, in the agent, and each worker is forked from it and runs the module's file in place
(torchrun's `--run-path`), instead of being a fresh `python -m` that imports torch and the learner again. On a
2-core machine that second import is 1.5-2 s on the path from `rlctl run` to the first env step. With a CUDA build
of torch the workers are spawned as by plain torchrun: on a GPU machine (an H200) the forked ranks failed with
"Cannot re-initialize CUDA in forked subprocess", the agent having touched CUDA before forking.
"""

from __future__ import annotations

import gc
import importlib
import os
import signal
import socket
import sys
import threading

from rlctl.tether import tether_to_supervisor

tether_to_supervisor()  # before torch's import: the agent ends with its supervisor, and torchrun ends its ranks

import torch  # noqa: E402
from torch.distributed.run import parse_args, run  # noqa: E402


def bind_rendezvous_to_its_address() -> None:
    """torchrun's rendezvous store (static, or elastic c10d) listens on every interface; make it listen on the
    rendezvous address only (127.0.0.1 for a job on one machine), through a socket bound here and handed over
    (TCPStore master_listen_fd)."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, static_tcp_rendezvous

    def store(host, port, world_size=None, is_master=False, *args, **kwargs):
        if is_master and "master_listen_fd" not in kwargs:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            listener = socket.create_server((host, port), family=family, backlog=1024)
            kwargs["master_listen_fd"] = listener.detach()  # the store owns the descriptor from here on
        return TCPStore(host, port, world_size, is_master, *args, **kwargs)

    static_tcp_rendezvous.TCPStore = c10d_rendezvous_backend.TCPStore = store


def main(argv: list[str] | None = None) -> None:
    """Parse torchrun's arguments and launch; a module run with fork start becomes an in-place run of its file."""
    # The ranks stop by themselves when the supervisor dies; this agent ends them with SIGTERM (its own handler
    # kills the workers) if they have not, then exits.
    from rlctl.roles.supervisor_watch import ORPHAN_GRACE_S, watch_supervisor

    watch_supervisor(lambda: threading.Timer(ORPHAN_GRACE_S - 1.0, os.kill, (os.getpid(), signal.SIGTERM)).start(),
                     grace_s=ORPHAN_GRACE_S + 0.5)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    bind_rendezvous_to_its_address()
    if args.rdzv_backend == "c10d":
        from rlctl.launch.elastic import rank_nodes_in_plan_order

        rank_nodes_in_plan_order()
    if args.start_method == "fork" and torch.version.cuda is not None:
        # A CUDA build of torch: CUDA is unusable in a child forked after the agent touched it, so ranks start as
        # fresh processes.
        args.start_method = "spawn"
    if args.module and args.start_method == "fork":
        module = importlib.import_module(args.training_script)
        args.module, args.run_path, args.training_script = False, True, module.__file__
        gc.freeze()  # as the fork server does: a rank's full collections neither scan nor copy the imported heap
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        run(args)  # a failed worker raises ChildFailedError: torchrun's error report and exit 1
    except SignalException as exc:
        # SIGTERM (the supervisor's fallback, Slurm's, or the kernel's once the supervisor is gone): the agent has
        # ended its workers already. Exit as a process the signal ended (128 + N), which the supervisor restarts
        # outside a stop, where torchrun's exit 1 says it gave up on failing ranks and fails the run; and without
        # torchrun's traceback and the interpreter's teardown (0.5 s after the last worker).
        print(f"torchrun agent stopped by signal {int(exc.sigval)}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(128 + int(exc.sigval))
    # Every worker has ended and the agents have passed torchrun's exit barrier: skip the interpreter's teardown of
    # torch (0.3-0.5 s that every stop of the run would wait for).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
