"""Attention masks given to ``scaled_dot_product_attention`` in a form its fused kernels take.

A model traced by torch.compile may build an attention mask from constants alone: a
transformers encoder given no padding mask builds an all-true boolean mask from ``arange``
when it is being compiled, where run eagerly it passes no mask at all. The mask is expanded
over the key dimension (stride 0 there), which no fused CUDA kernel accepts (they need the
mask's last dimension contiguous), so ``scaled_dot_product_attention`` falls back to its math
form: the scores materialised in fp32, ``[batch * heads, seq, seq]`` in the forward and twice
in the backward (on an H100, BERT at batch 16 and seq 512 held two 192 MiB fp32 buffers at the
peak of every plan, where eager PyTorch runs flash attention).

:func:`drop_constant_masks` is a pass over the graph dynamo hands a backend, before AOTAutograd
traces it: a mask computed from no graph input (no placeholder, so no parameter, buffer or
user tensor, and no random op) is evaluated once; if it masks nothing (a boolean mask all
true, a float mask all zero) the attention is called without it. The result is the same
attention, so the step trains as before.

:func:`contiguous_masks` handles the masks that do mask something: a CUDA mask whose last
dimension is not contiguous is copied to a contiguous one, once per mask (a mask shared by
every layer is copied once). T5's relative position bias is laid out keys-inner-heads-outer
(last stride 8 at 8 heads), so each of its self-attentions ran in math form too, with its fp32
scores; the copy (one bf16 ``[batch, heads, seq, seq]``) lets the memory-efficient kernel run,
which also gives the bias its gradient.
"""
from __future__ import annotations

import re

import torch
import torch.fx as fx

__all__ = ["drop_constant_masks", "contiguous_masks", "FUSED_MASK_DEVICES"]

_ATTENTION = torch.nn.functional.scaled_dot_product_attention
_MASK_POSITION = 3  # scaled_dot_product_attention(query, key, value, attn_mask, ...)
# Devices whose fused attention kernels need the mask's last dimension contiguous (CPU's
# flash kernel takes any strides).
FUSED_MASK_DEVICES = ("cuda",)
# Ops whose value is not a function of their arguments: a mask from any of them is not constant.
_RANDOM = re.compile(r"rand|dropout|bernoulli|normal|uniform|multinomial|poisson|exponential|geometric|cauchy")


def drop_constant_masks(gm: fx.GraphModule) -> list[str]:
    """Remove from ``gm``'s attention calls each mask that is computed from constants alone and
    masks nothing; returns the names of the attention nodes changed (``gm`` is recompiled when
    any is)."""
    changed = []
    for node in list(gm.graph.nodes):
        mask, where = _mask_argument(node)
        if mask is None or not _masks_nothing(mask):
            continue
        _set_mask(node, where, None)
        changed.append(node.name)
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed


def contiguous_masks(gm: fx.GraphModule, devices: tuple[str, ...] = FUSED_MASK_DEVICES) -> list[str]:
    """Give ``gm``'s attention calls a contiguous copy of each mask on one of ``devices`` whose
    last dimension is strided (boolean, or of the query's dtype: the masks fused kernels take);
    returns the names of the masks copied (``gm`` is recompiled when any is)."""
    copies: dict[fx.Node, fx.Node] = {}
    for node in list(gm.graph.nodes):
        mask, where = _mask_argument(node)
        if mask is None or not _strided_mask(mask, node.args[0], devices):
            continue
        if mask not in copies:
            with gm.graph.inserting_after(mask):
                copies[mask] = gm.graph.call_method("contiguous", (mask,))
        _set_mask(node, where, copies[mask])
    if copies:
        gm.recompile()
    return [mask.name for mask in copies]


def _strided_mask(mask: fx.Node, query: object, devices: tuple[str, ...]) -> bool:
    """``mask`` (dynamo's example value) is on one of ``devices``, of a dtype fused kernels take
    with ``query``, and its last dimension is not contiguous."""
    value = mask.meta.get("example_value")
    query = query.meta.get("example_value") if isinstance(query, fx.Node) else None
    if not isinstance(value, torch.Tensor) or not isinstance(query, torch.Tensor) or value.dim() == 0:
        return False
    return (value.device.type in devices and value.dtype in (torch.bool, query.dtype)
            and value.shape[-1] > 1 and value.stride(-1) != 1)


def _set_mask(node: fx.Node, where: str, mask: fx.Node | None) -> None:
    if where == "kwargs":
        node.kwargs = {**node.kwargs, "attn_mask": mask}
    else:
        node.args = (*node.args[:_MASK_POSITION], mask, *node.args[_MASK_POSITION + 1:])


def _mask_argument(node: fx.Node) -> tuple[fx.Node | None, str]:
    """An attention call's mask node, and whether it is passed by keyword or by position."""
    if node.op != "call_function" or node.target is not _ATTENTION:
        return None, ""
    if isinstance(node.kwargs.get("attn_mask"), fx.Node):
        return node.kwargs["attn_mask"], "kwargs"
    if len(node.args) > _MASK_POSITION and isinstance(node.args[_MASK_POSITION], fx.Node):
        return node.args[_MASK_POSITION], "args"
    return None, ""


def _masks_nothing(mask: fx.Node) -> bool:
    """``mask`` depends on no graph input and evaluates to all true (boolean) or all zero."""
    order = _constant_ancestry(mask)
    if order is None:
        return False
    values: dict[fx.Node, object] = {}
    try:
        with torch.random.fork_rng(devices=[]):
            for node in order:
                args = fx.node.map_arg(node.args, values.__getitem__)
                kwargs = fx.node.map_arg(node.kwargs, values.__getitem__)
                if node.op == "call_method":
                    values[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
                else:
                    values[node] = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001  a mask that cannot be evaluated here is kept as the model wrote it
        return False
    value = values[mask]
    if not isinstance(value, torch.Tensor):
        return False
    return bool(value.all()) if value.dtype == torch.bool else bool((value == 0).all())


def _constant_ancestry(mask: fx.Node) -> list[fx.Node] | None:
    """The nodes ``mask`` is computed from, in graph order, or None if any is a graph input, a
    module attribute, or a random op."""
    seen: set[fx.Node] = set()
    stack = [mask]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        if node.op not in ("call_function", "call_method") or _RANDOM.search(_name(node.target)):
            return None
        seen.add(node)
        stack.extend(node.all_input_nodes)
    return [node for node in mask.graph.nodes if node in seen]


def _name(target: object) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))
