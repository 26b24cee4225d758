"""Data paths as plug-ins: how experience travels from collectors to learner ranks, the only place that knows them
by name.

A `DataPath` owns everything of one path: the `[algorithm]` fields it reads (checked when the registry loads), its
job checks and warnings, its processes, ports and endpoints in the launch plan, the learner's source of batches,
the collector's (and inference server's) sender and the message kind it sends. An algorithm's registry entry
(rlctl.algos) names its path; everything else calls the path instead of branching on its name.

* `replay` (rlctl.datapaths.replay): collectors -> replay shards -> sampled batches, priorities back;
* `rollouts` (rlctl.datapaths.rollouts): collector c -> learner rank c mod ranks, [T(+1), B] rollouts (in an
  elastic world every collector -> rank 0, which deals them to the ranks present).

Who may import this package: the job schema, the plan, the registry and the roles. This module and the two path
modules are light (pydantic-free, no torch): the CLI path loads them. Runtime parts (sockets, torch) live in
`replay_runtime` and `rollout_runtime`, imported only by the methods that build them.

Adding a path = a module here with a `DataPath` subclass, one entry in `DATA_PATHS`, tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class PathProcess:
    """One process a data path adds to the plan (e.g. a replay shard): its role, the host it runs on, the module it
    runs and the sockets it binds (name -> endpoint)."""

    role: str
    rank: int
    host: Any  # spec.HostSpec
    module: str
    binds: dict[str, str]


@dataclass
class PathPlan:
    """A data path's part of the launch plan: endpoints every process reads (RLCTL_ENDPOINTS), the processes it
    adds, and sockets learner ranks bind (global rank -> name -> endpoint)."""

    endpoints: dict[str, object] = field(default_factory=dict)
    processes: list[PathProcess] = field(default_factory=list)
    rank_binds: dict[int, dict[str, str]] = field(default_factory=dict)


class DataPath:
    """How experience travels for the algorithms whose registry entry names this path."""

    name: str = ""
    # The `[algorithm]` section's fields and methods this path reads; every algorithm on the path must have them.
    required_fields: tuple[str, ...] = ()
    required_methods: tuple[str, ...] = ()
    # Job-file sections only this path reads (`rlctl init` leaves them out for other algorithms).
    sections: tuple[str, ...] = ()
    # The process role this path starts per shard (`hosts[].replay_shards`, `topology.replay_shards`), or "".
    shard_role: str = ""
    shard_module: str = ""  # what a shard process runs (`python -m`)
    message_kind: str = ""  # kind of what actor cores' take() returns on this path (the collector's messages)
    # The fields every message of the path carries (the shells read them: `reward` counts what was sent).
    message_fields: tuple[str, ...] = ()

    def requirements(self, entry) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(fields, methods) the `[algorithm]` section of registry entry `entry` must have on this path."""
        return self.required_fields, self.required_methods

    def check_section(self, entry, section: type) -> None:
        """Raise TypeError when registry entry `entry`'s `[algorithm]` model lacks what this path reads (a registry
        mistake, found when the registry loads rather than in the middle of a run)."""
        fields, methods = self.requirements(entry)
        known = getattr(section, "model_fields", {})
        missing = [f for f in fields if f not in known] + [m for m in methods if not callable(getattr(section, m, None))]
        if missing:
            raise TypeError(f"algorithm {entry.name!r}: its [algorithm] section {section.__name__} lacks "
                            f"{', '.join(missing)}, which the {self.name!r} data path reads")

    def message_layout(self, actor: type, job, info) -> dict:
        """The actor core's declared layout of one message on this path (field -> shape and dtype)."""
        raise NotImplementedError

    def check_actor(self, entry, actor: type, job, info) -> None:
        """Raise TypeError when registry entry `entry`'s actor core does not declare a layout with this path's
        `message_fields` (run by the tests for every algorithm; loading an actor imports torch)."""
        try:
            fields = set(self.message_layout(actor, job, info))
        except (AttributeError, NotImplementedError) as exc:
            raise TypeError(f"algorithm {entry.name!r}: {actor.__name__} declares no message layout for the "
                            f"{self.name!r} data path ({exc})") from None
        missing = [f for f in self.message_fields if f not in fields]
        if missing:
            raise TypeError(f"algorithm {entry.name!r}: {actor.__name__}'s layout lacks {', '.join(missing)}, which "
                            f"the {self.name!r} data path reads")

    # -- job checks (spec.JobSpec's validators call these; messages start with the key path) --
    def min_collectors(self, job) -> int:
        """Collectors the job needs at least."""
        return 1

    def check_collectors(self, job) -> None:
        """Raise ValueError when the job's collectors cannot feed this path."""

    def check_hosts(self, job) -> None:
        """Raise ValueError when `[[hosts]]` place this path's processes wrongly."""

    def check_algorithm(self, job) -> None:
        """Raise ValueError when the `[algorithm]` settings cannot work on this path."""

    def warnings(self, job) -> list[str]:
        """What in the job works against learning on this path, each with a suggestion."""
        return []

    # -- placement --
    def shard_count(self, job) -> int:
        """Processes of `shard_role` the job runs in all (0 when the path has none)."""
        return 0

    def port_groups(self, job) -> tuple[int, int]:
        """(groups, ports per group) of the job's range this path binds, right after control/weights/rendezvous."""
        return 0, 0

    def plan(self, job, hosts: list, ports: list[list[int]], addr: Callable, bind: Callable) -> PathPlan:
        """Endpoints, processes and learner binds from the placed `hosts`, this path's `ports` (per group) and
        `addr(host)` / `bind(host)` (the address others reach a host at, the one it binds)."""
        raise NotImplementedError

    # -- runtime (imports torch and ZeroMQ when called) --
    def learner_source(self, net, rc, job, info, rank: int, world: int, device):
        """The learner rank's source of batches: `sock`, `take(version)`, `feedback(batch, result)`, `metrics()`."""
        raise NotImplementedError

    def senders(self, net, endpoints: dict, job, info, name: str, collector: int | None = None) -> list:
        """PUSH senders (rlctl.datapaths.sender.ExperienceSender) for process `name`: collector c's experience goes
        through `senders[c % len(senders)]`; with `collector` given, only the one that collector uses."""
        raise NotImplementedError


REPLAY, ROLLOUTS = "replay", "rollouts"


def _paths() -> dict[str, DataPath]:
    from rlctl.datapaths.replay import ReplayPath
    from rlctl.datapaths.rollouts import RolloutPath

    return {REPLAY: ReplayPath(), ROLLOUTS: RolloutPath()}


DATA_PATHS: dict[str, DataPath] = _paths()


def data_path(name: str) -> DataPath:
    """The data path registered as `name`."""
    return DATA_PATHS[name]
