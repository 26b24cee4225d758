"""The `[algorithm] name = "r2d2"` section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from rlctl.job.specbase import Discount, Fraction, LearningRate, PosInt, Section

SeqSteps = Annotated[int, Field(ge=1, le=4096)]


class R2D2Spec(Section):
    """R2D2: recurrent (LSTM) double, dueling, n-step DQN over prioritized replay of fixed-length sequences."""

    name: Literal["r2d2"]
    gamma: Discount = 0.997
    """Discount factor."""
    n_step: Annotated[int, Field(ge=1, le=100)] = 5
    """Steps summed into each target's return (within a sequence)."""
    lr: LearningRate = 1e-4
    """Adam learning rate."""
    adam_eps: Annotated[float, Field(gt=0, le=1)] = 1e-3
    """Adam epsilon."""
    batch_size: Annotated[int, Field(ge=1, le=1 << 16)] = 64
    """Sequences per gradient update and learner rank."""
    burn_in: Annotated[int, Field(ge=0, le=4096)] = 40
    """Steps at the start of each sequence that only warm up the recurrent state (no loss)."""
    trace_length: SeqSteps = 80
    """Steps after the burn-in that are trained on; a sequence holds burn_in + trace_length steps."""
    sequence_period: SeqSteps = 40
    """Steps between the starts of consecutive sequences of an episode (sequences overlap by length - period)."""
    lstm_size: Annotated[int, Field(ge=1, le=65536)] = 512
    """Width of the recurrent layer."""
    memory: Literal["lstm", "none"] = "lstm"
    """`lstm`, or `none`: a feed-forward layer of the same width in its place (to check a task needs memory)."""
    target_update_interval: PosInt = 2500
    """Updates between target-network copies."""
    publish_interval: PosInt = 20
    """Updates between weight publications to collectors and evaluator."""
    grad_clip: Annotated[float, Field(gt=0, le=1e9)] = 40.0
    """Global gradient-norm clip."""
    priority_eta: Fraction = 0.9
    """Sequence priority eta * max|td| + (1 - eta) * mean|td| over its trained steps."""
    rescale_eps: Annotated[float, Field(ge=0, le=1)] = 1e-3
    """Epsilon of the invertible value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps * x."""
    epsilon: Annotated[float, Field(ge=0, le=1)] = 0.4
    """Ape-X epsilon ladder base: eps_i = epsilon ** (1 + epsilon_alpha * i / (N - 1))."""
    epsilon_alpha: Annotated[float, Field(ge=0, le=100)] = 7.0
    """Ape-X epsilon ladder exponent."""
    double: bool = True
    """Double-Q targets (online net picks, target net evaluates)."""
    dueling: bool = True
    """Dueling value/advantage head."""
    send_batch: Annotated[int, Field(ge=1, le=1 << 16)] = 8
    """Sequences a collector gathers before sending them to a replay shard."""
    prefetch: Annotated[int, Field(ge=1, le=64)] = 2
    """Sample requests each learner rank keeps in flight (pipelined sampling)."""

    @property
    def sequence_length(self) -> int:
        """Steps per stored sequence: burn-in plus trained steps."""
        return self.burn_in + self.trace_length

    @model_validator(mode="after")
    def _check_period(self) -> "R2D2Spec":
        if self.sequence_period > self.sequence_length:
            raise ValueError(f"sequence_period: {self.sequence_period} is longer than a sequence "
                             f"(burn_in + trace_length = {self.sequence_length}): steps would be left out")
        return self
