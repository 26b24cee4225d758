"""The collector shell: steps a gymnasium vector env with the newest policy and pushes experience.

The shell owns the env, the weights, episode accounting, heartbeats and sending; the algorithm's `ActorCore`
(rlctl.algos) acts and decides what to record and when to cut it: n-step transitions for Ape-X, sequences for
R2D2 (both to replay shards), rollouts of one policy version for PPO, APPO and IMPALA (to one learner rank).
Started as `python -m rlctl.roles.collector` by the supervisor; everything it needs comes from the environment
(see roles/context.py).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import zmq

from rlctl import metric_names as M
from rlctl import wire
from rlctl.algos import REPLAY, build_model
from rlctl.algos.base import ActorCore, ActorSetup
from rlctl.envs import env_space_info, make_vec_env
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main
from rlctl.roles.learner_data import ROLLOUT_SOCKET_BUFFER
from rlctl.weights import WeightSubscriber


EPISODE_REPORT_S = 0.1


class ExperienceSender:
    """PUSH to replay shards (ZeroMQ spreads batches over the shards that have room) or to one learner rank."""

    def __init__(self, net: wire.SecureContext, endpoints: str | list[str], sender: str, kind: str, sndbuf: int):
        # Small queues and kernel buffers: when shards rate-limit (or a learner is busy), a collector blocks
        # within a batch or two instead of parking stale transitions in TCP buffers (see BUFFERED_TRANSITIONS).
        self.sock = net.client(zmq.PUSH, endpoints, sndhwm=1, sndbuf=sndbuf)
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
        if not self.control.due(now) and not (self.episodes.ended and now - self.last_sent >= EPISODE_REPORT_S):
            return
        if now - self.last_t >= self.control.interval:  # the rate over a whole interval, however often we report
            self.rate = (self.env_steps - self.last_steps) / (now - self.last_t)
            self.last_steps, self.last_t = self.env_steps, now
        self.last_sent = now
        self.control.heartbeat({
            M.COLLECTOR_ENV_STEPS: self.env_steps, M.ENV_STEPS_PER_S: self.rate,
            M.COLLECTOR_WEIGHT_VERSION: self.weights.version, M.COLLECTOR_SENT: self.sender.sent,
            **self.episodes.take(), M.NET_DROPPED: self.weights.dropped,
        })


def build_actor(rc: RoleContext, info, model: torch.nn.Module, num_envs: int) -> ActorCore:
    """The job's actor core for this collector."""
    return rc.job.algo.load("actor")(ActorSetup(rc.job, info, model, rc.rank, num_envs, rc.seed))


def experience_sender(rc: RoleContext, net: wire.SecureContext, kind: str, info) -> ExperienceSender:
    """PUSH to every replay shard (replay data path), or to learner rank c % ranks (rollouts)."""
    if rc.job.algo.data == REPLAY:
        return ExperienceSender(net, [r["experience"] for r in rc.endpoints["replay"]], rc.name, kind,
                                wire.experience_buffer_bytes(info.obs_bytes))
    ranks = rc.endpoints["rollouts"]
    return ExperienceSender(net, ranks[rc.rank % len(ranks)], rc.name, kind, ROLLOUT_SOCKET_BUFFER)


def run(rc: RoleContext, stop: StopFlag) -> None:
    """Build the env, policy, actor core and sockets, then step until stopped."""
    torch.set_num_threads(1)
    torch.manual_seed(rc.seed)
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    env = make_vec_env(rc.job.env)
    info = env_space_info(env)
    model = build_model(rc.job, info)
    model.eval()
    weights = WeightSubscriber(net, rc.endpoints["weights"], model, rc.weight_board)
    actor = build_actor(rc, info, model, env.num_envs)
    sender = experience_sender(rc, net, actor.kind, info)
    print(f"{rc.name}: {env.num_envs} x {rc.job.env.id} ({type(env).__name__}), {rc.job.algorithm.name}, "
          f"weights {'from shared memory ' + rc.weight_board if rc.weight_board else 'over the network'}, "
          f"pid {os.getpid()} {actor.describe()}", flush=True)
    try:
        with torch.no_grad():
            step_loop(rc, stop, env, actor, weights, sender, CollectorReport(control, weights, sender,
                                                                          EpisodeTracker(env.num_envs)))
    finally:
        env.close()
        net.close()


def step_loop(rc: RoleContext, stop: StopFlag, env, actor: ActorCore, weights: WeightSubscriber,
              sender: ExperienceSender, report: CollectorReport) -> None:
    """Act, step, record; at each cut send the block, then take the newest weights and report.

    Weights change only between blocks (a rollout is all one version); a block the actor will not begin (PPO
    waiting for the next version, or no weights yet) waits on the weights socket, reporting meanwhile.
    """
    obs, _ = env.reset(seed=rc.seed)
    version, first = -1, True

    def waiting() -> None:
        # Blocked by a full replay shard or a busy learner: keep the weights fresh for the next block meanwhile.
        weights.poll()
        report()
    while not stop:
        weights.poll()
        report()
        if not actor.begin(weights.version, weights.serial):
            weights.sock.poll(50)
            continue
        version = weights.version
        if first:
            # Start-up is measured up to this line (bench/solve_cartpole.py).
            print(f"{rc.name}: first env step (weights version {version})", flush=True)
            first = False
        while True:
            actions = actor.act(obs)
            next_obs, rewards, terminated, truncated, _ = env.step(actions)
            ready = actor.record(obs, actions, rewards, next_obs, terminated, truncated)
            obs = next_obs
            if ready:
                break
        block = actor.take()
        report.env_steps += report.episodes.add(block.rewards, block.done, block.valid)
        if not sender.send_blocking(block.arrays, version, stop, waiting):
            break
        if sender.sent == block.arrays["reward"].size:  # bench/faults.py times a restart up to this line
            print(f"{rc.name}: first batch sent ({sender.sent} transitions)", flush=True)


if __name__ == "__main__":
    role_main(run)
