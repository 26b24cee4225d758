"""`[sweep.early_stop]` of a sweep file as data: which rule, and when trials are judged (the decision itself is
rlctl.supervise.early_stop's). Standard library only."""

from __future__ import annotations

from dataclasses import dataclass

RULES = ("median",)
EARLY_STOP_KEYS = ("rule", "grace_env_steps", "interval_env_steps", "min_trials")


@dataclass(frozen=True)
class EarlyStopRule:
    """When trials are judged: from `grace_env_steps` on, every `interval_env_steps`, against at least `min_trials`
    other trials that reached the same env step."""

    rule: str = "median"
    grace_env_steps: int = 10_000
    interval_env_steps: int = 5_000
    min_trials: int = 3

    def record(self) -> dict:
        """The rule as sweep.json keeps it."""
        return {k: getattr(self, k) for k in EARLY_STOP_KEYS}

    @classmethod
    def from_record(cls, data: object) -> EarlyStopRule | None:
        """The rule sweep.json keeps, or None when it keeps none (the sweep stops no trial early)."""
        if not isinstance(data, dict):
            return None
        return cls(**{k: data[k] for k in EARLY_STOP_KEYS if k in data})

    def check_point(self, steps: float) -> int | None:
        """The last check point at or before `steps` env steps, or None before the grace is over."""
        if steps < self.grace_env_steps:
            return None
        return self.grace_env_steps + int((steps - self.grace_env_steps) // self.interval_env_steps) * \
            self.interval_env_steps
