"""Reading a sweep file: `[sweep]` (the base job, seeds, trials, how many run at once, where they run) and
`[sweep.params]` (job key paths: a list is a grid axis; `{choice=[...]}`, `{uniform=[a,b]}`, `{log_uniform=[a,b]}` are drawn `trials` times
with a seeded RNG) -> a SweepSpec and every trial's validated JobSpec, or a SweepFileError naming the file, the
parameter and the trial. Nothing starts before every trial's job has passed the job loader's own checks.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlctl.job.early_stop_spec import EARLY_STOP_KEYS, RULES, EarlyStopRule
from rlctl.job.load import JobFileError, validate_job
from rlctl.job.pbt_spec import PbtSpec, check_values, parse_pbt
from rlctl.job.resolved import resolved_dict
from rlctl.job.spec import JobSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

SWEEP_KEYS = ("base", "name", "seeds", "trials", "max_concurrent", "sample_seed", "place", "trials_per_host", "params",
              "pbt", "early_stop")
PLACES = ("local", "hosts", "nodes")  # this machine; one of the base job's [[hosts]], or one Slurm node, per trial
DISTRIBUTIONS = ("choice", "uniform", "log_uniform")
SEED_KEY = "job.seed"  # what `seeds` sets in every trial's job
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class SweepFileError(Exception):
    """A sweep file that cannot be used: names the file and, per problem, the parameter (or key) and the trial."""

    def __init__(self, path: str | Path, problems: list[str]):
        self.path, self.problems = str(path), problems
        super().__init__(self.render())

    def render(self) -> str:
        """Human-readable, one problem per line."""
        return "\n".join([f"{self.path}: invalid sweep file"] + [f"  {p}" for p in self.problems])


@dataclass(frozen=True)
class Param:
    """One `[sweep.params]` entry: a grid axis (`values`) or a distribution drawn once per sample."""

    key: str
    values: tuple = ()
    distribution: str | None = None
    bounds: tuple = ()

    def draw(self, rng: random.Random) -> object:
        """One value of a distribution (ints stay ints where both bounds are ints)."""
        if self.distribution == "choice":
            return rng.choice(self.bounds)
        low, high = self.bounds
        ints = all(isinstance(b, int) for b in self.bounds)
        if self.distribution == "uniform":
            return rng.randint(low, high) if ints else rng.uniform(low, high)
        value = math.exp(rng.uniform(math.log(low), math.log(high)))
        return round(value) if ints else value


@dataclass(frozen=True)
class Trial:
    """One trial: its id, the values its parameters take (key path -> value) and its seed."""

    id: str
    values: dict
    seed: int
    host: str | None = None  # place = "hosts": the [[hosts]] entry it runs on, all of it

    def label(self) -> str:
        """`t003 (algorithm.lr=0.001, seed 2)`: how messages name the trial."""
        parts = [f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v!r}" for k, v in self.values.items()]
        parts.append(f"seed {self.seed}")
        return f"{self.id} ({', '.join(parts)})"


@dataclass
class SweepSpec:
    """A validated sweep file: where it and its base job are, its name, and its trials with their jobs."""

    path: Path
    base: Path
    name: str
    max_concurrent: int
    params: list[Param]
    seeds: list[int]
    place: str = "local"
    trials_per_host: int = 1
    trials: list[Trial] = field(default_factory=list)
    jobs: list[JobSpec] = field(default_factory=list)  # trial i's job
    pbt: PbtSpec | None = None  # [sweep.pbt]: population-based training of the trials
    early_stop: EarlyStopRule | None = None  # [sweep.early_stop]: none, no trial is stopped early


def is_sweep_file(path: str | Path) -> bool:
    """True for a readable TOML file with a `[sweep]` table (what `rlctl plan` and `run` treat as a sweep)."""
    try:
        return isinstance(tomllib.loads(Path(path).read_text(encoding="utf-8")).get("sweep"), dict)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def load_sweep(path: str | Path) -> SweepSpec:
    """Read a sweep file, expand its trials and validate each trial's job; SweepFileError on any problem."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SweepFileError(path, ["file not found"]) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SweepFileError(path, [f"cannot read: {exc}"]) from None
    table = data.get("sweep")
    if not isinstance(table, dict) or set(data) != {"sweep"}:
        raise SweepFileError(path, ["a sweep file holds one table, [sweep] (with [sweep.params])"])
    problems = [f"sweep.{k}: unknown key (known: {', '.join(SWEEP_KEYS)})" for k in table if k not in SWEEP_KEYS]
    base_path, base_data = _base(path, table, problems)
    params = _params(table.get("params"), problems)
    seeds = _int_list(table, "seeds", problems)
    samples = _positive(table, "trials", 1, problems)
    if samples > 1 and not any(p.distribution for p in params):
        problems.append("sweep.trials: draws from distributions ({choice=...}, {uniform=...}, {log_uniform=...}); "
                        "[sweep.params] has none")
    max_concurrent = _positive(table, "max_concurrent", 1, problems)
    early_stop = _early_stop(table.get("early_stop"), problems)
    sample_seed = table.get("sample_seed", 0)
    if not isinstance(sample_seed, int) or isinstance(sample_seed, bool):
        problems.append(f"sweep.sample_seed: an integer (got {sample_seed!r})")
        sample_seed = 0
    name = table.get("name", path.stem)
    if not isinstance(name, str) or not NAME_RE.match(name):
        problems.append(f"sweep.name: letters, digits, `_`, `.`, `-` (got {name!r})")
    place = _place(table, base_path, base_data, problems)
    trials_per_host = _positive(table, "trials_per_host", 1, problems)
    if problems:
        raise SweepFileError(path, problems)
    seeds = seeds or [base_data.get("job", {}).get("seed", 0)]
    spec = SweepSpec(path, base_path, name, max_concurrent, params, seeds, place, trials_per_host,
                     early_stop=early_stop)
    spec.trials = expand(params, seeds, samples, random.Random(sample_seed))
    spec.pbt = parse_pbt(table.get("pbt"), len(spec.trials), max_concurrent, problems)
    if problems:
        raise SweepFileError(path, problems)
    bases = [base_data]
    if place == "hosts":
        bases = one_host_jobs(path, base_data)
        spec.trials = [replace(t, host=bases[i % len(bases)]["hosts"][0]["name"]) for i, t in enumerate(spec.trials)]
    elif place == "nodes":  # the base job's layout on one node: the learner node and its collectors
        cluster = {k: v for k, v in base_data["cluster"].items() if k != "nodes"}
        bases = [{**base_data, "cluster": {**cluster, "node_count": 1, "learner_nodes": 1}}]
    spec.jobs = _trial_jobs(path, bases, spec.trials, params)
    if spec.pbt is not None:
        _check_pbt_values(path, spec, base_data)
    return spec


def _place(table: dict, base_path: Path, base_data: dict, problems: list[str]) -> str:
    """`sweep.place`, checked against the base job and what else the sweep asks for."""
    place = table.get("place", "local")
    if place not in PLACES:
        problems.append(f"sweep.place: one of {', '.join(map(repr, PLACES))} (got {place!r})")
    elif place == "hosts" and not (isinstance(base_data.get("hosts"), list) and base_data["hosts"]):
        problems.append(f'sweep.place: "hosts" runs each trial on one of the base job\'s [[hosts]]; {base_path.name} '
                        "lists none")
    elif place == "nodes" and (base_data.get("cluster") or {}).get("scheduler") != "slurm":
        problems.append(f'sweep.place: "nodes" runs each trial on one node of the Slurm allocation the sweep runs in; '
                        f'{base_path.name} needs cluster.scheduler = "slurm"')
    if "pbt" in table and "early_stop" in table:
        problems.append("sweep.early_stop: with [sweep.pbt] a losing trial copies a winner instead of stopping; "
                        "use one of the two")
    if place != "local" and "pbt" in table:
        problems.append('sweep.pbt: population-based training runs its trials on this machine (place = "local") '
                        "for now")
    return place


def one_host_jobs(path: Path, base: dict) -> list[dict]:
    """Per `[[hosts]]` entry of the base job, the job with all its processes on that host alone: the learner
    (the head's learner_procs), and the collectors, replay shards and evaluator of every host together. A trial
    placed on a host runs this job."""
    try:
        spec = validate_job(base, "the base job")
    except JobFileError as exc:
        raise SweepFileError(path, [f"sweep.base: {key or '<job>'}: {reason}" for key, reason in exc.problems]) \
            from None
    head = next((h for h in spec.hosts if h.learner), spec.hosts[0])
    counts = {"learner": True, "collectors": sum(h.collectors for h in spec.hosts),
              "replay_shards": sum(h.replay_shards for h in spec.hosts),
              "evaluator": any(h.evaluator for h in spec.hosts)}
    if head.learner_procs is not None:
        counts["learner_procs"] = head.learner_procs
    out = []
    for raw in base["hosts"]:
        host = {k: v for k, v in raw.items() if k not in ("learner_procs", *counts)}
        out.append({**copy.deepcopy(base), "hosts": [{**copy.deepcopy(host), **counts}]})
    return out


def _check_pbt_values(path: Path, spec: SweepSpec, base: dict) -> None:
    """SweepFileError when a value a perturbation starts from or reaches is one the job schema refuses."""
    first = spec.trials[0]

    def base_value(key: str) -> object:
        node: object = resolved_dict(spec.jobs[0])
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def refused(key: str, value: object) -> str | None:
        try:
            validate_job(with_values(base, {**first.values, SEED_KEY: first.seed, key: value}), first.id)
        except TypeError as exc:
            return f"a key path goes through a value: {exc}"
        except JobFileError as exc:
            return "; ".join(f"{k or '<job>'}: {reason}" for k, reason in exc.problems)
        return None

    problems: list[str] = []
    check_values(spec.pbt, base_value, refused, problems)
    if problems:
        raise SweepFileError(path, problems)


def _base(path: Path, table: dict, problems: list[str]) -> tuple[Path, dict]:
    """(the base job's path, its parsed TOML): `base` is relative to the sweep file."""
    base = table.get("base")
    if not isinstance(base, str) or not base:
        problems.append("sweep.base: required: the job file every trial starts from (relative to this file)")
        return path, {}
    base_path = (path.parent / base).resolve()
    try:
        return base_path, tomllib.loads(base_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"sweep.base: {base_path}: file not found")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        problems.append(f"sweep.base: {base_path}: cannot read: {exc}")
    return base_path, {}


def _params(table: object, problems: list[str]) -> list[Param]:
    """The `[sweep.params]` entries, each checked for its form (the values themselves are the job schema's)."""
    if table is None:
        return []
    if not isinstance(table, dict):
        problems.append("sweep.params: a table of job key paths")
        return []
    out = []
    for key, spec in table.items():
        where = f"sweep.params.{key!r}"
        if key == SEED_KEY:
            problems.append(f"{where}: seeds are sweep.seeds")
        elif isinstance(spec, list):
            if not spec:
                problems.append(f"{where}: an empty grid (give at least one value)")
            else:
                out.append(Param(key, tuple(spec)))
        elif isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in DISTRIBUTIONS:
            kind, bounds = next(iter(spec.items()))
            problem = _bounds_problem(kind, bounds)
            if problem:
                problems.append(f"{where}: {problem}")
            else:
                out.append(Param(key, distribution=kind, bounds=tuple(bounds)))
        else:
            problems.append(f"{where}: a list (a grid axis) or one of {{choice=[...]}}, {{uniform=[a, b]}}, "
                            f"{{log_uniform=[a, b]}} (got {spec!r})")
    return out


def _bounds_problem(kind: str, bounds: object) -> str | None:
    """Why a distribution's values cannot be drawn from, or None."""
    if kind == "choice":
        return None if isinstance(bounds, list) and bounds else "choice: a non-empty list"
    numeric = isinstance(bounds, list) and len(bounds) == 2 and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in bounds)
    if not numeric or bounds[0] > bounds[1]:
        return f"{kind}: [low, high], two numbers with low <= high (got {bounds!r})"
    if kind == "log_uniform" and bounds[0] <= 0:
        return f"log_uniform: bounds above 0 (got {bounds!r})"
    return None


def _early_stop(table: object, problems: list[str]) -> EarlyStopRule | None:
    """`[sweep.early_stop]` as a rule (rlctl.supervise.early_stop), or None when the file has none."""
    if table is None:
        return None
    if not isinstance(table, dict):
        problems.append("sweep.early_stop: a table (rule, grace_env_steps, interval_env_steps, min_trials)")
        return None
    problems += [f"sweep.early_stop.{k}: unknown key (known: {', '.join(EARLY_STOP_KEYS)})"
                 for k in table if k not in EARLY_STOP_KEYS]
    rule = table.get("rule", "median")
    if rule not in RULES:
        problems.append(f"sweep.early_stop.rule: one of {', '.join(RULES)} (got {rule!r})")
    default = EarlyStopRule()
    counts = {}
    for key, low in (("grace_env_steps", 0), ("interval_env_steps", 1), ("min_trials", 1)):
        value = table.get(key, getattr(default, key))
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            problems.append(f"sweep.early_stop.{key}: an integer >= {low} (got {value!r})")
        counts[key] = value
    return EarlyStopRule("median", **counts)


def _int_list(table: dict, key: str, problems: list[str]) -> list[int]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                              for v in value):
        problems.append(f"sweep.{key}: a list of non-negative integers (got {value!r})")
        return []
    if key in table and not value:
        problems.append(f"sweep.{key}: an empty list (leave it out for the base job's seed)")
    return value


def _positive(table: dict, key: str, default: int, problems: list[str]) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        problems.append(f"sweep.{key}: a positive integer (got {value!r})")
        return default
    return value


def expand(params: list[Param], seeds: list[int], samples: int, rng: random.Random) -> list[Trial]:
    """Every trial, in order: each draw of the distributions, each point of the grid, each seed."""
    grid = [p for p in params if p.distribution is None]
    drawn = [p for p in params if p.distribution is not None]
    out = []
    for _ in range(samples):
        draw = {p.key: p.draw(rng) for p in drawn}
        for point in itertools.product(*(p.values for p in grid)):
            values = {p.key: v for p, v in zip(grid, point)}
            values.update(draw)
            values = {p.key: values[p.key] for p in params}  # the file's order
            for seed in seeds:
                out.append(Trial(f"t{len(out):03d}", values, seed))
    return out


def with_values(data: dict, values: dict) -> dict:
    """A copy of a job's TOML data with each key path set (a KeyError-free path: missing tables are made)."""
    data = copy.deepcopy(data)
    for key, value in values.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise TypeError(f"{part!r} is not a table")
            node = child
        node[leaf] = value
    return data


def _trial_jobs(path: Path, bases: list[dict], trials: list[Trial], params: list[Param]) -> list[JobSpec]:
    """Each trial's job (trial i starts from bases[i mod len(bases)]), validated; SweepFileError naming the
    parameter and (first) trial of every problem."""
    jobs = []
    first: dict[str, str] = {}  # parameter and key path -> the problem, told for the first trial that has it
    others: Counter = Counter()
    for i, trial in enumerate(trials):
        base = bases[i % len(bases)]
        try:
            jobs.append(validate_job(with_values(base, {**trial.values, SEED_KEY: trial.seed}), trial.id))
            continue
        except TypeError as exc:
            found = [("", f"a key path goes through a value: {exc}")]
        except JobFileError as exc:
            found = exc.problems
        for key, reason in found:
            where = f"{_param_of(key, params)}{key or '<job>'}"
            if where in first:
                others[where] += 1
            else:
                first[where] = f"{_param_of(key, params)}trial {trial.label()}: {key or '<job>'}: {reason}"
    if first:
        raise SweepFileError(path, [line + (f" (and {others[w]} more trials)" if others[w] else "")
                                    for w, line in first.items()])
    return jobs


def _param_of(key: str, params: list[Param]) -> str:
    """`sweep.params."algorithm.lr": ` when a job problem's key path is (under) a parameter's, else ''."""
    for p in params:
        if key == p.key or key.startswith(p.key + ".") or key.startswith(p.key + "["):
            return f"sweep.params.{p.key!r}: "
    return ""
