"""Attention masks that mask nothing are dropped before the graph is planned, and only those."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import planner
from planner.attention_masks import contiguous_masks, drop_constant_masks
from planner.tracing import capture
from tests.training import assert_same_step

BATCH, SEQ, HEADS, DIM = 2, 8, 2, 16


class MaskedAttention(nn.Module):
    """Self-attention whose mask is built the way a compiled transformers encoder builds one
    when given no padding mask (``"all"``: every key seen, expanded over keys), or one that
    masks something (``"causal"``, from constants too; ``"padding"``, from an input)."""

    def __init__(self, mask: str, by_position: bool = False) -> None:
        super().__init__()
        self.mask, self.by_position = mask, by_position
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(BATCH, SEQ, HEADS, DIM // HEADS).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        index = torch.arange(SEQ, device=x.device)
        if self.mask == "all":
            mask = (index[None, None, :, None] >= 0).expand(BATCH, -1, SEQ, SEQ)
        elif self.mask == "causal":
            mask = index[None, None, :, None] >= index[None, None, None, :]
        else:
            mask = keep[:, None, None, :].expand(-1, -1, SEQ, -1)
        if self.by_position:
            y = F.scaled_dot_product_attention(q, k, v, mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(BATCH, SEQ, DIM)).square().mean()


class BiasedAttention(nn.Module):
    """Two attentions sharing a learned bias laid out keys-inner-heads-outer (last stride HEADS),
    as a relative position bias is."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.bias = nn.Parameter(torch.randn(SEQ, SEQ, HEADS))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(BATCH, SEQ, HEADS, DIM // HEADS).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        bias = self.bias.permute(2, 0, 1)[None] + torch.where(keep, 0.0, -1e4)[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return F.scaled_dot_product_attention(y, k, v, attn_mask=bias).square().mean()


def _inputs():
    torch.manual_seed(0)
    keep = torch.ones(BATCH, SEQ, dtype=torch.bool)
    keep[0, -3:] = False
    return torch.randn(BATCH, SEQ, DIM), keep


def _dropped(model: nn.Module) -> list[str]:
    """What the pass drops from the graph dynamo makes of ``model``."""
    found = []

    def backend(gm, example_inputs):
        found.extend(drop_constant_masks(gm))
        assert gm(*example_inputs) is not None  # the rewritten graph still runs
        return gm

    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(*_inputs())
    return found


@pytest.mark.parametrize("by_position", [False, True])
def test_a_mask_of_constants_that_masks_nothing_is_dropped(by_position):
    assert len(_dropped(MaskedAttention("all", by_position))) == 1


@pytest.mark.parametrize("mask", ["causal", "padding"])
def test_a_mask_that_masks_something_or_reads_an_input_stays(mask):
    assert _dropped(MaskedAttention(mask)) == []


@pytest.mark.parametrize("mask", ["all", "padding"])
def test_the_captured_joint_graph_attends_without_a_mask_that_masks_nothing(mask):
    joint = capture(MaskedAttention(mask), _inputs())
    attention = [n for n in joint.graph.nodes if "attention" in str(n.target) and "backward" not in str(n.target)]
    assert len(attention) == 1
    assert ("attn_mask" in attention[0].kwargs) == (mask == "padding")


@pytest.mark.parametrize("mask", ["all", "causal", "padding"])
def test_masked_attention_trains_like_eager(mask):
    config = planner.PlannerConfig(codegen="eager", estimator="flops", time_limit=5)

    def run_planned(twin, inputs):
        return planner.plan(twin, inputs, memory_budget=0.0, solver="greedy", config=config).module

    assert_same_step(lambda: (MaskedAttention(mask), _inputs()), run_planned)


def test_a_strided_mask_is_copied_once_where_fused_kernels_need_it():
    model = BiasedAttention()
    copied = {}

    def backend(devices):
        def compile_graph(gm, example_inputs):
            copied[devices] = contiguous_masks(gm, devices)
            return gm
        return compile_graph

    for devices in (("cpu",), ("cuda",)):
        torch._dynamo.reset()
        torch.compile(model, backend=backend(devices), fullgraph=True)(*_inputs())
    assert len(copied[("cpu",)]) == 1  # one copy for the two attentions that share the bias
    assert copied[("cuda",)] == []  # a CPU mask is left alone unless CPU kernels are named
    torch._dynamo.reset()
    assert_same_step(lambda: (BiasedAttention(), _inputs()),
                     lambda twin, inputs: torch.compile(twin, backend=backend(("cpu",)), fullgraph=True))



def _no_mask_here(n):
    raise RuntimeError("cannot be evaluated at compile time")


def test_a_mask_that_cannot_be_evaluated_is_kept():
    graph = torch.fx.Graph()
    q = graph.placeholder("q")
    mask = graph.call_function(_no_mask_here, (8,))
    graph.output(graph.call_function(F.scaled_dot_product_attention, (q, q, q), {"attn_mask": mask}))
    gm = torch.fx.GraphModule(nn.Module(), graph)
    assert drop_constant_masks(gm) == []
    assert any(n.target is _no_mask_here for n in gm.graph.nodes)
