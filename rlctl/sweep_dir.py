"""Sweep directories: a sweep's `sweep.json` (its trials, their values and seeds, its scheduler and status) and one
ordinary run directory per trial under it::

    <runs_dir>/<sweep-name>-<YYYYmmdd-HHMMSS>/
        sweep.json  scheduler.log  [pbt.jsonl]  t000/  t001/ ...   (each: job.toml plan.json state.json logs/ tb/
                                                                     checkpoints/)

A trial's folder holds its job.toml from the start; its state.json appears when the scheduler starts it.
On the fast CLI path (`rlctl status`, `stop`, `compare`): standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlctl.durable import replace_bytes
from rlctl.rundir import RunDir, RunNotFound, _read_json, status_of
from rlctl.run_status import RunStatus

SWEEP_JSON = "sweep.json"
PBT_JSONL = "pbt.jsonl"  # population-based training: one exploit a line (rlctl.supervise.pbt)


class SweepDir:
    """Paths and state of one sweep directory."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.sweep_id = self.path.name
        self.sweep_json = self.path / SWEEP_JSON
        self.log = self.path / "scheduler.log"

    def __repr__(self) -> str:
        return f"SweepDir({str(self.path)!r})"

    def read(self) -> dict:
        """sweep.json ({} when missing or unreadable; never raises)."""
        return _read_json(self.sweep_json) or {}

    def write(self, data: dict) -> None:
        """sweep.json, durably."""
        replace_bytes(self.sweep_json, (json.dumps(data, indent=1, default=str) + "\n").encode())

    def update(self, **changes) -> dict:
        """sweep.json with `changes` applied (only its scheduler writes while it lives)."""
        data = {**self.read(), **changes}
        self.write(data)
        return data

    def trials(self) -> list[dict]:
        """The trials as sweep.json lists them: id, values, seed."""
        listed = self.read().get("trials")
        return [t for t in listed if isinstance(t, dict) and isinstance(t.get("id"), str)] if isinstance(
            listed, list) else []

    def lineage(self) -> list[dict]:
        """The exploits of population-based training, oldest first (pbt.jsonl; [] without one)."""
        try:
            lines = (self.path / PBT_JSONL).read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a killed scheduler
            if isinstance(record, dict) and isinstance(record.get("trial"), str):
                out.append(record)
        return out

    def trial_dir(self, trial_id: str) -> RunDir:
        """The run directory of one trial."""
        return RunDir(self.path / trial_id)

    def status(self, data: dict | None = None) -> str:
        """The sweep's status: its scheduler's word, `lost` when the scheduler died without one."""
        return status_of(self.read() if data is None else data)


def trial_status(rundir: RunDir) -> str:
    """A trial's status: its run's, or pending while its run has not begun."""
    state = rundir.read_state()
    return RunStatus.PENDING if state is None else status_of(state)


def sweep_hparams(run_path: Path, hparams: dict) -> dict:
    """A sweep trial's own hyperparameters for TensorBoard's HParams tab: `sweep.trial`, then each parameter of
    the sweep (its value as the job has it, else as sweep.json lists it) and `job.seed` where the sweep has several
    seeds; {} for a run that is no sweep's trial."""
    parent = Path(run_path).parent
    if not is_sweep(parent):
        return {}
    sweep = SweepDir(parent)
    trials = sweep.trials()
    trial = next((t for t in trials if t["id"] == Path(run_path).name), None)
    if trial is None:
        return {}
    values = trial.get("values") if isinstance(trial.get("values"), dict) else {}
    out: dict = {"sweep.trial": trial["id"]}
    out.update({k: hparams.get(k, v) for k, v in values.items()})
    if len({t.get("seed") for t in trials}) > 1:
        out["job.seed"] = hparams.get("job.seed", trial.get("seed"))
    return out


def is_sweep(path: Path) -> bool:
    """True for a folder holding a sweep.json."""
    return (Path(path) / SWEEP_JSON).is_file()


def list_sweeps(root: Path) -> list[SweepDir]:
    """Every sweep under root, by id (oldest first: ids end with their start time)."""
    try:
        return [SweepDir(p) for p in sorted(Path(root).iterdir()) if is_sweep(p)]
    except OSError:
        return []


def find_sweep(root: Path, name: str | None) -> SweepDir | None:
    """The sweep an id, unique id prefix or path names; None when it names no sweep (it may name a run). A prefix of
    several sweeps is RunNotFound."""
    if not name:
        return None
    if is_sweep(Path(name)) and ("/" in name or not (Path(root) / name).exists()):
        return SweepDir(Path(name))
    if "/" not in name and is_sweep(Path(root) / name):
        return SweepDir(Path(root) / name)
    matches = [s for s in list_sweeps(root) if s.sweep_id.startswith(name)]
    if len(matches) > 1:
        raise RunNotFound(f"{name!r} matches {len(matches)} sweeps: {', '.join(s.sweep_id for s in matches)}; "
                          "give more of the sweep id")
    return matches[0] if matches else None
