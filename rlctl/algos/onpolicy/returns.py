"""Rollout math for PPO, APPO and IMPALA: GAE, V-trace and the losses, over [T, B] tensors.

Rollouts come from gymnasium vector envs with NEXT_STEP autoreset, so a rollout
holds T+1 observations and, per step, `valid` (False on the reset step that
follows an episode end: its action was ignored), `terminated` and `done`
(terminated or truncated). Values V[0..T] are those of the T+1 observations;
after a truncation V[t+1] is the value of the episode's final observation (the
env returns it on the truncating step), so time limits are bootstrapped and
true terminations are not. The recursions loop over time only, vectorized over
every env of the batch.
"""

from __future__ import annotations

import torch

from rlctl import metric_names as M


def gae(rewards: torch.Tensor, values: torch.Tensor, terminated: torch.Tensor, done: torch.Tensor,
        valid: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and returns ([T, B] each) from values [T+1, B]."""
    T = rewards.shape[0]
    not_term = 1.0 - terminated.float()
    carry = 1.0 - done.float()  # the advantage chain stops at every episode end
    mask = valid.float()  # reset steps get 0 (they are left out of every loss)
    deltas = rewards + gamma * values[1:] * not_term - values[:-1]
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(T - 1, -1, -1):
        running = (deltas[t] + gamma * lam * carry[t] * running) * mask[t]
        adv[t] = running
    return adv, adv + values[:-1]


def vtrace(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
           terminated: torch.Tensor, done: torch.Tensor, valid: torch.Tensor, gamma: float,
           rho_bar: float = 1.0, c_bar: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace value targets v_s [T, B] and policy-gradient advantages [T, B] (Espeholt et al. 2018, eq. 1).

    `values` [T+1, B] are the current (target-policy) values; the advantages use
    rho_s (r_s + gamma v_{s+1} - V(x_s)) with rho clipped at `rho_bar`.
    """
    T = rewards.shape[0]
    ratio = torch.exp(target_logp - behaviour_logp)
    rho = torch.clamp(ratio, max=rho_bar)
    c = torch.clamp(ratio, max=c_bar)
    not_term = 1.0 - terminated.float()
    carry = (1.0 - done.float()) * gamma  # traces never cross an episode end
    mask = valid.float()  # reset steps: v_s = V(x_s), advantage 0
    deltas = rho * (rewards + gamma * values[1:] * not_term - values[:-1])
    acc = torch.zeros_like(rewards[0])
    vs_minus_v = torch.zeros_like(rewards)
    for t in range(T - 1, -1, -1):
        acc = (deltas[t] + carry[t] * c[t] * acc) * mask[t]
        vs_minus_v[t] = acc
    vs = vs_minus_v + values[:-1]
    # v_{s+1} for the advantage: the next step's target inside an episode, V(x_{s+1}) across a time-limit cut.
    next_vs = torch.cat([vs[1:], values[-1:]])
    next_vs = torch.where(done.bool(), values[1:], next_vs)
    pg_adv = rho * (rewards + gamma * next_vs * not_term - values[:-1]) * mask
    return vs, pg_adv


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask (0/1 weights); 0 where the mask is empty."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def ppo_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, new_values: torch.Tensor,
             old_values: torch.Tensor, returns: torch.Tensor, entropy: torch.Tensor, clip: float,
             value_clip: float | None, vf_coef: float, ent_coef: float,
             diagnostics: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped-surrogate PPO loss (policy + vf_coef * value - ent_coef * entropy) and its statistics
    (approx_kl and clipfrac only with `diagnostics`: they cost a tenth of a small minibatch step)."""
    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    policy_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip)).mean()
    v_loss = (new_values - returns).pow(2)
    if value_clip is not None:
        clipped = old_values + (new_values - old_values).clamp(-value_clip, value_clip)
        v_loss = torch.max(v_loss, (clipped - returns).pow(2))
    value_loss = 0.5 * v_loss.mean()
    ent = entropy.mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * ent
    stats = {M.POLICY_LOSS: policy_loss.detach(), M.VALUE_LOSS: value_loss.detach(),
             M.ENTROPY: ent.detach()}
    if diagnostics:
        with torch.no_grad():
            stats[M.APPROX_KL] = ((ratio - 1) - log_ratio).mean()
            stats[M.CLIPFRAC] = ((ratio - 1).abs() > clip).float().mean()
    return loss, stats


def impala_loss(logp: torch.Tensor, entropy: torch.Tensor, values: torch.Tensor, vs: torch.Tensor,
                pg_adv: torch.Tensor, mask: torch.Tensor, vf_coef: float,
                ent_coef: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IMPALA's actor-critic loss on V-trace targets, averaged over valid steps ([T, B] inputs)."""
    policy_loss = -masked_mean(logp * pg_adv.detach(), mask)
    value_loss = 0.5 * masked_mean((vs.detach() - values).pow(2), mask)
    ent = masked_mean(entropy, mask)
    loss = policy_loss + vf_coef * value_loss - ent_coef * ent
    stats = {M.POLICY_LOSS: policy_loss.detach(), M.VALUE_LOSS: value_loss.detach(),
             M.ENTROPY: ent.detach()}
    return loss, stats
