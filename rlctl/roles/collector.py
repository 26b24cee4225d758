"""Collector role: steps a gymnasium vector env with the newest policy and pushes experience.

Started as `python -m rlctl.roles.collector` by the supervisor; everything it
needs comes from the environment (see roles/context.py).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import zmq

from rlctl import wire
from rlctl.algos.apex import ChunkedNStep, EpsilonGreedy, epsilon_ladder
from rlctl.envs import make_vec_env, space_info
from rlctl.models import QNetwork, load_flat_parameters
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main


EXPERIENCE_SOCKET_BUFFER = 64 * 1024


class WeightSubscriber:
    """SUB socket on the learner's weight publications; keeps only the newest, never blocks."""

    def __init__(self, net: wire.SecureContext, endpoint: str, model: torch.nn.Module):
        self.sock = net.client(zmq.SUB, endpoint, subscribe=b"", rcvhwm=2)
        self.model = model
        self.version = -1
        self.dropped = 0

    def poll(self) -> bool:
        """Load the newest weights that have arrived, if any; True when the policy changed."""
        if not self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # the per-step fast path: nothing arrived
            return False
        newest = None
        for _, msg in wire.receive_waiting(self.sock):
            if msg is None:
                self.dropped += 1
            elif msg.kind == "weights" and "params" in msg.arrays:
                newest = msg
        if newest is None or newest.version <= self.version:
            return False
        try:
            load_flat_parameters(self.model, newest.arrays["params"])
        except ValueError:
            self.dropped += 1
            return False
        self.version = newest.version
        return True


class ExperienceSender:
    """PUSH to every replay shard (ZeroMQ spreads batches over the shards that have room)."""

    def __init__(self, net: wire.SecureContext, endpoints: list[str], sender: str):
        # Small queues and kernel buffers: when shards rate-limit, a collector blocks within a few batches
        # instead of parking tens of thousands of stale transitions in TCP buffers.
        self.sock = net.client(zmq.PUSH, endpoints, sndhwm=2, sndbuf=EXPERIENCE_SOCKET_BUFFER)
        self.sender = sender
        self.sent = 0

    def try_send(self, batch: dict[str, np.ndarray], version: int) -> bool:
        """Send unless every shard is full (backpressure from a rate-limited shard)."""
        try:
            wire.send(self.sock, "experience", self.sender, version, None, batch, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        self.sent += len(batch["reward"])
        return True


def run(rc: RoleContext, stop: StopFlag) -> None:
    """The collector loop: act, step, accumulate n-step transitions, send batches, report."""
    torch.set_num_threads(1)
    job, algo = rc.job, rc.job.algorithm
    rng = np.random.default_rng(rc.seed)
    torch.manual_seed(rc.seed)
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    env = make_vec_env(job.env)
    obs_shape, obs_dtype, n_actions = space_info(env)
    n_envs = env.num_envs
    model = QNetwork(obs_shape, n_actions, job.model.hidden, job.model.activation, algo.dueling)
    model.eval()
    weights = WeightSubscriber(net, rc.endpoints["weights"], model)
    sender = ExperienceSender(net, [r["experience"] for r in rc.endpoints["replay"]], rc.name)
    # Ape-X ladder over every env slot of the job, so each slot explores at its own rate.
    ladder = epsilon_ladder(job.collector_count * n_envs, algo.epsilon, algo.epsilon_alpha)
    eps = ladder[rc.rank * n_envs:(rc.rank + 1) * n_envs]
    explore = EpsilonGreedy(eps, n_actions, rng)
    # One chunk = one send batch: n-step returns and priorities are computed per chunk, not per step.
    chunker = ChunkedNStep(n_envs, algo.n_step, algo.gamma, obs_shape, obs_dtype, chunk=-(-algo.send_batch // n_envs),
                           n_actions=n_actions)

    obs, _ = env.reset(seed=rc.seed)
    prev_done = np.zeros(n_envs, dtype=bool)
    ep_return = np.zeros(n_envs, dtype=np.float64)
    ep_length = np.zeros(n_envs, dtype=np.int64)
    finished_returns: list[float] = []
    finished_lengths: list[int] = []
    ready: dict[str, np.ndarray] | None = None
    env_steps = 0
    last_steps, last_t = 0, time.monotonic()

    def _report_if_due() -> None:
        nonlocal last_steps, last_t, finished_returns, finished_lengths
        now = time.monotonic()
        if not control.due(now):
            return
        rate = (env_steps - last_steps) / max(now - last_t, 1e-9)
        last_steps, last_t = env_steps, now
        control.heartbeat({
            "env_steps": env_steps, "charts/env_steps_per_s": rate,
            "collector/weight_version": weights.version, "collector/sent": sender.sent,
            "episode_returns": finished_returns[-1000:], "episode_lengths": finished_lengths[-1000:],
            "net/dropped": weights.dropped,
        })
        finished_returns, finished_lengths = [], []

    print(f"{rc.name}: {n_envs} x {job.env.id} ({type(env).__name__}), eps {eps.min():.4f}..{eps.max():.4f}, pid {os.getpid()}",
          flush=True)

    while not stop:
        if ready is not None and not sender.try_send(ready, weights.version):
            # Every shard is full (rate limit): wait for room rather than step ahead with a stale policy.
            sender.sock.poll(20, zmq.POLLOUT)
            _report_if_due()
            continue
        ready = None
        weights.poll()
        with torch.no_grad():
            q = model(torch.from_numpy(obs))
        actions = explore(q)
        next_obs, rewards, terminated, truncated, _ = env.step(actions)
        valid = ~prev_done  # NEXT_STEP autoreset: the step after an episode end is a reset, not a transition
        # The acting Q-values also give each transition's initial priority (no second forward pass).
        full = chunker.add(obs, actions, rewards, next_obs, terminated, truncated, valid, q=q.numpy())
        done = terminated | truncated
        ep_return += rewards * valid
        ep_length += valid
        if done.any():
            finished_returns.extend(ep_return[done].tolist())
            finished_lengths.extend(ep_length[done].tolist())
            ep_return[done] = 0.0
            ep_length[done] = 0
        prev_done = done
        obs = next_obs
        env_steps += int(valid.sum())
        if full:
            ready = chunker.take()
        _report_if_due()
    env.close()
    net.close()


if __name__ == "__main__":
    role_main(run)
