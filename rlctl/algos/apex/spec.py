"""The `[algorithm] name = "apex"` section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rlctl.job.specbase import Discount, LearningRate, PosInt, Section


class ApexSpec(Section):
    """Ape-X DQN: double + dueling n-step DQN over prioritized replay shards."""

    name: Literal["apex"]
    gamma: Discount = 0.99
    """Discount factor."""
    n_step: Annotated[int, Field(ge=1, le=100)] = 3
    """Steps summed into each transition's return."""
    lr: LearningRate = 1e-3
    """Adam learning rate."""
    adam_eps: Annotated[float, Field(gt=0, le=1)] = 1e-5
    """Adam epsilon."""
    batch_size: Annotated[int, Field(ge=1, le=1 << 20)] = 128
    """Transitions per gradient update and learner rank."""
    target_update_interval: PosInt = 250
    """Updates between target-network copies (too frequent copies let Q overshoot: learner/q_abs_max against
    learner/q_bound shows it)."""
    publish_interval: PosInt = 20
    """Updates between weight publications to collectors and evaluator."""
    grad_clip: Annotated[float, Field(gt=0, le=1e9)] = 10.0
    """Global gradient-norm clip."""
    epsilon: Annotated[float, Field(ge=0, le=1)] = 0.4
    """Ape-X epsilon ladder base: eps_i = epsilon ** (1 + epsilon_alpha * i / (N - 1))."""
    epsilon_alpha: Annotated[float, Field(ge=0, le=100)] = 7.0
    """Ape-X epsilon ladder exponent."""
    double: bool = True
    """Double DQN targets (online net picks, target net evaluates)."""
    dueling: bool = True
    """Dueling value/advantage head."""
    send_batch: Annotated[int, Field(ge=1, le=1 << 20)] = 256
    """Transitions a collector gathers before sending them to a replay shard (at least 64 steps of its envs, so
    per-send costs stay small with many envs)."""
    prefetch: Annotated[int, Field(ge=1, le=64)] = 2
    """Sample requests each learner rank keeps in flight (pipelined sampling)."""
