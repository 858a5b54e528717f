"""Capture a model's joint forward+backward graph through torch.compile and AOTAutograd."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.nn as nn

from planner import _torch_compat
from planner.attention_masks import contiguous_masks, drop_constant_masks
from planner.errors import CaptureError
from planner.frames import own_frame
from planner.graph import JointGraph

__all__ = ["capture", "as_inputs", "make_backend", "CODEGENS"]

CODEGENS = ("eager", "inductor")


class _Captured(Exception):
    """Raised from inside the partitioner to stop compilation once the joint graph is in hand."""

    def __init__(self, joint: JointGraph):
        super().__init__("joint graph captured")
        self.joint = joint


def as_inputs(example_inputs: Any) -> tuple:
    """Example inputs as a tuple: a lone tensor is wrapped, a list becomes a tuple."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs)
    raise CaptureError(
        f"example_inputs must be a tensor or a tuple of the model's positional arguments, "
        f"got {type(example_inputs).__name__}"
    )


def make_backend(partition_fn: Callable, codegen: str, inductor_options: dict[str, Any] | None = None,
                 fusions: Any = None) -> Callable:
    """A torch.compile backend whose joint graphs are split by ``partition_fn``.

    ``codegen="eager"`` runs the split graphs op by op (like aot_eager); ``"inductor"`` compiles
    them with inductor, through its custom partitioner hook, with ``inductor_options`` over the
    planner's inductor settings (``fusions`` adds up the fusions its guard refuses,
    :func:`planner._torch_compat.inductor_compile`).
    Either way, attention masks that mask nothing are dropped first, and strided CUDA masks made
    contiguous (:mod:`planner.attention_masks`).
    """
    if codegen == "eager":
        compile_graph = _torch_compat.aot_autograd(fw_compiler=_identity, bw_compiler=_identity, partition_fn=partition_fn)
    elif codegen == "inductor":
        options = dict(inductor_options or {})

        def compile_graph(gm, example_inputs):
            return _torch_compat.inductor_compile(gm, example_inputs, partition_fn, options, fusions)
    else:
        raise ValueError(f"codegen must be one of {CODEGENS}, got {codegen!r}")

    def backend(gm: fx.GraphModule, example_inputs: list) -> Callable:
        drop_constant_masks(gm)
        contiguous_masks(gm)
        return compile_graph(gm, example_inputs)

    return backend


def _identity(gm, example_inputs):
    from functorch.compile import make_boxed_func

    return make_boxed_func(gm)


def capture(model: nn.Module, example_inputs: Any, codegen: str = "eager",
            inductor_options: dict[str, Any] | None = None) -> JointGraph:
    """The joint forward+backward graph of one training step of ``model``.

    The model is traced with fake tensors (nothing is run for real, so BatchNorm statistics and
    the RNG are untouched). ``codegen`` must match how the plan will run, since inductor rewrites
    the joint graph before partitioning it (with ``inductor_options`` set as the plan will be).

    Raises
    ------
    CaptureError
        On a graph break, data-dependent control flow, or when nothing requires a gradient.
    """
    inputs = as_inputs(example_inputs)
    if not _anything_requires_grad(model, inputs):
        raise CaptureError(
            "nothing in this model or its inputs requires a gradient, so there is no backward pass "
            "to plan; call model.train() and make sure its parameters have requires_grad=True"
        )

    def grab(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        joint = _torch_compat.merge_common_subexpressions(joint)
        raise _Captured(JointGraph(joint, num_fwd_outputs, list(joint_inputs), kwargs))

    target = own_frame(model) if isinstance(model, nn.Module) else model
    compiled = torch.compile(target, backend=make_backend(grab, codegen, inductor_options), fullgraph=True, dynamic=False)
    try:
        compiled(*inputs)
    except Exception as err:  # dynamo wraps what the backend raises
        captured = _find_cause(err, _Captured)
        if captured is not None:
            return captured.joint
        raise _capture_error(err) from err
    raise CaptureError(
        "the model ran without producing a joint graph: its outputs do not depend on anything that "
        "requires a gradient; return a tensor computed from the parameters or inputs"
    )


def _anything_requires_grad(model: Any, inputs: Sequence) -> bool:
    params = model.parameters() if isinstance(model, nn.Module) else ()
    return any(p.requires_grad for p in params) or any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in inputs
    )


def _find_cause(err: BaseException | None, kind: type) -> Any:
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, kind):
            return err
        seen.add(id(err))
        err = getattr(err, "inner_exception", None) or err.__cause__ or err.__context__
    return None


def _capture_error(err: Exception) -> CaptureError:
    text = str(err)
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    data_dependent = any(
        key in text
        for key in ("data-dependent", "Data-dependent", "data dependent", "GuardOnDataDependent", "generic_jump")
    )
    where = _user_line(text)
    where = f" at {where}" if where else ""
    split = ("or compile it with planner.compile(model, ...) (torch.compile with planner.backend()), which "
             "plans the graphs between the breaks against one budget for the whole step (a break inside the "
             "loop over a model's layers makes torch.compile skip that whole frame: compile the layers with "
             "planner.compile_blocks(model.layers) then)")
    if data_dependent:
        return CaptureError(
            f"data-dependent control flow: the model branches on a tensor's value{where} ({first}); "
            f"replace the Python `if`/loop on tensor values with torch.where or torch.cond, {split}"
        )
    import torch._dynamo.exc as dynamo_exc

    if isinstance(err, (dynamo_exc.Unsupported, dynamo_exc.UserError)):
        return CaptureError(
            f"graph break: torch.compile cannot trace the whole model as one graph{where} ({first}); "
            "remove the unsupported Python construct from forward (prints, .item(), .tolist(), "
            f"calls into non-torch libraries), {split}"
        )
    if isinstance(err, dynamo_exc.TorchRuntimeError):
        return CaptureError(
            f"torch.compile could not run the model on fake tensors ({_fake_run_cause(text) or first}); dynamo "
            "traces so before any backend runs, so torch.compile fails on this model and these inputs whatever "
            "its backend: make `torch.compile(model, backend=\"eager\")` run on these inputs first"
        )
    return CaptureError(f"the model could not be traced by torch.compile: {type(err).__name__}: {first}")


def _user_line(text: str) -> str | None:
    """Where in the model's code dynamo stopped, from its message's "from user code" frames: the
    innermost one's file name, line and function, and its source line; None if it names none."""
    _, found, frames = text.partition("from user code:")
    calls = list(re.finditer(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', frames)) if found else []
    if not calls:
        return None
    path, line, function, source = calls[-1].groups()
    return f"{Path(path).name}:{line} in {function} (`{source.strip()}`)"


def _fake_run_cause(text: str) -> str | None:
    """The error an op raised when dynamo ran it on fake tensors, from dynamo's message (which
    opens with a line naming only dynamo's own error): its ``got Error('...')`` part, or None."""
    found = re.search(r"got (\w+(?:Error|Exception)\(.*?\))(?:\n|$)", text)
    if found is None:
        return None
    cause = found.group(1)
    return cause if len(cause) <= 400 else cause[:400] + "..."
