"""Neural network models and parameter (de)serialization helpers."""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import numpy as np
import torch
from torch import nn

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}


def mlp(in_dim: int, hidden: Sequence[int], activation: str = "relu") -> tuple[nn.Sequential, int]:
    """Build a Linear+activation trunk; return (trunk, output width)."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {sorted(_ACTIVATIONS)}")
    layers: list[nn.Module] = []
    width = int(in_dim)
    for size in hidden:
        layers += [nn.Linear(width, int(size)), _ACTIVATIONS[activation]()]
        width = int(size)
    # An empty `hidden` yields an identity trunk, so heads sit directly on the input.
    return nn.Sequential(*layers), width


class QNetwork(nn.Module):
    """MLP Q-network over flattened observations, dueling head optional."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        n_actions: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        dueling: bool = True,
    ):
        super().__init__()
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.n_actions = int(n_actions)
        self.dueling = bool(dueling)
        in_dim = math.prod(self.obs_shape)
        self.trunk, width = mlp(in_dim, hidden, activation)
        if self.dueling:
            self.value_head = nn.Linear(width, 1)
            self.advantage_head = nn.Linear(width, self.n_actions)
        else:
            self.head = nn.Linear(width, self.n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Map observations [B, *obs_shape] to Q-values [B, n_actions]."""
        param_dtype = next(self.parameters()).dtype
        features = self.trunk(obs.reshape(obs.shape[0], -1).to(param_dtype))
        if not self.dueling:
            return self.head(features)
        value = self.value_head(features)
        advantage = self.advantage_head(features)
        # Subtracting the mean advantage makes the V/A split identifiable.
        return value + advantage - advantage.mean(dim=1, keepdim=True)


def flat_parameters(module: nn.Module) -> torch.Tensor:
    """Return all parameters as one detached, contiguous float32 1-D tensor (parameters() order)."""
    chunks = [p.detach().reshape(-1).to(torch.float32) for p in module.parameters()]
    if not chunks:
        return torch.zeros(0, dtype=torch.float32)
    # torch.cat always allocates, so the result never aliases live parameters.
    return torch.cat(chunks)


def load_flat_parameters(module: nn.Module, flat: torch.Tensor | np.ndarray) -> None:
    """Copy a flat vector produced by flat_parameters back into the module's parameters."""
    if isinstance(flat, np.ndarray):
        # Copy: buffers from the wire are often read-only, which torch.from_numpy dislikes.
        flat = torch.tensor(flat)
    if flat.dim() != 1:
        raise ValueError(f"flat parameters must be 1-D, got shape {tuple(flat.shape)}")
    params = list(module.parameters())
    expected = sum(p.numel() for p in params)
    if flat.numel() != expected:
        raise ValueError(f"flat parameter size {flat.numel()} does not match module size {expected}")
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n


def parameter_digest(module: nn.Module) -> str:
    """SHA-256 hex digest of the flat float32 parameter bytes."""
    flat = flat_parameters(module).cpu().numpy()
    return hashlib.sha256(flat.tobytes()).hexdigest()
