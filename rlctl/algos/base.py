"""The seam between the shells (roles/learner.py, roles/collector.py) and an algorithm's own code.

A `LearnerCore` is the update math of one learner rank: the learner shell builds it, hands it batches from the
algorithm's data path and asks it for its state; process group, DDP, seeding, the data source, stop agreement,
weight publication, checkpoints and heartbeats are the shell's. An `ActorCore` acts inside the collector shell and
decides what experience to record and when to cut it; envs, weights, episodes, heartbeats and sending are the
shell's. Both are plain objects: tests run them in-process, without torchrun or sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from rlctl import metric_names as M
from rlctl.envs import SpaceInfo
from rlctl.optim import optimizer_step


def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True) for parameters on one device, the same
    arithmetic without its per-parameter move of each norm to the first one's device: a twelfth of a small PPO
    minibatch step on the CPU."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


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


@dataclass
class Loss:
    """What a core computes for one gradient step: the loss, its statistics (metric -> float or 0-d tensor, detached)
    and, for replay data, new priorities of the items it was computed on (in batch order)."""

    loss: torch.Tensor
    stats: dict[str, Any] = field(default_factory=dict)
    priorities: np.ndarray | None = None


class LearnerCore:
    """An algorithm's update rule on one rank: what the learner shell (roles/learner.py) reads of a core.

    A core sets `model` (the network actors run), `opt` (its optimizer) and `max_grad_norm` in __init__ and
    computes losses: `steps(batch)` cuts a batch into the parts of one update (one by default; epochs x minibatches
    for PPO, through `minibatch_epochs`), `loss(part, report)` turns a part into a `Loss`. The gradient step itself
    (zero_grad, backward, clipping, the optimizer step, `learner/grad_norm` and the non-finite guard) is `update`'s,
    here once for every algorithm; cores do not override `update`. `begin_update` / `end_update` bracket an update
    (learning-rate schedules, target networks, counters)."""

    model: nn.Module
    opt: torch.optim.Optimizer
    max_grad_norm: float = 1e9  # global gradient-norm clip
    publish_interval: int = 1  # updates between weight publications (each one a new policy version)
    nonfinite_steps: int = 0  # gradient steps refused for a non-finite gradient (learner/nonfinite_updates)

    def __init__(self, setup: LearnerSetup):
        self.setup = setup

    def update(self, batch: dict) -> UpdateResult:
        """Train on one batch (numpy arrays as sampled from replay, or [T(+1), B, ...] tensors of rollouts): each
        of the core's steps through one gradient step; statistics averaged over the steps that report them."""
        stats = dict(self.begin_update(batch))
        totals: dict[str, Any] = {}
        counts: dict[str, int] = {}
        norms, priorities = [], None
        for part, report in self.steps(batch):
            out = self.loss(part, report)
            norm = self.gradient_step(out.loss)
            if norm is not None:
                norms.append(norm)
            for k, v in out.stats.items() if report else ():  # summed as tensors: one conversion per heartbeat
                v = v.detach() if isinstance(v, torch.Tensor) else v
                totals[k] = totals[k] + v if k in totals else v
                counts[k] = counts.get(k, 0) + 1
            if out.priorities is not None:
                priorities = out.priorities
        self.end_update(batch)
        stats.update({k: v / counts[k] for k, v in totals.items()})
        if norms:
            stats[M.GRAD_NORM] = torch.stack(norms).mean()
        return UpdateResult(stats, self.samples(batch), priorities)

    def gradient_step(self, loss: torch.Tensor) -> torch.Tensor | None:
        """Backward, clip the global gradient norm to `max_grad_norm`, step; the norm before clipping. A
        non-finite norm (a NaN or infinity in the batch or the loss) skips the step and is counted (None): no NaN
        reaches the weights that are published and checkpointed. The guard reads the norm, not the loss: with DDP
        the norm is of the averaged gradients, so every rank skips alike (a rank skipping on its own loss would
        leave its peers in the all-reduce)."""
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = clip_grad_norm(self.model.parameters(), self.max_grad_norm)
        if not torch.isfinite(norm):
            self.opt.zero_grad(set_to_none=True)
            self.nonfinite_steps += 1
            return None
        optimizer_step(self.opt)
        return norm.detach()

    def zero_loss(self) -> Loss:
        """A loss of zero through every parameter: the step of a rank with nothing to learn from in a part, whose
        DDP peers wait for that step's all-reduce."""
        return Loss(sum(p.sum() * 0.0 for p in self.model.parameters()))

    def begin_update(self, batch: dict) -> dict[str, Any]:
        """Before an update's steps (e.g. set the learning rate); statistics of the update as a whole."""
        return {}

    def steps(self, batch: dict) -> Iterator[tuple[dict, bool]]:
        """The parts of one update, each with whether its losses' statistics are reported: the batch, once."""
        yield batch, True

    def loss(self, part: dict, report: bool) -> Loss:
        """The loss of one part of a batch (with statistics when `report`)."""
        raise NotImplementedError

    def end_update(self, batch: dict) -> None:
        """After an update's steps (e.g. count it, copy a target network)."""

    def samples(self, batch: dict) -> int:
        """Samples (env steps) the batch trained on, for learner/samples_per_s."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Everything besides `model` a checkpoint keeps (optimizer, target network, counters)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned."""


def minibatch_epochs(rows: dict[str, torch.Tensor], epochs: int, minibatches: int, generator: torch.Generator,
                     device: torch.device) -> Iterator[tuple[dict[str, torch.Tensor], bool]]:
    """`epochs` passes over `rows` (fields of equal length), each shuffled and cut into `minibatches` parts, with
    whether it is the last pass (whose statistics are reported, as CleanRL reports them). tensor_split always gives
    `minibatches` parts (some maybe empty), so every DDP rank takes the same number of steps."""
    n = len(next(iter(rows.values())))
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=generator).to(device)
        # One row gather per field and epoch, then contiguous minibatch views.
        shuffled = {k: v.index_select(0, perm) for k, v in rows.items()}
        for parts in zip(*(v.tensor_split(minibatches) for v in shuffled.values())):
            yield dict(zip(shuffled, parts)), epoch == epochs - 1


class TargetNetworkCore(LearnerCore):
    """A value-learning core with a target network copied from `model` every `target_update_interval` updates
    (Ape-X, R2D2); a checkpoint keeps the target, the optimizer and the update count."""

    target: nn.Module
    opt: torch.optim.Optimizer
    updates: int = 0

    def end_update(self, batch: dict) -> None:
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
