"""Checkpoints: model + optimizer + counters, written atomically; newest kept plus every Kth."""

from __future__ import annotations

import os
from pathlib import Path

import torch

FORMAT = 1


class CheckpointError(Exception):
    """A checkpoint that cannot be read or used."""


def save_checkpoint(directory: str | Path, payload: dict, name: str = "latest.pt", index: int = 0,
                    keep_every: int = 0) -> Path:
    """Write `name` atomically; also keep `ckpt-<index>.pt` when index is a multiple of keep_every."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{name}.{os.getpid()}.tmp"
    torch.save({"format": FORMAT, **payload}, tmp)
    numbered = d / f"ckpt-{index:06d}.pt"
    if keep_every and index % keep_every == 0 and not numbered.exists():
        os.link(tmp, numbered)  # same bytes, no second write
    os.replace(tmp, d / name)
    return d / name


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
