"""The roles a job's processes play, as the plan, state.json and heartbeats name them: one name for each, used
everywhere (plain strings, so that a plan or state.json read back compares equal without conversion)."""

from __future__ import annotations


class Role:
    """A process's role (its `RLCTL_ROLE`, the prefix of its name "collector-3")."""

    LEARNER = "learner"
    COLLECTOR = "collector"
    REPLAY_SHARD = "replay"  # the replay data path's shard process (rlctl.datapaths.replay)
    EVALUATOR = "evaluator"
    INFERENCE = "inference"  # a central-inference server (SEED-RL style)
    RELAY = "relay"  # a host's weights relay: one copy of each version from learner rank 0 for the host's processes


ROLES = frozenset(v for k, v in vars(Role).items() if k.isupper())

# The supervisor's own log (logs/supervisor.log): not a process role, but `rlctl logs --role` knows it too.
SUPERVISOR = "supervisor"
LOG_SOURCES = ROLES | {SUPERVISOR}
