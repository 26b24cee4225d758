"""The job's contiguous port range, laid out once: the job schema checks its size, the launch plan binds it."""

from __future__ import annotations


class PortLayout:
    """Ports from `base` in this order: control, weights, rendezvous, the data path's groups (e.g. two per replay
    shard, or one per learner rank for rollouts), one per inference server, the weights relays' tree (each relay with
    relays below it binds it on its own host), the sealed weights' bulk sockets (rank 0's, the tree's:
    rlctl.net.sealed), and one spare."""

    def __init__(self, job, base: int):
        self.base = base
        ports = iter(range(base, 1 << 30))
        self.control, self.weights, self.rendezvous = next(ports), next(ports), next(ports)
        groups, per_group = job.data_path.port_groups(job)
        self.data = [[next(ports) for _ in range(per_group)] for _ in range(groups)]
        self.inference = [next(ports) for _ in range(job.inference_server_count)]
        self.relay_tree = next(ports)
        self.weights_bulk, self.relay_tree_bulk = next(ports), next(ports)
        self.size = next(ports) + 1 - base  # the spare included
