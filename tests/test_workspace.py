"""Library kernels' scratch memory: measured in a child process, counted at its step."""
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import planner
import planner.workspace as workspace
from estimators import get_estimator
from planner.bounds import min_memory_plan, runtime_optimal_plan
from planner.build import build_problem
from planner.emit import emit
from planner.memory import convolutions_laid_out, simulate
from planner.problem import memory_profile
from planner.real_ops import argument_specs, run_in_child
from tests.models import MODELS

SCRATCH = 3 << 20


def three_mib(call, device):
    """A stand-in measurer for CPU tests: runs the call and reports 3 MiB of scratch."""
    call()
    return SCRATCH


def by_layout(call, device):
    """A stand-in measurer for CPU tests: 5 MiB of scratch for a convolution (or its backward)
    whose first output (a backward's first it computes) is laid out channels-last, 3 MiB for
    any other call."""
    out = call()
    first = next(o for o in out if o is not None) if isinstance(out, (tuple, list)) else out
    laid_out = first.dim() == 4 and first.is_contiguous(memory_format=torch.channels_last) and not first.is_contiguous()
    return 5 << 20 if laid_out else SCRATCH


def crash_on_batched(call, device):
    """Kills its process on a batched product, as a library kernel crashing on random inputs does."""
    out = call()
    if out.dim() == 3:
        os._exit(7)
    return out.numel()


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(workspace, "_BYTES", {})
    monkeypatch.setattr(workspace, "_FAILED", {})
    monkeypatch.setattr(workspace, "_LOADED", set())
    monkeypatch.setattr(workspace, "_LAID_OUT", {})
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    return monkeypatch


def _planned(name):
    model, inputs = MODELS[name]()
    joint = planner.capture(model, inputs, codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    plan = runtime_optimal_plan(problem)
    forward, backward = emit(joint, problem, [problem.names[i] for i in np.flatnonzero(plan.saved)])
    timeline = simulate(forward, backward, joint.num_fwd_outputs, fuse=True)
    kernels = {n.name for gm in (forward, backward) for n in gm.graph.nodes if workspace.workspace_bytes(n)}
    return timeline, memory_profile(problem, plan).peak, kernels


def test_cpu_graphs_are_not_measured(fresh):
    timeline, bound, kernels = _planned("cnn")
    assert kernels == set() and workspace.measured_workspaces() == {}


def test_scratch_is_alive_at_its_kernels_step_in_the_simulation_and_the_solvers_bound(fresh):
    before, bound_before, _ = _planned("cnn")
    fresh.setattr(workspace, "_DEVICES", {"cpu": "tests.test_workspace:three_mib"})
    after, bound_after, kernels = _planned("cnn")
    assert {"convolution", "convolution_backward"} <= {name.rstrip("_0123456789") for name in kernels}
    assert set(workspace.measured_workspaces().values()) == {SCRATCH}
    assert len(before.steps) == len(after.steps)
    for (phase, name, old), (_, _, new) in zip(before.steps, after.steps):
        assert new - old == (SCRATCH if name in kernels else 0), (phase, name)
    # no recomputation at the fast end: the schedule's bound is the simulation, scratch included
    assert bound_before == before.peak and bound_after == after.peak > before.peak
    # measured once per signature: a second graph of the same ops runs nothing
    again = planner.capture(*MODELS["cnn"](), codegen="inductor")
    laid_out = convolutions_laid_out([*again.primals, *again.forward_nodes])  # as the problem's build decides
    assert workspace.measure_workspaces(again.graph.nodes, channels_last=laid_out) == 0


def test_a_kernel_that_crashes_its_measuring_process_is_reported_and_the_rest_measured():
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    jobs = [(key, name, argument_specs(args), {}, "cpu", "tests.test_workspace:crash_on_batched", {})
            for key, name, args in [("first", "aten.mm.default", (a, b)),
                                    ("crashes", "aten.bmm.default", (a[None], b[None])),
                                    ("after", "aten.mm.default", (b.t(), a.t()))]]
    results = run_in_child(jobs)
    assert results["first"] == 8 and results["after"] == 8
    assert "stopped the measuring process (exit status 7" in results["crashes"]


def test_a_recomputed_kernels_scratch_is_in_the_solvers_bound_where_its_copy_is_made(fresh):
    fresh.setattr(workspace, "_DEVICES", {"cpu": "tests.test_workspace:three_mib"})
    model, inputs = MODELS["cnn"]()
    problem = build_problem(planner.capture(model, inputs, codegen="inductor"), get_estimator("flops"), fuse=True)
    plan = min_memory_plan(problem)
    s = problem.schedule
    copies = np.flatnonzero(plan.recomputed & (s.owner == np.arange(len(problem))) & (s.copy_scratch > 0))
    assert len(copies) and set(s.copy_scratch[copies]) == {SCRATCH}  # the convolutions, recomputed
    joint = planner.capture(model, inputs, codegen="inductor")
    forward, backward = emit(joint, problem, [problem.names[i] for i in np.flatnonzero(plan.saved)])
    timeline = simulate(forward, backward, joint.num_fwd_outputs, fuse=True)
    bound = memory_profile(problem, plan)
    without = memory_profile(replace(problem, schedule=replace(s, copy_scratch=np.zeros_like(s.copy_scratch))), plan)
    # each copy's scratch counted once, at the step it is made for
    assert int((bound.backward - without.backward).sum()) == SCRATCH * len(copies)
    simulated = {step: b for phase, step, b in timeline.steps if phase == "backward"}
    steps = [(step, int(bound.backward[t]), simulated[step]) for t, step in enumerate(s.step_names) if step in simulated]
    assert len(steps) > len(bound.backward) // 2
    assert [step for step in steps if step[2] > step[1]] == []
    assert timeline.peak <= bound.peak


def test_a_kernel_that_cannot_be_measured_is_named_in_a_warning_and_counted_as_none(fresh):
    fresh.setattr(workspace, "_DEVICES", {"cpu": "tests.test_workspace:crash_on_batched"})
    gm = make_fx(lambda a, b: torch.mm(a, b).sum() + torch.bmm(a[None], b[None]).sum(), tracing_mode="fake")(
        torch.randn(4, 8), torch.randn(8, 2))
    nodes = {str(n.target): n for n in gm.graph.nodes if n.op == "call_function"}
    with pytest.warns(UserWarning, match=r"1 library kernel\(s\) could not be measured .*aten\.bmm\.default"):
        # run op by op, the products and the two sums are library kernels; all but bmm measured
        assert workspace.measure_workspaces(gm.graph.nodes, fuse=False) == 3
    assert workspace.workspace_bytes(nodes["aten.mm.default"], fuse=False) == 8
    assert workspace.workspace_bytes(nodes["aten.bmm.default"], fuse=False) == 0
    (failed,) = workspace.failed_workspaces()
    assert failed.startswith("aten.bmm.default|")


def test_a_plans_summary_says_what_scratch_memory_it_counted(fresh):
    model, inputs = MODELS["cnn"]()
    config = planner.PlannerConfig(memory_budget=1.0, time_limit=5)
    assert "library scratch" not in planner.plan(model, inputs, config=config).summary()  # a CPU graph: none
    fresh.setattr(workspace, "_DEVICES", {"cpu": "tests.test_workspace:three_mib"})
    summary = planner.plan(model, inputs, config=config).summary()
    line = next(line for line in summary.splitlines() if line.startswith("library scratch"))
    assert "with scratch memory (largest 3.00 MiB, aten.convolution" in line, line


def test_convolutions_that_inductor_lays_out_channels_last_are_measured_so(fresh):
    """The traced graph's tensors are contiguous; inductor's layout optimisation runs the
    convolutions channels-last, forward and backward, and their scratch is measured that way,
    under a key of its own (a contiguous measurement of the same op is not reused)."""
    from planner.memory import CONVOLUTIONS

    fresh.setattr(workspace, "_DEVICES", {"cpu": "tests.test_workspace:by_layout"})
    model, inputs = MODELS["cnn"]()
    joint = planner.capture(model, inputs, codegen="inductor")
    convs = [n for n in joint.graph.nodes if n.target in CONVOLUTIONS]
    assert {n.target for n in convs} == set(CONVOLUTIONS)
    for laid_out, scratch in ((False, SCRATCH), (True, 5 << 20)):
        workspace.measure_workspaces(joint.graph.nodes, channels_last=laid_out)
        assert {workspace.workspace_bytes(n) for n in convs} == {scratch}
    keys = workspace.measured_workspaces()
    assert sum(key.endswith(workspace.CHANNELS_LAST) for key in keys) == len({workspace._LAID_OUT[k] for k in workspace._LAID_OUT})
    # the planner decides it as inductor does: on a CPU with oneDNN, convolutions are channels-last
    assert convolutions_laid_out([*joint.primals, *joint.forward_nodes]) == torch.backends.mkldnn.is_available()
