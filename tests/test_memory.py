"""The memory simulator: equal to a count over real storages, and consistent with the schedule."""
import contextlib
import re

import numpy as np
import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

import planner
from estimators import get_estimator
from planner._torch_compat import FUSION_DISTANCE, tangents_held_through_backward
from planner.bounds import min_memory_plan, runtime_optimal_plan
from planner.build import build_problem
from planner.emit import emit
from planner.memory import simulate
from planner.problem import evaluate_names, memory_profile
from solvers import get_solver
from tests.models import MODELS

aten = torch.ops.aten


def _forward(x, w):
    h = torch.mm(x, w)                       # a fresh storage
    v = h.view(-1)                           # a view: no new storage
    a, b = torch.split(h, 2, dim=1)          # views of h, through getitems
    var, mean = torch.var_mean(a, dim=0)     # a multi-output op: two storages
    r = torch.relu(b).clone()
    r.add_(1.0)                              # in place: writes r's storage
    loss = (v.sum() + var.sum() + mean.sum() + r.sum())
    return loss, h, r


def _backward(h, r, tangent):
    g = torch.mul(h, tangent)
    t = g.t()
    k = torch.mm(t, r)
    k.mul_(2.0)
    return k, torch.sum(g, 0)


def _traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def _real_count(gm: fx.GraphModule, args: list, phase: str, held_ptrs: dict, keep_outputs: bool,
                kept_extra: set = frozenset()) -> tuple[list, list]:
    """Bytes alive after each call_function node, by brute force over the real storages.

    Runs the graph on real tensors, records each value's storage pointer, and counts at each
    step every storage made in the step whose pointer is read at that step or later (or kept).
    """
    env, order = {}, []
    placeholders = iter(args)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders)
        elif node.op == "call_function":
            call_args, call_kwargs = fx.map_arg((node.args, node.kwargs), env.__getitem__)
            env[node] = node.target(*call_args, **call_kwargs)
            order.append(node)
        elif node.op == "output":
            outputs = [env[o] for o in node.args[0] if isinstance(o, fx.Node)]

    def ptrs(value):
        if isinstance(value, (tuple, list)):  # outputs of multi-output ops, nested tuples too
            return {p: size for item in value for p, size in ptrs(item).items()}
        return {value.untyped_storage().data_ptr(): value.untyped_storage().nbytes()} if isinstance(value, torch.Tensor) else {}

    before = {p for a in args for p in ptrs(a)} - set(held_ptrs)
    made, reads = dict(held_ptrs), {}
    tangent = ptrs(args[-1]) if phase == "backward" else {}
    for p, size in tangent.items():  # the backward's tangent is made for the step
        made[p] = (-1, size)
        before.discard(p)
    for k, node in enumerate(order):
        for p, size in ptrs(env[node]).items():
            if p not in before and p not in made:
                made[p] = (k, size)
        for inp in node.all_input_nodes:
            for p in ptrs(env[inp]):
                reads[p] = k
    kept = ({p for o in outputs for p in ptrs(o)} if keep_outputs else set()) | set(kept_extra)
    if tangents_held_through_backward():  # the tangent too, until the backward returns (the engine holds it)
        kept |= set(tangent)
    counts = []
    for k, node in enumerate(order):
        alive = [size for p, (start, size) in made.items() if start <= k and (p in kept or reads.get(p, start) >= k)]
        counts.append((phase, node.name, sum(alive)))
    return counts, outputs


def _simulated_and_counted(forward_fn, backward_fn):
    """The simulated timeline of a traced forward and backward, and a brute-force count of the
    same steps over real storages. The forward returns the loss and then the saved values."""
    x, w = torch.randn(8, 6), torch.randn(6, 4)
    forward = _traced(forward_fn, x, w)
    saved = list(forward(x, w)[1:])
    backward = _traced(backward_fn, *saved, torch.ones(()))
    timeline = simulate(forward, backward, num_fwd_outputs=1)

    fwd_counts, outs = _real_count(forward, [x, w], "forward", {}, keep_outputs=True)
    # the backward holds the forward's user output (kept) and the saved values (until last read)
    stored = {o.untyped_storage().data_ptr(): (-1, o.untyped_storage().nbytes()) for o in outs}
    bwd_counts, _ = _real_count(backward, [*outs[1:], torch.ones(())], "backward", stored, keep_outputs=True,
                                kept_extra={outs[0].untyped_storage().data_ptr()})
    return forward, timeline, fwd_counts + bwd_counts


def test_simulation_equals_a_count_over_real_storages():
    _, timeline, expected = _simulated_and_counted(_forward, _backward)
    assert [s[:2] for s in timeline.steps] == [s[:2] for s in expected]
    assert list(timeline.steps) == expected
    assert timeline.peak == max(b for _, _, b in expected)


def _random_forward(x, w):
    from planner._torch_compat import run_and_save_rng_state

    h = torch.mm(x, w)
    state, (out, mask) = run_and_save_rng_state()(aten.native_dropout.default, h, 0.5, True)  # nested outputs
    loss = torch.relu(out).sum()
    return loss, state, mask


def _random_backward(state, mask, tangent):
    return (torch.mul(mask, tangent) * 2.0,)


def test_simulation_counts_outputs_nested_in_tuples():
    forward, timeline, expected = _simulated_and_counted(_random_forward, _random_backward)
    assert list(timeline.steps) == expected
    dropout = next(n for n in forward.graph.nodes if "run_and_save_rng_state" in str(n.target))
    assert any(name == dropout.name and size >= 8 * 4 * 4 for _, name, size in timeline.steps)  # out and mask


def _bound_and_simulated(name, fraction, codegen):
    fuse = codegen == "inductor"
    model, inputs = MODELS[name]()
    joint = planner.capture(model, inputs, codegen=codegen)
    problem = build_problem(joint, get_estimator("flops"), fuse=fuse)
    decision = get_solver("cpsat").solve(problem, planner.Budget(fraction=fraction).resolve(problem))
    forward, backward = emit(joint, problem, decision.saved)
    plan = evaluate_names(problem, decision.saved)
    # views and inlined constants cost nothing, values made for the backward are computed once
    recomputes = bool((plan.recomputed & problem.saveable & (problem.runtime > 0)).any())
    return decision.peak_bytes, simulate(forward, backward, joint.num_fwd_outputs, fuse=fuse).peak, recomputes


@pytest.mark.parametrize("name", ["gpt", "cnn", "views_inplace"])
@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_the_solvers_bound_is_at_least_the_simulated_peak(name, fraction):
    # The schedule counts the copies made for a step as alive together, an upper bound; with
    # no recomputation beyond views it is exact.
    bound, simulated, recomputes = _bound_and_simulated(name, fraction, "eager")
    assert simulated <= bound
    if not recomputes:
        assert simulated == bound


@pytest.mark.parametrize("name", ["gpt", "cnn"])
@pytest.mark.parametrize("end", ["least memory", "fastest"])
def test_with_inductor_fusion_the_schedule_bounds_the_simulation(name, end):
    # Each was once under: a recomputed copy fused into its readers reads its inputs until its
    # last reader (gpt); a multi-output op's outputs are made together (the CNN's max-pool).
    model, inputs = MODELS[name]()
    problem = build_problem(planner.capture(model, inputs, codegen="inductor"), get_estimator("flops"), fuse=True)
    plan = min_memory_plan(problem) if end == "least memory" else runtime_optimal_plan(problem)
    joint = planner.capture(model, inputs, codegen="inductor")
    forward, backward = emit(joint, problem, [problem.names[i] for i in np.flatnonzero(plan.saved)])
    timeline = simulate(forward, backward, joint.num_fwd_outputs, fuse=True)
    bound = memory_profile(problem, plan)
    assert timeline.peak <= bound.peak
    if end == "least memory":  # every recomputable value recomputed: bounded at every step
        simulated = {step: b for phase, step, b in timeline.steps if phase == "backward"}
        steps = [(step, int(bound.backward[t]), simulated[step])
                 for t, step in enumerate(problem.schedule.step_names) if step in simulated]
        assert len(steps) > len(bound.backward) // 2
        assert [s for s in steps if s[2] > s[1]] == []


@pytest.mark.parametrize("name", ["gpt", "cnn"])
def test_with_inductor_fusion_the_bound_is_exact_without_recomputation(name):
    bound, simulated, recomputes = _bound_and_simulated(name, 1.0, "inductor")
    assert not recomputes and simulated == bound


def test_simulated_peak_never_rises_as_the_budget_falls():
    model, inputs = MODELS["gpt"]()
    peaks = []
    for fraction in (1.0, 0.6, 0.3, 0.0):
        torch._dynamo.reset()
        result = planner.plan(model, inputs, memory_budget=fraction, config=planner.PlannerConfig(codegen="eager"))
        result.module(*inputs).backward()
        peaks.append(result.timeline.peak)
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[-1]


def _shared_expression(a, b, c, d, two, steps):
    x = (a + b + c + d) * two + steps  # one pointwise expression, read by two kernels
    return x.sum(), (x * 2).amax()


def test_inductor_stores_a_shared_expression_only_when_it_loads_many_inputs():
    from planner.memory import readers, stored_bytes

    a, b, c, d = (torch.randn(64) for _ in range(4))

    def constants_inside(a, b, c, d):  # full and arange are computed in the kernels: no loads
        return _shared_expression(a, b, c, d, torch.full((64,), 2.0), torch.arange(64))

    for gm, stored in ((_traced(constants_inside, a, b, c, d), False),
                       (_traced(_shared_expression, a, b, c, d, torch.full((64,), 2.0), torch.arange(64)), True)):
        x = next(n for n in gm.graph.nodes if n.op == "call_function" and len(n.users) == 2)
        assert (stored_bytes(x, readers(x), fuse=True) > 0) == stored, gm.code


def _readers_meet(a, b, c, d, e, g, grad, w):
    """A value reading five stored inputs (bf16), read by three products that meet in one float32
    value, itself read by row sums, the pointwise op after them and a column sum: kernels apart."""
    v = ((a + b) * c + d) * e
    meet = grad * (v * 0.5 + (v * v) * (v * g))
    rows, total = (meet * w).sum(-1, keepdim=True), meet.sum(-1, keepdim=True)
    return meet * w - rows * grad - total, meet.sum(0)


def test_a_value_stored_on_reuse_keeps_its_buffer_where_its_readers_meet_in_a_value_several_kernels_compute():
    """Inductor stores a value that several nodes read, past REALIZE_READS stored inputs, as it
    lowers it: its readers' expressions then load it as one input. Where they meet in one value
    that several kernels compute, each loads the buffer, so it stays; the value where they meet
    reads few inputs and is computed in each kernel (Wav2Vec2's GELU input in its GroupNorm
    backward: 200 MiB on an H100). Inductor's CPU code, read here, stores the bfloat16 value and
    no float32 one but the output."""
    import re
    from torch._inductor.utils import run_and_get_code
    from planner.memory import readers, stored_bytes

    args = [torch.randn(64, 512, dtype=torch.bfloat16) for _ in range(5)] + [torch.randn(64, 512) for _ in range(3)]
    gm = _traced(_readers_meet, *args)
    stored = {n.meta["val"].dtype: stored_bytes(n, readers(n), fuse=True) for n in gm.graph.nodes
              if n.op == "call_function" and n.meta["val"].dim() == 2 and n.meta["val"].shape[0] == 64
              and stored_bytes(n, readers(n), fuse=True)}
    assert stored == {torch.bfloat16: 64 * 512 * 2, torch.float32: 64 * 512 * 4}  # the value, and the output

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(_readers_meet, backend="inductor"), *args)
    made = re.findall(r"empty_strided_cpu\(\(64, 512\), \(512, 1\), (torch\.\w+)\)", code)
    assert sorted(made) == ["torch.bfloat16", "torch.float32"], code


def test_inductor_constants_are_recomputed_not_saved():
    model, inputs = MODELS["gpt"]()
    problem = build_problem(planner.capture(model, inputs, codegen="inductor"), get_estimator("flops"), fuse=True)
    constants = [i for i, t in enumerate(problem.targets) if t.startswith(("prims.iota", "aten.full", "aten.scalar_tensor"))]
    assert constants and not problem.saveable[constants].any()
    assert not runtime_optimal_plan(problem).saved[constants].any()


def _accumulate(x, w, v):
    a = torch.sin(x)                 # a storage of its own, read only by the product
    p = torch.mm(a.t(), w)           # read only by the add at the end
    q = torch.mm(torch.cos(x).t(), v).relu()
    return p + q


def test_inductor_computes_a_product_added_later_where_the_add_is():
    """add(mm(a, b), c) becomes addmm(c, a, b) at the add (a tied weight's gradient): the
    product's inputs live until the add, and the product stores nothing of its own."""
    from planner.memory import kernel_steps, readers, stored_bytes

    x, w, v = torch.randn(256, 64), torch.randn(256, 32), torch.randn(256, 32)
    gm = _traced(_accumulate, x, w, v)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    product = next(n for n in nodes if n.target is aten.mm.default and n.args[0].args[0].target is aten.sin.default)
    add = next(n for n in nodes if n.target is aten.add.Tensor)
    assert stored_bytes(product, readers(product), fuse=True) == 0
    assert stored_bytes(product, readers(product), fuse=False) > 0
    assert kernel_steps(nodes, fuse=True)[product] == nodes.index(add)

    # what the rule follows: inductor's generated code has an addmm and one mm
    from torch._inductor.utils import run_and_get_code

    _, (code, *_) = run_and_get_code(torch.compile(_accumulate, backend="inductor"), x, w, v)
    assert code.count("extern_kernels.addmm(") == 1 and code.count("extern_kernels.mm(") == 1, code


def _accumulate_twice(x, w, v, u):
    return _accumulate(x, w, v) + u  # the sum is read by a pointwise op alone


def test_on_a_gpu_a_product_added_for_pointwise_readers_only_stays_apart(monkeypatch):
    """Inductor on a GPU keeps add(mm(a, b), c) unfused when every reader of the sum is
    pointwise (T5's tied embedding, whose gradient sum is added to again): the product is
    stored where it runs. Read by the output, it is still computed at the add. On a CPU the
    add fuses either way. (The device is the graph's values' own; "cpu" stands in for a GPU.)"""
    import planner.memory as memory

    x, w, v, u = torch.randn(256, 64), torch.randn(256, 32), torch.randn(256, 32), torch.randn(64, 32)
    for fn, args, gpu_fuses in ((_accumulate_twice, (x, w, v, u), False), (_accumulate, (x, w, v), True)):
        gm = _traced(fn, *args)
        product = next(n for n in gm.graph.nodes if n.target is aten.mm.default and n.args[0].args[0].target is aten.sin.default)
        assert memory.stored_bytes(product, memory.readers(product), fuse=True) == 0
        with monkeypatch.context() as patch:
            patch.setattr(memory, "_GPU_TYPES", ("cpu",))
            assert (memory.stored_bytes(product, memory.readers(product), fuse=True) == 0) == gpu_fuses


def _accumulate_after(x, w, y, steps: int):
    p = torch.mm(torch.sin(x).t(), w)  # its operands are made first: a tied weight's gradient
    for _ in range(steps):             # 2 nodes a step before the add
        y = y * 1.01 + 0.5
    return p + y


@pytest.mark.parametrize("steps", [4, 40])
def test_the_planners_compile_keeps_a_product_apart_from_an_add_far_from_its_operands(steps):
    """Inductor rewrites add(mm(a, b), c) into addmm(c, a, b) at the add; the planner's compile
    splits it again where the product's operands are made more than FUSION_DISTANCE nodes
    before the add (DeBERTa's logits gradient, alive through the whole backward otherwise), and
    the memory model stores the product where it runs there, and not when the add is near."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    from planner._torch_compat import products_apart
    from planner.memory import readers, stored_bytes

    x, w, y = torch.randn(256, 64), torch.randn(256, 32), torch.randn(64, 32)
    far = 2 * steps > FUSION_DISTANCE
    gm = _traced(lambda x, w, y: _accumulate_after(x, w, y, steps), x, w, y)
    product = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    assert (stored_bytes(product, readers(product), fuse=True) > 0) == far

    torch._dynamo.reset()
    with inductor_config.patch(post_grad_custom_post_pass=products_apart(), fx_graph_cache=False):
        fn = torch.compile(lambda x, w, y: _accumulate_after(x, w, y, steps), backend="inductor")
        out, (code, *_) = run_and_get_code(fn, x, w, y)
    assert ("extern_kernels.addmm(" in code) == (not far) and ("extern_kernels.mm(" in code) == far, code
    torch.testing.assert_close(out, _accumulate_after(x, w, y, steps))


def _late_sum(x, y):
    s = torch.sin(x).sum(0)                 # a reduction whose one reader is the add at the end
    t = torch.mm(y, y.t()).relu().sum(0)    # a product in between
    return s + t


def test_inductor_computes_a_reduction_in_its_pointwise_readers_kernel():
    """A reduction read by one pointwise op is computed in that op's kernel, however late (T5's
    per-layer position-bias gradients, summed after the last layer): its inputs live until then,
    and it stores nothing of its own."""
    from planner.memory import kernel_steps, readers, stored_bytes

    x, y = torch.randn(64, 64), torch.randn(64, 32)
    gm = _traced(_late_sum, x, y)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    sin = next(n for n in nodes if n.target is aten.sin.default)
    (reduction,) = sin.users
    add = next(n for n in nodes if n.target is aten.add.Tensor)
    assert stored_bytes(reduction, readers(reduction), fuse=True) == 0
    assert kernel_steps(nodes, fuse=True)[reduction] == kernel_steps(nodes, fuse=True)[sin] == nodes.index(add)

    # what the rule follows: inductor's generated code computes the sine after the product
    from torch._inductor.utils import run_and_get_code

    _, (code, *_) = run_and_get_code(torch.compile(_late_sum, backend="inductor"), x, y)
    calls = [line for line in code[code.index("def call("):].splitlines() if "extern_kernels.mm(" in line or "sin" in line]
    assert "extern_kernels.mm(" in calls[0] and "sin" in calls[-1], code


def _sum_then_layers(x, w, layers: int, products: bool):
    s = torch.sin(x).sum(0).double()  # a reduction read by a cast, which is computed in the add's kernel
    h, kept = x, []
    for i in range(layers):  # matrix products, or values stored for the caller (a kernel each)
        if products:
            h = torch.mm(h, w)
        else:
            kept.append(x * (i + 2))
    return h, *kept, x.cos().sum(0) + s  # which the add does not need


@pytest.mark.parametrize("layers,products", [(FUSION_DISTANCE // 4, False), (2 * FUSION_DISTANCE, False), (1, True)])
def test_a_backward_stores_a_reduction_its_reader_is_too_far_from(layers, products):
    """In a backward, the planner's compile refuses to fuse a reduction into a reader computed
    more than FUSION_DISTANCE kernels later (here a cast, computed in the add's kernel), or with
    a matrix product between them, so the memory model stores it where it runs and frees its
    inputs there; nearer, it is still computed in the reader's kernel."""
    from planner.memory import far_epilogues, kernel_steps, readers, stored_bytes

    gm = _traced(lambda x, w: _sum_then_layers(x, w, layers, products), torch.randn(64, 64), torch.randn(64, 64))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    sin = next(n for n in nodes if n.target is aten.sin.default)
    (reduction,) = sin.users
    far = far_epilogues(nodes, fuse=True)
    apart = products or layers > FUSION_DISTANCE
    assert (reduction in far) == apart
    assert far_epilogues(nodes, fuse=False) == frozenset()
    add = nodes[-1]
    stored, step = stored_bytes(reduction, readers(reduction), True, far), kernel_steps(nodes, True, far)[reduction]
    if apart:
        assert stored == 64 * 4 and step == nodes.index(reduction)
    else:
        assert stored == 0 and step == nodes.index(add)


def _wide_then_narrow(a, b, c, d, e, g):
    p = a * b + c * d + e  # reads 5 stored inputs, and two kernels read it
    x = p + g              # reads p and g; two kernels read it too
    return x.sum(0), x.amax(0), p.sum(1)


def test_a_fused_expression_counts_a_stored_producer_as_one_read():
    """Inductor stores a pointwise value read by several kernels once it reads more than
    REALIZE_READS stored inputs, and a reader of it then reads one buffer: ``x`` reads ``p`` and
    ``g`` and stays fused, ``p`` is stored (ConvNeXt's layer-norm gradient and the residual sum
    after it). Inductor's generated code has the one full-size buffer."""
    from torch._inductor.utils import run_and_get_code

    from planner.memory import REALIZE_READS, readers, stored_bytes

    args = [torch.randn(64, 64) for _ in range(6)]
    gm = _traced(_wide_then_narrow, *args)
    adds = [n for n in gm.graph.nodes if n.target is aten.add.Tensor]
    p, x = adds[-2], adds[-1]
    assert REALIZE_READS < 5 and len(readers(p)) == len(readers(x)) == 2
    assert stored_bytes(p, readers(p), fuse=True) == 64 * 64 * 4
    assert stored_bytes(x, readers(x), fuse=True) == 0

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(_wide_then_narrow, backend="inductor"), *args)
    full = [line for line in code.splitlines() if "empty_strided" in line and "(64, 64)" in line]
    assert len(full) == 1, code


def _softmax_backward(mask, scores, row_max, row_sum, grad):
    out = (scores - row_max).exp() / row_sum * mask  # the output recomputed from 4 stored inputs
    x = grad * out                                   # reads 5: more than REALIZE_READS
    return (-out * x.sum(-1, keepdim=True) + x).to(torch.bfloat16)


@pytest.mark.parametrize("row", [512, 2048])
def test_a_value_whose_readers_all_run_in_one_kernel_is_never_stored(row, monkeypatch):
    """A recomputed softmax's backward reads ``grad * out`` in a row sum and in the pointwise op
    that reads the sum: one kernel, so inductor never writes it, however many inputs it reads
    (DeBERTa's 192 MiB at budget 0 on an H100). On a GPU that holds for rows a persistent
    reduction takes; a longer row is taken as stored. Inductor's CPU code has no row-sized
    float32 buffer at either length."""
    from torch._inductor.utils import run_and_get_code

    import planner.memory as memory

    args = [torch.rand(64, row) > 0.1, torch.randn(64, row), torch.randn(64, 1), torch.rand(64, 1) + 1, torch.randn(64, row)]
    gm = _traced(_softmax_backward, *args)
    x = next(n for n in gm.graph.nodes if n.op == "call_function" and any(memory.is_reduction(r) for r in n.users))
    assert memory.stored_bytes(x, memory.readers(x), fuse=True) == 0
    with monkeypatch.context() as patch:  # "cpu" stands in for a GPU (where the exp is not stored on reuse)
        patch.setattr(memory, "_GPU_TYPES", ("cpu",))
        assert len(memory.readers(x)) == 2 and len(memory._leaf_reads(x, depth=8)) > memory.REALIZE_READS
        assert memory.stored_bytes(x, memory.readers(x), fuse=True) == (0 if row <= memory.PERSISTENT_RNUMEL else 64 * row * 4)

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(_softmax_backward, backend="inductor"), *args)
    assert not [line for line in code.splitlines() if "empty_strided_cpu((64, %d)" % row in line and "float32" in line], code


def _masked_softmax(scores, bias, mask, other):
    """A softmax of scores read with three other stored inputs, as GPT-Neo's is (its causal
    mask, positions indexed out of a sum): ``exp`` reads five, with the row max."""
    x = torch.where(mask, scores + bias, -1e4) + other
    e = (x - x.amax(-1, keepdim=True)).exp()  # softmax as the joint graph has it, decomposed
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("online", [False, True])
def test_an_online_softmax_leaves_its_exp_to_the_division(online, monkeypatch):
    """Where inductor computes a softmax's row max and sum in one reduction of the input (its
    online softmax, on CUDA and XPU), the sum reads no ``exp``: the ``exp`` is computed in the
    division alone, never stored, however many inputs it reads. Without it, on a GPU, the
    ``exp`` that reads five stored inputs is stored for the division and the sum over rows longer
    than a persistent reduction takes."""
    import planner._torch_compat as torch_compat
    import planner.memory as memory

    assert torch_compat.online_softmax("cuda") and not torch_compat.online_softmax("cpu")
    monkeypatch.setattr(torch_compat, "online_softmax", lambda device_type: online)  # "cpu" stands in
    monkeypatch.setattr(memory, "_GPU_TYPES", ("cpu",))
    row = 2 * memory.PERSISTENT_RNUMEL
    args = [torch.randn(2, 16, row), torch.randn(2, 16, row), torch.rand(2, 16, row) > 0.1, torch.randn(2, 16, row)]
    gm = _traced(_masked_softmax, *args)
    exp = next(n for n in gm.graph.nodes if n.target is aten.exp.default)
    row_sum = next(n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList)
    assert len(memory._leaf_reads(exp, depth=8)) > memory.REALIZE_READS
    assert memory.online_softmax_sum(row_sum) is online
    assert ([r.target for r in memory.readers(exp)] == [aten.div.Tensor]) if online else (len(memory.readers(exp)) == 2)
    assert memory.stored_bytes(exp, memory.readers(exp), fuse=True) == (0 if online else 2 * 16 * row * 4)


def _masked_scores(scores, row_max, grad):
    """A value read by two kernels: the scores, their row max, and a mask made as transformers
    makes its causal masks (positions from ``arange``, compared, and-ed with a padding mask of
    ones indexed by batch), more than eight ops from the positions."""
    b, s, _ = scores.shape
    q, k = torch.arange(s) + 0, torch.arange(s) + 0
    causal = k[None, None, :] <= q[None, :, None]
    padding = torch.ones(b, s, dtype=torch.bool)[torch.arange(b)[:, None, None], k[None, None, :]]
    mask = torch.where(causal & padding, 0.0, -1e4).to(scores.dtype)
    x = (((scores + mask).float() - row_max) * 0.5 + 1.0).abs()
    y = grad * x
    return y.sum(0), (x * y.sum(-1, keepdim=True)).to(torch.bfloat16)


def test_a_mask_made_from_constants_loads_nothing():
    """Inductor computes a value made from constants alone (through pointwise ops, views and
    indexing) in the kernels that read it, loading nothing: the shared value reads two stored
    inputs, not the mask's positions and indexed padding (counted, five: stored, as Bloom's
    recomputed softmax was, 512 MiB a layer never allocated on an H200). Inductor's code has no
    buffer of its shape in float32."""
    from torch._inductor.utils import run_and_get_code

    import planner.memory as memory

    args = [torch.randn(4, 64, 64), torch.randn(4, 64, 1), torch.randn(4, 64, 64)]
    gm = _traced(_masked_scores, *args)
    x = next(n for n in gm.graph.nodes if n.target is aten.abs.default)
    assert len(memory.readers(x)) == 2
    assert {leaf.target for leaf in memory._leaf_reads(x, depth=8)} == {"scores_1", "row_max_1"}
    assert memory.stored_bytes(x, memory.readers(x), fuse=True) == 0
    mask = next(n for n in gm.graph.nodes if n.target is aten.where.self)
    assert memory.reads_nothing(mask) and not memory.reads_nothing(x)

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(_masked_scores, backend="inductor"), *args)
    assert not [line for line in code.splitlines() if "empty_strided_cpu((4, 64, 64)" in line and "float32" in line], code


def test_a_chain_deeper_than_pythons_recursion_is_walked():
    """A residual stream is a pointwise chain as deep as the model: whether it reads nothing is
    found without recursion, down to a constant or a stored input."""
    import sys

    import planner.memory as memory

    graph = fx.Graph()
    stored = graph.placeholder("x")
    constant = graph.call_function(aten.arange.default, (8,))
    stored.meta["val"] = constant.meta["val"] = torch.empty(8)
    tails = []
    for start in (stored, constant):
        node = start
        for _ in range(2 * sys.getrecursionlimit()):
            node = graph.call_function(aten.add.Tensor, (node, 1.0))
            node.meta["val"] = torch.empty(8)
        tails.append(node)
    assert not memory.reads_nothing(tails[0]) and memory.reads_nothing(tails[1])
    with memory._graphs_unchanged():  # and memoised inside a walk
        assert [memory.reads_nothing(t) for t in tails] == [False, True]


def test_kernels_are_counted_as_the_values_inductor_stores_before_fusing_them():
    """One kernel per stored value and per library call, before inductor fuses them: here the
    batch sum and the output's cast; the shared value, its row sum (a persistent epilogue), the
    mask made from constants (its indexed padding too) are computed inside them. Inductor's CPU
    code fuses the two into one loop nest: a count to compare plans by, at or above the kernels
    run. Without fusion (eager codegen) every operator is one."""
    from torch._inductor.utils import run_and_get_code

    import planner.memory as memory

    args = [torch.randn(4, 64, 64), torch.randn(4, 64, 1), torch.randn(4, 64, 64)]
    gm = _traced(_masked_scores, *args)
    index = next(n for n in gm.graph.nodes if n.target is aten.index.Tensor)
    assert memory.stored_bytes(index, memory.readers(index), fuse=True) == 0
    assert memory.kernel_count(gm, fuse=True) == 2
    assert memory.kernel_count(gm, fuse=False) == len([n for n in gm.graph.nodes if n.op == "call_function"
                                                       and memory._shared_input(n) is None])

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(_masked_scores, backend="inductor"), *args)
    assert 1 <= code.count("async_compile.cpp_pybinding(") <= 2, code

    # the simulation's walk counts the emitted modules so (what budget 1.0 compares)
    model, inputs = MODELS["gpt"]()
    problem = build_problem(planner.capture(model, inputs, codegen="inductor"), get_estimator("flops"), fuse=True)
    joint = planner.capture(model, inputs, codegen="inductor")
    forward, backward = emit(joint, problem, [problem.names[i] for i in np.flatnonzero(min_memory_plan(problem).saved)])
    timeline = simulate(forward, backward, joint.num_fwd_outputs, fuse=True)
    assert timeline.kernels == memory.kernel_count(forward, True) + memory.kernel_count(backward, True, backward=True) > 0


class _CrossEntropyHead(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, vocab) / 4)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(x @ self.w, y)


@pytest.mark.parametrize("gpu, vocab", [(False, 2048), (True, 2048), (True, 64)])
def test_a_gradient_is_written_into_the_logits_its_kernel_reads_at_its_index(gpu, vocab, monkeypatch):
    """With the logits saved, the cross entropy's backward recomputes their row max and sum and
    writes the logits' gradient (their size and dtype) in the kernel that reads them last, at
    the index it writes: inductor writes it into them, rows of any length (on an H200 a GPT-NeoX
    cross entropy over rows of 8192 did; see ``not_written_in_place``). The simulation counts
    one buffer there, and the schedule stays at or above it."""
    import planner.memory as memory

    if gpu:  # "cpu" stands in for a GPU
        monkeypatch.setattr(memory, "_GPU_TYPES", ("cpu",))
    joint = planner.capture(_CrossEntropyHead(vocab), [torch.randn(32, 16), torch.randint(0, vocab, (32,))],
                            codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    plan = evaluate_names(problem, ["mm"])  # the logits saved, everything after them recomputed
    forward, backward = emit(joint.copy(), problem, ["mm"])
    gradient = next(n for n in backward.graph.nodes if n.op == "call_function" and n.target is aten.sub.Tensor
                    and any(u.target is aten.mm.default for u in n.users))
    logits = next(n for n in backward.graph.nodes if n.name == "mm")
    assert logits in memory._leaf_reads(gradient, depth=8) and logits not in memory.not_written_in_place(gradient)
    steps = simulate(forward, backward, joint.num_fwd_outputs, fuse=True).steps
    at_gradient = next(b for phase, name, b in steps if phase == "backward" and name == gradient.name)
    assert at_gradient - 32 * vocab * 4 in range(0, 64)  # and the loss's few scalars
    assert max(memory_profile(problem, plan).backward) >= max(b for phase, _, b in steps if phase == "backward")


class _HeadsOut(torch.nn.Module):
    """A product's output laid out by heads and copied back (an attention's output), or scaled
    where it is: the copy reads the product at another index than it writes."""

    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.transposed = transposed
        self.w = torch.nn.Parameter(torch.randn(16, 64) / 4)
        self.v = torch.nn.Parameter(torch.randn(64, 8) / 4)

    def forward(self, x):
        p = x @ self.w
        if self.transposed:
            c = p.view(4, 32, 8, 8).transpose(1, 2).reshape(128, 64)
        else:
            c = p * 2.0
        return (c @ self.v).square().mean()


@pytest.mark.parametrize("transposed", [False, True])
def test_a_copy_is_written_into_its_input_only_where_it_reads_it_at_its_own_index(transposed):
    """Inductor writes a kernel's output into an input it reads last only where it reads it at
    the index it writes (its ``can_inplace``): a scaled product is written into the product, a
    copy of the product laid out by heads is not. The simulation counts the copy beside the
    product, and inductor's CPU code for the planned forward writes into the product's buffer
    only the first."""
    from torch._inductor.utils import run_and_get_code

    import planner.memory as memory

    x = torch.randn(128, 16)
    joint = planner.capture(_HeadsOut(transposed), [x], codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    forward, backward = emit(joint.copy(), problem, [])
    product = next(n for n in forward.graph.nodes if n.target is aten.mm.default)
    copy = next(n for n in forward.graph.nodes if n.op == "call_function" and n is not product
                and memory.stored_bytes(n, memory.readers(n), True) and product in memory._leaf_reads(n, 8))
    assert (product in memory.not_written_in_place(copy)) is transposed
    steps = [b for phase, name, b in simulate(forward, backward, joint.num_fwd_outputs, fuse=True).steps
             if phase == "forward" and name == copy.name]
    assert steps == [128 * 64 * 4 * (2 if transposed else 1)]
    torch._dynamo.reset()
    compiled = planner.compile(_HeadsOut(transposed), memory_budget=0.0)
    _, (forward_code, *_) = run_and_get_code(lambda: compiled(x).backward())
    assert forward_code.index("extern_kernels.mm(primals_2, primals_1, out=buf0)") > 0  # the product
    assert ("= buf0; del buf0  # reuse" in forward_code) is not transposed, forward_code


class _GatedProjection(torch.nn.Module):
    """A gate and an up projection made by one product and split (as Mixtral's experts and
    Phi-3's MLP do): the backward concatenates the two halves' gradients."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 64) / 4)
        self.v = torch.nn.Parameter(torch.randn(32, 16) / 4)

    def forward(self, x):
        gate, up = (x @ self.w).chunk(2, dim=-1)
        return ((torch.nn.functional.silu(gate) * up) @ self.v).square().mean()


def _emitted_saving_mm(model, x):
    """``model``'s joint graph on ``x`` (inductor codegen), its problem, and the forward and
    backward emitted for a plan that saves the product ``mm``."""
    joint = planner.capture(model, [x], codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    return (joint, problem, *emit(joint.copy(), problem, ["mm"]))


def _compiled_backward_code(make, x) -> str:
    """The code inductor writes for the backward of a fresh ``make()`` compiled at budget 0."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = planner.compile(make(), memory_budget=0.0)
    _, codes = run_and_get_code(lambda: compiled(x).backward())
    return codes[-1]


def test_a_concatenation_computes_its_pointwise_inputs_where_it_writes_them():
    """The backward's ``cat`` of the gate's and the up projection's gradients: each half is a
    pointwise expression inductor computes where the concatenation writes it (into its slice on
    the CPU, inside one kernel on a GPU), never in a buffer of its own; the simulation and the
    schedule store neither half, and inductor's CPU code allocates no buffer for them."""
    import planner.memory as memory

    x = torch.randn(128, 16)
    joint, problem, forward, backward = _emitted_saving_mm(_GatedProjection(), x)
    cat = next(n for n in backward.graph.nodes if n.target is aten.cat.default)
    halves = cat.args[0]
    assert all(memory.stored_bytes(h, memory.readers(h), True) == 0 for h in halves)
    steps = [(name, b) for phase, name, b in simulate(forward, backward, joint.num_fwd_outputs, fuse=True).steps
             if phase == "backward"]
    at = next(i for i, (name, _) in enumerate(steps) if name == cat.name)
    assert steps[at][1] - steps[at - 1][1] == 128 * 64 * 4  # the concatenation alone
    plan = evaluate_names(problem, ["mm"])
    assert max(memory_profile(problem, plan).backward) >= max(b for _, b in steps)
    backward_code = _compiled_backward_code(_GatedProjection, x)
    assert "empty_strided_cpu((128, 64)" in backward_code  # the concatenation
    assert backward_code.count("empty_strided_cpu((128, 32)") == 1  # the product's gradient; no half


class _SlicedProjection(torch.nn.Module):
    """A product read through a slice: the slice's gradient is scattered into zeros (a ``full``
    and a ``slice_scatter``) for the product's backward."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 64) / 4)

    def forward(self, x):
        return (x @ self.w)[:, 8:].square().mean()


def test_a_scattered_slice_computes_the_zeros_it_writes_into():
    """Inductor lowers ``slice_scatter`` to a kernel choosing the source or the base at each
    index: the zeros of a slice's backward are computed there, never stored. The simulation
    stores no ``full`` (it had stored both the zeros and the scatter), and inductor's CPU code
    allocates one buffer of the product's shape in the backward, the scatter's, which the
    product's backward reads."""
    import planner.memory as memory

    x = torch.randn(128, 16)
    joint, _, forward, backward = _emitted_saving_mm(_SlicedProjection(), x)
    scatter = next(n for n in backward.graph.nodes if n.target is aten.slice_scatter.default)
    zeros = scatter.args[0]
    assert zeros.target is aten.full.default and memory.stored_bytes(zeros, memory.readers(zeros), True) == 0
    stored = simulate(forward, backward, joint.num_fwd_outputs, fuse=True).stored
    assert stored[("backward", zeros.name)] == 0 and stored[("backward", scatter.name)] == 128 * 64 * 4
    backward_code = _compiled_backward_code(_SlicedProjection, x)
    assert backward_code.count("empty_strided_cpu((128, 64)") == 1  # the scatter's; no zeros apart


def _biased_attention(q, k, v, rel, g):
    bias = (rel * 2.0).expand(2, 4, 16, 16).contiguous()  # dense, as planner.attention_masks makes it
    out = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.1)
    grads = aten._scaled_dot_product_efficient_attention_backward(g, q, k, v, bias, *out, 0.1, [True] * 4)
    return out[0], grads


def test_an_attention_bias_laid_out_for_a_replayed_attention_is_stored_for_every_reader():
    """A fused attention with dropout, recomputed, replays in an RNG wrapper, and the emitter
    lays its dense bias out as traced: inductor stores the bias where it is made, and the
    attention's backward reads that buffer (T5 on an H200: 64 MiB kept between the two). Read
    by the attention kernels alone, each makes a copy of its own (never stored)."""
    import planner.memory as memory
    from planner import _torch_compat

    args = [torch.randn(2, 4, 16, 8, device="meta") for _ in range(3)] + [torch.randn(1, 4, 16, 16, device="meta"),
                                                                          torch.randn(2, 4, 16, 8, device="meta")]
    gm = make_fx(_biased_attention)(*args)
    bias = next(n for n in gm.graph.nodes if n.target is aten.clone.default)
    attention = next(n for n in gm.graph.nodes if n.target is aten._scaled_dot_product_efficient_attention.default)
    assert memory.laid_out_for_replay(bias)
    assert memory.stored_bytes(bias, memory.readers(bias), fuse=True) == 0  # copied by each attention kernel
    with gm.graph.inserting_before(attention):
        forced = gm.graph.call_function(_torch_compat.as_traced_strides(), (bias, list(bias.meta["val"].stride())))
    forced.meta["val"] = bias.meta["val"]
    attention.replace_input_with(bias, forced)
    assert memory.stored_bytes(bias, memory.readers(bias), fuse=True) == 2 * 4 * 16 * 16 * 4
    assert not memory.laid_out_for_replay(next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor))  # no random reader


def _broadcast_products(x, b, c):
    h = torch.tanh(x * b)  # the backward sums the gradients of b and c over the batch
    return (torch.tanh(h + c) * h).sum()


def test_the_backward_fuses_no_kernels_further_apart_than_the_limit():
    """The planner's compile guard (which the memory model follows, planner.memory.far_epilogues):
    inductor compiling a backward refuses the fusions it
    would make across more nodes than the limit (all of them at a limit of 0, none at the
    default on this small graph), and the step trains as before."""
    from planner._torch_compat import fusion_distance_guard

    guards = []
    inputs = [torch.randn(64, 64, requires_grad=True), torch.randn(64, requires_grad=True),
              torch.randn(64, requires_grad=True)]
    want = torch.autograd.grad(_broadcast_products(*inputs), inputs)
    for limit in (FUSION_DISTANCE, 0):
        guards.append(fusion_distance_guard(limit))
        with torch._inductor.config.patch(_pre_fusion_custom_pass=guards[-1]):
            torch._dynamo.reset()
            got = torch.autograd.grad(torch.compile(_broadcast_products)(*inputs), inputs)
        torch.testing.assert_close(got, want)
    assert guards[0].refused == 0 < guards[1].refused


class _Node:
    """A stand-in for an inductor scheduler node: its place in order, what it makes, what it
    depends on, and whether it is an extern kernel (a matrix product, a convolution)."""

    def __init__(self, order: int, ancestors=(), extern: bool = False, reduction: bool = False) -> None:
        self.min_order = self.max_order = order
        self.name, self.ancestors, self.extern, self.reduction = f"op{order}", set(ancestors), extern, reduction

    def get_operation_names(self) -> set:
        return {self.name}

    def get_nodes(self) -> list:
        return [self]

    def is_extern(self) -> bool:
        return self.extern

    def is_reduction(self) -> bool:
        return self.reduction


def test_the_backward_fuses_no_independent_kernels_across_a_matrix_product():
    """Two independent kernels (a horizontal fusion) with a matrix product between them are in
    different layers: fused, the scheduler runs the later layer's work before the rest of the
    earlier one's. A pointwise reader is not hoisted across it to its producer either (what it
    writes would be alive through the product); a reduction reader is (its output is a row),
    and neighbours fuse."""
    from types import SimpleNamespace

    from planner._torch_compat import refuse_far_fusions

    nodes = [_Node(0), _Node(1), _Node(2, extern=True), _Node(3, ancestors={"op0"}, reduction=True), _Node(4),
             _Node(5, ancestors={"op0"})]
    scheduler = SimpleNamespace(can_fuse=lambda a, b: True)
    counts = SimpleNamespace(refused=0, refused_across=0)
    refuse_far_fusions(scheduler, nodes, FUSION_DISTANCE, counts)
    assert scheduler.can_fuse(nodes[0], nodes[1])  # independent neighbours
    assert scheduler.can_fuse(nodes[0], nodes[3])  # a producer and its reduction reader
    assert scheduler.can_fuse(nodes[3], nodes[0])
    assert not scheduler.can_fuse(nodes[0], nodes[5])  # a producer and its pointwise reader
    assert not scheduler.can_fuse(nodes[1], nodes[4])  # independent, a product between
    assert not scheduler.can_fuse(nodes[4], nodes[1])
    assert counts.refused == counts.refused_across == 3
    reads_product = _Node(6, ancestors={"op0", "op2"}, reduction=True)  # a reader of op0 that needs the product too
    assert not scheduler.can_fuse(nodes[0], reads_product) and counts.refused == counts.refused_across == 4
    assert scheduler.can_fuse(nodes[4], nodes[5])  # no product between
    refuse_far_fusions(scheduler, nodes, 2, counts)  # the distance limit still applies
    assert not scheduler.can_fuse(nodes[0], nodes[3]) and counts.refused == 5 and counts.refused_across == 4


def _kernel_orders(fn, args: list, kernel: str) -> dict[bool, list[str]]:
    """The order of ``fn``'s matrix products ("mm") and of its generated kernels whose name holds
    ``kernel`` in inductor's code, without and with the guard (which refuses only fusions across
    a product here, each asked about once per round of fusion)."""
    from types import SimpleNamespace

    from torch._inductor.utils import run_and_get_code

    from planner._torch_compat import refuse_far_fusions

    orders = {}
    for guarded in (False, True):
        counts = SimpleNamespace(refused=0, refused_across=0)

        def guard(nodes, guarded=guarded, counts=counts):
            if guarded:
                refuse_far_fusions(nodes[0].scheduler, nodes, FUSION_DISTANCE, counts)
            return nodes

        torch._dynamo.reset()
        with torch._inductor.config.patch(_pre_fusion_custom_pass=guard, fx_graph_cache=False, reorder_for_locality=False):
            _, (code, *_) = run_and_get_code(torch.compile(fn, backend="inductor"), *args)
        calls = code[code.index("def call("):].splitlines()
        orders[guarded] = [("mm" if "extern_kernels.mm(" in line else kernel) for line in calls
                           if "extern_kernels.mm(" in line or ("_fused_" in line and kernel in line and "(" in line)]
        assert (counts.refused > 0) == guarded and counts.refused == counts.refused_across, code
    return orders


def _sum_product_later(x, w, y, v):
    r = x.sum(1, keepdim=True)  # a reduction whose reader needs a product made after it
    q = (y * 3).sin()
    n = torch.mm(y, v)          # a product the reader does not need
    m = torch.mm(x, w)          # a product the reader needs
    return q, n, x * r * m


def test_a_reader_that_needs_a_later_product_is_not_fused_with_its_producer():
    """Fused into its reader, a reduction's kernel stays where the reduction was and the
    product the reader needs is hoisted above the work between them (inductor's order of a
    training graph, which it does not reorder for locality); the guard refuses that fusion and
    the order stays as written. The memory model stores such a reduction where it runs."""
    from planner.memory import far_epilogues

    args = [torch.randn(256, 256) for _ in range(4)]
    assert _kernel_orders(_sum_product_later, args, "_sum_") == {False: ["mm", "_sum_", "mm"],
                                                                 True: ["_sum_", "mm", "mm"]}
    gm = _traced(_sum_product_later, *args)
    order = [n for n in gm.graph.nodes if n.op != "output"]
    (reduction,) = [n for n in order if n.target is aten.sum.dim_IntList]
    assert far_epilogues(order, fuse=True) == {reduction}


def _pointwise_reader_after_product(x, w):
    p = x.sin()             # stored: the product reads it
    m = torch.mm(p, w)
    return m, (p * 3).exp()  # a pointwise reader of p placed after the product, not needing it


def test_a_pointwise_reader_is_not_hoisted_across_a_product_to_its_producer():
    """Fused into its producer's kernel, a pointwise reader placed after a matrix product runs
    before the product, and what it writes is alive through it (GPT-2's layer-norm input,
    float32, through the next layer's attention): the guard refuses the fusion, and the reader
    runs after the product, where the memory model computes it."""
    args = [torch.randn(256, 256) for _ in range(2)]
    assert _kernel_orders(_pointwise_reader_after_product, args, "exp") == {False: ["exp", "mm"],
                                                                            True: ["mm", "exp"]}


def test_the_planner_backend_counts_the_fusions_its_guard_refuses():
    """A planned backward of the test MLP at budget 0 (inductor) has fusions the guard refuses,
    all of independent kernels across a product; the backend adds them up, and the step trains
    like eager."""
    from tests.models import MODELS
    from tests.training import assert_same_step

    backends = []

    def run(model, inputs):
        compiled = planner.compile(model, memory_budget=0.0, codegen="inductor", time_limit=5)
        backends.append(compiled.planner_backend)
        return compiled

    torch._dynamo.reset()
    assert_same_step(MODELS["mlp"], run)
    (backend,) = backends
    assert backend.fusions_refused.refused == backend.fusions_refused.refused_across > 0


def _masked_attentions(q, b, c):
    m = torch.where(b > 0, b, c)  # reads b, and c where a second stored input is given
    return (torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=m),
            torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=m, scale=0.5))


@pytest.mark.parametrize("reads", [1, 2])
def test_fused_attention_copies_a_mask_inductor_has_not_stored(reads):
    """Inductor lays out a fused attention's inputs itself and computes a pointwise mask that it
    has not stored into a copy for each attention, alive while that one runs (T5's position
    bias on an H100); a mask reading two stored inputs is stored once for both, where it is
    computed (inductor realizes it for the library kernels reading it). Inductor's generated
    code has as many mask-sized buffers as the memory model counts."""
    from torch._inductor.utils import run_and_get_code

    from planner.memory import input_copy_bytes, kernel_steps, readers, stored_bytes

    q, b = torch.randn(2, 4, 64, 32), torch.randn(2, 4, 64, 64)
    c = b.cos() if reads == 2 else 0.0
    gm = _traced(lambda q, b: _masked_attentions(q, b, 0.0), q, b) if reads == 1 else _traced(_masked_attentions, q, b, c)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    mask = next(n for n in nodes if n.target is aten.where.self)
    attentions = readers(mask)
    size = b.numel() * b.element_size()
    assert len(attentions) == 2
    copies = [input_copy_bytes(a, fuse=True) for a in attentions]
    if reads == 1:
        assert stored_bytes(mask, attentions, fuse=True) == 0 and copies == [size, size]
        assert kernel_steps(nodes, fuse=True)[mask] == max(nodes.index(a) for a in attentions)
    else:
        assert stored_bytes(mask, attentions, fuse=True) == size and copies == [0, 0]
    assert input_copy_bytes(attentions[0], fuse=False) == 0

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(_masked_attentions, backend="inductor"), q, b, c)
    buffers = [line for line in code.splitlines() if "empty_strided" in line and "(2, 4, 64, 64)" in line]
    assert len(buffers) == (2 if reads == 1 else 1), code


def _softmax_saving_its_sum(x, keep):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    total = e.sum(-1, keepdim=True)  # returned too, as a saved value is
    return (e / total * keep).to(torch.bfloat16), total


def test_a_row_sum_the_graph_returns_is_still_computed_in_its_readers_kernel():
    """A row sum that the graph also returns (saved for the backward) is stored for the output,
    and inductor still computes it in the kernel of the division reading it: the exp both read is
    computed there too, never stored. Inductor's CPU code, read here, has no exp-sized buffer."""
    import re
    from torch._inductor.utils import run_and_get_code
    from planner.memory import readers, stored_bytes

    args = [torch.randn(2, 4, 128, 128), torch.rand(2, 4, 128, 128) > 0.1]
    gm = _traced(_softmax_saving_its_sum, *args)
    exp = next(n for n in gm.graph.nodes if n.target is aten.exp.default)
    total = next(n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList)
    assert stored_bytes(exp, readers(exp), fuse=True) == 0 and stored_bytes(total, readers(total), fuse=True) > 0

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(_softmax_saving_its_sum, backend="inductor"), *args)
    assert not re.findall(r"empty_strided_cpu\(\(2, 4, 128, 128\), \([^)]*\), torch\.float32\)", code), code


def _softmax_read_twice(x, keep, g, column):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    p = e / e.sum(-1, keepdim=True)
    other = p * g
    return p * keep, other.sum(0) if column else other  # in a joint graph, the second is the backward's


@pytest.mark.parametrize("column", [False, True])
def test_readers_meet_in_one_kernel_of_their_own_phase(column):
    """A forward value's readers that meet in the probabilities are one forward kernel, whatever
    the backward reads of the probabilities (it loads them saved, or computes a copy of its own).
    Read by two products of their size, the probabilities are computed in one kernel, which
    inductor fuses from the two; read by a product and a column sum, in two, and the exp (stored
    as it is lowered on a CPU) keeps its buffer. Inductor's CPU code, read here, agrees."""
    import re
    from torch._inductor.utils import run_and_get_code
    from planner.memory import readers, stored_bytes

    args = [torch.randn(2, 4, 64, 64), torch.rand(2, 4, 64, 64) > 0.1, torch.randn(2, 4, 64, 64), column]
    gm = _traced(_softmax_read_twice, *args)
    exp = next(n for n in gm.graph.nodes if n.target is aten.exp.default)
    size = 2 * 4 * 64 * 64 * 4
    assert stored_bytes(exp, readers(exp), fuse=True) == (size if column else 0)

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(_softmax_read_twice, backend="inductor"), *args)
    made = len(re.findall(r"empty_strided_cpu\(\(2, 4, 64, 64\), \([^)]*\), torch\.float32\)", code))
    outputs = 1 if column else 2  # of the exp's size: the products the graph returns
    assert made - outputs == (1 if column else 0), code  # and the exp where two kernels read it

    product = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor and n.args[1] is list(gm.graph.nodes)[2])
    for node in [product, *product.users]:  # tagged as AOTAutograd tags the backward's nodes
        node.meta["partitioner_tag"] = "is_backward"
    assert stored_bytes(exp, readers(exp), fuse=True) == 0


def _affine_norm(x, w, b, g):
    """A norm's affine output as the decomposition has it: the row scale ``rstd * w`` read
    directly (in the shift) and through a view; read by kernels apart."""
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True)
    scale = torch.rsqrt(var + 1e-5) * w
    normed = (x * scale.view(x.shape[0], x.shape[1]).unsqueeze(-1) + (b - mean * scale)).float()
    return (normed * g).sum(0), normed.sum(-1), (normed * normed).amax(0)


def test_a_view_of_a_saved_producer_is_its_own_stored_input():
    """The emitter hands a view of a saved value to the backward as an input of its own, and
    inductor counts each input it loads: with the scale saved, the normalised value reads the
    input, the row mean, the shift's bias, the scale and the view of it, five stored inputs, so
    saving the scale does not let inductor compute its copy inside its readers (the producers
    that do, sub and add_1, are still named). On Wav2Vec2's feature encoder the schedule had
    counted four and the copy fused once the scale was saved: 200 MiB under the simulation."""
    from planner.memory import _OWN_DEPTH, _leaf_reads_stopped_at, inlined_once_saved, readers

    args = [torch.randn(4, 8, 256, dtype=torch.bfloat16), torch.randn(8, 1, dtype=torch.bfloat16),
            torch.randn(8, 1, dtype=torch.bfloat16), torch.randn(4, 8, 256)]
    gm = _traced(_affine_norm, *args)
    normed = next(n for n in gm.graph.nodes if n.target is aten._to_copy.default)
    scale = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor and tuple(n.meta["val"].shape) == (4, 8, 1))
    view = next(n for n in gm.graph.nodes if n.target is aten.unsqueeze.default)
    leaves = _leaf_reads_stopped_at(normed, scale, _OWN_DEPTH)
    assert scale in leaves and view in leaves and len(leaves) == 5
    named = inlined_once_saved(normed, readers(normed))
    assert named and scale not in named


def _attention_over_a_product(q, x, w):
    s = torch.bmm(x, w)  # read only by the attention's mask, which inductor copies for the attention
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=(s * 0.5).view(2, 4, 64, 64))
    return out.sum(), q


def test_a_value_read_only_through_a_library_kernels_input_copy_is_freed_before_the_call():
    """The copy of a fused attention's unstored mask is made before the attention runs, by a
    kernel that reads the product last and writes into its storage: at the attention, the
    product is gone and the copy holds its bytes, beside the attention's outputs. Inductor's
    code frees the product's buffer before the call."""
    import re
    from torch._inductor.utils import run_and_get_code

    from planner.memory import input_copy_bytes

    q, x, w = torch.randn(2, 4, 64, 32), torch.randn(8, 64, 16), torch.randn(8, 16, 64)
    forward = _traced(_attention_over_a_product, q, x, w)
    backward = _traced(lambda q, t: q * t, q, torch.ones(()))
    steps = {name: nbytes for phase, name, nbytes in simulate(forward, backward, 1, fuse=True).steps if phase == "forward"}
    attention = next(n for n in forward.graph.nodes if "scaled_dot_product" in str(n.target))
    outputs = sum(v.numel() * v.element_size() for v in attention.meta["val"])
    product = x.shape[0] * x.shape[1] * w.shape[2] * 4
    assert input_copy_bytes(attention, fuse=True) == product and steps["bmm"] == product
    assert steps[attention.name] == product + outputs  # the copy and the outputs; the product is gone

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(_attention_over_a_product, backend="inductor"), q, x, w)
    lines = code.splitlines()
    (made,) = re.findall(r"extern_kernels\.bmm\(.*out=(buf\d+)\)", code)
    freed = next(k for k, line in enumerate(lines) if re.search(rf"\bdel {made}\b", line))
    called = next(k for k, line in enumerate(lines) if "scaled_dot_product" in line and "attn_mask=" in line)
    assert freed < called, code


def test_the_timeline_names_the_saved_values_alive_at_its_peak():
    """``saved_at_peak``: the forward's saved values among the storages alive at the peak step
    (the budget-0 check drops those of the polish's saves first)."""
    from planner.memory import storage_root

    forward, timeline, _ = _simulated_and_counted(_forward, _backward)
    saved = next(iter(forward.graph.find_nodes(op="output"))).args[0][1:]  # h, and r written in place
    assert sum(nbytes for *_, nbytes in timeline.at_peak) == timeline.peak
    alive = {name for phase, name, _ in timeline.at_peak if phase == "forward"}
    assert {n.name for n in saved if storage_root(n).name in alive} == set(timeline.saved_at_peak) == {"mm", "add_"}


@pytest.mark.parametrize("name", ["gpt", "cnn"])
def test_a_simulation_finds_readers_once_and_forgets_them(name, monkeypatch):
    """Within one simulation each node's readers and leaf reads are found once, then forgotten:
    the timeline is the one found without keeping them."""
    from planner import memory
    from planner.predict import simulated_timeline

    model, inputs = MODELS[name]()
    joint = planner.capture(model, inputs, codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    # any plan that recomputes does; greedy's needs no search up to a time limit
    saved = get_solver("greedy").solve(problem, planner.Budget(fraction=0.3).resolve(problem)).saved
    timeline = simulated_timeline(joint, problem, saved)
    assert getattr(memory._seen, "maps", None) is None  # forgotten after the walk
    monkeypatch.setattr(memory, "_graphs_unchanged", contextlib.nullcontext)
    forward, backward = emit(joint.copy(), problem, saved)
    assert simulate(forward, backward, joint.num_fwd_outputs, fuse=True) == timeline


def _ends_on_a_temporary(x, w):
    h = torch.mm(x, w)       # read last by the forward's last op, kept by nothing
    r = torch.relu(x)        # saved for the backward
    return h.sum(), r


def test_what_a_forward_holds_after_it_ends_is_what_outlives_its_last_op():
    # a graph run several times before its backward, or before other graphs, keeps only this:
    # counting the bytes alive while its last op ran (its dead input too) over-counted the step
    x, w = torch.randn(8, 6), torch.randn(6, 64)
    forward = _traced(_ends_on_a_temporary, x, w)
    outs = forward(x, w)
    backward = _traced(lambda r, tangent: (torch.mul(r, tangent),), outs[1], torch.ones(()))
    timeline = simulate(forward, backward, num_fwd_outputs=1)
    last = [b for phase, _, b in timeline.steps if phase == "forward"][-1]
    assert timeline.held_after_forward == sum(o.untyped_storage().nbytes() for o in outs)
    assert last == timeline.held_after_forward + 8 * 64 * 4  # the sum still read the product


class _GeluSquare(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 64)

    def forward(self, x):
        return torch.nn.functional.gelu(self.proj(x)).square().mean()


def test_a_value_no_forward_output_needs_is_counted_in_the_forward_only_where_the_plan_computes_it():
    # After the merge of common subexpressions, a GELU's derivative reads the forward's erf, and
    # its part that reads no tangent (cdf + x * pdf) is a forward value no forward output needs.
    # The emitted forward computes it only where the plan saves it; counted at its place in the
    # forward anyway, it raised Wav2Vec2's feature encoder's forward by 200 MiB, and budget 0
    # saved it rather than recompute it.
    torch.manual_seed(0)
    model, x = _GeluSquare(), torch.randn(32, 16, requires_grad=True)
    problem = build_problem(planner.capture(model, (x,), codegen="inductor"), get_estimator("flops"), fuse=True)
    schedule = problem.schedule
    stored = [int(i) for i in np.flatnonzero(schedule.on_demand & (schedule.transient > 0))]
    assert stored, "the derivative's sum is stored where it is made"
    least = min_memory_plan(problem)
    names = [problem.names[i] for i in np.flatnonzero(least.saved)]
    saving = evaluate_names(problem, [*names, problem.names[stored[0]]])
    assert saving.saved[stored[0]]  # the backward reads it: saved, not pruned
    for plan, computed in ((least, False), (saving, True)):
        joint = planner.capture(model, (x,), codegen="inductor")
        forward, backward = emit(joint, problem, [problem.names[i] for i in np.flatnonzero(plan.saved)])
        assert (problem.names[stored[0]] in {n.name for n in forward.graph.nodes}) == computed
        timeline = simulate(forward, backward, joint.num_fwd_outputs, fuse=True)
        profile = memory_profile(problem, plan)
        assert timeline.forward_peak <= profile.forward.max()
        if not computed:  # nothing is recomputed in the forward: the count is exact there
            assert profile.forward.max() == timeline.forward_peak


def test_a_buffers_update_and_what_it_reads_are_never_on_demand():
    # BatchNorm's running statistics are written by copy_ nodes no forward output reads: the
    # forward runs them whatever the plan saves
    model, inputs = MODELS["cnn"]()
    joint = planner.capture(model, inputs, codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    index = {name: i for i, name in enumerate(problem.names)}
    updates = [n for n in joint.forward_nodes if n.is_impure() and n.name in index]
    assert updates
    read = {a.name for n in updates for a in n.all_input_nodes if a.name in index}
    assert read and not problem.schedule.on_demand[[index[name] for name in read | {n.name for n in updates}]].any()


def _scale_tangent(x, w, tangent):
    return (torch.mm(x.t(), torch.mul(tangent, 2.0)),)


def _scale_product(x, w, tangent):
    return (torch.mm(x.t(), torch.mul(torch.mm(tangent, w), 2.0)),)


@pytest.mark.parametrize("backward_fn, written_in_place", [(_scale_tangent, False), (_scale_product, True)])
def test_a_backward_kernel_writes_in_place_into_its_own_storages_never_a_tangent(backward_fn, written_in_place):
    # inductor reuses a buffer it allocated (or a saved value donated to it), never a tangent: an
    # output the step does not use gets zeros from the autograd engine, alive beside its reader's
    x, w = torch.randn(8, 6), torch.randn(4, 4)
    forward = _traced(lambda x, w: (torch.mm(x, torch.ones(6, 4)).sum(), x.clone()), x, w)
    backward = _traced(backward_fn, x, w, torch.ones(8, 4))
    timeline = simulate(forward, backward, num_fwd_outputs=1, fuse=True)
    scaled = next(n.name for n in backward.graph.nodes if n.target is aten.mul.Tensor)
    at_scale = next(b for phase, name, b in timeline.steps if phase == "backward" and name == scaled)
    one = 8 * 4 * 4  # a tangent, a product and the scaled value are each this size
    saved, loss = 8 * 6 * 4, 4  # the saved copy of x, the loss the caller keeps
    # the scaled value is written into the product where there is one, never into the tangent
    assert (("backward", scaled) in timeline.written_in_place) == written_in_place
    if tangents_held_through_backward():  # the tangent and w (no saved value), until the backward returns
        assert at_scale == saved + loss + one + 4 * 4 * 4 + one
    else:
        assert at_scale == saved + loss + (one if written_in_place else 2 * one)


class _LossAndScaled(torch.nn.Module):
    """A loss and scaled logits, both returned (the caller keeps both)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6, 4))

    def forward(self, x):
        logits = x @ self.w
        return logits.sum(), logits * 3.0


def _fastest_plans_backward(model, x):
    """The problem of ``model`` under inductor's rules, its fastest plan, and the bytes the
    simulation of that plan's emitted backward holds at each of its steps."""
    joint = planner.capture(model, [x], codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    plan = runtime_optimal_plan(problem)
    forward, backward = emit(joint, problem, [problem.names[i] for i in np.flatnonzero(plan.saved)])
    steps = [b for phase, _, b in simulate(forward, backward, joint.num_fwd_outputs, fuse=True).steps
             if phase == "backward"]
    return problem, plan, steps


def test_the_schedule_writes_no_backward_output_into_a_tangent():
    # the logits' gradient (the scaled logits' tangent times 3 plus the loss's tangent) is one
    # kernel that reads that tangent last, the only storage of its size it could write into
    problem, plan, simulated = _fastest_plans_backward(_LossAndScaled(), torch.randn(8, 6))
    assert memory_profile(problem, plan).backward.tolist() == simulated
    scaled = 8 * 4 * 4  # kept by the caller; its tangent and the logits' gradient are as large
    assert max(simulated) >= 3 * scaled


class _TwoOutputs(torch.nn.Module):
    """A product and its ReLU handed on, as a graph cut by a graph break hands on the values
    the rest of the step reads: the step differentiates only the ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6, 4))

    def forward(self, x):
        h = x @ self.w
        return torch.relu(h) * 2.0, h * 3.0


def test_a_compiled_backward_holds_its_tangents_until_it_returns(monkeypatch):
    """On torch 2.11 the autograd engine holds the gradients it hands a compiled backward, and
    the zeros it makes for an output that got none, until that backward returns; on 2.13
    AOTAutograd takes them boxed and they go as the backward drops them. The memory model
    counts tangents as the installed torch keeps them (``tangents_held_through_backward``)."""
    from functorch.compile import make_boxed_func

    from planner._torch_compat import aot_autograd, storage_weakref

    seen = {}

    def backward_compiler(gm, example_inputs):
        tangents = [k for k, p in enumerate(gm.graph.find_nodes(op="placeholder")) if "tangents" in p.name]

        def run(args):
            refs = [storage_weakref(args[k]) for k in tangents]
            out = gm(*args)
            args.clear()  # as inductor's code drops its inputs: no reference of the backward's own is left
            own = torch.ones(8, 4)
            mine = storage_weakref(own)
            del own
            seen.update(tangents=[not r.expired() for r in refs], own=not mine.expired())
            return out

        run._boxed_call = True
        return run

    model, x = _TwoOutputs(), torch.randn(8, 6)
    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm), bw_compiler=backward_compiler)
    relu, product = torch.compile(model, backend=backend, fullgraph=True)(x)
    (relu * 5.0).sum().backward()  # the product gets no gradient: the engine hands zeros for it
    held = tangents_held_through_backward()
    assert seen == {"tangents": [held, held], "own": False}

    # the simulation and the schedule hold both tangents (the caller keeps both outputs) to the
    # backward's last step where the engine does; where it does not, they free them earlier
    last = {}
    for kept in (True, False):
        monkeypatch.setattr(planner.memory, "tangents_held_through_backward", lambda kept=kept: kept)
        problem, plan, steps = _fastest_plans_backward(model, x)
        assert memory_profile(problem, plan).backward[-1] == steps[-1]  # the weight's gradient, last
        last[kept] = steps[-1]
    # at the weight's gradient: both outputs, the product's summed gradient it reads, and itself
    outputs, tangent, weight_grad = 2 * 8 * 4 * 4, 8 * 4 * 4, 6 * 4 * 4
    assert last[False] == outputs + tangent + weight_grad
    assert last[True] == last[False] + 2 * tangent  # the two tangents, read by the first two steps


class _ReluStack(torch.nn.Module):
    """Three ReLU layers: the backward of each reads its mask, which AOTAutograd traces after the
    loss and PyTorch's partitioner leaves there."""

    def __init__(self):
        super().__init__()
        self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(64, 64) / 8) for _ in range(3))

    def forward(self, x):
        for w in self.ws:
            x = torch.relu(x @ w) * 2.0  # the product reads no ReLU output: its backward reads the mask
        return x.mean()


def test_pytorchs_split_is_walked_with_its_masks_where_inductor_fuses_them():
    """A mask PyTorch's split computes after the loss reads the pre-activation of its layer;
    inductor computes it in that layer's kernel, so the walk counts it there, as it counts the
    planner's own forward, which places it so."""
    from planner._torch_compat import pytorch_split_modules
    from planner.graph import copy_module, _place_tangent_free

    joint = planner.capture(_ReluStack(), (torch.randn(512, 64),), codegen="inductor")
    forward, backward = pytorch_split_modules(joint.given_module(), list(joint.joint_inputs), joint.num_fwd_outputs,
                                              **joint.partition_kwargs)
    nodes = list(forward.graph.nodes)
    masks = [n for n in nodes if n.meta.get("partitioner_tag") == "is_backward" and n.meta["val"].dtype == torch.bool]
    assert len(masks) == 3 and any(nodes.index(m) > nodes.index(m.all_input_nodes[0]) + 1 for m in masks)
    placed = copy_module(forward)
    _place_tangent_free(placed.graph, {n for n in placed.graph.nodes if n.name in {m.name for m in masks}})

    def forward_peak(module, fuse):
        timeline = simulate(module, backward, joint.num_fwd_outputs, fuse=fuse)
        return max(total for phase, _, total in timeline.steps if phase == "forward")

    assert forward_peak(forward, True) == forward_peak(placed, True)
    # run in graph order, as without inductor, the late masks keep the pre-activations alive
    assert forward_peak(forward, False) > forward_peak(placed, False)


class _ConvThenLinear(torch.nn.Module):
    """A depthwise convolution, a linear layer over its channels (laid out by channels last,
    as ConvNeXt's blocks do), and the residual sum of the two, which the next convolution reads;
    the first convolution's output is read again after the sum."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.linear = torch.nn.Linear(16, 16)
        self.next = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)

    def forward(self, x):
        h = self.conv(x)
        y = self.linear(h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return (self.next(h + y) * h).square().mean()


def test_values_are_written_in_place_as_inductor_lays_them_out_channels_last():
    """Inductor's layout optimisation stores a convolution's output channels-last, where the
    trace has it contiguous; the residual sum then reads the linear layer's output (laid out by
    channels last, seen through a permute) at the index it writes, and is written into it. The
    memory model sees that only with the layouts inductor uses (``laid_out``); inductor's CPU code
    for the planned forward writes the sum into the product's buffer."""
    from torch._inductor.utils import run_and_get_code

    import planner.memory as memory

    x = torch.randn(4, 16, 8, 8)
    joint = planner.capture(_ConvThenLinear(), [x], codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    forward, _ = emit(joint.copy(), problem, [])
    nodes = list(forward.graph.nodes)
    assert memory.convolutions_laid_out(nodes)  # on the CPU inductor always lays convolutions out so
    product = next(n for n in nodes if n.target in (aten.mm.default, aten.addmm.default))
    total = next(n for n in nodes if n.target is aten.add.Tensor and product in memory._leaf_reads(n, 8)
                 and any(u.target is aten.convolution.default for u in n.users))
    assert product in memory.not_written_in_place(total)  # the traced layouts: another index
    with memory._graphs_unchanged(), memory._laid_out_channels_last(True):
        conv = next(n for n in nodes if n.target is aten.convolution.default)
        assert memory.laid_out(conv).is_contiguous(memory_format=torch.channels_last)
        assert not memory.laid_out(conv).is_contiguous()
        assert product not in memory.not_written_in_place(total)
    torch._dynamo.reset()
    compiled = planner.compile(_ConvThenLinear(), memory_budget=1.0, solver="greedy")
    _, (forward_code, *_) = run_and_get_code(lambda: compiled(x).backward())
    product_buffer = re.search(r"extern_kernels\.(?:add)?mm\([^\n]*out=(buf\d+)\)", forward_code).group(1)
    b = product_buffer
    assert re.search(rf"= (?:{b}|reinterpret_tensor\({b}, [^\n]*\)); del {b}  # reuse", forward_code), forward_code


class _ConvReluLinear(torch.nn.Module):
    """A convolution, a ReLU, and a linear layer over the last (width) dimension, whose matrix
    product reads the ReLU through a reshape."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(torch.relu(self.conv(x)))


def test_a_library_kernel_reading_a_value_through_a_view_fixes_its_layout():
    """Inductor's layout optimisation stores the convolution's output channels-last, and the ReLU
    of it, voted by its one load, would be too; but the matrix product reads the ReLU through a
    reshape, and inductor fixes the ReLU's buffer contiguous as it lowers the product, its traced
    strides not being channels-last. ``laid_out`` says so, and inductor's CPU
    code allocates the ReLU's buffer contiguous."""
    from torch._inductor.utils import run_and_get_code

    import planner.memory as memory

    x = torch.randn(4, 16, 8, 8)
    joint = planner.capture(_ConvReluLinear(), [x], codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    forward, _ = emit(joint.copy(), problem, [])
    nodes = list(forward.graph.nodes)
    relu = next(n for n in nodes if n.target is aten.relu.default)
    assert memory.convolutions_laid_out(nodes) and relu not in memory._graph_outputs(forward.graph)
    with memory._graphs_unchanged(), memory._laid_out_channels_last(True):
        conv = next(n for n in nodes if n.target is aten.convolution.default)
        assert memory.laid_out(conv).is_contiguous(memory_format=torch.channels_last)
        assert memory._fixed_layout(relu, relu.meta["val"]) is not None
        assert memory.laid_out(relu).is_contiguous()
    torch._dynamo.reset()
    model = _ConvReluLinear()
    with torch.no_grad():
        _, (code, *_) = run_and_get_code(torch.compile(model), x)
    assert "(4, 16, 8, 8), (1024, 64, 8, 1)" in code, code  # the ReLU, contiguous
    assert "(4, 16, 8, 8), (1024, 1, 128, 16)" in code, code  # the convolution's output, channels-last


class _AttentionAfterConvolution(torch.nn.Module):
    """A convolution, then two attention blocks over its pixels whose projections are 1x1
    convolutions (CoAtNet's attention stages): queries, keys and values are made contiguous,
    and the attention's output is transposed back for the projection."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 64, 3, padding=1)
        self.qkv = torch.nn.ModuleList(torch.nn.Conv2d(64, 192, 1) for _ in range(2))
        self.proj = torch.nn.ModuleList(torch.nn.Conv2d(64, 64, 1) for _ in range(2))

    def forward(self, x, y):
        x = self.stem(x)
        batch, channels, height, width = x.shape
        for qkv, proj in zip(self.qkv, self.proj):
            q, k, v = qkv(x).view(batch, 4, 3 * channels // 4, -1).chunk(3, dim=2)
            o = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(-1, -2).contiguous() for t in (q, k, v)))
            x = proj(o.transpose(-1, -2).reshape(batch, -1, height, width)) + x
        return torch.nn.functional.cross_entropy(x.mean((2, 3))[:, :10], y)


class _AttentionAlongRows(torch.nn.Module):
    """A convolution whose pixels attend along their rows (the rows as heads, the channels last),
    the attention's output permuted back to channels first for a projection: a view that is
    channels-last as traced, the attention's output being contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.qkv = torch.nn.Conv2d(16, 48, 1)
        self.proj = torch.nn.Conv2d(16, 16, 1)

    def forward(self, x, y):
        x = self.stem(x)
        q, k, v = (t.contiguous() for t in self.qkv(x).permute(0, 2, 3, 1).chunk(3, dim=-1))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = self.proj(o.permute(0, 3, 1, 2)) + x
        return torch.nn.functional.cross_entropy(x.mean((2, 3))[:, :10], y)


class _ConvolvedChannelSplits(torch.nn.Module):
    """InceptionNeXt's token mixer: a channel split of a convolution's output (stored
    channels-last) into a part kept as it is and three parts convolved depthwise, joined again;
    each part a view of the split's input, its traced strides those of a contiguous tensor's,
    and the input saved too (a scale on the residual reads it)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.mix = torch.nn.ModuleList(torch.nn.ModuleList(torch.nn.Conv2d(4, 4, k, padding=p, groups=4)
                                                           for k, p in ((3, 1), ((1, 5), (0, 2)), ((5, 1), (2, 0))))
                                       for _ in range(2))
        self.norm = torch.nn.ModuleList(torch.nn.BatchNorm2d(16) for _ in range(2))
        self.mlp = torch.nn.ModuleList(torch.nn.Conv2d(16, 16, 1) for _ in range(2))
        self.skip = torch.nn.Parameter(torch.ones(2, 16, 1, 1))

    def forward(self, x, y):
        x = self.stem(x)
        for convs, norm, mlp, skip in zip(self.mix, self.norm, self.mlp, self.skip):
            kept, *parts = torch.split(x, (4, 4, 4, 4), dim=1)
            mixed = torch.cat((kept, *(conv(part) for conv, part in zip(convs, parts))), dim=1)
            x = mlp(torch.nn.functional.gelu(norm(mixed))) + x * skip  # skip's gradient reads x
        return torch.nn.functional.cross_entropy(x.mean((2, 3))[:, :10], y)


@pytest.mark.parametrize("budget", [0.0, 0.5])
@pytest.mark.parametrize("model_class", [_AttentionAfterConvolution, _AttentionAlongRows, _ConvolvedChannelSplits])
def test_the_simulation_carries_the_storages_the_compiled_forward_saves(monkeypatch, budget, model_class):
    """Inductor stores a forward's 4-D outputs channels-last where they follow a convolution,
    whatever they mean, and lays each out so as it lowers it: the attention's transposed output,
    saved for the projection's backward beside the attention's own output, is then a buffer of
    its own, not a view of that output; and so is a view of the attention's output where the
    output's stored layout does not give the view's strides. The storages the simulation
    carries into the backward are those the compiled step saves (inductor's CPU code;
    parameters and inputs left out), in number and in bytes."""
    import planner.memory as memory

    found = []
    walk = memory._Walk.run

    def spy(self, gm, phase, keep, carried=None, held=frozenset()):
        done = walk(self, gm, phase, keep, carried, held)
        if phase == "backward":
            keys = {key for found in carried.values() for key in found}
            found.append((len(keys), sum(self.size[key] for key in keys)))
        return done

    monkeypatch.setattr(memory._Walk, "run", spy)
    torch.manual_seed(0)
    model, x, y = model_class(), torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    compiled = planner.compile(model, memory_budget=budget)
    compiled(x, y).backward()  # planned (the last walk is the plan's) and compiled
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), x, y]}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in own:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        compiled(x, y).backward()
    assert found[-1] == (len(saved), sum(saved.values()))


def test_a_saved_view_inductor_would_store_as_a_copy_is_made_again_in_the_backward():
    """The parts of a channel split of a value stored channels-last, its traced strides those of
    a contiguous tensor's, handed over from the forward would each be a dense copy alive from the
    forward to the backward (:func:`planner.memory.copied_views`); the emitter makes them again
    from the saved value in the backward, and the compiled step saves no part of its own. The
    step trains like eager."""
    from planner.memory import copied_views
    from tests.training import assert_same_step

    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    backends = []

    def run(model, inputs):
        compiled = planner.compile(model, memory_budget=0.0)
        backends.append(compiled.planner_backend)
        return compiled

    assert_same_step(lambda: (_ConvolvedChannelSplits(), (x, y)), run)
    (backend,) = backends
    forward, _, outputs, _ = backend._emitted[0]
    assert not copied_views(forward, outputs)
    part = (4, 4, 16, 16)
    assert any(isinstance(v := n.meta.get("val"), torch.Tensor) and v.shape == part for n in forward.graph.nodes), "no split"
    model = _ConvolvedChannelSplits()
    compiled = planner.compile(model, memory_budget=0.0)
    compiled(x, y).backward()
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), x, y]}
    saved = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in own:
            saved.append((tuple(t.shape), t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        compiled(x, y).backward()
    assert saved and not [s for s in saved if s == (part, 4 * 4 * 16 * 16 * 4)], saved


class _LayerNorm2d(torch.nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _GlobalResponseNorm(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((dim,), 0.1))
        self.bias = torch.nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        norm = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        return x + torch.addcmul(self.bias, self.weight, x * (norm / (norm.mean(dim=-1, keepdim=True) + 1e-6)))


class _ConvNeXtV2Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.depthwise = torch.nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.mlp = torch.nn.Sequential(torch.nn.LayerNorm(dim), torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       _GlobalResponseNorm(4 * dim), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        return x + self.mlp(self.depthwise(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _ConvNeXtV2Like(torch.nn.Module):
    """ConvNeXt-V2's stages: a patchifying stem and a layer norm over channels, then per stage a
    downsampling convolution after such a norm (but the first), and blocks of a depthwise
    convolution, then over channels-last pixels (permuted there and back) a layer norm and an
    MLP with a global response norm, added to the residual."""

    def __init__(self, dims=(16, 32, 48, 64), depths=(2, 1, 1, 1)) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, dims[0], 4, stride=4), _LayerNorm2d(dims[0]))
        self.downs = torch.nn.ModuleList([torch.nn.Identity()] + [
            torch.nn.Sequential(_LayerNorm2d(a), torch.nn.Conv2d(a, b, 2, stride=2)) for a, b in zip(dims, dims[1:])])
        self.stages = torch.nn.ModuleList(torch.nn.Sequential(*(_ConvNeXtV2Block(d) for _ in range(n)))
                                          for d, n in zip(dims, depths))
        self.norm = torch.nn.LayerNorm(dims[-1])

    def forward(self, x, y):
        x = self.stem(x)
        for down, stage in zip(self.downs, self.stages):
            x = stage(down(x))
        return torch.nn.functional.cross_entropy(self.norm(x.mean((2, 3)))[:, :10], y)


def test_a_convolution_backward_lays_out_the_gradient_it_reads_as_inductor_does(monkeypatch):
    """Where inductor lowers a convolution backward itself (torch 2.13), the lowering requires
    the output gradient it reads channels-last, whatever the convolution's input; a gradient no
    earlier reader fixed is then stored so. On the CPU, the gradients a ConvNeXt-V2-like model's
    convolution backwards read are laid out in the memory model as inductor's code lays them
    out (strides of the dimensions of more than one element), at budget 0. Among them, a
    stage's residual gradient read by its downsampling convolution's backward, whose input
    the model lays out otherwise."""
    import planner.memory as memory
    from planner._torch_compat import inductor_lays_out_convolution_gradient
    from torch._inductor import graph as inductor_graph

    if not inductor_lays_out_convolution_gradient():
        pytest.skip("this torch runs a convolution backward as a fallback kernel")
    lowered = {}
    run_node = inductor_graph.GraphLowering.run_node

    def lowering(self, node):
        out = run_node(self, node)
        if node.graph.find_nodes(op="call_function", target=aten.convolution_backward.default):
            lowered[node.name] = out  # a backward's: laid out once it is compiled
        return out

    modelled = {}
    walk = memory._Walk.run

    def spy(self, gm, phase, keep, carried=None, held=frozenset()):
        done = walk(self, gm, phase, keep, carried, held)
        if phase == "backward":
            modelled.clear()
            for node in gm.graph.find_nodes(op="call_function", target=aten.convolution_backward.default):
                grad = node.args[0]
                if memory.fusible(grad) and memory.laid_out(grad) is not None:
                    modelled[grad.name] = (tuple(grad.meta["val"].shape), memory.laid_out(grad).stride())
        return done

    monkeypatch.setattr(inductor_graph.GraphLowering, "run_node", lowering)
    monkeypatch.setattr(memory._Walk, "run", spy)
    torch.manual_seed(0)
    model, x, y = _ConvNeXtV2Like(depths=(1, 1, 1, 1)), torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    planner.compile(model, memory_budget=0.0, solver="greedy")(x, y).backward()  # no clock in its plan
    assert modelled, "no gradient read by a convolution backward is stored"
    for name, (shape, strides) in modelled.items():
        layout = tuple(int(s) for s in lowered[name].get_layout().stride)
        assert [s for n, s in zip(shape, strides) if n > 1] == [s for n, s in zip(shape, layout) if n > 1], (
            name, strides, layout)


def test_a_view_a_library_kernel_reads_is_copied_where_its_base_is_laid_out_otherwise(monkeypatch):
    """Inductor copies a view that a library kernel reads where the view's base, as laid out,
    cannot give it: ConvNeXt-V2's residual gradient between two blocks of a stage is fixed
    contiguous, and the block below reads it permuted to channels-last pixels and reshaped, in
    two matrix products; one copy serves both (a buffer of its own as the view is lowered), or
    a copy for its one reader (``copy_input`` as the reader is lowered). The views the memory
    model counts as copies in the backward are those inductor copies (its CPU code), at budget
    0."""
    import planner.memory as memory
    from torch._inductor import graph as inductor_graph
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    from planner.ops import aliased_input, is_getitem

    lowered, copied_for = {}, set()
    run_node, copy_input = inductor_graph.GraphLowering.run_node, ir.ExternKernel.copy_input

    def lowering(self, node):
        out = run_node(self, node)
        if node.graph.find_nodes(op="call_function", target=aten.convolution_backward.default):
            lowered[node.name] = out  # a backward's
        return out

    def copying(x):
        if isinstance(x, ir.BaseView):  # a view no reinterpretation of its base's buffer gives
            copied_for.add(getattr(V.graph.current_node, "name", None))
        return copy_input(x)

    counted, views = set(), {}
    walk = memory._Walk.run

    def spy(self, gm, phase, keep, carried=None, held=frozenset()):
        done = walk(self, gm, phase, keep, carried, held)
        if phase == "backward":
            counted.clear()
            counted.update(node.name for node in self.view_copies)
            views.clear()
            views.update((node.name, node) for node in gm.graph.nodes if aliased_input(node) is not None and not is_getitem(node))
        return done

    monkeypatch.setattr(inductor_graph.GraphLowering, "run_node", lowering)
    monkeypatch.setattr(ir.ExternKernel, "copy_input", staticmethod(copying))
    monkeypatch.setattr(memory._Walk, "run", spy)
    torch.manual_seed(0)
    model, x, y = _ConvNeXtV2Like(depths=(2, 1, 1, 1)), torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    planner.compile(model, memory_budget=0.0, solver="greedy")(x, y).backward()  # no clock in its plan

    def buffer(name):
        try:
            return lowered[name].get_name()
        except (KeyError, NotImplementedError, AttributeError):
            return None

    own = {name for name, node in views.items()
           if buffer(name) is not None and buffer(aliased_input(node).name) not in (None, buffer(name))}
    for_reader = {name for name, node in views.items() if any(r.name in copied_for for r in node.users)}
    assert own, "no view of the backward is a buffer of its own"
    assert own <= counted, (own, counted)
    assert counted <= own | for_reader, (counted, own, for_reader)


def test_a_recomputed_layer_norm_reads_its_saved_input_inside_its_readers():
    """A layer norm's normalised input, ``(x - mean) * rstd``, read by its forward and its
    backward: recomputed with ``x`` recomputed too, the schedule's walk reaches more stored
    inputs than inductor inlines for several readers, so it counts the copy stored; with ``x``
    saved the walk stops there, and the copy is computed inside each reader. The schedule names
    the producers that do so (``x`` among them), a plan saving one is evaluated with the copy
    fused and one saving none with it stored, and the emitted backward of the plan saving ``x``
    stores no normalised input."""
    from planner.models import GPTConfig, gpt_example
    from planner.schedule import with_saved_fusions
    from solvers.reference import reference_plan

    model, batch = gpt_example(GPTConfig(n_layer=2, d_model=64, seq_len=64))
    joint = planner.capture(model, list(batch), codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    s, rows = problem.schedule, problem.schedule.fused_if_saved
    by_name = {node.name: node for node in joint.graph.nodes}
    plan = reference_plan(problem)
    normalised = [i for i in np.flatnonzero((rows >= 0).any(axis=1))
                  if _normalised(by_name[problem.names[i]]) and plan.recomputed[i]]
    assert normalised, "the frugal plan recomputes no normalised input whose producers the schedule names"
    first = normalised[0]
    producers = rows[first][rows[first] >= 0]
    saving = plan.saved.copy()  # and the first producer named
    saving[producers[0]] = True
    assert not s.fused[first] and s.copy_bytes[first] > 0  # counted stored, whatever the plan
    fused = with_saved_fusions(s, saving)
    assert fused.fused[first] and fused.copy_bytes[first] == 0
    unsaved = saving.copy()
    unsaved[producers] = False
    assert not with_saved_fusions(s, unsaved).fused[first]
    every = saving.copy()  # and a producer of every recomputed normalised input
    for i in normalised:
        every[rows[i][rows[i] >= 0][0]] = True
    forward, backward = emit(joint.copy(), problem, [problem.names[i] for i in np.flatnonzero(every)])
    stored = simulate(forward, backward, joint.num_fwd_outputs, fuse=True).stored
    copies = [n for n in backward.graph.nodes if n.meta.get("recomputed") and _normalised(n)]
    assert copies and all(stored[("backward", n.name)] == 0 for n in copies)


def _normalised(node: fx.Node) -> bool:
    """``node`` is a layer norm's ``(x - mean) * rstd``."""
    return node.target is aten.mul.Tensor and any(getattr(a, "target", None) is aten.rsqrt.default for a in node.args)


class _UpsampledLoss(torch.nn.Module):
    """Logits upsampled (bilinear) to the labels' pixels and a cross-entropy, as a segmentation
    head computes its loss: inductor's decomposition loads the logits four times at computed
    indices (``_unsafe_index``), and the backward scatters four weighted copies of the gradient
    back (``index_put`` with accumulation)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 6, 1)

    def forward(self, x, labels):
        logits = torch.nn.functional.interpolate(self.conv(x), size=labels.shape[-2:], mode="bilinear")
        return torch.nn.functional.cross_entropy(logits, labels)


def test_loads_at_computed_indices_and_scattered_values_are_computed_in_the_kernels_reading_them():
    """Inductor lowers ``_unsafe_index`` (as ``gather``, ``embedding`` and ``index``) to pointwise
    code that loads its operand where its reader needs it, and an ``index_put`` to a scatter
    kernel that computes its values where it stores them. The simulation stores none of the four
    upsampled loads nor the four scattered values; inductor's CPU code allocates, at the
    upsampled size, as many forward buffers as the simulation stores, and fewer backward ones
    than there are scattered values. A boolean index falls back to ATen's kernel, which reads
    its values stored."""
    import re
    from torch._inductor.utils import run_and_get_code
    from planner.memory import scatters_values

    torch.manual_seed(0)
    x, labels = torch.randn(2, 8, 16, 16), torch.randint(0, 6, (2, 64, 64))
    torch._dynamo.reset()
    backend = planner.backend(memory_budget=1.0)
    _, codes = run_and_get_code(lambda: torch.compile(_UpsampledLoss(), backend=backend)(x, labels).backward())
    forward, backward = backend._emitted[0][:2]
    stored = backend.timelines[0].stored
    size = 2 * 6 * 64 * 64 * 4
    loads = [n for n in forward.graph.nodes if n.target is aten._unsafe_index.Tensor]
    puts = [n for n in backward.graph.nodes if n.target is aten.index_put.default]
    assert len(loads) == 4 and all(stored[("forward", n.name)] == 0 for n in loads)
    assert len(puts) == 4 and all(scatters_values(n) and stored[("backward", n.args[2].name)] == 0 for n in puts)
    upsampled = r"empty_strided_cpu\(\(2, 6, 64, 64\)"
    assert len(re.findall(upsampled, codes[0])) == sum(stored[("forward", n.name)] == size for n in forward.graph.nodes
                                                       if ("forward", n.name) in stored)
    assert len(re.findall(upsampled, codes[1])) < len(puts)

    def masked_put(base, mask, values):
        return base.index_put((mask,), values)

    gm = _traced(masked_put, torch.zeros(8, 4), torch.rand(8) > 0.5, torch.randn(4))
    (put,) = [n for n in gm.graph.nodes if n.target is aten.index_put.default]
    assert not scatters_values(put)


def _indexed_mask_attention(q, k, v, keep):
    positions = torch.arange(keep.shape[1])  # computed: the loads read only the padding mask
    allowed = keep[:, None, positions, None] & keep[:, None, None, positions]
    bias = torch.where(allowed, 0.0, float("-inf"))
    first = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return torch.nn.functional.scaled_dot_product_attention(first, k, v, attn_mask=bias)


def test_each_load_of_a_buffer_at_its_own_indices_is_a_read_of_its_own():
    """A padding mask indexed by query and by key position (as transformers builds attention
    masks) is read twice: inductor counts each load at its own indices, and stores a bias reading
    more than one input before the fused attentions that read it, rather than have each copy it.
    The memory model stores the bias, and inductor's CPU code allocates its buffer."""
    import re
    from torch._inductor.utils import run_and_get_code
    from planner.memory import readers, stored_bytes

    args = [torch.randn(2, 4, 64, 16), torch.randn(2, 4, 64, 16), torch.randn(2, 4, 64, 16), torch.rand(2, 64) > 0.2]
    gm = _traced(_indexed_mask_attention, *args)
    bias = next(n for n in gm.graph.nodes if n.target is aten.where.self)
    assert stored_bytes(bias, readers(bias), fuse=True) == 2 * 64 * 64 * 4
    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(_indexed_mask_attention, backend="inductor"), *args)
    assert re.findall(r"empty_strided_cpu\(\(2, 1, 64, 64\), \([^)]*\), torch\.float32\)", code), code


class _EmbeddingScaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 24)
        self.w = torch.nn.Parameter(torch.randn(24))

    def forward(self, ids):
        return (torch.tanh(self.emb(ids)) * self.w).square().mean()


def test_an_embeddings_gradient_is_computed_in_the_kernel_scattering_it():
    """An embedding's backward puts the gradient of every looked-up row into zeros of the table's
    shape (``_unsafe_index_put`` or, on newer torch, ``_unsafe_masked_index_put_accumulate``):
    inductor computes the gradient where its scatter kernel loads it. The simulation stores
    neither the gradient nor the zeros, and inductor's CPU code allocates no buffer of the
    gradient's shape (8 x 40 x 24), only the table's."""
    import re
    from torch._inductor.utils import run_and_get_code
    from planner.memory import _INDEX_PUTS, scatters_values

    ids = torch.randint(0, 50, (8, 40))
    torch._dynamo.reset()
    backend = planner.backend(memory_budget=1.0)
    _, codes = run_and_get_code(lambda: torch.compile(_EmbeddingScaled(), backend=backend)(ids).backward())
    backward, stored = backend._emitted[0][1], backend.timelines[0].stored
    (put,) = [n for n in backward.graph.nodes if n.target in _INDEX_PUTS]
    values, base = put.args[3] if len(put.args) > 3 and isinstance(put.args[3], fx.Node) else put.args[2], put.args[0]
    assert scatters_values(put) and stored[("backward", values.name)] == 0 and stored[("backward", base.name)] == 0
    assert not re.findall(r"empty_strided_cpu\(\(8, 40, 24\)", codes[1]), codes[1]
    assert re.findall(r"empty_strided_cpu\(\(50, 24\)", codes[1])


class _GroupNormEncoder(torch.nn.Module):
    """A convolutional audio encoder's first layers (convolution, GroupNorm, GELU), in bfloat16:
    the GroupNorm backward's decomposition casts its input gradient, a bfloat16 value computed
    from the GELU's gradient, to float32 and reads it in its row sums and its output."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 64, 10, 5, bias=False)
        self.norm = torch.nn.GroupNorm(64, 64)
        self.head = torch.nn.Conv1d(64, 64, 3, 2, bias=False)

    def forward(self, audio):
        hidden = torch.nn.functional.gelu(self.norm(self.conv(audio[:, None])))
        return torch.nn.functional.gelu(self.head(hidden)).float().pow(2).mean()


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_a_gradient_read_through_a_widening_cast_by_several_kernels_is_stored_narrow(budget):
    """Inductor stores a float32 cast that several kernels read where it reads more than a few
    stored inputs: the cast of a bfloat16 gradient to the GroupNorm backward's float32. The
    emitted backward lays the bfloat16 gradient out as traced, so it is stored instead and the
    cast computed in its readers: inductor's CPU code allocates no float32 buffer of the
    activation's size in the backward (it does without the rule), the simulation stores no
    float32 value of that size there, and the gradients are eager's."""
    import re
    from torch._inductor.utils import run_and_get_code
    from planner.memory import narrow_cast_input

    torch.manual_seed(0)
    model, audio = _GroupNormEncoder().to(torch.bfloat16), torch.randn(4, 16000, dtype=torch.bfloat16)
    model(audio).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    backend = planner.backend(memory_budget=budget)
    _, codes = run_and_get_code(lambda: torch.compile(model, backend=backend)(audio).backward())
    backward = backend._emitted[0][1]
    # (GroupNorm's statistics reshaped by as_strided are laid out as traced too: emit.as_strided_reads_as_traced)
    forced = [n for n in backward.graph.nodes if "inductor_force_stride_order" in str(n.target)
              and any(u.target is not torch.ops.aten.as_strided.default for u in n.users)]
    assert forced and all(n.args[0].meta["val"].dtype == torch.bfloat16 for n in forced)
    assert all(u.meta["val"].dtype == torch.float32 for n in forced for u in n.users)
    size = 4 * 64 * 3199
    assert not re.findall(r"empty_strided_cpu\(\(4, 64, 3199\), \([^)]*\), torch\.float32\)", codes[-1])
    stored = backend.timelines[0].stored
    assert not [name for (phase, name), nbytes in stored.items() if phase == "backward" and nbytes >= 4 * size]
    for p, want in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, want, atol=1e-3, rtol=1.6e-2)

    def read_once(x):  # the cast's one reader computes it: nothing to store
        return (x * 2).float() * 3

    gm = _traced(read_once, torch.randn(64, 64, dtype=torch.bfloat16))
    cast = next(n for n in gm.graph.nodes if n.meta.get("val") is not None and n.meta["val"].dtype == torch.float32)
    assert narrow_cast_input(cast) is None


def test_the_schedule_counts_a_narrow_stored_gradient_in_its_casts_place():
    """The solvers' schedule counts what the emitted backward stores: the GroupNorm backward's
    bfloat16 input gradient, not its float32 cast (:func:`planner.memory.narrow_cast_input`)."""
    from planner.memory import build_schedule, narrow_cast_input, readers, stored_bytes

    model, audio = _GroupNormEncoder().to(torch.bfloat16), torch.randn(4, 16000, dtype=torch.bfloat16)
    joint = planner.capture(model, (audio,), codegen="inductor")
    schedule = build_schedule(joint, fuse=True)
    steps = {node.name: node for node in joint.backward_nodes}
    casts = [(t, node) for t, name in enumerate(schedule.step_names) if narrow_cast_input(node := steps[name], None)
             is not None and stored_bytes(node, readers(node), fuse=True) > 0]  # stored, as the joint graph reads
    assert casts
    for t, cast in casts:
        assert schedule.reuse[t] == 0
        narrow = schedule.step_names.index(cast.args[0].name)
        assert schedule.reuse[narrow] == 4 * 64 * 3199 * 2 == cast.meta["val"].numel() * 2


class _GroupNormStack(torch.nn.Module):
    """Three of :class:`_GroupNormEncoder`'s convolution, GroupNorm and GELU layers: a narrow
    gradient to store for each GroupNorm backward."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.Conv1d(1 if k == 0 else 32, 32, 5, 2, bias=False), torch.nn.GroupNorm(32, 32), torch.nn.GELU())
            for k in range(3))

    def forward(self, audio):
        hidden = audio[:, None]
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden.float().pow(2).mean()


def test_narrow_gradients_are_stored_alike_with_each_question_asked_once_between_changes(monkeypatch):
    """:func:`planner.emit.store_narrow_casts` asks its questions of a module inside one walk of
    it until it stores a value (which changes the graph), then in a new one: the values stored
    and the modules are those of asking each question afresh."""
    from planner import emit, memory
    from planner.bounds import runtime_optimal_plan
    from planner.build import build_problem
    from estimators import get_estimator

    model, audio = _GroupNormStack().to(torch.bfloat16), torch.randn(2, 4000, dtype=torch.bfloat16)
    joint = planner.capture(model, (audio,), codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    saved = tuple(problem.names[i] for i in np.flatnonzero(runtime_optimal_plan(problem).saved))

    def stored():
        forward, backward = emit.emit(joint.copy(), problem, saved)
        names = [n.name for n in emit.store_narrow_casts(forward, backward)]
        return names, forward.code, backward.code

    walked = stored()
    monkeypatch.setattr(memory, "_graphs_unchanged", contextlib.nullcontext)
    assert len(walked[0]) >= 3 and walked == stored()


class _Fan(torch.nn.Module):
    """One hidden state read by many linear branches: its gradient is a sum of as many matrix
    products' outputs (viewed back to three dimensions, so no ``addmm`` takes them)."""

    def __init__(self, branches=20, width=64):
        super().__init__()
        self.inp = torch.nn.Linear(width, width)
        self.branches = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(branches))

    def forward(self, x):
        hidden = torch.tanh(self.inp(x))
        return sum(torch.relu(branch(hidden)) for branch in self.branches).pow(2).mean()


def test_a_gradient_summed_from_many_branches_is_stored_where_its_reads_pile_up():
    """Inductor stores a pointwise value whose expression reads more than
    ``REALIZE_ACC_READS`` buffers, however many kernels read it: the running sum of twenty
    branches' gradients is stored every few terms. The simulation stores what inductor's code
    keeps in the planned backward (budget 0) and agrees with it, where without the rule
    inductor kept sums the simulation had computed in their reader."""
    from planner import memory

    torch.manual_seed(0)
    model, x = _Fan(), torch.randn(8, 64, 64)
    backend = planner.backend(memory_budget=0.0)
    torch.compile(model, backend=backend)(x).backward()
    backward = backend._emitted[0][1].graph
    with memory._graphs_unchanged():
        piled = [n for n in backward.nodes if memory.stored_for_reads(n)]
        assert piled and all(n.target == torch.ops.aten.add.Tensor for n in piled)
        assert all(memory.stored_bytes(n, memory.readers(n), fuse=True) == 4 * 8 * 64 * 64 for n in piled)
    (report,) = backend.stores_against_inductor()
    assert report["backward"]["unmodelled"] == {} and report["backward"]["unstored"] == {}
