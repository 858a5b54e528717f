"""Run one training step of a model and of its planned twin, and compare everything."""
from __future__ import annotations

import copy

import torch

from planner.check import train_step

SEED = 1234


def step(module, inputs, model):
    """Loss (or output), ``model``'s gradients and buffers after one step of ``module`` under a
    fixed seed (:func:`planner.check.train_step`)."""
    done = train_step(module, model, inputs, SEED)
    return done.output, done.grads, done.buffers


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
