"""R2D2's actor core: the recurrent state carried across steps, the Ape-X epsilon ladder, sequences cut with
overlap and their initial priorities."""

from __future__ import annotations

import numpy as np
import torch

from rlctl.algos.apex.dqn import EpsilonGreedy, collector_epsilons
from rlctl.algos.base import ActorCore, ActorSetup, Block
from rlctl.algos.r2d2.model import RecurrentQNetwork
from rlctl.algos.r2d2.sequences import SequenceCutter


def build_model(job, info) -> RecurrentQNetwork:
    """The recurrent dueling Q-network of an R2D2 job: the [model] MLP, then the LSTM (or its stand-in)."""
    algo = job.algorithm
    if not info.discrete:
        raise ValueError(f"r2d2 needs a Discrete action space; {job.env.id} has a Box one")
    if job.model.encoder != "mlp":
        raise ValueError("r2d2 supports model.encoder = 'mlp' only")
    return RecurrentQNetwork(info.obs_shape, info.n_actions, job.model.hidden, job.model.activation, algo.lstm_size,
                             algo.memory, algo.dueling)


def sequence_cutter(job, info, n_envs: int) -> SequenceCutter:
    """The job's sequence cutter for `n_envs` env slots."""
    algo = job.algorithm
    return SequenceCutter(n_envs, algo.sequence_length, algo.sequence_period, info.obs_shape, info.obs_dtype,
                          algo.lstm_size, n_actions=info.n_actions, burn_in=algo.burn_in, gamma=algo.gamma,
                          n=algo.n_step, eps=algo.rescale_eps, eta=algo.priority_eta, min_ready=algo.send_batch)


class R2D2Actor(ActorCore):
    """Acts epsilon-greedily on Q from the recurrent net, carrying each env slot's state from step to step and
    starting it anew with each episode; a block is `send_batch` sequences."""

    def __init__(self, setup: ActorSetup):
        super().__init__(setup)
        n_envs, info = setup.num_envs, setup.info
        self.eps = collector_epsilons(setup.job, setup.rank, n_envs)
        self.explore = EpsilonGreedy(self.eps, info.n_actions, np.random.default_rng(setup.seed))
        self.model: RecurrentQNetwork = setup.model
        self.cutter = sequence_cutter(setup.job, info, n_envs)
        # On the CPU, where record() stores it; an inference server moves it to its device for the forward.
        h, c = self.model.initial_state(n_envs)
        self.state = (h.cpu(), c.cpu())
        self.before = self.state  # the state each env acted from at the current step (stored with sequences)
        self.q: torch.Tensor | None = None
        self.prev_done = np.zeros(n_envs, dtype=bool)
        self.reset_next = np.zeros(n_envs, dtype=bool)

    @staticmethod
    def item_layout(job, info) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """One stored sequence: field -> (shape, dtype), what replay shards accept (besides its priority)."""
        empty = sequence_cutter(job, info, 1).take()
        return {k: (tuple(a.shape[1:]), a.dtype) for k, a in empty.items() if k != "priority"}

    def describe(self) -> str:
        """One line for the log."""
        return f"eps {self.eps.min():.4f}..{self.eps.max():.4f}"

    def step_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each env's (h, c) for this step, zero where the last step reset the env."""
        if self.reset_next.any():
            # These envs were reset by the last step (NEXT_STEP autoreset): obs starts a new episode.
            self.state = self.model.reset_state(self.state, self.reset_next)
        self.before = self.state
        return self.state

    @staticmethod
    def forward(model, obs: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Q(obs, state) and the state after the step."""
        q, (h, c) = model.step(obs, (state[0], state[1]))
        return q, h, c

    def act_on(self, obs: np.ndarray, outputs: tuple[torch.Tensor, ...]) -> np.ndarray:
        """Epsilon-greedy actions over the Q-values; the state moves on."""
        self.q, h, c = outputs
        self.state = (h, c)
        return self.explore(self.q)

    def record(self, obs, actions, rewards, next_obs, terminated, truncated) -> bool:
        """Store the step with the state it was acted from and the Q-values it was acted on."""
        h, c = self.before
        ready = self.cutter.add(obs, actions, rewards, next_obs, terminated, truncated, h.numpy(), c.numpy(),
                                self.q.numpy())
        # The step after an episode's end is the env's reset: the observation it returns is a new episode's first.
        self.reset_next = self.prev_done
        self.prev_done = terminated | truncated
        return ready

    def take(self) -> Block:
        """The ready sequences (with their initial priorities)."""
        rewards, done, valid = self.cutter.fresh_steps()
        rewards, done, valid = rewards.copy(), done.copy(), valid.copy()
        return Block(self.cutter.take(), rewards, done, valid)
