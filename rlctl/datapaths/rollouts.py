"""The rollouts data path: collector c pushes [T(+1), envs] rollouts of one policy version to learner rank
c mod ranks, which stacks its share into a batch (synchronously: one of the current version per own collector).
In an elastic world every collector pushes to rank 0, which deals each round's rollouts to the ranks present."""

from __future__ import annotations

from rlctl.datapaths import DataPath, PathPlan


class RolloutPath(DataPath):
    """Collectors -> learner ranks, no processes in between."""

    name = "rollouts"
    required_fields = ("rollout_len",)
    message_kind = "rollout"
    # obs stacked (and rebuilt from frames), action checked, reward counted, valid gating samples and losses.
    message_fields = ("obs", "action", "reward", "valid")

    def message_layout(self, actor, job, info) -> dict:
        """`actor.layout(rollout_len, info)`: field -> (rows, per-env shape, dtype) of a [rows, envs, ...] rollout."""
        return actor.layout(job.algorithm.rollout_len, info)

    def requirements(self, entry):
        """Every algorithm: `rollout_len`. Asynchronous ones also gather `rollouts_per_update(envs)` rollouts per
        batch within `max_policy_lag` versions."""
        if entry.synchronous:
            return self.required_fields, ()
        return (*self.required_fields, "max_policy_lag"), ("rollouts_per_update",)

    def min_collectors(self, job) -> int:
        """One collector per learner rank at least: each rank learns from its own collectors' rollouts."""
        return job.max_world_ranks

    def check_collectors(self, job) -> None:
        """At least one collector per learner rank (of the largest group: spare hosts wait outside it)."""
        ranks = job.max_world_ranks
        if job.collector_count < ranks:
            where = "hosts" if job.hosts else "topology.collectors"
            raise ValueError(f"{where}: {job.algorithm.name} sends each collector's rollouts to one learner rank, so it "
                             f"needs at least one collector per rank ({job.collector_count} < {ranks})")

    def check_hosts(self, job) -> None:
        """No host runs replay shards: nothing would use them."""
        for i, h in enumerate(job.hosts):
            if h.replay_shards:
                raise ValueError(f"hosts[{i}].replay_shards: {job.algorithm.name} learns from rollouts, not "
                                 f"replay, so {h.name!r} would run shards that nothing uses (set 0)")

    def warnings(self, job) -> list[str]:
        """Asynchronous algorithms: rollouts that would arrive older than `max_policy_lag` (and be dropped)."""
        algo = job.algorithm
        if job.algorithm_entry.synchronous:
            return []
        # While a collector takes one rollout, its rank receives one from each of its collectors and so makes this
        # many updates: the lag a rollout arrives with, about.
        per_rank = -(-job.collector_count // job.max_world_ranks)
        per_update = algo.rollouts_per_update(job.env.envs_per_collector)
        lag = per_rank / per_update
        if lag <= algo.max_policy_lag:
            return []
        return [f"{per_rank} collectors per learner rank and {per_update} rollouts per update: rollouts arrive about "
                f"{lag:.0f} versions old, past algorithm.max_policy_lag = {algo.max_policy_lag}, so most would be "
                f"dropped; raise max_policy_lag to {int(lag + 0.999) + 2} or algorithm.batch_steps"]

    def port_groups(self, job) -> tuple[int, int]:
        """One PULL port per learner rank."""
        return job.learner_ranks, 1

    def plan(self, job, hosts, ports, addr, bind) -> PathPlan:
        """Rank r binds `rollouts-r` on its learner node; collectors reach every rank's endpoint."""
        nodes = [h for h in hosts if h.learner]
        out = PathPlan(endpoints={"rollouts": []})
        for rank, (port,) in enumerate(ports):
            node = nodes[job.learner_node_of(rank)]
            out.endpoints["rollouts"].append(f"tcp://{addr(node)}:{port}")
            out.rank_binds[rank] = {f"rollouts-{rank}": f"tcp://{bind(node)}:{port}"}
        return out

    def learner_source(self, net, rc, job, info, rank, world, device):
        """This rank's share of the collectors' rollouts, stacked on `device`. Each rank binds the socket of its
        place in the plan (its node's first rank + its local rank), which in an elastic world may differ from its
        rank in the round: rank 0 learns the others' from all of them and deals to those."""
        from rlctl.datapaths.rollout_source import RolloutSource

        slot = job.first_rank_of(rc.learner_node) + rc.local_rank
        dealt_to = None
        if job.elastic_learners and world > 1:
            import torch.distributed as dist

            slots: list = [None] * world
            dist.all_gather_object(slots, slot)
            dealt_to = [rc.endpoints["rollouts"][s] for s in slots[1:]] if rank == 0 else None
        return RolloutSource(net, rc.binds[f"rollouts-{slot}"], job, info, job.algorithm_entry.load("actor").layout,
                             rank, world, device, dealt_to)

    def senders(self, net, endpoints, job, info, name, collector=None):
        """A PUSH per learner rank (an inference server, for all its collectors), or collector `collector`'s one;
        in an elastic world rank 0's alone, which deals the rollouts to the ranks present."""
        from rlctl.datapaths.rollout_source import rollout_buffer_bytes
        from rlctl.datapaths.sender import ExperienceSender

        ranks = endpoints["rollouts"][:1] if job.elastic_learners else endpoints["rollouts"]
        chosen = ranks if collector is None else [ranks[collector % len(ranks)]]
        return [ExperienceSender(net, ep, name, self.message_kind, rollout_buffer_bytes(job, info)) for ep in chosen]
