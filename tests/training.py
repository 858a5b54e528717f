"""Run one training step of a model and of its planned twin, and compare everything."""
from __future__ import annotations

import copy

import torch

SEED = 1234


def step(module, inputs, model):
    """Loss (or output), ``model``'s gradients and buffers after one step of ``module`` under a fixed seed."""
    torch.manual_seed(SEED)
    out = module(*inputs)
    if out.dim():  # a non-scalar output is reduced against a seeded random tangent
        torch.manual_seed(SEED + 1)
        (out * torch.randn_like(out)).sum().backward()
    else:
        out.backward()
    # a parameter the loss does not reach, or a frozen one (sinusoidal positions), has none
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    return out.detach(), grads, buffers


def assert_same_step(make_model, run_planned, atol=1e-5):
    """``run_planned(model, inputs) -> module`` must train exactly like eager ``model``."""
    model, inputs = make_model()
    model.train()
    twin = copy.deepcopy(model)
    expected = step(model, inputs, model)
    actual = step(run_planned(twin, inputs), inputs, twin)
    torch.testing.assert_close(actual[0], expected[0], atol=atol, rtol=0)
    for kind, got, want in (("gradient", actual[1], expected[1]), ("buffer", actual[2], expected[2])):
        assert got.keys() == want.keys()
        for name in want:
            if want[name] is None or got[name] is None:
                assert got[name] is want[name] is None, f"{kind} {name}: one step has none"
                continue
            torch.testing.assert_close(got[name], want[name], atol=atol, rtol=0, msg=f"{kind} {name} differs")
