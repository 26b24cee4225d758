"""The job's settings that apply to it: what TensorBoard's hyperparameters (HParams tab, text table) record.

A section the job does not use is left out, decided by the resolved job itself:
`env.atari` unless `env.preset = "atari"`, `replay` unless the algorithm has replay shards, `inference` unless
`topology.inference = "central"`, `evaluator` unless the job runs one, and `cluster` (but its `scheduler`) unless
`cluster.scheduler = "slurm"`. job.toml keeps every key.
"""

from __future__ import annotations

from rlctl.job.resolved import resolved_dict
from rlctl.job.spec import JobSpec
from rlctl.metrics import flatten


def unused_sections(spec: JobSpec) -> list[str]:
    """Key prefixes ("env.atari.") of the sections `spec` does not use."""
    evaluator = any(h.evaluator for h in spec.hosts) if spec.hosts else spec.topology.evaluator
    unused = {"env.atari.": spec.env.preset != "atari", "replay.": spec.replay_shard_count == 0,
              "inference.": not spec.central_inference, "evaluator.": not evaluator,
              "cluster.": spec.cluster.scheduler != "slurm"}
    return [prefix for prefix, drop in unused.items() if drop]


def applicable_settings(spec: JobSpec) -> dict[str, object]:
    """The resolved job flattened ({"replay.capacity": 5000}), less the sections it does not use."""
    unused = tuple(unused_sections(spec))
    return {k: v for k, v in flatten(resolved_dict(spec)).items()
            if k == "cluster.scheduler" or not k.startswith(unused)}
