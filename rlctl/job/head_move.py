"""An elastic run whose head host is lost goes on with its learner head on another host: the job of its next segment.

The head, the first learner host, holds what cannot move within a segment: rank 0 (the weights endpoint, the
checkpoints, rollout dealing), the rendezvous store, and whatever else the job placed there. When its host is lost
for good (two starts of the head in a row cannot reach it over SSH), the supervisor ends the segment and starts the next
one at once (rlctl.supervise.loop.supervise_rundir), as `rlctl run --resume` with this job would: the next learner
host takes the head's place, the lost host's collectors, replay shards and evaluator with it, and the lost host
stays a learner node of its own, last, which joins the group once it answers again. The new head continues from the
newest checkpoint that came home (rlctl.supervise.checkpoint_mirror sends it there before anything starts).
"""

from __future__ import annotations

from rlctl.job.load import JobFileError, validate_job
from rlctl.job.resolved import host_secrets, resolved_dict, with_host_secrets
from rlctl.job.spec import JobSpec


class HeadNotMovable(Exception):
    """The job cannot go on without its head's host (the message says why)."""


def head_moved(spec: JobSpec, lost: str) -> JobSpec:
    """The job with its head on the next learner host (a non-spare one first) and what `lost` ran besides its
    learner node moved there; `lost` last among the hosts, a learner node alone. HeadNotMovable when `lost` is not
    an elastic group's head, or the job so changed is not valid (its reason)."""
    learners = [h for h in spec.hosts if h.learner]
    if not spec.elastic_learners or not learners or learners[0].name != lost:
        raise HeadNotMovable(f"{lost} is not the head of an elastic learner group")
    # An elastic group has another learner host (min_learner_nodes is below their number).
    heir = min(learners[1:], key=lambda h: h.spare).name
    data = resolved_dict(spec)  # hosts[].env masked: the secrets go back in below
    rows = {row["name"]: row for row in data["hosts"]}
    old, new = rows[lost], rows[heir]
    new.update(spare=False, collectors=new["collectors"] + old["collectors"],
               replay_shards=new["replay_shards"] + old["replay_shards"],
               evaluator=new["evaluator"] or old["evaluator"])
    old.update(collectors=0, replay_shards=0, evaluator=False)
    # The heir in the head's place, the others in their order (collector ranks stay where they were), the lost last.
    data["hosts"] = [new if row is old else row for row in data["hosts"] if row is not new] + [old]
    try:
        moved = validate_job(data, f"the job with its learner head on {heir}")
    except JobFileError as exc:
        raise HeadNotMovable(exc.render()) from None
    return with_host_secrets(moved, host_secrets(spec))
