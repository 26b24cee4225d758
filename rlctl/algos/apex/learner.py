"""Ape-X's learner core: double (or plain) n-step DQN targets, importance-weighted Huber loss, new priorities."""

from __future__ import annotations

import copy

import numpy as np
import torch

from rlctl import metric_names as M
from rlctl.algos.apex.actor import build_model
from rlctl.algos.apex.dqn import targets_from_q, td_loss
from rlctl.algos.base import LearnerSetup, Loss, TargetNetworkCore
from rlctl.optim import build_optimizer


class ApexLearner(TargetNetworkCore):
    """Online and target Q-networks and fused Adam; `update` takes a batch sampled from replay."""

    def __init__(self, setup: LearnerSetup):
        super().__init__(setup)
        algo, device = setup.algo, setup.device
        self.algo, self.device = algo, device
        self.model = build_model(setup.job, setup.info).to(device)
        self.target = copy.deepcopy(self.model)
        self.train_model = setup.distribute(self.model)
        # Fused Adam: one kernel for all parameters (about 20% of a small network's update on CPU).
        self.opt = build_optimizer("adam", self.model.parameters(), lr=algo.lr, eps=algo.adam_eps)
        self.publish_interval, self.max_grad_norm = algo.publish_interval, algo.grad_clip
        # |Q| <= max|R_n| / (1 - gamma^n) for n-step returns R_n: the divergence guard's bound, from the data seen.
        self.reward_max = 0.0
        self.bound_scale = 1.0 / (1.0 - algo.gamma ** algo.n_step) if algo.gamma < 1 else None  # None: no bound

    def _tensor(self, a: np.ndarray, dtype=None) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=dtype)).to(self.device)

    def begin_update(self, batch: dict) -> dict:
        """The largest |reward| seen so far, for the divergence guard's bound; the learning rate in use."""
        self.reward_max = max(self.reward_max, float(np.abs(batch["reward"]).max()))
        return {M.LR: self.opt.param_groups[0]["lr"]}

    def loss(self, batch: dict, report: bool) -> Loss:
        """Double-DQN loss on n-step transitions; priorities |TD| for the sampled keys."""
        algo = self.algo
        obs, next_obs = self._tensor(batch["obs"]), self._tensor(batch["next_obs"])
        actions = self._tensor(batch["action"], np.int64)
        rewards = self._tensor(batch["reward"], np.float32)
        discounts = self._tensor(batch["discount"], np.float32)
        weights = self._tensor(batch["weights"], np.float32)
        # One forward over [s; s'] through DDP: Q(s) for the loss, Q_online(s') for double-DQN action choice.
        both = self.train_model(torch.cat([obs, next_obs]))
        q, next_q_online = both[: len(obs)], both[len(obs):].detach()
        with torch.no_grad():
            y = targets_from_q(next_q_online, self.target(next_obs), rewards, discounts, algo.double)
        loss, td_abs = td_loss(q, actions, y, weights)
        stats = {M.TD_LOSS: loss.detach(), M.Q_MEAN: q.detach().mean(), M.Q_ABS_MAX: q.detach().abs().max()}
        if self.bound_scale is not None:
            stats[M.Q_BOUND] = self.reward_max * self.bound_scale
        return Loss(loss, stats, td_abs.cpu().numpy().astype(np.float32))

    def samples(self, batch: dict) -> int:
        """Transitions sampled."""
        return len(batch["obs"])
