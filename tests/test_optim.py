"""rlctl.optim: the learners' optimizers do what torch.optim's do, without importing torch._dynamo."""

import subprocess
import sys

CHILD = r'''
import io, sys
import torch
from rlctl.optim import build_optimizer, optimizer_step

def train(make, step, name, **kw):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = make(name, net.parameters(), **kw)
    x = torch.randn(64, 4)
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        net(x).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5, foreach=True)
        step(opt)
    state = opt.state_dict()
    opt.load_state_dict(state)
    torch.save({"model": net.state_dict(), "optimizer": state}, io.BytesIO())
    return torch.cat([p.detach().flatten() for p in net.parameters()])

lean = {n: train(build_optimizer, optimizer_step, n, **kw)
        for n, kw in (("adam", {"lr": 1e-2}), ("rmsprop", {"lr": 1e-2, "alpha": 0.99}))}
print("dynamo imported:", "torch._dynamo" in sys.modules)

def plain(name, params, **kw):
    return torch.optim.Adam(params, fused=True, **kw) if name == "adam" else torch.optim.RMSprop(params, **kw)

for n, kw in (("adam", {"lr": 1e-2}), ("rmsprop", {"lr": 1e-2, "alpha": 0.99})):
    assert torch.equal(lean[n], train(plain, lambda o: o.step(), n, **kw)), n
print("same parameters as torch.optim")
'''


def test_optimizers_match_torch_optim_without_importing_dynamo():
    """Adam and RMSprop through rlctl.optim: bit-identical to torch.optim, and torch._dynamo never imported."""
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "dynamo imported: False" in out.stdout
    assert "same parameters as torch.optim" in out.stdout
