"""A2C's `[algorithm]` section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rlctl.algos.onpolicy.spec import OnPolicySpec
from rlctl.job.specbase import Fraction, LearningRate


class A2CSpec(OnPolicySpec):
    """Synchronous A2C: one actor-critic gradient step per round of rollouts (every collector's, of one version)."""

    name: Literal["a2c"]
    rollout_len: Annotated[int, Field(ge=1, le=1 << 16)] = 5
    """Steps per env in one rollout: the n of the n-step returns (with gae_lambda = 1)."""
    lr: LearningRate = 7e-4
    """Learning rate."""
    gae_lambda: Fraction = 1.0
    """GAE lambda; 1 gives A2C's plain n-step returns."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """`rmsprop` (as A3C/A2C) or `adam`."""
    rmsprop_alpha: Annotated[float, Field(gt=0, lt=1)] = 0.99
    """RMSProp smoothing constant."""
    norm_adv: bool = False
    """Normalise advantages over each round's batch."""
