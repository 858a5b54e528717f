"""The offload-everything anchor of bench/offload.py trains exactly like the model without it."""
import torch

from bench.offload import ANCHORS, OffloadAll
from tests.models import MODELS


def _grads(model, inputs, hooks=None):
    model.zero_grad(set_to_none=True)
    if hooks is None:
        loss = model(*inputs)
    else:
        with hooks:
            loss = model(*inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_saved_tensors_hooks_offload_packs_every_activation_and_trains_like_the_model():
    model, inputs = MODELS["gpt"]()
    torch.manual_seed(0)
    loss, grads = _grads(model, inputs)
    hooks = OffloadAll(list(model.parameters()), min_bytes=0)
    torch.manual_seed(0)  # the same dropout masks
    loss_off, grads_off = _grads(model, inputs, hooks)
    assert hooks.packed > 0 and hooks.unpacked == hooks.packed
    assert torch.equal(loss, loss_off)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_off))


def test_parameters_stay_where_they_are():
    model = torch.nn.Linear(8, 8)
    hooks = OffloadAll(list(model.parameters()), min_bytes=0)
    x = torch.randn(4, 8, requires_grad=True)
    with hooks:
        y = torch.tanh(model(x)).sum()  # linear saves x and the weight; tanh its output
    y.backward()
    assert hooks.packed == 2 and hooks.unpacked == 2  # x and tanh's output, not the weight


def test_the_hooks_anchor_offloads_what_a_compiled_step_saves_and_trains_like_eager():
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    expected = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))
    run = ANCHORS["saved_tensors_hooks offload"](torch.nn.Sequential(model, _Square()), min_bytes=0)
    got = torch.autograd.grad(run(x), list(model.parameters()))
    assert run.hooks.packed > 0 and run.hooks.unpacked == run.hooks.packed
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(expected, got))


class _Square(torch.nn.Module):
    def forward(self, y):
        return y.square().sum()


class _SplitHeads(torch.nn.Module):
    """A fused projection split three ways: the compiled step saves views with gaps between their
    rows (strides of the whole projection), which its backward checks."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 48)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (y.view(b, t, 2, 8).transpose(1, 2) for y in self.proj(x).split(16, dim=-1))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).square().sum()


def test_the_hooks_anchor_gives_a_saved_view_back_with_its_strides():
    torch._dynamo.reset()
    model = _SplitHeads()
    x = torch.randn(4, 8, 16)
    expected = torch.autograd.grad(model(x), list(model.parameters()))
    run = ANCHORS["saved_tensors_hooks offload"](model, min_bytes=0)
    got = torch.autograd.grad(run(x), list(model.parameters()))
    assert run.hooks.packed > 0 and run.hooks.unpacked == run.hooks.packed
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(expected, got))
