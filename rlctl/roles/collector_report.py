"""What a collector reports: its episodes (returns and lengths, from blocks of rewards and done flags), env steps
and rate, in heartbeats. Numpy only: the collector of central inference, which loads no torch, uses it too."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from rlctl import metric_names as M
from rlctl.roles.context import ControlClient

# Finished episodes are reported within this long (not only with the next regular heartbeat): a run that stops on
# training returns stops that much sooner.
EPISODE_REPORT_S = 0.1


class EpisodeTracker:
    """Running return and length of every env slot; finished episodes are kept until the next report.

    Fed a block of steps at a time (a chunk or a rollout), vectorized over it: per step it cost about as much as
    everything else a collector adds to stepping its env.
    """

    def __init__(self, n_envs: int):
        self.ep_return = np.zeros(n_envs, dtype=np.float64)
        self.ep_length = np.zeros(n_envs, dtype=np.int64)
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.pending_ended = False

    def add(self, rewards: np.ndarray, done: np.ndarray, valid: np.ndarray) -> int:
        """Queue a [T, n_envs] block for accounting at the next `take` (the arrays are kept, not copied); returns
        its valid steps. Accounting many blocks at once costs about what one block alone does."""
        self.pending.append((rewards, done, valid))
        self.pending_ended = self.pending_ended or bool(done.any())
        return int(valid.sum())

    @property
    def ended(self) -> bool:
        """Whether any episode ended since the last `take`."""
        return bool(self.returns) or self.pending_ended

    def steps(self, rewards: np.ndarray, done: np.ndarray, valid: np.ndarray) -> int:
        """Account a [T, n_envs] block of steps (reset steps after an episode end are not `valid`); returns
        the number of valid steps."""
        if not len(done):
            return 0
        # Running return and length of each slot's episode, in float64 as a per-step sum would be.
        ret = np.cumsum(rewards * valid, axis=0, dtype=np.float64) + self.ep_return
        length = np.cumsum(valid, axis=0) + self.ep_length
        env_idx, row_idx = np.nonzero(done.T)  # env-major, so an env's ends are adjacent and in time order
        if len(env_idx):
            ended_ret, ended_len = ret[row_idx, env_idx], length[row_idx, env_idx]
            # The running sums do not restart at an end: subtract the value at the same env's previous end.
            after_end = np.zeros(len(env_idx), dtype=bool)
            after_end[1:] = env_idx[1:] == env_idx[:-1]
            ep_ret = ended_ret - np.where(after_end, np.roll(ended_ret, 1), 0.0)
            ep_len = ended_len - np.where(after_end, np.roll(ended_len, 1), 0)
            order = np.argsort(row_idx, kind="stable")  # report in the order the episodes ended
            self.returns.extend(ep_ret[order].tolist())
            self.lengths.extend(ep_len[order].tolist())
            ended = done.any(axis=0)
            last_end = len(done) - 1 - np.argmax(done[::-1], axis=0)
            cols = np.arange(done.shape[1])
            self.ep_return = ret[-1] - np.where(ended, ret[last_end, cols], 0.0)
            self.ep_length = length[-1] - np.where(ended, length[last_end, cols], 0)
        else:
            self.ep_return, self.ep_length = ret[-1], length[-1]
        return int(valid.sum())

    def take(self) -> dict:
        """The finished episodes since the last call, as heartbeat fields."""
        if self.pending:
            self.steps(*(np.concatenate(parts) for parts in zip(*self.pending)))
            self.pending, self.pending_ended = [], False
        out = {M.EPISODE_RETURNS: self.returns[-1000:], M.EPISODE_LENGTHS: self.lengths[-1000:]}
        self.returns, self.lengths = [], []
        return out


class CollectorReport:
    """Heartbeats with env-step rate, episodes and the collector's own `figures()`: when due, and soon after
    episodes end.

    Finished episodes go out within EPISODE_REPORT_S rather than with the next regular heartbeat: a run that stops
    on training returns stops that much sooner (at 1 s a CartPole job ran ~5k env steps past its target).
    """

    def __init__(self, control: ControlClient, episodes: EpisodeTracker, figures: Callable[[], dict]):
        self.control, self.episodes, self.figures = control, episodes, figures
        self.env_steps = 0
        self.wait_s = 0.0  # seconds spent waiting instead of stepping (the shell adds them)
        self.last_steps, self.last_wait, self.last_t, self.last_sent = 0, 0.0, time.monotonic(), 0.0
        self.rate = self.wait_frac = 0.0

    def __call__(self) -> None:
        """Send a heartbeat if one is due, or if episodes ended and the last one left EPISODE_REPORT_S ago."""
        now = time.monotonic()
        if not self.control.due(now) and not (self.episodes.ended and now - self.last_sent >= EPISODE_REPORT_S):
            return
        if now - self.last_t >= self.control.interval:  # the rate over a whole interval, however often we report
            self.rate = (self.env_steps - self.last_steps) / (now - self.last_t)
            self.wait_frac = min(1.0, (self.wait_s - self.last_wait) / (now - self.last_t))
            self.last_steps, self.last_wait, self.last_t = self.env_steps, self.wait_s, now
        self.last_sent = now
        self.control.heartbeat({M.COLLECTOR_ENV_STEPS: self.env_steps, M.ENV_STEPS_PER_S: self.rate,
                                M.COLLECTOR_WAIT_FRAC: self.wait_frac,
                                **self.episodes.take(), **self.figures()})
