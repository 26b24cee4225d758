"""Optional Weights & Biases mirror of a run's scalars (`[logging] wandb`), written by the supervisor beside its
TensorBoard files. wandb is imported only here, only when a job asks for it."""

from __future__ import annotations

import os
import sys


class WandbMirror:
    """One W&B run per rlctl run (the same id, so `rlctl run --resume` continues it), config = the job's keys."""

    def __init__(self, spec, run_id: str, run_dir: str, config: dict):
        os.environ.setdefault("WANDB_SILENT", "true")  # its banner would tear through the live table
        import wandb

        self.run = wandb.init(project=spec.project, entity=spec.entity, mode=spec.mode, dir=run_dir, name=run_id,
                              id=run_id, resume="allow", config=config)

    def log(self, values: dict, step: int) -> None:
        """The scalars of one TensorBoard point, at the same step (env steps)."""
        self.run.log(values, step=step)

    def finish(self, ok: bool) -> None:
        """Close the W&B run (its exit code: 0 unless the run failed)."""
        self.run.finish(exit_code=0 if ok else 1)


def open_mirror(spec, run_id: str, run_dir: str, config: dict) -> WandbMirror | None:
    """The mirror, or None (with the reason on stderr) when W&B cannot start: a logging mirror never fails a run."""
    try:
        return WandbMirror(spec, run_id, run_dir, config)
    except Exception as exc:  # wandb raises many types (no login, network, a bad entity)
        print(f"supervisor: Weights & Biases disabled for this run: {type(exc).__name__}: {exc}", file=sys.stderr,
              flush=True)
        return None
