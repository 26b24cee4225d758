"""R2D2's learner core: stored-state sequences, burn-in, rescaled n-step double-Q targets, sequence priorities."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from rlctl import metric_names as M
from rlctl.algos.base import LearnerSetup, Loss, TargetNetworkCore
from rlctl.algos.r2d2.actor import build_model
from rlctl.algos.r2d2.model import RecurrentQNetwork
from rlctl.algos.r2d2.targets import r2d2_loss, value_rescale_inv
from rlctl.optim import build_optimizer


class SequenceQ(nn.Module):
    """`unroll` as a module's forward, so DDP sees (and synchronises) it."""

    def __init__(self, net: RecurrentQNetwork):
        super().__init__()
        self.net = net

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Q-values [T, B, A] over obs [T, B, ...] from state (h, c)."""
        return self.net.unroll(obs, (h, c))[0]


class R2D2Learner(TargetNetworkCore):
    """Online and target recurrent Q-networks and Adam; `update` takes a batch of sequences sampled from replay."""

    def __init__(self, setup: LearnerSetup):
        super().__init__(setup)
        algo = setup.algo
        self.algo, self.device = algo, setup.device
        self.model = build_model(setup.job, setup.info).to(setup.device)
        self.target = copy.deepcopy(self.model)
        self.train_model = setup.distribute(SequenceQ(self.model))
        self.opt = build_optimizer("adam", self.model.parameters(), lr=algo.lr, eps=algo.adam_eps)
        self.publish_interval, self.max_grad_norm = algo.publish_interval, algo.grad_clip
        self.reward_max = 0.0  # for the divergence guard's bound max|r| / (1 - gamma)

    def _time_major(self, a: np.ndarray, dtype=None) -> torch.Tensor:
        """[B, T, ...] as sampled -> [T, B, ...] on the device."""
        return torch.from_numpy(np.array(a, dtype=dtype)).to(self.device).transpose(0, 1)

    def begin_update(self, batch: dict) -> dict:
        """The largest |reward| seen so far, for the divergence guard's bound; the learning rate in use."""
        self.reward_max = max(self.reward_max, float(np.abs(batch["reward"]).max()))
        return {M.LR: self.opt.param_groups[0]["lr"]}

    def loss(self, batch: dict, report: bool) -> Loss:
        """Burn-in without gradient from the stored state, then the loss over the rest of each sequence."""
        algo, burn = self.algo, self.algo.burn_in
        obs = self._time_major(batch["obs"])
        actions = self._time_major(batch["action"], np.int64)
        rewards = self._time_major(batch["reward"], np.float32)
        terminated = self._time_major(batch["terminated"], bool)
        valid = self._time_major(batch["valid"], bool)
        h0 = torch.from_numpy(np.array(batch["h0"], dtype=np.float32)).to(self.device)
        c0 = torch.from_numpy(np.array(batch["c0"], dtype=np.float32)).to(self.device)
        weights = torch.from_numpy(np.array(batch["weights"], dtype=np.float32)).to(self.device)
        with torch.no_grad():
            q_target, _ = self.target.unroll(obs, (h0, c0))
            # Burn-in: the stored state is stale (older weights); these steps only bring it up to date.
            q_burn, (h, c) = self.model.unroll(obs[:burn], (h0, c0)) if burn else (obs.new_zeros(0), (h0, c0))
        q_rest = self.train_model(obs[burn:], h, c)
        q = torch.cat([q_burn.reshape(burn, *q_rest.shape[1:]), q_rest]) if burn else q_rest
        loss, priorities, stats = r2d2_loss(q, q_target, actions, rewards, terminated, valid, weights, burn,
                                            algo.gamma, algo.n_step, algo.rescale_eps, algo.double, algo.priority_eta)
        # The guard compares values in return units: h^-1 of the largest rescaled |Q| (h is odd and increasing).
        stats[M.Q_ABS_MAX] = value_rescale_inv(q.detach().abs().max(), algo.rescale_eps)
        if algo.gamma < 1:
            stats[M.Q_BOUND] = self.reward_max / (1.0 - algo.gamma)
        return Loss(loss, stats, priorities)

    def samples(self, batch: dict) -> int:
        """Valid steps after burn-in."""
        return int(np.asarray(batch["valid"])[:, self.algo.burn_in:].sum())
