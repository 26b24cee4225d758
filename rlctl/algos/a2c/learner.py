"""A2C's learner core: the policy-gradient, value and entropy loss over a round's rollouts, one step per round."""

from __future__ import annotations

import torch

from rlctl import metric_names as M
from rlctl.algos.base import Loss
from rlctl.algos.onpolicy.learner import ActorCriticCore
from rlctl.algos.onpolicy.returns import gae, masked_mean


class A2CLearner(ActorCriticCore):
    """Advantages from the training forward's own (detached) values."""

    def loss(self, r: dict[str, torch.Tensor], report: bool) -> Loss:
        """-logp x advantage + vf_coef x squared value error - ent_coef x entropy, averaged over valid steps."""
        algo = self.algo
        rewards, logp, entropy, values = self._evaluate(r)
        T, B = rewards.shape
        with torch.no_grad():
            adv, returns = gae(rewards, values.detach(), r["terminated"], r["done"], r["valid"], algo.gamma,
                               algo.gae_lambda)
        valid = r["valid"].float()
        if algo.norm_adv and valid.sum() > 1:
            mean = masked_mean(adv, valid)
            adv = (adv - mean) / (masked_mean((adv - mean).pow(2), valid).sqrt() + 1e-8)
        policy_loss = masked_mean(-logp * adv, valid)
        value_loss = masked_mean((values[:T] - returns).pow(2), valid)
        ent = masked_mean(entropy, valid)
        loss = policy_loss + algo.vf_coef * value_loss - algo.ent_coef * ent
        return Loss(loss, {M.POLICY_LOSS: policy_loss.detach(), M.VALUE_LOSS: value_loss.detach(),
                           M.ENTROPY: ent.detach()})
