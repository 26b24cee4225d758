"""The R2D2 network: MLP encoder, LSTM core (or a same-width feed-forward stand-in), dueling Q head."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import nn

from rlctl.models import linear, mlp, mlp_forward

State = tuple[torch.Tensor, torch.Tensor]


class RecurrentQNetwork(nn.Module):
    """Q-values from an observation and a recurrent state (h, c), each [B, lstm_size].

    `memory = "none"` swaps the LSTM for Linear + ReLU of the same width and passes the state through untouched,
    so a job can be run without recurrence (same API, same sizes) to show what the recurrence is worth.
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, hidden: Sequence[int] = (64,),
                 activation: str = "relu", lstm_size: int = 64, memory: str = "lstm", dueling: bool = True):
        super().__init__()
        if memory not in ("lstm", "none"):
            raise ValueError(f"unknown memory {memory!r}; expected 'lstm' or 'none'")
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.n_actions, self.lstm_size = int(n_actions), int(lstm_size)
        self.memory, self.dueling = memory, bool(dueling)
        self.trunk, width = mlp(math.prod(self.obs_shape), hidden, activation)
        # Seq-first, as the learner unrolls [T, B] batches.
        self.core = nn.LSTM(width, self.lstm_size) if memory == "lstm" else nn.Linear(width, self.lstm_size)
        if self.dueling:
            self.value_head = nn.Linear(self.lstm_size, 1)
            self.advantage_head = nn.Linear(self.lstm_size, self.n_actions)
        else:
            self.head = nn.Linear(self.lstm_size, self.n_actions)

    def _weight(self) -> torch.Tensor:
        """A parameter to read the dtype and device from (float32 unless the module was cast)."""
        return self.value_head.weight if self.dueling else self.head.weight

    def _encode(self, obs: torch.Tensor, lead: int) -> torch.Tensor:
        """Trunk features [*obs.shape[:lead], width]; float64 or uint8 observations are cast to the parameters'."""
        flat = obs.reshape(*obs.shape[:lead], -1).to(self._weight().dtype)
        return mlp_forward(self.trunk, flat)

    def _q(self, features: torch.Tensor) -> torch.Tensor:
        """Q-values [..., A] from core outputs [..., lstm_size]."""
        if not self.dueling:
            return linear(self.head, features)
        value = linear(self.value_head, features)
        advantage = linear(self.advantage_head, features)
        # Subtracting the mean advantage makes the V/A split identifiable.
        return value + advantage - advantage.mean(dim=-1, keepdim=True)

    def initial_state(self, batch: int) -> State:
        """Zero state (h, c), each [batch, lstm_size], on the parameters' device."""
        weight = self._weight()
        zeros = torch.zeros(batch, self.lstm_size, dtype=weight.dtype, device=weight.device)
        return zeros, zeros.clone()

    def unroll(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Q-values [T, B, A] over obs [T, B, *obs_shape] from `state`, and the state after the last step.

        One nn.LSTM call over the whole sequence; no resets inside (a stored sequence never crosses an episode end).
        """
        x = self._encode(obs, 2)
        if self.memory == "none":
            return self._q(torch.relu(linear(self.core, x))), state
        h, c = state
        out, (h_n, c_n) = self.core(x, (h.unsqueeze(0), c.unsqueeze(0)))
        return self._q(out), (h_n.squeeze(0), c_n.squeeze(0))

    def step(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One time step: Q-values [B, A] for obs [B, *obs_shape], and the new state."""
        x = self._encode(obs, 1)
        if self.memory == "none":
            return self._q(torch.relu(linear(self.core, x))), state
        # torch.lstm_cell on nn.LSTM's own weights (same gate layout) skips nn.LSTM's per-call checks and the
        # sequence/layer packing: the actor calls this every vector-env step.
        core = self.core
        h, c = torch.lstm_cell(x, (state[0], state[1]), core.weight_ih_l0, core.weight_hh_l0,
                               core.bias_ih_l0, core.bias_hh_l0)
        return self._q(h), (h, c)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [B, A] of one step from the zero state, for generic code that calls model(obs)."""
        return self.step(obs, self.initial_state(obs.shape[0]))[0]

    def greedy(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Greedy actions [B] (int64) for one step, and the new state."""
        q, new_state = self.step(obs, state)
        return q.argmax(dim=1), new_state

    def reset_state(self, state: State, mask: torch.Tensor | np.ndarray) -> State:
        """The state with the rows where `mask` [B] is True set to zero (envs starting an episode)."""
        h, c = state
        keep = ~torch.as_tensor(mask, dtype=torch.bool, device=h.device)
        keep = keep.unsqueeze(1).to(h.dtype)
        return h * keep, c * keep
