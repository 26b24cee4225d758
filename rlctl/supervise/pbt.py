"""Population-based training of a sweep's trials (`[sweep.pbt]`, rlctl.job.pbt_spec), for its scheduler.

Every `interval` env steps of a trial, it is ranked by its current return among the trials that have one; in the
bottom `quantile` it exploits a trial of the top `quantile`: its run is stopped as `rlctl stop` stops it, the
donor's newest checkpoint (weights, optimizer, counters) and replay snapshots replace its own, its job.toml takes
the donor's values of the perturbed keys, each perturbed (explore), and it is resumed as `rlctl run --resume`
resumes a run. Each exploit is a line of the sweep's pbt.jsonl (the lineage `rlctl status SWEEP` shows).

The decisions (`choose_donor`, `explore`) are pure functions; `PopulationTrainer` reads the trials and acts.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlctl import metric_names as M
from rlctl.job.load import JobFileError, load_job, validate_job
from rlctl.job.pbt_spec import PbtSpec
from rlctl.job.resolved import resolved_dict
from rlctl.job.sweep_spec import Param, with_values
from rlctl.job.toml_writer import dumps_toml
from rlctl.rundir import RunDir, status_of
from rlctl.run_status import RunStatus
from rlctl.sweep_dir import SweepDir

EXPLORE_TRIES = 20  # draws of perturbed values until the job schema accepts them (else the donor's values)


def trial_score(state: dict) -> float | None:
    """What PBT ranks a trial by: its current mean evaluation return, else its mean training return."""
    metrics = state.get("metrics") if isinstance(state.get("metrics"), dict) else {}
    for key in (M.EVAL_RETURN_MEAN, M.EPISODE_RETURN_MEAN):
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            return float(value)
    return None


def choose_donor(trial_id: str, scores: dict[str, float], quantile: float, rng: random.Random) -> str | None:
    """The trial `trial_id` copies: one of the top quantile drawn at random when it ranks in the bottom quantile
    (ties broken by id, so the decision is reproducible), else None."""
    if trial_id not in scores or len(scores) < 2:
        return None
    ranked = sorted(scores, key=lambda t: (scores[t], t))
    k = max(1, int(len(ranked) * quantile))
    bottom, top = ranked[:k], ranked[-k:]
    if trial_id not in bottom or trial_id in top:
        return None
    return rng.choice(top)


def explore(values: dict, perturb: tuple, resample_probability: float, rng: random.Random) -> dict:
    """The values perturbed: each key drawn again from its distribution (always without factors, else with
    `resample_probability`) or multiplied by one of its factors; uniform and log-uniform bounds clip a product,
    and an integer key stays an integer."""
    out = dict(values)
    for p in perturb:
        old = values[p.key]
        if p.distribution and (not p.factors or rng.random() < resample_probability):
            new = Param(p.key, distribution=p.distribution, bounds=p.bounds).draw(rng)
        else:
            new = old * rng.choice(p.factors)
            if p.distribution in ("uniform", "log_uniform"):
                new = min(max(new, p.bounds[0]), p.bounds[1])
        out[p.key] = round(new) if isinstance(old, int) and isinstance(new, float) else new
    return out


def next_mark(env_steps: float, interval: int) -> int:
    """The env steps of a trial's next decision: the first multiple of the interval past `env_steps`."""
    return (int(env_steps) // interval + 1) * interval


def value_at(data: dict, key: str) -> object:
    """A key path's value in a job's data (None where it has none)."""
    node: object = data
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


@dataclass
class Exploit:
    """A decided exploit, waiting for its trial's run to stop."""

    trial: str
    donor: str
    env_steps: float
    scores: dict


class PopulationTrainer:
    """The exploit and explore steps of one sweep's population, driven by its scheduler's loop."""

    def __init__(self, sweep: SweepDir, spec: PbtSpec, log: Callable[[str], None]):
        self.sweep, self.spec, self.log = sweep, spec, log
        self.rng = random.Random(spec.seed)
        self.marks: dict[str, int] = {}  # trial -> env steps of its next decision
        self.pending: dict[str, Exploit] = {}

    @classmethod
    def of(cls, sweep: SweepDir, log: Callable[[str], None]) -> "PopulationTrainer | None":
        """The sweep's trainer, or None for a sweep without [sweep.pbt]."""
        data = sweep.read().get("pbt")
        return cls(sweep, PbtSpec.from_json(data), log) if isinstance(data, dict) else None

    def step(self, running: dict, stop: Callable[[str], None]) -> list[str]:
        """Stop (through `stop`) the running trials that exploit now; apply the exploits of those whose run has
        stopped since, and return them: the trials to resume at once."""
        resume = [t for t in list(self.pending) if t not in running and self._apply(self.pending.pop(t))]
        states = {t["id"]: self.sweep.trial_dir(t["id"]).read_state() or {} for t in self.sweep.trials()}
        scores = {t: s for t, s in ((t, trial_score(st)) for t, st in states.items() if t not in self.pending)
                  if s is not None}
        for trial_id in running:
            if trial_id in self.pending:
                continue
            steps = (states[trial_id].get("metrics") or {}).get(M.ENV_STEPS) or 0
            mark = self.marks.setdefault(trial_id, self.spec.interval)
            if steps < mark:
                continue
            donor = choose_donor(trial_id, scores, self.spec.quantile, self.rng)
            if donor is not None and not (self.sweep.trial_dir(donor).checkpoints_dir / "latest.pt").is_file():
                continue  # decided again once the donor has a checkpoint to give
            self.marks[trial_id] = next_mark(steps, self.spec.interval)
            if donor is not None:
                self.pending[trial_id] = Exploit(trial_id, donor, steps, {t: scores[t] for t in (trial_id, donor)})
                self.log(f"pbt: {trial_id} (return {scores[trial_id]:.1f}) exploits {donor} (return "
                         f"{scores[donor]:.1f}) at {steps:,.0f} env steps: stopping {trial_id}")
                stop(trial_id)
        return resume

    def _apply(self, exploit: Exploit) -> bool:
        """The donor's checkpoint and perturbed values into the stopped trial; False when it ended otherwise (it
        reached its target first) and is not to be resumed."""
        rundir, donor = self.sweep.trial_dir(exploit.trial), self.sweep.trial_dir(exploit.donor)
        status = status_of(rundir.read_state() or {})
        if status != RunStatus.STOPPED:
            self.log(f"pbt: {exploit.trial} ended {status} before its exploit of {exploit.donor}: none made")
            return False
        if not (donor.checkpoints_dir / "latest.pt").is_file():
            self.log(f"pbt: {exploit.donor} has no checkpoint any more: {exploit.trial} resumes as it was")
            return True
        old_job, donor_job = load_job(rundir.job_toml), load_job(donor.job_toml)
        keys = [p.key for p in self.spec.perturb]
        old = {k: value_at(resolved_dict(old_job), k) for k in keys}
        given = {k: value_at(resolved_dict(donor_job), k) for k in keys}
        new_job, new = self._perturbed(old_job, given, rundir.job_toml)
        copy_checkpoint(donor, rundir)
        rundir.write_job(dumps_toml(resolved_dict(new_job)))
        record = {"time": time.time(), "trial": exploit.trial, "env_steps": exploit.env_steps,
                  "from": exploit.donor, "scores": exploit.scores, "old": old, "donor": given, "new": new}
        with open(self.sweep.path / "pbt.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        self.log(f"pbt: {exploit.trial} continues from {exploit.donor}'s checkpoint with "
                 + ", ".join(f"{k}={old[k]!r} -> {new[k]!r}" for k in keys))
        return True

    def _perturbed(self, job, donor_values: dict, source: Path):
        """(the trial's job with the donor's values explored, those values): drawn until the schema takes them."""
        data = resolved_dict(job)
        for _ in range(EXPLORE_TRIES):
            values = explore(donor_values, self.spec.perturb, self.spec.resample_probability, self.rng)
            try:
                return validate_job(with_values(data, values), str(source)), values
            except JobFileError as exc:
                self.log(f"pbt: perturbed values {values} refused ({exc.problems[0][1]}); drawing again")
        return validate_job(with_values(data, donor_values), str(source)), dict(donor_values)


def copy_checkpoint(donor: RunDir, rundir: RunDir) -> None:
    """The donor's newest checkpoint and replay snapshots become the trial's; its own numbered checkpoints and
    snapshots go (a resume must not fall back on them)."""
    src, dst = donor.checkpoints_dir, rundir.checkpoints_dir
    for old in [*dst.glob("ckpt-*.pt"), *dst.glob("*.npz"), dst / "latest.pt"]:
        old.unlink(missing_ok=True)
    for path in [src / "latest.pt", *src.glob("*.npz")]:
        if path.is_file():  # written by rename: a complete file, whatever the donor does meanwhile
            tmp = dst / f".{path.name}.pbt"
            shutil.copyfile(path, tmp)
            os.replace(tmp, dst / path.name)
