"""Which role holds the others back, from the waits the roles report: the learner's share of time waiting for data
(learner/data_wait_frac) against the collectors' share waiting for the learner side (collector/wait_frac: room in a
rate-limited replay shard or a busy learner's socket, the next weights, or in central inference their actions).

Plain data (the CLI path imports it): run-level metrics in, one line out.
"""

from __future__ import annotations

from rlctl import metric_names as M

WAITING = 0.25  # a role that waits this share of its time is held back by another


def _frac(metrics: dict, key: str) -> float | None:
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def verdict(metrics: dict) -> str | None:
    """"learner-bound: …", "collector-bound: …", "inference-bound: …" or "balanced: …"; None until both the learner
    and the collectors have reported their waits."""
    learner, collectors = _frac(metrics, M.DATA_WAIT_FRAC), _frac(metrics, M.COLLECTOR_WAIT_FRAC)
    if learner is None or collectors is None:
        return None
    data = "samples" if M.REPLAY_SIZE in metrics else "rollouts"
    central = M.INFERENCE_REQUESTS_PER_S in metrics
    if collectors >= WAITING and collectors > learner:
        if central:
            return f"inference-bound: collectors wait {collectors:.0%} for actions; learner waits {learner:.0%}"
        what = "replay room" if data == "samples" else "the learner"
        return f"learner-bound: collectors wait {collectors:.0%} for {what}; learner waits {learner:.0%}"
    if learner >= WAITING and learner > collectors:
        return f"collector-bound: learner waits {learner:.0%} for {data}; collectors wait {collectors:.0%}"
    return f"balanced: learner waits {learner:.0%} for {data}, collectors {collectors:.0%}"
