"""Ape-X DQN math: actor-side exploration, n-step transitions and priorities, learner-side targets and loss.

No sockets or processes here; the collector and learner roles call into these functions.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlctl.envs import autoreset_valid
from rlctl.data.frames import frame_table


def epsilon_ladder(num_actors: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Per-actor exploration rates eps_i = base ** (1 + alpha * i / (N - 1)) from the Ape-X paper."""
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}")
    if num_actors == 1:
        return np.array([base], dtype=np.float32)
    i = np.arange(num_actors, dtype=np.float64)
    return (base ** (1.0 + alpha * i / (num_actors - 1))).astype(np.float32)


class NStepAccumulator:
    """Turns a vector env's step stream into n-step transitions, per env, vectorized over envs.

    The per-step form: collectors use ChunkedNStep, and the tests hold the two to the same output.

    Each call to `step` feeds one vector-env step (s_t, a_t, r_t, s_{t+1}, terminated, truncated)
    for all envs and returns the transitions that became complete:

    * mid-episode, once an env holds n pending steps, each new step completes the oldest one
      with the n-step return and discount gamma**n;
    * on `terminated`, every pending step completes with its partial return up to the episode
      end, next_obs = the final observation and discount 0 (no bootstrap past a true terminal);
    * on `truncated` (time limit, not terminated), likewise but with discount gamma**m, m being
      the number of rewards summed, so the learner bootstraps from the final observation.

    `valid` handles gymnasium 1.x's default NEXT_STEP autoreset: on the step after an episode
    ends, the vector env resets that sub-env, ignores the action and returns the reset obs with
    reward 0. That step is not a transition, so the collector passes
    valid = ~(previous terminated | truncated); rows with valid False are ignored entirely.

    Emitted rows are ordered by env index, then oldest pending step first.
    """

    def __init__(self, num_envs: int, n: int, gamma: float, obs_shape: tuple[int, ...], obs_dtype=np.float32):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.num_envs = int(num_envs)
        self.n = int(n)
        self.gamma = float(gamma)
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.obs_dtype = np.dtype(obs_dtype)
        # Ring buffers indexed [slot, env]; an env's pending steps live at slots start..start+count-1 (mod n).
        self._obs = np.zeros((self.n, self.num_envs, *self.obs_shape), dtype=self.obs_dtype)
        self._actions = np.zeros((self.n, self.num_envs), dtype=np.int64)
        # float64 so long discounted sums don't drift before the final float32 cast.
        self._rewards = np.zeros((self.n, self.num_envs), dtype=np.float64)
        self._start = np.zeros(self.num_envs, dtype=np.int64)
        self._count = np.zeros(self.num_envs, dtype=np.int64)
        self._env_index = np.arange(self.num_envs)
        self._age = np.arange(self.n)

    def pending(self) -> np.ndarray:
        """Number of steps each env holds that have not been emitted yet."""
        return self._count.copy()

    def reset(self) -> None:
        """Drop all pending steps (e.g. after the collector resets every env)."""
        self._start[:] = 0
        self._count[:] = 0

    def step(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        valid: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Feed one vector-env step; return the transitions that became complete (possibly zero rows)."""
        n, gamma = self.n, self.gamma
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        valid = np.ones(self.num_envs, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
        envs = self._env_index[valid]

        # 1. Append the new step of every valid env at the end of its window.
        write_slot = (self._start[envs] + self._count[envs]) % n
        self._obs[write_slot, envs] = np.asarray(obs)[valid]
        self._actions[write_slot, envs] = np.asarray(actions)[valid]
        self._rewards[write_slot, envs] = np.asarray(rewards, dtype=np.float64)[valid]
        self._count[envs] += 1

        done = (terminated | truncated) & valid
        full = valid & ~done & (self._count == n)

        # 2. Rewards in age order [age, env], zero past each env's count, then backward discounted sums.
        slot_by_age = (self._start[None, :] + self._age[:, None]) % n
        in_window = self._age[:, None] < self._count[None, :]
        rewards_by_age = np.where(in_window, self._rewards[slot_by_age, self._env_index[None, :]], 0.0)
        returns = np.zeros_like(rewards_by_age)
        running = np.zeros(self.num_envs, dtype=np.float64)
        for k in range(n - 1, -1, -1):
            running = rewards_by_age[k] + gamma * running
            returns[k] = running

        # 3. Which (env, age) pairs complete now: whole window on episode end, the oldest when full.
        emit = (done[None, :] & in_window) | (full[None, :] & (self._age[:, None] == 0))
        env_idx, age_idx = np.nonzero(emit.T)  # env-major, oldest first
        slots = slot_by_age[age_idx, env_idx]
        m = self._count[env_idx] - age_idx
        discount = np.where(terminated[env_idx], 0.0, gamma ** m.astype(np.float64))

        out = {
            "obs": self._obs[slots, env_idx].copy(),
            "action": self._actions[slots, env_idx].copy(),
            "reward": returns[age_idx, env_idx].astype(np.float32),
            "next_obs": np.asarray(next_obs, dtype=self.obs_dtype)[env_idx],
            "discount": discount.astype(np.float32),
        }

        # 4. Slide full windows by one; clear windows of finished episodes.
        self._start[full] = (self._start[full] + 1) % n
        self._count[full] = n - 1
        self._start[done] = 0
        self._count[done] = 0
        return out


class ChunkedNStep:
    """NStepAccumulator's transitions, computed once per chunk of steps instead of once per step.

    `add` only copies one vector-env step into [rows, env] arrays (a few microseconds); `take` emits every
    transition that became complete, vectorized over the whole chunk with a loop over the n offsets. The last
    n-1 rows carry over, with a flag for the starts still waiting for later rewards. Same rules as
    NStepAccumulator (terminated: no bootstrap; truncated: bootstrap from the final obs; NEXT_STEP autoreset
    steps, the step after each end, are not transitions), and the tests check the two agree. Which steps are
    autoreset steps follows from the stored ends, so `add` takes none of it (envs.autoreset_valid).

    With `n_actions`, `add` also takes the Q-values the actor acted on, and `take` adds Ape-X initial priorities
    |R + discount * max Q(s') - Q(s, a)| without another forward pass: every next observation is acted on one
    step later (also the final one, on the autoreset step), so a transition waits one row for its Q(s').

    With `frame_stack` S (observations are S-frame stacks; needs `n_actions`), `take` sends each frame of the
    chunk once: `frames` and, per transition, `obs_frame` / `next_frame`, where its stacks start in `frames`
    (rlctl.data.frames), instead of `obs` / `next_obs`.
    """

    def __init__(self, num_envs: int, n: int, gamma: float, obs_shape: tuple[int, ...], obs_dtype=np.float32,
                 chunk: int = 32, n_actions: int = 0, frame_stack: int = 0):
        if frame_stack and not n_actions:
            raise ValueError("frame tables need n_actions (next observations are then rows of the chunk)")
        self.frame_stack = int(frame_stack)
        self.num_envs, self.n, self.gamma, self.chunk = int(num_envs), int(n), float(gamma), int(chunk)
        self.lag = 1 if n_actions else 0
        rows = self.chunk + self.n - 1 + self.lag
        self.obs = np.zeros((rows, self.num_envs, *obs_shape), dtype=obs_dtype)
        # With Q-values the row after a transition's last step is always there, and its obs is that step's
        # next_obs (the actor acts on every next observation, the final one too): no copy of it is kept.
        self.next_obs = self.obs if self.lag else np.zeros_like(self.obs)
        self.action = np.zeros((rows, self.num_envs), dtype=np.int64)
        self.reward = np.zeros((rows, self.num_envs), dtype=np.float64)
        self.terminated = np.zeros((rows, self.num_envs), dtype=bool)
        self.truncated = np.zeros((rows, self.num_envs), dtype=bool)
        self.done_before = np.zeros(self.num_envs, dtype=bool)  # done of the step before row 0
        self.waiting = np.zeros((rows, self.num_envs), dtype=bool)  # carried starts not emitted yet
        self.q = np.zeros((rows, self.num_envs, n_actions), dtype=np.float32) if n_actions else None
        self.rows = 0
        self.carried = 0
        self.gamma_powers = self.gamma ** np.arange(self.n + 1, dtype=np.float64)

    def add(self, obs, actions, rewards, next_obs, terminated, truncated, q=None) -> bool:
        """Store one vector-env step; True when a chunk is full and `take` should be called."""
        i = self.rows
        self.obs[i], self.action[i], self.reward[i] = obs, actions, rewards
        if not self.lag:
            self.next_obs[i] = next_obs
        self.terminated[i], self.truncated[i] = terminated, truncated
        if self.q is not None:
            self.q[i] = q
        self.rows += 1
        return self.rows - self.carried >= self.chunk

    def _done_valid(self) -> tuple[np.ndarray, np.ndarray]:
        """done and valid of the stored rows, computed once per chunk rather than once per step."""
        done = self.terminated[:self.rows] | self.truncated[:self.rows]
        return done, autoreset_valid(done, self.done_before)

    def fresh_steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(reward, done, valid) [rows, envs] of the steps added since the last `take`; call before `take`."""
        done, valid = self._done_valid()
        c = self.carried
        return self.reward[c:self.rows], done[c:], valid[c:]

    def take(self) -> dict[str, np.ndarray]:
        """Every transition completed by the stored steps, env-major and oldest first within an env."""
        n, gamma, rows = self.n, self.gamma, self.rows
        done, starts = self._done_valid()
        starts[: self.carried] &= self.waiting[: self.carried]
        # Each start sums m = min(n, steps to its episode's end, inclusive) rewards: the end is the first done row
        # at or after it (a reverse running minimum of done rows' indices), so no walk with per-offset state.
        row = np.arange(rows)[:, None]
        big = rows + n + self.lag  # "no end in sight": m = n
        next_end = np.minimum.accumulate(np.where(done, row, big)[::-1], axis=0)[::-1]
        m = np.minimum(next_end - row + 1, n)
        last = row + m - 1
        ret = self.reward[:rows].copy()
        for k in range(1, min(n, rows)):
            # Offset k adds gamma^k r[t+k] where the start's sum reaches that far (rows past the end: not there yet).
            ret[:rows - k] += np.where(m[:rows - k] > k, gamma ** k * self.reward[k:rows], 0.0)
        complete = starts & (last + self.lag < rows)
        env_idx, row_idx = np.nonzero(complete.T)
        # Gathers through flat (row * envs + env) indices: one index array per gather is several times cheaper
        # than a pair (a 64-env chunk spent half its time in paired fancy indexing).
        envs = self.num_envs
        at = row_idx * envs + env_idx
        at_last = last.reshape(-1)[at] * envs + env_idx
        at_next = at_last + envs if self.lag else at_last  # where each transition's next_obs is kept
        m_at = m.reshape(-1)[at]
        terminated = self.terminated.reshape(-1)[at_last]
        discount = np.where(terminated, 0.0, self.gamma_powers[m_at])
        action = self.action.reshape(-1)[at]
        ret_at = ret.reshape(-1)[at]
        out = {"action": action, "reward": ret_at.astype(np.float32), "discount": discount.astype(np.float32)}
        if self.frame_stack:
            out["frames"], start = frame_table(self.obs[:rows])
            out["obs_frame"], out["next_frame"] = start[at].astype(np.int32), start[at_next].astype(np.int32)
        else:
            flat_obs = (-1, *self.obs.shape[2:])
            out["obs"], out["next_obs"] = self.obs.reshape(flat_obs)[at], self.next_obs.reshape(flat_obs)[at_next]
        if self.q is not None:
            n_actions = self.q.shape[2]
            q_flat = self.q.reshape(-1)
            q_taken = q_flat[at * n_actions + action]
            # max over the actions of Q(s') at the row after each transition's last step, action by action
            # (numpy's reduction over a short last axis costs more than this for small action sets).
            nxt = at_next * n_actions
            q_next = q_flat[nxt]
            for a in range(1, n_actions):
                np.maximum(q_next, q_flat[nxt + a], out=q_next)
            out["priority"] = np.abs(ret_at + discount * q_next - q_taken).astype(np.float32)
        keep = min(n - 1 + self.lag, rows)
        self._carry(rows - keep, starts & ~complete, done)
        return out

    def _carry(self, first: int, waiting: np.ndarray, done: np.ndarray) -> None:
        keep = self.rows - first
        if first:
            self.done_before = done[first - 1]
        arrays = (self.obs, self.action, self.reward, self.terminated, self.truncated)
        if not self.lag:
            arrays += (self.next_obs,)
        for arr in arrays + ((self.q,) if self.q is not None else ()):
            arr[:keep] = arr[first:self.rows]
        self.waiting[:keep] = waiting[first:self.rows]
        self.rows = self.carried = keep


def double_dqn_targets(
    online: nn.Module, target: nn.Module, next_obs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor
) -> torch.Tensor:
    """Double-DQN targets y = r + discount * Q_target(s', argmax_a Q_online(s', a)), without grad."""
    with torch.no_grad():
        return targets_from_q(online(next_obs), target(next_obs), rewards, discounts, double=True)


def targets_from_q(next_q_online: torch.Tensor, next_q_target: torch.Tensor, rewards: torch.Tensor,
                   discounts: torch.Tensor, double: bool = True) -> torch.Tensor:
    """n-step targets from precomputed Q(s') tables: double (online picks, target evaluates) or plain max."""
    with torch.no_grad():
        if double:
            best = next_q_online.argmax(dim=1, keepdim=True)
            next_values = next_q_target.gather(1, best).squeeze(1)
        else:
            next_values = next_q_target.max(dim=1).values
        return rewards + discounts * next_values


def td_loss(
    q_values: torch.Tensor, actions: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance-weighted Huber TD loss; returns (loss, |TD error| detached) for priority updates."""
    q_taken = q_values.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    huber = F.smooth_l1_loss(q_taken, targets, reduction="none", beta=1.0)
    loss = (weights * huber).mean()
    td_abs = (q_taken - targets).abs().detach()
    return loss, td_abs


def _module_device(module: nn.Module) -> torch.device:
    """Device of the module's first parameter, CPU for parameterless modules."""
    first = next(module.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def initial_priorities(online: nn.Module, batch: dict[str, np.ndarray]) -> np.ndarray:
    """Actor-side Ape-X priorities |r + discount * max_a Q(s') - Q(s)[a]| for fresh n-step transitions."""
    k = len(batch["action"])
    if k == 0:
        return np.zeros(0, dtype=np.float32)
    device = _module_device(online)
    with torch.no_grad():
        # One forward over [obs; next_obs] halves the per-call overhead on the actor.
        stacked = torch.as_tensor(np.concatenate([batch["obs"], batch["next_obs"]]), device=device)
        q = online(stacked)
        q_obs, q_next = q[:k], q[k:]
        actions = torch.as_tensor(batch["action"], dtype=torch.int64, device=device)
        rewards = torch.as_tensor(batch["reward"], dtype=q.dtype, device=device)
        discounts = torch.as_tensor(batch["discount"], dtype=q.dtype, device=device)
        targets = rewards + discounts * q_next.max(dim=1).values
        q_taken = q_obs.gather(1, actions.unsqueeze(1)).squeeze(1)
        return (targets - q_taken).abs().float().cpu().numpy()


def collector_epsilons(job, rank: int, n_envs: int) -> np.ndarray:
    """Collector `rank`'s rungs of the job's Ape-X ladder: it runs over every env slot of the job (collectors x
    envs per collector), so each slot explores at its own rate."""
    algo = job.algorithm
    ladder = epsilon_ladder(job.collector_count * n_envs, algo.epsilon, algo.epsilon_alpha)
    return ladder[rank * n_envs:(rank + 1) * n_envs]


class EpsilonGreedy:
    """Per-row epsilon-greedy over a batch of Q rows, with the random draws made in blocks (not per step)."""

    def __init__(self, epsilons: np.ndarray, n_actions: int, rng: np.random.Generator, block: int = 1024):
        self.eps = np.asarray(epsilons, dtype=np.float64)
        self.n_actions, self.rng, self.block = n_actions, rng, block
        self._i = block

    def __call__(self, q_values: torch.Tensor) -> np.ndarray:
        """Actions for one step: a random action where this row explores, else argmax."""
        if self._i == self.block:
            self._explore = self.rng.random((self.block, len(self.eps))) < self.eps
            self._random = self.rng.integers(0, self.n_actions, (self.block, len(self.eps)), dtype=np.int64)
            self._i = 0
        greedy = q_values.argmax(dim=1).numpy()
        i = self._i
        self._i += 1
        return np.where(self._explore[i], self._random[i], greedy)
