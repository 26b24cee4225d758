"""Checkpoints: model + optimizer + counters, written durably (rlctl.durable); newest kept plus every Kth."""

from __future__ import annotations

from pathlib import Path

import torch

from rlctl.durable import remove_temporaries, replace_file

FORMAT = 1


class CheckpointError(Exception):
    """A checkpoint that cannot be read or used."""


def save_checkpoint(directory: str | Path, payload: dict, name: str = "latest.pt", index: int = 0,
                    keep_every: int = 0) -> Path:
    """Write `name` durably; also keep `ckpt-<index>.pt` when index is a multiple of keep_every."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    numbered = d / f"ckpt-{index:06d}.pt" if keep_every and index % keep_every == 0 else None
    return replace_file(d / name, lambda f: torch.save({"format": FORMAT, **payload}, f), link_also=numbered)


def newest_checkpoint(directory: str | Path, name: str = "latest.pt") -> dict | None:
    """The newest readable checkpoint in `directory` (`name`, else the highest numbered one), or None; temporary
    files of killed writers are removed first."""
    d = Path(directory)
    remove_temporaries(d)
    candidates = [d / name] + sorted(d.glob("ckpt-*.pt"), reverse=True)
    for path in candidates:
        if path.is_file():
            try:
                return {**load_checkpoint(path), "path": str(path)}
            except CheckpointError as exc:
                print(f"skipping checkpoint {path}: {exc}", flush=True)
    return None


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint (tensors and plain data only: no pickled code is executed)."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise CheckpointError(f"cannot read checkpoint: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError("not an rlctl checkpoint")
    return data


def evaluate_checkpoint(path: str | Path, episodes: int, seed: int) -> dict:
    """Greedy episodes with a checkpoint's policy; returns mean/min/max return and lengths."""
    from rlctl.algos import build_model
    from rlctl.envs import SpaceInfo
    from rlctl.roles.evaluator import greedy_episodes
    from rlctl.spec import validate_job

    data = load_checkpoint(path)
    spec = validate_job(data["job"], f"{path}:job")
    if "space" not in data:
        raise CheckpointError("checkpoint has no 'space' record (written by an older rlctl)")
    model = build_model(spec, SpaceInfo.from_dict(data["space"]))
    model.load_state_dict(data["model"])
    returns, lengths = greedy_episodes(model, spec.env, episodes, seed, spec.algo.recurrent)
    return {"checkpoint": str(path), "updates": int(data.get("updates", 0)), "episodes": episodes,
            "return_mean": float(returns.mean()), "return_min": float(returns.min()),
            "return_max": float(returns.max()), "length_mean": float(lengths.mean())}
