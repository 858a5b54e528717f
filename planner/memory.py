"""Memory of a training step: simulate the emitted graphs, and build a problem's schedule.

Both follow the same rules, read from node metadata:

* a view (and a getitem of a view op) shares its base's storage, and an in-place op's result
  the storage it wrote; a multi-output op allocates one storage per tensor output when it runs;
* an offloaded value's host copy takes no device memory, and the value is freed after the wait
  for that copy (its last reader); its copy back is allocated when the backward starts it;
* a storage is freed right after its last reader (inductor and fx code both drop references
  at last use); inputs and parameters are held before the step and never counted;
* forward outputs the caller keeps, and the gradients the backward returns, live to the end
  (outputs seen freed by the time the backward began, ``released``, only to the forward's end,
  or, where a value the graph saves holds their storage, to its last reader there: the
  caller's tensor is watched as well as the storage, which that saved value keeps alive);
  so do the backward's tangents, whatever reads them, on a torch whose autograd engine holds the
  gradients it hands a compiled backward (and the zeros it makes for an output that got none)
  until that backward returns (:func:`planner._torch_compat.tangents_held_through_backward`:
  torch 2.11; on an H200, HF GPT-2's first graph, cut from its loss by a graph break, held the
  zeros tangent of the hidden states it hands on, 12 MiB, at its backward's peak); elsewhere a
  tangent is freed after its last reader;
* with ``fuse=True`` (inductor), a pointwise value (a cast, a constant such as ``iota`` or
  ``full``) read only by pointwise ops, reductions, indexing ops and concatenations
  (:func:`fuses_producers`) is computed inside their kernel and never stored (so is a reduction
  read by one pointwise op, :func:`epilogue_reduction`),
  unless several kernels read it and it reads more than ``REALIZE_READS`` stored inputs
  (inductor then stores it rather than recompute it in each reader: its
  ``realize_reads_threshold``), or, on a CPU, its expression computes ``exp``, ``log``,
  ``sigmoid`` or ``tanh`` (:func:`stored_on_reuse`); a fused value's inputs are read when the
  kernel computing it runs; a value whose readers all run in one kernel (:func:`one_kernel`:
  a pointwise op and reductions that are its persistent epilogues) is never stored. A random
  tensor (inductor stores each one) is stored only where several kernels read it
  (:func:`random_in_one_kernel`). A fused kernel may write its output into an input of the same
  size that it reads last (inductor's in-place reuse), but never into a tangent: the backward's
  tangents are graph inputs inductor does not own (saved values are donated to it, tangents
  are not; an output the step never uses gets a tangent of zeros the autograd engine makes);
  nor into a saved value whose storage a forward output the caller got shares, which
  AOTAutograd does not donate (on an H200, OPT's logits, saved for the loss's backward and
  dropped by the caller: its gradient took a buffer of its own, 128 MiB, beside them); the
  schedule counts this in the backward only, so in the forward its bound stays at or above
  the simulation;
* a library kernel (a matrix product, a convolution, attention: :func:`library_kernel`) on a
  CUDA device also holds the scratch memory measured for it (:mod:`planner.workspace`: a cuDNN
  workspace, an attention backward's accumulators) while it runs, at its own step only. The
  schedule counts it at the steps of the forward's and the backward's own kernels, and a
  recomputed copy's at the step the copy is made for (a recomputed convolution's workspace:
  0.1-294 MiB on ResNet-50 at batch 128 on an H100);
* with ``fuse=True``, a library kernel whose inputs inductor lays out itself (fused attention:
  :func:`copies_inputs`) computes a pointwise input not stored yet into a copy of its own, alive
  at its step only (:func:`input_copy_bytes`); the value itself is then never stored;
* with ``fuse=True``, when inductor lays the forward out channels-last (its layout optimisation,
  on for most convolutional networks), every 4-D input or weight of a convolution that is a
  graph input not already channels-last is copied before the forward runs
  (:func:`layout_copies`); the copy replaces the input for all its readers, so it is freed
  after its last reader, in the backward if the input is saved.

The schedule is built before the plan is known. Its backward fusion looks through a fusible
forward value into that value's producers, as the emitted backward does when the value is
recomputed. Where that walk counts a recomputed copy stored (over ``REALIZE_READS``), the
schedule also names the producers whose saving would stop the walk within it
(:func:`inlined_once_saved`), and a plan's evaluation counts the copy fused where the plan
saves one of them. When the value is saved instead, the emitted backward reads it as a stored tensor,
and a backward expression over it may be fused where the schedule stored it. Its inputs then
stay alive a few kernels longer, against a temporary the schedule counted: on the test GPT,
128 bytes under the simulation at some steps, never at the peak. Treating saved-or-recomputed
forward values as stored tensors instead overcounts by the whole logits (256 MiB on the
benchmark GPT), since the log-softmax is recomputed there.

:func:`simulate` walks the emitted forward and backward modules; :func:`build_schedule` gives
the torch-free :class:`~planner.schedule.Schedule` the solvers plan with.
"""
from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from functools import lru_cache
from dataclasses import dataclass, field
from itertools import takewhile
from typing import Callable, Collection, Iterable, Mapping, TypeVar

import numpy as np
import torch
import torch.fx as fx

from planner._torch_compat import REALIZE_ACC_READS, tangents_held_through_backward
from planner.graph import JointGraph, placed_order
from planner.offload_ops import OFFLOAD
from planner.ops import (aliased_input, dense_layout, is_getitem, is_random, replays_as_traced, storage_bytes,
                         written_input)
from planner.schedule import Schedule
from planner.workspace import workspace_bytes

T = TypeVar("T")

__all__ = ["Timeline", "simulate", "build_schedule", "storage_root", "layout_copies", "convolutions_laid_out",
           "constant_inlined", "CONVOLUTIONS", "graph_unchanged"]


@dataclass(frozen=True)
class Timeline:
    """Bytes alive after each node of the step runs, in execution order.

    ``steps[k]`` is ``(phase, node name, bytes)`` with phase ``"forward"`` or ``"backward"``;
    ``at_peak`` lists the storages alive at the (first) peak step as ``(phase, node name, bytes)``,
    for finding what the simulation counts there (``bench/gpu_trace.py``); ``saved_at_peak`` names
    the forward's saved values (its outputs after the caller's) alive there.
    """

    steps: tuple[tuple[str, str, int], ...]
    at_peak: tuple[tuple[str, str, int], ...] = field(default=(), compare=False, repr=False)
    saved_at_peak: tuple[str, ...] = field(default=(), compare=False, repr=False)
    # bytes alive once the forward has run and freed what its last ops read
    forward_end: int = 0
    # kernels the two modules run, counted as kernel_count counts them
    kernels: int = field(default=0, compare=False)
    # bytes of each value's own storage, by (phase, node name): 0 where it is computed in its
    # readers; a value written in place of an input is left out, and named in written_in_place
    stored: Mapping[tuple[str, str], int] = field(default_factory=dict, compare=False, repr=False)
    written_in_place: frozenset[tuple[str, str]] = field(default=frozenset(), compare=False, repr=False)

    @property
    def peak(self) -> int:
        return max((b for _, _, b in self.steps), default=0)

    @property
    def held_after_forward(self) -> int:
        """Bytes alive when the forward ends: what the graph keeps for its backward, with its
        outputs, while the graphs after it in the step run. A step's bytes are those alive while
        its op runs, its inputs included: the forward's last op's inputs that nothing keeps are
        freed once it ends (``forward_end``), and a graph that runs several times before its
        backward, or before other graphs, keeps only what is left."""
        return self.forward_end

    @property
    def forward_peak(self) -> int:
        return max((b for phase, _, b in self.steps if phase == "forward"), default=0)

    @property
    def backward_peak(self) -> int:
        return max((b for phase, _, b in self.steps if phase == "backward"), default=0)

    @property
    def peak_step(self) -> tuple[str, str, int] | None:
        return max(self.steps, key=lambda s: s[2], default=None)


def storage_root(node: fx.Node) -> fx.Node:
    """The node that owns the storage ``node``'s value lives in."""
    while (base := _shared_input(node)) is not None:
        node = base
    return node


_AS_TRACED = "prims.inductor_force_stride_order.default"  # planner._torch_compat.as_traced_strides
_name = lru_cache(maxsize=None)(str)  # an op's name, as str gives it, made once per op


def _shared_input(node: fx.Node) -> fx.Node | None:
    """The input whose storage the node's value is (a view of, or written in place; or its
    input laid out as traced for an RNG wrapper, which inductor writes where the input is made)."""
    if _name(node.target) == _AS_TRACED:  # named: the prim is registered only once inductor is imported
        return node.args[0]
    return aliased_input(node) or written_input(node)


# Within one simulate() or build_schedule(): the readers, leaf reads, kernels, persistent
# epilogues, constant expressions and inputs not written in place of nodes of graphs that do
# not change while it walks them, each found once (on ResNet-50's emitted modules they were
# found again ~10^5 times); per thread, as a table each in ``_seen.maps``, None outside a walk
_seen = threading.local()


@contextmanager
def _graphs_unchanged():
    outer = getattr(_seen, "maps", None)
    _seen.maps = outer if outer is not None else _empty_maps()
    try:
        yield
    finally:
        _seen.maps = outer


def graph_unchanged():
    """A context in which the graphs walked do not change: what this module finds for their
    nodes (readers, leaf reads, kernels, layouts) is found once and kept until it exits. For
    callers that ask it of many nodes of one graph, such as an estimator pricing each node of a
    joint graph (outside one, every question walks the graph afresh: 8.8 s of a 2-core CPU for
    the roofline's step estimate of timm's ConvFormer-S18 joint graph of 2912 nodes)."""
    return _graphs_unchanged()


def _empty_maps() -> tuple[dict, ...]:
    return ({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {})


def _seen_or_found(table: int, key: object, find):
    """``find()``, or within a walk (:func:`_graphs_unchanged`) what it gave for ``key`` before."""
    maps = getattr(_seen, "maps", None)
    if maps is None:
        return find()
    found = maps[table].get(key)
    if found is None:
        found = maps[table][key] = find()
    return found


def _with_tables(find: Callable[[tuple[dict, ...]], T]) -> T:
    """``find(maps)`` with the walk's tables (:func:`_graphs_unchanged`), or outside a walk with
    tables made for this call alone: the graph does not change while it runs."""
    maps = getattr(_seen, "maps", None)
    if maps is not None:
        return find(maps)
    _seen.maps = _empty_maps()
    try:
        return find(_seen.maps)
    finally:
        _seen.maps = None


def readers(node: fx.Node) -> list[fx.Node]:
    """Nodes that read ``node``'s storage, looking through views of it."""
    return list(_seen_or_found(0, node, lambda: tuple(_readers(node))))


def _readers(node: fx.Node) -> list[fx.Node]:
    found = []
    for user in node.users:
        if _shared_input(user) is node:
            if written_input(user) is node:
                found.append(user)  # an in-place op reads what it writes
            found.extend(readers(user))
        elif not online_softmax_sum(user):
            found.append(user)
    return found


_SUM, _AMAX, _SUB, _EXP = (torch.ops.aten.sum.dim_IntList, torch.ops.aten.amax.default, torch.ops.aten.sub.Tensor,
                           torch.ops.aten.exp.default)


def online_softmax_sum(node: fx.Node) -> bool:
    """``node`` sums ``exp(x - amax(x))`` over the dims of the max, both kept, on a device where
    inductor computes that row max and sum in one reduction of ``x`` (its online softmax,
    :func:`planner._torch_compat.online_softmax`): ``node`` does not read the ``exp``, which is
    computed only in its other readers (the softmax's division).

    On an H200 (torch 2.11) GPT-Neo's float32 softmax (rows of 2048) stored no ``exp``: its
    expression reads five stored inputs (the scores, the causal mask, two positions indexed out
    of a sum, the row max), which the memory model had taken as stored for its two readers, 256
    MiB a layer at batch 1."""
    if node.target is not _SUM or len(node.args) < 3 or node.args[2] is not True:
        return False
    exp = node.args[0]
    if not (isinstance(exp, fx.Node) and exp.target is _EXP and isinstance(sub := exp.args[0], fx.Node)
            and sub.target is _SUB and isinstance(amax := sub.args[1], fx.Node) and amax.target is _AMAX):
        return False
    if amax.args[0] is not sub.args[0] or list(amax.args[1]) != list(node.args[1]) or amax.args[2:3] != (True,):
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    from planner._torch_compat import online_softmax

    return online_softmax(val.device.type)


def stored_bytes(node: fx.Node, reading: list[fx.Node], fuse: bool, far: Collection[fx.Node] = ()) -> int:
    """Bytes written to memory for ``node``'s own storage, given the nodes that read it
    (``far``: the backward's reductions too far from their reader to be fused,
    :func:`far_epilogues`)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or _shared_input(node) is not None or node.target is OFFLOAD:
        return 0  # a view, an in-place result, or a copy in host memory
    if fuse and _inlined(node, reading, far):
        return 0
    return storage_bytes(val)


REALIZE_READS = 4
FUSED_IF_SAVED = 4  # producers kept per value by the schedule (Schedule.fused_if_saved)


def kernel_steps(order: list[fx.Node], fuse: bool, far: Collection[fx.Node] = (),
                 stored: Collection[fx.Node] = ()) -> dict[fx.Node, int]:
    """Index in ``order`` of the last kernel that computes each node, when its inputs are really
    read: its own, or for a value fused into its readers, the last of theirs. A node in
    ``stored`` (known to be stored) is computed at its own index.

    A stored pointwise value is also computed inside the kernels of the readers inductor lowers
    before it is stored: it stores the value when a reader that cannot fuse it (a matrix product)
    asks for it, and readers lowered earlier (in graph order) already inlined its expression.
    """
    where = {node: k for k, node in enumerate(order)}
    steps: dict[fx.Node, int] = {}
    for node in reversed(order):
        steps[node] = where[node]
        val = node.meta.get("val")
        if fuse and isinstance(val, torch.Tensor) and _shared_input(node) is None and node not in stored:
            reading = readers(node)
            if not reading or not all(r in steps for r in reading):
                continue
            if _inlined(node, reading, far):
                steps[node] = max(steps[r] for r in reading)
            elif fusible(node) and not all(_leaves_unstored(r) for r in reading) and not stored_on_reuse(node):
                lowered_first = takewhile(_leaves_unstored, sorted(reading, key=where.__getitem__))
                steps[node] = max([steps[node], *(steps[r] for r in lowered_first)])
    return steps


def _inlined(node: fx.Node, reading: list[fx.Node], far: Collection[fx.Node] = ()) -> bool:
    """Inductor computes ``node`` inside the kernels that read it (see the module docstring), a
    matrix product inside the ``addmm`` its one reader becomes (:func:`accumulated_product`), or
    a reduction inside its one pointwise reader's kernel (:func:`epilogue_reduction`) unless it
    is in ``far``. A random value is computed in its readers' kernel when they are one kernel
    (:func:`random_in_one_kernel`); a value the emitter lays out as traced (for generated
    kernels: :func:`planner.emit.store_narrow_random`; for an RNG wrapper:
    :func:`laid_out_for_replay`) is stored."""
    if accumulated_product(node, reading) or (node not in far and epilogue_reduction(node, reading)):
        return True
    if not reading and node.users and all(online_softmax_sum(user) for user in node.users):
        return True  # an ``exp`` only the online softmax's reduction reads: computed nowhere
    if _name(node.target) in _RANDOM_VALUES:
        return random_in_one_kernel(node, far)
    if not _may_inline(node, reading) or _stored_for_library(len(_leaf_reads(node, _OWN_DEPTH)), reading):
        return False
    if stored_for_reads(node):
        return _fused_into_reader(node, reading, far)
    return one_kernel(reading, far) or not stored_on_reuse(node)


def _may_inline(node: fx.Node, reading: list[fx.Node]) -> bool:
    """``node`` is pointwise (or reads nothing), each of its readers computes it in its own kernel,
    and the emitter does not lay it out as traced (stored where it is made: :func:`laid_out_for_replay`)."""
    return ((fusible(node) or reads_nothing(node)) and bool(reading) and all(_leaves_unstored(r) for r in reading)
            and not _forced_stored(node))


def _forced_stored(node: fx.Node) -> bool:
    """The emitter lays ``node`` out as traced (``inductor_force_stride_order``): inductor stores
    it where it is made, and its readers load it."""
    return any(_name(user.target) == _AS_TRACED for user in node.users)


def _stored_for_library(leaves: int, reading: list[fx.Node]) -> bool:
    """A value reading ``leaves`` stored inputs is stored for the library kernel among its
    ``reading`` nodes that copies its inputs (inductor's realize_hint)."""
    return leaves > 1 and any(copies_inputs(r) for r in reading)


def inlined_once_saved(node: fx.Node, reading: list[fx.Node]) -> list[fx.Node]:
    """The producers whose saving, any one of them, lets inductor compute ``node``'s recomputed
    copy inside the kernels reading it, where the schedule counts that copy stored (fewest bytes
    first, then nearest ``node``; none where there are none).

    The schedule looks through a fusible forward value into its producers, as the emitted
    backward does when they are recomputed too; where the walk counts more than
    ``REALIZE_READS`` stored inputs, inductor stores the copy (:func:`stored_on_reuse`). A saved
    producer is one stored input of the emitted backward, and the walk stops there. On an H200,
    timm's ViT after the merge of common subexpressions: each layer norm's backward reads the
    forward's normalised input, ``(x - mean) * rstd`` in float32; recomputed, it reads six stored
    inputs through the residual stream ``x``, and the schedule counted its copy stored (36.9 MiB
    a layer); with ``x`` saved it reads three, and the compiled backward stored none (budget 0,
    each block's input saved: 643.2 MiB in the problem, 616.2 traced and simulated)."""
    if (_name(node.target) in _RANDOM_VALUES or not _may_inline(node, reading) or one_kernel(reading)
            or _heavy_reuse_on_cpu(node)):
        return []
    through = _looked_through(node, _OWN_DEPTH)
    found = []
    for producer, _ in sorted(through.items(), key=lambda item: (storage_bytes(item[0].meta["val"]), item[1])):
        leaves = len(_leaf_reads_stopped_at(node, producer, _OWN_DEPTH))
        if leaves <= REALIZE_READS and not _stored_for_library(leaves, reading):
            found.append(producer)
    return found


def _looked_through(node: fx.Node, depth: int) -> dict[fx.Node, int]:
    """The producers holding a tensor of their own that :func:`_leaf_reads` looks into from
    ``node``, each with the fewest producers between (0: an input of ``node``)."""
    found: dict[fx.Node, int] = {}
    frontier, between = [node], 0
    while frontier and depth > 0:
        following = []
        for n in frontier:
            for inp in n.all_input_nodes:
                producer = storage_root(inp)
                if producer not in found and not reads_nothing(producer) and _inlined_producer(producer):
                    found[producer] = between
                    following.append(producer)
        frontier, between, depth = following, between + 1, depth - 1
    return {p: k for p, k in found.items() if isinstance(p.meta.get("val"), torch.Tensor)}


def _leaf_reads_stopped_at(node: fx.Node, stop: fx.Node | None, depth: int) -> set[fx.Node]:
    """:func:`_leaf_reads` of ``node``, with ``stop`` (if any) read as a stored input (saved);
    the producers whose walk does not reach ``stop`` give their own, memoised. A view of ``stop``
    is an input of its own: the emitter hands a view of a saved value to the backward as it is
    (:func:`planner.emit._view_of_kept`), and inductor counts each input it loads. On the CPU
    capture of Wav2Vec2's feature encoder with GPU rules, a GroupNorm's float32 GELU input read
    its saved ``rstd * weight`` and a view of it: five stored inputs in the emitted backward,
    where the walk had counted four and the schedule its copy fused once that product is saved
    (the plan the solver found least at 401.5 MiB simulated at 600.9; inductor stored the copy,
    200 MiB, on an H100).

    A load at computed indices (:data:`_LOADS`) reads its stored operand once per load: inductor
    counts each load of a buffer at an index of its own (``nontrivial_read_count``), so the load
    stands for its operand's read. transformers' attention masks index one padding mask twice
    (by query and by key position): on an H100, GPT-2's mask, read by its fused attentions, was
    counted as reading one stored input and so copied by each attention, where inductor stored it
    (16 MiB at batch 8) for reading two."""
    leaves: set[fx.Node] = set()
    for inp in node.all_input_nodes:
        producer = storage_root(inp)
        if reads_nothing(producer):
            continue
        if stop is not None and producer is stop:
            leaves.add(inp)
            continue
        if depth > 0 and _inlined_producer(producer):
            if stop is not None and stop in _looked_through(producer, depth - 1):
                leaves |= _leaf_reads_stopped_at(producer, stop, depth - 1)
            else:
                leaves |= _leaf_reads(producer, depth - 1)
            continue
        leaves.add(node if node.target in _LOADS and inp is node.args[0] else producer)  # a load's operand
    return leaves


def laid_out_for_replay(node: fx.Node) -> bool:
    """A random op reads ``node``, a dense tensor: recomputed, that op replays in an RNG wrapper
    whose dense inputs the emitter lays out as traced (:func:`planner.emit._as_traced`), and
    inductor then stores ``node``'s copy where it is made, for every reader (:func:`_inlined`).
    On an H200, T5's attention bias (64 MiB at batch 16), computed for a recomputed attention
    replayed with its dropout, stayed stored until that attention's backward read it, another
    layer's attention and backward running between; the memory model had counted a copy for
    each reader, alive at its step only (budget 0: 483.1 MiB predicted, 555.4 measured)."""
    return replays_as_traced(node.meta.get("val")) and any(is_random(r) for r in readers(node))


def one_kernel(reading: list[fx.Node], far: Collection[fx.Node] = ()) -> bool:
    """The nodes ``reading`` a value all run in one kernel: one node, or one pointwise node and
    reductions that are its persistent epilogues (:func:`persistent_epilogue`), computed in one
    kernel itself (:func:`_computed_once`).

    Inductor stores a value that several kernels read and that reads more than
    ``REALIZE_READS`` stored inputs; a buffer whose readers all end up in the kernel computing
    it is never written (its kernel-local buffers). A softmax backward recomputed from its
    inputs reads the product of the output and its gradient in a row sum and in the pointwise
    op that reads the sum, all in one persistent reduction: on an H200, DeBERTa's (a dropout mask,
    the scores, their row max and sum, the attention's gradient: 5 reads) was counted as a
    stored 192 MiB float32 buffer at budget 0 and never allocated (predicted 991 MiB, measured
    824)."""
    ends = {_kernel_end(reader, far) for reader in reading}
    return len(ends) == 1 and (len(reading) == 1 or _computed_once(next(iter(ends)), far))


def _computed_once(end: fx.Node, far: Collection[fx.Node] = (), depth: int = 4) -> bool:
    """The kernel computing the expression of ``end``, where several readers of a value meet
    (:func:`_kernel_end`), is one kernel: ``end`` is no pointwise value read by several kernels
    that compute it, or is stored on reuse (:func:`stored_on_reuse`), or its readers meet again
    in one such kernel (looked for ``depth`` times).

    Inductor stores a value that several nodes read, past ``REALIZE_READS`` stored inputs, as it
    lowers it, and drops the buffer only where every reader ends up in the kernel that computes
    it. Readers that meet in a pointwise value inlined into several kernels read the buffer in
    each. On an H100, Wav2Vec2's feature encoder at budget 0: a GELU's recomputed float32 input
    (5 stored inputs, read by the three products of the GELU's gradient) met in the gradient,
    which the GroupNorm backward's looped row sums and its pointwise output each compute: the
    model had counted no buffer, inductor stored it (200 MiB at batch 8)."""
    return _seen_or_found(9, (end, far, depth), lambda: _find_computed_once(end, far, depth))


def _find_computed_once(end: fx.Node, far: Collection[fx.Node], depth: int) -> bool:
    # in a joint graph, the backward's readers load the saved value or compute a copy of their
    # own: the forward's kernels are those of the forward's readers (on a CPU, DeBERTa's softmax
    # exp, its row sum and division meeting in the probabilities the backward reads too, had
    # been counted stored, 192 MiB a layer, and the least peak planned rose from 516 to 686 MiB)
    phase = _tagged_backward(end)
    reading = [r for r in readers(end) if _tagged_backward(r) == phase]
    if (end.op != "call_function" or not fusible(end) or len(reading) < 2 or not all(_leaves_unstored(r) for r in reading)
            or stored_on_reuse(end) or _forced_stored(end)):
        return True
    ends = {_kernel_end(reader, far) for reader in reading}
    if len(ends) > 1 and _side_by_side(ends):
        return True
    return depth > 0 and len(ends) == 1 and _computed_once(next(iter(ends)), far, depth - 1)


def _side_by_side(ends: Collection[fx.Node]) -> bool:
    """Pointwise values of one size reading a common input: inductor fuses their kernels into one
    (on a CPU, a softmax's probabilities read by two products came out as one kernel that
    stores both products and not the exp)."""
    sizes = {n.meta["val"].numel() if isinstance(n.meta.get("val"), torch.Tensor) else None for n in ends}
    return all(n.op == "call_function" and fusible(n) for n in ends) and len(sizes) == 1 and None not in sizes


def _kernel_end(node: fx.Node, far: Collection[fx.Node] = (), depth: int = 8) -> fx.Node:
    """The node whose kernel computes ``node``: ``node`` itself, or, looking through a reduction
    that is a persistent epilogue and a pointwise value with one reader that computes it, the
    node they are computed in."""
    return _seen_or_found(2, (node, far, depth), lambda: _find_kernel_end(node, far, depth))


def _find_kernel_end(node: fx.Node, far: Collection[fx.Node], depth: int) -> fx.Node:
    for _ in range(depth):
        if persistent_epilogue(node, far):
            node = readers(node)[0]
        elif (node.op == "call_function" and fusible(node) and len(reading := readers(node)) == 1
              and _leaves_unstored(reading[0]) and not _forced_stored(node)):
            node = reading[0]
        else:
            break
    return node


_RANDOM_VALUES = frozenset({"prims.inductor_random.default", "prims.inductor_randint.default"})


def random_in_one_kernel(node: fx.Node, far: Collection[fx.Node] = ()) -> bool:
    """Inductor computes the random tensor ``node`` inside one kernel and never stores it.

    Inductor stores every random tensor it generates, and drops the buffer when the one kernel
    computing all its readers reads it (a kernel-local buffer). Followed through the values
    computed from it in their one reader's kernel: the first value stored, or read by several
    kernels, or by a kernel that cannot compute it, decides. A dropout mask recomputed in a
    backward from its seed, read by the recomputed forward and by the dropout's backward, had
    its float32 random tensor stored between the two (192 MiB for DeBERTa's attention at batch
    16 on an H200); in a forward the dropout's kernel computes it."""
    value = node
    for _ in range(8):
        reading = readers(value)
        if len(reading) != 1:
            return bool(reading) and all(fuses_producers(r) for r in reading) and one_kernel(reading, far)
        (reader,) = reading
        if not fusible(reader):
            return fuses_producers(reader)
        if stored_bytes(reader, readers(reader), True, far) > 0:
            return True
        value = reader
    return False


def narrow_random_value(node: fx.Node) -> fx.Node | None:
    """The value made from the random tensor ``node`` that the emitter stores in its place where
    ``node`` is recomputed (:func:`planner.emit.store_narrow_random`): following ``node``'s one
    pointwise reader at a time, the first value read by several kernels, if it is narrower than
    ``node``; None otherwise."""
    if node.op != "call_function" or _name(node.target) not in _RANDOM_VALUES:
        return None
    value = node
    while len(value.users) == 1 and fusible(reader := next(iter(value.users))):
        value = reader
    val, random = value.meta.get("val"), node.meta.get("val")
    if (value is node or len(value.users) < 2 or not isinstance(val, torch.Tensor) or not isinstance(random, torch.Tensor)
            or val.element_size() >= random.element_size() or one_kernel(readers(value))):
        return None
    return value


def narrow_cast_input(cast: fx.Node, far: Collection[fx.Node] | None = (),
                      channels_last: bool | None = None) -> fx.Node | None:
    """The narrower value that the widening cast ``cast`` reads, which the emitter stores in the
    cast's place (:func:`planner.emit.store_narrow_casts`); None where there is none.

    A gradient computed in a narrow float type and read through a cast to float32 by several
    kernels (the decompositions of the normalisations' backwards cast their inputs up, and read
    them in row sums, column sums and a pointwise output) is stored by inductor as the cast: the
    float32 value, twice the bytes of the narrow one, which is read by no other node. Stored
    narrow, the cast reads one input and is computed inside each reader. On an H100, Wav2Vec2's
    first GroupNorm backward (bf16) stored its float32 input, 200 MiB at batch 8, at the step's
    peak. Taken where ``cast`` widens a float on one device, only generated kernels read it,
    inductor would store it (:func:`stored_bytes`; ``far`` as there), and its input is a
    pointwise value densely laid out that only ``cast`` reads; with ``far`` None, whether inductor
    would store the cast is not asked (the cheap part of the test, for a caller that finds ``far``
    only where some cast passes it).

    Not where the graph's convolutions are laid out channels-last (``channels_last``; None: as
    the walk in progress has it) and the value is 4-D: stored as traced, it is a contiguous
    buffer among channels-last ones, and what reads it comes out contiguous too. On an H100,
    ResNet-50's residual gradients, so stored, reached seven convolutions' backwards that way,
    which converted each to channels-last before cuDNN read it (1.2 ms of copies a step, and
    three more reductions, 1.08x torch.compile's GPU time for PyTorch's own split at budget 1.0)."""
    val = cast.meta.get("val")
    if cast.op != "call_function" or cast.target not in _CASTS or not isinstance(val, torch.Tensor):
        return None
    narrow = cast.args[0]
    small = narrow.meta.get("val") if isinstance(narrow, fx.Node) else None
    if (not isinstance(small, torch.Tensor) or not small.is_floating_point() or not val.is_floating_point()
            or small.element_size() >= val.element_size() or small.device != val.device):
        return None
    if channels_last is None:
        channels_last = getattr(_seen, "layout", None) is not None
    if channels_last and small.dim() == 4:
        return None
    if (narrow.op != "call_function" or len(narrow.users) != 1 or not fusible(narrow) or reads_nothing(narrow)
            or not dense_layout(small) or _shared_input(narrow) is not None):
        return None
    reading = readers(cast)
    if not reading or not all(fuses_producers(r) for r in reading):
        return None
    return narrow if far is None or stored_bytes(cast, reading, True, far) > 0 else None


PERSISTENT_RNUMEL = 1024  # inductor's largest persistent inner reduction (its choices' threshold)


def persistent_epilogue(node: fx.Node, far: Collection[fx.Node] = ()) -> bool:
    """``node`` is a reduction over its input's last dimensions of at most
    :data:`PERSISTENT_RNUMEL` elements, fused into its one pointwise reader
    (:func:`epilogue_reduction`, not ``far``): inductor computes each row in registers in one pass
    (a persistent reduction), and the reader's code runs in the same loop, after the row's
    reduction. On a GPU a longer row is reduced in a loop, and a value read again after that
    loop is taken as stored; inductor's CPU code computes it in the kernel at any length."""
    return _seen_or_found(3, (node, far), lambda: _is_persistent_epilogue(node, far))


def _is_persistent_epilogue(node: fx.Node, far: Collection[fx.Node]) -> bool:
    # a reduction the graph also returns (saved for a backward) is stored for it, and still
    # computed in its reader's kernel: on a CPU, DeBERTa's softmax at budget 0 saved its row sum,
    # and inductor computed the exp, the sum and the division in one kernel, where the model had
    # stored the float32 exp (192 MiB a layer) for two kernels
    if node.op != "call_function" or node in far or not epilogue_reduction(node, [r for r in readers(node) if r.op != "output"]):
        return False
    source, dims = node.args[0], node.args[1] if len(node.args) > 1 else None
    val = source.meta.get("val") if isinstance(source, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not isinstance(dims, (list, tuple)) or not dims or val.dim() == 0:
        return False
    dims = sorted(int(d) % val.dim() for d in dims)
    rnumel = int(np.prod([val.shape[d] for d in dims]))
    return (dims == list(range(val.dim() - len(dims), val.dim()))
            and (rnumel <= PERSISTENT_RNUMEL or val.device.type not in _GPU_TYPES))


def _leaves_unstored(reader: fx.Node) -> bool:
    """Lowering ``reader`` does not store a pointwise value it reads: it computes the value in
    its own kernel (:func:`fuses_producers`), or into a copy of its own (:func:`copies_inputs`)."""
    return fuses_producers(reader) or copies_inputs(reader)


def copies_inputs(node: fx.Node) -> bool:
    """Inductor lays out ``node``'s tensor inputs as its kernel needs them, and computes an input
    it has not stored yet (a pointwise value) into a copy made for ``node`` alone, alive while
    ``node`` runs (its ``require_stride_order``): a library kernel with a layout constraint
    (:func:`planner._torch_compat.inductor_fixes_layout`: fused attention, an RNN), or an RNG
    wrapper, whose arguments the emitter lays out as traced (:func:`planner.emit._as_traced`; a
    dense one is then stored where it is made, not copied: :func:`laid_out_for_replay`).

    A convolution is left out: inductor lays out a convolution's input when the input's producer
    is lowered, once for all its readers. On an H100, T5's attention bias (64 MiB, read by a
    recomputed attention and by its backward) was computed into a copy for each, made just
    before it and freed after it, not stored from the first to the second (the layer's FFN
    backward runs between them): 64 MiB over the measured peak at budget 0."""
    if node.op != "call_function":
        return False
    if _name(node.target) in _RNG_WRAPPERS:
        return True
    if node.target in CONVOLUTIONS or not library_kernel(node.target):
        return False
    from planner._torch_compat import inductor_fixes_layout

    return inductor_fixes_layout(node.target)


def input_copy_bytes(node: fx.Node, fuse: bool, far: Collection[fx.Node] = (),
                     within: Collection[fx.Node] | None = None) -> int:
    """Bytes of the copies :func:`copies_inputs` makes for ``node``: one per input that inductor
    has not stored (a pointwise value whose readers, other than the graph's output, do not store
    it; ``within``, where given, the readers that count), laid out dense. A value the graph also
    returns is stored for the output after its readers are lowered, so they still copy it."""
    return sum(input_copies(node, fuse, far, within))


def input_copies(node: fx.Node, fuse: bool, far: Collection[fx.Node] = (),
                 within: Collection[fx.Node] | None = None) -> list[int]:
    """The bytes of each copy :func:`input_copy_bytes` counts, in input order."""
    if not fuse or not copies_inputs(node):
        return []
    sizes, seen = [], set()
    for inp in node.all_input_nodes:
        root = storage_root(inp)
        val = inp.meta.get("val")
        if root in seen or root.op != "call_function" or not fusible(root) or not isinstance(val, torch.Tensor):
            continue
        reading = [r for r in readers(root) if r.op != "output" and (within is None or r in within)]
        if _inlined(root, reading, far):
            seen.add(root)
            sizes.append(val.numel() * val.element_size())
    return sizes


def epilogue_reduction(node: fx.Node, reading: list[fx.Node]) -> bool:
    """``node`` is a reduction that inductor computes inside the kernel of its one reader, a
    pointwise op (the reduction's epilogue).

    Inductor fuses a reduction with its pointwise consumer however far apart the two are in the
    graph (its scheduler has no distance limit), so the reduction's inputs are read, and stay
    alive, until the consumer runs. T5's relative position bias, shared by every layer, gets one
    batch-summed gradient per layer; the pointwise sum of those gradients runs after the last
    layer's backward, and inductor fused every layer's batch sum into it: each layer's
    softmax-backward inputs (128 MiB fp32 scores at batch 16, seq 512) stayed alive to the end of
    the backward, 1.7 GiB over the memory model at budget 0 on an H100. The planner's compile
    refuses such fusions in a backward (:func:`planner._torch_compat.fusion_distance_guard`), so
    in a backward the rule holds only within its distance (:func:`far_epilogues`); in a forward,
    which the guard leaves alone, it holds at any distance.
    """
    return (is_reduction(node) and isinstance(node.meta.get("val"), torch.Tensor)
            and len(reading) == 1 and fusible(reading[0]))


def far_epilogues(order: list[fx.Node], fuse: bool) -> frozenset[fx.Node]:
    """The reductions of a backward ``order`` that :func:`epilogue_reduction` would fuse into a
    reader computed more than :data:`~planner._torch_compat.FUSION_DISTANCE` kernels later (the
    reader's own kernel, or that of the readers a pointwise reader is fused into), or with an
    operator inductor does not generate (a matrix product, a convolution) run between the two:
    the planner's compile refuses those fusions
    (:func:`~planner._torch_compat.fusion_distance_guard`), so each is stored where it runs.
    Kernels are counted as inductor's scheduler counts its nodes before fusion: one per stored
    value (by the rules above) and per operator it cannot generate."""
    if not fuse:
        return frozenset()
    from planner._torch_compat import FUSION_DISTANCE

    kernel = kernel_steps(order, fuse)
    kernels = np.zeros(len(order) + 1, dtype=np.int64)
    candidates = []
    for k, node in enumerate(order):
        reading = readers(node) if node.op == "call_function" else []
        own = node.op == "call_function" and not is_getitem(node) and _shared_input(node) is None
        if own and isinstance(node.meta.get("val"), torch.Tensor):
            own = stored_bytes(node, reading, fuse) > 0 or not generated(node)
        kernels[k + 1] = kernels[k] + int(own)
        if epilogue_reduction(node, reading) and reading[0] in kernel:
            candidates.append((k, kernel[reading[0]]))
    # apart as the guard counts: the difference of the two kernels' places
    externs = np.cumsum([0] + [int(_extern(node)) for node in order])
    return frozenset(order[k] for k, read in candidates
                     if kernels[read] - kernels[k] > FUSION_DISTANCE or externs[read] > externs[k + 1])


def kernel_count(gm: fx.GraphModule, fuse: bool, backward: bool = False) -> int:
    """Kernels ``gm`` runs, counted as inductor's scheduler counts its nodes before fusion (as
    :func:`far_epilogues` does): one per value stored by the rules above (a value computed inside
    its readers' kernels is none) and one per operator inductor does not generate (a library
    kernel). Inductor fuses some of those nodes into one kernel (a reduction with the pointwise
    value it reads): counts compare plans of one graph, not a plan with the launches measured.
    ``backward``: ``gm`` is a backward, whose far reductions are stored. Without ``fuse`` (eager
    codegen), one per operator."""
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    with _graphs_unchanged():
        return _kernels(nodes, fuse, far_epilogues(nodes, fuse) if backward else frozenset())


def _kernels(nodes: list[fx.Node], fuse: bool, far: Collection[fx.Node]) -> int:
    """:func:`kernel_count` of ``nodes``, ``far`` their stored far reductions; the simulation's
    walk counts each module so, with the ``far`` it found."""
    count = 0
    for node in nodes:
        if node.op != "call_function" or is_getitem(node) or _shared_input(node) is not None:
            continue
        if (isinstance(node.meta.get("val"), torch.Tensor) and (generated(node) or node.target in _INDEXING)
                and stored_bytes(node, readers(node), fuse, far) == 0):
            continue
        count += 1
    return count


def _extern(node: fx.Node) -> bool:
    """``node`` is an operator inductor runs as an extern kernel (not :func:`fuses_producers`,
    not a random prim), one of the backward's own.

    A recomputed copy (an emitted backward's) does not count: the schedule is built before the
    plan and cannot know where copies will be, and the simulation must stay within its bound, so
    both look at the backward's own operators. (A recomputed product between a reduction and its
    reader is then taken as fused where the compile stores the reduction: the reduction's own
    bytes are missed, its inputs counted a little longer.)"""
    return (node.op == "call_function" and not is_getitem(node) and _shared_input(node) is None
            and not fuses_producers(node) and _name(node.target) not in _RANDOM_PRIMS
            and not node.meta.get("recomputed"))


# inductor's random prims, which it generates as pointwise code (named: registered only once inductor is imported)
_RANDOM_PRIMS = frozenset({"prims.inductor_random.default", "prims.inductor_randint.default",
                           "prims.inductor_seeds.default", "prims.inductor_lookup_seed.default"})


def accumulated_product(node: fx.Node, reading: list[fx.Node]) -> bool:
    """``node`` is a matrix product that inductor computes where its one reader, an add, is.

    Inductor's post-grad passes rewrite ``add(mm(a, b), c)`` into ``addmm(c, a, b)`` placed at the
    add (``c`` of the product's dtype; the pattern matcher tries the product as the add's second
    operand first). The product then stores nothing of its own, and ``a`` and ``b`` are read when
    the add runs: a tied weight's gradient, the output layer's product added to the embedding's
    gradient at the end of the backward, keeps the logits' gradient alive until then (128 MiB on
    BERT at batch 16 on an H100, where the memory model had freed it after the product). Only a
    ``c`` of the product's own shape counts (a broadcast bias sits next to its product anyway).

    On a GPU, inductor leaves the add unfused when every reader of the sum is pointwise (its
    ``should_prefer_unfused_addmm``: the add then fuses into them), and the product is computed
    where it is. T5's tied embedding gets the output layer's gradient added to the decoder's
    embedding gradient, and that sum is added to the encoder's: the model had kept T5's 128 MiB
    logits gradient alive through the decoder's backward, which the H100 did not.

    The planner's compile keeps a product apart from an add far from where its operands are
    made (:func:`planner._torch_compat.products_apart`): such a product is stored where it runs.
    """
    if node.target is not _MM or len(reading) != 1:
        return False
    add = reading[0]
    if add.target is not _ADD or add.kwargs or len(add.args) != 2 or node not in add.args:
        return False
    first, second = add.args
    if first is second:
        return False
    if first is node and isinstance(second, fx.Node) and accumulated_product(second, readers(second)):
        return False  # the second product is the one rewritten
    other = second if first is node else first
    if not _same_operand(other, node) or _prefers_unfused_add(add, other):
        return False
    from planner._torch_compat import operands_ready_near

    return operands_ready_near(add, node.args[:2])  # else the planner's compile keeps it apart


_GPU_TYPES = ("cuda", "xpu", "mps", "mtia")  # inductor's GPU device types (``is_gpu``)


def _prefers_unfused_add(add: fx.Node, other: fx.Node) -> bool:
    """Inductor keeps ``add`` apart from its product: ``other`` is on a GPU and every reader
    of the sum (through views) is a pointwise op."""
    return other.meta["val"].device.type in _GPU_TYPES and all(torch.Tag.pointwise in _tags(r) for r in readers(add))


def _same_operand(other: object, product: fx.Node) -> bool:
    """``other`` can be the ``c`` of ``addmm(c, a, b)`` for ``product``: a computed tensor of its
    dtype and shape with no broadcast dimension."""
    val, out = (other.meta.get("val") if isinstance(other, fx.Node) else None), product.meta.get("val")
    return (isinstance(val, torch.Tensor) and isinstance(out, torch.Tensor) and other.op != "placeholder"
            and val.dtype == out.dtype and tuple(val.shape) == tuple(out.shape) and 0 not in val.stride())


_MM, _ADD = torch.ops.aten.mm.default, torch.ops.aten.add.Tensor


def _leaf_reads(node: fx.Node, depth: int) -> frozenset[fx.Node]:
    """The stored inputs a fused pointwise expression reads, looking through inlined producers.

    A producer read by several kernels is inlined only while it reads at most ``REALIZE_READS``
    stored inputs itself; past that inductor stores it, and it is one read. On ConvNeXt's
    backward a layer norm's gradient (reading 8 inputs) is stored, and the residual gradient
    summed over the blocks after it (3 reads) stays inlined: each block's gradient stays alive
    to the stage's end (73.5 MiB at budget 0 on an H100, where the model had stored the sum).

    Whether a producer is inlined is counted from the producer (inductor decides it as it lowers
    the producer), not from how deep the walk has come: on an H200, CodeGen's recomputed softmax
    gradient read the stored probabilities and one more input, and was inlined into its two
    readers, where the walk from it, stopped short inside the probabilities' mask, had counted
    four inputs for them instead of five, inlined them and so counted five for the gradient
    (1 GiB a layer at batch 4, stored in the model and not by inductor)."""
    return _with_tables(lambda maps: _leaf_reads_in(node, depth, maps[1]))


def _leaf_reads_in(node: fx.Node, depth: int, known: dict) -> frozenset[fx.Node]:
    if (node, _OWN_DEPTH) not in known:
        _own_reads_first(node, known)
    return _seen_or_found(1, (node, depth), lambda: _find_leaf_reads(node, depth))


_OWN_DEPTH = 8  # how deep a producer's own stored reads are looked for


def _walked_producer(inp: fx.Node) -> fx.Node | None:
    """The producer :func:`_find_leaf_reads` may look into for input ``inp`` (through views), or
    None. A value the emitter lays out as traced is stored where it is made (:func:`_may_inline`):
    one read, however it was computed."""
    producer = storage_root(inp)
    if (reads_nothing(producer) or not fusible(producer) or not all(fuses_producers(r) for r in readers(producer))
            or _forced_stored(producer)):
        return None
    return producer


def _inlined_producer(node: fx.Node) -> bool:
    """A pointwise producer whose expression inductor lowers inside the expressions reading it:
    it has one reader, or is not stored on reuse (:func:`stored_on_reuse`). One that is, is one
    stored input of its readers' expressions, whether or not the scheduler later drops its buffer
    (its readers in one kernel: :func:`_inlined`): inductor counts a value's reads as it lowers it."""
    return (_walked_producer(node) is not None and not _heavy_reuse_on_cpu(node) and not stored_for_reads(node)
            and (len(readers(node)) < 2 or not stored_on_reuse(node)))


# the ops whose reuse inductor stores on a CPU (StorageBox.should_realize_on_reuse's heavy ops)
_HEAVY_ON_CPU = frozenset(f"{space}.{op}.default" for space in ("aten", "prims")
                          for op in ("exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"))


def stored_on_reuse(node: fx.Node) -> bool:
    """Inductor stores a pointwise value that several kernels read rather than compute it in
    each (``StorageBox.should_realize_on_reuse``): where it reads more than ``REALIZE_READS``
    stored inputs, its inlined producers' included; and on a CPU, where it has several readers
    and its expression computes an ``exp``, ``log``, ``sigmoid`` or ``tanh`` (inductor's heavy ops
    there: an inlined producer's count too). On a CPU (torch 2.13), timm's CoAtNet (tiny, bf16)
    at budget 0 stored such values the model had computed in each reader, the MBConv blocks'
    ``sigmoid`` and the casts over them among them: 0.55 MB forward and 6.3 MB backward before
    this rule, 0.16 and 2.8 MB after (``PlannerBackend.stores_against_inductor``)."""
    return len(_leaf_reads(node, _OWN_DEPTH)) > REALIZE_READS or _heavy_reuse_on_cpu(node)


def stored_for_reads(node: fx.Node) -> bool:
    """Inductor stores the pointwise value ``node``, however many kernels read it, where its
    expression, with the producers inlined into it, reads more than
    :data:`~planner._torch_compat.REALIZE_ACC_READS` stored inputs (``has_exceeded_max_reads``,
    which the planner's compile sets for every device): past that, it is one stored input of
    its readers. A gradient summed from many branches is such a value: on an H100, T5's backward
    at budget 0 stored a sum of the residual stream's gradients (8 MiB at batch 16) that the
    model had computed inside the one kernel reading it."""
    return (node.op == "call_function" and fusible(node) and isinstance(node.meta.get("val"), torch.Tensor)
            and len(_accumulated_reads(node)) > REALIZE_ACC_READS)


def _fused_into_reader(node: fx.Node, reading: list[fx.Node], far: Collection[fx.Node] = ()) -> bool:
    """The scheduler fuses the kernel storing ``node`` (:func:`stored_for_reads`) into the one
    kernel reading it, which drops its buffer: its readers are one kernel (:func:`one_kernel`)
    that waits for no library kernel (a matrix product, a convolution) run after ``node``. The
    planner's compile refuses a fusion across such a kernel in a backward
    (:func:`~planner._torch_compat.fusion_distance_guard`), and a forward's fusion would have to
    move ``node``'s kernel past it. On the CPU (tiny BERT, bf16, budget 0) a layer norm's
    gradient stored so, read by the next pointwise op alone, kept no buffer; a running sum of
    gradients, each term a matrix product's output made after it, kept its buffer."""
    if not one_kernel(reading, far):
        return False
    end = _kernel_end(reading[0], far)
    if not _computed_once(end, far):  # one reader, computed in several kernels: each loads the buffer
        return False
    place = _places(node.graph)
    made = place[node]
    return not any(_extern(read) and place[read] > made  # storages: the reads are their roots
                   for read in _accumulated_reads(end) - _accumulated_reads(node))


def _places(graph: fx.Graph) -> dict[fx.Node, int]:
    """Each node's index in ``graph``'s order (once per walk)."""
    return _seen_or_found(11, graph, lambda: {n: k for k, n in enumerate(graph.nodes)})


def _accumulated_reads(node: fx.Node) -> frozenset[fx.Node]:
    """The storages ``node``'s expression loads, through the producers inlined into it however
    deep (inductor counts the buffers an expression reads, each once: ``num_reads``). Found with
    a stack, producers first, each once per walk: a residual stream is a chain as deep as the
    model, and the rule (:func:`stored_for_reads`) keeps each set small."""
    return _with_tables(lambda maps: _accumulated_reads_in(node, maps[10]))


def _accumulated_reads_in(node: fx.Node, known: dict) -> frozenset[fx.Node]:
    stack, order = [(node, False)], []
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
        elif n not in known:
            known[n] = None  # being walked
            stack.append((n, True))
            stack.extend((p, False) for inp in n.all_input_nodes
                         if (p := _walked_producer(inp)) is not None and p not in known)
    for n in order:
        reads: set[fx.Node] = set()
        for inp in n.all_input_nodes:
            producer = storage_root(inp)
            if reads_nothing(producer):
                continue
            if _inlined_producer(producer):  # walked (a producer the walk looks into), so found first
                reads |= known[producer]
            else:
                reads.add(producer)
        known[n] = frozenset(reads)
    return known[node]


def _heavy_reuse_on_cpu(node: fx.Node) -> bool:
    """On a CPU, ``node`` has several readers and its expression computes one of inductor's heavy
    ops (:func:`stored_on_reuse`): inductor stores it as it lowers it, so the expressions reading
    it load it, even where they then run in one kernel with it (which drops the buffer: a
    recomputed softmax's output read by its backward's row sum and the op reading that sum)."""
    if not _on_cpu(node) or len(node.users) < 2:  # in a joint graph, its forward and backward readers: the
        return False                                # schedule's bound stays above the simulation's
    with _graphs_unchanged():  # memoised for this call at least: the graph does not change while it runs
        return _seen_or_found(7, node, lambda: _heavy_expression(node))


def _on_cpu(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.device.type == "cpu" and "cpu" not in _GPU_TYPES


def _heavy_expression(node: fx.Node) -> bool:
    """``node``'s expression, with the producers inductor inlines into it, computes one of
    :data:`_HEAVY_ON_CPU` (within a walk, found producers first, as :func:`_own_reads_first`
    finds their reads, so no recursion runs down a chain)."""
    return _seen_or_found(8, node, lambda: _name(node.target) in _HEAVY_ON_CPU or any(
        (producer := _walked_producer(inp)) is not None and _inlined_producer(producer) and _heavy_expression(producer)
        for inp in node.all_input_nodes))


def _own_reads_first(node: fx.Node, known: dict) -> None:
    """Find the own stored reads (at :data:`_OWN_DEPTH`) of ``node`` and of the producers a walk
    from it may look into, producers first, with a stack: each then finds its producers' counts
    found, and no recursion runs as deep as a chain of producers (a residual stream is as deep
    as the model)."""
    order, visited, stack = [], set(), [(node, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in visited or (n, _OWN_DEPTH) in known:
            continue
        visited.add(n)
        stack.append((n, True))
        for inp in n.all_input_nodes:
            producer = _walked_producer(inp)
            if producer is not None and producer not in visited:
                stack.append((producer, False))
    for n in order:
        if (n, _OWN_DEPTH) not in known:
            known[(n, _OWN_DEPTH)] = _find_leaf_reads(n, _OWN_DEPTH)
        if _on_cpu(n):  # found producers first too: an expression walks its producers'
            _heavy_expression(n)
            _heavy_reuse_on_cpu(n)


def _find_leaf_reads(node: fx.Node, depth: int) -> frozenset[fx.Node]:
    return frozenset(_leaf_reads_stopped_at(node, None, depth))


def reads_nothing(node: fx.Node) -> bool:
    """``node`` is computed from constants alone (``iota``, ``full``...) through pointwise ops,
    casts, views and loads at computed indices (``index``, ``gather``): inductor computes it in
    every kernel that reads it, and it loads no stored input there, however many ops it takes.

    transformers builds its causal masks so: positions from ``iota``, compared, and-ed with a
    padding mask indexed out of a ``full`` of ones. On an H200, Bloom's recomputed softmax (a
    float32 expression of the scores, the mask and the row max and sum) was counted as reading
    six stored inputs, so as stored for its two readers: 512 MiB a layer at batch 8 that inductor
    never allocated (budget 0: 1570 MiB predicted, 1104 measured)."""
    return _seen_or_found(4, node, lambda: _reads_nothing(node))


def _reads_nothing(node: fx.Node) -> bool:
    # walked with a stack, not recursion: a residual stream is a pointwise chain as deep as the
    # model (a 96-layer GPT's ran past Python's recursion limit)
    maps = getattr(_seen, "maps", None)
    known = maps[4] if maps is not None else {}
    stack, seen = [node], {node}
    while stack:
        n = stack.pop()
        if n is not node and n in known:
            if not known[n]:
                return False
            continue
        if n.op != "call_function" or not isinstance(n.meta.get("val"), torch.Tensor):
            return False
        if n.target in _CONSTANTS:
            continue
        computed = fusible(n) or _shared_input(n) is not None  # fusible: the loads at computed indices too
        if not computed or _name(n.target) in _RANDOM_PRIMS:
            return False
        for inp in n.all_input_nodes:
            if inp not in seen:
                seen.add(inp)
                stack.append(inp)
    return True


def not_written_in_place(writer: fx.Node, depth: int = 12) -> frozenset[fx.Node]:
    """The stored inputs (their :func:`storage_root`) that the kernel computing ``writer`` reads
    but cannot write ``writer`` into, though one may be of its size and read last there: inputs
    of another dtype, and inputs the kernel reads at another index than the one it writes.

    Inductor writes a kernel's output into an input it owns, of the same dtype and storage size,
    that no later kernel reads (its ``decide_inplace_update``), only where every access to that
    input inside the fused kernel is the output's own index: the output's read of it, and the
    reads of the reductions fused with it (their loops normalised, a reduction over a dense
    input's trailing dimensions reads it at the output's index; one over other dims, a batch
    norm's channel sums, runs in a kernel of its own, so reductions are not looked into). So a
    softmax, over rows of any length, writes its probabilities into the scores it reads, and its
    gradient into the probabilities, and a batch norm's gradient is written into the
    convolution's output it reads; a copy of a transposed product's output is not written into
    it.

    Measured by the planner's own graphs compiled on an H200 (torch 2.11), inductor's writes in
    place read back from its scheduler: at budget 0 on CodeGen, GPT-Neo, MPT, and GPT-NeoX, its
    looped softmax kernels (rows of 1024 and 2048) and a cross entropy's gradient (rows of 8192)
    wrote in place, 256 MiB a layer at batch 1 on CodeGen, where the model had counted a buffer
    beside each (a rule that no kernel fused with a looped reduction writes into what it reads),
    and the copies of transposed ``bmm`` outputs did not, where the model had written them in.
    """
    return _seen_or_found(5, (writer, depth), lambda: _not_written_in_place(writer, depth))


def _not_written_in_place(writer: fx.Node, depth: int) -> frozenset[fx.Node]:
    val = writer.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return frozenset()
    same, other = _indexed_reads(writer, depth)
    return frozenset(other | {root for root in same if _dtype(root) != val.dtype})


def _indexed_reads(writer: fx.Node, depth: int) -> tuple[set[fx.Node], set[fx.Node]]:
    """The stored inputs ``writer``'s kernel reads at the index it writes, and those it reads
    (also) at another, looking through views and inlined pointwise producers (as
    :func:`_leaf_reads` does)."""
    if getattr(_seen, "layout", None) is not None:
        return _indexed_reads_laid_out(writer, depth)
    same: set[fx.Node] = set()
    other: set[fx.Node] = set()
    seen: set[tuple] = set()
    stack = [(inp, writer, True, 0) for inp in writer.all_input_nodes]  # the writer's value is at its index
    while stack:
        node, consumer, at_index, d = stack.pop()
        at_index = _read_at_index(node, consumer, at_index)
        if (node, at_index) in seen:
            continue
        seen.add((node, at_index))
        if (base := _shared_input(node)) is not None:  # a view: its base is read through it
            stack.append((base, node, at_index, d))
        elif reads_nothing(node):
            continue
        elif d < depth and _inlined_producer(node):  # not a reduction (see not_written_in_place)
            stack.extend((inp, node, at_index, d + 1) for inp in node.all_input_nodes)
        else:
            (same if at_index else other).add(node)
    return same - other, other


def _indexed_reads_laid_out(writer: fx.Node, depth: int) -> tuple[set[fx.Node], set[fx.Node]]:
    """:func:`_indexed_reads` with values laid out as inductor lays them out (:func:`laid_out`).
    Each value met carries where the writer stores each of its elements (strides into the
    writer's storage, None where it is not one element each); a stored input is read at the
    writer's index where it is laid out so."""
    same: set[fx.Node] = set()
    other: set[fx.Node] = set()
    seen: set[tuple] = set()
    written = laid_out(writer)
    stack = [(inp, _elementwise(inp, written), 0) for inp in writer.all_input_nodes]
    while stack:
        node, where, d = stack.pop()
        key = (node, None if where is None else (tuple(where.shape), tuple(where.stride())))
        if key in seen:
            continue
        seen.add(key)
        if (base := _shared_input(node)) is not None:  # a view: its base is read through it
            stack.append((base, _unviewed(node, base, where), d))
        elif reads_nothing(node):
            continue
        elif d < depth and _inlined_producer(node):  # not a reduction (see not_written_in_place)
            stack.extend((inp, _elementwise(inp, where), d + 1) for inp in node.all_input_nodes)
        else:
            laid = laid_out(node)
            at_index = (where is not None and laid is not None and laid.storage_offset() == 0
                        and tuple(laid.shape) == tuple(where.shape) and _same_layout(laid, where))
            (same if at_index else other).add(node)
    return same - other, other


def _elementwise(node: fx.Node, where: torch.Tensor | None) -> torch.Tensor | None:
    """Where a pointwise reader of ``node`` stores each element of it: ``where`` (its own) if
    the two are shaped alike, else None (broadcast)."""
    val = node.meta.get("val")
    if where is None or not isinstance(val, torch.Tensor) or tuple(val.shape) != tuple(where.shape):
        return None
    return where


def _unviewed(view: fx.Node, base: fx.Node, where: torch.Tensor | None) -> torch.Tensor | None:
    """``where`` (for ``view``'s elements) carried back to ``base``'s: through a permute or a
    reshape, or a write in place; None for any other view (a slice, a broadcast)."""
    val = base.meta.get("val")
    if where is None or not isinstance(val, torch.Tensor):
        return None
    if aliased_input(view) is not base:  # written in place, or laid out as traced: the same elements
        return where if tuple(val.shape) == tuple(where.shape) else None
    name = _name(view.target)
    try:
        if name == "aten.permute.default":
            dims = [k % where.dim() for k in view.args[1]]
            inverse = [dims.index(k) for k in range(len(dims))]
            return where.permute(inverse)
        if name in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
                    "aten.alias.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.unsqueeze.default",
                    "aten.squeeze.default"):
            return where.view(tuple(val.shape))
        if name in ("aten.t.default", "aten.transpose.int"):
            dims = (0, 1) if name == "aten.t.default" else view.args[1:3]
            return where.transpose(*dims)
    except Exception:  # noqa: BLE001  (no such view of those strides: not element for element)
        return None
    return None


def _read_at_index(node: fx.Node, consumer: fx.Node, consumer_at_index: bool) -> bool:
    """Whether ``consumer``'s kernel reads ``node`` at the writer's (linear) index, given whether
    ``consumer``'s own value is at it (the traced layouts)."""
    val, out = node.meta.get("val"), consumer.meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    return consumer_at_index and val.numel() == out.numel() and _same_layout(val, out)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Element k of ``a``'s storage is element k of ``b``'s (same shape and strides, or both
    contiguous: a reshape)."""
    if a.is_contiguous() and b.is_contiguous():
        return True
    return (tuple(a.shape) == tuple(b.shape)
            and all(sa == sb for size, sa, sb in zip(a.shape, a.stride(), b.stride()) if size != 1))


@contextmanager
def _laid_out_channels_last(on: bool, carried: dict[str, tuple] | None = None,
                            preferred: Collection[fx.Node] | None = None,
                            joint_forward: Collection[fx.Node] | None = None):
    """Within a walk: inductor's layout optimisation is ``on`` for the graphs walked; the values
    named in ``carried`` (a backward module's inputs, by name) were stored by the forward with
    the strides given; where ``preferred`` is given, the graph walked is a forward whose outputs
    inductor stores channels-last where they are among these (:func:`_stored_output`); where
    ``joint_forward`` is given, the graph walked is a joint one, whose forward (these nodes) and
    backward inductor compiles apart."""
    outer = getattr(_seen, "layout", None), getattr(_seen, "preferred", None), getattr(_seen, "joint_forward", None)
    _seen.layout = dict(carried or {}) if on else None  # None: the traced layouts
    _seen.preferred = frozenset(preferred) if on and preferred is not None else None
    _seen.joint_forward = frozenset(joint_forward) if on and joint_forward is not None else None
    try:
        yield
    finally:
        _seen.layout, _seen.preferred, _seen.joint_forward = outer


def _copied_output(node: fx.Node) -> bool:
    """A forward's output ``node`` (within a walk with ``preferred``) is a view that inductor
    copies to store it with :func:`_stored_output`'s strides, which its base's layout does not
    give it (``GraphLowering.run_node``'s ``require_stride_order`` on an output). On the CPU, a
    transposed attention output saved for the backward was stored channels-last, (4, 4, 16, 256)
    with strides (16384, 1, 1024, 4), in a buffer of its own beside the attention's output. On
    an H200 (torch 2.11), CoAtNet's attention output, a library kernel's, was stored
    channels-last as it was lowered, and the projection's input, its view saved for the
    backward, became a copy of its own (one 9.2 MiB buffer a layer, 4.8% of the budget-0 peak
    the model had missed)."""
    if getattr(_seen, "preferred", None) is None or aliased_input(node) is None:
        return False
    val, laid = node.meta.get("val"), laid_out(node)
    if not isinstance(val, torch.Tensor):
        return False
    if laid is None:
        return _unviewable(node)
    return not _same_layout(laid, _restrided(val, _stored_output(node)))


def copied_views(forward: fx.GraphModule, num_fwd_outputs: int) -> frozenset[str]:
    """Names of the views among ``forward``'s saved values that inductor stores as copies of
    their own (:func:`_copied_output`), under its layout optimisation; none without it.
    On an H200 (torch 2.11), InceptionNeXt's channel split of a block's input, which the input
    was saved beside, went to the backward as four dense copies, the input being stored
    channels-last and each part's traced strides those of a contiguous tensor's (50 MiB over the
    simulated budget-0 peak, counted as views)."""
    nodes = list(forward.graph.nodes)
    if not convolutions_laid_out(nodes):
        return frozenset()
    from planner._torch_compat import inductor_prefers_channels_last

    saved = _outputs(forward)[num_fwd_outputs:]
    with _graphs_unchanged(), _laid_out_channels_last(True, preferred=inductor_prefers_channels_last(forward.graph)):
        return frozenset(out.name for out in saved if _copied_output(out))


def backward_propagated(forward: fx.GraphModule, backward: fx.GraphModule, num_fwd_outputs: int,
                        nodes: Collection[fx.Node]) -> dict[fx.Node, torch.Tensor | None]:
    """The values of ``nodes`` (of ``backward``) as inductor's fake-tensor propagation gives them
    (:func:`_propagated`) where the forward is laid out channels-last: the forward's saved values
    stored as inductor stores them (:func:`_stored_output`), each op by its own stride rules."""
    from planner._torch_compat import inductor_prefers_channels_last

    outer = getattr(_seen, "maps", None)
    _seen.maps = _empty_maps()  # fresh tables: the caller changes the graphs after
    try:
        strides = _carried_strides(_outputs(forward)[num_fwd_outputs:], backward,
                                   inductor_prefers_channels_last(forward.graph))
        with _laid_out_channels_last(True, strides):
            return {node: _propagated(node) for node in nodes}
    finally:
        _seen.maps = outer


def _saved_inputs(backward: fx.GraphModule) -> list[fx.Node]:
    """``backward``'s inputs that the forward's saved values feed, in order (not the tangents)."""
    return [p for p in backward.graph.find_nodes(op="placeholder") if not str(p.target).startswith("tangents")]


def _carried_strides(saved: list, backward: fx.GraphModule, preferred: Collection[fx.Node] | None) -> dict[str, tuple]:
    """By name, each input of ``backward`` fed by a tensor among the forward's ``saved`` values,
    with the strides the forward stores that value in (:func:`_stored_output`: under the layout
    optimisation where ``preferred`` is given, else as traced)."""
    with _laid_out_channels_last(preferred is not None, preferred=preferred):
        stored = {out: _stored_output(out) for out in saved if isinstance(out.meta.get("val"), torch.Tensor)}
    return {p.name: stored[out] for p, out in zip(_saved_inputs(backward), saved) if out in stored}


def _unviewable(node: fx.Node) -> bool:
    """View ``node`` is one its base's layout does not allow, where that layout is known."""
    return laid_out(node) is None and laid_out(aliased_input(node)) is not None


def _library_reader(reader: fx.Node) -> bool:
    """``reader`` is a kernel inductor does not generate code for (a library kernel, a matrix
    product), which reads its inputs wherever they are stored."""
    return reader.op == "call_function" and not fuses_producers(reader) and _name(reader.target) not in _RANDOM_PRIMS


def _copied_view(node: fx.Node) -> bool:
    """View ``node`` is a buffer of its own (within a walk with layouts known): its base's
    layout does not give it (:func:`laid_out` is None, its base's known), and a kernel that
    inductor does not generate reads it, for which inductor copies it
    (``ExternKernel.realize_input``: ``convert_to_reinterpret_view`` fails, ``copy_input``);
    one copy serves all its readers. On an H200, ConvNeXt-V2's residual gradient, fixed
    contiguous, was copied for the matrix products of the block below reading it through a
    permute and a reshape, (200704, 96) alive from the first product to the weight gradient's
    (36.8 MiB over the simulated peak at budget 0)."""
    if getattr(_seen, "layout", None) is None or aliased_input(node) is None or is_getitem(node):
        return False
    return _unviewable(node) and any(_library_reader(reader) for reader in readers(node))


def _stored_output(node: fx.Node) -> tuple[int, ...]:
    """The strides a forward (within a walk with ``preferred``) stores its output ``node`` with:
    channels-last where it is 4-D, dense and among the nodes inductor prefers channels-last
    (downstream of a convolution, up to the last one, or upstream of one:
    ``GraphLowering.find_nodes_prefer_channels_last``), whatever the value means; else as
    traced (``GraphLowering.run_node`` for a graph's outputs)."""
    val = node.meta["val"]
    if (val.dim() == 4 and node in (_seen.preferred or ())
            and _dense_strides(val) == tuple(val.stride())):
        return _channels_last_strides(val.shape)
    return tuple(val.stride())


def laid_out(node: fx.Node) -> torch.Tensor | None:
    """``node``'s value (a meta tensor) in the layout inductor stores or views it in, or None
    where that is not known.

    Inductor's layout optimisation (on for a graph with convolutions, :func:`convolutions_laid_out`)
    copies a convolution's input and weight channels-last, and a convolution's outputs and its
    backward's are laid out as the op's fake implementation lays them out from its inputs so
    laid out (channels-last where the trace has them contiguous). A stored pointwise
    value takes the layout most of its inputs of its size are read in (its fill order, from the
    strides of its loads; contiguous on a tie). A view's layout follows its base's. Outside such
    a walk, the trace's.
    On an H200, a ConvNeXt-V2 backward's residual gradient (the sum of a depthwise convolution's
    input gradient, channels-last, and of the gradient from the layer above, contiguous) was
    stored contiguous in a buffer of its own: counted written into the convolution's gradient,
    the simulated peak was 36.8 MiB under the measured one."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    if getattr(_seen, "layout", None) is None:
        return val
    return _seen_or_found(6, node, lambda: _laid_out(node, val))


def _laid_out(node: fx.Node, val: torch.Tensor):
    base = aliased_input(node)
    if base is not None:
        return _viewed(node, base, val)
    if (getattr(_seen, "preferred", None) is not None and node.op == "call_function"
            and node in _graph_outputs(node.graph)):  # stored as it is lowered: later readers read that
        return _restrided(val, _stored_output(node))
    if node.target in CONVOLUTIONS:
        return _convolved(node, 0)
    if is_getitem(node) and getattr(node.args[0], "target", None) in CONVOLUTIONS:
        return _convolved(node.args[0], node.args[1])
    if node.op == "placeholder" and node.name in _seen.layout:  # stored by the forward
        strides = _seen.layout[node.name]
        return val if strides == tuple(val.stride()) else _restrided(val, strides)
    if val.dim() == 4 and node.op == "call_function" and fusible(node) and (fixed := _fixed_layout(node, val)) is not None:
        return fixed
    if val.dim() == 4 and not val.is_contiguous(memory_format=torch.channels_last) and _stored_channels_last(node):
        return _restrided(val, _channels_last_strides(val.shape))
    return val


# readers that, among several, fix a value's layout to its propagated strides' order as it is
# lowered (inductor's GraphLowering.run_node)
_FIXING_READERS = (torch.ops.aten.mm.default, torch.ops.aten.convolution_backward.default,
                   torch.ops.aten._int_mm.default)


def _fixed_layout(node: fx.Node, val: torch.Tensor) -> torch.Tensor | None:
    """The layout inductor fixes pointwise ``node``'s buffer in before it could choose one by its
    loads, or None where nothing fixes it (a forward's output is fixed before, as it is stored:
    :func:`_laid_out`). In inductor's order: among several readers, an ``mm`` or a convolution backward
    fixes it in the order of its propagated strides (:func:`_propagated`) as ``node`` is lowered;
    then, in a graph compiled on its own, a value several readers read and that reads more than
    ``REALIZE_READS`` stored inputs is stored on reuse, channels-last where it is dense and
    among the nodes inductor prefers channels-last in that graph
    (``GraphLowering.run_node``'s ``maybe_apply_channels_last_stride_order``);
    else the first reader in graph order that inductor does not generate code for (a library
    kernel, a matrix product) fixes it:
    - through a view, channels-last only where the propagated strides are
      (``ExternKernel.convert_to_reinterpret_view``);
    - reading ``node`` itself, a convolution channels-last; a convolution backward its gradient
      channels-last too, where inductor lowers it itself (torch 2.13's lowering requires it so
      for a 2-D convolution under the layout optimisation, whatever the input's layout); an op
      with a layout constraint in the propagated order; any other contiguous
      (``ExternKernel.process_kernel``).
    On an H200 (torch 2.11), a ConvNeXt-V2 backward's residual gradient, the sum of two
    channels-last values read by the next ``mm`` through a permute and a reshape, was stored
    contiguous in a buffer of its own, its propagated strides being neither contiguous nor
    channels-last, where the memory model had written it in place of one of them (36.8 MiB over
    the simulated peak at budget 0). On the CPU (torch 2.13) these rules make the model's writes
    in place those of inductor's code on a ConvNeXt-like block; on the H200 they are not yet
    measured."""
    propagated = _propagated(node)
    forward = getattr(_seen, "joint_forward", None)  # a joint graph: only readers compiled with node
    lowered_with = (lambda reader: True) if forward is None else (lambda reader: (reader in forward) == (node in forward))
    users = [user for user in node.users if lowered_with(user)]
    if len(users) > 1 and any(user.target in _FIXING_READERS for user in users):
        return _restrided(val, _dense_strides(propagated))
    from planner._torch_compat import (inductor_fixes_layout, inductor_lays_out_convolution_gradient,
                                       inductor_prefers_channels_last)

    if (forward is None and len(node.users) > 1 and _dense_strides(propagated) == tuple(propagated.stride())
            and node not in _graph_outputs(node.graph) and stored_on_reuse(node)
            and node in _seen_or_found(6, (node.graph, "preferred"), lambda: inductor_prefers_channels_last(node.graph))):
        return _restrided(val, _channels_last_strides(val.shape))  # stored on reuse, in a graph it is lowered apart

    order = _graph_order(node.graph)
    for reader in sorted(filter(lowered_with, readers(node)), key=order.__getitem__):
        if not _library_reader(reader):
            continue  # generated code: reads the value wherever it is laid out
        if reader not in node.users:  # through a view
            channels_last = _channels_last_4d(propagated)
        elif reader.target is torch.ops.aten.convolution.default and node in reader.args[:2]:
            channels_last = True
        elif (reader.target is torch.ops.aten.convolution_backward.default and node is reader.args[0]
              and inductor_lays_out_convolution_gradient()):  # required channels-last for a 2-D convolution
            channels_last = True
        elif inductor_fixes_layout(reader.target):  # its constraint: the propagated order
            return _restrided(val, _dense_strides(propagated))
        else:
            channels_last = False
        return _restrided(val, _channels_last_strides(val.shape) if channels_last else _contiguous_strides(val.shape))
    return None


def _graph_outputs(graph: fx.Graph) -> frozenset[fx.Node]:
    return _seen_or_found(6, (graph, "outputs"), lambda: frozenset(
        a for out in graph.find_nodes(op="output") for a in out.all_input_nodes))


def _graph_order(graph: fx.Graph) -> dict[fx.Node, int]:
    return _seen_or_found(6, (graph, "order"), lambda: {n: k for k, n in enumerate(graph.nodes)})


def _dense_strides(val: torch.Tensor) -> tuple[int, ...]:
    """Dense strides in the order of ``val``'s."""
    meta = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device="meta")
    return tuple(torch.empty_like(meta).stride())


def _contiguous_strides(shape) -> tuple[int, ...]:
    return torch.empty(tuple(shape), device="meta").stride()


def _propagated(node: fx.Node) -> torch.Tensor | None:
    """``node``'s value as inductor's fake-tensor propagation over its graph gives it before
    lowering (``compile_fx``'s ``fake_tensor_prop``): from the graph's inputs as stored (their
    :func:`laid_out`, the forward's outputs for a backward), each op by its own stride rules.
    These are the strides inductor reads where it fixes a layout (:func:`_fixed_layout`). The
    trace's where no input of the walked graph is stored otherwise than traced."""
    val = node.meta.get("val")
    if not getattr(_seen, "layout", None):  # no carried names: the graph's inputs are as traced
        return val
    found = _seen_or_found(6, (node.graph, "propagated"), lambda: _propagate(node.graph))
    return found.get(node, val)


def _propagate(graph: fx.Graph) -> dict[fx.Node, object]:
    """:func:`_propagated` for every node of ``graph`` whose value differs from the trace's
    (those downstream of an input laid out otherwise); a node whose inputs are all as traced
    keeps its traced value, and one whose op cannot be replayed on fake tensors too."""
    env: dict[fx.Node, object] = {}
    for node in graph.nodes:
        if node.op == "placeholder":
            laid = laid_out(node)
            if laid is not None and laid is not node.meta.get("val"):
                env[node] = laid
            continue
        if (node.op != "call_function" or not any(inp in env for inp in node.all_input_nodes)
                or getattr(getattr(node.target, "_schema", None), "is_mutable", False)):
            continue
        if is_getitem(node):
            outs = env.get(node.args[0])
            if isinstance(outs, (tuple, list)) and node.args[1] < len(outs):
                env[node] = outs[node.args[1]]
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: env.get(a, a.meta.get("val")))
        mode = next((val.fake_mode for inp in node.all_input_nodes
                     if isinstance(val := env.get(inp, inp.meta.get("val")), torch._subclasses.FakeTensor)), None)
        if mode is None:
            continue
        try:
            with mode:
                out = node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001  (kept as traced)
            continue
        if not _strided_alike(out, node.meta.get("val")):
            env[node] = out
    return env


def _strided_alike(a: object, b: object) -> bool:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_strided_alike(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return tuple(a.shape) == tuple(b.shape) and tuple(a.stride()) == tuple(b.stride())
    return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor)


def _viewed(node: fx.Node, base: fx.Node, val: torch.Tensor) -> torch.Tensor | None:
    """``node``'s view of ``base`` replayed on ``base`` as laid out, or None if it cannot be; a
    getitem's, one of the views its view op (``split``, ``unbind``) makes."""
    base_val, laid = base.meta.get("val"), laid_out(base)
    if laid is None:
        return None
    if laid is base_val:
        return val
    view = node.args[0] if is_getitem(node) else node
    args = [laid if a is base else a.meta.get("val") if isinstance(a, fx.Node) else a for a in view.args]
    try:
        out = view.target(*args, **view.kwargs)
        out = out[node.args[1]] if view is not node else out
    except Exception:  # noqa: BLE001  a view the layout does not allow (inductor copies): unknown
        return None
    return out if isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(val.shape) else None


def _channels_last_4d(val: torch.Tensor | None) -> bool:
    return (val is not None and val.dim() == 4 and val.is_contiguous(memory_format=torch.channels_last)
            and not val.is_contiguous())


def _channels_last_strides(shape) -> tuple[int, ...]:
    return torch.empty(tuple(shape), device="meta").contiguous(memory_format=torch.channels_last).stride()


def _convolved(conv: fx.Node, output: int) -> torch.Tensor | None:
    """Output ``output`` of convolution (or its backward) ``conv`` laid out as the op's fake
    implementation lays it out, run on its inputs as inductor lays them out (a convolution's
    input and weight copied channels-last), as inductor itself lays out a library kernel's
    outputs; as traced where that cannot be replayed."""
    def replay():
        forward = conv.target is torch.ops.aten.convolution.default
        args = []
        for k, arg in enumerate(conv.args):
            val = arg.meta.get("val") if isinstance(arg, fx.Node) else arg
            if isinstance(arg, fx.Node) and isinstance(val, torch.Tensor):
                if forward and k < 2 and val.dim() == 4:
                    val = _restrided(val, _channels_last_strides(val.shape))
                elif (laid := laid_out(arg)) is not None:
                    val = laid
            args.append(val)
        mode = next((a.fake_mode for a in args if isinstance(a, torch._subclasses.FakeTensor)), None)
        traced = conv.meta.get("val")
        if mode is None or not all(isinstance(a, torch._subclasses.FakeTensor) or not isinstance(a, torch.Tensor)
                                   for a in args):
            out = traced
        else:
            try:
                with mode:
                    out = conv.target(*args, **conv.kwargs)
            except Exception:  # noqa: BLE001  (kept as traced)
                out = traced
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    outputs = _seen_or_found(6, (conv, "outputs"), replay)
    val = outputs[output] if output < len(outputs) else None
    return val if isinstance(val, torch.Tensor) else None


def _restrided(val: torch.Tensor, strides) -> torch.Tensor:
    """A tensor like ``val`` (a fake one, on its device, where ``val`` is) with ``strides``."""
    mode = getattr(val, "fake_mode", None)
    if mode is None:
        return torch.empty_strided(val.shape, strides, dtype=val.dtype, device="meta")
    with mode:
        return torch.empty_strided(val.shape, strides, dtype=val.dtype, device=val.device)


def _stored_channels_last(node: fx.Node) -> bool:
    """Inductor stores 4-D ``node`` channels-last (see :func:`laid_out`; within a walk with the
    layout optimisation on)."""
    if not fusible(node):  # a placeholder too: :func:`_laid_out` reads the carried strides
        return False
    votes = 0
    for read in _loads(node):
        if read is not None and tuple(read.shape) == tuple(node.meta["val"].shape):
            votes += 1 if _channels_last_4d(read) else -1 if read.is_contiguous() else 0
    return votes > 0


def _loads(writer: fx.Node, depth: int = _OWN_DEPTH) -> list[torch.Tensor | None]:
    """The stored values ``writer``'s kernel loads, laid out (:func:`laid_out`) as it reads them:
    through views, and through the inlined pointwise producers it computes itself."""
    found: list[torch.Tensor | None] = []
    seen: set[fx.Node] = set()
    stack = [(inp, 0) for inp in writer.all_input_nodes]
    while stack:
        node, d = stack.pop()
        if node in seen or reads_nothing(node):
            continue
        seen.add(node)
        if _shared_input(node) is None and d < depth and _inlined_producer(node):
            stack.extend((inp, d + 1) for inp in node.all_input_nodes)
        else:
            found.append(laid_out(node))
    return found


def _dtype(node: fx.Node) -> torch.dtype | None:
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def is_reduction(node: fx.Node) -> bool:
    """``node`` is an ATen reduction (``sum``, ``mean``, ``var_mean``...): inductor generates
    its kernel, a kernel of its own unless it is fused into its one pointwise reader."""
    return torch.Tag.reduction in _tags(node)


def _tags(node: fx.Node) -> list:
    target = node.target
    return target.tags if isinstance(target, torch._ops.OpOverload) else []


def fusible(node: fx.Node) -> bool:
    """A pointwise op, a cast, a constant factory (``iota``, ``full``, ``scalar_tensor``...), or a
    load at computed indices (``gather``, ``embedding``, ``index``: :data:`_LOADS`): inductor
    generates its code inside fused kernels (a constant reads no memory there; a load reads its
    operand through the indices where its reader needs it). Inductor lowers each load to a
    pointwise node (``Pointwise.create``), so it is stored only by the rules every pointwise value
    follows: on an H100, SegFormer's bilinear upsampling of its logits (four ``_unsafe_index``
    loads of the 128 x 128 logits, 16 x 150 x 512 x 512 each in float32) was counted stored,
    2.3 GiB each, where inductor computes the loads in the kernel that interpolates between them
    (budget 1.0 predicted 11.806 GiB against 5.655 measured)."""
    return _fusible_target(node.target)


@lru_cache(maxsize=None)
def _fusible_target(target: object) -> bool:
    tags = target.tags if isinstance(target, torch._ops.OpOverload) else []
    return (torch.Tag.pointwise in tags or target in _CASTS or target in _CONSTANTS or target in _LOADS
            or str(target) in _LOWERED_POINTWISE)


def constant_inlined(node: fx.Node) -> bool:
    """A constant (``iota``, ``full``, ``scalar_tensor``...) that inductor computes inside every
    kernel reading it, forward and backward, so it is never stored."""
    return node.target in _CONSTANTS and _inlined(node, readers(node))


def generated(node: fx.Node) -> bool:
    """A pointwise op, a cast, a reduction, or an ATen factory (``iota``, ``full``,
    ``scalar_tensor``: no tensor inputs): inductor generates its kernel code, and can compute
    a fused producer inside it."""
    return fusible(node) or is_reduction(node) or _factory(node)


def library_kernel(target: object, fuse: bool = True) -> bool:
    """An ATen op with tensor inputs that runs as a library kernel, which may hold scratch memory
    while it runs: with ``fuse`` (inductor), one inductor does not generate code for (not
    :func:`fusible`, a reduction, an indexing op or a prim, which inductor lowers itself, its
    random and pooling prims among them, nor another op its lowerings generate:
    :func:`planner._torch_compat.inductor_calls_library`); without, any op but a pointwise one or
    a cast (eager runs each ATen kernel as it is)."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace == "prims" or _fusible_target(target):
        return False
    if not fuse:
        return True
    from planner._torch_compat import inductor_calls_library

    return torch.Tag.reduction not in target.tags and target not in _INDEXING and inductor_calls_library(target)


def fuses_producers(node: fx.Node) -> bool:
    """Inductor can compute a pointwise producer inside ``node``'s kernel: ``node`` is
    :func:`generated`, an indexing op (``gather``, ``embedding``, ``index``, the scatters, a
    slice or select scattered into a base: ``_VIEW_SCATTERS``) that inductor lowers to a kernel
    loading its operands through computed indices, or a
    concatenation: on a GPU inductor lowers a ``cat`` to one pointwise kernel that computes its
    inputs where it reads them, on the CPU to a buffer each pointwise input is computed into, in
    its slice. A fused gate-and-up projection's backward concatenates the two halves' gradients,
    each a pointwise expression of the projection and the gradient: on an H100, Mixtral's
    experts computed both halves in the kernel writing the concatenation, where the memory
    model had stored each half first (24 MiB each; budget 0 measured 0.337 GiB against 0.319
    predicted, and 0.340 against 0.338 once the halves were fused)."""
    return (generated(node) or node.target in _INDEXING or node.target is torch.ops.aten.cat.default
            or node.target in _VIEW_SCATTERS or scatters_values(node))


def scatters_values(node: fx.Node) -> bool:
    """``node`` is an ``index_put`` inductor lowers to its scatter kernel, which computes the
    values' pointwise expression where it stores them (:func:`planner._torch_compat.inductor_scatters_index_put`;
    boolean indices fall back to ATen's kernel, which reads them stored). Its base is copied into
    its own buffer first, by a kernel that computes a pointwise base (the zeros of a gather's or an
    upsampling's backward) where it writes it. On an H100, SegFormer's bilinear upsampling
    backward scatters four weighted copies of the logits' gradient (16 x 150 x 512 x 512, float32)
    into the 128 x 128 logits' gradient; three were counted stored (2.3 GiB each)."""
    if node.target not in _INDEX_PUTS or not isinstance(node.meta.get("val"), torch.Tensor):
        return False
    at, masked = _INDEX_PUTS[node.target]
    indices = node.args[at] if len(node.args) > at else node.kwargs.get("indices", ())
    if any(isinstance(i, fx.Node) and getattr(i.meta.get("val"), "dtype", None) in (torch.bool, torch.uint8)
           for i in indices):
        return False
    accumulate = masked or (node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False))
    from planner._torch_compat import inductor_scatters_index_put

    return inductor_scatters_index_put(node.meta["val"].dtype, bool(accumulate))


def _factory(node: fx.Node) -> bool:
    target = node.target
    return (isinstance(target, torch._ops.OpOverload) and target.namespace in ("aten", "prims")
            and not any(isinstance(i.meta.get("val"), torch.Tensor) for i in node.all_input_nodes))


_CASTS = (torch.ops.prims.convert_element_type.default, torch.ops.aten._to_copy.default)
_CONSTANTS = (torch.ops.prims.iota.default, torch.ops.aten.scalar_tensor.default, torch.ops.aten.full.default,
              torch.ops.aten.zeros.default, torch.ops.aten.ones.default, torch.ops.aten.arange.default,
              torch.ops.aten.arange.start, torch.ops.aten.arange.start_step)
# Ops without ATen's pointwise tag that inductor lowers to pointwise code all the same: max
# pooling's offsets turned into int64 indices are computed from the int8 offsets inside the
# kernel that reads them, the scatter of max pooling's backward (PyTorch's partitioner recomputes
# them too). Counted as stored,
# a ResNet-50 plan saved the 8x larger indices (196 MiB at batch 128) instead of the offsets.
# (Named, not looked up: the prim is registered only once inductor is imported.)
_LOWERED_POINTWISE = frozenset({"prims._low_memory_max_pool_offsets_to_indices.default"})
# Scatters too: inductor's scatter kernel loads its index and source through their loaders, so
# a pointwise producer (max pooling's indices, scattered into by its backward) is computed there.
_RNG_WRAPPERS = frozenset({"run_with_rng_state", "run_and_save_rng_state"})  # planner._torch_compat's RNG ops
CONVOLUTIONS = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)
# indexing ops inductor lowers to pointwise loads at computed indices (the scatters below write a buffer)
_LOADS = (torch.ops.aten.gather.default, torch.ops.aten.embedding.default, torch.ops.aten.index.Tensor,
          torch.ops.aten._unsafe_index.Tensor,
          *((torch.ops.aten._unsafe_masked_index.default,) if hasattr(torch.ops.aten, "_unsafe_masked_index") else ()))
_INDEXING = (*_LOADS, torch.ops.aten.scatter_add.default, torch.ops.aten.scatter.src, torch.ops.aten.scatter.value)
# A slice or select scattered into a base: inductor lowers it to one kernel choosing, at each
# index, the source or the base, both loaded where they are read, so a pointwise base or source
# (the ``full`` of zeros a slice's backward scatters into) is computed there, never stored. On an
# H200, Llama's rotary backward scatters its query and key gradients into zeros (16 and 8 MiB a
# layer at batch 4), counted stored at the step's peak: budget 0 predicted 524.3 MiB, traced
# 484.3. The scatter's own output stays counted stored: taken for a pointwise value (fused into
# its readers), XLNet's budget-0 plan on an H200 measured 543.4 MiB against 435.4, inductor
# copying the scatter's output for each of the two batched products reading it (96 MiB each),
# copies the memory model does not count.
_VIEW_SCATTERS = (torch.ops.aten.slice_scatter.default, torch.ops.aten.select_scatter.default)
# index_put and its forms, each with the place of its indices and whether it is the masked put
# (which always accumulates; a torch 2.13 embedding's backward, on newer torch only)
_INDEX_PUTS = {torch.ops.aten.index_put.default: (1, False), torch.ops.aten._unsafe_index_put.default: (1, False),
               **({torch.ops.aten._unsafe_masked_index_put_accumulate.default: (2, True)}
                  if hasattr(torch.ops.aten, "_unsafe_masked_index_put_accumulate") else {})}


def convolutions_laid_out(nodes: list[fx.Node]) -> bool:
    """Inductor lays out the convolutions of a training forward of ``nodes`` channels-last (its
    layout optimisation, :func:`planner._torch_compat.inductor_layout_opt`); False without any."""
    if not any(n.target is torch.ops.aten.convolution.default for n in nodes):
        return False
    from planner._torch_compat import inductor_layout_opt

    return inductor_layout_opt(nodes)


def layout_copies(nodes: list[fx.Node]) -> dict[fx.Node, int]:
    """Graph inputs that inductor copies to channels-last before a training forward of ``nodes``
    (placeholders and ops) runs, with the copies' bytes: the 4-D inputs and weights of its
    convolutions that are not channels-last already, when its layout optimisation is on."""
    if not convolutions_laid_out(nodes):
        return {}
    convs = [n for n in nodes if n.target is torch.ops.aten.convolution.default]
    copies: dict[fx.Node, int] = {}
    for conv in convs:
        for arg in conv.args[:2]:
            val = arg.meta.get("val") if isinstance(arg, fx.Node) and arg.op == "placeholder" else None
            if isinstance(val, torch.Tensor) and val.dim() == 4 and not val.is_contiguous(memory_format=torch.channels_last):
                copies[arg] = storage_bytes(val)
    return copies


def simulate(forward: fx.GraphModule, backward: fx.GraphModule, num_fwd_outputs: int, fuse: bool = False,
             released: Collection[int] = (), stored: Mapping[tuple[str, str], int] | None = None) -> Timeline:
    """Walk the emitted modules in execution order and count the bytes alive after each node.

    The forward's outputs after the first ``num_fwd_outputs`` are the saved values, passed in
    order to the backward's non-tangent inputs; they live until their last reader there. The
    first ``num_fwd_outputs`` go to the caller, who keeps them through the backward, except those
    at the places ``released``: seen freed by the time the backward began (a graph's output that
    the next graph of the step consumed, a model's logits the training loop dropped). They are
    alive at the end of the forward, while later graphs of the step run.

    ``stored`` names values known to be stored, by (phase, node name), with their bytes, whatever
    the rules above say: what the code inductor wrote for the modules was seen to keep
    (:meth:`planner.compiler.PlannerBackend.compiled_step_peak`). Each is computed at its own
    place, where inductor lowers it.
    """
    with _graphs_unchanged():
        return _simulate(forward, backward, num_fwd_outputs, fuse, released, stored or {})


def _simulate(forward: fx.GraphModule, backward: fx.GraphModule, num_fwd_outputs: int, fuse: bool,
              released: Collection[int], stored: Mapping[tuple[str, str], int]) -> Timeline:
    walk = _Walk(fuse, stored)
    fwd_out = _outputs(forward)
    channels_last = fuse and convolutions_laid_out(list(forward.graph.nodes))
    from planner._torch_compat import inductor_prefers_channels_last

    preferred = inductor_prefers_channels_last(forward.graph) if channels_last else frozenset()
    with _laid_out_channels_last(channels_last, preferred=preferred):
        walk.run(forward, "forward", keep=fwd_out)
    forward_end = walk.total
    to_caller = _outputs(forward, raw=True)[:num_fwd_outputs]  # by place, as the caller gets them
    kept = [out for k, out in enumerate(to_caller) if k not in released and isinstance(out, fx.Node)]
    held = {key for out in kept for key in walk.keys.get(out, ())}
    # a saved value sharing a storage with an output the caller got is not donated to the backward
    # (AOTAutograd's donated buffers leave out aliases of user outputs), so no kernel writes into it
    walk.undonated = {key for out in to_caller if isinstance(out, fx.Node) for key in walk.keys.get(out, ())}
    saved_keys = [walk.keys.get(out, ()) for out in fwd_out[num_fwd_outputs:]]
    # nor are saved values sharing a storage with one another (a value and a view of it): the
    # backward's compile takes them out of the donated buffers (_torch_compat.undonate_aliased_inputs)
    shared = Counter(key for keys in saved_keys for key in set(keys))
    walk.undonated |= {key for key, count in shared.items() if count > 1}
    carried = dict(zip(_saved_inputs(backward), saved_keys))
    carried_strides = _carried_strides(fwd_out[num_fwd_outputs:], backward, preferred if channels_last else None)
    with _laid_out_channels_last(channels_last, carried_strides):
        walk.run(backward, "backward", keep=_outputs(backward), carried=carried, held=held)
    peak_live = walk.peak_live
    at_peak = tuple(sorted(((key[0], "/".join(map(str, key[1:])), walk.size[key]) for key in peak_live),
                           key=lambda item: -item[2]))
    saved_at_peak = tuple(out.name for out, keys in zip(fwd_out[num_fwd_outputs:], saved_keys)
                          if not peak_live.isdisjoint(keys))
    return Timeline(tuple(walk.steps), at_peak, saved_at_peak, forward_end, walk.kernels, walk.values,
                    frozenset(walk.in_place))


def stores_against_inductor(timeline: Timeline, kept: Mapping[str, tuple[Mapping[str, int], Collection[str]]],
                            graphs: Mapping[str, fx.Graph] | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """Where the code inductor wrote stores values otherwise than the simulation did.

    ``kept`` maps a phase compiled to what its code keeps
    (:func:`planner._torch_compat.kept_buffers`: each buffer's bytes and the nodes whose value
    it may hold, and the names lowered); a buffer holds the first of those the simulation has,
    as a value (stored or computed in its readers) or written in place of an input. A buffer
    holding a value written in place is no difference: inductor may write it in place too, or
    into the storage of an input it freed just before (its ``# reuse``).
    For each phase: ``"unmodelled"``, the values it keeps a buffer for that the simulation
    computes inside their readers (inductor's bytes), and ``"unstored"``, the values the
    simulation stores that no buffer of the code holds (the simulation's bytes), by name. Only
    values both know by name are compared (inductor's passes rename a few nodes). A buffer that
    holds a value the simulation computes in its readers and that names, among the nodes
    computed into it, one the simulation stores, of the buffer's bytes, that no buffer holds, is
    that stored value's storage under its later name, and no difference: on an H200, Cohere's
    and Nemotron's attention masks, stored by the simulation as the ``where`` that makes them and
    by inductor as the ``clone`` after it (one kernel), counted twice had raised the compiled
    prediction 5.6% and 12.8% over the plan's, where the measured peak was under it. With the
    phases' ``graphs``, the same holds where the buffer names no stored value but its value is
    computed, through views and pointwise ops of one input each, from one the simulation stores
    of the buffer's bytes that no buffer holds (:func:`_stored_source`): inductor's passes had
    renamed Llama's stored ``where``, so no buffer named it. A phase whose code could not be read
    has ``"error"`` instead, saying why."""
    found = {}
    for phase, report in kept.items():
        if isinstance(report, str):  # what the compile could not read, and why
            found[phase] = {"error": report}
            continue
        buffers, lowered = report
        own = {name: nbytes for (where, name), nbytes in timeline.stored.items() if where == phase}
        in_place = {name for where, name in timeline.written_in_place if where == phase}
        nodes = {node.name: node for node in graphs[phase].nodes} if graphs and phase in graphs else {}
        held = {}  # a buffer holds the value of the first node it names that the simulation has as a value
        named = []
        for nbytes, names in buffers:
            name = next((n for n in names if n in own or n in in_place or _several_outputs(nodes.get(n))), None)
            if name is not None and name not in in_place and name in own and nbytes:
                held[name] = held.get(name, 0) + nbytes
                named.append((name, nbytes, names))
        unmodelled = {name: nbytes for name, nbytes in held.items() if own[name] == 0}
        unstored = {name: nbytes for name, nbytes in own.items() if nbytes and name in lowered and name not in held}
        for name, nbytes, names in named:  # one storage, named by the later of two values computed into it
            if name not in unmodelled:
                continue
            twin = next((n for n in names if unstored.get(n) == nbytes), None)
            if twin is None and name in nodes:  # or by a value computed from one stored under a name the code lost
                source = _stored_source(nodes[name], own)
                twin = source if source is not None and source not in held and own[source] == nbytes else None
            if twin is not None:
                unstored.pop(twin, None)
                held[twin] = nbytes
                unmodelled[name] -= nbytes
                if unmodelled[name] <= 0:
                    del unmodelled[name]
        found[phase] = {"unmodelled": unmodelled, "unstored": unstored}
    return found


def _several_outputs(node: fx.Node | None) -> bool:
    """``node`` returns a tuple of tensors (fused attention, a convolution's backward):
    inductor's buffer for one of them names it first, then the nodes computed into its inputs,
    and holds that output, not any of theirs. On an H200, Llama's attention outputs and their
    gradients had been taken for the grouped keys' ``clone`` read by the attention, so that
    clone, computed inside the attention's copy of its inputs, was counted stored twice (32 MiB
    a layer, compiled prediction +8.3% over the traced peak where the plan's was +3.3%)."""
    return node is not None and isinstance(node.meta.get("val"), (tuple, list))


def _stored_source(node: fx.Node, stored: Mapping[str, int]) -> str | None:
    """The value the simulation stores (``stored``: bytes by name) that ``node``'s value is
    computed from alone, through views and pointwise ops of one tensor input each (a mask's
    ``where``, then its ``expand`` and ``clone``); None if it reads more than one value or none."""
    while (aliased_input(node) is not None or fusible(node)) and len(inputs := node.all_input_nodes) == 1:
        node = inputs[0]
        if stored.get(node.name):
            return node.name
    return None


def _outputs(gm: fx.GraphModule, raw: bool = False) -> list:
    """The module's output nodes (``raw``: every output in place, nodes or not)."""
    out = next(iter(gm.graph.find_nodes(op="output"))).args[0]
    items = list(out) if isinstance(out, (list, tuple)) else [out]
    return items if raw else [o for o in items if isinstance(o, fx.Node)]


def _tagged_backward(node: fx.Node) -> bool:
    return node.meta.get("partitioner_tag") == "is_backward"


def _fused_into_producer(node: fx.Node) -> bool:
    """A forward node that AOTAutograd placed after the loss (tagged backward, yet reading no
    tangent: ReLU's mask, a weight's transpose) and that inductor computes where its inputs are
    made: a pointwise op, fused into a kernel that reads the same inputs, or a view. PyTorch's
    partitioner leaves such a node where it was traced (the planner's own forward places it
    after its inputs: :class:`planner.graph.JointGraph`); counted there, its inputs stayed alive
    through the whole forward (T5 at batch 16, PyTorch's split on an H200: predicted 2.408 GiB,
    measured 2.244; inductor stored the masks with the kernels of their layers)."""
    return (_tagged_backward(node) and bool(node.all_input_nodes)
            and (fusible(node) or aliased_input(node) is not None))


class _Walk:
    """Storages alive across the forward and the backward module."""

    def __init__(self, fuse: bool, stored: Mapping[tuple[str, str], int] | None = None) -> None:
        self.fuse = fuse
        self.forced = dict(stored or {})  # (phase, name) -> bytes of values known to be stored
        self.size: dict[object, int] = {}
        self.live: set[object] = set()
        self.keys: dict[fx.Node, tuple] = {}
        self.steps: list[tuple[str, str, int]] = []
        self.copies: dict[fx.Node, int] = {}
        self.view_copies: set[fx.Node] = set()
        self.paths: dict[fx.Node, dict[tuple, object]] = {}  # tuple-valued nodes: index path -> storage
        self.total = 0  # bytes of the storages in ``live``
        self.clock = 0  # steps walked, both modules
        self.born: dict[object, int] = {}  # storage -> the first step it is alive at
        self.gone: dict[object, int] = {}  # storage -> the first step it is no longer alive at
        self.peak_step = -1
        self.peak = -1
        self.far: frozenset = frozenset()  # the phase's reductions stored, not fused (far_epilogues)
        self.tangents: set[object] = set()  # storages no kernel writes into (inputs it does not own)
        self.undonated: set[object] = set()  # saved storages the caller's outputs share (not donated)
        self.kernels = 0  # kernels of the modules walked (_kernels)
        self.values: dict[tuple[str, str], int] = {}  # (phase, name) -> own storage's bytes, 0 if fused
        self.in_place: set[tuple[str, str]] = set()  # (phase, name) of values written in an input's storage

    def run(self, gm: fx.GraphModule, phase: str, keep: list, carried: dict | None = None, held: set = frozenset()):
        carried = carried or {}
        nodes = [n for n in gm.graph.nodes if n.op != "output"]
        if self.fuse and phase == "forward":
            nodes = placed_order(nodes, {n for n in nodes if _fused_into_producer(n)})
        self.copies = layout_copies(nodes) if self.fuse and phase == "forward" else {}
        self.view_copies = ({out for out in keep if isinstance(out, fx.Node) and _copied_output(out)}
                              | {node for node in nodes if _copied_view(node)})
        self.far = far_epilogues(nodes, self.fuse) if phase == "backward" else frozenset()
        self.kernels += _kernels(nodes, self.fuse, self.far)
        keys: dict[fx.Node, tuple] = {}
        made: dict[fx.Node, tuple] = {}
        for node in nodes:
            keys[node], made[node] = self._keys(node, keys, phase, carried)
        last: dict[object, int] = {}
        kernel = kernel_steps(nodes, self.fuse, self.far, {n for n in nodes if (phase, n.name) in self.forced})
        for node in nodes:
            for inp in node.all_input_nodes:
                for key in keys[inp]:
                    last[key] = max(last.get(key, -1), kernel[node])
        kept = {key for out in keep for key in keys.get(out, ())} | set(held)
        if phase == "backward" and tangents_held_through_backward():  # until the backward returns
            kept |= self.tangents
        due: dict[int, list] = {}  # step -> storages not kept whose last reader runs then: freed after it
        for key in sorted(self.live, key=lambda key: (self.born[key], repr(key))):  # in a fixed order
            if key not in kept:
                due.setdefault(max(last.get(key, -1), 0), []).append(key)

        def arrive(key: object, k: int) -> None:
            if key not in self.live:
                self.live.add(key)
                self.total += self.size[key]
                self.born[key] = self.clock
                if key not in kept:
                    due.setdefault(max(last.get(key, -1), k), []).append(key)

        for k, node in enumerate(nodes):
            # (a value known to be stored has a buffer of its own: inductor wrote it in no input)
            if self.fuse and len(made[node]) == 1 and generated(node) and (phase, node.name) not in self.forced:
                for old in self._reused(made[node][0], k, last, node, keys, due.get(k, ())):
                    self._leave(old, self.clock)
                    self.values.pop((phase, node.name), None)  # written in place: no storage of its own
                    self.in_place.add((phase, node.name))
            copying = 0  # bytes alive once the copies of the library kernel's inputs are made
            if copies := input_copies(node, self.fuse, self.far):  # made for this kernel alone
                made_copies = (phase, node.name, "input copies")
                self.size[made_copies] = sum(copies)
                arrive(made_copies, k)
                copying, due[k] = self._copied_only(node, keys, due.get(k, []), copies, made_copies)
            for key in made[node]:
                arrive(key, k)
            if scratch := workspace_bytes(node, self.fuse):  # alive while the library kernel runs
                self.size[(phase, node.name, "workspace")] = scratch
                arrive((phase, node.name, "workspace"), k)
            if node.op == "call_function":
                total = max(self.total, copying)
                self.steps.append((phase, node.name, total))
                if total > self.peak:
                    self.peak, self.peak_step = total, self.clock
            for key in due.pop(k, ()):
                self._leave(key, self.clock + 1)
            self.clock += 1
        self.keys.update(keys)

    def _copied_only(self, node: fx.Node, keys: dict, ending: list, copies: list[int],
                     made: tuple) -> tuple[int, list]:
        """Free the storages of ``ending`` (those read last at ``node``'s step) that ``node``
        reads only through the ``copies`` of its inputs (their bytes, stored as ``made``), as
        those copies are made; return the bytes alive while they are made, and the rest of
        ``ending`` (``node``'s own inputs, which end after it).

        Inductor frees a buffer after the last kernel reading it, and the copy kernels run
        before the library kernel allocates its outputs and scratch; a copy kernel writes into a
        storage of its size that it reads last, as any generated kernel may (:meth:`_reused`).
        On an H100, Whisper's attention backward at budget 0 read copies of the recomputed query,
        key and value, whose projections were freed before the call: 35 MiB the model had counted
        alive through it (predicted 385.9 MiB, traced 359.0)."""
        own = {made, *(key for inp in node.all_input_nodes for key in keys.get(inp, ()))}
        dying = [key for key in ending if key not in own and key in self.live]
        writable = [key for key in dying if key not in self.tangents and key not in self.undonated]
        reused = 0
        for size in copies:
            into = next((key for key in writable if self.size[key] == size), None)
            if into is not None:
                writable.remove(into)
                reused += size
        copying = self.total - reused
        for key in dying:
            self._leave(key, self.clock)
        return copying, [key for key in ending if key not in dying]

    def _leave(self, key: object, step: int) -> None:
        if key in self.live:
            self.live.remove(key)
            self.total -= self.size[key]
            self.gone[key] = step

    @property
    def peak_live(self) -> frozenset:
        """The storages alive at the peak."""
        never = self.clock + 1
        return frozenset(key for key, born in self.born.items() if born <= self.peak_step < self.gone.get(key, never))

    def _reused(self, key: object, k: int, last: dict, node: fx.Node, keys: dict, ending: Iterable) -> set:
        """An input storage of the same size that ``node``'s kernel (step ``k``) reads last:
        inductor writes the output into it in place (its ``# reuse``), so the output adds nothing.
        One of ``ending``, the storages freed after step k (none kept past the kernel), of the
        output's dtype and read at its index (:func:`not_written_in_place`, found only where
        there is a candidate)."""
        size = self.size[key]
        candidates = [old for old in ending if size and old in self.live and old not in self.tangents
                      and old not in self.undonated and last.get(old, -1) == k and self.size[old] == size]
        if candidates:
            blocked = {stored for root in not_written_in_place(node) for stored in keys.get(root, ())}
            candidates = [old for old in candidates if old not in blocked]
        return set(candidates[:1])

    def _keys(self, node: fx.Node, keys: dict, phase: str, carried: dict) -> tuple[tuple, tuple]:
        """The storages ``node``'s value lives in, and those of them it allocates."""
        if node in carried:
            return tuple(carried[node]), ()
        if node.op == "placeholder":
            if node in self.copies:
                return self._new((phase, node.name), self.copies[node])  # its channels-last copy
            if phase == "forward":
                return (), ()  # an input or parameter, held before the step
            new = self._new((phase, node.name), _value_bytes(node.meta.get("val")))  # a tangent
            self.tangents.update(new[0])
            return new
        if node.op != "call_function":
            return (), ()
        base = _shared_input(node)
        if base is not None:
            if node in self.view_copies:  # stored in a layout of its own (for the backward, or a library kernel)
                self.values[(phase, node.name)] = _copy_bytes(node.meta.get("val"))
                return self._new((phase, node.name), self.values[(phase, node.name)])
            return keys.get(base, ()), ()
        if is_getitem(node):  # one output of a multi-output op, or a tuple of them (nested)
            index = node.args[1]
            inner = {path[1:]: key for path, key in self.paths.get(node.args[0], {}).items() if path[0] == index}
            if () in inner:
                return (inner[()],), ()
            self.paths[node] = inner
            return tuple(inner.values()), ()
        val = node.meta.get("val")
        if isinstance(val, (tuple, list)):  # one storage per tensor output, outputs nested in tuples too
            self.paths[node] = {path: self._new((phase, node.name, *path), _value_bytes(item))[0][0]
                                for path, item in _leaves(val)}
            new = tuple(self.paths[node].values())
            return new, new
        if not isinstance(val, torch.Tensor):
            return (), ()
        forced = self.forced.get((phase, node.name))
        new = self._new((phase, node.name),
                        forced if forced is not None else stored_bytes(node, readers(node), self.fuse, self.far))
        self.values[(phase, node.name)] = self.size[(phase, node.name)]
        return new

    def _new(self, key: tuple, size: int) -> tuple[tuple, tuple]:
        self.size[key] = size
        return (key,), (key,)


def _leaves(val: object, path: tuple = ()) -> list[tuple[tuple, object]]:
    """The non-tuple items of a (nested) tuple value, with their index paths."""
    if isinstance(val, (tuple, list)):
        return [leaf for i, item in enumerate(val) for leaf in _leaves(item, (*path, i))]
    return [(path, val)]


def _value_bytes(val: object) -> int:
    return storage_bytes(val) if isinstance(val, torch.Tensor) else 0


def _copy_bytes(val: object) -> int:
    """Bytes of a dense copy of view ``val``: its own elements (a part of a split, say), not its
    base's storage."""
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def build_schedule(joint: JointGraph, fuse: bool = False) -> Schedule:
    """The :class:`Schedule` of a joint graph, over its forward nodes and backward steps."""
    # the joint graph is only read here (Llama's problem: 3.02 s to 0.15 s, docs/plan-time-cpu.md)
    channels_last = fuse and convolutions_laid_out([*joint.primals, *joint.forward_nodes])
    with _graphs_unchanged(), _laid_out_channels_last(channels_last, joint_forward=joint.forward_nodes):
        return _build_schedule(joint, fuse)


def _build_schedule(joint: JointGraph, fuse: bool) -> Schedule:
    nodes = joint.forward_nodes
    index = {node: i for i, node in enumerate(nodes)}
    n = len(nodes)
    out_roots = {storage_root(o) for o in joint.fwd_outputs if isinstance(o, fx.Node)}
    held_roots = out_roots - freed_output_roots(joint)  # the caller keeps these
    steps = [node for node in joint.graph.nodes if node in joint.backward_nodes and node.op == "call_function"]
    owner = np.full(n, -1, dtype=np.int64)
    transient = np.zeros(n, dtype=np.int64)
    copy_bytes = np.zeros(n, dtype=np.int64)
    fused = np.zeros(n, dtype=bool)
    made_with = np.arange(n, dtype=np.int64)
    fwd_last = np.arange(n, dtype=np.int64)
    held = np.zeros(n, dtype=bool)
    narrow_copy: dict[int, int] = {}
    fwd_kernel = kernel_steps([*nodes, joint.output_node], fuse)
    always = computed_whatever_saved(joint)
    on_demand = np.array([node not in always for node in nodes], dtype=bool)
    demand_reads: list[tuple[int, int, int]] = []
    for i, node in enumerate(nodes):
        owner[i] = index.get(storage_root(node), -1)
        if owner[i] != i:
            continue
        reading = readers(node)
        forward = [r for r in reading if r in index]
        held[i] = node in held_roots
        out = node in out_roots  # stored for the caller, alive to the forward's end
        transient[i] = stored_bytes(node, forward + ([joint.output_node] if out else []), fuse)
        in_backward = [r for r in reading if r.op != "output"]
        fused[i] = fuse and isinstance(node.meta.get("val"), torch.Tensor) and _inlined(node, in_backward)
        # a recomputed reduction fused into a reader that runs far from it (a product between
        # them) is stored where it runs (far_epilogues), which only the plan decides: a row's
        # worth, counted stored (the test GPT's softmax inlined into its gradient's readers kept
        # its row max and sums stored, 1152 bytes over a bound without them)
        copy_bytes[i] = 0 if fused[i] and not is_reduction(node) else stored_bytes(node, in_backward, fuse=False)
        if is_getitem(node) and node.args[0] in index:
            made_with[i] = index[node.args[0]]
        if fused[i] and laid_out_for_replay(node):
            fused[i], copy_bytes[i] = False, storage_bytes(node.meta["val"])
        if fuse and (narrow := narrow_random_value(node)) in index:
            # recomputed, the random tensor is computed in the kernel storing the narrow value
            # (planner.emit.store_narrow_random); that value's copy is stored
            fused[i], copy_bytes[i] = True, 0
            narrow_copy[index[narrow]] = storage_bytes(narrow.meta["val"])
        fwd_last[i] = n - 1 if out else min(n - 1, max([i] + [fwd_kernel[r] for r in forward if r in always]))
        demand_reads += [(i, index[r], min(n - 1, fwd_kernel[r])) for r in forward if r not in always]
    for j, nbytes in narrow_copy.items():
        fused[j], copy_bytes[j] = False, nbytes
    fused_if_saved = np.full((n, FUSED_IF_SAVED), -1, dtype=np.int64)
    if fuse:
        for i in np.flatnonzero(~fused & (copy_bytes > 0) & (owner == np.arange(n))):
            node = nodes[i]
            found = [index[p] for p in inlined_once_saved(node, [r for r in readers(node) if r.op != "output"])
                     if p in index][:FUSED_IF_SAVED]
            fused_if_saved[i, :len(found)] = found
    first_read = np.full(n, len(steps), dtype=np.int64)
    last_read = np.full(n, -1, dtype=np.int64)
    far = far_epilogues(steps, fuse)
    bwd_kernel = kernel_steps(steps, fuse, far)
    for t, step in enumerate(steps):  # a copy is made before its first reader; read until its last kernel
        for inp in step.all_input_nodes:
            o = index.get(storage_root(inp))
            if o is not None:
                first_read[o] = min(first_read[o], t)
                last_read[o] = max(last_read[o], bwd_kernel[step])
    for out in joint.bwd_outputs:  # a gradient that is a forward value lives to the end
        o = index.get(storage_root(out)) if isinstance(out, fx.Node) else None
        if o is not None:
            first_read[o] = min(first_read[o], len(steps) - 1)
            last_read[o] = len(steps) - 1
    # widening casts the emitter has read their narrow input stored (planner.emit.store_narrow_casts)
    narrowed = {step: narrow for step in steps
                if fuse and (narrow := narrow_cast_input(step, far)) is not None and narrow in joint.backward_nodes}
    reuse = np.array([_backward_bytes(step, fuse, far, narrowed) if fuse and generated(step) else 0 for step in steps],
                     dtype=np.int64)
    no_reuse = np.zeros(n, dtype=bool)  # the kernel reading it last cannot write into it (not_written_in_place)
    for o in np.flatnonzero(last_read >= 0):
        no_reuse[o] = bool(reuse[last_read[o]]) and nodes[o] in not_written_in_place(steps[last_read[o]])
    undonated = np.array([node in out_roots for node in nodes], dtype=bool)  # saved, the caller's output's storage
    base, reuse_base = _backward_base(joint, steps, bwd_kernel, fuse, reuse, far, narrowed)
    base += np.array([workspace_bytes(step, fuse) for step in steps], dtype=np.int64)
    # a backward kernel's copies of its unstored inputs; of a forward value, counted whether or
    # not the plan saves it (saved, it is a stored input of the backward and is not copied)
    base += np.array([input_copy_bytes(step, fuse, far, within=joint.backward_nodes) for step in steps], dtype=np.int64)
    base += sum(storage_bytes(nodes[i].meta["val"]) for i in np.flatnonzero(held)
                if isinstance(nodes[i].meta.get("val"), torch.Tensor))
    # library kernels' scratch (planner.workspace) and copies of their unstored inputs
    scratch = np.array([workspace_bytes(node, fuse) + input_copy_bytes(node, fuse, within=index) for node in nodes],
                       dtype=np.int64)
    fwd_base = scratch.copy()
    copies = layout_copies([*joint.primals, *nodes]) if fuse else {}
    if copies:
        until = _latest_reads(nodes, index, first_read, last_read, fused, len(steps))
        for primal, size in copies.items():
            reading = readers(primal)
            forward = [r for r in reading if r in index]
            # read in the backward directly, or by a recomputed copy of a forward reader
            end = max([-1] + [bwd_kernel[r] for r in reading if r in bwd_kernel] + [until[index[r]] for r in forward])
            fwd_end = n - 1 if end >= 0 else max([0] + [fwd_kernel[r] for r in forward])
            fwd_base[: fwd_end + 1] += size
            base[: end + 1] += size
    demand_needs = sorted({(index[a], k) for k in np.flatnonzero(on_demand).tolist() for a in nodes[k].all_input_nodes
                           if a in index})
    return Schedule(owner, transient, copy_bytes, fused, made_with, fwd_last, first_read, last_read, held, base,
                    reuse, reuse_base, tuple(s.name for s in steps), fwd_base=fwd_base,
                    copy_scratch=scratch, no_reuse=no_reuse, undonated=undonated, fused_if_saved=fused_if_saved,
                    on_demand=on_demand,
                    demand_reads=np.array(demand_reads, dtype=np.int64).reshape(-1, 3),
                    demand_needs=np.array(demand_needs, dtype=np.int64).reshape(-1, 2))


def computed_whatever_saved(joint: JointGraph) -> set[fx.Node]:
    """Forward nodes the emitted forward computes under every plan: those its outputs need (and a
    random op, which the forward runs to keep its RNG state where the plan recomputes it, and an
    op with side effects, such as a buffer's in-place update), with what they read. The others
    are pieces of the backward that read no tangent (after the merge of common subexpressions, a
    GELU's derivative reads the forward's ``erf``): the forward computes one only where the plan
    saves it or a value it computes reads it, as the split keeps only what its outputs and saved
    values need. On Wav2Vec2's feature encoder (bf16, seq
    64000, batch 8), one such sum, 200 MiB in float32, was counted alive in the forward beside the
    convolution's float32 output, and budget 0 saved it rather than recompute it: 500 MiB
    planned where the plan without it simulates 408."""
    forward = set(joint.forward_nodes)
    roots = [o for o in joint.fwd_outputs if isinstance(o, fx.Node)]
    roots += [n for n in forward if is_random(n) or n.is_impure()]
    found: set[fx.Node] = set()
    while roots:
        node = roots.pop()
        if node in found or node not in forward:
            continue
        found.add(node)
        roots.extend(node.all_input_nodes)
    return found


def saved_outputs(forward: fx.GraphModule, num_fwd_outputs: int) -> frozenset[int]:
    """Places of ``forward``'s first ``num_fwd_outputs`` outputs (the caller's) whose storage is
    that of a value it saves for the backward (its outputs after those)."""
    out = _outputs(forward, raw=True)
    saved = {storage_root(o) for o in out[num_fwd_outputs:] if isinstance(o, fx.Node)}
    return frozenset(k for k, o in enumerate(out[:num_fwd_outputs])
                     if isinstance(o, fx.Node) and storage_root(o) in saved)


def freed_output_roots(joint: JointGraph) -> set[fx.Node]:
    """Storages of the forward outputs at the places ``joint.released`` (freed by the caller
    before the backward), less those the caller keeps through another output."""
    roots = [(k in joint.released, storage_root(o)) for k, o in enumerate(joint.fwd_outputs) if isinstance(o, fx.Node)]
    return {root for freed, root in roots if freed} - {root for freed, root in roots if not freed}


def _latest_reads(nodes: list[fx.Node], index: dict, first_read: np.ndarray, last_read: np.ndarray,
                  fused: np.ndarray, T: int) -> np.ndarray:
    """Per forward node, the last backward step at which a recomputed copy of it can read its
    inputs under any plan (-1 if it has none): a copy is made by its first direct reader, or else
    by the latest copy reading it; a fused copy reads them up to its last reader's kernel
    (``first_read`` is ``T`` for a node no backward step reads)."""
    made = np.full(len(nodes), -1, dtype=np.int64)
    until = np.full(len(nodes), -1, dtype=np.int64)
    for i in range(len(nodes) - 1, -1, -1):
        later = [index[r] for r in readers(nodes[i]) if r in index]
        made[i] = first_read[i] if first_read[i] < T else max([-1] + [made[j] for j in later])
        until[i] = max([made[i], last_read[i]] + [until[j] for j in later]) if fused[i] else made[i]
    return until


def _backward_bytes(step: fx.Node, fuse: bool, far: Collection[fx.Node], narrowed: Mapping[fx.Node, fx.Node]) -> int:
    """Bytes stored for the backward node ``step``: none for a cast in ``narrowed`` (computed in
    its readers from its narrow input), that input's own bytes for the input."""
    if step in narrowed:
        return 0
    if len(step.users) == 1 and narrowed.get(next(iter(step.users))) is step:
        return storage_bytes(step.meta["val"])
    return stored_bytes(step, readers(step), fuse, far)


def _backward_base(joint: JointGraph, steps: list[fx.Node], kernel: dict, fuse: bool,
                   reuse: np.ndarray, far: Collection[fx.Node],
                   narrowed: Mapping[fx.Node, fx.Node]) -> tuple[np.ndarray, np.ndarray]:
    """Bytes of the backward's own storages (tangents, temporaries, gradients) alive per step,
    and the steps whose output can be written into one of them (of size ``reuse[t]``, read last
    at t); ``kernel`` gives the step at which each node's inputs are really read; ``narrowed``:
    the widening casts computed in their readers from their narrow input, stored in their place
    (:func:`narrow_cast_input`)."""
    step_of = {node: t for t, node in enumerate(steps)}
    T = len(steps)
    delta = np.zeros(T + 1, dtype=np.int64)
    reuse_base = np.zeros(T, dtype=bool)
    grads = {storage_root(o) for o in joint.bwd_outputs if isinstance(o, fx.Node)}
    tangents_held = tangents_held_through_backward()
    for node in [*joint.tangents, *steps]:
        if storage_root(node) is not node:
            continue
        reading = readers(node)
        size = _value_bytes(node.meta.get("val")) if node.op == "placeholder" else _backward_bytes(node, fuse, far, narrowed)
        if len(reading) == 1 and reading[0] in narrowed:  # read where the cast is: in the cast's readers
            reading = readers(reading[0])
        if is_getitem(node) or not size:
            continue
        start = step_of.get(node, 0)
        # a gradient is returned; a tangent may be held by the autograd engine until the backward returns
        held = node in grads or (node.op == "placeholder" and tangents_held)
        end = T - 1 if held else max([start] + [kernel[r] for r in reading if r in kernel])
        delta[start] += size
        delta[end + 1] -= size
        owned = node not in grads and node.op != "placeholder"  # a tangent is not inductor's to write into
        if owned and start < end and reuse[end] == size:
            reuse_base[end] |= node not in not_written_in_place(steps[end])
    for node in steps:  # multi-output ops: each output is allocated when the op runs
        val = node.meta.get("val")
        if isinstance(val, (tuple, list)):
            for user in node.users:
                owns = is_getitem(user) and aliased_input(user) is None
                if owns and isinstance(user.meta.get("val"), torch.Tensor):
                    size = storage_bytes(user.meta["val"])
                    end = T - 1 if user in grads else max([step_of[node]] + [kernel[r] for r in readers(user) if r in kernel])
                    delta[step_of[node]] += size
                    delta[end + 1] -= size
                    if user not in grads and step_of[node] < end and reuse[end] == size:
                        reuse_base[end] |= user not in not_written_in_place(steps[end])
    return np.cumsum(delta)[:T], reuse_base
