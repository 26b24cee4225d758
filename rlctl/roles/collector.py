"""Collector role: steps a gymnasium vector env with the newest policy and pushes experience.

Two modes on one loop skeleton: off-policy algorithms (Ape-X) send n-step
transitions with initial priorities to replay shards; rollout algorithms (PPO,
APPO, IMPALA) send fixed-length rollouts, each taken with one policy version,
to one learner rank. Started as `python -m rlctl.roles.collector` by the
supervisor; everything it needs comes from the environment (see roles/context.py).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import zmq

from rlctl import wire
from rlctl.algos.apex import ChunkedNStep, EpsilonGreedy, epsilon_ladder
from rlctl.envs import SpaceInfo, autoreset_valid, env_space_info, make_vec_env
from rlctl.models import ActorCritic, build_policy
from rlctl.spec import OFF_POLICY, SYNCHRONOUS
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main
from rlctl.weights import WeightSubscriber


EXPERIENCE_SOCKET_BUFFER = 64 * 1024
EPISODE_REPORT_S = 0.1
# New weights and due heartbeats are looked for once a millisecond rather than every step: each look costs a few
# microseconds, a tenth of a CartPole collector's whole step.
POLL_S = 0.001
ROLLOUT_SOCKET_BUFFER = 4096  # about one rollout in flight per collector and side: the bound on async policy lag


class ExperienceSender:
    """PUSH to replay shards (ZeroMQ spreads batches over the shards that have room) or to one learner rank."""

    def __init__(self, net: wire.SecureContext, endpoints: str | list[str], sender: str, kind: str = "experience",
                 sndhwm: int = 2, sndbuf: int = EXPERIENCE_SOCKET_BUFFER):
        # Small queues and kernel buffers: when shards rate-limit (or a learner is busy), a collector blocks
        # within a few batches instead of parking tens of thousands of stale transitions in TCP buffers.
        self.sock = net.client(zmq.PUSH, endpoints, sndhwm=sndhwm, sndbuf=sndbuf)
        self.sender, self.kind = sender, kind
        self.sent = 0

    def try_send(self, batch: dict[str, np.ndarray], version: int) -> bool:
        """Send unless every shard is full (backpressure from a rate-limited shard)."""
        try:
            wire.send(self.sock, self.kind, self.sender, version, None, batch, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        self.sent += batch["reward"].size
        return True

    def send_blocking(self, batch: dict[str, np.ndarray], version: int, stop: StopFlag, on_wait) -> bool:
        """Send, waiting for room (backpressure) while calling `on_wait`; False if stopped first."""
        while not stop:
            if self.try_send(batch, version):
                return True
            self.sock.poll(20, zmq.POLLOUT)
            on_wait()
        return False


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
        out = {"episode_returns": self.returns[-1000:], "episode_lengths": self.lengths[-1000:]}
        self.returns, self.lengths = [], []
        return out


class CollectorReport:
    """Heartbeats with env-step rate, episodes and weight version: when due, and soon after episodes end.

    Finished episodes go out within EPISODE_REPORT_S rather than with the next regular heartbeat: a run that stops
    on training returns stops that much sooner (at 1 s a CartPole job ran ~5k env steps past its target).
    """

    def __init__(self, control: ControlClient, weights: WeightSubscriber, sender: ExperienceSender,
                 episodes: EpisodeTracker):
        self.control, self.weights, self.sender, self.episodes = control, weights, sender, episodes
        self.env_steps = 0
        self.last_steps, self.last_t, self.last_sent = 0, time.monotonic(), 0.0
        self.rate = 0.0

    def __call__(self) -> None:
        """Send a heartbeat if one is due, or if episodes ended and the last one left EPISODE_REPORT_S ago."""
        now = time.monotonic()
        if not self.control.due(now) and not (self.episodes.returns and now - self.last_sent >= EPISODE_REPORT_S):
            return
        if now - self.last_t >= self.control.interval:  # the rate over a whole interval, however often we report
            self.rate = (self.env_steps - self.last_steps) / (now - self.last_t)
            self.last_steps, self.last_t = self.env_steps, now
        self.last_sent = now
        self.control.heartbeat({
            "env_steps": self.env_steps, "charts/env_steps_per_s": self.rate,
            "collector/weight_version": self.weights.version, "collector/sent": self.sender.sent,
            **self.episodes.take(), "net/dropped": self.weights.dropped,
        })


def run(rc: RoleContext, stop: StopFlag) -> None:
    """Build the env, policy and sockets, then run the transition or the rollout loop."""
    torch.set_num_threads(1)
    torch.manual_seed(rc.seed)
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    env = make_vec_env(rc.job.env)
    info = env_space_info(env)
    model = build_policy(rc.job, info)
    model.eval()
    weights = WeightSubscriber(net, rc.endpoints["weights"], model, rc.weight_board)
    print(f"{rc.name}: {env.num_envs} x {rc.job.env.id} ({type(env).__name__}), {rc.job.algorithm.name}, "
          f"weights {'from shared memory ' + rc.weight_board if rc.weight_board else 'over the network'}, "
          f"pid {os.getpid()}", flush=True)
    try:
        if rc.job.algorithm.name in OFF_POLICY:
            run_transitions(rc, stop, env, info, model, weights, control, net)
        else:
            run_rollouts(rc, stop, env, info, model, weights, control, net)
    finally:
        env.close()
        net.close()


def run_transitions(rc: RoleContext, stop: StopFlag, env, info: SpaceInfo, model: torch.nn.Module,
                    weights: WeightSubscriber, control: ControlClient, net: wire.SecureContext) -> None:
    """Ape-X: act epsilon-greedily, accumulate n-step transitions, send chunks to the replay shards."""
    algo, n_envs, n_actions = rc.job.algorithm, env.num_envs, info.n_actions
    rng = np.random.default_rng(rc.seed)
    sender = ExperienceSender(net, [r["experience"] for r in rc.endpoints["replay"]], rc.name)
    # Ape-X ladder over every env slot of the job, so each slot explores at its own rate.
    ladder = epsilon_ladder(rc.job.collector_count * n_envs, algo.epsilon, algo.epsilon_alpha)
    eps = ladder[rc.rank * n_envs:(rc.rank + 1) * n_envs]
    explore = EpsilonGreedy(eps, n_actions, rng)
    # One chunk = one send batch: n-step returns and priorities are computed per chunk, not per step.
    chunker = ChunkedNStep(n_envs, algo.n_step, algo.gamma, info.obs_shape, np.dtype(info.obs_dtype),
                           chunk=-(-algo.send_batch // n_envs), n_actions=n_actions)
    episodes = EpisodeTracker(n_envs)
    report = CollectorReport(control, weights, sender, episodes)
    print(f"{rc.name}: eps {eps.min():.4f}..{eps.max():.4f}", flush=True)

    obs, _ = env.reset(seed=rc.seed)
    ready: dict[str, np.ndarray] | None = None
    next_poll = 0.0
    print(f"{rc.name}: first env step", flush=True)  # start-up is measured up to this line (bench/solve_cartpole.py)
    with torch.no_grad():
        while not stop:
            if ready is not None and not sender.try_send(ready, weights.version):
                # Every shard is full (rate limit): wait for room rather than step ahead with a stale policy.
                sender.sock.poll(20, zmq.POLLOUT)
                report()
                continue
            ready = None
            now = time.monotonic()
            if now >= next_poll:
                weights.poll()
                report()
                next_poll = now + POLL_S
            q = model(torch.from_numpy(obs))
            actions = explore(q)
            next_obs, rewards, terminated, truncated, _ = env.step(actions)
            # The acting Q-values also give each transition's initial priority (no second forward pass).
            if chunker.add(obs, actions, rewards, next_obs, terminated, truncated, q=q.numpy()):
                report.env_steps += episodes.steps(*chunker.fresh_steps())
                ready = chunker.take()
            obs = next_obs


def rollout_layout(T: int, info: SpaceInfo) -> dict[str, tuple[int, tuple[int, ...], np.dtype]]:
    """The rollout message: field -> (rows, per-env shape, dtype); every array is [rows, n_envs, *per-env shape].

    T steps per env, plus the (T+1)th observation and its value for bootstrapping. The learner validates what it
    receives against the same layout.
    """
    act_shape, act_dtype = ((), np.int64) if info.discrete else (tuple(info.action_shape), np.float32)
    return {"obs": (T + 1, tuple(info.obs_shape), np.dtype(info.obs_dtype)),
            "value": (T + 1, (), np.dtype(np.float32)),
            "action": (T, act_shape, np.dtype(act_dtype)),
            "logp": (T, (), np.dtype(np.float32)),
            "reward": (T, (), np.dtype(np.float32)),
            "terminated": (T, (), np.dtype(bool)),
            "done": (T, (), np.dtype(bool)),
            "valid": (T, (), np.dtype(bool))}


class RolloutBuffer:
    """Preallocated arrays of one rollout (rollout_layout) for `n_envs` envs."""

    def __init__(self, T: int, n_envs: int, info: SpaceInfo):
        self.T = T
        self.arrays = {name: np.empty((rows, n_envs, *shape), dtype=dtype)
                       for name, (rows, shape, dtype) in rollout_layout(T, info).items()}


def run_rollouts(rc: RoleContext, stop: StopFlag, env, info: SpaceInfo, model: ActorCritic,
                 weights: WeightSubscriber, control: ControlClient, net: wire.SecureContext) -> None:
    """PPO/APPO/IMPALA: rollouts of `rollout_len` steps, one policy version each, to this collector's learner rank.

    Synchronous PPO waits after each rollout for the next version (every round is on-policy); APPO and IMPALA
    take whatever version is newest when a rollout starts and never wait for the learner.
    """
    algo, n_envs = rc.job.algorithm, env.num_envs
    synchronous = algo.name in SYNCHRONOUS
    ranks = rc.endpoints["rollouts"]
    sender = ExperienceSender(net, ranks[rc.rank % len(ranks)], rc.name, kind="rollout", sndhwm=1,
                              sndbuf=ROLLOUT_SOCKET_BUFFER)
    episodes = EpisodeTracker(n_envs)
    report = CollectorReport(control, weights, sender, episodes)
    low = np.asarray(info.action_low, dtype=np.float32).reshape(info.action_shape) if not info.discrete else None
    high = np.asarray(info.action_high, dtype=np.float32).reshape(info.action_shape) if not info.discrete else None
    obs, _ = env.reset(seed=rc.seed)
    prev_done = np.zeros(n_envs, dtype=bool)
    sent_version = -1
    while not stop:
        weights.poll()
        if weights.version < 0 or (synchronous and weights.version <= sent_version):
            weights.sock.poll(50)  # waiting for the first weights, or (PPO) for the next version
            report()
            continue
        version = weights.version
        if sent_version < 0 and report.env_steps == 0:
            print(f"{rc.name}: first env step (weights version {version})", flush=True)  # start-up ends here
        # A fresh buffer per rollout: the previous one may still be queued in ZeroMQ (sent without a copy).
        buf = RolloutBuffer(algo.rollout_len, n_envs, info)
        a = buf.arrays
        with torch.no_grad():
            for t in range(buf.T):
                actions, logp, value = model.act(torch.from_numpy(obs))
                act_np = actions.numpy()
                a["obs"][t] = obs
                a["action"][t] = act_np
                a["logp"][t] = logp.numpy()
                a["value"][t] = value.numpy()
                # The Gaussian's sample is kept as drawn (its log-prob); the env gets it clipped to the bounds.
                obs, rewards, terminated, truncated, _ = env.step(act_np if low is None else np.clip(act_np, low, high))
                a["reward"][t] = rewards
                a["terminated"][t] = terminated
                a["done"][t] = truncated  # | terminated, once for the whole rollout below
            a["obs"][buf.T] = obs
            a["value"][buf.T] = model.value(torch.from_numpy(obs)).numpy()
        np.logical_or(a["done"], a["terminated"], out=a["done"])
        a["valid"][:] = autoreset_valid(a["done"], prev_done)
        prev_done = a["done"][-1].copy()
        report.env_steps += episodes.steps(a["reward"], a["done"], a["valid"])
        if not sender.send_blocking(a, version, stop, report):
            break
        sent_version = version
        report()


if __name__ == "__main__":
    role_main(run)
