"""R2D2 learning math: value rescaling, n-step double-Q targets over stored sequences, sequence priorities, loss.

Everything is time-major: Q tables [T+1, B, A] for the T+1 observations of a sequence, per-step arrays [T, B].
"""

from __future__ import annotations

import numpy as np
import torch

from rlctl import metric_names as M


def value_rescale(x, eps: float = 1e-3):
    """h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x, for a torch tensor or a numpy array."""
    # sqrt(|x|+1) - 1 = |x| / (sqrt(|x|+1) + 1): the same value without the cancellation near 0 (in float32 the
    # plain form loses about 3 digits there).
    if isinstance(x, torch.Tensor):
        return x / (torch.sqrt(x.abs() + 1.0) + 1.0) + eps * x
    x = np.asarray(x)
    return x / (np.sqrt(np.abs(x) + 1.0) + 1.0) + eps * x


def value_rescale_inv(x, eps: float = 1e-3):
    """The exact inverse h^-1(x) = sign(x)(((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1).

    Computed as x (u - 1)(u + 1) with u = (sqrt(...) - 1) / (2 eps) rewritten so nothing cancels (u - 1 in closed
    form); the paper's form loses most float32 digits for small |x| and divides by zero at eps = 0, this one does
    neither.
    """
    lib = torch if isinstance(x, torch.Tensor) else np
    x = x if lib is torch else np.asarray(x)
    a = lib.abs(x)
    s = lib.sqrt(1.0 + 4.0 * eps * (a + 1.0 + eps))
    u = 2.0 * (a + 1.0 + eps) / (s + 1.0)
    u_minus_1_over_a = (2.0 - 4.0 * eps / (1.0 + 2.0 * eps + s)) / (s + 1.0)
    return x * u_minus_1_over_a * (u + 1.0)


def nstep_targets(q_online_next: torch.Tensor, q_target: torch.Tensor, actions: torch.Tensor,
                  rewards: torch.Tensor, terminated: torch.Tensor, valid: torch.Tensor, gamma: float, n: int,
                  eps: float = 1e-3, double: bool = True) -> torch.Tensor:
    """Rescaled n-step targets [T, B], 0 at invalid steps, without grad.

    y_t = h(sum_{k<m} gamma^k r_{t+k} + gamma^m (1 - terminated_{t+m-1}) h^-1(Q_target(s_{t+m}, a*))), m the
    n steps cut short at the episode's end (a terminated step, or a step whose successor is invalid: the obs row
    after it holds the final observation) and at the sequence's end; a* the argmax of Q_online (double) or of
    Q_target at s_{t+m}. `actions` is unused here (targets need only the bootstrap argmax) and kept so the
    signature lists a sequence's fields in one order.
    """
    del actions
    with torch.no_grad():
        steps = rewards.shape[0]
        valid = valid.bool()
        terminated = terminated.bool()
        # An episode ends at a step that terminates or whose next step is not a transition; the sequence's own
        # end is handled by the `span` cut below (bootstrap from the stored obs row T).
        ends = terminated.clone()
        ends[:-1] |= ~valid[1:]
        rewards = rewards.to(q_target.dtype)
        ret = torch.zeros_like(rewards)
        disc = torch.ones_like(rewards)
        start = torch.arange(steps, device=rewards.device).unsqueeze(1).expand(rewards.shape)
        last = start.clone()  # the last step summed into each start's return
        ended = torch.zeros_like(valid)
        for k in range(n):
            # Offset k of every start t at once: rows shifted up by k; rows past the sequence end are absent.
            span = steps - k
            if span <= 0:
                break
            active = valid[:span] & ~ended[:span]
            ret[:span] += torch.where(active, disc[:span] * rewards[k:], 0.0)
            disc[:span] = torch.where(active, disc[:span] * gamma, disc[:span])
            last[:span] = torch.where(active, start[:span] + k, last[:span])
            ended[:span] |= active & ends[k:]
        # One argmax per stored row, then each step reads the row after its last summed step.
        table = q_online_next if double else q_target
        best = table.argmax(dim=-1, keepdim=True)
        row_values = value_rescale_inv(q_target.gather(-1, best).squeeze(-1), eps)  # [T+1, B]
        cols = torch.arange(rewards.shape[1], device=rewards.device).unsqueeze(0)
        bootstrap = row_values[last + 1, cols]
        not_term = (~terminated.gather(0, last)).to(ret.dtype)
        targets = value_rescale(ret + disc * not_term * bootstrap, eps)
        return torch.where(valid, targets, 0.0)


def sequence_priorities(td_abs: torch.Tensor, mask: torch.Tensor, eta: float = 0.9) -> torch.Tensor:
    """Per-sequence priority [B]: eta max_t |delta| + (1 - eta) mean_t |delta| over masked steps; 0 if none."""
    mask = mask.bool()
    masked = torch.where(mask, td_abs, 0.0)  # |delta| >= 0, so 0 never wins the max over a real step
    count = mask.sum(0).clamp(min=1).to(td_abs.dtype)
    return eta * masked.max(dim=0).values + (1.0 - eta) * masked.sum(0) / count


def _td(q: torch.Tensor, targets: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor, burn_in: int):
    """(Q(s_t, a_t), delta, mask) for the steps from `burn_in` on: burn-in steps only warm the recurrent state, so
    they are sliced away (no loss, no priority, no gradient)."""
    q_taken = q[burn_in:-1].gather(-1, actions[burn_in:].long().unsqueeze(-1)).squeeze(-1)
    return q_taken, q_taken - targets[burn_in:], valid[burn_in:].bool()


def r2d2_loss(q: torch.Tensor, q_target: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
              terminated: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor, burn_in: int, gamma: float,
              n: int, eps: float = 1e-3, double: bool = True, eta: float = 0.9):
    """(loss, priorities [B] float32 numpy, stats): importance-weighted mean over sequences of the mean
    1/2 delta^2 over their valid steps from `burn_in` on, delta = Q(s_t, a_t) - y_t.

    `q` [T+1, B, A] carries grad (the caller unrolled the online net over burn-in and the rest); burn-in steps
    carry no loss and no priority, and their Q entries get exactly zero gradient (they are sliced away).
    """
    targets = nstep_targets(q.detach(), q_target, actions, rewards, terminated, valid, gamma, n, eps, double)
    q_taken, td, mask = _td(q, targets, actions, valid, burn_in)
    maskf = mask.to(td.dtype)
    count = maskf.sum(0).clamp(min=1.0)
    per_sequence = (0.5 * td.pow(2) * maskf).sum(0) / count
    loss = (weights.to(td.dtype) * per_sequence).mean()
    priorities = sequence_priorities(td.detach().abs(), mask, eta)
    with torch.no_grad():
        q_mean = (q_taken * maskf).sum() / maskf.sum().clamp(min=1.0)
    stats = {M.TD_LOSS: loss.detach(), M.Q_MEAN: q_mean}
    return loss, priorities.float().cpu().numpy(), stats


def actor_priorities(q: np.ndarray, actions: np.ndarray, rewards: np.ndarray, terminated: np.ndarray,
                     valid: np.ndarray, burn_in: int, gamma: float, n: int, eps: float = 1e-3,
                     eta: float = 0.9) -> np.ndarray:
    """Initial priorities [B] float32 from the Q-values the actor acted on (one table serves as online and target).

    numpy in and out; the math is r2d2_loss's own (through zero-copy torch views), so the two cannot drift apart.
    """
    q_t = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32))
    actions_t = torch.from_numpy(np.ascontiguousarray(actions, dtype=np.int64))
    rewards_t = torch.from_numpy(np.ascontiguousarray(rewards, dtype=np.float32))
    terminated_t = torch.from_numpy(np.ascontiguousarray(terminated, dtype=bool))
    valid_t = torch.from_numpy(np.ascontiguousarray(valid, dtype=bool))
    targets = nstep_targets(q_t, q_t, actions_t, rewards_t, terminated_t, valid_t, gamma, n, eps, double=True)
    _, td, mask = _td(q_t, targets, actions_t, valid_t, burn_in)
    return sequence_priorities(td.abs(), mask, eta).numpy().astype(np.float32)
