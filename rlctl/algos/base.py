"""The seam between the shells (roles/learner.py, roles/collector.py) and an algorithm's own code.

A `LearnerCore` is the update math of one learner rank: the learner shell builds it, hands it batches from the
algorithm's data path and asks it for its state; process group, DDP, seeding, the data source, stop agreement,
weight publication, checkpoints and heartbeats are the shell's. An `ActorCore` acts inside the collector shell and
decides what experience to record and when to cut it; envs, weights, episodes, heartbeats and sending are the
shell's. Both are plain objects: tests run them in-process, without torchrun or sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from rlctl.envs import SpaceInfo
from rlctl.optim import optimizer_step


@dataclass
class LearnerSetup:
    """What a learner core is built from: the job, the env's spaces, where it runs and how to distribute."""

    job: Any  # spec.JobSpec
    info: SpaceInfo
    device: torch.device
    rank: int = 0
    world: int = 1
    # Wraps the module a core trains through (DDP when world > 1, the module itself otherwise).
    distribute: Callable[[nn.Module], nn.Module] = lambda module: module

    @property
    def algo(self):
        """The job's `[algorithm]` section."""
        return self.job.algorithm


@dataclass
class UpdateResult:
    """One update's figures: statistics (metric name -> float or 0-d tensor, averaged between heartbeats),
    samples trained on, and for replay data new priorities of the sampled items (in batch order)."""

    stats: dict[str, Any]
    samples: int
    priorities: np.ndarray | None = None


class LearnerCore:
    """An algorithm's update rule on one rank. Subclasses set `model` (the network actors run) and `opt` (its
    optimizer) in __init__ and take each gradient step through `gradient_step`."""

    model: nn.Module
    opt: torch.optim.Optimizer
    publish_interval: int = 1  # updates between weight publications (each one a new policy version)
    nonfinite_steps: int = 0  # gradient steps refused for a non-finite gradient (learner/nonfinite_updates)

    def __init__(self, setup: LearnerSetup):
        self.setup = setup

    def gradient_step(self, loss: torch.Tensor, max_grad_norm: float) -> bool:
        """Backward, clip the global gradient norm, step. A non-finite norm (a NaN or infinity in the batch or the
        loss) skips the step and is counted: no NaN reaches the weights that are published and checkpointed."""
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_grad_norm, foreach=True)
        if not torch.isfinite(norm):  # with DDP every rank has the same averaged gradients, so all skip alike
            self.opt.zero_grad(set_to_none=True)
            self.nonfinite_steps += 1
            return False
        optimizer_step(self.opt)
        return True

    def update(self, batch: dict) -> UpdateResult:
        """Train on one batch: numpy arrays as sampled from replay, or [T(+1), B, ...] tensors of rollouts."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Everything besides `model` a checkpoint keeps (optimizer, target network, counters)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned."""


class TargetNetworkCore(LearnerCore):
    """A value-learning core with a target network copied from `model` every `target_update_interval` updates
    (Ape-X, R2D2); a checkpoint keeps the target, the optimizer and the update count."""

    target: nn.Module
    opt: torch.optim.Optimizer
    updates: int = 0

    def stepped(self) -> None:
        """Count one update; copy the online network into the target when its interval has passed."""
        self.updates += 1
        if self.updates % self.setup.algo.target_update_interval == 0:
            self.target.load_state_dict(self.model.state_dict())

    def state_dict(self) -> dict:
        """Target network, optimizer and update count."""
        return {"target": self.target.state_dict(), "optimizer": self.opt.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned."""
        self.target.load_state_dict(state["target"])
        self.opt.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])


@dataclass
class ActorSetup:
    """What an actor core is built from."""

    job: Any  # spec.JobSpec
    info: SpaceInfo
    model: nn.Module  # the policy, loaded with each new version by the shell
    rank: int  # collector rank
    num_envs: int
    seed: int


@dataclass
class Block:
    """A cut of experience: the arrays to send, and (reward, done, valid) [steps, envs] of the env steps it
    consumed, for the shell's episode accounting."""

    arrays: dict[str, np.ndarray]
    rewards: np.ndarray
    done: np.ndarray
    valid: np.ndarray


class ActorCore:
    """Acting and cutting experience for one collector (its vector env's every slot).

    The shell calls `begin(version, serial)` before a block (weights only change between blocks), then per vector step
    `act(obs)` and `record(...)` until record returns True, then `take()`. It runs under torch.no_grad. `act` is
    split in three (`step_state`, `forward`, `act_on`) so that an inference server can run one forward for many
    collectors' cores (central inference); the core itself does not know which of the two drives it.
    """

    @staticmethod
    def item_layout(job, info) -> dict:
        """Replay algorithms: one stored item's fields -> (shape, dtype); shards accept exactly this (+ priority)."""
        raise NotImplementedError

    def __init__(self, setup: ActorSetup):
        self.setup = setup

    def describe(self) -> str:
        """What the log's first line says of this actor (e.g. its exploration rates)."""
        return ""

    def begin(self, version: int, serial: int) -> bool:
        """Start a block acting with weights `version` (-1: none yet), the `serial`-th weights this collector loaded
        (a restarted learner may publish a version again); False to wait for other weights."""
        return True

    def act(self, obs: np.ndarray) -> np.ndarray:
        """The env actions for one vector step: `forward` over this collector's envs, then `act_on`."""
        return self.act_on(obs, self.forward(self.setup.model, torch.from_numpy(obs), *self.step_state()))

    def step_state(self) -> tuple[torch.Tensor, ...]:
        """Recurrent cores: the state each env slot acts from at this step (episode starts reset), [n_envs, ...]
        tensors that `forward` takes after the observations; () for feed-forward ones."""
        return ()

    @staticmethod
    def forward(model: nn.Module, obs: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The policy's outputs for a batch of rows, each [rows, ...]: one collector's envs, or in central inference
        several collectors' requests concatenated (rlctl.roles.inference), split again for each one's `act_on`."""
        raise NotImplementedError

    def act_on(self, obs: np.ndarray, outputs: tuple[torch.Tensor, ...]) -> np.ndarray:
        """This collector's env actions from its rows of `forward`'s outputs (CPU tensors): exploration, and what
        to keep for `record`."""
        raise NotImplementedError

    def record(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
               terminated: np.ndarray, truncated: np.ndarray) -> bool:
        """Store one vector step; True when a block is ready to take."""
        raise NotImplementedError

    def take(self) -> Block:
        """The ready block."""
        raise NotImplementedError
