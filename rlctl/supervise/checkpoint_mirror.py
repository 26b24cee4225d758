"""A run's checkpoints kept on the launching machine while it runs, and sent where they are read at its start.

A learner's rank 0 or an evaluator on an SSH host writes its checkpoints there (remote_checkpoint_dir). Fetched
only at the run's end (remote_cleanup), they would be lost with a host lost mid-run, and a run resumed with its
learner head on another host would start there from nothing, silently. So:

- at the start of each segment, the newest checkpoints of the run directory go to the SSH hosts of the learner's
  head and of the evaluator, where a copy as new is kept (`rlctl.launch.remote push`): a resumed run whose head
  moved to another host continues where it was; a head host they cannot reach fails the start, loudly;
- while the run goes, every `logging.checkpoint_interval_s` (5 s at least), what those hosts wrote since comes
  home, in a thread of its own (one SSH call per host): a host lost for good costs about one interval of learning,
  not the run.

Checkpoints only: replay snapshots can be gigabytes; they come home at the run's end (remote_cleanup), and a lost
host's are lost with it.

Newer means a later modification time, the writer's clock kept along the way. SSH hosts only: a Slurm node's working
directory is expected on the cluster's shared filesystem, where the next allocation finds the checkpoints.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rlctl.job.spec import HostSpec, JobSpec
from rlctl.launch.hosts import pull_newer, push_directory
from rlctl.launch.remote import folder_files, remote_checkpoint_dir
from rlctl.role_names import Role

# Checkpoints (latest.pt, ckpt-N.pt, best.pt), not the replay snapshots beside them (replay-N.npz): those can be
# gigabytes, and come home at the run's end.
CHECKPOINT_SUFFIX = ".pt"
MIN_INTERVAL_S = 5.0  # an ssh and a python on the host per pull: not every second, whatever the checkpoints do
PULL_TIMEOUT_S = 60.0  # one host's pull in the mirror (the run's end fetches again, with retries)


class CheckpointsNotSent(RuntimeError):
    """The head's host could not take the run's checkpoints: its learner would start from nothing."""


def checkpoints_to_send(home: Path) -> list[str]:
    """The files a host needs to continue the run: every checkpoint but the numbered ones, of which the newest
    (a fallback for an unreadable latest.pt)."""
    names = [p.name for p in folder_files(home) if p.name.endswith(CHECKPOINT_SUFFIX)]
    numbered = sorted(n for n in names if n.startswith("ckpt-"))
    return [n for n in names if not n.startswith("ckpt-")] + numbered[-1:]


def writer_hosts(processes) -> set[str]:
    """Hosts of the processes (ProcessSpecs) that write checkpoints: the learner's head (rank 0 on node 0) and the
    evaluator."""
    return {p.host for p in processes if p.role == Role.EVALUATOR or (p.role == Role.LEARNER and p.rank == 0)}


class CheckpointMirror:
    """The run's checkpoints between its run directory and its SSH hosts."""

    def __init__(self, spec: JobSpec, run_id: str, home: Path):
        self.interval = max(spec.logging.checkpoint_interval_s, MIN_INTERVAL_S)
        self.remote_dir, self.home = remote_checkpoint_dir(run_id), home
        self.hosts: dict[str, HostSpec] = {h.name: h for h in spec.hosts if not h.is_local and h.slurm_job is None}
        self.since: dict[str, float] = {}  # host -> the newest modification time it is known to have sent or got
        self.next_at = 0.0
        self.record: dict = {}  # state.json's `checkpoints_home`: the last one that came, and errors
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def seed(self, processes, log) -> None:
        """Before anything starts: the run directory's checkpoints to the writers' SSH hosts. CheckpointsNotSent when
        the learner head's host cannot take them; an evaluator's host that cannot is a log line."""
        names = checkpoints_to_send(self.home)
        self.next_at = time.time() + self.interval
        if not names:
            return
        head = next((p.host for p in processes if p.role == Role.LEARNER and p.rank == 0), None)
        hosts = [self.hosts[n] for n in sorted(writer_hosts(processes)) if n in self.hosts]
        newest = max((self.home / n).stat().st_mtime for n in names)
        for name, result in push_directory(hosts, self.home, names, self.remote_dir).items():
            if isinstance(result, str):
                if name == head:
                    raise CheckpointsNotSent(f"could not send the run's checkpoints to {name}, the learner head's "
                                             f"host: {result}; its learner would start from nothing")
                log(f"could not send the run's checkpoints to {name}: {result}")
                continue
            self.since[name] = newest
            log(f"checkpoints sent to {name}: " + (", ".join(result) or f"its own are as new ({', '.join(names)})"))

    def due(self, now: float) -> bool:
        """An interval has passed since the last pull began, and it is over."""
        return bool(self.hosts) and now >= self.next_at and not (self._thread is not None and self._thread.is_alive())

    def pull(self, now: float, processes, lost: set[str]) -> None:
        """What the writers' SSH hosts that are not `lost` wrote since comes home, in the background."""
        self.next_at = now + self.interval
        hosts = [self.hosts[n] for n in sorted(writer_hosts(processes) - lost) if n in self.hosts]
        if hosts:
            self._thread = threading.Thread(target=self._pull, args=(hosts,), daemon=True, name="rlctl-ckpt-mirror")
            self._thread.start()

    def _pull(self, hosts: list[HostSpec]) -> None:
        for h in hosts:
            got = pull_newer(h, self.remote_dir, self.home, self.since.get(h.name, -1.0), CHECKPOINT_SUFFIX,
                             timeout=PULL_TIMEOUT_S)
            with self._lock:
                errors = self.record.setdefault("errors", {})
                if isinstance(got, str):
                    errors[h.name] = got
                    continue
                errors.pop(h.name, None)
                if got:
                    self.since[h.name] = max(self.since.get(h.name, -1.0), *got.values())
                    self.record.update(at=time.time(), host=h.name, files=sorted(got))

    def close(self) -> None:
        """Wait for a pull under way (the run's end fetches everything after it)."""
        if self._thread is not None:
            self._thread.join(PULL_TIMEOUT_S + 5)

    def document(self) -> dict:
        """state.json's key: when checkpoints last came home, from where; hosts whose last pull failed."""
        with self._lock:
            record = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.record.items() if v}
        return {"checkpoints_home": record} if record else {}
