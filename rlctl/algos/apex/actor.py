"""Ape-X's actor core: epsilon-greedy over the Q-values, n-step transitions and their initial priorities."""

from __future__ import annotations

import numpy as np
import torch

from rlctl.algos.apex.dqn import ChunkedNStep, EpsilonGreedy, collector_epsilons
from rlctl.algos.base import ActorCore, ActorSetup, Block
from rlctl.data.frames import MIN_FRAME_CHUNK_STEPS, frame_stack_depth
from rlctl.models import QNetwork

MIN_CHUNK_STEPS = 64


def build_model(job, info) -> QNetwork:
    """The dueling (or plain) Q-network of an Ape-X job: an MLP, or convolutions over images."""
    if not info.discrete:
        raise ValueError(f"{job.algorithm.name} needs a Discrete action space; {job.env.id} has a Box one "
                         "(use ppo, appo or impala)")
    return QNetwork(info.obs_shape, info.n_actions, job.model.hidden, job.model.activation, job.algorithm.dueling,
                    job.model.encoder)


class ApexActor(ActorCore):
    """Acts epsilon-greedily (each env slot of the job at its own rung of the ladder) and cuts n-step transitions
    into chunks of `send_batch`; the acting Q-values give each transition's initial priority."""

    def __init__(self, setup: ActorSetup):
        super().__init__(setup)
        algo, n_envs, info = setup.job.algorithm, setup.num_envs, setup.info
        self.eps = collector_epsilons(setup.job, setup.rank, n_envs)
        self.explore = EpsilonGreedy(self.eps, info.n_actions, np.random.default_rng(setup.seed))
        # One chunk = one send batch: n-step returns and priorities are computed per chunk, not per step; and at
        # least MIN_CHUNK_STEPS steps, so that per-chunk costs stay small beside the steps also with many envs.
        # Frame stacks travel and are stored one frame each (rlctl.data.frames), in longer chunks, so that the frames a
        # chunk re-sends (its carry, its first stacks) stay few.
        frame_stack = frame_stack_depth(setup.job, info)
        chunk = max(-(-algo.send_batch // n_envs), MIN_FRAME_CHUNK_STEPS if frame_stack else MIN_CHUNK_STEPS)
        self.chunker = ChunkedNStep(n_envs, algo.n_step, algo.gamma, info.obs_shape, np.dtype(info.obs_dtype),
                                    chunk=chunk, n_actions=info.n_actions,
                                    frame_stack=frame_stack)
        self.model = setup.model
        self.q: torch.Tensor | None = None

    @staticmethod
    def item_layout(job, info) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """One n-step transition: field -> (shape, dtype), what replay shards accept (besides its priority)."""
        obs = (tuple(info.obs_shape), np.dtype(info.obs_dtype))
        return {"obs": obs, "action": ((), np.dtype(np.int64)), "reward": ((), np.dtype(np.float32)),
                "next_obs": obs, "discount": ((), np.dtype(np.float32))}

    def describe(self) -> str:
        """One line for the log."""
        return f"eps {self.eps.min():.4f}..{self.eps.max():.4f}"

    @staticmethod
    def forward(model, obs: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor]:
        """Q(obs)."""
        return (model(obs),)

    def act_on(self, obs: np.ndarray, outputs: tuple[torch.Tensor, ...]) -> np.ndarray:
        """Epsilon-greedy actions over the Q-values (kept for the initial priorities)."""
        self.q = outputs[0]
        return self.explore(self.q)

    def record(self, obs, actions, rewards, next_obs, terminated, truncated) -> bool:
        """Store the step with the Q-values it was acted on."""
        return self.chunker.add(obs, actions, rewards, next_obs, terminated, truncated, q=self.q.numpy())

    def take(self) -> Block:
        """Every transition the chunk completed, with its initial priority."""
        rewards, done, valid = self.chunker.fresh_steps()
        rewards = rewards.copy()  # a view of rows that take() moves
        return Block(self.chunker.take(), rewards, done, valid)
