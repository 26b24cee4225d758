"""What-if prototypes for bench/collector.py --what-if (NOT used by rlctl; candidates for rlctl/algos/apex.py).

`BlockNStep` produces exactly the transitions of rlctl.algos.apex.NStepAccumulator (same rows,
same order; checked by `python bench/_collector_whatif.py`), but a step only writes one row
per array (`record`); the n-step arithmetic runs once per block of steps (`flush`), so its
~50 small numpy calls are paid once per block instead of once per step.

With `q_priorities=True` it also stores the Q-values the collector computed to act, and
gives each transition its Ape-X initial priority |R + discount * max_a Q(s_{t+m}) - Q(s_t, a_t)|
from them (the next observation of every step is acted on in the next step, also with
gymnasium's NEXT_STEP autoreset), so no extra forward pass is needed for priorities. The
emission of a transition is then delayed until the Q-values of its next observation exist.
"""

from __future__ import annotations

import numpy as np


class BlockNStep:
    """Vector-env steps -> n-step transitions, computed once per block of `block` steps."""

    def __init__(self, num_envs: int, n: int, gamma: float, obs_shape: tuple[int, ...], obs_dtype=np.float32,
                 block: int = 32, n_actions: int = 0, q_priorities: bool = False):
        self.N, self.n, self.gamma = int(num_envs), int(n), float(gamma)
        self.q_priorities = bool(q_priorities)
        self.carry = self.n - 1 + int(self.q_priorities)  # rows that may still be needed by the next block
        cap = self.carry + max(1, int(block))
        self.cap = cap
        N = self.N
        self.obs = np.zeros((cap, N, *obs_shape), dtype=obs_dtype)
        self.next_obs = np.zeros((cap, N, *obs_shape), dtype=obs_dtype)
        self.act = np.zeros((cap, N), dtype=np.int64)
        self.rew = np.zeros((cap, N), dtype=np.float64)
        self.term = np.zeros((cap, N), dtype=bool)
        self.trunc = np.zeros((cap, N), dtype=bool)
        self.start = np.zeros((cap, N), dtype=bool)  # a valid step whose transition is not emitted yet
        self.q = np.zeros((cap, N, n_actions), dtype=np.float32) if self.q_priorities else None
        self.t = 0
        self.pow = self.gamma ** np.arange(self.n + 1)
        self._rows = np.arange(cap)[:, None]

    def full(self) -> bool:
        return self.t == self.cap

    def record(self, obs, actions, rewards, next_obs, terminated, truncated, valid, q=None) -> None:
        """One vector-env step (q: the Q-values [N, A] computed on `obs` to act, with q_priorities)."""
        t = self.t
        self.obs[t] = obs
        self.act[t] = actions
        self.rew[t] = rewards
        self.next_obs[t] = next_obs
        self.term[t] = terminated
        self.trunc[t] = truncated
        self.start[t] = valid
        if self.q is not None:
            self.q[t] = q
        self.t = t + 1

    def flush(self) -> dict[str, np.ndarray]:
        """Transitions completed by the recorded steps; keeps what the next block still needs."""
        L, n = self.t, self.n
        rew, term, start = self.rew[:L], self.term[:L], self.start[:L]
        rows = self._rows[:L]
        done = (term | self.trunc[:L]) & start
        # d: first episode end at or after each step (beyond the block if none).
        d = np.minimum.accumulate(np.where(done, rows, L + n)[::-1], axis=0)[::-1]
        m = np.minimum(n, d - rows + 1)  # rewards in each step's transition
        j = rows + m - 1  # the step that completes it
        emit = start & (j + int(self.q_priorities) < L)
        t_idx, e_idx = np.nonzero(emit)
        m_e, j_e = m[t_idx, e_idx], j[t_idx, e_idx]
        ret = np.zeros(len(t_idx))
        for k in range(n):
            ret += np.where(k < m_e, self.pow[k] * rew[np.minimum(t_idx + k, L - 1), e_idx], 0.0)
        discount = np.where((d[t_idx, e_idx] == j_e) & term[j_e, e_idx], 0.0, self.pow[m_e])
        order = np.lexsort((t_idx, e_idx, j_e))  # NStepAccumulator's order: completion step, env, start
        t_idx, e_idx, j_e, ret, discount = t_idx[order], e_idx[order], j_e[order], ret[order], discount[order]
        out = {
            "obs": self.obs[t_idx, e_idx],
            "action": self.act[t_idx, e_idx],
            "reward": ret.astype(np.float32),
            "next_obs": self.next_obs[j_e, e_idx],
            "discount": discount.astype(np.float32),
        }
        if self.q is not None:
            q_taken = self.q[t_idx, e_idx, out["action"]]
            q_next = self.q[j_e + 1, e_idx].max(axis=1)
            out["priority"] = np.abs(ret + discount * q_next - q_taken).astype(np.float32)
        self.start[:L][emit] = False
        keep = min(self.carry, L)
        if keep:
            arrays = [self.obs, self.next_obs, self.act, self.rew, self.term, self.trunc, self.start]
            for a in arrays + ([self.q] if self.q is not None else []):
                a[:keep] = a[L - keep:L].copy()
        self.t = keep
        return out


def _check() -> None:
    """BlockNStep == NStepAccumulator (and q-priorities == initial_priorities with a fixed model)."""
    import gymnasium as gym
    import torch

    from rlctl.algos.apex import NStepAccumulator, initial_priorities
    from rlctl.models import QNetwork

    torch.manual_seed(0)
    model = QNetwork((4,), 2, [16])
    for n_envs, n, block, q_prio in [(8, 3, 32, False), (8, 1, 32, True), (64, 3, 4, True), (8, 5, 7, True),
                                     (3, 3, 1, False), (3, 3, 1, True), (8, 3, 2, True)]:
        env = gym.make_vec("CartPole-v1", num_envs=n_envs, vectorization_mode="vector_entry_point",
                           max_episode_steps=15)  # short: many truncations as well as terminations
        rng = np.random.default_rng(0)
        obs, _ = env.reset(seed=0)
        ref = NStepAccumulator(n_envs, n, 0.99, (4,))
        blk = BlockNStep(n_envs, n, 0.99, (4,), block=block, n_actions=2, q_priorities=q_prio)
        prev = np.zeros(n_envs, bool)
        a_out, b_out = [], []
        for _ in range(1500):
            with torch.no_grad():
                q = model(torch.from_numpy(obs)).numpy()
            act = rng.integers(0, 2, n_envs)
            nobs, r, te, tr, _ = env.step(act)
            r = r * rng.uniform(0.5, 1.5, n_envs)
            a_out.append(ref.step(obs, act, r, nobs, te, tr, ~prev))
            blk.record(obs, act, r, nobs, te, tr, ~prev, q)
            if blk.full():
                b_out.append(blk.flush())
            prev, obs = te | tr, nobs
        b_out.append(blk.flush())
        a = {k: np.concatenate([o[k] for o in a_out]) for k in a_out[0]}
        b = {k: np.concatenate([o[k] for o in b_out]) for k in b_out[0]}
        k_b = len(b["reward"])  # with q_priorities the last step's transitions wait for the next Q-values
        for key in a:
            assert np.allclose(a[key][:k_b], b[key]), (key, n_envs, n, block)
        assert len(a["reward"]) - k_b <= n_envs * n
        if q_prio:
            p_ref = initial_priorities(model, {k: v[:k_b] for k, v in a.items()})
            assert np.allclose(p_ref, b["priority"], atol=1e-5), "q-priorities"
        print(f"ok: {n_envs} envs, n {n}, block {block}, q_priorities {q_prio}: {k_b} transitions identical")


if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    _check()
