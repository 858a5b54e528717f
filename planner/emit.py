"""Rewrite a joint graph into forward and backward modules that follow a decision.

The forward computes its outputs and the saved values; the backward recomputes every other
forward value it reads, each just before its first use, as the autograd engine would order it.
Random ops that are recomputed replay the RNG state the forward saved for them, so dropout masks
are bit-identical. A saved value may instead be offloaded (:mod:`planner.offload_ops`): the
forward copies it to host memory as soon as it is made and waits for the copy after its last
forward reader, which frees it there; the backward copies it back ahead of its first reader and
waits for that copy just before the reader.
"""
from __future__ import annotations

import contextlib
import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from planner import _torch_compat
from planner.offload_ops import OFFLOAD, RELOAD, WAIT
from planner.graph import JointGraph
from planner.memory import backward_propagated, convolutions_laid_out, copied_views
from planner.ops import (aliased_input, dense_layout, first_tensor, is_getitem, is_random, replays_as_traced,
                         storage_bytes, view_base, written_input)
from planner.problem import Problem, evaluate_names

__all__ = ["emit", "Transfer", "offloadable", "store_narrow_casts"]


def emit(joint: JointGraph, problem: Problem, saved: tuple[str, ...],
         offloaded: dict[str, Transfer] | None = None, fuse: bool = False) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward modules saving exactly ``saved`` (names of forward nodes).

    ``offloaded`` maps saved names to how they are offloaded (:class:`Transfer`); the forward
    hands those to the backward in host memory. The joint graph is rewritten in place (it is
    consumed). The modules follow AOTAutograd's calling convention: the forward returns its
    outputs, then the saved tensors, then saved sizes; the backward takes the saved values and
    the tangents and returns the gradients. Under inductor's layout optimisation, where the
    forward would hand over parts of a split that inductor stores as copies of their own, the
    modules are emitted again with those parts made in the backward (:func:`_copied_parts`).
    With ``fuse`` (the modules are compiled by inductor), widening casts that inductor would
    store read their narrow input stored instead (:func:`store_narrow_casts`).
    """
    whole = joint.copy() if convolutions_laid_out([*joint.primals, *joint.forward_nodes]) else None
    forward, backward = _emit(joint, problem, saved, offloaded or {}, frozenset())
    if whole is not None and (parts := _copied_parts(forward, joint.num_fwd_outputs)):
        forward, backward = _emit(whole, problem, saved, offloaded or {}, parts)
    if fuse:
        store_narrow_casts(forward, backward, channels_last=whole is not None)
        if whole is not None:
            recomputed_convolutions_read_channels_last(forward, backward, joint.num_fwd_outputs)
        for module in (forward, backward):
            whole_scatters_as_copies(module)
            as_strided_reads_as_traced(module)
    return forward, backward


def whole_scatters_as_copies(module: fx.GraphModule) -> list[fx.Node]:
    """Write every ``as_strided_scatter`` of ``module`` that overwrites all of its base as a copy
    of its source in the view's layout (a permute, a contiguous clone, a view to the base's
    shape); the scatters so replaced.

    Autograd writes the gradient of an ``as_strided`` so: zeros the size of the storage, the
    gradient scattered into them. Where the view covers the whole storage (a contiguous base, no
    offset, a view as large as the base with no gap and no overlap), no zero is left and the
    scatter is a copy. Inductor lowers the scatter as a fill of its base, then a write of the
    source through the view; torch 2.11 on the CPU fused that write into the loop computing the
    source, ahead of the fill, and the zeros overwrote it: timm's ConvNeXt (its head pools to
    1x1 and flattens) trained with its every gradient below the last block's scale zero
    wherever the planner's own modules ran (budgets 0 and 0.5; 1.0 with ``fast_end="model"``).
    The copy has no fill to order."""
    graph, replaced = module.graph, []
    for node in list(graph.find_nodes(op="call_function", target=torch.ops.aten.as_strided_scatter.default)):
        base, source, size, stride, *rest = (*node.args, *node.kwargs.values())
        offset = rest[0] if rest else 0
        if not (isinstance(base, fx.Node) and isinstance(source, fx.Node)) or offset \
                or not all(type(n) is int for n in (*size, *stride)):
            continue  # a symbolic size or stride is left to inductor
        base_val, source_val = base.meta.get("val"), source.meta.get("val")
        if not (isinstance(base_val, torch.Tensor) and isinstance(source_val, torch.Tensor)):
            continue
        if not base_val.is_contiguous() or math.prod(size) != base_val.numel() \
                or not dense_layout(torch.empty_strided(size, stride, device="meta")):
            continue
        order = sorted(range(len(size)), key=lambda dim: -stride[dim])
        permuted = _inserted_before(node, torch.ops.aten.permute.default, source, order)
        copied = _inserted_before(node, torch.ops.aten.clone.default, permuted, memory_format=torch.contiguous_format)
        viewed = _inserted_before(node, torch.ops.aten.view.default, copied, list(base_val.shape))
        node.replace_all_uses_with(viewed)
        graph.erase_node(node)
        schema = getattr(base.target, "_schema", None)
        if not base.users and base.op == "call_function" and schema is not None and not schema.is_mutable:
            graph.erase_node(base)  # the zeros the scatter filled
        replaced.append(node)
    if replaced:
        graph.lint()
        module.recompile()
    return replaced


def recomputed_convolutions_read_channels_last(forward: fx.GraphModule, backward: fx.GraphModule,
                                               num_fwd_outputs: int) -> list[fx.Node]:
    """Make every 2-D convolution ``backward`` recomputes, and every convolution backward, read
    its input channels-last where the strides inductor propagates to that input (from the saved
    values as the forward stored them, :func:`planner.memory.backward_propagated`) are not; the
    inputs so copied (one copy each, read by all of them).

    Inductor lays a forward with convolutions out channels-last, and lowers a convolution
    channels-last whatever its input's strides, but propagates strides through the backward
    graph by each op's own rules, and (torch 2.11) runs a convolution backward on its inputs in
    those strides. A value the forward stores channels-last by its shape though it is laid out
    otherwise (a layer norm's output over the channels, in the block's (N, H, W, C) shape) reaches
    a recomputed convolution through a permute in strides that are neither contiguous nor
    channels-last; the convolution's output then propagates contiguous, and so does all the
    backward recomputes from it. On an H100, ConvFormer-S18's depthwise convolutions' backwards
    then ran ATen's own kernels for contiguous inputs in place of cuDNN's channels-last ones
    (budget 0: 56.5 ms a step against torch.compile's 26.1, 18.7 ms of it in those kernels).
    The convolution backward of a recomputed convolution reads the same input, which cuDNN then
    copied to channels-last itself on every step (ConvFormer-S18's 1x1 convolutions at budget 0:
    3.7 ms of ATen copies more than torch.compile's step). The copy is the one inductor makes to
    lower the convolution; made explicit, its readers propagate channels-last."""
    readers: dict[fx.Node, list[tuple[fx.Node, int]]] = {}
    for target, position in ((torch.ops.aten.convolution.default, 0), (torch.ops.aten.convolution_backward.default, 1)):
        for node in backward.graph.find_nodes(op="call_function", target=target):
            source = node.args[position]
            if isinstance(source, fx.Node) and _four_d(source.meta.get("val")):
                readers.setdefault(source, []).append((node, position))
    if not readers:
        return []
    graph, copied = backward.graph, []
    order = {node: index for index, node in enumerate(graph.nodes)}
    pending = sorted(readers, key=order.__getitem__)
    while pending:
        # a copy lays out channels-last what the backward computes from its readers: the sources
        # laid out otherwise that none of them is computed from are copied, then strides are
        # propagated again for the rest
        propagated = backward_propagated(forward, backward, num_fwd_outputs, pending)
        wanted = {source for source in pending if _four_d(val := propagated.get(source))
                  and not val.is_contiguous(memory_format=torch.channels_last)}
        chosen, downstream = [], set()
        for node in graph.nodes:
            if any(arg in downstream for arg in node.all_input_nodes):
                downstream.add(node)
            elif node in wanted:
                chosen.append(node)
                downstream.add(node)
        for source in chosen:
            reading = readers[source]
            first = min((node for node, _ in reading), key=order.__getitem__)
            copy = _inserted_before(first, torch.ops.aten.clone.default, source, memory_format=torch.channels_last)
            for node, position in reading:
                node.update_arg(position, copy)
            copied.append(source)
        pending = [source for source in pending if source in wanted and source not in chosen]
    if copied:
        graph.lint()
        backward.recompile()
    return copied


def _four_d(val: object) -> bool:
    return isinstance(val, torch.Tensor) and val.dim() == 4


def _inserted_before(node: fx.Node, target: Any, source: fx.Node, *args: Any, **kwargs: Any) -> fx.Node:
    """``target(source, *args, **kwargs)`` inserted before ``node``, with its value (computed from
    ``source``'s, fake where that is) and ``node``'s phase tags."""
    traced = source.meta["val"]
    with getattr(traced, "fake_mode", None) or contextlib.nullcontext():
        val = target(traced, *args, **kwargs)
    with node.graph.inserting_before(node):
        inserted = node.graph.call_function(target, (source, *args), kwargs)
    inserted.meta = {"val": val, **_phase_tags(node)}
    return inserted


def _phase_tags(node: fx.Node) -> dict:
    """``node``'s tags of the phase it runs in (the backward's, and recomputed), for a node
    inserted beside it."""
    return {key: node.meta[key] for key in ("partitioner_tag", "recomputed") if key in node.meta}


def as_strided_reads_as_traced(module: fx.GraphModule) -> list[fx.Node]:
    """Make every ``as_strided`` of ``module`` read its input laid out as traced
    (:func:`_torch_compat.as_traced_strides`); the inputs so laid out.

    ``as_strided`` reads its input's storage through the strides it is given, which the trace
    wrote for the input's layout then (AOTAutograd writes some reshapes of a norm's statistics
    so). Inductor lays a value out as it likes: a forward laid out channels-last hands the
    backward saved values of other strides than traced, and a value the backward computes from
    them took their order. A plan that recomputed such a reshape in the backward (BiT's
    weight-standardised GroupNorm, transformers, at budget 0) read the wrong elements: gradients
    11% off, float64 on the CPU. An input whose traced layout has gaps or overlaps is left as it
    is (no layout of its own could give it back)."""
    graph, laid_out = module.graph, []
    for node in list(graph.find_nodes(op="call_function", target=torch.ops.aten.as_strided.default)):
        source = node.args[0]
        if not isinstance(source, fx.Node) or not replays_as_traced(source.meta.get("val")):
            continue
        meta = _phase_tags(node)
        with graph.inserting_before(node):
            node.args = (_as_traced(graph, source, meta), *node.args[1:])
        laid_out.append(source)
    if laid_out:
        graph.lint()
        module.recompile()
    return laid_out


def _copied_parts(forward: fx.GraphModule, num_fwd_outputs: int) -> frozenset[str]:
    """The parts of multi-output views (``split``, ``unbind``) that ``forward`` hands to the
    backward and that inductor would store as copies of their own (:func:`planner.memory.copied_views`):
    the backward makes them again from their base, saved already, instead of each part being
    held in a buffer of its own from the forward on. Other views stay handed over even where
    copied: made again in the backward from a base laid out channels-last, such a view fed
    matrix products and convolution backwards through a copy for each (ConvNeXt)."""
    copied = copied_views(forward, num_fwd_outputs)
    return frozenset(n.name for n in forward.graph.nodes if n.name in copied and is_getitem(n))


def _emit(joint: JointGraph, problem: Problem, saved: tuple[str, ...], offloaded: dict[str, Transfer],
          rebuilt: frozenset[str]) -> tuple[fx.GraphModule, fx.GraphModule]:
    """:func:`emit`, the views named in ``rebuilt`` made again in the backward from their base."""
    result = evaluate_names(problem, saved)
    by_name = {node.name: node for node in joint.graph.nodes}
    recomputed = {by_name[problem.names[i]] for i in result.recomputed.nonzero()[0]}
    kept = [by_name[problem.names[i]] for i in result.saved.nonzero()[0]]
    replays = _save_rng_states(joint, recomputed)
    recomputed = {replays[n].value if n in replays else n for n in recomputed}
    _insert_recomputation(joint, recomputed, {r.value: r for r in replays.values()}, rebuilt)
    store_narrow_random(joint.graph)
    kept = _insert_transfers(joint, kept, offloaded)
    saved_values, saved_syms = _saved_values(joint, kept, [r.state for r in replays.values()])
    joint.graph.lint()
    forward, backward = _torch_compat.extract_fwd_bwd_modules(joint.module, saved_values, saved_syms,
                                                              joint.num_fwd_outputs)
    _drop_recomputation(forward)
    return forward, backward


def _drop_recomputation(forward: fx.GraphModule) -> None:
    """Take the backward's copies of recomputed nodes out of ``forward``.

    The split copies into the forward every node whose inputs it has, and then removes those no
    output needs, but keeps a random op (dropout, and every attention kernel, which takes a dropout
    probability) where inductor's ``fallback_random`` is on: so the backward's recomputed attention,
    and all it reads, ran in the forward too, unread (and on the CPU a recomputed dropout there
    failed inductor's compile, its saved RNG state a real tensor under fake tensors). Nothing the
    forward returns reads a copy."""
    graph, dropped = forward.graph, False
    for node in reversed(list(graph.nodes)):
        if node.meta.get("recomputed") and node.op == "call_function" and not node.users:
            graph.erase_node(node)
            dropped = True
    if dropped:  # the memory model emits plans many times over; most forwards hold no copy
        graph.lint()
        forward.recompile()


@dataclass(frozen=True)
class _Replay:
    """A random node rewritten as ``pair = run_and_save_rng_state(op, *args)``; ``value = pair[1]``."""

    state: fx.Node
    value: fx.Node

    @property
    def pair(self) -> fx.Node:
        return self.value.args[0]


def _save_rng_states(joint: JointGraph, recomputed: set[fx.Node]) -> dict[fx.Node, _Replay]:
    """Make each recomputed random node also return the RNG state it started from."""
    graph, replays = joint.graph, {}
    for node in [n for n in joint.forward_nodes if n in recomputed and is_random(n)]:
        with graph.inserting_before(node):
            args = fx.map_arg(node.args, lambda a: _as_traced(graph, a, {"partitioner_tag": "is_forward"}))
            pair = graph.call_function(_torch_compat.run_and_save_rng_state(), (node.target, *args), node.kwargs)
            state = graph.call_function(operator.getitem, (pair, 0))
            value = graph.call_function(operator.getitem, (pair, 1))
        state_val = _rng_state_like(node)
        pair.meta = dict(node.meta, val=(state_val, node.meta["val"]))
        state.meta = {"val": state_val, "partitioner_tag": "is_forward"}
        value.meta = dict(node.meta)
        node.replace_all_uses_with(value)
        graph.erase_node(node)
        replays[node] = _Replay(state, value)
    return replays


def _as_traced(graph: fx.Graph, arg: fx.Node, meta: dict) -> fx.Node:
    """``arg`` for an op that an RNG higher-order op wraps, laid out as it was traced (the
    wrapper does not pass on the op's layout constraints: :func:`_torch_compat.as_traced_strides`).
    Inserted at the graph's insertion point, with ``meta`` added to the value's."""
    val = arg.meta.get("val")
    if not replays_as_traced(val):
        return arg  # the op reads a view into a larger storage: a layout no copy could have
    forced = graph.call_function(_torch_compat.as_traced_strides(), (arg, list(val.stride())))
    forced.meta = {"val": val, **meta}
    return forced


def _untraced(arg: fx.Node) -> fx.Node:
    """The value an :func:`_as_traced` node lays out (``arg`` itself for any other node)."""
    return arg.args[0] if arg.target is _torch_compat.as_traced_strides() else arg


def _rng_state_like(node: fx.Node) -> torch.Tensor:
    """A (fake) tensor shaped like the RNG state of the device the node runs on."""
    first = first_tensor(node.meta["val"])
    cuda = first.device.type == "cuda"
    state = torch.cuda.get_rng_state(first.device) if cuda else torch.get_rng_state()
    mode = getattr(first, "fake_mode", None)
    return mode.from_tensor(state) if mode is not None else state


def _insert_recomputation(joint: JointGraph, recomputed: set[fx.Node], replays: dict[fx.Node, _Replay],
                          rebuilt: frozenset[str] = frozenset()) -> None:
    """Give the backward its own copy of every recomputed node, placed before its first user;
    views of saved values are handed over from the forward, but for those named in ``rebuilt``."""
    graph = joint.graph
    copies: dict[fx.Node, fx.Node] = {}

    def copy_of(node: fx.Node, before: fx.Node) -> fx.Node:
        if node not in recomputed or (node.name not in rebuilt and _view_of_kept(node, recomputed)):
            return node
        if node not in copies:
            replay = replays.get(node)
            source = replay.pair if replay else node  # a replay re-runs the op inside the pair
            args = fx.map_arg(source.args, lambda a: copy_of(_untraced(a), before))
            kwargs = fx.map_arg(source.kwargs, lambda a: copy_of(a, before))
            with graph.inserting_before(before):
                if replay:
                    args = fx.map_arg(args, lambda a: _as_traced(graph, a, {"partitioner_tag": "is_backward",
                                                                            "recomputed": True}))
                    new = graph.call_function(_torch_compat.run_with_rng_state(), (replay.state, *args), kwargs)
                else:
                    new = graph.create_node(node.op, node.target, args, kwargs)
            new.meta = dict(node.meta, partitioner_tag="is_backward", recomputed=True)
            copies[node] = new
            if isinstance(node.meta.get("val"), (tuple, list)):  # a multi-output op: its outputs now
                for user in node.users:
                    if is_getitem(user):
                        copy_of(user, before)
        return copies[node]

    for user in [n for n in graph.nodes if n in joint.backward_nodes]:
        user.args = fx.map_arg(user.args, lambda a: copy_of(a, user))
        user.kwargs = fx.map_arg(user.kwargs, lambda a: copy_of(a, user))
    # the gradients; a forward output the backward recomputes is still returned as the forward made it
    output, forward_count = joint.output_node, joint.num_fwd_outputs
    outputs = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    outputs[forward_count:] = [fx.map_arg(a, lambda x: copy_of(x, output)) for a in outputs[forward_count:]]
    output.args = (type(output.args[0])(outputs) if isinstance(output.args[0], (list, tuple)) else outputs[0],
                   *output.args[1:])


def store_narrow_random(graph: fx.Graph) -> list[fx.Node]:
    """Store a recomputed random value's narrowest form where several kernels read it.

    Inductor stores every random tensor it generates (float32 for ``rand``) and computes the
    values made from it inside their readers' kernels. A dropout mask recomputed in a backward
    from its seed is read by the recomputed forward and by the dropout's backward: two kernels,
    so the float32 random tensor was stored between them, where the mask (bool) is a quarter of
    it (DeBERTa's attention, batch 16: 192 MiB against 48 on an H200). For each recomputed
    random node whose values are each read once, up to one read by several kernels
    (:func:`planner.memory.one_kernel`) that is narrower than the random tensor, that value is
    laid out as traced (:func:`_torch_compat.as_traced_strides`), which makes inductor store it
    and compute the random tensor in its kernel alone. Returns the values so laid out."""
    from planner.memory import narrow_random_value

    stored = []
    for node in [n for n in graph.nodes if n.meta.get("recomputed")]:
        value = narrow_random_value(node)
        if value is None or not dense_layout(value.meta["val"]):
            continue
        _read_as_traced(graph, value)
        stored.append(value)
    return stored


def _read_as_traced(graph: fx.Graph, value: fx.Node) -> None:
    """Every reader of ``value`` reads it laid out as traced (:func:`_torch_compat.as_traced_strides`,
    its traced strides), which makes inductor store it where it is made."""
    with graph.inserting_after(value):
        forced = graph.call_function(_torch_compat.as_traced_strides(), (value, list(value.meta["val"].stride())))
    forced.meta = dict(value.meta)
    value.replace_all_uses_with(forced, delete_user_cb=lambda user: user is not forced)


def store_narrow_casts(forward: fx.GraphModule, backward: fx.GraphModule, channels_last: bool = False) -> list[fx.Node]:
    """Store the narrow value a widening cast reads, where inductor would store the cast.

    A bfloat16 gradient that a normalisation's backward reads through a cast to float32 in
    several kernels is stored by inductor as the float32 cast (:func:`planner.memory.narrow_cast_input`).
    Laid out as traced (:func:`_torch_compat.as_traced_strides`), the narrow value is stored
    instead, at half the bytes, and the cast is computed inside each reader from it: what the
    readers load is what eager's kernels read, the gradient rounded to its own type. For the
    ``forward`` and ``backward`` modules inductor compiles (the backward's reductions far from
    their readers stay unfused there, :func:`planner.memory.far_epilogues`); ``channels_last``:
    inductor lays out the graph's convolutions channels-last, and 4-D casts are left to it.
    Returns the values so stored."""
    from planner.memory import far_epilogues, graph_unchanged, narrow_cast_input

    stored = []
    for module in (forward, backward):
        graph, far, own = module.graph, None, []
        casts, k = list(graph.nodes), 0
        while k < len(casts):
            narrow = None
            with graph_unchanged():  # answers kept while the graph stays as it is: storing a value changes it
                for k in range(k, len(casts)):
                    if narrow_cast_input(casts[k], None, channels_last) is None:  # the cheap part first: far only
                        continue                                                  # where it passes
                    if far is None:
                        steps = [n for n in graph.nodes if n.op != "output"]
                        far = far_epilogues(steps, True) if module is backward else frozenset()
                    if (narrow := narrow_cast_input(casts[k], far, channels_last)) is not None:
                        break
            if narrow is not None:
                _read_as_traced(graph, narrow)
                own.append(narrow)
            k += 1
        if own:
            module.recompile()
        stored += own
    return stored


@dataclass(frozen=True)
class Transfer:
    """Where one offloaded value's copies meet compute: the forward waits for the copy to host
    after ``wait_after`` (a forward node; None: the value's last forward reader, or the copy
    itself), and the backward starts the copy back before ``reload_before`` (a backward node;
    None: the value's first backward reader, where it is waited for in any case)."""

    wait_after: str | None = None
    reload_before: str | None = None


def offloadable(node: fx.Node, min_bytes: int = 0) -> bool:
    """Whether a saved node can be offloaded: a tensor that owns its storage, that no other
    value shares (no view of it, nothing written into it) and that the graph does not return
    (a forward output stays alive for the caller), so its copy holds all of it and freeing it
    after the copy frees its bytes; and of at least ``min_bytes`` (a transfer of a few bytes,
    such as an attention kernel's RNG seed, costs more than it frees)."""
    def shares(a: fx.Node, b: fx.Node) -> bool:
        return aliased_input(a) is b or written_input(a) is b

    val = node.meta.get("val")
    return (node.op == "call_function" and isinstance(val, torch.Tensor) and storage_bytes(val) >= max(min_bytes, 1)
            and aliased_input(node) is None and written_input(node) is None
            and not any(user.op == "output" or shares(user, node) for user in node.users))


def _insert_transfers(joint: JointGraph, kept: list[fx.Node], offloaded: dict[str, Transfer]) -> list[fx.Node]:
    """Offload the kept nodes named in ``offloaded``; returns the forward's saved nodes, each
    offloaded one replaced by its host copy."""
    if not offloaded:
        return kept
    graph = joint.graph
    by_name = {n.name: n for n in graph.nodes}
    unknown = sorted(set(offloaded) - {k.name for k in kept})
    if unknown:
        raise ValueError(f"offloaded values must be saved by the plan; not saved: {', '.join(unknown)}")
    forward = set(joint.forward_nodes)
    order = {n: i for i, n in enumerate(graph.nodes)}
    swapped = {}
    for value in [k for k in kept if k.name in offloaded]:
        if not offloadable(value):
            raise ValueError(f"{value.name} cannot be offloaded: only a tensor that owns its storage, that no view "
                             "or in-place op shares and that the graph does not return can be (planner.emit.offloadable)")
        how = offloaded[value.name]
        readers = [u for u in value.users if u in forward]
        backward = sorted((u for u in value.users if u not in forward), key=order.__getitem__)
        with graph.inserting_after(value):
            copy = graph.call_function(OFFLOAD, (value,))
        copy.meta = {"val": OFFLOAD(value.meta["val"]), "partitioner_tag": "is_forward", "offload": "forward"}
        after = by_name[how.wait_after] if how.wait_after else max(readers, key=order.__getitem__, default=copy)
        after = copy if after is value else after  # the copy was inserted right after the value
        first = backward[0] if backward else None  # a recomputed copy reading it may precede the placement's reader
        before = by_name[how.reload_before] if how.reload_before else first
        before = min(before, first, key=order.__getitem__) if first is not None else None
        # the forward's wait comes before the copy back starts (forward nodes may follow backward ones in the joint)
        early = before is not None and after is not copy and order[after] >= order[before]
        with graph.inserting_before(before) if early else graph.inserting_after(after):
            host = graph.call_function(WAIT, (copy, value))
        host.meta = dict(copy.meta)
        if first is None:
            swapped[value] = host
            continue
        val = value.meta["val"]
        with graph.inserting_before(before):
            back = graph.call_function(RELOAD, (host, val.device, list(val.size()), list(val.stride())))
        with graph.inserting_before(first):
            ready = graph.call_function(WAIT, (back,))
        back.meta = {"val": RELOAD(host.meta["val"], val.device, list(val.size()), list(val.stride())),
                     "partitioner_tag": "is_backward", "offload": "backward", "recomputed": True}
        ready.meta = dict(back.meta)
        for user in backward:
            user.replace_input_with(value, ready)
        swapped[value] = host
    return [swapped.get(k, k) for k in kept]


def _view_of_kept(node: fx.Node, recomputed: set[fx.Node]) -> bool:
    """A view (``view``, ``permute``, ``t``...) of a saved value or an input: the backward reads the
    forward's view, handed over in the saved value's storage, instead of making the view again.
    Inductor then lays the view out as its forward readers had it; rebuilt in the backward from a
    base it laid out channels-last, the view fed matrix products and convolution backwards through
    copies (ConvNeXt).

    A broadcast (``expand``, a stride of 0) is made again from its base instead: returned from
    the forward it is no view to inductor's CUDA backend, which writes it out whole in the
    broadcast shape. A grouped-query attention's key saved before its heads are repeated (2 MiB
    a layer on Qwen2) went over as a 14 MiB buffer, 3% over the predicted peak."""
    val = node.meta.get("val")
    if node.op != "call_function" or not isinstance(val, torch.Tensor):
        return False  # a multi-output view op (``split``) is made again; its parts, getitems, are views as any
    if broadcast(val):
        return False
    root = view_base(node)
    return root is not node and root not in recomputed


def broadcast(value: torch.Tensor) -> bool:
    """Whether ``value`` repeats elements of its storage (a dimension of stride 0 and size > 1)."""
    return any(size > 1 and stride == 0 for size, stride in zip(value.shape, value.stride()))


def _saved_values(joint: JointGraph, kept: list[fx.Node], rng_states: list[fx.Node]) -> tuple[list, list]:
    """Tensors and sizes the forward hands to the backward: saved nodes (or the views of them the
    backward reads), RNG states, and primals."""
    backward = [n for n in joint.graph.nodes if n.meta.get("recomputed") or n in joint.backward_nodes]
    read = {inp for n in backward for inp in n.all_input_nodes}
    views = [n for n in joint.forward_nodes if n in read and n not in kept and aliased_input(n) is not None
             and isinstance(n.meta.get("val"), torch.Tensor)]
    values, syms = [], []
    for node in [*[p for p in joint.primals if p in read], *[k for k in kept if k in read], *views, *rng_states]:
        (values if isinstance(node.meta.get("val"), torch.Tensor) else syms).append(node)
    return values, syms
