"""PPO's minibatch gradient for an actor-critic of two MLP trunks and a categorical head, written out.

The forward pass, the clipped-surrogate loss's derivative and the backward pass are ~45 tensor ops that write
every parameter's gradient into one flat buffer (each `.grad` a view of it), with no autograd graph. On MinAtar's
frames autograd's step of the 64-64 actor and critic spent about a third of its time beyond its matrix products:
graph nodes, a float copy of every ReLU mask, clipping parameter by parameter. Written out, an 8,192-sample
update ran 1.4x faster on 2 threads here (bench/minatar_update.py). The arithmetic is autograd's up to float
rounding (tests compare the two on the same minibatch); it is taken only where the core trains the model itself
(one rank: DDP's gradient hooks hang on autograd).
"""

from __future__ import annotations

import torch
from torch import nn

from rlctl import metric_names as M
from rlctl.models import ActorCritic, FlatMLP, as_float

# Each activation in place, and its backward from its output as autograd computes it.
_ACTIVATIONS = {nn.ReLU: (torch.relu_, lambda grad, out: torch.ops.aten.threshold_backward(grad, out, 0)),
                nn.Tanh: (torch.tanh_, torch.ops.aten.tanh_backward)}


class WrittenPPOGradient:
    """The gradient of PPO's minibatch loss (rlctl.algos.onpolicy.returns.ppo_loss) for a model that `fits`."""

    @staticmethod
    def fits(model: nn.Module) -> bool:
        """Whether `model` is an actor-critic this gradient is written for: a categorical head, separate MLP trunks
        of at least one layer, ReLU or tanh."""
        if not isinstance(model, ActorCritic) or not model.discrete:
            return False
        bodies = (model.actor_body, model.critic_body)
        if bodies[0] is bodies[1] or not all(isinstance(b, FlatMLP) and len(b.trunk) for b in bodies):
            return False
        return all(type(layer) in _ACTIVATIONS for b in bodies for layer in b.trunk[1::2])

    def __init__(self, model: ActorCritic):
        self.model = model
        self.params = list(model.parameters())
        self.flat = torch.zeros(sum(p.numel() for p in self.params), device=self.params[0].device)
        self.views, offset = [], 0
        for p in self.params:
            self.views.append(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.grad_of = {id(p): v for p, v in zip(self.params, self.views)}
        self.trunks = [(list(body.trunk[0::2]), *_ACTIVATIONS[type(body.trunk[1])])
                       for body in (model.actor_body, model.critic_body)]

    def _attach(self) -> None:
        # The optimizer's zero_grad(set_to_none=True), on any autograd step between, drops the views.
        if self.params[0].grad is not self.views[0]:
            for p, v in zip(self.params, self.views):
                p.grad = v

    @torch.no_grad()
    def __call__(self, mb: dict[str, torch.Tensor], cols: torch.Tensor | None, algo,
                 report: bool) -> dict[str, torch.Tensor]:
        """Write the minibatch's gradient into every parameter's .grad (views of `flat`); the loss's statistics
        when `report` (as ppo_loss's, diagnostics included), else {}."""
        self._attach()
        x = as_float(mb["obs"].reshape(len(mb["obs"]), -1))
        n = x.shape[0]
        (actor, actor_fn, actor_back), (critic, critic_fn, critic_back) = self.trunks
        actor_out = self._trunk_forward(actor, actor_fn, x, cols)
        critic_out = self._trunk_forward(critic, critic_fn, x, cols)
        head, value_head = self.model.actor_head, self.model.critic_head
        logits = torch.addmm(head.bias, actor_out[-1], head.weight.t())
        values = torch.addmm(value_head.bias, critic_out[-1], value_head.weight.t()).squeeze(1)

        logp_all = torch.log_softmax(logits, 1)
        probs = logp_all.exp()
        actions = mb["action"].long().reshape(-1, 1)
        log_ratio = logp_all.gather(1, actions).squeeze(1) - mb["logp"]
        ratio = log_ratio.exp()
        entropy = -(probs * logp_all).sum(1)
        adv = mb["adv"]
        if algo.norm_adv and n > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1 - algo.clip, 1 + algo.clip)
        # d policy loss / d log-prob per row: through the unclipped term where it is the larger (torch.max's
        # backward; where the two are equal the clamp is the identity and both halves pass).
        g_logp = torch.where(unclipped >= clipped, unclipped, 0.0)
        # d/d logits of the policy term g (onehot - p) and of -ent_coef H: ent_coef p (log p + H); both / n.
        d_logits = probs * (logp_all + entropy.unsqueeze(1)).mul_(algo.ent_coef) - probs * g_logp.unsqueeze(1)
        d_logits.scatter_add_(1, actions, g_logp.unsqueeze(1)).div_(n)

        error = values - mb["ret"]
        v_loss = error * error
        d_values = error
        if algo.value_clip is not None:
            step = values - mb["v"]
            clipped_error = mb["v"] + step.clamp(-algo.value_clip, algo.value_clip) - mb["ret"]
            clipped_loss = clipped_error * clipped_error
            inside = step.abs() <= algo.value_clip
            d_values = torch.where(v_loss >= clipped_loss, error, clipped_error * inside)
            v_loss = torch.maximum(v_loss, clipped_loss)
        d_values = (d_values * (algo.vf_coef / n)).unsqueeze(1)

        self._head_backward(head, d_logits, actor_out[-1])
        self._head_backward(value_head, d_values, critic_out[-1])
        self._trunk_backward(actor, actor_back, actor_out, d_logits @ head.weight, cols)
        self._trunk_backward(critic, critic_back, critic_out, d_values @ value_head.weight, cols)
        if not report:
            return {}
        policy_loss = torch.maximum(unclipped, clipped).mean()
        return {M.POLICY_LOSS: policy_loss, M.VALUE_LOSS: 0.5 * v_loss.mean(), M.ENTROPY: entropy.mean(),
                M.APPROX_KL: ((ratio - 1) - log_ratio).mean(),
                M.CLIPFRAC: ((ratio - 1).abs() > algo.clip).float().mean()}

    @staticmethod
    def _trunk_forward(layers: list[nn.Linear], activation, x: torch.Tensor,
                       cols: torch.Tensor | None) -> list[torch.Tensor]:
        """[input, output of each layer after its activation]; the first layer over `cols` of its inputs."""
        outs = [x]
        for i, layer in enumerate(layers):
            weight = layer.weight.index_select(1, cols) if i == 0 and cols is not None else layer.weight
            outs.append(activation(torch.addmm(layer.bias, outs[-1], weight.t())))
        return outs

    def _head_backward(self, layer: nn.Linear, d_out: torch.Tensor, inputs: torch.Tensor) -> None:
        """A head's weight and bias gradients from d loss / d (its output)."""
        torch.mm(d_out.t(), inputs, out=self.grad_of[id(layer.weight)])
        torch.sum(d_out, 0, out=self.grad_of[id(layer.bias)])

    def _trunk_backward(self, layers: list[nn.Linear], backward, outs: list[torch.Tensor], d_top: torch.Tensor,
                        cols: torch.Tensor | None) -> None:
        """Layer gradients from d loss / d (the trunk's output), the first layer's into its `cols` columns only."""
        d_out = d_top
        for i in range(len(layers) - 1, -1, -1):
            layer = layers[i]
            d_pre = backward(d_out, outs[i + 1])
            torch.sum(d_pre, 0, out=self.grad_of[id(layer.bias)])
            grad = self.grad_of[id(layer.weight)]
            if i == 0 and cols is not None:
                grad.zero_().index_copy_(1, cols, d_pre.t() @ outs[0])
                return
            torch.mm(d_pre.t(), outs[i], out=grad)
            if i:
                d_out = d_pre @ layer.weight
