"""Neural network models and parameter (de)serialization helpers."""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}
_ACTIVATION_FNS = {nn.ReLU: torch.relu, nn.Tanh: torch.tanh, nn.ELU: F.elu}


def linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """layer(x) without nn.Module's call dispatch."""
    return F.linear(x, layer.weight, layer.bias)


def as_float(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`x` in `dtype`; booleans (MinAtar's grids) through a uint8 view, 4x faster than converting bools on the CPU."""
    return (x.view(torch.uint8) if x.dtype == torch.bool else x).to(dtype)


def mlp_forward(trunk: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """trunk(x) for an `mlp` trunk, calling the functions directly.

    A collector's forward pass on a handful of observations is mostly per-call overhead: nn.Module dispatch for
    the 15 modules of an actor-critic was a third to a half of it (CartPole, 4 envs: about 70 us -> 45 us).
    """
    for layer in trunk:
        x = linear(layer, x) if isinstance(layer, nn.Linear) else _ACTIVATION_FNS[type(layer)](x)
    return x


def mlp(in_dim: int, hidden: Sequence[int], activation: str = "relu") -> tuple[nn.Sequential, int]:
    """Build a Linear+activation trunk; return (trunk, output width)."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {sorted(_ACTIVATIONS)}")
    layers: list[nn.Module] = []
    width = int(in_dim)
    for size in hidden:
        layers += [nn.Linear(width, int(size)), _ACTIVATIONS[activation]()]
        width = int(size)
    # An empty `hidden` yields an identity trunk, so heads sit directly on the input.
    return nn.Sequential(*layers), width


class QNetwork(nn.Module):
    """Q-network: an MLP over flattened observations, or (`encoder = "conv"`) convolutions over images; dueling
    head optional."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        n_actions: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        dueling: bool = True,
        encoder: str = "mlp",
    ):
        super().__init__()
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.n_actions = int(n_actions)
        self.dueling = bool(dueling)
        self.conv = ConvEncoder(self.obs_shape) if encoder == "conv" else None
        if self.conv is not None:
            self.trunk, width = nn.Sequential(), self.conv.out_dim
        else:
            self.trunk, width = mlp(math.prod(self.obs_shape), hidden, activation)
        if self.dueling:
            self.value_head = nn.Linear(width, 1)
            self.advantage_head = nn.Linear(width, self.n_actions)
        else:
            self.head = nn.Linear(width, self.n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Map observations [B, *obs_shape] to Q-values [B, n_actions]."""
        if self.conv is not None:
            features = self.conv(obs)
        else:
            param_dtype = next(self.parameters()).dtype
            features = mlp_forward(self.trunk, as_float(obs.reshape(obs.shape[0], -1), param_dtype))
        if not self.dueling:
            return linear(self.head, features)
        value = linear(self.value_head, features)
        advantage = linear(self.advantage_head, features)
        # Subtracting the mean advantage makes the V/A split identifiable.
        return value + advantage - advantage.mean(dim=1, keepdim=True)


    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The greedy action per observation (argmax Q)."""
        return self(obs).argmax(1)


# Below this height or width the Nature-DQN stack does not fit; such inputs (MinAtar's 10 x 10) get MinAtar's own
# network: one 3 x 3 convolution of 16 channels, then 128 units.
SMALL_IMAGE = 36


class ConvEncoder(nn.Module):
    """Convolutions over image observations, (H, W, C) or (C, H, W): Nature-DQN's for Atari-sized frames, MinAtar's
    for small grids; uint8 pixels are scaled to [0, 1] here (on the device the network runs on), bools read as 0/1."""

    def __init__(self, obs_shape: tuple[int, ...], out_dim: int | None = None):
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(f"model.encoder = 'conv' needs image observations (H, W, C) or (C, H, W), got {obs_shape}")
        # Channels are the smallest axis at either end (gymnasium's image envs are HWC, wrappers often make CHW).
        self.channels_last = obs_shape[-1] < obs_shape[0]
        c, h, w = (obs_shape[2], obs_shape[0], obs_shape[1]) if self.channels_last else obs_shape
        if min(h, w) < SMALL_IMAGE:
            self.conv = nn.Sequential(nn.Conv2d(c, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
            out_dim = out_dim or 128
        else:
            self.conv = nn.Sequential(
                nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
            out_dim = out_dim or 512
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, out_dim), nn.ReLU())
        self.out_dim = out_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, *obs_shape] -> [B, out_dim]."""
        # Channels-last (NHWC) memory either way: the CPU's convolutions run it about 1.3x faster than NCHW. HWC
        # frames are that already once permuted; CHW ones (stacked frames) are laid out so while still uint8.
        x = obs.permute(0, 3, 1, 2) if self.channels_last else obs.contiguous(memory_format=torch.channels_last)
        x = as_float(x)  # keeps the layout
        if obs.dtype == torch.uint8:
            x = x / 255.0
        return self.fc(self.conv(x))


# A batch of boolean observations whose set columns are at most this share of all is cut to them for training
# (live_columns); above it the gather costs about what the smaller products save.
LIVE_SHARE_MAX = 0.8


def live_columns(flat: torch.Tensor) -> torch.Tensor | None:
    """The columns of a boolean batch [N, D] that some row sets (int64 [k]), or None where they are over
    LIVE_SHARE_MAX of D or the batch is not boolean or empty.

    A column no row sets adds nothing to a first linear layer's output and gets an exact zero of weight gradient,
    so a trunk given only the live columns (FlatMLP.forward's `cols`) computes the same outputs and gradients with a
    k-wide first product instead of a D-wide one. MinAtar's grids are 1-8% ones: over a PPO batch of 8,192 random
    Breakout frames 142 of 400 columns are ever set, and its update ran 1.35x faster (bench/minatar_update.py).
    """
    if flat.dtype != torch.bool or flat.dim() != 2 or not len(flat):
        return None
    # numpy's any over rows is about 10x torch's on the CPU (2.8 -> 0.2 ms for 8,192 SpaceInvaders frames).
    cols = torch.from_numpy(np.flatnonzero(flat.numpy().any(0))) if flat.is_cpu else flat.any(0).nonzero().squeeze(1)
    return cols if len(cols) <= LIVE_SHARE_MAX * flat.shape[1] else None


def take_columns(flat: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """flat[:, cols] of a 2-D batch, as a new contiguous tensor."""
    # numpy's take is about 4x torch's index_select along the inner dimension on the CPU (6 -> 1.5 ms for 8,192
    # SpaceInvaders frames), which was 7% of the PPO update.
    if flat.is_cpu:
        return torch.from_numpy(np.take(flat.numpy(), cols.numpy(), axis=1))
    return flat.index_select(1, cols)


class FlatMLP(nn.Module):
    """Flatten the observation, then an MLP trunk."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: Sequence[int], activation: str):
        super().__init__()
        self.trunk, self.out_dim = mlp(math.prod(obs_shape), hidden, activation)

    def forward(self, obs: torch.Tensor, cols: torch.Tensor | None = None) -> torch.Tensor:
        """[B, *obs_shape] -> [B, out_dim]; with `cols` (live_columns), `obs` is [B, k]: those columns only."""
        if cols is None:
            return mlp_forward(self.trunk, as_float(obs.reshape(obs.shape[0], -1)))
        first = self.trunk[0]
        x = F.linear(as_float(obs), first.weight.index_select(1, cols), first.bias)
        return mlp_forward(self.trunk[1:], x)


_LOG_2PI = math.log(2 * math.pi)


class ActorCritic(nn.Module):
    """Policy and value for PPO/APPO/IMPALA: categorical over Discrete actions, diagonal Gaussian over Box.

    With the `mlp` encoder actor and critic have separate trunks (as CleanRL and SB3 do for MLPs); with `conv`
    they share the convolutions. Sampling and log-probs are written out rather than built from
    torch.distributions, whose argument checks cost more than the math at collector batch sizes.
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int = 0, action_dim: int = 0,
                 hidden: Sequence[int] = (64, 64), activation: str = "tanh", encoder: str = "mlp",
                 log_std_init: float = 0.0, share_trunk: bool = False):
        super().__init__()
        if (n_actions > 0) == (action_dim > 0):
            raise ValueError("give exactly one of n_actions (Discrete) or action_dim (Box)")
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.discrete = n_actions > 0
        out = n_actions if self.discrete else action_dim
        if encoder == "conv":
            shared = ConvEncoder(self.obs_shape)
            self.actor_body, self.critic_body = shared, shared
            width = shared.out_dim
            self.actor_head, self.critic_head = nn.Linear(width, out), nn.Linear(width, 1)
        elif share_trunk:
            self.actor_body = self.critic_body = FlatMLP(self.obs_shape, hidden, activation)
        else:
            self.actor_body, self.critic_body = (FlatMLP(self.obs_shape, hidden, activation),
                                                 FlatMLP(self.obs_shape, hidden, activation))
        if encoder != "conv":
            self.actor_head = nn.Linear(self.actor_body.out_dim, out)
            self.critic_head = nn.Linear(self.critic_body.out_dim, 1)
        # Orthogonal init as CleanRL and SB3 use for PPO: sqrt(2) gain in the trunks, a small last policy layer
        # (the first policy is near uniform / near zero mean).
        # dict.fromkeys, not a set: a set of modules iterates in address order, which made the initial
        # parameters (and with them a whole run) differ between runs of the same seed.
        for body in dict.fromkeys((self.actor_body, self.critic_body)):
            for layer in body.modules():
                if isinstance(layer, (nn.Linear, nn.Conv2d)):
                    nn.init.orthogonal_(layer.weight, math.sqrt(2))
                    nn.init.zeros_(layer.bias)
        nn.init.orthogonal_(self.actor_head.weight, 0.01)
        nn.init.zeros_(self.actor_head.bias)
        nn.init.orthogonal_(self.critic_head.weight, 1.0)
        nn.init.zeros_(self.critic_head.bias)
        self.log_std = None if self.discrete else nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def forward(self, obs: torch.Tensor, cols: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits or Gaussian means [B, A], values [B]); with `cols` (from `live_columns`), `obs` holds only those
        columns of the flattened observations."""
        if cols is not None:
            features = self.actor_body.forward(obs, cols)
            critic = features if self.critic_body is self.actor_body else self.critic_body.forward(obs, cols)
            return linear(self.actor_head, features), linear(self.critic_head, critic).squeeze(-1)
        features = self.actor_body.forward(obs)
        # Shared convolutions run once for both heads (running them per head doubled every forward and backward).
        critic = features if self.critic_body is self.actor_body else self.critic_body.forward(obs)
        return linear(self.actor_head, features), linear(self.critic_head, critic).squeeze(-1)

    def live_columns(self, obs: torch.Tensor) -> torch.Tensor | None:
        """`live_columns` of a batch of observations [N, *obs_shape] where both trunks are MLPs with a first layer
        (an empty `hidden` puts the heads on the input itself), else None."""
        if not isinstance(self.actor_body, FlatMLP) or not len(self.actor_body.trunk):
            return None
        return live_columns(obs.flatten(1))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values [B]."""
        return linear(self.critic_head, self.critic_body.forward(obs)).squeeze(-1)

    def log_prob_entropy(self, head: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of `actions` and the policy entropy, both [B]."""
        if self.discrete:
            logp_all = torch.log_softmax(head, dim=-1)
            logp = logp_all.gather(1, actions.long().reshape(-1, 1)).squeeze(1)
            return logp, -(logp_all.exp() * logp_all).sum(-1)
        log_std = self.log_std.expand_as(head)
        z = (actions.reshape(head.shape) - head) * torch.exp(-log_std)
        logp = (-0.5 * z.pow(2) - log_std - 0.5 * _LOG_2PI).sum(-1)
        entropy = (0.5 + 0.5 * _LOG_2PI + log_std).sum(-1)
        return logp, entropy

    def sample(self, head: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled actions and their log-probabilities."""
        if self.discrete:
            logp_all = torch.log_softmax(head, dim=-1)
            # Gumbel-max: one argmax instead of a multinomial draw.
            gumbel = -torch.log(-torch.log(torch.rand_like(logp_all).clamp_(1e-20, 1.0)))
            actions = (logp_all + gumbel).argmax(-1)
            return actions, logp_all.gather(1, actions.reshape(-1, 1)).squeeze(1)
        noise = torch.randn_like(head)
        actions = head + noise * torch.exp(self.log_std)
        logp = (-0.5 * noise.pow(2) - self.log_std - 0.5 * _LOG_2PI).sum(-1)
        return actions, logp

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward for a collector step: (actions, their log-probs, values)."""
        head, value = self(obs)
        actions, logp = self.sample(head)
        return actions, logp, value

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action: argmax for Discrete, the Gaussian mean for Box."""
        head = linear(self.actor_head, self.actor_body.forward(obs))
        return head.argmax(-1) if self.discrete else head


def flat_parameters(module: nn.Module) -> torch.Tensor:
    """Return all parameters as one detached, contiguous float32 1-D tensor (parameters() order)."""
    chunks = [p.detach().reshape(-1).to(torch.float32) for p in module.parameters()]
    if not chunks:
        return torch.zeros(0, dtype=torch.float32)
    # torch.cat always allocates, so the result never aliases live parameters.
    return torch.cat(chunks)


def load_flat_parameters(module: nn.Module, flat: torch.Tensor | np.ndarray) -> None:
    """Copy a flat vector produced by flat_parameters back into the module's parameters."""
    if isinstance(flat, np.ndarray):
        # Copy: buffers from the wire are often read-only, which torch.from_numpy dislikes.
        flat = torch.tensor(flat)
    if flat.dim() != 1:
        raise ValueError(f"flat parameters must be 1-D, got shape {tuple(flat.shape)}")
    params = list(module.parameters())
    expected = sum(p.numel() for p in params)
    if flat.numel() != expected:
        raise ValueError(f"flat parameter size {flat.numel()} does not match module size {expected}")
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n


def share_flat_storage(module: nn.Module) -> np.ndarray | None:
    """Move the module's parameters into one contiguous float32 buffer (flat_parameters order) and return it as a
    writable numpy view, or None when they are not all float32 on the CPU.

    Loading published weights is then one copy into the buffer, where load_flat_parameters makes a tensor and
    copies per parameter (a CartPole collector: about 250 us per new version, cold, 30 times a second).
    """
    params = list(module.parameters())
    if not params or any(p.dtype != torch.float32 or p.device.type != "cpu" for p in params):
        return None
    flat = flat_parameters(module)  # a fresh buffer holding the current values
    offset = 0
    for p in params:
        p.data = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat.numpy()


def parameter_digest(module: nn.Module) -> str:
    """SHA-256 hex digest of the flat float32 parameter bytes."""
    flat = flat_parameters(module).cpu().numpy()
    return hashlib.sha256(flat.tobytes()).hexdigest()
