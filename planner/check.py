"""Does a planned model train like eager? One seeded step of a model eager, under torch.compile and
planned at each budget, compared tensor by tensor (``acplan check``).

A difference is relative: per tensor (the output, each parameter's gradient, each buffer after the
step, such as BatchNorm's running statistics) the largest absolute difference from eager's over
eager's largest magnitude, and the worst over the tensors. A gradient is measured against at
least ``FLOOR`` times the step's largest gradient magnitude, and a buffer against the largest
buffer's: one that is zero but for rounding (an attention key's bias, which softmax cancels; a
pooler no loss reaches; the running mean of a BatchNorm fed by one whose shift is still zero) is
all rounding, and against its own magnitude would differ by 100% or more in any compiled step,
which would make torch.compile's yardstick useless for the rest. Generated kernels sum in other
orders than eager's, so a compiled step differs a little anyway, and by much more on a model whose step
amplifies rounding (BatchNorm over a handful of values, say): torch.compile's own difference from
eager, measured in the same run, is the yardstick. A planned step passes where its difference is
within ``tolerance`` or within ``SLACK`` times torch.compile's. Each planned step's difference from
torch.compile's step is reported beside it: where torch.compile's own step is far from eager's
(inductor's Bernoulli draws are not eager's, so a model with stochastic depth differs by whole
gradients), a planned step that equals torch.compile's to rounding did what torch.compile did.

Compiled steps run with inductor's ``fallback_random`` on, so that dropout draws what eager draws
(inductor's own generator draws other numbers); a planned step that recomputes a dropout must
then draw its masks again exactly.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

__all__ = ["Difference", "FLOOR", "Step", "SLACK", "WIDE", "allowance_note", "check_model", "compare_steps", "train_step"]

SLACK = 10.0  # a planned step may differ from eager by this many times torch.compile's difference
FLOOR = 1e-3  # a gradient (buffer) is measured against at least this times the step's largest gradient's (buffer's)
WIDE = 1e-3  # an allowance above this is said to be wide (allowance_note)


@dataclass(frozen=True)
class Step:
    """What one training step left: its output (detached), each parameter's gradient (None where
    the step reached none) and each buffer, by name."""

    output: torch.Tensor
    grads: dict[str, torch.Tensor | None]
    buffers: dict[str, torch.Tensor]


def train_step(run: Callable, model: torch.nn.Module, inputs: Sequence, seed: int = 0,
               autocast: torch.dtype | None = None) -> Step:
    """One step of ``run(*inputs)`` (``model`` or a compiled twin of it) under a fixed seed, so that
    dropout draws the same masks in every run. A scalar output is the loss; any other is reduced
    against a seeded random tangent. Gradients are taken off ``model`` (set to None). ``autocast``:
    the forward runs inside ``torch.autocast`` to that type on the inputs' device, as mixed-precision
    training runs it (the backward outside)."""
    torch.manual_seed(seed)
    device = next((x.device.type for x in inputs if isinstance(x, torch.Tensor)), "cpu")
    with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
        out = run(*inputs)
    if out.dim():
        torch.manual_seed(seed + 1)
        (out * torch.randn_like(out)).sum().backward()
    else:
        out.backward()
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = None
    return Step(out.detach(), grads, {n: b.detach().clone() for n, b in model.named_buffers()})


@dataclass(frozen=True)
class Difference:
    """The worst relative difference of a step from eager's, and the tensor it is in."""

    relative: float
    where: str


def compare_steps(got: Step, want: Step) -> Difference:
    """The worst relative difference of ``got`` from ``want`` (see the module; a gradient or buffer
    against at least :data:`FLOOR` times ``want``'s largest of its kind). A gradient one step has
    and the other lacks, or a tensor of another shape, is an infinite difference."""
    worst = Difference(0.0, "output")

    def floor(tensors: Iterable[torch.Tensor | None]) -> float:
        return FLOOR * max((t.abs().max().item() for t in tensors
                            if t is not None and t.numel() and t.is_floating_point()), default=0.0)

    pairs = [("output", got.output, want.output, 0.0)]
    least = floor(want.grads.values())
    pairs += [(f"gradient {n}", got.grads.get(n), g, least) for n, g in want.grads.items()]
    least = floor(want.buffers.values())
    pairs += [(f"buffer {n}", got.buffers.get(n), b, least) for n, b in want.buffers.items()]
    for where, a, b, least in pairs:
        if a is None and b is None:
            continue
        if a is None or b is None or a.shape != b.shape:
            return Difference(float("inf"), where)
        a, b = a.double(), b.double()
        scale = max(b.abs().max().item() if b.numel() else 0.0, least)
        diff = (a - b).abs().max().item() if b.numel() else 0.0
        relative = diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))
        if relative != relative:  # a NaN in either step (eager's too) is no match
            relative = float("inf")
        if relative > worst.relative:
            worst = Difference(relative, where)
    return worst


def _cast(made: tuple, dtype: torch.dtype | None) -> tuple[torch.nn.Module, tuple]:
    model, inputs = made
    if dtype is None:
        return model, tuple(inputs)
    inputs = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    return model.to(dtype), inputs


def check_model(made: tuple, budgets: Sequence[Any], compile_planned: Callable[[torch.nn.Module, Any], Callable],
                dtype: torch.dtype | None = None, tolerance: float = 1e-5,
                torch_compile: bool = True, autocast: torch.dtype | None = None) -> list[dict[str, Any]]:
    """Rows of the check of ``made`` (``(model, example_inputs)``): torch.compile's difference from
    eager (where ``torch_compile``), then each budget's (``compile_planned(model, budget)`` returns
    the planned twin to run) with ``passed``. ``dtype`` casts the model and its floating inputs
    first (float64 makes rounding small enough to tell a wrong plan from a reordered sum);
    ``autocast`` runs every step's forward inside ``torch.autocast`` to that type. A planned row's
    ``from_torch_compile`` is its difference from torch.compile's step (None without that run)."""
    model, inputs = _cast(made, dtype)
    model.train()
    base = copy.deepcopy(model)  # every run starts from the same weights and buffers
    # each run gets its own copy of the inputs: a model that updates an input in place (a running
    # statistic passed in) would otherwise hand every later run what the earlier ones left
    eager = train_step(model, model, copy.deepcopy(inputs), autocast=autocast)
    rows: list[dict[str, Any]] = []
    allowed = tolerance

    def compiled_step(run: Callable, twin: torch.nn.Module) -> Step:
        import torch._inductor.config as inductor_config

        with inductor_config.patch(fallback_random=True):  # compiled lazily, in the first call
            return train_step(run, twin, copy.deepcopy(inputs), autocast=autocast)

    compiled = None
    if torch_compile:
        torch._dynamo.reset()
        twin = copy.deepcopy(base)
        compiled = compiled_step(torch.compile(twin), twin)
        found = compare_steps(compiled, eager)
        rows.append({"run": "torch.compile", "relative": found.relative, "where": found.where, "passed": None})
        allowed = max(tolerance, SLACK * found.relative)
    for budget in budgets:
        torch._dynamo.reset()
        twin = copy.deepcopy(base)
        planned = compiled_step(compile_planned(twin, budget), twin)
        found = compare_steps(planned, eager)
        rows.append({"run": f"planner, budget {budget}", "relative": found.relative, "where": found.where,
                     "passed": found.relative <= allowed, "allowed": allowed,
                     "from_torch_compile": None if compiled is None else compare_steps(planned, compiled).relative})
    return rows


def allowance_note(rows: Sequence[dict[str, Any]]) -> str | None:
    """What the check's verdicts are worth where torch.compile's own difference made the
    allowance wide (above :data:`WIDE`), else None: a planned step wrong the way torch.compile's
    is passes too (on a model that reads a buffer and then updates it in place, torch.compile's
    step differed from eager's by 0.3, and a planned step that recomputed from the updated
    buffer the same way passed)."""
    reference = next((row for row in rows if row["run"] == "torch.compile"), None)
    allowed = max((row["allowed"] for row in rows if row.get("allowed") is not None), default=0.0)
    if reference is None or allowed <= WIDE:
        return None
    return (f"note: torch.compile's own step differs from eager by {reference['relative']:.1e} "
            f"({reference['where']}), so planned steps pass within {allowed:.1e}; a step wrong the way "
            "torch.compile's is passes too, and the difference from torch.compile's step says how close "
            "a planned step came to it. Rounding explains such a difference from eager in bfloat16 or "
            "float16; in float64 it rarely does (random draws inductor makes its own way do)")
