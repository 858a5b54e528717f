"""Budget 1.0 at PyTorch's split is torch.compile's own step: its graphs, its inductor settings."""
import pytest
import torch
from torch import nn
import torch._inductor.compile_fx as compile_fx_module
import torch._inductor.config as inductor_config

import planner
from planner import _torch_compat
from planner.torch_split import FAST_END_CHOICE, compiles_as_pytorch
from planner.models import GPTConfig, gpt_example
from tests.models import MODELS
from tests.training import assert_same_step

SETTINGS = ("allow_buffer_reuse", "reorder_for_peak_memory")


@pytest.fixture
def compiled(monkeypatch):
    """Each module inductor compiles, with its code, whether it is marked to be compiled as
    torch.compile does, and the inductor settings in force while it compiles."""
    seen = []
    original = compile_fx_module.compile_fx_inner

    def recording(gm, example_inputs, **kwargs):
        seen.append({"code": gm.code, "as_pytorch": _torch_compat.compiled_as_pytorch(gm),
                     **{key: getattr(inductor_config, key) for key in SETTINGS}})
        return original(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx_inner", recording)
    # compiled, not read back from the caches an earlier run of the suite filled
    with inductor_config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield seen


def _torch_compile(model):
    """``torch.compile(model)`` (inductor as its backend calls it), its modules recorded too."""
    def inductor(gm, example_inputs):
        return compile_fx_module.compile_fx(gm, example_inputs, inner_compile=compile_fx_module.compile_fx_inner)

    return torch.compile(planner.own_frame(model), backend=inductor)


def _step(module, inputs):
    out = module(*inputs)
    (out if out.dim() == 0 else out.sum()).backward()


class _ResidualCNN(nn.Module):
    """Two convolutions with BatchNorm around a residual sum, then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + x)
        return self.head(y.mean((2, 3))).float().sum()


def _bf16_residual_cnn():
    """In bfloat16, on the CPU, where inductor lays out convolutions channels-last: the residual
    gradient reaches BatchNorm's backward through a widening cast."""
    torch.manual_seed(0)
    return _ResidualCNN().to(torch.bfloat16), (torch.randn(4, 8, 16, 16, dtype=torch.bfloat16),)


@pytest.mark.parametrize("model", ["gpt", "views_inplace", "bf16_residual_cnn"])
def test_budget_one_at_the_split_compiles_the_graphs_torch_compile_compiles(model, compiled):
    make = {**MODELS, "bf16_residual_cnn": _bf16_residual_cnn}[model]
    network, inputs = make()
    _step(_torch_compile(network), inputs)
    stock = list(compiled)
    assert len(stock) == 2
    compiled.clear()
    network, inputs = make()
    planned = planner.compile(network, memory_budget=1.0, solver="greedy", time_limit=5)
    _step(planned, inputs)
    decision = planned.planner_backend.graphs[0].decision
    assert decision.stats[FAST_END_CHOICE]["plan"] == "pytorch split" and compiles_as_pytorch(decision)
    assert [c["code"] for c in compiled] == [c["code"] for c in stock]  # forward, then backward
    assert all(c["as_pytorch"] for c in compiled)
    for key in SETTINGS:  # inductor's own settings, not the planner's
        assert [c[key] for c in compiled] == [c[key] for c in stock]
    assert compiled[0]["allow_buffer_reuse"] is True


def test_a_plan_of_its_own_compiles_with_the_planners_settings(compiled):
    network, inputs = MODELS["gpt"]()
    planned = planner.compile(network, memory_budget=0.0, solver="greedy", time_limit=5)
    _step(planned, inputs)
    assert not compiles_as_pytorch(planned.planner_backend.graphs[0].decision)
    assert len(compiled) == 2 and not any(c["as_pytorch"] for c in compiled)
    assert all(c["allow_buffer_reuse"] is False and c["reorder_for_peak_memory"] is False for c in compiled)


def test_inductor_options_apply_to_the_split_too(compiled):
    network, inputs = MODELS["mlp"]()
    planned = planner.compile(network, memory_budget=1.0, solver="greedy", time_limit=5,
                              inductor_options={"allow_buffer_reuse": False})
    _step(planned, inputs)
    assert compiles_as_pytorch(planned.planner_backend.graphs[0].decision)
    assert compiled and all(c["as_pytorch"] and c["allow_buffer_reuse"] is False for c in compiled)


def _gpt_without_dropout():
    return gpt_example(GPTConfig(n_layer=2, d_model=32, n_head=2, seq_len=16, vocab=64, batch=2, dropout=0.0))


@pytest.mark.parametrize("make", [_gpt_without_dropout, MODELS["views_inplace"]], ids=["gpt", "views_inplace"])
def test_the_split_compiled_as_torch_compile_trains_like_eager(make):
    # without dropout: inductor draws random numbers its own way unless told to fall back to
    # eager's, and that changes the graph PyTorch splits (the dropout GPT's split then holds 13%
    # more than the planner's fast end, which is taken instead)
    be = planner.backend(planner.PlannerConfig(codegen="inductor"), memory_budget=1.0, solver="greedy")
    assert_same_step(make, lambda twin, inputs: torch.compile(twin, backend=be))
    assert compiles_as_pytorch(be.graphs[0].decision)


def test_budget_one_weighs_the_split_torch_compile_makes_of_the_graph_as_handed_over(monkeypatch):
    """PyTorch's partitioner reads the node order: budget 1.0 weighs its split of the joint
    graph in the order AOTAutograd handed it over (what torch.compile runs), not of the
    planner's reordering (the dropout GPT's forward values tagged backward, placed after their
    inputs)."""
    from estimators import get_estimator
    from planner import torch_split
    from planner.bounds import named_plan
    from planner.build import build_problem
    from planner.torch_split import pytorch_split_plan

    with torch._inductor.config.patch(fallback_random=True):
        joint = planner.capture(*MODELS["gpt"](), codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    handed_over = [n.name for n in joint.given_module().graph.nodes]
    assert handed_over != [n.name for n in joint.graph.nodes]
    split, orders = _torch_compat.pytorch_split_modules, []

    def seen(module, *args, **kwargs):
        orders.append([n.name for n in module.graph.nodes])
        return split(module, *args, **kwargs)

    monkeypatch.setattr(torch_split, "_PYTORCH_SPLITS", {})
    monkeypatch.setattr(_torch_compat, "pytorch_split_modules", seen)
    weighed = pytorch_split_plan(joint, problem)
    assert orders == [handed_over]
    names = _torch_compat.pytorch_saved_names(joint.given_module(), joint.joint_inputs, joint.num_fwd_outputs,
                                              known=set(problem.names))
    assert weighed.saved.tolist() == named_plan(problem, names).saved.tolist()


def test_where_pytorchs_partitioner_fails_the_planner_emits_the_split_and_says_so(compiled, monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("no split here")

    # the split weighed once in this process (kept per graph), then failing where it is compiled
    network, inputs = MODELS["mlp"]()
    _step(planner.compile(network, memory_budget=1.0, solver="greedy", time_limit=5), inputs)
    compiled.clear()
    monkeypatch.setattr(_torch_compat, "pytorch_split_modules", fails)
    network, inputs = MODELS["mlp"]()
    planned = planner.compile(network, memory_budget=1.0, solver="greedy", time_limit=5)
    with pytest.warns(UserWarning, match="PyTorch's partitioner failed to split this graph.*no split here"):
        _step(planned, inputs)
    assert compiles_as_pytorch(planned.planner_backend.graphs[0].decision)
    assert len(compiled) == 2 and not any(c["as_pytorch"] or c["allow_buffer_reuse"] for c in compiled)


def test_a_compile_at_the_split_runs_pytorchs_partitioner_once_per_graph(compiled, monkeypatch, tmp_path):
    """The split weighed while planning is the one compiled: same graph, same arguments
    (inductor's static inputs, the parameters, which PyTorch's partitioner counts free to save)."""
    from planner import torch_split
    from planner.decisions import forget_decisions

    calls = []
    split = _torch_compat.pytorch_split_modules
    monkeypatch.setattr(_torch_compat, "pytorch_split_modules", lambda *a, **kw: calls.append(kw) or split(*a, **kw))
    monkeypatch.setattr(torch_split, "_PYTORCH_SPLITS", {})
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    forget_decisions()  # solved here, not read back from an earlier test
    network, inputs = _gpt_without_dropout()
    planned = planner.compile(network, memory_budget=1.0, solver="greedy", time_limit=5)
    _step(planned, inputs)
    forget_decisions()
    assert compiles_as_pytorch(planned.planner_backend.graphs[0].decision)
    assert len(calls) == 1 and calls[0]["static_lifetime_input_indices"]
    assert len(compiled) == 2 and all(c["as_pytorch"] for c in compiled)


def test_a_plan_made_ahead_compiles_the_split_it_names(compiled):
    """plan() solves on a capture and compiles later on a graph traced again: the split found
    then saves what the plan names, so it is compiled as torch.compile does, with no warning."""
    import warnings

    network, inputs = _gpt_without_dropout()
    result = planner.plan(network, inputs, memory_budget=1.0, solver="greedy", config=planner.PlannerConfig(time_limit=5))
    assert compiles_as_pytorch(result.decision)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="PyTorch's")
        _step(result.module, inputs)
    assert len(compiled) == 2 and all(c["as_pytorch"] for c in compiled)


def test_a_plan_whose_split_saves_otherwise_is_emitted_as_it_names(compiled):
    """A plan that says it took PyTorch's split but names other values (a plan file made with
    another torch) runs what it names: the emitter's modules, and a warning says why."""
    from dataclasses import replace

    from planner.api import Plan
    from planner.bounds import runtime_optimal_plan

    network, inputs = _gpt_without_dropout()
    result = planner.plan(network, inputs, memory_budget=1.0, solver="greedy", config=planner.PlannerConfig(time_limit=5))
    problem = result.graph_plan.problem
    other = tuple(problem.names[i] for i in runtime_optimal_plan(problem).saved.nonzero()[0])
    assert set(other) != set(result.decision.saved)
    tampered = replace(result.graph_plan, decision=replace(result.decision, saved=other))
    network, inputs = _gpt_without_dropout()
    with pytest.warns(UserWarning, match="saves other values than the plan"):
        _step(Plan(network, tampered, result.config).module, inputs)
    assert len(compiled) == 2 and not any(c["as_pytorch"] for c in compiled)
