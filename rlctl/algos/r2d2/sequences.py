"""Actor side of R2D2: cut a vector env's step stream into fixed-length, overlapping sequences (Acme's
SequenceAdder), vectorized over envs, into preallocated numpy arrays."""

from __future__ import annotations

import numpy as np

from rlctl.algos.r2d2.targets import actor_priorities


class SequenceCutter:
    """Per env, sequences start at episode steps 0, P, 2P, ... and hold up to L = seq_len steps.

    A sequence is emitted once it holds L steps, or when its episode ends (then padded: zeros, valid False after
    the end), so windows overlap by L - P steps and every step is in at least one sequence. Each holds `obs`
    [L+1, *obs_shape] (row i < length the obs acted on at step i, row `length` the observation after the last
    step: the next one, or the episode's final observation; later rows zero), `action`, `reward`, `terminated`,
    `valid` [L], and `h0`, `c0` [lstm_size]: the recurrent state the actor had before acting on row 0.

    Follows gymnasium's NEXT_STEP autoreset: the step after an episode end is no transition (its action is
    ignored); the actor acts on the final observation there with the episode's state, and resets its state only
    before acting on the reset observation that step returns. A sequence is emitted by the `add` after its last
    step: that call's `obs` is its bootstrap row, and that call's `q` the Q-values acted on it, which the initial
    priorities need (as in ChunkedNStep, every next observation is acted on one step later). So `next_obs` is not
    read: each call's `obs` is the previous call's `next_obs`.

    `add` writes one step into [L+1, envs] ring arrays (indexed by global step, so a plain row write) and a few
    per-env counters; the gathering of a sequence happens once per emitted sequence, with fancy indexing.
    """

    def __init__(self, num_envs: int, seq_len: int, period: int, obs_shape: tuple[int, ...], obs_dtype=np.float32,
                 lstm_size: int = 64, *, n_actions: int = 0, burn_in: int = 0, gamma: float = 0.997, n: int = 5,
                 eps: float = 1e-3, eta: float = 0.9, min_ready: int = 1):
        if not 1 <= period <= seq_len:
            raise ValueError(f"period must be in [1, seq_len={seq_len}], got {period}")
        self.num_envs, self.seq_len, self.period = int(num_envs), int(seq_len), int(period)
        self.n_actions, self.min_ready = int(n_actions), int(min_ready)
        # For the initial priorities (targets.actor_priorities).
        self.burn_in, self.gamma, self.n = int(burn_in), float(gamma), int(n)
        self.eps, self.eta = float(eps), float(eta)
        self.obs_shape, self.obs_dtype, self.lstm_size = tuple(obs_shape), np.dtype(obs_dtype), int(lstm_size)
        # L + 1 rows: a full sequence reads global steps g-L .. g (its bootstrap row is the current step's obs).
        rows, envs = self.seq_len + 1, self.num_envs
        self._obs = np.zeros((rows, envs, *self.obs_shape), dtype=self.obs_dtype)
        self._action = np.zeros((rows, envs), dtype=np.int64)
        self._reward = np.zeros((rows, envs), dtype=np.float32)
        self._terminated = np.zeros((rows, envs), dtype=bool)
        self._h = np.zeros((rows, envs, self.lstm_size), dtype=np.float32)
        self._c = np.zeros_like(self._h)
        self._q = np.zeros((rows, envs, self.n_actions), dtype=np.float32) if self.n_actions else None
        # Of each env's latest step: its episode step (-1 for an autoreset step), transition or not, episode end.
        self._t = np.full(envs, -1, dtype=np.int64)
        self._valid = np.zeros(envs, dtype=bool)
        self._done = np.zeros(envs, dtype=bool)
        self._g = 0  # global steps added
        self._open = (self.seq_len - 1) // self.period + 1  # most sequences of one env open at once
        self._ready: list[dict[str, np.ndarray]] = []
        self._n_ready = 0
        # reward, done, valid of the steps since the last take, for episode accounting; grown by doubling.
        self._log = np.zeros((3, 64, envs), dtype=np.float64)
        self._log_rows = 0

    def add(self, obs, actions, rewards, next_obs, terminated, truncated, h, c, q=None) -> bool:
        """Store one vector-env step ((h, c): the state before acting on obs); True once `min_ready` sequences are
        ready for `take`."""
        del next_obs  # arrives as the next call's obs (see the class docstring)
        slot = self._g % (self.seq_len + 1)
        self._obs[slot], self._action[slot], self._reward[slot] = obs, actions, rewards
        self._terminated[slot], self._h[slot], self._c[slot] = terminated, h, c
        if self._q is not None:
            if q is None:
                raise ValueError("this SequenceCutter computes priorities (n_actions > 0): pass q")
            self._q[slot] = q
        if self._g:
            self._emit()
        done = np.logical_or(terminated, truncated)
        valid = ~self._done  # NEXT_STEP autoreset: the step after an episode end is not a transition
        self._t = np.where(valid, self._t + 1, -1)
        self._valid, self._done = valid, done
        self._record(rewards, done, valid)
        self._g += 1
        return self._n_ready >= self.min_ready

    def _record(self, rewards, done, valid) -> None:
        """Log one step for fresh_steps."""
        if self._log_rows == self._log.shape[1]:
            self._log = np.concatenate([self._log, np.zeros_like(self._log)], axis=1)
        self._log[:, self._log_rows] = rewards, done, valid
        self._log_rows += 1

    def _emit(self) -> None:
        """Gather the sequences whose last step was the previous global step (the current one is their
        bootstrap row, already written)."""
        L, P, t = self.seq_len, self.period, self._t
        ended = self._valid & self._done
        full = self._valid & (t >= L - 1) & ((t - (L - 1)) % P == 0)
        envs = np.flatnonzero(ended | full)
        if not len(envs):
            return
        # Candidate starts of each emitting env, oldest first: the open ones are multiples of P in [t-L+1, t].
        t_e = t[envs, None]
        starts = (t_e // P) * P - P * np.arange(self._open - 1, -1, -1)
        oldest = t_e - (L - 1)
        take = (starts >= 0) & (starts >= oldest) & (ended[envs, None] | (starts == oldest))
        rows, cols = np.nonzero(take)  # env ascending, then start ascending
        env = envs[rows][:, None]
        length = (t_e[rows, 0] - starts[rows, cols])[:, None] + 1
        first = self._g - length  # global step of each sequence's row 0
        i = np.arange(L + 1)
        slots = (first + i) % (L + 1)  # [N, L+1]
        obs_pad = i > length  # rows past the bootstrap row
        step_pad = i[:L] >= length  # steps past the last one
        batch = {
            "obs": self._obs[slots, env],
            "action": self._action[slots[:, :L], env],
            "reward": self._reward[slots[:, :L], env],
            "terminated": self._terminated[slots[:, :L], env],
            "valid": ~step_pad,
            "h0": self._h[slots[:, 0], env[:, 0]],
            "c0": self._c[slots[:, 0], env[:, 0]],
        }
        for key in ("action", "reward", "terminated"):
            batch[key][step_pad] = 0
        batch["obs"][obs_pad] = 0
        if self._q is not None:
            batch["q"] = self._q[slots, env]
            batch["q"][obs_pad] = 0
        self._ready.append(batch)
        self._n_ready += len(rows)

    def fresh_steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(reward, done, valid) [k, num_envs] of the k steps added since the last `take`; call before `take`."""
        reward, done, valid = self._log[:, :self._log_rows]
        return reward.copy(), done.astype(bool), valid.astype(bool)

    def take(self) -> dict[str, np.ndarray]:
        """Every ready sequence stacked on a leading axis [N, ...], oldest emission first; with n_actions also
        `priority` [N] float32 (targets.actor_priorities on the Q-values the actor acted on)."""
        batches = self._ready or [self._empty()]
        out = {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}
        self._ready, self._n_ready, self._log_rows = [], 0, 0
        q = out.pop("q", None)
        if q is not None:
            # actor_priorities is time-major like the learner's unroll.
            out["priority"] = actor_priorities(
                q.transpose(1, 0, 2), out["action"].T, out["reward"].T, out["terminated"].T, out["valid"].T,
                self.burn_in, self.gamma, self.n, self.eps, self.eta)
        return out

    def _empty(self) -> dict[str, np.ndarray]:
        """A zero-sequence batch with the right shapes and dtypes."""
        L = self.seq_len
        batch = {
            "obs": np.zeros((0, L + 1, *self.obs_shape), dtype=self.obs_dtype),
            "action": np.zeros((0, L), dtype=np.int64),
            "reward": np.zeros((0, L), dtype=np.float32),
            "terminated": np.zeros((0, L), dtype=bool),
            "valid": np.zeros((0, L), dtype=bool),
            "h0": np.zeros((0, self.lstm_size), dtype=np.float32),
            "c0": np.zeros((0, self.lstm_size), dtype=np.float32),
        }
        if self._q is not None:
            batch["q"] = np.zeros((0, L + 1, self.n_actions), dtype=np.float32)
        return batch
