"""What kind of operation an fx node of the joint graph is: view, random, side-effecting.

These predicates read the ATen schema (alias annotations, mutability, tags), never a hand-kept
list of op names, so new ops are classified correctly.
"""
from __future__ import annotations

import operator
from functools import lru_cache

import torch
import torch.fx as fx

__all__ = [
    "is_getitem",
    "is_view",
    "aliased_input",
    "view_base",
    "written_input",
    "is_random",
    "side_effect",
    "storage_bytes",
    "first_tensor",
    "device_name",
]

_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d", "_dtensor")


def is_getitem(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def _schema(node: fx.Node) -> torch.FunctionSchema | None:
    target = node.target
    return target._schema if isinstance(target, torch._ops.OpOverload) else None


def aliased_input(node: fx.Node) -> fx.Node | None:
    """The input whose storage the node's output shares, or None if the output owns its storage.

    A view op (``view``, ``t``, ``expand``, ``detach``, ...) aliases its annotated argument; a
    getitem of a view op's tuple (``split``, ``unbind``) aliases what that op aliases.
    """
    if is_getitem(node):
        parent = node.args[0]
        return aliased_input(parent) if isinstance(parent, fx.Node) else None
    index = _aliased_argument(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
    if index is None or index >= len(node.args):
        return None
    value = node.args[index]
    return value if isinstance(value, fx.Node) else None


@lru_cache(maxsize=None)
def _aliased_argument(target: torch._ops.OpOverload) -> int | None:
    """The position of the argument an op's output is a view of, read from its schema once."""
    schema = target._schema
    if schema.is_mutable:
        return None
    returns = [ret.alias_info for ret in schema.returns if ret.alias_info is not None and not ret.alias_info.is_write]
    if not returns:
        return None
    # A list return (``Tensor(a)[]`` of split/unbind/chunk) hides its alias set in the element
    # type, so an empty set means: aliases the annotated input.
    out_sets = {s for info in returns for s in info.after_set}
    for index, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is not None and not info.is_write and (not out_sets or out_sets & set(info.before_set)):
            return index
    return None


def view_base(node: fx.Node) -> fx.Node:
    """The node a chain of views (:func:`aliased_input`) of ``node`` ends at: ``node`` itself if it
    owns its storage."""
    while (base := aliased_input(node)) is not None:
        node = base
    return node


def written_input(node: fx.Node) -> fx.Node | None:
    """The input an in-place op writes and returns (``add_``, ``copy_``), or None."""
    schema = _schema(node)
    if schema is None or not schema.is_mutable:
        return None
    returned = {s for ret in schema.returns if ret.alias_info is not None and ret.alias_info.is_write
                for s in ret.alias_info.after_set}
    for arg, value in zip(schema.arguments, node.args):
        info = arg.alias_info
        if info is not None and info.is_write and returned & set(info.before_set) and isinstance(value, fx.Node):
            return value
    return None


def is_view(node: fx.Node) -> bool:
    return aliased_input(node) is not None


def is_random(node: fx.Node) -> bool:
    """True for ops that draw from the RNG (dropout, rand_like, bernoulli, ...).

    An aten op tagged as seeded that is asked for no dropout (``dropout_p`` 0, as the fused
    attention ops of most models are in training) draws nothing: the flash, memory-efficient and
    cuDNN attention kernels take the RNG state only where dropout_p > 0 (measured: the CUDA RNG
    state is unchanged by their forward and backward at 0, and moves at 0.1), so running it again
    gives the same values and leaves the RNG as it was. It is recomputed as itself, not through
    an RNG replay, which inductor runs outside its compiled code, from Python, on every step."""
    target = node.target
    if not (isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags):
        return False
    return not (target.namespace == "aten" and _asks_no_dropout(node, target._schema))


def _asks_no_dropout(node: fx.Node, schema: torch.FunctionSchema) -> bool:
    for position, arg in enumerate(schema.arguments):
        if arg.name == "dropout_p":
            value = node.args[position] if position < len(node.args) else node.kwargs.get(arg.name, arg.default_value)
            return isinstance(value, (int, float)) and value == 0
    return False


def side_effect(node: fx.Node) -> str | None:
    """Why the node must run exactly once, in the forward, or None if it is pure.

    Mutating ops, collectives and calls the planner cannot see into are never recomputed.
    """
    if node.op != "call_function":
        return None if node.op in ("placeholder", "output", "get_attr") else f"{node.op} node"
    if is_getitem(node):
        return None
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        if target.namespace in _COLLECTIVE_NAMESPACES:
            return "collective"
        if target._schema.is_mutable:
            return "mutates an input"
        return None
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher-order op {target.name()}"
    if getattr(target, "__module__", "") in ("_operator", "operator", "math", "torch.sym_float"):
        return None  # symbolic-size arithmetic on SymInts
    if getattr(target, "__module__", "").startswith("torch.fx.experimental.sym_node"):
        return None
    return f"opaque call {getattr(target, '__name__', target)}"


def written_inputs(node: fx.Node) -> list[fx.Node]:
    """The inputs ``node`` writes in place: the arguments its op's schema marks written
    (``copy_``'s destination, an ``add_``'s self, an ``out=``); none for a functional op."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
        return []
    written = []
    for place, argument in enumerate(target._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = node.args[place] if place < len(node.args) and not argument.kwarg_only else node.kwargs.get(argument.name)
        written += [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, fx.Node)]
    return written


def first_tensor(value: object) -> torch.Tensor | None:
    """The node value itself if a tensor, the first element of a tuple value, else None."""
    first = value[0] if isinstance(value, (tuple, list)) and value else value
    return first if isinstance(first, torch.Tensor) else None


def device_name(device: torch.device) -> str:
    """The name measurements and decisions are kept under for a device: the GPU's model name
    (``"NVIDIA H100 80GB HBM3"``), else ``"cpu"``."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def storage_bytes(value: torch.Tensor) -> int:
    """Bytes of the storage behind a (fake) tensor, which is what saving it keeps alive."""
    try:
        return int(value.untyped_storage().nbytes())
    except (NotImplementedError, RuntimeError):
        return int(value.numel() * value.element_size())


def dense_layout(val: torch.Tensor) -> bool:
    """``val``'s strides lay its elements out with no gap and no overlap, in some dim order."""
    expected = 1
    for size, stride in sorted(zip(val.shape, val.stride()), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def replays_as_traced(val: object) -> bool:
    """An RNG wrapper's argument of value ``val`` is laid out as traced by the emitter
    (:func:`planner.emit._as_traced`; the memory model counts it stored where it is made): a
    tensor of at least one dimension whose layout has no gap and no overlap."""
    return isinstance(val, torch.Tensor) and val.dim() > 0 and dense_layout(val)
