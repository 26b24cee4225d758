"""The replay data path: collectors push transitions (or sequences) to replay shards; each learner rank samples
prioritized batches from its shard(s) and sends new priorities back."""

from __future__ import annotations

from rlctl.datapaths import DataPath, PathPlan, PathProcess
from rlctl.role_names import Role

# Items a replay shard serves per sample request (rlctl.roles.replay refuses larger ones). Here, in a light module,
# so that the job schema checks `algorithm.batch_size` against it without importing the shard.
MAX_SAMPLE = 1 << 16


class ReplayPath(DataPath):
    """Collectors -> replay shards -> sampled batches; the plan starts the shards."""

    name = "replay"
    required_fields = ("batch_size", "prefetch")
    sections = ("replay",)
    shard_role = Role.REPLAY_SHARD
    shard_module = "rlctl.roles.replay"
    message_kind = "experience"
    message_fields = ("reward",)

    def message_layout(self, actor, job, info) -> dict:
        """`actor.item_layout(job, info)`: one stored item's fields -> (shape, dtype); shards take it (+ priority)."""
        return actor.item_layout(job, info)

    def check_hosts(self, job) -> None:
        """Some host must run a shard."""
        if sum(h.replay_shards for h in job.hosts) == 0:
            raise ValueError(f"hosts: algorithm {job.algorithm.name!r} needs replay: give some host replay_shards >= 1")

    def check_algorithm(self, job) -> None:
        """Collectors to fill the shards, and batches a shard serves."""
        if job.collector_count == 0:
            where = "hosts" if job.hosts else "topology.collectors"
            raise ValueError(f"{where}: {job.algorithm.name} needs at least one collector to fill its replay shards"
                             + ("; give some host collectors >= 1" if job.hosts else ""))
        batch = job.algorithm.batch_size
        if batch > MAX_SAMPLE:
            raise ValueError(f"algorithm.batch_size: {batch} is more than a replay shard serves per request "
                             f"({MAX_SAMPLE}); every sample request would be dropped")

    def shard_count(self, job) -> int:
        """`hosts[].replay_shards` summed, else `topology.replay_shards` (default: one per learner rank)."""
        if job.hosts:
            return sum(h.replay_shards for h in job.hosts)
        return job.topology.replay_shards or job.learner_ranks

    def port_groups(self, job) -> tuple[int, int]:
        """Two ports per shard: experience in, sample requests."""
        return job.replay_shard_count, 2

    def plan(self, job, hosts, ports, addr, bind) -> PathPlan:
        """One shard process per `replay_shards` of each host; every collector reaches every shard."""
        out = PathPlan(endpoints={self.shard_role: []})
        shards = [h for h in hosts for _ in range(h.replay_shards)]
        for rank, (h, (exp, smp)) in enumerate(zip(shards, ports)):
            out.endpoints[self.shard_role].append({"experience": f"tcp://{addr(h)}:{exp}",
                                                   "sample": f"tcp://{addr(h)}:{smp}"})
            out.processes.append(PathProcess(self.shard_role, rank, h, self.shard_module,
                                             {"experience": f"tcp://{bind(h)}:{exp}", "sample": f"tcp://{bind(h)}:{smp}"}))
        return out

    def learner_source(self, net, rc, job, info, rank, world, device):
        """Batches sampled from this rank's shard(s)."""
        from rlctl.datapaths.replay_source import ReplaySource

        return ReplaySource(net, rc.endpoints[self.shard_role], job, info, rank, world, rc.name)

    def senders(self, net, endpoints, job, info, name, collector=None):
        """One PUSH to every shard (ZeroMQ spreads batches over the shards that have room)."""
        from rlctl.net import wire
        from rlctl.datapaths.sender import ExperienceSender

        return [ExperienceSender(net, [r["experience"] for r in endpoints[self.shard_role]], name, self.message_kind,
                                 wire.experience_buffer_bytes(info.obs_bytes))]
