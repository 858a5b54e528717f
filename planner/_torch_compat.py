"""The one place that calls private torch functions.

Every private entry point the planner needs is wrapped here, so an upgrade of torch touches one
file; ``tests/test_torch_compat.py`` checks each wrapper on the installed version (the project
supports torch 2.11 through 2.13).
"""
from __future__ import annotations

import bisect
import contextlib
from types import SimpleNamespace

from typing import Any, Callable, Collection, Mapping

import torch
import torch.fx as fx

__all__ = [
    "aot_autograd",
    "eager_collectives",
    "extract_fwd_bwd_modules",
    "run_and_save_rng_state",
    "run_with_rng_state",
    "inductor_compile",
    "inductor_layout_opt",
    "inductor_calls_library",
    "inductor_scatters_index_put",
    "inductor_fixes_layout",
    "storage_weakref",
    "tangents_held_through_backward",
    "has_custom_partitioner_hook",
    "pytorch_knapsack_solvers",
    "pytorch_partition",
    "pytorch_saved_names",
    "split_saved_names",
    "merge_common_subexpressions",
    "pytorch_split_modules",
    "compiled_as_pytorch",
    "report_kept_buffers",
    "kept_buffers",
    "compiling_frame",
    "mutated_primals",
    "gpu_spin",
    "is_fake",
    "real_tensors",
]


def aot_autograd(**kwargs: Any) -> Callable:
    """A torch.compile backend running AOTAutograd with the given compilers and partition_fn."""
    from torch._dynamo.backends.common import aot_autograd as _aot_autograd

    return _aot_autograd(**kwargs)


def extract_fwd_bwd_modules(
    joint: fx.GraphModule,
    saved_values: list[fx.Node],
    saved_sym_nodes: list[fx.Node],
    num_fwd_outputs: int,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Split a joint graph into AOTAutograd's forward and backward modules.

    The forward returns its outputs followed by ``saved_values`` and ``saved_sym_nodes``; the
    backward takes those and the tangents, and computes every other forward node it needs itself,
    in the joint graph's order. AOTAutograd's runtime expects exactly this layout.
    """
    from torch._functorch.partitioners import _extract_fwd_bwd_modules

    return _extract_fwd_bwd_modules(
        joint, list(saved_values), list(saved_sym_nodes), num_fwd_outputs=num_fwd_outputs
    )


def run_and_save_rng_state() -> Any:
    """Higher-order op returning ``(rng_state, op(*args))``; inductor runs it as a fallback."""
    return torch._prims.rng_prims.run_and_save_rng_state


def run_with_rng_state() -> Any:
    """Higher-order op running ``op(*args)`` with the RNG set to a saved state, then restoring it."""
    return torch._prims.rng_prims.run_with_rng_state


def as_traced_strides() -> Any:
    """Op ``(tensor, stride) -> tensor`` with exactly that stride: inductor lays the tensor out
    so (a copy only where a fixed layout differs); run eagerly, it copies where strides differ.

    The RNG higher-order ops above are inductor fallbacks without the layout constraints
    inductor gives the op they wrap: a fused attention kernel needs its mask's last dimension
    contiguous, and wrapped, got the mask in whatever layout inductor chose (on an H100, T5's
    memory-efficient attention failed: ``(*bias): last dimension must be contiguous``).
    """
    import torch._inductor.inductor_prims  # noqa: F401  registers the prim

    return torch.ops.prims.inductor_force_stride_order.default


def lazy_graph_modules():
    """A context in which the GraphModules made by :func:`graph_module` and by PyTorch's
    partition extraction write their Python code only when first run or read (torch.fx's lazy
    graph modules, as dynamo makes them): a module that is only walked, as the memory model
    walks the emitted modules of a plan it weighs, never pays for it (profiled on the CPU, writing
    that code took about 3 s of 16 for three simulations of T5). A torch without them makes
    modules as usual."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


def graph_module(root: torch.nn.Module, graph: fx.Graph) -> fx.GraphModule:
    """``fx.GraphModule(root, graph)``, lazy inside :func:`lazy_graph_modules`."""
    try:
        from torch.fx._lazy_graph_module import _make_graph_module
    except ImportError:
        return fx.GraphModule(root, graph)
    return _make_graph_module(root, graph)


def real_tensors():
    """A context in which tensors are real even inside torch.compile, whose partitioner (and
    so the planner's estimators) runs under a FakeTensorMode: ops there run no kernels."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


@contextlib.contextmanager
def eager_collectives():
    """A context in which the planner's own object collectives run as in eager code inside a
    torch.compile partitioner: real tensors (not the compile's fake ones), and the Python
    dispatcher AOTAutograd enables turned off. Through the Python dispatcher a gloo collective
    queues its work holding the GIL, while gloo's worker thread may need the GIL to finish an
    earlier work's Python callback (DDP's and FSDP2's): the two then wait for each other."""
    from torch._dispatch.python import no_python_dispatcher
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), no_python_dispatcher():
        yield


def is_fake(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a compile's fake tensor (metadata only: a graph run on it during
    compilation, as DDP's graph splitting runs each part to trace the next, ran no step)."""
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return bool(_is_fake(tensor))


def gpu_spin(cycles: int) -> None:
    """Queue a kernel that keeps the current CUDA stream busy for about ``cycles`` GPU clock
    cycles (``torch.cuda._sleep``): work the host queues behind it then runs back to back."""
    torch.cuda._sleep(int(cycles))


def has_custom_partitioner_hook() -> bool:
    import torch._inductor.config as inductor_config

    return hasattr(inductor_config, "custom_partitioner_fn")


# Inductor stores a pointwise value that several kernels read once its expression (its inlined
# producers too) takes more than ``realize_opcount_threshold`` ops (30 on a GPU; 50 on the CPU
# in 2.13); the memory model counts stored reads only (planner.memory.REALIZE_READS). On an
# H200, MPT's recomputed softmax (scores less the row max, over the sum, with its ALiBi biases
# and causal mask built from positions inline: 31 ops, counted by inductor on the CPU) was
# stored in float32 for the softmax's backward, 1 GiB a layer at batch 4 that the model had
# fused (budget 0: 1.770 GiB predicted, 2.303 measured). Planned graphs take the CPU's bar on
# every device: no higher, since a value read twice at every step of a pointwise chain is
# evaluated 2**depth times while it stays inlined (a 10-step chain took stock inductor 23 s to
# compile on the CPU), and inductor's guard against that stops inlining at 100 ops only.
REALIZE_OPCOUNT = 50

# Inductor stores a pointwise value, however many kernels read it, once its expression (its
# inlined producers' too) reads more than ``realize_acc_reads_threshold`` stored inputs
# (``has_exceeded_max_reads``: 8 on a GPU, 12 on the CPU in 2.13). Planned graphs take the GPU's
# bar on every device, and the memory model counts it (planner.memory.stored_for_reads). On an
# H100, T5's backward at budget 0 stored a sum of the residual stream's gradients (8 MiB at
# batch 16) that the model had computed in the one kernel reading it.
REALIZE_ACC_READS = 8


def inductor_compile(gm: fx.GraphModule, example_inputs: list, partition_fn: Callable,
                     options: dict[str, Any] | None = None, fusions: Any = None) -> Callable:
    """Compile a dynamo graph with inductor, using ``partition_fn`` to split the joint graph.

    Uses inductor's custom partitioner hook, so inductor's joint-graph passes run before the
    planner sees the graph. Inductor's reordering for peak memory is turned off: the emitted
    order is part of the plan, and the planner's memory figures are for that order. (On an H100,
    inductor's reordering raised the measured peak of a frugal GPT plan above the emitted
    order's: 1.280 against 1.199 GiB, and 1.367 against 1.322 GiB at a budget of 0.05.)

    In the backward, inductor fuses no two kernels more than :data:`FUSION_DISTANCE` apart
    (:func:`fusion_distance_guard`; the memory model follows it, see
    :func:`planner.memory.far_epilogues`).

    A pointwise value several kernels read is stored only past :data:`REALIZE_OPCOUNT` ops of
    its expression, as the memory model assumes (``realize_opcount_threshold``), and any pointwise
    value past :data:`REALIZE_ACC_READS` stored reads (``realize_acc_reads_threshold``).

    Inductor's buffer pool is turned off too (``allow_buffer_reuse``; in-place kernels stay):
    it keeps a dead buffer alive until a later buffer of the same size takes it over, which in
    a frugal plan's backward held three 128 MiB MLP buffers of one layer through the next
    layer's attention backward and recomputation (on an H100, 1.333 GiB measured against
    0.916 GiB freed at last use). Freed at last use, the caching allocator hands the block to
    the next allocation of its size instead.

    A forward or backward that ``partition_fn`` marked with :func:`compiled_as_pytorch` (PyTorch's
    own split, :func:`pytorch_split_modules`) is compiled with inductor's settings as they are
    outside this call instead, as ``torch.compile`` compiles it.

    ``options`` are inductor config settings applied over these (``PlannerConfig.inductor_options``).
    ``fusions``, when given, adds up the guard's refusals (its ``refused`` and ``refused_across``).

    Raises
    ------
    ConfigError
        If ``options`` names a setting this inductor does not have.
    """
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    class _Partitioner(CustomPartitionerFn):
        def __call__(self, joint, joint_inputs, **kwargs):
            return partition_fn(joint, joint_inputs, **kwargs)

        def uuid(self) -> None:
            # The split depends on the plan, so no compiled artefact may be reused across plans.
            return None

    lowered = SimpleNamespace(graph=None)  # the graph inductor is compiling, seen after fusion
    own = {"allow_buffer_reuse": False, "post_grad_custom_post_pass": products_apart(inductor_config.post_grad_custom_post_pass)}
    if hasattr(inductor_config, "_post_fusion_custom_pass"):  # 2.11 and 2.13 have it
        own["_post_fusion_custom_pass"] = _remember_graph(lowered, inductor_config._post_fusion_custom_pass)
    if hasattr(inductor_config, "_pre_fusion_custom_pass"):  # 2.11 and 2.13 have it
        own["_pre_fusion_custom_pass"] = fusion_distance_guard(counts=fusions)
    if hasattr(inductor_config, "reorder_for_peak_memory"):
        own["reorder_for_peak_memory"] = False
    own["realize_opcount_threshold"] = REALIZE_OPCOUNT
    if hasattr(inductor_config, "realize_acc_reads_threshold"):
        own["realize_acc_reads_threshold"] = REALIZE_ACC_READS
    unknown = sorted(k for k in options or {} if not hasattr(inductor_config, k))
    if unknown:
        from planner.errors import ConfigError

        raise ConfigError(f"inductor_options: inductor has no setting {', '.join(unknown)}; see torch._inductor.config")
    # PyTorch's own split gets the products kept apart too: the memory model counts them so
    # (and the graph remembered, so that what its code keeps can be reported for it too)
    unchanged = ("post_grad_custom_post_pass", "_post_fusion_custom_pass")
    stock = {key: getattr(inductor_config, key) for key in own if key not in unchanged} | dict(options or {})

    def inner_compile(module: fx.GraphModule, inputs: list, **kwargs: Any) -> Any:
        request = next(iter(module.graph.find_nodes(op="output"))).meta.get(_KEPT)
        lowered.graph = None
        if kwargs.get("is_backward"):
            undonate_aliased_inputs(module)
        with inductor_config.patch(stock) if compiled_as_pytorch(module) else contextlib.nullcontext():
            compiled = compile_fx_inner(module, inputs, **kwargs)
        if request is not None and lowered.graph is not None:
            into, phase = request
            try:  # a report on the compiled code: it must not fail the compile
                into[phase] = kept_buffers(lowered.graph)
            except Exception as err:  # noqa: BLE001 - said in the report
                into[phase] = f"not read: {type(err).__name__}: {err}"
        lowered.graph = None
        return compiled

    patches = {"custom_partitioner_fn": _Partitioner(), "fx_graph_cache": False, **own, **(options or {})}
    # config_patches, unlike a patch around the call, also covers a backward compiled lazily
    return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches)


def undonate_aliased_inputs(backward: fx.GraphModule) -> list[int]:
    """Take out of AOTAutograd's donated backward buffers (``fw_metadata.bw_donated_idxs``, which
    inductor may overwrite once it has read them) every input of ``backward`` that shares a
    storage with another of its inputs; the indices taken out.

    AOTAutograd donates each saved value that shares no storage with the forward's inputs or the
    caller's outputs, but does not look at the saved values among themselves. Where a plan saves
    a value and a view of it as two inputs, inductor counted the value dead after its last direct
    read and wrote a kernel's output into it while the view was still to be read: timm's VOLO at
    budget 0.5 (float64, CPU) trained with gradients off by 130% until this."""
    from torch._guards import TracingContext
    from torch.multiprocessing.reductions import StorageWeakRef

    context = TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    donated = getattr(meta, "bw_donated_idxs", None)
    if not donated:
        return []
    by_storage: dict[Any, list[int]] = {}
    for k, node in enumerate(backward.graph.find_nodes(op="placeholder")):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not val.is_sparse:
            by_storage.setdefault(StorageWeakRef(val.untyped_storage()), []).append(k)
    shared = {k for ks in by_storage.values() if len(ks) > 1 for k in ks}
    taken = sorted(shared.intersection(donated))
    if taken:
        meta.bw_donated_idxs = [k for k in donated if k not in shared]
    return taken


_AS_PYTORCH = "acplan_compiled_as_pytorch"  # output node meta: compile this module as torch.compile does
_KEPT = "acplan_kept_buffers"  # output node meta: where the compile reports the buffers its code keeps


def _remember_graph(lowered: Any, then: Callable | None) -> Callable:
    """An inductor post-fusion pass that notes the graph being compiled in ``lowered.graph``
    (:func:`inductor_compile` reads its buffers once its code is written), then runs ``then``."""
    def remember(nodes: list) -> list:
        from torch._inductor.virtualized import V

        lowered.graph = V.graph
        return nodes if then is None else then(nodes)

    return remember


def report_kept_buffers(module: fx.GraphModule, into: dict, phase: str) -> None:
    """Have :func:`inductor_compile` put in ``into[phase]``, once it has compiled ``module``,
    what the code it wrote keeps (:func:`kept_buffers`). The request sits on the output node,
    which the copies AOTAutograd makes of a module keep (as :func:`compiled_as_pytorch`'s mark)."""
    next(iter(module.graph.find_nodes(op="output"))).meta[_KEPT] = (into, phase)


def kept_buffers(graph: Any) -> tuple[list[tuple[int, tuple[str, ...]]], frozenset[str]]:
    """The buffers an inductor ``GraphLowering`` whose code is written allocates, each as its
    bytes and the names of the fx nodes whose value it may hold, and the names of all the nodes
    it lowered.

    Left out: buffers inductor removed (a fused kernel's local ones, those written in place of an
    input), and outputs with no storage of their own (a multi-output kernel's, a mutation's). A
    buffer holds the value of the node whose lowering made it, when inductor says which; else (a
    value stored when a later reader asks for it, such as a matrix product) of one of the nodes
    computed into it, named latest first."""
    from torch._inductor import ir

    removed = set(graph.removed_buffers) | set(graph.inplaced_to_remove)
    place = {node: k for k, node in enumerate(graph.module.graph.nodes)}
    no_storage = tuple(getattr(ir, name) for name in ("NoneLayout", "MultiOutputLayout", "MutationLayoutSHOULDREMOVE")
                       if hasattr(ir, name))
    hint = getattr(graph.sizevars, "optimization_hint", None) or graph.sizevars.size_hint  # 2.13, 2.11
    kept = []
    for buf in graph.buffers:
        layout = getattr(buf, "layout", None)
        if buf.get_name() in removed or layout is None or isinstance(layout, no_storage):
            continue
        node = getattr(buf, "origin_node", None)
        origins = ((node,) if node is not None else
                   tuple(sorted((n for n in getattr(buf, "origins", ()) if n in place), key=place.__getitem__, reverse=True)))
        if origins:
            kept.append((int(hint(layout.storage_size())) * buf.get_dtype().itemsize, tuple(n.name for n in origins)))
    return kept, frozenset(node.name for node in place)


def compiled_as_pytorch(module: fx.GraphModule, mark: bool = False) -> bool:
    """Whether ``module`` (a forward or backward a partition function returns) is to be compiled
    with inductor's own settings, as ``torch.compile`` compiles it (:func:`inductor_compile`);
    with ``mark``, mark it so first. The mark sits on its output node, which the copies
    AOTAutograd makes of a module keep."""
    output = next(iter(module.graph.find_nodes(op="output")))
    if mark:
        output.meta[_AS_PYTORCH] = True
    return bool(output.meta.get(_AS_PYTORCH))


def pytorch_split_modules(joint: fx.GraphModule, joint_inputs: list, num_fwd_outputs: int,
                          **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The forward and backward modules of PyTorch's own split of ``joint`` (its partitioner at
    ``activation_memory_budget`` 1.0), called as ``torch.compile``'s inductor calls it, each
    marked to be compiled as ``torch.compile`` compiles it (:func:`compiled_as_pytorch`).
    ``kwargs``: what inductor passed the partition function (``static_lifetime_input_indices``
    ...). The split edits the graph it is given."""
    import torch._functorch.config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    kwargs = {**kwargs, "compiler": "inductor", "num_fwd_outputs": num_fwd_outputs}
    with functorch_config.patch(activation_memory_budget=1.0):
        forward, backward = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
    for module in (forward, backward):
        compiled_as_pytorch(module, mark=True)
    return forward, backward


# Inductor's own distance for fusions that lengthen live ranges (``are_long_distant_nodes``).
FUSION_DISTANCE = 64


def products_apart(chained: Any = None, limit: int = FUSION_DISTANCE) -> Any:
    """An inductor post-grad pass (``post_grad_custom_post_pass``, run after inductor's own and
    before ``chained``) that undoes inductor's rewrite of ``add(mm(a, b), c)`` into
    ``addmm(c, a, b)`` where the product's operands are ready more than ``limit`` nodes before
    the add (:func:`operands_ready_near`): the product runs after its later operand, the add
    where the ``addmm`` was.

    The rewrite places the product at the add. A tied embedding's gradient is the output layer's
    product added to the embedding's own gradient at the end of the backward, so the logits'
    gradient, that product's operand, stayed alive through every layer's backward: 128 MiB of
    DeBERTa's 0.85 GiB budget-0 peak at batch 16 on an H200, which eager frees after the output
    layer. Kept apart, the product's result (the weight's shape) waits for the add instead. A
    linear layer's bias (broadcast, not of the output's shape) and an add near its product keep
    inductor's ``addmm``; the memory model follows the rule
    (:func:`planner.memory.accumulated_product`).
    """
    from torch._inductor.custom_graph_pass import CustomGraphPass

    # a pass set before, or a list of them (2.13 takes lists)
    later = () if chained is None else tuple(chained) if isinstance(chained, (list, tuple)) else (chained,)

    class _ProductsApart(CustomGraphPass):
        def __call__(self, graph: fx.Graph) -> None:
            keep_products_apart(graph, limit)
            for other in later:
                other(graph)

        def uuid(self) -> Any:
            return ("acplan products apart", limit, *(getattr(p, "uuid", lambda: None)() for p in later))

    return _ProductsApart()


def keep_products_apart(graph: fx.Graph, limit: int = FUSION_DISTANCE) -> int:
    """Split each ``addmm(c, a, b)`` of ``graph`` whose ``c`` has the output's shape and whose
    operands are not ready near it (:func:`operands_ready_near`) into ``mm(a, b)`` after the later
    operand and ``add(c, mm)`` in its place; the number split."""
    aten = torch.ops.aten
    order = {node: k for k, node in enumerate(graph.nodes)}
    split = 0
    for node in list(graph.find_nodes(op="call_function", target=aten.addmm.default)):
        inp, a, b = node.args[:3]
        val = node.meta.get("val")
        if (node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1 or not isinstance(inp, fx.Node)
                or not isinstance(val, torch.Tensor) or not isinstance(inp.meta.get("val"), torch.Tensor)
                or tuple(inp.meta["val"].shape) != tuple(val.shape) or operands_ready_near(node, (a, b), limit)):
            continue
        later = max((x for x in (a, b) if isinstance(x, fx.Node) and x.op != "placeholder"), key=order.__getitem__)
        with graph.inserting_after(later):
            product = graph.call_function(aten.mm.default, (a, b))
        with graph.inserting_before(node):
            add = graph.call_function(aten.add.Tensor, (inp, product))
        product.meta["val"] = add.meta["val"] = val
        node.replace_all_uses_with(add)
        graph.erase_node(node)
        split += 1
    return split


def operands_ready_near(node: fx.Node, operands: Any, limit: int = FUSION_DISTANCE) -> bool:
    """``node`` is within ``limit`` nodes of where the later of ``operands`` is made (or of the
    graph's start), in its graph's order: a product of them computed at ``node`` runs near where
    it could run. Operands that are graph inputs or views of them count as near: moving the
    product frees nothing the graph owns (a backward's tangent is held by its caller to the end:
    GPT-2's logits gradient, made by the loss graph after a graph break, stayed alive through
    the other graph's backward on an H200 with the product moved). Looks at ``limit`` nodes at
    most."""
    from planner.ops import view_base

    made = {x for x in operands if isinstance(x, fx.Node) and x.op != "placeholder"}
    if not made or any(view_base(x).op == "placeholder" for x in made):
        return True
    prev = node.prev
    for _ in range(limit):
        if prev.op == "root" or prev in made:
            return True
        prev = prev.prev
    return False


def fusion_distance_guard(limit: int = FUSION_DISTANCE, counts: Any = None) -> Callable:
    """An inductor pre-fusion pass (``_pre_fusion_custom_pass``) after which a backward graph's
    scheduler fuses no two nodes more than ``limit`` apart in its order, no two independent
    nodes (a horizontal fusion: neither reads what the other makes) with a matrix product or
    convolution between them, and no two nodes the later of which needs such a product between
    them.

    Inductor fuses a reduction with its pointwise reader, and two kernels that read one buffer,
    however far apart they are in the graph: the fused kernel runs where the later one would, so
    the earlier one's inputs stay alive until then. Its scheduler has the test for this
    (``Scheduler.are_long_distant_nodes``, written for activation checkpointing, at 64 nodes)
    but calls it nowhere in torch 2.11 and 2.13; this applies that test, on the one scheduler
    the pass is given, before inductor's own ``can_fuse``. Forward graphs are left alone: on an
    H100, ResNet-50's forward made 322 such fusions, and refusing them cost 4-7% of its step
    for no memory; T5's 30 at budget 0 were all in the backward, and refusing them took its
    peak from 4.333 to 1.182 GiB at the same step time. ``guard.refused`` counts the refusals
    (inductor may ask about one pair in several rounds of fusion), or ``counts.refused`` where
    ``counts`` is given: an object with ``refused`` and ``refused_across``, shared by compiles.

    Within the limit, a horizontal fusion still moves work across layers: ConvNeXt's backward at
    budget 0 (H100) fused the layer-scale gradient sums of three blocks into one kernel, and the
    scheduler, keeping the fused kernel where the first block's sum was, ran the next two blocks'
    work before the rest of the first block's (its weight gradients), whose inputs (two 36.75 MiB
    MLP buffers) and the gradients the sums read stayed alive through them. A matrix product or
    convolution between the two marks a layer boundary, so such fusions are refused
    (``guard.refused_across`` counts them, within ``refused``).

    A producer fused into its reader moves work too: the fused kernel takes the producer's place,
    so whatever the reader needs that runs between them (a matrix product, and all it reads) is
    hoisted above the rest of the work there. T5's backward on an H100 fused the first encoder
    layer's batch-summed position-bias gradient into the sum of all layers' at the end; the
    second layer's weight gradients then ran after the first layer's whole backward, their inputs
    and the feed-forward gradients (two 32 MiB buffers) alive through it. So a fusion whose later
    kernel depends on a matrix product or convolution between the two is refused as well (in
    ``refused_across``); the memory model follows this (:func:`planner.memory.far_epilogues`).

    The same move lengthens what the hoisted kernel writes: GPT-2's backward at budget 0 (H200)
    fused the normalised input of a layer norm (float32, 24 MiB), read by that norm's backward
    after the next layer's attention, into the kernel that recomputed the residual stream
    before it, so it was alive through the attention's recompute and backward, over the memory
    model, which computes every stored value where the graph places it. So a fusion across a
    matrix product whose later kernel writes anything other than a reduction (a value of its
    whole iteration space) is refused too; a reduction (a bias's gradient summed where the
    gradient is made) still moves up, its output a row.
    """
    def guard(nodes: list) -> list:
        from torch._inductor.virtualized import V

        if nodes and V.graph.is_backward:
            refuse_far_fusions(nodes[0].scheduler, nodes, limit, counts if counts is not None else guard)
        return nodes

    guard.refused = guard.refused_across = 0
    return guard


def refuse_far_fusions(scheduler: Any, nodes: list, limit: int, counts: Any) -> None:
    """Wrap ``scheduler.can_fuse`` to refuse the fusions :func:`fusion_distance_guard` names,
    adding to ``counts.refused`` (and ``counts.refused_across``). ``nodes`` are the scheduler's
    nodes before fusion, in order."""
    can_fuse = scheduler.can_fuse
    externs = sorted((node.min_order, name) for node in nodes if node.is_extern() for name in node.get_operation_names())
    products = [order for order, _ in externs]

    def near_only(node1, node2, *args, **kwargs) -> bool:
        if not can_fuse(node1, node2, *args, **kwargs):
            return False
        if max(abs(node1.min_order - node2.max_order), abs(node2.min_order - node1.max_order)) > limit:
            counts.refused += 1
            return False
        first, last = min(node1.min_order, node2.min_order), max(node1.max_order, node2.max_order)
        between = {name for _, name in externs[bisect.bisect_right(products, first):bisect.bisect_left(products, last)]}
        if not between:
            return True
        later = node1 if node1.max_order >= node2.max_order else node2
        independent = not (node1.get_operation_names() & node2.ancestors
                           or node2.get_operation_names() & node1.ancestors)
        writes_full = any(not sub.is_reduction() for sub in later.get_nodes())
        if independent or writes_full or between & later.ancestors:
            counts.refused += 1
            counts.refused_across += 1
            return False
        return True

    scheduler.can_fuse = near_only


def no_matmul_padding() -> dict[str, Any]:
    """Inductor settings that keep its joint-graph passes from padding matrix products
    (``shape_padding``): where a product's sizes are not multiples of the tensor cores' tile,
    inductor times the product padded and unpadded on the device while it compiles and, where
    padded is faster, pads the operands with copies that the graph then holds. Empty where this
    inductor has no such setting."""
    import torch._inductor.config as inductor_config

    return {"shape_padding": False} if hasattr(inductor_config, "shape_padding") else {}


def inductor_modes() -> dict[str, dict[str, Any]]:
    """``torch.compile``'s modes and the inductor settings each stands for
    (``torch._inductor.list_mode_options``): ``"max-autotune-no-cudagraphs"``:
    ``{"max_autotune": True, "coordinate_descent_tuning": True}``, ..."""
    from torch._inductor import list_mode_options

    return {mode: dict(list_mode_options(mode)) for mode in list_mode_options()}


def inductor_layout_opt(nodes: list[fx.Node]) -> bool:
    """Whether inductor lays out a training forward graph of ``nodes`` channels-last (its layout
    optimisation, decided by ``GraphLowering.decide_layout_opt``, which reads only the graph's
    nodes): it then copies every 4-D input and weight of a convolution to channels-last."""
    from torch._inductor.graph import GraphLowering

    module = SimpleNamespace(graph=SimpleNamespace(nodes=list(nodes)))
    return bool(GraphLowering.decide_layout_opt(module, is_inference=False))


def inductor_lays_out_convolution_gradient() -> bool:
    """Whether inductor lowers ``convolution_backward`` itself (torch 2.13), requiring the
    output gradient it reads channels-last for a 2-D convolution under the layout optimisation
    (else in the order of the weight's gradient: ``kernel.conv.convolution_backward_lowering``),
    where torch 2.11 runs it as a fallback kernel, whose inputs are laid out as any fallback's
    (:func:`inductor_fixes_layout`)."""
    from torch._inductor import lowering

    try:
        from torch._inductor.kernel import conv
    except ImportError:
        return False
    own = getattr(conv, "convolution_backward_lowering", None)
    return own is not None and lowering.lowerings.get(torch.ops.aten.convolution_backward.default) is own


def inductor_prefers_channels_last(graph: fx.Graph) -> frozenset[fx.Node]:
    """The nodes of a forward ``graph`` inductor's layout optimisation prefers channels-last
    (``GraphLowering.find_nodes_prefer_channels_last``, which reads only the graph's nodes): a
    convolution's inputs and outputs, what flows into them, and what flows from them up to the
    last convolution."""
    from torch._inductor.graph import GraphLowering

    return frozenset(GraphLowering.find_nodes_prefer_channels_last(SimpleNamespace(module=SimpleNamespace(graph=graph))))


def inductor_calls_library(target: Any) -> bool:
    """Inductor runs ``target`` as a library call rather than generating its code: it falls back
    to the ATen kernel (its ``fallbacks``), has no lowering for it, or lowers it to a library
    convolution (cuDNN). Its other lowerings (``cat``, ``index_put``, ``sort``, matrix products
    it may lower to templates...) are generated or call libraries that hold no scratch memory
    of their own (cuBLAS keeps one workspace for the process)."""
    from torch._inductor import lowering

    convolutions = (torch.ops.aten.convolution.default, torch.ops.aten._convolution.default)
    return target in lowering.fallbacks or target not in lowering.lowerings or target in convolutions


def inductor_scatters_index_put(dtype: torch.dtype, accumulate: bool) -> bool:
    """Inductor lowers an ``index_put`` into a buffer of ``dtype`` to its own scatter kernel, which
    loads the values where it stores them (``index_put_impl_``: their pointwise expression is
    computed there), rather than falling back to ATen's kernel, which reads them stored: it falls
    back under deterministic algorithms and for an atomic add Triton cannot generate
    (``needs_fallback_due_to_atomic_add_limitations``: int64, bool, bfloat16 before Hopper)."""
    if torch.are_deterministic_algorithms_enabled():
        return False
    if not accumulate:
        return True
    from torch._inductor import utils

    limited = getattr(utils, "needs_fallback_due_to_atomic_add_limitations", None)
    return limited is not None and not limited(dtype)


def online_softmax(device_type: str) -> bool:
    """Whether inductor computes a softmax's row max and sum in one reduction on ``device_type``
    (its ``online_softmax``: a post-grad pattern, applied for Triton kernels on CUDA and XPU, that
    reads the input once for both and leaves ``exp`` to the softmax's other readers)."""
    from torch._inductor import config as inductor_config

    if device_type not in ("cuda", "xpu") or not getattr(inductor_config, "online_softmax", False):
        return False
    return getattr(inductor_config, f"{device_type}_backend", "triton") == "triton"


def inductor_fixes_layout(target: Any) -> bool:
    """Inductor lowers ``target`` with a layout constraint on its tensor inputs (its lowering
    table's, or a layout tag on the op): the op's ``require_stride_order`` lays out each input
    as the kernel needs it, copying an input inductor has not stored yet (fused attention's mask
    and operands, an RNN's weights)."""
    from torch._inductor import lowering

    if not isinstance(target, torch._ops.OpOverload):
        return False
    find = getattr(lowering, "maybe_layout_constraints", None)  # reads the table and the op's tags
    if find is not None:
        return find(target) is not None
    table = getattr(lowering, "layout_constraints", getattr(lowering, "_maybe_layout_constraints", {}))
    return target in table


def storage_weakref(tensor: torch.Tensor) -> Any:
    """A weak reference to ``tensor``'s storage: ``expired()`` once no tensor or view uses it."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(tensor.untyped_storage())


def tangents_held_through_backward() -> bool:
    """Whether a compiled backward's tangents stay alive until it returns. Without
    ``boxed_grads_call`` (torch 2.11) the autograd engine holds the gradients it hands an
    autograd Function's backward, and the zeros it makes for an output that got none, through
    the call. Where torch has it (2.13), AOTAutograd's compiled functions take them boxed and
    drop them, so the compiled backward frees each one after its last reader."""
    return not hasattr(torch.autograd.Function, "boxed_grads_call")


# Frames a planned module resumes in after graph breaks inside library code (a decorator's
# wrapper) are one code object for every model in the process: each compile of one, whatever its
# backend, is a cache entry of that code object, and past dynamo's ``recompile_limit`` (8) the
# frame runs eagerly from then on, unplanned.
COMPILES_PER_CODE = 1024


@contextlib.contextmanager
def compile_limits_lifted():
    """dynamo's per-code-object compile limits raised to :data:`COMPILES_PER_CODE` (never
    lowered) while a planned module runs, and restored after."""
    config = torch._dynamo.config
    before = config.recompile_limit, config.accumulated_recompile_limit
    config.recompile_limit = max(before[0], COMPILES_PER_CODE)
    config.accumulated_recompile_limit = max(before[1], COMPILES_PER_CODE)
    try:
        yield
    finally:
        config.recompile_limit, config.accumulated_recompile_limit = before


def compiling_frame() -> tuple[int, int] | None:
    """The ids dynamo gives the code frame whose graph is being compiled (the same for every
    recompile of that frame, a new one for each frame a graph break resumes in) and this compile
    of it (a new one for each recompile); None outside a compile."""
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    return None if compile_id is None else (compile_id.frame_id, compile_id.frame_compile_id)


def pytorch_partition() -> Callable:
    """PyTorch's own partitioner (``min_cut_rematerialization_partition``), called as inductor
    calls it: for benchmarks that compile PyTorch's split through the planner's settings."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return min_cut_rematerialization_partition


def pytorch_saved_names(joint: fx.GraphModule, joint_inputs: list, num_fwd_outputs: int,
                        known: Collection[str] | None = None) -> list[str]:
    """Names of the nodes that PyTorch's own split (what torch.compile runs at its default
    ``activation_memory_budget`` of 1.0, :func:`pytorch_split_modules`) saves for the backward
    (:func:`split_saved_names`; ``known`` by default the joint graph's nodes). The split edits
    the graph it is given: pass a copy (:meth:`planner.graph.JointGraph.given_module`)."""
    known = {n.name for n in joint.graph.nodes} if known is None else known
    return split_saved_names(*pytorch_split_modules(joint, joint_inputs, num_fwd_outputs), known)


def merge_common_subexpressions(joint: fx.GraphModule) -> fx.GraphModule:
    """``joint`` (a joint graph handed to a partition function) with its dead code dropped and
    its common subexpressions merged, as PyTorch's partitioner does before it splits (functorch's
    ``cse`` setting, on by default; its ``fx_graph_cse``, which leaves random ops and mutations
    apart): one value computed twice the same way is one value, saved or recomputed once.
    XLNet casts its dropped-out position embedding for each layer's projection (six identical
    casts, 12 MiB each at seq 512); PyTorch's split saved one, the planner's graph had six."""
    import torch._functorch.config as functorch_config
    from torch._functorch.compile_utils import fx_graph_cse

    joint.graph.eliminate_dead_code()
    if functorch_config.cse:
        joint.graph = fx_graph_cse(joint.graph)
    joint.recompile()
    return joint


def split_saved_names(forward: fx.GraphModule, backward: fx.GraphModule, known: Collection[str],
                      inputs_of: Mapping[str, Collection[str]] | None = None) -> list[str]:
    """What a split of a joint graph into ``forward`` and ``backward`` saves, named by nodes of
    that joint graph: the backward's inputs other than tangents (saved primals by their
    placeholders' names). A saved value whose name is not in ``known``, such as a ``detach`` the
    split moved into the forward, is named by the first of ``known`` it reads through first
    inputs, or left out.

    With ``inputs_of`` (a known node's name -> the names of the known nodes it reads), a node of
    ``forward`` is taken for the known node of its name only if it reads those: a node the split
    made anew can take the name of another node of the joint graph. PyTorch's split of XLNet
    (seq 512) moved a backward ``permute`` of the dropped-out position embedding into the
    forward as ``permute_297``, the name of another permute of the joint graph; taken for that
    one, the embedding's dropout was left to recompute from seeds that cannot be recomputed,
    and budget 1.0 fell back to the planner's own fast end."""
    made = {n.name: n for n in forward.graph.nodes}

    def is_known(node: fx.Node) -> bool:
        if node.name not in known:
            return False
        if inputs_of is None or node.name not in inputs_of:
            return True
        return {a.name for a in node.all_input_nodes if a.name in known} == set(inputs_of[node.name])

    names = []
    for placeholder in backward.graph.find_nodes(op="placeholder"):
        node = made.get(placeholder.name)
        while node is not None and not is_known(node):
            node = next((a for a in node.args if isinstance(a, fx.Node)), None)
        if not placeholder.name.startswith("tangents") and node is not None:
            names.append(node.name)
    return names


def pytorch_knapsack_solvers() -> dict[str, Callable]:
    """PyTorch's own knapsack solvers, for side-by-side benchmarks."""
    from torch._functorch._activation_checkpointing import knapsack

    return {
        "torch_greedy": knapsack.greedy_knapsack,
        "torch_dp": knapsack.dp_knapsack,
        "torch_ilp": knapsack.ilp_knapsack,
    }


def mutated_primals(joint: fx.GraphModule) -> set[fx.Node] | None:
    """Primal placeholders that the step mutates (e.g. BatchNorm running statistics).

    Read from AOTAutograd's input/output descriptors; None where this torch does not record them.
    """
    output = next(iter(joint.graph.find_nodes(op="output")))
    descs = output.meta.get("desc")
    if descs is None:
        return None
    mutated = {repr(d.mutated_input) for d in descs if hasattr(d, "mutated_input")}
    return {n for n in joint.graph.find_nodes(op="placeholder") if repr(n.meta.get("desc")) in mutated}
