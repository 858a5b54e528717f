"""Runtime from FLOP counts and bytes moved, at nominal device rates.

Matrix ops are costed by ``torch.utils.flop_counter``; every op also pays for the bytes it reads
and writes, so bandwidth-bound pointwise chains are not free. The estimate is
``max(flops / flops_per_second, bytes / bytes_per_second)``, a roofline at fixed nominal rates
(the roofline estimator measures them for the device instead).
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from estimators.base import Estimator

__all__ = ["FlopsEstimator", "bytes_moved"]


class FlopsEstimator(Estimator):
    """Parameters
    ----------
    flops_per_second : nominal arithmetic rate (default 100 TFLOP/s, a modern GPU in bf16).
    bytes_per_second : nominal memory bandwidth (default 2 TB/s).
    """

    name = "flops"

    def __init__(self, flops_per_second: float = 100e12, bytes_per_second: float = 2e12) -> None:
        self.flops_per_second = float(flops_per_second)
        self.bytes_per_second = float(bytes_per_second)

    def runtime(self, node: fx.Node) -> float:
        return max(count_flops(node) / self.flops_per_second, bytes_moved(node) / self.bytes_per_second)


def _val(arg):
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def count_flops(node: fx.Node) -> int:
    """FLOPs of one call of the node's op, on its fake input tensors (0 for ops without a formula).

    Counted once per op and argument signature (shapes, dtypes, other arguments) in the process:
    the layers of a model repeat the same calls."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return 0
    if not any(op in flop_registry or op in _FORMULAS for op in (target, target.overloadpacket)):
        return 0
    args = tree_map(_val, node.args, is_leaf=lambda x: isinstance(x, fx.Node))
    kwargs = tree_map(_val, node.kwargs, is_leaf=lambda x: isinstance(x, fx.Node))
    key = repr((target, tree_map(_signature, (args, kwargs))))
    if key not in _COUNTED:
        if len(_COUNTED) > 100_000:
            _COUNTED.clear()
        if target.overloadpacket.__name__.startswith("_scaled_dot_product"):
            args = _query_heads(args)
        counter = FlopCounterMode(display=False, custom_mapping=_FORMULAS)
        with counter:
            target(*args, **kwargs)
        _COUNTED[key] = int(counter.get_total_flops())
    return _COUNTED[key]


_COUNTED: dict[str, int] = {}


def _cpu_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                            **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# Formulas torch's counter lacks before 2.14: the CPU's flash attention, which SDPA runs on a CPU,
# takes the arguments of the CUDA kernels' formulas (query, key, value first; the backward's
# output gradient before them), and counts as they do. Without them a CPU graph's attention was
# free to recompute.
_FORMULAS = {op: formula for op, formula in (
    (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, _cpu_attention),
    (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward, _cpu_attention_backward),
) if op not in flop_registry}


def _signature(arg):
    """What a FLOP formula reads of an argument: a tensor's shape and dtype, any other value."""
    return ("tensor", tuple(arg.shape), arg.dtype) if isinstance(arg, torch.Tensor) else arg


def _query_heads(args: tuple) -> tuple:
    """Attention arguments with grouped-query keys and values (fewer heads than the query, as
    ``enable_gqa=True`` passes them) repeated to the query's heads: the FLOPs are those of the
    repeated attention, and torch 2.11's counter accepts only equal heads."""
    heads = max((a.shape[-3] for a in args if isinstance(a, torch.Tensor) and a.dim() == 4), default=0)

    def repeat(a):
        if isinstance(a, torch.Tensor) and a.dim() == 4 and a.shape[-3] != heads and heads % a.shape[-3] == 0:
            return a.repeat_interleave(heads // a.shape[-3], dim=-3)
        return a

    return tuple(repeat(a) for a in args)


def bytes_moved(node: fx.Node) -> int:
    """Bytes of every tensor the node reads plus every tensor it writes."""
    leaves, _ = tree_flatten([_val(a) for a in node.all_input_nodes] + [node.meta.get("val")])
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
