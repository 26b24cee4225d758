"""The rollout algorithms' actor core: rollouts of `rollout_len` steps per env, each taken with one version."""

from __future__ import annotations

import math

import numpy as np
import torch

from rlctl.algos.base import ActorCore, ActorSetup, Block
from rlctl.envs import SpaceInfo, autoreset_valid
from rlctl.data.frames import frame_stack_depth, rollout_frames
from rlctl.models import ActorCritic


def build_model(job, info: SpaceInfo) -> ActorCritic:
    """The actor-critic of a PPO/APPO/IMPALA job: categorical policy for Discrete actions, Gaussian for Box."""
    model = job.model
    return ActorCritic(info.obs_shape, n_actions=info.n_actions,
                       action_dim=0 if info.discrete else math.prod(info.action_shape),
                       hidden=model.hidden, activation=model.activation, encoder=model.encoder,
                       share_trunk=model.share_trunk,
                       log_std_init=job.algorithm.log_std_init)


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


class RolloutActor(ActorCore):
    """Samples from the policy and records actions, log-probs and values; a block is one rollout.

    Synchronous PPO begins a rollout only with a version newer than the last one sent (every round is
    on-policy); APPO and IMPALA take whatever version is newest and never wait.
    """

    layout = staticmethod(rollout_layout)  # what the learner's rollout inbox accepts

    def __init__(self, setup: ActorSetup):
        super().__init__(setup)
        job, info = setup.job, setup.info
        self.model: ActorCritic = setup.model
        self.device = next(self.model.parameters()).device  # an inference server's may be a GPU
        self.T, self.n_envs, self.info = job.algorithm.rollout_len, setup.num_envs, info
        self.synchronous = job.algorithm_entry.synchronous
        self.frame_stack = frame_stack_depth(job, info)  # > 0: obs travel as frames sent once (rlctl.data.frames)
        self.low = None if info.discrete else np.asarray(info.action_low, np.float32).reshape(info.action_shape)
        self.high = None if info.discrete else np.asarray(info.action_high, np.float32).reshape(info.action_shape)
        self.prev_done = np.zeros(self.n_envs, dtype=bool)
        self.started = -1  # serial of the weights of the last rollout begun
        self.t = 0

    def begin(self, version: int, serial: int) -> bool:
        """A fresh buffer for a rollout of `version` (the previous one may still be queued in ZeroMQ, unsent); PPO
        rolls out each weights it loads once."""
        if version < 0 or (self.synchronous and serial == self.started):
            return False
        self.started, self.t = serial, 0
        self.arrays = RolloutBuffer(self.T, self.n_envs, self.info).arrays
        return True

    @staticmethod
    def forward(model, obs: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Sampled actions, their log-probabilities and the values."""
        return model.act(obs)

    def act_on(self, obs: np.ndarray, outputs: tuple[torch.Tensor, ...]) -> np.ndarray:
        """Sampled actions (clipped to a Box's bounds for the env; the sample itself is what is recorded)."""
        a, t = self.arrays, self.t
        actions, logp, value = outputs
        act_np = actions.numpy()
        a["obs"][t] = obs
        a["action"][t] = act_np
        a["logp"][t] = logp.numpy()
        a["value"][t] = value.numpy()
        return act_np if self.low is None else np.clip(act_np, self.low, self.high)

    def record(self, obs, actions, rewards, next_obs, terminated, truncated) -> bool:
        """Store the step's outcome; after T steps, the bootstrap value and the episode masks."""
        a, t = self.arrays, self.t
        a["reward"][t] = rewards
        a["terminated"][t] = terminated
        a["done"][t] = truncated  # | terminated, once for the whole rollout below
        self.t = t = t + 1
        if t < self.T:
            return False
        a["obs"][t] = next_obs
        a["value"][t] = self.model.value(torch.from_numpy(next_obs).to(self.device)).cpu().numpy()
        np.logical_or(a["done"], a["terminated"], out=a["done"])
        a["valid"][:] = autoreset_valid(a["done"], self.prev_done)
        self.prev_done = a["done"][-1].copy()
        return True

    def take(self) -> Block:
        """The rollout (stacked-frame observations as their frames, each sent once)."""
        a = self.arrays
        return Block(rollout_frames(a) if self.frame_stack else a, a["reward"], a["done"], a["valid"])
