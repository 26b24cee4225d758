"""Learner optimizers that never import torch._dynamo: 1.1-1.5 s of CPU at every learner start.

torch.optim fences several Optimizer methods off from torch.compile: `add_param_group` (called by the
constructor), `zero_grad`, `state_dict` and `load_state_dict` go through `torch._disable_dynamo`, and `step`
through `_use_grad_for_differentiable`. Each imports torch._dynamo (and sympy) on first use, only to set up a fence
that eager code never needs; rlctl never compiles. On a 2-core machine that import sat on the path from
`rlctl run` to the first update. `build_optimizer` marks the fenced methods as already fenced (the wrapper's own
cache), and `optimizer_step` calls the optimizer's update directly with autograd off, as torch.optim does, which
also skips its per-step profiler scope. If torch changes these internals the marks match nothing and
`optimizer_step` ends at the ordinary `step`: a slower start, the same arithmetic.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import torch

_fences_marked = False


def _mark_dynamo_fences() -> None:
    """Pre-fill the `torch._disable_dynamo` cache of every fenced Optimizer method with the method itself."""
    global _fences_marked
    if _fences_marked:
        return
    _fences_marked = True
    try:
        from torch._compile import _disable_dynamo
    except ImportError:
        return
    fence = _disable_dynamo(lambda: None).__code__
    for cls in (torch.optim.Optimizer, *torch.optim.Optimizer.__subclasses__()):
        for fn in vars(cls).values():
            if getattr(fn, "__code__", None) is fence and hasattr(fn, "__wrapped__"):
                setattr(fn.__wrapped__, "__dynamo_disable", fn.__wrapped__)


def build_optimizer(name: str, params: Iterable[torch.nn.Parameter], **kwargs) -> torch.optim.Optimizer:
    """`adam` (fused: one kernel for all parameters) or `rmsprop`, set up without importing torch._dynamo."""
    _mark_dynamo_fences()
    if name == "adam":
        return torch.optim.Adam(params, fused=True, **kwargs)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, **kwargs)
    raise ValueError(f"unknown optimizer {name!r}")


@functools.cache
def _step_body(cls: type) -> Callable:
    """The optimizer class's own `step`, under torch.optim's wrappers (found once per class, not per step)."""
    fn = cls.step
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def optimizer_step(opt: torch.optim.Optimizer) -> None:
    """One update: the optimizer's own `step` body under no_grad, without the wrappers that import torch._dynamo."""
    with torch.no_grad():
        _step_body(type(opt))(opt)


def optimizer_settings(opt: torch.optim.Optimizer) -> list[dict]:
    """Each parameter group's settings (lr, eps, betas, ...) without its parameters: what a job made."""
    return [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]


def keep_optimizer_settings(opt: torch.optim.Optimizer, settings: list[dict]) -> None:
    """Put back the settings optimizer_settings took: after load_state_dict, whose param_groups are the saved
    ones (the old learning rate; the issue Ray Tune's PBT had, Ray issue 62173), the job's apply again."""
    for group, kept in zip(opt.param_groups, settings):
        group.update(kept)
