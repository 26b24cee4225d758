"""`[sweep.pbt]`: population-based training of a sweep's trials. Every `interval` env steps a trial in the bottom
`quantile` of the population (by its current return) copies a top trial's checkpoint and continues with the
`[sweep.pbt.perturb]` keys perturbed: each multiplied by one of its `factors`, or drawn again from its distribution
(`{choice=[...]}`, `{uniform=[a, b]}`, `{log_uniform=[a, b]}`; with factors as well, with `resample_probability`).

Only hyperparameters may be perturbed (numeric `algorithm.*` keys): what a checkpoint of another trial can continue
with; the network and the topology stay those of the base job. Standard library only (sweep.json carries the spec).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

PBT_KEYS = ("interval", "quantile", "resample_probability", "perturb", "seed")
DISTRIBUTIONS = ("choice", "uniform", "log_uniform")
DEFAULT_FACTORS = (0.8, 1.2)  # Ray Tune's and the PBT paper's
HYPERPARAMETERS = "algorithm."


@dataclass(frozen=True)
class Perturbation:
    """How one key is perturbed: factors to multiply it by and/or a distribution to draw it from again."""

    key: str
    factors: tuple = ()
    distribution: str | None = None
    bounds: tuple = ()

    def candidates(self, base: object) -> list:
        """Values the schema must accept: the base value times each factor, the bounds, every choice."""
        scaled = [base * f for f in self.factors] if isinstance(base, (int, float)) else []
        return scaled + list(self.bounds)


@dataclass(frozen=True)
class PbtSpec:
    """A validated `[sweep.pbt]`."""

    interval: int
    quantile: float = 0.25
    resample_probability: float = 0.25
    seed: int = 0
    perturb: tuple = field(default_factory=tuple)  # of Perturbation

    def to_json(self) -> dict:
        """What sweep.json keeps (the scheduler reads the spec back with from_json)."""
        return {"interval": self.interval, "quantile": self.quantile, "seed": self.seed,
                "resample_probability": self.resample_probability,
                "perturb": [{"key": p.key, "factors": list(p.factors), "distribution": p.distribution,
                             "bounds": list(p.bounds)} for p in self.perturb]}

    @classmethod
    def from_json(cls, data: dict) -> "PbtSpec":
        """The spec sweep.json holds."""
        perturb = tuple(Perturbation(p["key"], tuple(p.get("factors") or ()), p.get("distribution"),
                                     tuple(p.get("bounds") or ())) for p in data.get("perturb", []))
        return cls(int(data["interval"]), float(data["quantile"]), float(data["resample_probability"]),
                   int(data.get("seed", 0)), perturb)


def parse_pbt(table: object, population: int, max_concurrent: int, problems: list[str]) -> PbtSpec | None:
    """`[sweep.pbt]` -> a PbtSpec (None when absent or wrong; each problem appended, naming its key)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        problems.append("sweep.pbt: a table (interval, quantile, [sweep.pbt.perturb])")
        return None
    found = len(problems)
    problems += [f"sweep.pbt.{k}: unknown key (known: {', '.join(PBT_KEYS)})" for k in table if k not in PBT_KEYS]
    interval = table.get("interval")
    if not _is_int(interval) or interval < 1:
        problems.append(f"sweep.pbt.interval: required: env steps between decisions, a positive integer "
                        f"(got {interval!r})")
    quantile = table.get("quantile", 0.25)
    if not _is_number(quantile) or not 0 < quantile <= 0.5:
        problems.append(f"sweep.pbt.quantile: a number in (0, 0.5] (got {quantile!r})")
    resample = table.get("resample_probability", 0.25)
    if not _is_number(resample) or not 0 <= resample <= 1:
        problems.append(f"sweep.pbt.resample_probability: a number in [0, 1] (got {resample!r})")
    seed = table.get("seed", 0)
    if not _is_int(seed):
        problems.append(f"sweep.pbt.seed: an integer (got {seed!r})")
    perturb = _perturbations(table.get("perturb"), problems)
    if population < 2:
        problems.append(f"sweep.pbt: a population of at least 2 trials (this sweep has {population})")
    elif max_concurrent < population:
        problems.append(f"sweep.pbt: the population trains together: max_concurrent ({max_concurrent}) must be at "
                        f"least the number of trials ({population})")
    if len(problems) > found:
        return None
    return PbtSpec(interval, float(quantile), float(resample), seed, tuple(perturb))


def _perturbations(table: object, problems: list[str]) -> list[Perturbation]:
    if not isinstance(table, dict) or not table:
        problems.append("sweep.pbt.perturb: required: a table of the keys to perturb, e.g. "
                        "\"algorithm.lr\" = { factors = [0.8, 1.2] }")
        return []
    out = []
    for key, entry in table.items():
        where = f"sweep.pbt.perturb.{key!r}"
        if not key.startswith(HYPERPARAMETERS) or key == "algorithm.name":
            problems.append(f"{where}: only hyperparameters (algorithm.* keys, but algorithm.name) may be perturbed: "
                            "a checkpoint must fit the network and topology it continues in")
            continue
        if isinstance(entry, list):
            entry = {"factors": entry}
        if not isinstance(entry, dict) or not entry:
            problems.append(f"{where}: a table: {{ factors = [0.8, 1.2] }} and/or one of {{ choice = [...] }}, "
                            f"{{ uniform = [a, b] }}, {{ log_uniform = [a, b] }} (got {entry!r})")
            continue
        problem, made = _perturbation(key, entry)
        if problem:
            problems.append(f"{where}: {problem}")
        else:
            out.append(made)
    return out


def _perturbation(key: str, entry: dict) -> tuple[str | None, Perturbation | None]:
    unknown = [k for k in entry if k != "factors" and k not in DISTRIBUTIONS]
    if unknown:
        return f"unknown key {unknown[0]!r} (known: factors, {', '.join(DISTRIBUTIONS)})", None
    kinds = [k for k in entry if k in DISTRIBUTIONS]
    if len(kinds) > 1:
        return f"one distribution at most (got {', '.join(kinds)})", None
    factors = entry.get("factors", [])
    if "factors" in entry and (not isinstance(factors, list) or not factors or not all(
            _is_number(f) and f > 0 for f in factors)):
        return f"factors: a non-empty list of numbers above 0 (got {factors!r})", None
    kind = kinds[0] if kinds else None
    bounds = entry.get(kind) if kind else []
    problem = _bounds_problem(kind, bounds) if kind else None
    if problem:
        return problem, None
    return None, Perturbation(key, tuple(factors), kind, tuple(bounds))


def _bounds_problem(kind: str, bounds: object) -> str | None:
    if kind == "choice":
        return None if isinstance(bounds, list) and bounds else "choice: a non-empty list"
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(_is_number(b) for b in bounds)
            and bounds[0] <= bounds[1]):
        return f"{kind}: [low, high], two numbers with low <= high (got {bounds!r})"
    if kind == "log_uniform" and bounds[0] <= 0:
        return f"log_uniform: bounds above 0 (got {bounds!r})"
    return None


def check_values(spec: PbtSpec, base_value: Callable[[str], object], refused: Callable[[str, object], str | None],
                 problems: list[str]) -> None:
    """Every value a perturbation can start from or reach in one step, through the job schema (`refused(key,
    value)`: its reason, or None); a key the job does not have is named with the schema's own reason."""
    for p in spec.perturb:
        where = f"sweep.pbt.perturb.{p.key!r}"
        base = base_value(p.key)
        if base is None:
            problems.append(f"{where}: {refused(p.key, 1.0) or 'not a key of the job'}")
            continue
        if not _is_number(base):
            problems.append(f"{where}: only numbers can be perturbed (the job has {base!r})")
            continue
        for value in p.candidates(base):
            value = round(value) if isinstance(base, int) and isinstance(value, float) else value
            reason = refused(p.key, value)
            if reason:
                problems.append(f"{where}: {value!r}: {reason}")
                break


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
