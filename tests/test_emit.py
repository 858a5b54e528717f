"""The emitted modules: what the forward hands over, and where the backward recomputes."""
import copy

import pytest
import torch

import planner
from estimators import get_estimator
from planner import _torch_compat
from planner.build import build_problem
from planner.emit import emit
from planner.ops import is_getitem
from planner.problem import evaluate_names
from solvers import get_solver
from tests.models import MODELS


def emitted(model_name, fraction):
    model, inputs = MODELS[model_name]()
    joint = planner.capture(model, inputs)
    problem = build_problem(joint, get_estimator("flops"))
    decision = get_solver("cpsat").solve(problem, planner.Budget(fraction=fraction).resolve(problem))
    outputs = joint.num_fwd_outputs
    fw, bw = emit(joint, problem, decision.saved)
    return problem, decision, outputs, fw, bw


def calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_forward_returns_exactly_the_saved_values(fraction):
    problem, decision, num_outputs, fw, bw = emitted("gpt", fraction)
    returned = next(iter(fw.graph.find_nodes(op="output"))).args[0][num_outputs:]
    primals = {n for n in returned if n.op == "placeholder"}
    rng_states = {n for n in returned if n.meta["val"].dtype == torch.uint8}
    # a saved value goes over as itself or as the views of it the backward reads
    from planner.memory import storage_root

    roots = {storage_root(n) for n in returned}
    activations = {n.name for n in roots if n.op != "placeholder"} - {n.name for n in rng_states}
    assert activations == set(decision.saved)
    recomputed = evaluate_names(problem, decision.saved).recomputed
    assert len(rng_states) == int((recomputed & problem.random).sum())
    assert [n.name for n in bw.graph.find_nodes(op="placeholder")][: len(returned)] == [n.name for n in returned]


def test_recomputed_dropout_replays_its_rng_state():
    # The least-memory cut recomputes every dropout (its RNG state is smaller than its mask),
    # whatever plan a time-limited search finds for budget 0 on this machine.
    from planner.bounds import min_memory_plan

    model, inputs = MODELS["gpt"]()
    joint = planner.capture(model, inputs)
    problem = build_problem(joint, get_estimator("flops"))
    plan = min_memory_plan(problem)
    replayed = int((plan.recomputed & problem.random).sum())
    assert replayed > 0
    fw, bw = emit(joint, problem, tuple(problem.names[i] for i in plan.saved.nonzero()[0]))
    assert sum(n.target is _torch_compat.run_and_save_rng_state() for n in calls(fw)) == replayed
    assert sum(n.target is _torch_compat.run_with_rng_state() for n in calls(bw)) == replayed
    # the wrapped op gets each tensor input laid out as it was traced (the wrapper passes on no
    # layout constraint of the op)
    for gm, wrapper, first in ((fw, _torch_compat.run_and_save_rng_state(), 1),
                               (bw, _torch_compat.run_with_rng_state(), 2)):  # (state,) op, *args
        for node in (n for n in calls(gm) if n.target is wrapper):
            inputs = [a for a in node.args[first:] if isinstance(a, torch.fx.Node) and a.meta["val"].dim() > 0]
            forced = [a for a in inputs if a.target is _torch_compat.as_traced_strides()]
            assert forced and all(a.args[1] == list(a.args[0].meta["val"].stride()) for a in forced)
            # what is left as it is is a view into a larger storage (no copy has its strides)
            assert all(a.meta["val"].untyped_storage().nbytes() > a.meta["val"].numel() * a.meta["val"].element_size()
                       for a in inputs if a not in forced)


class _Noise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x):
        h = torch.nn.functional.dropout(torch.tanh(self.a(x)) * torch.rand(32, 64), 0.2)
        return torch.tanh(self.b(h)).sum()


def test_random_ops_are_replayed_only_where_torch_can_tell_their_device():
    # Inductor draws a step's random numbers from seeds made by prims.inductor_seeds(count, device),
    # which names its device by position: torch's replay of an RNG state cannot tell it (inductor
    # fails compiling such a plan), so the seeds are saved, never recomputed.
    compiled = planner.compile(_Noise(), memory_budget=0.0, time_limit=5)
    compiled(torch.randn(32, 64)).backward()
    (graph,) = compiled.planner_backend.graphs
    problem = graph.problem
    random = {problem.names[i]: i for i in problem.random.nonzero()[0]}
    seeds = random.pop("inductor_seeds_default")
    assert not problem.recomputable[seeds]
    assert "naming its device by position" in problem.must_save_reason[seeds]
    # torch.rand (device keyword) and dropout (reads a tensor) stay replayable, and replayed they
    # train like eager
    from planner.bounds import min_memory_plan
    from tests.training import assert_same_step

    joint = planner.capture(_Noise(), (torch.randn(32, 64),))
    problem = build_problem(joint, get_estimator("flops"))
    plan = min_memory_plan(problem)
    assert problem.recomputable[problem.random].all() and int((plan.recomputed & problem.random).sum()) == 2
    assert_same_step(lambda: (_Noise(), (torch.randn(32, 64),)),
                     lambda m, x: planner.compile(m, memory_budget=0.0, codegen="eager", time_limit=5))


class _Attention(torch.nn.Module):
    def __init__(self, dropout_p):
        super().__init__()
        self.qkv, self.dropout_p = torch.nn.Linear(32, 96), dropout_p

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 16, 3, 2, 16).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p, is_causal=True)
        return torch.tanh(y).square().mean()


def test_attention_asked_for_no_dropout_is_recomputed_as_itself():
    # A seeded attention op with dropout_p 0 draws nothing: recomputed, it runs again as itself,
    # with no RNG state saved or replayed (inductor would run a replay op by op from Python)
    from planner.bounds import min_memory_plan
    from tests.training import assert_same_step

    joint = planner.capture(_Attention(0.0), (torch.randn(2, 16, 32),))
    problem = build_problem(joint, get_estimator("flops"))
    (node,) = [n for n in joint.forward_nodes if n.target is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default]
    assert torch.Tag.nondeterministic_seeded in node.target.tags
    (attention,) = problem.index([node.name])
    assert not problem.random[attention]
    plan = min_memory_plan(problem)
    assert plan.recomputed[attention]
    fw, bw = emit(joint, problem, tuple(problem.names[i] for i in plan.saved.nonzero()[0]))
    wrappers = (_torch_compat.run_and_save_rng_state(), _torch_compat.run_with_rng_state())
    assert not [n for gm in (fw, bw) for n in calls(gm) if n.target in wrappers]
    assert [n for n in calls(bw) if "scaled_dot_product_flash_attention_for_cpu.default" in str(n.target)]
    assert_same_step(lambda: (_Attention(0.0), (torch.randn(2, 16, 32),)),
                     lambda m, x: planner.compile(m, memory_budget=0.0, codegen="eager", time_limit=5))
    # asked for dropout, the attention's randomness is a node that draws
    joint = planner.capture(_Attention(0.1), (torch.randn(2, 16, 32),))
    assert build_problem(joint, get_estimator("flops")).random.any()


class _DroppedAttention(torch.nn.Module):
    """Dropout, then attention: attention kernels take a dropout probability, so are random ops."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x):
        h = torch.nn.functional.dropout(x, 0.1, self.training)
        q, k, v = self.qkv(h).view(8, 16, 3, 2, 16).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.tanh(y).square().mean()


def test_the_forward_runs_none_of_the_backwards_recomputation():
    # The split copies into the forward every node whose inputs it has and drops those no output
    # reads, but keeps random ops where random ops count as effects (inductor's fallback_random,
    # or no compile at all): the recomputed attention, and the dropout replayed before it
    from planner.bounds import min_memory_plan
    from tests.training import assert_same_step

    joint = planner.capture(_DroppedAttention(), (torch.randn(8, 16, 32),))  # x larger than the RNG state
    problem = build_problem(joint, get_estimator("flops"))
    plan = min_memory_plan(problem)
    recomputed = {problem.names[i] for i in plan.recomputed.nonzero()[0]}
    attention = "_scaled_dot_product_flash_attention_for_cpu"
    assert attention in recomputed and any(name.startswith("native_dropout") for name in recomputed)
    fw, bw = emit(joint, problem, tuple(problem.names[i] for i in plan.saved.nonzero()[0]))
    assert not [n.name for n in fw.graph.nodes if n.meta.get("recomputed")]
    assert len([n for n in calls(fw) if attention in str(n.target)]) == 1
    assert [n for n in calls(bw) if n.target is _torch_compat.run_with_rng_state()]
    # compiled by inductor drawing eager's random numbers (it failed: the replay's RNG state, made
    # in the same forward, was a real tensor where inductor's compile wants fake ones)
    with torch._inductor.config.patch(fallback_random=True):
        assert_same_step(lambda: (_DroppedAttention(), (torch.randn(8, 16, 32),)),
                         lambda m, x: planner.compile(m, memory_budget=0.0, time_limit=5))


class _Returned(torch.nn.Module):
    """A loss and a hidden state for the caller (as a graph before a break), which the loss reads."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = torch.tanh(self.layer(x))
        return (h * h).sum(), h


def test_a_forward_output_the_backward_recomputes_is_made_once_in_the_forward():
    joint = planner.capture(_Returned(), (torch.randn(4, 16),))
    problem = build_problem(joint, get_estimator("flops"))
    (tanh,) = [n.name for n in joint.fwd_outputs if "tanh" in str(n.target)]
    saved = tuple(name for name, must in zip(problem.names, ~problem.recomputable) if must and name != tanh)
    assert tanh in {problem.names[i] for i in evaluate_names(problem, saved).recomputed.nonzero()[0]}
    fw, bw = emit(joint, problem, saved)
    assert len([n for n in calls(fw) if n.target is torch.ops.aten.tanh.default]) == 1
    assert [n for n in calls(bw) if n.target is torch.ops.aten.tanh.default]


def test_nothing_is_recomputed_at_budget_one():
    problem, decision, _, fw, bw = emitted("gpt", 1.0)
    assert not any(n.meta.get("recomputed") and problem.runtime[problem.index([n.name])[0]] > 0
                   for n in calls(bw) if n.name in problem.names)
    assert not any(n.target is _torch_compat.run_with_rng_state() for n in calls(bw))


def test_recomputation_happens_just_before_its_first_use():
    problem, decision, _, fw, bw = emitted("gpt", 0.0)
    nodes = list(bw.graph.nodes)
    recomputed = [n for n in nodes if n.meta.get("recomputed")]
    plan = evaluate_names(problem, decision.saved).recomputed
    owner = problem.schedule.owner
    # views of saved values (or of inputs) are handed over from the forward, not made again
    handed = [i for i in plan.nonzero()[0] if owner[i] != i and problem.targets[i] != "<built-in function getitem>"
              and (owner[i] < 0 or not plan[owner[i]])]
    assert handed and len(recomputed) == int(plan.sum()) - len(handed)
    for node in recomputed:
        if is_getitem(node) and node.args[0].meta.get("recomputed"):
            # an output of a multi-output op is made with the op: no other step between them
            first_use = nodes.index(node)
            node = node.args[0]
        else:
            first_use = min(nodes.index(u) for u in node.users)
        between = nodes[nodes.index(node) + 1 : first_use]
        # Only other recomputations (feeding the same use) may sit between a value and its first use.
        assert all(n.meta.get("recomputed") for n in between), f"{node.name} recomputed too early"


class _RepeatedHeads(torch.nn.Module):
    """A key computed pointwise, then repeated over heads (``expand`` and ``reshape``) before a
    matrix product, as grouped-query attention repeats its keys."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        key = torch.sin(x @ self.w) * 3
        heads = key[:, :, None].expand(4, 2, 7, 16, 8).reshape(4, 14, 16, 8)
        return (heads @ self.w).sum()


def test_a_broadcast_of_a_saved_value_is_made_again_in_the_backward():
    from planner.emit import broadcast
    from tests.training import assert_same_step

    model, x = _RepeatedHeads(), torch.randn(4, 2, 16, 8)
    joint = planner.capture(model, (x,))
    problem = build_problem(joint, get_estimator("flops"))
    fw, bw = emit(joint, problem, ("mul",))
    returned = next(iter(fw.graph.find_nodes(op="output"))).args[0]
    # an expand handed over is written out whole by inductor's CUDA backend; its base goes instead
    assert not any(broadcast(n.meta["val"]) for n in returned if isinstance(n.meta.get("val"), torch.Tensor))
    assert any(n.target is torch.ops.aten.expand.default for n in calls(bw))
    assert_same_step(lambda: (_RepeatedHeads(), (torch.randn(4, 2, 16, 8),)),
                     lambda m, inputs: planner.compile(m, memory_budget=0.5, codegen="eager", time_limit=5))


class _ReluSum(torch.nn.Module):
    """``relu(x @ w).mean()``: the backward reads only ReLU's mask, which AOTAutograd traces there."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 32))

    def forward(self, x):
        return torch.relu(x @ self.w).mean()


def test_a_mask_the_backward_makes_from_forward_values_is_a_forward_value():
    from planner.bounds import runtime_optimal_plan
    from planner.build import backward_born
    from tests.training import assert_same_step

    def make():
        torch.manual_seed(0)
        return _ReluSum(), (torch.randn(8, 16),)

    joint = planner.capture(*make(), codegen="inductor")  # decomposed: threshold_backward compares with 0
    mask = next(n for n in joint.graph.nodes if n.meta.get("partitioner_tag") == "is_backward"
                and n.meta["val"].dtype == torch.bool)
    relu = next(n for n in joint.graph.nodes if n.target is torch.ops.aten.relu.default)
    assert mask in joint.forward_nodes and backward_born(mask) and mask.prev is relu  # placed with its input
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    i, r = problem.names.index(mask.name), problem.names.index(relu.name)
    assert problem.runtime[i] == 0.0 and problem.runtime[r] > 0.0  # computed once whatever the plan
    fast = runtime_optimal_plan(problem)
    assert fast.saved[i] and not fast.saved[r]  # a byte an element, not four

    def run_planned(twin, inputs):
        result = planner.plan(twin, inputs, memory_budget=1.0,
                              config=planner.PlannerConfig(fast_end="model"))
        assert mask.name in result.decision.saved and relu.name not in result.decision.saved
        return result.module

    assert_same_step(make, run_planned)


def test_a_recomputed_dropout_mask_is_stored_not_its_random_tensor_and_trains_as_torch_compile():
    """Recomputed in the backward from its seed, a dropout's mask is read by the recomputed
    forward and by the dropout's backward: the emitter lays the mask out as traced, so inductor
    stores it (bool) and not the float32 random tensor it is made from, and the memory model
    counts the mask. The step draws what torch.compile's own draws (inductor's seeds)."""
    from planner.bounds import min_memory_plan
    from planner.emit import store_narrow_random
    from planner.memory import build_schedule, narrow_random_value, readers, simulate, stored_bytes
    from tests.training import step

    model, inputs = MODELS["gpt"]()
    joint = planner.capture(model, inputs, codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    # the schedule the solvers plan with counts the mask's copy, not the random tensor's
    schedule, nodes = build_schedule(joint, fuse=True), joint.forward_nodes
    narrowed = {i: nodes.index(v) for i, node in enumerate(nodes) if (v := narrow_random_value(node)) is not None}
    assert narrowed and all(schedule.fused[i] and schedule.copy_bytes[i] == 0 for i in narrowed)
    assert all(schedule.copy_bytes[j] == nodes[j].meta["val"].numel() for j in narrowed.values())
    plan = min_memory_plan(problem)
    outputs = joint.num_fwd_outputs
    fw, bw = emit(joint, problem, tuple(problem.names[i] for i in plan.saved.nonzero()[0]))
    assert plan.peak_bytes >= simulate(fw, bw, outputs, fuse=True).peak  # the bound holds
    forced = [n for n in calls(bw) if n.target is _torch_compat.as_traced_strides()]
    masks = [n.args[0] for n in forced if n.args[0].meta["val"].dtype == torch.bool]
    assert masks and len(masks) == len(forced)
    for mask in masks:
        random = mask
        while str(random.target) != "prims.inductor_random.default":
            random = random.args[0]
        assert random.meta["val"].dtype == torch.float32 and stored_bytes(random, readers(random), fuse=True) == 0
        assert stored_bytes(mask, readers(mask), fuse=True) == mask.meta["val"].numel()
        assert len(set(readers(mask))) >= 2
    assert store_narrow_random(bw.graph) == []  # once laid out, nothing more to do

    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    expected = step(torch.compile(model), inputs, model)
    actual = step(planner.compile(twin, memory_budget=0.0, time_limit=5), inputs, twin)
    torch.testing.assert_close(actual[0], expected[0], atol=1e-5, rtol=0)
    for name, grad in expected[1].items():
        torch.testing.assert_close(actual[1][name], grad, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("size, stride, offset, replaced", [
    ([2, 16], [16, 1], 0, True),       # row-major over all 32
    ([2, 16], [1, 2], 0, True),        # column-major over all 32
    ([2, 1, 16], [1, 7, 2], 0, True),  # a size-1 dimension's stride is any
    ([2, 8], [16, 1], 0, False),       # half of them: the zeros stay
    ([2, 15], [16, 1], 1, False),      # an offset
    ([4, 8], [4, 1], 0, False),        # as many, but rows overlap
])
def test_a_scatter_over_its_whole_base_is_emitted_as_a_copy(size, stride, offset, replaced):
    from torch.fx.experimental.proxy_tensor import make_fx

    from planner.emit import whole_scatters_as_copies

    def scatter(base, source):
        return torch.ops.aten.as_strided_scatter.default(base, source, size, stride, offset)

    base, source = torch.arange(32.0) + 100, torch.randn(size)
    module = make_fx(scatter, tracing_mode="fake")(base, source)
    assert len(whole_scatters_as_copies(module)) == int(replaced)
    left = module.graph.find_nodes(op="call_function", target=torch.ops.aten.as_strided_scatter.default)
    assert len(left) == int(not replaced)
    torch.testing.assert_close(module(base, source), scatter(base, source), rtol=0, atol=0)
    out = next(iter(module.graph.find_nodes(op="output"))).args[0]
    assert out.meta["val"].shape == base.shape and out.meta["val"].stride() == base.stride()
