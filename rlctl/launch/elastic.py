"""Elastic learners: torchrun's c10d rendezvous, with learner nodes ranked in plan order.

torch's dynamic rendezvous numbers the nodes of each round by their descriptors (address, pid, a counter), so rank 0
lands on whichever node's address sorts first. rlctl's plan has rank 0 on the head, the learner host whose weights
port collectors subscribe to and whose board its own processes read, and the head's agent hosts the rendezvous
store. Here each agent's descriptor carries its plan node (RLCTL_RANK of a learner node) and sorts by it first,
so rank 0 is on the head while the head takes part, and the other nodes follow in plan order.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _NodeDescGenerator


@dataclass(eq=True, frozen=True)
class PlannedNode(_NodeDesc):
    """A rendezvous participant that sorts by its plan node first (a descriptor of this module, so the state the
    agents share unpickles to it on every node)."""

    node: int = 0

    def _key(self) -> tuple:
        return self.node, self.addr, self.pid, self.local_id

    def __lt__(self, other: _NodeDesc) -> bool:
        return self._key() < (getattr(other, "node", 0), other.addr, other.pid, other.local_id)


class PlannedNodeGenerator(_NodeDescGenerator):
    """Descriptors of this agent's node, numbered as the plan numbers learner nodes."""

    def __init__(self, node: int):
        super().__init__()
        self.node = node

    def generate(self, local_addr: str | None = None) -> _NodeDesc:
        """The next descriptor, with the plan node."""
        plain = super().generate(local_addr)
        return PlannedNode(plain.addr, plain.pid, plain.local_id, self.node)


def rank_nodes_in_plan_order() -> None:
    """Make this agent's rendezvous descriptors carry its plan node, the workers' store theirs alone, and each
    round's membership a line of the node's log.

    The workers of each round start a store of their own (on rank 0's node, at a free port), instead of sharing the
    agent's across rounds: after a node left, the new round's ranks would otherwise find the old round's keys there
    under the same restart count (torchrun counts failures, not membership changes) and connect to dead peers."""
    node = int(os.environ.get("RLCTL_RANK", "0"))
    dynamic_rendezvous.DynamicRendezvousHandler._node_desc_generator = PlannedNodeGenerator(node)
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # Each round in the node's log ("... has joined round 3 of the rendezvous ... as rank 1 in a world of size 2"):
    # how a user sees why a world changed. torchrun's agent shows only warnings by default.
    logging.getLogger(dynamic_rendezvous.__name__).setLevel(logging.INFO)
