"""Limits that a job file's validation (rlctl.spec) and the processes that enforce them share: one constant each,
here, so the two cannot drift. Light: the CLI path imports it."""

from __future__ import annotations

# Items a replay shard serves per sample request (rlctl.roles.replay drops a larger request); a larger
# algorithm.batch_size would have every request dropped, so rlctl.spec refuses it.
REPLAY_MAX_SAMPLE = 1 << 16
