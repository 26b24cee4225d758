"""The `[algorithm]` sections of the rollout algorithms: `ppo`, `appo` and `impala`.

Their data path (rollouts) reads `rollout_len` from every one of them, and `rollouts_per_update` (from
`batch_steps` or `rollouts_per_batch`) and `max_policy_lag` from the asynchronous ones.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rlctl.job.specbase import Coef, Discount, Fraction, LearningRate, PosInt, Section


BatchSteps = Annotated[int, Field(ge=1, le=1 << 24)]


class AsynchronousBatch:
    """What the rollouts data path asks of an asynchronous algorithm's section (APPO, IMPALA)."""

    def rollouts_per_update(self, envs_per_collector: int) -> int:
        """Rollouts a learner rank trains on per update: `rollouts_per_batch` where given, else as many as hold
        `batch_steps` env steps (at least one)."""
        if self.rollouts_per_batch:
            return self.rollouts_per_batch
        return max(1, -(-self.batch_steps // (self.rollout_len * envs_per_collector)))


class OnPolicySpec(Section):
    """Fields every rollout-based algorithm shares (collectors send fixed-length rollouts to the learner)."""

    gamma: Discount = 0.99
    """Discount factor."""
    rollout_len: Annotated[int, Field(ge=1, le=1 << 16)] = 32
    """Steps per env in one rollout (all taken with one policy version)."""
    lr: LearningRate = 3e-4
    """Learning rate."""
    lr_anneal_steps: PosInt | None = None
    """Env steps over which the learning rate falls linearly to 0; unset = constant."""
    adam_eps: Annotated[float, Field(gt=0, le=1)] = 1e-5
    """Optimizer epsilon."""
    vf_coef: Coef = 0.5
    """Value-loss coefficient."""
    ent_coef: Coef = 0.0
    """Entropy-bonus coefficient."""
    max_grad_norm: Annotated[float, Field(gt=0, le=1e9)] = 0.5
    """Global gradient-norm clip."""
    reward_scale: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """Rewards are multiplied by this on the learner (episode returns are reported unscaled)."""
    log_std_init: Annotated[float, Field(ge=-20, le=5)] = 0.0
    """Initial log standard deviation of the Gaussian policy (Box action spaces)."""


class PPOSpec(OnPolicySpec):
    """Synchronous PPO: every collector sends one rollout per policy version; learner ranks train in lockstep (DDP)."""

    name: Literal["ppo"]
    gae_lambda: Fraction = 0.95
    """GAE lambda."""
    epochs: Annotated[int, Field(ge=1, le=1000)] = 10
    """Passes over each round's rollouts."""
    minibatches: Annotated[int, Field(ge=1, le=1 << 16)] = 4
    """Minibatches per epoch and learner rank."""
    clip: Annotated[float, Field(gt=0, le=10)] = 0.2
    """Surrogate clip range."""
    value_clip: Annotated[float, Field(gt=0, le=1e6)] | None = None
    """Clip the value update to this range around the behaviour value; unset = no value clipping."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""


class APPOSpec(PPOSpec, AsynchronousBatch):
    """Asynchronous PPO: collectors never wait; the learner trains on whatever rollouts arrive within the lag bound."""

    name: Literal["appo"]  # type: ignore[assignment]
    epochs: Annotated[int, Field(ge=1, le=1000)] = 1
    """Passes over each batch of rollouts."""
    minibatches: Annotated[int, Field(ge=1, le=1 << 16)] = 1
    """Minibatches per epoch and learner rank."""
    batch_steps: BatchSteps = 512
    """Env steps each learner rank trains on per update, gathered as whole rollouts (`rollout_len` x
    `env.envs_per_collector` steps each): an update keeps its size when collectors or envs per collector change."""
    rollouts_per_batch: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    """Rollouts per update and learner rank, whatever a rollout holds (instead of `batch_steps`)."""
    max_policy_lag: Annotated[int, Field(ge=0, le=1 << 20)] = 10
    """Rollouts more than this many versions behind the learner are dropped (and counted)."""
    vtrace: bool = False
    """Value targets and advantages from V-trace on current values (as Sample Factory's APPO), instead of GAE."""
    rho_bar: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """V-trace importance-weight clip for the value target and advantage (rho-bar)."""
    c_bar: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """V-trace trace-cutting clip (c-bar)."""


class IMPALASpec(OnPolicySpec, AsynchronousBatch):
    """IMPALA: actor-critic with V-trace targets computed on the learner from the behaviour log-probs."""

    name: Literal["impala"]
    lr: LearningRate = 6e-4
    """Learning rate."""
    ent_coef: Coef = 0.01
    """Entropy-bonus coefficient."""
    max_grad_norm: Annotated[float, Field(gt=0, le=1e9)] = 40.0
    """Global gradient-norm clip."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """`rmsprop` (as the IMPALA paper) or `adam`."""
    rmsprop_alpha: Annotated[float, Field(gt=0, lt=1)] = 0.99
    """RMSProp smoothing constant."""
    batch_steps: BatchSteps = 512
    """Env steps each learner rank trains on per update, gathered as whole rollouts (`rollout_len` x
    `env.envs_per_collector` steps each): an update keeps its size when collectors or envs per collector change."""
    rollouts_per_batch: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    """Rollouts per update and learner rank, whatever a rollout holds (instead of `batch_steps`)."""
    max_policy_lag: Annotated[int, Field(ge=0, le=1 << 20)] = 20
    """Rollouts more than this many versions behind the learner are dropped (and counted)."""
    rho_bar: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """V-trace importance-weight clip (rho-bar)."""
    c_bar: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """V-trace trace-cutting clip (c-bar)."""
