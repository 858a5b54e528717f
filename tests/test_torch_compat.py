"""Each private torch entry point the planner wraps still works on the installed torch."""
import pytest
import torch

import planner
from planner import _torch_compat
from tests.models import MODELS


def test_rng_state_ops_replay_a_random_op():
    x = torch.ones(1000)
    state, first = _torch_compat.run_and_save_rng_state()(torch.ops.aten.native_dropout.default, x, 0.5, True)
    torch.rand(10)  # move the generator on
    again = _torch_compat.run_with_rng_state()(state, torch.ops.aten.native_dropout.default, x, 0.5, True)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_mutated_primals_finds_batchnorm_statistics():
    model, inputs = MODELS["cnn"]()
    joint = planner.capture(model, inputs)
    mutated = joint.mutated_primals
    shapes = sorted(tuple(n.meta["val"].shape) for n in mutated)
    # running_mean, running_var and num_batches_tracked of both BatchNorm layers
    assert shapes == [(), (), (8,), (8,), (8,), (8,)]


def test_inductor_calls_libraries_for_convolutions_and_fallbacks_and_generates_the_rest():
    aten = torch.ops.aten
    for op in (aten.convolution.default, aten.convolution_backward.default,
               aten._scaled_dot_product_efficient_attention_backward.default):
        assert _torch_compat.inductor_calls_library(op), op
    for op in (aten.cat.default, aten.index_put.default, aten.sort.default):
        assert not _torch_compat.inductor_calls_library(op), op


def test_inductor_scatters_an_index_put_itself_except_where_it_falls_back_to_atens():
    """Plain and accumulated float stores are inductor's scatter kernels; an accumulated int64 or
    bool store (no atomic add) and any store under deterministic algorithms are ATen's. A
    function compiled both ways agrees: its code calls ``aten.index_put_`` only where said."""
    from torch._inductor.utils import run_and_get_code

    assert _torch_compat.inductor_scatters_index_put(torch.float32, accumulate=True)
    assert _torch_compat.inductor_scatters_index_put(torch.int64, accumulate=False)
    assert not _torch_compat.inductor_scatters_index_put(torch.int64, accumulate=True)
    index = torch.tensor([0, 2, 2])
    for dtype in (torch.float32, torch.int64):
        torch._dynamo.reset()
        fn = torch.compile(lambda base, v: base.index_put((index,), v * 2, accumulate=True), backend="inductor")
        _, (code, *_) = run_and_get_code(fn, torch.zeros(4, dtype=dtype), torch.ones(3, dtype=dtype))
        assert ("aten.index_put_" in code) != _torch_compat.inductor_scatters_index_put(dtype, accumulate=True), code
    torch.use_deterministic_algorithms(True)
    try:
        assert not _torch_compat.inductor_scatters_index_put(torch.float32, accumulate=False)
    finally:
        torch.use_deterministic_algorithms(False)


def test_inductor_has_the_custom_partitioner_hook():
    assert _torch_compat.has_custom_partitioner_hook()


def test_pytorch_knapsack_solvers_answer():
    solvers = _torch_compat.pytorch_knapsack_solvers()
    memory, runtimes = [0.5, 0.3, 0.4], [3.0, 1.0, 2.0]
    for name, solve in solvers.items():
        value, saved, recomputed = solve(memory, runtimes, 0.8)
        assert sorted(saved + recomputed) == [0, 1, 2], name
        assert sum(memory[i] for i in saved) <= 0.8 + 1e-9, name


def test_inductor_keeps_the_emitted_order_of_planned_graphs(monkeypatch):
    import torch._inductor.memory as inductor_memory
    from planner.models import GPTConfig, gpt_example

    reordered = []
    real = inductor_memory.reorder_for_peak_memory

    def spy(nodes, *args, **kwargs):
        reordered.append(len(nodes))
        return real(nodes, *args, **kwargs)

    monkeypatch.setattr(inductor_memory, "reorder_for_peak_memory", spy)
    model, batch = gpt_example(GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16, vocab=64, batch=2))
    compiled = torch.compile(model, backend=planner.backend(codegen="inductor", memory_budget=0.5))
    compiled(*batch).backward()
    assert not reordered
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):  # inductor on its own still reorders
        torch.compile(model)(*batch).backward()
    assert reordered


def test_real_tensors_are_real_under_a_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        assert isinstance(torch.ones(2), FakeTensor)
        with _torch_compat.real_tensors():
            assert not isinstance(torch.ones(2), FakeTensor)


def test_inductor_layout_opt_agrees_with_inductor_on_the_planned_forward(monkeypatch):
    from torch._inductor.graph import GraphLowering

    decided = []
    real = GraphLowering.decide_layout_opt

    def spy(gm, *, is_inference):
        answer = real(gm, is_inference=is_inference)
        decided.append((list(gm.graph.nodes), answer))
        return answer

    monkeypatch.setattr(GraphLowering, "decide_layout_opt", staticmethod(spy))
    model, inputs = MODELS["cnn"]()
    torch.compile(model, backend=planner.backend(codegen="inductor", memory_budget=1.0, solver="greedy"))(*inputs).backward()
    nodes, answer = decided[0]  # the forward
    assert any(n.target is torch.ops.aten.convolution.default for n in nodes)
    assert answer  # mkldnn convolutions on the CPU; on a GPU, its channels-last heuristics
    assert _torch_compat.inductor_layout_opt(nodes) == answer
    # the forward of a model without convolutions is never laid out channels-last
    gpt_nodes = planner.capture(*MODELS["gpt"]()).forward_nodes
    assert not _torch_compat.inductor_layout_opt(gpt_nodes)


@pytest.fixture
def pooled(monkeypatch):
    """The keys of the buffers inductor's generated code puts in its pool, as they are pooled."""
    from torch._inductor.codegen import wrapper

    pooled = []
    real = wrapper.MemoryPlanningState.push

    def spy(self, key, item):
        pooled.append(key)
        return real(self, key, item)

    monkeypatch.setattr(wrapper.MemoryPlanningState, "push", spy)
    return pooled


def test_planned_graphs_free_buffers_at_last_use(pooled):
    model, inputs = MODELS["gpt"]()
    torch.compile(model, backend=planner.backend(codegen="inductor", memory_budget=0.0, solver="greedy"))(*inputs).backward()
    assert not pooled  # no dead buffer waits in inductor's pool for a later one of its size
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):  # inductor on its own pools them
        torch.compile(model)(*inputs).backward()
    assert pooled


def test_inductor_options_reach_inductor_and_unknown_ones_are_refused(pooled):
    model, inputs = MODELS["gpt"]()
    options = {"allow_buffer_reuse": True}  # the pool back on, over the planner's own setting
    torch.compile(model, backend=planner.backend(codegen="inductor", memory_budget=0.0, solver="greedy",
                                                 inductor_options=options))(*inputs).backward()
    assert pooled
    torch._dynamo.reset()
    bad = planner.backend(codegen="inductor", solver="greedy", inductor_options={"no_such_setting": 1})
    with pytest.raises(Exception, match="inductor has no setting no_such_setting"):
        torch.compile(model, backend=bad)(*inputs)


@pytest.mark.parametrize("budget, options, padding", [(0.0, {}, False), (0.5, {}, True),
                                                      (0.0, {"shape_padding": True}, True)])
def test_budget_zero_plans_graphs_inductor_pads_no_matrix_products_in(monkeypatch, budget, options, padding):
    """Inductor times each pad on the device while compiling, so a padded graph's least peak
    changed from run to run; at budget 0 the graph is captured and compiled without pads, unless
    ``inductor_options`` say otherwise."""
    import planner.api
    import planner.compiler

    seen = []
    real_solve, real_capture = planner.compiler.solve_graph, planner.api.capture

    def solve(*args, **kwargs):  # runs inside inductor's compile, under the planner's settings
        seen.append(torch._inductor.config.shape_padding)
        return real_solve(*args, **kwargs)

    def capture(*args, **kwargs):
        seen.append(kwargs["inductor_options"].get("shape_padding", True))
        return real_capture(*args, **kwargs)

    monkeypatch.setattr(planner.compiler, "solve_graph", solve)
    monkeypatch.setattr(planner.api, "capture", capture)
    assert torch._inductor.config.shape_padding  # inductor's default, which torch.compile keeps
    model, inputs = MODELS["mlp"]()
    settings = dict(memory_budget=budget, solver="greedy", codegen="inductor", inductor_options=options)
    torch.compile(model, backend=planner.backend(**settings))(*inputs).sum().backward()
    planner.plan(model, inputs, config=planner.PlannerConfig(**settings))
    assert seen == [padding, padding]


def test_pytorch_partition_splits_a_joint_graph():
    model, inputs = MODELS["mlp"]()
    joint = planner.capture(model, inputs)
    forward, backward = _torch_compat.pytorch_partition()(joint.module, joint.joint_inputs,
                                                          num_fwd_outputs=joint.num_fwd_outputs)
    assert isinstance(forward, torch.fx.GraphModule) and isinstance(backward, torch.fx.GraphModule)
    assert any(n.op == "placeholder" and "tangents" in str(n.target) for n in backward.graph.nodes)


def test_pytorch_saved_names_are_joint_nodes_and_leave_the_joint_alone():
    model, inputs = MODELS["cnn"]()
    joint = planner.capture(model, inputs)
    before = [n.format_node() for n in joint.graph.nodes]
    names = _torch_compat.pytorch_saved_names(joint.copy().module, joint.joint_inputs, joint.num_fwd_outputs)
    nodes = {n.name: n for n in joint.graph.nodes}
    assert names and all(name in nodes for name in names)
    assert not any(nodes[name].name.startswith("tangents") for name in names)
    assert [n.format_node() for n in joint.graph.nodes] == before


class _TwiceComputed(torch.nn.Module):
    """One expression of the input written twice, read by two projections."""

    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(16, 16) / 4)
        self.w2 = torch.nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x):
        return ((x * 2).tanh() @ self.w1).square().mean() + ((x * 2).tanh() @ self.w2).square().mean()


def test_a_joint_graph_computes_a_repeated_expression_once_as_pytorchs_partitioner_does():
    """The joint graph the planner plans has its common subexpressions merged (PyTorch's
    partitioner merges them before it splits): the expression written twice is one ``tanh``,
    saved once, and the planned step trains like eager."""
    torch.manual_seed(0)
    model, x = _TwiceComputed(), torch.randn(32, 16)
    joint = planner.capture(model, [x])
    tanh = [n for n in joint.forward_nodes if n.target is torch.ops.aten.tanh.default]
    assert len(tanh) == 1
    merged_again = _torch_compat.merge_common_subexpressions(joint.copy().module)
    assert len(merged_again.graph.nodes) == len(joint.graph.nodes)  # nothing left to merge
    twin = _TwiceComputed()
    twin.load_state_dict(model.state_dict())
    planner.compile(twin, memory_budget=1.0, codegen="eager", solver="greedy", time_limit=5)(x).backward()
    model(x).backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=0, msg=name)


def test_a_node_the_split_made_anew_is_not_taken_for_a_joint_node_of_its_name():
    """A split can move a node into the forward under the name of another node of the joint
    graph. Told what each known node reads, the saved value is named by the node it really
    is, found through its inputs."""
    def graph_of(build):
        graph = torch.fx.Graph()
        build(graph)
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    def forward(graph):
        x = graph.placeholder("x")
        a = graph.call_function(torch.ops.aten.relu.default, (x,), name="a")
        b = graph.call_function(torch.ops.aten.permute.default, (a, [1, 0]), name="b")  # made anew
        graph.output((b,))

    def backward(graph):
        b = graph.placeholder("b")
        graph.output((graph.call_function(torch.ops.aten.neg.default, (b,)),))

    fwd, bwd = graph_of(forward), graph_of(backward)
    known, inputs_of = {"a", "b", "c"}, {"a": [], "b": ["c"], "c": []}  # the joint's b reads c
    assert _torch_compat.split_saved_names(fwd, bwd, known) == ["b"]
    assert _torch_compat.split_saved_names(fwd, bwd, known, inputs_of) == ["a"]


def test_is_fake_tells_a_compiles_fake_tensors_from_real_ones():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ones(3)
    assert _torch_compat.is_fake(fake) and not _torch_compat.is_fake(torch.ones(3))


def test_as_traced_strides_lays_a_tensor_out_with_the_stride_asked_for():
    strided = torch.arange(24.0).view(2, 3, 4).permute(0, 2, 1)
    contiguous = _torch_compat.as_traced_strides()(strided, [12, 3, 1])
    assert contiguous.stride() == (12, 3, 1)
    torch.testing.assert_close(contiguous, strided)
    # inductor lays it out as asked too
    compiled = torch.compile(lambda t: _torch_compat.as_traced_strides()(t + 1, [12, 3, 1]), backend="inductor")
    assert compiled(strided).stride() == (12, 3, 1)


def test_inductor_fixes_layout_for_fused_attention_and_not_for_a_matrix_product():
    from planner._torch_compat import inductor_fixes_layout

    aten = torch.ops.aten
    assert inductor_fixes_layout(aten._scaled_dot_product_efficient_attention_backward.default)
    assert inductor_fixes_layout(aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert not inductor_fixes_layout(aten.mm.default)
    assert not inductor_fixes_layout(aten.mm)  # a packet, not an overload


def test_storage_weakref_expires_when_no_view_holds_the_storage():
    from planner._torch_compat import storage_weakref

    x = torch.randn(8)
    ref = storage_weakref(x)
    view = x[2:]
    del x
    assert not ref.expired()  # the view still uses the storage
    del view
    assert ref.expired()


def test_a_graph_module_made_lazily_runs_as_one_made_at_once():
    from planner._torch_compat import graph_module, lazy_graph_modules

    traced = torch.fx.symbolic_trace(lambda x: torch.tanh(x) * 2 + 1)
    x = torch.randn(3, 4)
    with lazy_graph_modules():
        lazy = graph_module(traced, traced.graph)
    eager = graph_module(traced, traced.graph)
    assert isinstance(lazy, torch.fx.GraphModule) and isinstance(eager, torch.fx.GraphModule)
    assert torch.equal(lazy(x), traced(x)) and torch.equal(eager(x), traced(x))
    assert "tanh" in lazy.code  # its code is written when read


class _LongExpression(torch.nn.Module):
    """A product, then a pointwise chain of 40 ops (no ``exp``, which the CPU stores on reuse
    anyway; no fan-out, whose inlined expressions grow exponentially) that two reductions over
    different axes read: two kernels."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32, 48) / 6)

    def forward(self, x):
        h = x @ self.w
        y = h
        for _ in range(40):
            y = y.sin()
        return y.sum(0).square().sum() + y.amax(1).sum()


def test_planned_graphs_compute_a_long_expression_in_each_reader_as_the_memory_model_counts_it():
    """Inductor stores a value several kernels read once its expression exceeds
    ``realize_opcount_threshold`` ops (30 on a GPU); the memory model counts stored reads only,
    so planned graphs raise that bar to :data:`planner._torch_compat.REALIZE_OPCOUNT`. Under the
    GPU's bar, inductor stores the 40-op expression here (a second (128, 48) buffer in the
    forward); the planned forward, compiled under the same outer setting, holds only the product,
    and the simulation stores nothing for the expression either."""
    from torch._inductor.utils import run_and_get_code

    x = torch.randn(128, 32)
    with torch._inductor.config.patch(realize_opcount_threshold=30):  # inductor's bar on a GPU
        _, (stock, *_) = run_and_get_code(torch.compile(_LongExpression(), backend="inductor"), x)
        assert stock.count("empty_strided_cpu((128, 48)") == 2  # the product and the expression
        torch._dynamo.reset()
        # greedy: a plan that does not depend on a solver's time limit (under load, a timed-out
        # exact solve may save one of the expression's values, a second such buffer)
        config = planner.PlannerConfig(memory_budget=0.0, codegen="inductor", solver="greedy")
        plan = planner.plan(_LongExpression(), [x], config)
        assert not any(name.startswith("sin") for name in plan.decision.saved)
        _, (forward, *_) = run_and_get_code(lambda: plan.module(x).backward())
    assert forward.count("empty_strided_cpu((128, 48)") == 1  # the product alone
    timeline = plan.timeline
    assert max(b for phase, _, b in timeline.steps if phase == "forward") < 2 * 128 * 48 * 4  # one such buffer


def test_inductor_prefers_channels_last_agrees_with_inductor_on_the_planned_forward(monkeypatch):
    from torch._inductor.graph import GraphLowering

    found = []
    real = GraphLowering.find_nodes_prefer_channels_last

    def spy(self):
        answer = real(self)
        found.append((self.module.graph, set(answer)))
        return answer

    monkeypatch.setattr(GraphLowering, "find_nodes_prefer_channels_last", spy)
    model, inputs = MODELS["cnn"]()
    torch.compile(model, backend=planner.backend(codegen="inductor", memory_budget=1.0, solver="greedy"))(*inputs).backward()
    graph, answer = found[0]  # the forward
    assert any(n.target is torch.ops.aten.convolution.default for n in answer)
    assert _torch_compat.inductor_prefers_channels_last(graph) == answer


def test_inductor_lays_out_convolution_gradient_says_whether_its_lowering_lays_it_out(monkeypatch):
    """Where inductor lowers a convolution backward itself, the lowering lays out the gradient it
    reads (channels-last, or the order of the weight's gradient); a fallback lays out nothing."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    laying_out = []
    for name in ("require_channels_last", "require_stride_order"):
        real = getattr(ir.ExternKernel, name).__func__

        def spy(cls, x, *args, _real=real, **kwargs):
            laying_out.append(getattr(V.graph.current_node, "target", None))
            return _real(cls, x, *args, **kwargs)

        monkeypatch.setattr(ir.ExternKernel, name, classmethod(spy))
    model, inputs = MODELS["cnn"]()
    torch.compile(model, backend=planner.backend(codegen="inductor", memory_budget=1.0, solver="greedy"))(*inputs).backward()
    assert torch.ops.aten.convolution.default in laying_out  # the forward's, laid out channels-last
    lowered = torch.ops.aten.convolution_backward.default in laying_out
    assert _torch_compat.inductor_lays_out_convolution_gradient() == lowered


def _stores(model_and_inputs=None, **options):
    model, inputs = model_and_inputs or MODELS["cnn"]()
    backend = planner.backend(codegen="inductor", memory_budget=0.0, solver="greedy", inductor_options=options)
    torch.compile(model, backend=backend)(*inputs).backward()
    (found,) = backend.stores_against_inductor()
    return found, backend


def test_the_buffers_inductor_keeps_are_compared_with_the_simulation_by_node():
    """What the code inductor wrote keeps (``kept_buffers``) is set against the simulation's
    stores per phase. With inductor's bar for storing a value several kernels read lowered to 0
    reads (``realize_reads_threshold``; the memory model computes such a value in each reader up
    to ``REALIZE_READS``), inductor stores values the simulation computes in their readers: the
    report names more values missed, each one the simulation had computed in its readers. The library kernels' outputs (convolutions) are stored by both, so named in neither
    list."""
    fused, _ = _stores()
    stored_more, backend = _stores(realize_reads_threshold=0)
    assert set(fused) == set(stored_more) == {"forward", "backward"}
    more = {(phase, name) for phase, found in stored_more.items() for name in found["unmodelled"]}
    assert more > {(phase, name) for phase, found in fused.items() for name in found["unmodelled"]}
    stored = backend.timelines[0].stored
    for phase, found in stored_more.items():
        assert all(stored[(phase, name)] == 0 for name in found["unmodelled"])
        assert all(stored[(phase, name)] > 0 for name in found["unstored"])
    named = {name for report in (fused, stored_more) for found in report.values() for names in found.values()
             for name in names}
    assert named and not any(name.startswith("convolution") for name in named)


def test_the_compiled_prediction_counts_what_inductor_stores():
    """``compiled_timelines`` simulates each graph again with the values inductor's code stores
    that the simulation had fused counted stored, at inductor's bytes; ``simulate(stored=...)``
    counts a value so whatever the rules say (here a fused value given a gigabyte: the peak holds
    it)."""
    from planner.memory import simulate

    found, backend = _stores(realize_reads_threshold=0)
    (compiled,) = backend.compiled_timelines()
    assert compiled is not None and backend.compiled_step_peak is not None
    for phase, report in found.items():
        assert report["unmodelled"]
        for name, nbytes in report["unmodelled"].items():
            assert compiled.stored[(phase, name)] == nbytes
    forward, backward, outputs, released = backend._emitted[0]
    plain = backend.timelines[0]
    name = next(name for (phase, name), nbytes in plain.stored.items() if phase == "backward" and nbytes == 0)
    forced = simulate(forward, backward, outputs, fuse=True, released=released, stored={("backward", name): 2**30})
    assert forced.stored[("backward", name)] == 2**30 and forced.peak >= 2**30 > plain.peak


def test_a_buffer_holding_a_value_the_simulation_wrote_in_place_is_no_difference():
    """Inductor names a buffer by the nodes computed into it, latest first (a fused kernel's cast
    after the product it casts). Where the simulation wrote the latest in place of an input (its
    ``written_in_place``), the buffer holds that value, not the fused one before it: ResNet-50's
    batch-norm gradients on an H200, named by the float32 product inside the bf16 cast written
    in place, had counted 196 MiB a layer twice in the compiled prediction."""
    from planner.memory import stores_against_inductor

    _, backend = _stores()
    timeline = backend.timelines[0]
    phase, written = next(iter(sorted(timeline.written_in_place)))
    fused = next(name for (where, name), nbytes in timeline.stored.items() if where == phase and nbytes == 0)
    lowered = frozenset({written, fused})
    found = stores_against_inductor(timeline, {phase: ([(4096, (written, fused))], lowered)})
    assert found[phase] == {"unmodelled": {}, "unstored": {}}
    found = stores_against_inductor(timeline, {phase: ([(4096, (fused, written))], lowered)})
    assert found[phase]["unmodelled"] == {fused: 4096}


def test_a_buffer_named_by_a_fused_value_after_a_stored_one_of_its_bytes_is_that_values_storage():
    """Inductor names a buffer by the nodes computed into it, latest first: a kernel that makes a
    value the simulation stores and then one it computes in its readers (an attention mask's
    ``where``, then its ``clone``) stores one buffer, named by the later. Where the stored value
    of the buffer's bytes is held by no other buffer, that is its storage, not a value the
    simulation misses (Cohere's and Nemotron's masks on an H200, counted twice in the compiled
    prediction); of other bytes, or held elsewhere, the fused value is still unmodelled."""
    from planner.memory import stores_against_inductor

    _, backend = _stores()
    timeline = backend.timelines[0]
    phase = "backward"
    fused = next(name for (where, name), nbytes in timeline.stored.items() if where == phase and nbytes == 0)
    stored, size = next((name, nbytes) for (where, name), nbytes in timeline.stored.items()
                        if where == phase and nbytes and (phase, name) not in timeline.written_in_place)
    lowered = frozenset({fused, stored})
    found = stores_against_inductor(timeline, {phase: ([(size, (fused, stored))], lowered)})
    assert found[phase] == {"unmodelled": {}, "unstored": {}}
    found = stores_against_inductor(timeline, {phase: ([(size + 512, (fused, stored))], lowered)})
    assert found[phase] == {"unmodelled": {fused: size + 512}, "unstored": {stored: size}}
    found = stores_against_inductor(timeline, {phase: ([(size, (stored,)), (size, (fused, stored))], lowered)})
    assert found[phase] == {"unmodelled": {fused: size}, "unstored": {}}


def test_a_buffer_for_a_pointwise_copy_of_a_stored_value_the_code_renamed_is_that_values_storage():
    """Where inductor's passes renamed the stored value, no buffer names it: a buffer named by a
    pointwise op the simulation computes in its readers, of one input, that input a value the
    simulation stores of the buffer's bytes and no buffer holds, is that value's storage (Llama's
    and Nemotron's attention masks on an H200: the ``where`` stored by the simulation, renamed
    by inductor, and the ``clone`` of it that names the buffer). Found through the phase's graph;
    without it, of other bytes, or with the value held by a buffer of its own, the pointwise
    value is unmodelled."""
    from planner.memory import fusible, stores_against_inductor

    _, backend = _stores()
    timeline, (_, backward) = backend.timelines[0], backend._emitted[0][:2]
    phase, graphs = "backward", {"backward": backward.graph}
    own = {name: nbytes for (where, name), nbytes in timeline.stored.items() if where == phase}
    fused, stored = next((node.name, node.all_input_nodes[0].name) for node in backward.graph.nodes
                         if own.get(node.name) == 0 and fusible(node) and len(node.all_input_nodes) == 1
                         and own.get(node.all_input_nodes[0].name)
                         and (phase, node.all_input_nodes[0].name) not in timeline.written_in_place)
    size, lowered = own[stored], frozenset({fused})  # the stored value lowered under another name
    assert stores_against_inductor(timeline, {phase: ([(size, (fused,))], lowered)}, graphs)[phase] == \
        {"unmodelled": {}, "unstored": {}}
    assert stores_against_inductor(timeline, {phase: ([(size, (fused,))], lowered)})[phase] == \
        {"unmodelled": {fused: size}, "unstored": {}}
    assert stores_against_inductor(timeline, {phase: ([(size + 512, (fused,))], lowered)}, graphs)[phase] == \
        {"unmodelled": {fused: size + 512}, "unstored": {}}
    held = stores_against_inductor(timeline, {phase: ([(size, (stored,)), (size, (fused,))], lowered | {stored})}, graphs)
    assert held[phase] == {"unmodelled": {fused: size}, "unstored": {}}


def test_a_buffer_named_first_by_an_op_of_several_outputs_holds_one_of_them():
    """A library kernel of several outputs (a convolution's backward, fused attention) has a
    buffer per output named by the kernel's node first, then by the nodes computed into its
    inputs: the buffer holds the kernel's output, not a value computed in its readers named
    after it (Llama's attention outputs had been taken for the grouped keys' ``clone``). Without
    the phase's graph, the first value the simulation has is still taken."""
    from planner.memory import stores_against_inductor

    _, backend = _stores()
    timeline, (_, backward) = backend.timelines[0], backend._emitted[0][:2]
    phase, graphs = "backward", {"backward": backward.graph}
    own = {name: nbytes for (where, name), nbytes in timeline.stored.items() if where == phase}
    several = next(n.name for n in backward.graph.nodes if isinstance(n.meta.get("val"), tuple))
    fused = next(name for name, nbytes in own.items() if nbytes == 0)
    kept = {phase: ([(4096, (several, fused))], frozenset({several, fused}))}
    assert stores_against_inductor(timeline, kept, graphs)[phase]["unmodelled"] == {}
    assert stores_against_inductor(timeline, kept)[phase]["unmodelled"] == {fused: 4096}


def test_the_user_is_told_once_where_what_inductor_stores_raises_a_graphs_peak_over_its_plan():
    """Once a graph has trained its counted steps, the backend simulates it again counting what
    inductor's code stores; where that peak is more than ``STORES_TOLD`` over the plan's, a
    warning names the values and both peaks. With inductor storing every pointwise value that
    reads two stored inputs (``realize_opcount_threshold`` 0), the test CNN's graph is told once,
    over five steps; with the planner's own settings it is not."""
    import warnings

    from planner.compiler import COUNTED_STEPS, STORES_TOLD

    def told(options):
        model, inputs = MODELS["cnn"]()
        backend = planner.backend(codegen="inductor", memory_budget=0.0, solver="greedy", inductor_options=options)
        step = torch.compile(model, backend=backend)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(COUNTED_STEPS + 2):
                step(*inputs).backward()
        (compiled,) = backend.compiled_timelines()
        return [str(w.message) for w in caught if "stores values the memory model computes" in str(w.message)], \
            compiled.peak / backend.timelines[0].peak - 1

    messages, over = told({"realize_opcount_threshold": 0})
    assert over > STORES_TOLD and len(messages) == 1
    assert f"({over:+.1%})" in messages[0] and "compiled_step_peak" in messages[0]
    messages, over = told({})
    assert over <= STORES_TOLD and messages == []


@pytest.fixture
def own_decisions(monkeypatch, tmp_path):
    """Decisions solved here are kept apart from every other test's (memory and disk cache)."""
    from planner.decisions import forget_decisions

    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    forget_decisions()
    yield
    forget_decisions()


def _dropping_polish(monkeypatch):
    """Budget 0's polish, made to drop one more save (the last the solver kept), as it drops one
    alive at the simulated peak; the name dropped is returned in a list once it has run."""
    import planner.solve as solve
    from planner.decision import with_plan
    from planner.problem import evaluate_names

    real, dropped = solve.least_peak_polish, []

    def polish(joint, problem, decision, fuse=True, checks=None):
        out = real(joint, problem, decision, fuse, checks)
        report = dict(out.stats.get("polish") or {})
        victim = out.saved[-1]
        plan = evaluate_names(problem, tuple(n for n in out.saved if n != victim))
        report["dropped"] = [*report.get("dropped", []), victim]
        dropped.append(victim)
        return with_plan(problem, out, plan, stats={**out.stats, "polish": report})

    monkeypatch.setattr(solve, "least_peak_polish", polish)
    return dropped


def _train(backend, steps, model_and_inputs=None):
    model, inputs = model_and_inputs or MODELS["cnn"]()
    step = torch.compile(model, backend=backend)
    grads = []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        step(*inputs).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return model, inputs, grads


def test_a_polish_drop_the_compiled_code_contradicts_is_tried_again_and_undone_where_the_code_holds_no_less(
        monkeypatch, own_decisions):
    """Where the code inductor wrote for a budget-0 plan holds more than its prediction
    (``compiled_timelines``), the graph, planned again after its first step, gets back the saves
    the polish dropped (``restore_polish_drops``) if that plan is predicted lower than the code
    found; once the restored plan's own code is read, it stays only if that holds less. Here
    inductor stores every pointwise value reading two stored inputs (``realize_opcount_threshold``
    0), whatever is saved: the restored plan's code holds as much, so the first plan runs again;
    every step trains as eager does."""
    from planner.compiler import COUNTED_STEPS

    dropped = _dropping_polish(monkeypatch)
    backend = planner.backend(codegen="inductor", memory_budget=0.0, inductor_options={"realize_opcount_threshold": 0})
    model, inputs, grads = _train(backend, COUNTED_STEPS + 2)
    tried, undone = backend.polish_restores
    assert tried["outcome"] == "restored" and tried["dropped"] == dropped[:1]
    assert tried["restored_peak"] < tried["compiled_peak"]
    assert undone["outcome"] == "reverted" and undone["restored_code_peak"] >= undone["compiled_peak"]
    assert dropped[0] not in backend.graphs[0].decision.saved and backend.replanned
    torch.manual_seed(0)
    twin, _ = MODELS["cnn"]()
    twin.load_state_dict(model.state_dict())
    twin(*inputs).backward()
    for step_grads in grads:
        for got, p in zip(step_grads, twin.parameters()):
            torch.testing.assert_close(got, p.grad, atol=1e-5, rtol=0)


def test_a_restored_polish_drop_stays_where_its_code_holds_less(monkeypatch, own_decisions):
    """The other way: where the restored plan's code, read once compiled, holds less than the
    code it replaced (its compiled prediction here taken as its plan's, as where what inductor
    stored was the drop's doing), the restored plan keeps running, saving what the polish had
    dropped."""
    from planner.compiler import COUNTED_STEPS, PlannerBackend

    dropped = _dropping_polish(monkeypatch)
    real = PlannerBackend._compiled_timeline

    def compiled(self, index, report=None):
        restored = "restored" in (self.graphs[index].decision.stats.get("polish") or {})
        return self.timelines[index] if restored else real(self, index, report)

    monkeypatch.setattr(PlannerBackend, "_compiled_timeline", compiled)
    settings = dict(codegen="inductor", memory_budget=0.0, inductor_options={"realize_opcount_threshold": 0})
    backend = planner.backend(**settings)
    _train(backend, COUNTED_STEPS + 2)
    assert [r["outcome"] for r in backend.polish_restores] == ["restored", "kept"]
    assert dropped[0] in backend.graphs[0].decision.saved
    # kept in the decision cache in place of the first: a later process compiles it from the start
    from planner.decisions import forget_decisions

    forget_decisions()
    torch._dynamo.reset()
    later = planner.backend(**settings)
    _train(later, 1)
    assert later.graphs[0].decision.stats.get("reused") == "disk" and len(dropped) == 1
    assert dropped[0] in later.graphs[0].decision.saved


class _SqueezeExcite(torch.nn.Module):
    """SiLU convolutions and a sigmoid gate over pooled channels (an MBConv block's), in bf16: the
    SiLU's ``sigmoid`` is read twice in its gradient, and the casts around it by several
    kernels, values whose expression computes an op inductor's CPU code stores on reuse."""

    def __init__(self, c=16):
        super().__init__()
        self.conv, self.fc, self.conv2 = (torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.Conv2d(c, c, 1),
                                          torch.nn.Conv2d(c, c, 3, padding=1))

    def forward(self, x):
        h = torch.nn.functional.silu(self.conv(x))
        h = h * torch.sigmoid(self.fc(h.mean((2, 3), keepdim=True)))
        return torch.nn.functional.silu(self.conv2(h)).square().mean()


def test_on_the_cpu_a_reused_value_computing_a_heavy_op_is_stored_as_inductor_stores_it():
    """Inductor on a CPU stores a value several kernels read once its expression computes
    ``exp``, ``log``, ``sigmoid`` or ``tanh``, even where its readers then run in one kernel
    (``should_realize_on_reuse``), so the expressions reading it load it. On a squeeze-excite
    block in bf16, the report of what inductor's code stores then names no cast the simulation
    fused, and in the backward nothing but a reduction (before the rule: the SiLU's recomputed
    ``sigmoid`` in the backward, and the casts over it in both phases)."""
    torch.manual_seed(0)
    found, _ = _stores((_SqueezeExcite().to(torch.bfloat16), [torch.randn(4, 16, 16, 16, dtype=torch.bfloat16)]))
    missed = [name for report in found.values() for name in report["unmodelled"]]
    assert not [name for name in missed if name.startswith("convert_element_type")], missed
    assert not [name for name in found["backward"]["unmodelled"] if not name.startswith(("sum", "mean", "amax"))], found


def test_saved_values_sharing_a_storage_are_not_donated_to_the_backward():
    """A saved value and a view of it, two inputs of the backward: AOTAutograd donates both, and
    inductor may write into the value after its last direct read while the view is still to be
    read. Only inputs sharing no storage with another stay donated."""
    from types import SimpleNamespace

    from torch._guards import TracingContext, tracing

    from planner._torch_compat import undonate_aliased_inputs

    base, other = torch.randn(4, 6), torch.randn(3)
    graph = torch.fx.Graph()
    for name, val in (("value", base), ("view", base.t()), ("alone", other), ("tangents_1", torch.randn(2))):
        graph.placeholder(name).meta["val"] = val
    graph.output(None)
    backward = torch.fx.GraphModule(torch.nn.Module(), graph)
    context = TracingContext(None)
    context.fw_metadata = SimpleNamespace(bw_donated_idxs=[0, 1, 2])
    with tracing(context):
        assert undonate_aliased_inputs(backward) == [0, 1]
    assert context.fw_metadata.bw_donated_idxs == [2]
    with tracing(context):  # nothing left to take out
        assert undonate_aliased_inputs(backward) == []
