"""planner.compile, plan() in loops, graph breaks under one step budget, the named backend."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import planner
from planner.models import GPTConfig, gpt_example
from tests.training import assert_same_step

TINY = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16, vocab=64, batch=2, dropout=0.0)
EAGER = dict(codegen="eager", solver="greedy", time_limit=5)


def test_plan_twenty_times_on_fresh_instances_of_one_class():
    # torch.compile keeps 8 graphs per code object; the ninth plan of one class used to fail
    for _ in range(20):
        model, batch = gpt_example(TINY)
        twin = __import__("copy").deepcopy(model)
        result = planner.plan(model, batch, config=planner.PlannerConfig(memory_budget=1.0, **EAGER))
        torch.testing.assert_close(result.module(*batch), twin(*batch), atol=1e-5, rtol=0)


def test_compile_twenty_times_plans_every_instance():
    for _ in range(20):
        model, batch = gpt_example(TINY)
        compiled = planner.compile(model, memory_budget=1.0, **EAGER)
        compiled(*batch).backward()
        assert len(compiled.planner_backend.graphs) == 1  # planned, not run unplanned past the limit


class TwoGraphs(nn.Module):
    """A graph break in the middle: the step compiles into two graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.Tanh())
        self.second = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        torch._dynamo.graph_break()
        return self.second(h).sum()


def test_an_absolute_budget_bounds_the_steps_peak_across_graph_breaks():
    def make():
        torch.manual_seed(0)
        return TwoGraphs(), (torch.randn(128, 64),)

    model, inputs = make()
    alone = planner.compile(model, **EAGER)
    alone(*inputs).backward()
    first, second = alone.planner_backend.timelines
    # the second graph's backward runs first and leaves its weights' gradients alive through the first's
    second_grads = sum(p.numel() * p.element_size() for p in model.second.parameters())
    assert alone.planner_backend.grads_after(next(iter(alone.planner_backend._step))) == second_grads
    assert alone.planner_backend.predicted_step_peak == max(first.forward_peak, first.backward_peak + second_grads,
                                                            first.held_after_forward + second.peak)
    # a budget the second graph fits alone but not on top of what the first holds: it must plan
    # for what the first leaves (between its own most frugal peak and its fastest)
    from solvers.frugal import min_peak_plan

    frugal_second = min_peak_plan(alone.planner_backend.graphs[1].problem, 5).plan.peak_bytes
    budget = max(first.peak, first.held_after_forward + (frugal_second + second.peak) // 2)
    assert second.peak <= budget < alone.planner_backend.predicted_step_peak
    planned = {}

    def run(twin, inputs):
        planned["module"] = planner.compile(twin, memory_budget=budget, **EAGER)
        return planned["module"]

    assert_same_step(make, run)
    backend = planned["module"].planner_backend
    one, two = backend.graphs
    assert one.decision.budget_bytes == budget
    assert two.decision.budget_bytes == budget - backend.timelines[0].held_after_forward
    assert backend.predicted_step_peak <= budget


class HandsOn(nn.Module):
    """A first graph whose own peak is its weights' gradients (its activations are small beside
    them), whose output goes on to a second graph that computes the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(64, 4096), nn.GELU(), nn.Linear(4096, 64))
        self.second = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        torch._dynamo.graph_break()
        return self.second(h).sum()


def test_a_graph_that_hands_its_outputs_on_holds_less_at_a_lower_budget():
    # alone, the first graph's least peak is set by its backward whatever it saves; in the step
    # its saved values wait while the second graph runs, so budget 0 must hold less than 1.0
    from planner.schedule import REST_OF_STEP

    def make():
        torch.manual_seed(0)
        return HandsOn(), (torch.randn(8, 64),)

    held = {}
    for budget in (0.0, 1.0):
        planned = {}

        def run(twin, inputs, budget=budget):
            planned["module"] = planner.compile(twin, memory_budget=budget, **EAGER)
            return planned["module"]

        assert_same_step(make, run)
        backend = planned["module"].planner_backend
        first, second = (g.problem.schedule.step_names[0] for g in backend.graphs)
        assert first == REST_OF_STEP and second != REST_OF_STEP  # the second returns the loss
        held[budget] = backend.timelines[0].held_after_forward
    assert held[0.0] < held[1.0]


def test_a_graph_that_hands_its_outputs_on_is_planned_again_for_the_step_it_saw():
    # at compile time the rest of the step is assumed as large as the first graph's own least
    # peak; after one step the second graph's real peak is known, and the first graph is planned
    # again for it (compiled again where its plan changes), training like eager throughout
    from planner.schedule import REST_OF_STEP

    torch.manual_seed(0)
    model, inputs = HandsOn(), (torch.randn(8, 64),)
    twin = __import__("copy").deepcopy(model)
    compiled = planner.compile(twin, memory_budget=0.0, codegen="eager", solver="cpsat", time_limit=10)
    backend = compiled.planner_backend
    predicted = []
    for _ in range(3):
        from tests.training import step

        expected, got = step(model, inputs, model), step(compiled, inputs, twin)
        torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=0)
        for name, grad in expected[1].items():
            torch.testing.assert_close(got[1][name], grad, atol=1e-5, rtol=0, msg=name)
        predicted.append(backend.predicted_step_peak)
    first, second = backend.step
    first_key = next(iter(backend._step))
    assert backend.rest_after(first_key) == second.peak  # what ran between its forward and backward
    problem = backend.graphs[0].problem
    s = problem.schedule
    own = s.owner == __import__("numpy").arange(len(s.owner))
    held = int(problem.nbytes[own & s.held.astype(bool)].sum())
    # its output, which the second graph consumes, is freed before its backward: alive through
    # the rest of the step, not held through the backward
    assert backend._parts[first_key].released == (0,) and held == 0
    output = 8 * 64 * 4
    assert s.step_names[0] == REST_OF_STEP and s.base[0] == output + int(s.fwd_base[-1]) + second.peak
    # planned for what the step needs, the step's predicted peak is no higher than at compile time
    assert predicted[1] == predicted[2] <= predicted[0]
    assert backend._parts[first_key].seen
    # and its backward runs beside the second graph's weight gradients, counted at each of its steps
    second_grads = sum(p.numel() * p.element_size() for p in twin.second.parameters())
    assert backend.grads_after(first_key) == backend._parts[first_key].beside_backward == second_grads > 0


def test_replan_false_keeps_the_plans_made_at_compile_time():
    torch.manual_seed(0)
    model, inputs = HandsOn(), (torch.randn(8, 64),)
    compiled = planner.compile(model, memory_budget=0.0, replan=False, codegen="eager", solver="cpsat", time_limit=10)
    compiled(*inputs).backward()
    first = list(compiled.planner_backend.graphs)
    compiled(*inputs).backward()
    assert compiled.planner_backend.graphs == first and compiled.planner_backend.replanned == []
    with pytest.raises(planner.ConfigError, match="replan='yes' is invalid"):
        planner.PlannerConfig(replan="yes")


def test_the_named_backend_reads_its_settings_from_the_environment(tmp_path):
    config = tmp_path / "plan.toml"
    config.write_text('[planner]\nmemory_budget = 1.0\nsolver = "greedy"\ncodegen = "eager"\n')
    script = textwrap.dedent("""
        import copy, torch
        from planner.models import GPTConfig, gpt_example
        model, batch = gpt_example(GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16, vocab=64, batch=2, dropout=0.0))
        twin = copy.deepcopy(model)
        torch.compile(model, backend="acplanner")(*batch).backward()   # found by name: planner not imported
        twin(*batch).backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=0)
        import planner.compiler as c
        print("plans", len(c.named_plans), c.named_plans[0].decision.solver)
    """)
    env = {**os.environ, "ACPLAN_CONFIG": str(config)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "plans 1 greedy" in done.stdout
    env["ACPLAN_CONFIG"] = str(tmp_path / "missing.toml")
    failed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).parent.parent)
    assert failed.returncode != 0 and "cannot read config file" in failed.stderr and "missing.toml" in failed.stderr


def test_torch_compiles_own_mode_and_options_reach_the_backend_by_name_or_as_an_object():
    """torch.compile hands its backend its ``options`` and ``mode``: options are planner settings
    over the config's, a mode its inductor settings (under inductor_options, whose own stand);
    planner.compile, compile_blocks, backend and plan take ``mode`` too. The modes that run CUDA
    graphs, a mode that does not exist and options that name no planner setting are refused,
    naming what to do instead."""
    from planner._torch_compat import inductor_modes
    from planner.compiler import named_plans

    def tiny():
        return gpt_example(GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16, vocab=64, batch=2, dropout=0.0))

    torch._dynamo.reset()  # torch.compile of the GPT class directly: no earlier test's compiles count
    settings = {"memory_budget": 0.0, "solver": "greedy", "codegen": "eager"}
    assert_same_step(tiny, lambda model, inputs: torch.compile(model, backend="acplanner", options=settings))
    model, batch = tiny()
    frugal = planner.plan(model, batch, **settings).decision
    assert named_plans[-1].decision.solver == "greedy" and named_plans[-1].decision.budget_bytes == frugal.budget_bytes

    torch._dynamo.reset()
    lite = inductor_modes()["lite"]
    assert lite  # a mode of inductor settings, which the planned graphs are compiled with
    objects = []
    assert_same_step(tiny, lambda model, inputs: torch.compile(
        model, backend=objects.append(planner.backend(solver="greedy")) or objects[-1], mode="lite"))
    assert objects[0].config.inductor_options == lite and objects[0].graphs
    # the settings given so reach the compile itself, not only the backend's config
    torch._dynamo.reset()
    unknown = torch.compile(tiny()[0], backend=planner.backend(), options={"inductor_options": {"no_such_setting": 1}})
    with pytest.raises(Exception, match="inductor has no setting no_such_setting"):
        unknown(*batch)
    assert planner.compile(model, mode="lite").planner_backend.config.inductor_options == lite
    assert planner.backend(mode="default").config.inductor_options == {}

    autotuned = inductor_modes()["max-autotune-no-cudagraphs"]
    mine = planner.PlannerConfig(inductor_options={"coordinate_descent_tuning": False})
    assert mine.with_compile_arguments("max-autotune-no-cudagraphs").inductor_options == {
        **autotuned, "coordinate_descent_tuning": False}
    for mode in [m for m, options in inductor_modes().items() if options.get("triton.cudagraphs")]:
        with pytest.raises(planner.ConfigError, match=f"mode='{mode}'.*CUDA graphs.*max-autotune-no-cudagraphs"):
            planner.PlannerConfig().with_compile_arguments(mode)
    with pytest.raises(planner.ConfigError, match="no such mode; inductor's are default"):
        planner.compile(model, mode="fastest")
    with pytest.raises(planner.ConfigError, match="max_autotune.*inductor's go under inductor_options"):
        planner.PlannerConfig().with_compile_arguments(options={"max_autotune": True})
    with pytest.raises(planner.ConfigError, match="did you mean memory_budget"):
        planner.PlannerConfig().with_compile_arguments(options={"memory_budjet": 0.5})
    with pytest.raises(planner.ConfigError, match="give a dict of planner settings"):
        planner.PlannerConfig().with_compile_arguments(options=[("memory_budget", 0.5)])


def test_a_recompiled_graph_replaces_its_earlier_self_in_the_step():
    torch.manual_seed(0)
    model = TwoGraphs()
    compiled = planner.compile(model, **EAGER)
    for rows in (128, 96, 64):  # new shapes: each frame compiles again
        compiled(torch.randn(rows, 64)).backward()
    backend = compiled.planner_backend
    assert len(backend.graphs) >= 4  # two frames, recompiled
    first_frame, second_frame = list(backend._step.values())
    # the step is the latest graph of each frame, not every graph compiled
    assert backend.predicted_step_peak == max(first_frame.peak, first_frame.held_after_forward + second_frame.peak)
    assert backend.predicted_step_peak < sum(t.held_after_forward for t in backend.timelines)


def test_the_plan_summary_names_the_rest_of_the_step_only_where_outputs_go_on():
    from tests.models import cnn, mlp

    settings = dict(memory_budget=0.0, solver="greedy")
    handed_on = planner.plan(*mlp(), **settings)  # returns a tensor the caller's loss reads
    assert "rest of the step" in handed_on.summary()
    assert handed_on.predicted.peak_bytes >= handed_on.graph_plan.problem.schedule.base[0]
    assert "rest of the step" not in planner.plan(*cnn(), **settings).summary()  # returns its loss


class WideHandOff(nn.Module):
    """A first graph whose wide output goes on to a second graph that makes the loss of it;
    ``keep`` also returns that output, which the caller then holds through the backward."""

    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.keep = keep
        self.first = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 4096))

    def forward(self, x: torch.Tensor):
        h = self.first(x)
        torch._dynamo.graph_break()
        loss = (h.tanh() * 2).sum()
        return (loss, h) if self.keep else loss


@pytest.mark.parametrize("keep", [False, True])
def test_an_output_the_step_frees_before_the_backward_is_not_counted_through_it(keep):
    # the first graph's output is consumed by the second graph; where the caller drops it, it is
    # freed before the first graph's backward, which is counted again without it after one step
    from planner.memory import simulate

    torch.manual_seed(0)
    model, x = WideHandOff(keep), torch.randn(32, 64)
    compiled = planner.compile(model, memory_budget=1.0, **EAGER)
    backend = compiled.planner_backend
    out = compiled(x)  # compiles both graphs; the backward has not begun
    loss = out[0] if keep else out
    first_key = next(iter(backend._step))
    part = backend._parts[first_key]
    forward, backward, outputs, fuse = part.simulated
    before = backend._step[first_key]
    assert before == simulate(forward, backward, outputs, fuse) and part.released is None
    loss.backward()
    after = backend._step[first_key]
    assert part.simulated is None and backend.timelines[part.index] is after
    if keep:
        assert part.released == () and after == before
        return
    assert part.released == (0,) and after == simulate(forward, backward, outputs, fuse, released=(0,))
    wide = 32 * 4096 * 4
    fwd = [b for phase, _, b in before.steps if phase == "forward"]
    assert fwd == [b for phase, _, b in after.steps if phase == "forward"]  # alive while the second graph runs
    assert after.held_after_forward == before.held_after_forward
    drop = {b0 - b1 for (p, _, b0), (_, _, b1) in zip(before.steps, after.steps) if p == "backward"}
    assert drop == {wide}  # at every step of its backward
    assert backend.predicted_step_peak <= max(before.peak, before.held_after_forward + backend.step[1].peak)


class SavedOutput(nn.Module):
    """One graph returning its loss and a wide value its backward reads (saved for it, as a
    language model's logits are), which the caller may drop before the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(64, 4096)

    def forward(self, x: torch.Tensor):
        logits = self.head(x)
        return (logits * logits).sum(), logits


@pytest.mark.parametrize("keep", [False, True])
def test_an_output_saved_for_the_backward_that_the_caller_drops_is_freed_at_its_last_reader(keep):
    # the saved value holds the output's storage, so whether the caller holds it is seen on the
    # tensor: once dropped it lives only as long as the backward reads it, not to the backward's end
    from planner.memory import simulate

    torch.manual_seed(0)
    compiled = planner.compile(SavedOutput(), memory_budget=1.0, **EAGER)
    backend = compiled.planner_backend
    loss, logits = compiled(torch.randn(32, 64))
    part = next(iter(backend._parts.values()))
    forward, backward, outputs, fuse = part.simulated
    before = backend._step[next(iter(backend._step))]
    if not keep:
        del logits
    loss.backward()
    after = backend.timelines[part.index]
    if keep:
        assert part.released == () and after == before
        return
    assert part.released == (1,) and after == simulate(forward, backward, outputs, fuse, released=(1,))
    assert backend.graphs[0].decision.saved  # the logits' storage stays alive into the backward
    wide = 32 * 4096 * 4
    drops = [b0 - b1 for (p, _, b0), (_, _, b1) in zip(before.steps, after.steps) if p == "backward"]
    assert drops[0] == 0 and drops[-1] == wide  # alive while read, freed before the backward ends


class KeptView(nn.Module):
    """:class:`WideHandOff` whose second graph also returns a detached view of the first
    graph's wide output (no autograd link to it), which the caller keeps through the backward
    while the output itself is dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 4096))

    def forward(self, x: torch.Tensor):
        h = self.first(x)
        torch._dynamo.graph_break()
        return (h.tanh() * 2).sum(), h.detach()[:, :8]


def test_an_output_whose_storage_a_view_the_caller_keeps_holds_stays_counted():
    # the first graph's output tensor is gone when its backward begins, but a detached view of
    # it the caller kept holds its storage, and the graph saves no value in it: it stays counted
    torch.manual_seed(0)
    compiled = planner.compile(KeptView(), memory_budget=1.0, **EAGER)
    backend = compiled.planner_backend
    loss, view = compiled(torch.randn(32, 64))
    first_key = next(iter(backend._step))
    part = backend._parts[first_key]
    before = backend._step[first_key]
    loss.backward()
    assert view.untyped_storage().nbytes() == 32 * 4096 * 4  # the whole output's storage, still alive
    assert part.released == () and backend._step[first_key] == before


class LossOf(nn.Module):
    """:class:`SavedOutput`'s loss alone, its wide value kept inside the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = SavedOutput()

    def forward(self, x: torch.Tensor):
        return self.inner(x)[0]


@pytest.mark.parametrize("returned", [False, True])
def test_a_saved_value_the_caller_also_got_is_not_written_in_place(returned):
    # AOTAutograd donates saved values to the backward unless a user output shares their storage:
    # inductor writes the gradient into the saved value only where it is not returned as well,
    # and the simulation counts it so
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    compiled = planner.compile(SavedOutput() if returned else LossOf(), memory_budget=1.0, codegen="inductor",
                               solver="greedy", time_limit=5)

    def step():
        out = compiled(torch.randn(32, 64))
        loss = out[0] if returned else out
        del out  # the caller drops the wide value before the backward
        loss.backward()

    _, codes = run_and_get_code(step)
    backward = next(code for code in codes if "tangents_1" in code)
    reused = [line for line in backward[backward.index("def call"):].splitlines() if "# reuse" in line]
    backend = compiled.planner_backend
    timeline = backend.timelines[0]
    in_place = {name for phase, name in timeline.written_in_place if phase == "backward"}
    assert backend.graphs[0].decision.saved  # the wide value is saved for the backward
    problem = backend.graphs[0].problem
    saved = [problem.index([name])[0] for name in backend.graphs[0].decision.saved]
    assert problem.schedule.undonated[saved].any() == returned  # the schedule says so too
    if returned:
        assert backend._parts[next(iter(backend._step))].released == (1,)  # counted freed at its last reader
        assert not reused and not in_place
    else:
        assert len(reused) == 1 and len(in_place) == 1


def test_a_graph_whose_output_the_step_frees_is_planned_again_without_holding_it():
    # seen freed on the first step, the output is not held through the first graph's backward
    # in its schedule either: the graph is planned again for that, and trains like eager
    from tests.training import step

    torch.manual_seed(0)
    model, x = WideHandOff(keep=False), torch.randn(32, 64)
    twin = __import__("copy").deepcopy(model)
    compiled = planner.compile(twin, memory_budget=0.0, codegen="eager", solver="cpsat", time_limit=5)
    backend = compiled.planner_backend
    held = []
    for _ in range(3):
        expected, got = step(model, (x,), model), step(compiled, (x,), twin)
        torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=0)
        for name, grad in expected[1].items():
            torch.testing.assert_close(got[1][name], grad, atol=1e-5, rtol=0, msg=name)
        held.append(bool(backend.graphs[0].problem.schedule.held.any()))
    assert held == [True, False, False]  # planned at compile time holding it, then for the step seen
    first_key = next(iter(backend._step))
    assert backend._parts[first_key].released == (0,)


def _shared_forward(self, x: torch.Tensor) -> torch.Tensor:
    """One code object for two kinds of layer (as a library's forward decorator is): dynamo
    compiles the frame it resumes in after the break once per kind."""
    h = self.inner(x)
    torch._dynamo.graph_break()
    return torch.tanh(self.out(h)) + x


class _Narrow(nn.Module):
    forward = _shared_forward

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.out = nn.Sequential(nn.Linear(32, 64), nn.GELU()), nn.Linear(64, 32)


class _Wide(nn.Module):
    forward = _shared_forward

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU())
        self.out = nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 32))


class TwoKinds(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Narrow(), _Narrow(), _Wide(), _Wide()])

        self.wide = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers if self.wide else self.layers[:2]:
            x = layer(x)
        return x.pow(2).mean()


@pytest.mark.parametrize("codegen", ["eager", "inductor"])
def test_two_compiles_of_one_frame_in_one_step_are_planned_apart(codegen):
    # the frame after the break compiles once for each kind of layer, and both run in every step:
    # each compile is its own part, counted and planned again for its own runs (the second
    # compile used to take the first's place, and planning the first again compiled the
    # second's graph with the first's inputs)
    import warnings

    torch.manual_seed(0)
    model, inputs = TwoKinds(), (torch.randn(16, 32),)
    compiled = {}

    def run(twin, inputs):
        compiled["module"] = planner.compile(twin, memory_budget=0.0, codegen=codegen, solver="greedy", time_limit=5)
        return compiled["module"]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same_step(lambda: (TwoKinds(), inputs), run)
        module = compiled["module"]
        for _ in range(2):
            module(*inputs).backward()
    assert not [w for w in caught if "failed to compile" in str(w.message)]
    backend = module.planner_backend
    variants = [key for key in backend._parts if len(key) == 3]  # a later compile of a frame, beside it
    assert variants and all(key[:2] in backend._parts for key in variants)
    # the wide layers' graphs run twice before their backward, and were planned again for that
    assert any(backend.runs[key] == backend._parts[key].repeats == 2 for key in variants)
    # every compile still runs, so every one counts in the step's prediction
    assert all(part.last_step == backend._steps for part in backend._parts.values())
    assert len(backend.step) == len(backend._parts)


def test_a_compile_the_step_no_longer_runs_stops_counting_in_it():
    torch.manual_seed(0)
    model, inputs = TwoKinds(), (torch.randn(16, 32),)
    compiled = planner.compile(model, memory_budget=0.0, **EAGER)
    backend = compiled.planner_backend
    compiled(*inputs).backward()
    whole, parts = backend.predicted_step_peak, len(backend.step)
    model.wide = False  # the wide layers' compiles run no more
    for _ in range(3):
        compiled(*inputs).backward()
    stale = {key for key, part in backend._parts.items() if part.last_step < backend._steps}
    assert stale and len(backend.step) == parts - len(stale)
    assert backend.predicted_step_peak < whole


def _library_decorator(forward):
    """A wrapper every decorated forward shares one code object of (as transformers' are)."""
    def wrapper(self, x):
        return forward(self, x)
    return wrapper


class _Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    @_library_decorator
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        torch._dynamo.graph_break()
        return torch.tanh(h).sum()


def test_compiles_of_library_code_shared_by_every_model_never_run_unplanned():
    # the decorator's wrapper is one code object for every model in the process: each compile
    # adds a cache entry to it, and past torch's recompile limit (8) it ran eagerly, unplanned
    counts = []
    for _ in range(12):
        compiled = planner.compile(_Decorated(), memory_budget=1.0, **EAGER)
        compiled(torch.randn(4, 16)).backward()
        counts.append(len(compiled.planner_backend.graphs))
    assert counts[0] >= 2 and counts == counts[:1] * 12


@pytest.mark.parametrize("eager_bytes", [0, 5000])
def test_what_code_outside_the_graphs_holds_counts_in_the_steps_prediction(monkeypatch, eager_bytes):
    # eager code between graph breaks (a mask, a norm, what autograd saves for them) holds memory
    # no graph plans: on a CUDA device the allocator shows it as the next graph begins. Here the
    # allocator is played: it reports what the first graph is predicted to hold, plus eager_bytes
    torch.manual_seed(0)
    model, inputs = TwoGraphs(), (torch.randn(128, 64),)
    compiled = planner.compile(model, **EAGER)
    backend = compiled.planner_backend
    first_runs: list = []

    def allocated(args):
        if not first_runs or first_runs[-1] == "second":  # runs alternate: first graph, second graph
            first_runs.append("first")
            return 10_000
        first_runs.append("second")
        return 10_000 + backend.step[0].held_after_forward + eager_bytes

    monkeypatch.setattr(planner.compiler, "_allocated", allocated)
    for _ in range(5):
        compiled(*inputs).backward()
    # read as each graph's run began in the first steps alone (the allocator's statistics cost)
    assert len(first_runs) == 2 * planner.compiler.OUTSIDE_MEASURED_STEPS < 2 * 5
    (first, first_line), (second, second_line) = backend._live.items()
    assert backend._parts[first].outside == 0 and backend._parts[second].outside == eager_bytes
    # the second graph's backward runs first, so no gradients of later graphs are alive in it
    second_term = first_line.held_after_forward + eager_bytes + max(second_line.forward_peak, second_line.backward_peak)
    first_term = max(first_line.forward_peak, first_line.backward_peak + backend.grads_after(first))
    assert backend.predicted_step_peak == max(first_term, second_term)
    assert second_term > first_term  # so the eager bytes raise the step's prediction


class _BrokenBlock(nn.Module):
    """A block whose code breaks the graph first: the rest is compiled once and run for each
    block, with that block's parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 1024), nn.GELU(), nn.Linear(1024, 64))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return h + self.net(h)


class _Blocks(nn.Module):
    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Linear(64, 64)
        self.blocks = nn.ModuleList(_BrokenBlock() for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x).tanh()
        for block in self.blocks:
            h = block(h)
        return h.square().mean()


def test_the_gradients_of_every_run_of_a_repeated_graph_count_in_the_steps_peak():
    """A graph run once per block leaves each block's gradients in its own parameters: all of
    them are alive while the first block's backward runs last, and while any graph before them
    runs its backward. The step's prediction counts every run's (on an H200, Wav2Vec2's six
    encoder layers, one graph run six times, left 81 MiB of gradients where one layer's, 13.5,
    had been counted: budget 0 predicted 433.3 MiB, traced 502.0)."""
    torch.manual_seed(0)
    model, x = _Blocks(), torch.randn(4, 64)
    compiled = planner.compile(model, memory_budget=1.0, **EAGER)
    for _ in range(planner.compiler.COUNTED_STEPS + 1):
        compiled(x).backward()
    backend = compiled.planner_backend
    key = next(key for key in backend._live if backend._repeats_of(key) == len(model.blocks))
    one = sum(p.numel() * p.element_size() for p in model.blocks[0].parameters())
    assert backend._parts[key].grad_bytes == one
    assert backend._grad_bytes(key) == len(model.blocks) * one
    timeline = backend._live[key]
    assert backend.predicted_step_peak >= timeline.backward_peak + backend.grads_after(key) + (len(model.blocks) - 1) * one


def test_counted_graphs_run_straight_through_after_the_first_steps_and_new_shapes_count_afresh():
    # counting runs costs a token and an autograd hook per run: after COUNTED_STEPS steps, each
    # graph measured and planned again, runs go straight through and leave no token
    torch.manual_seed(0)
    model = TwoGraphs()
    compiled = planner.compile(model, **EAGER)
    backend = compiled.planner_backend
    for _ in range(planner.compiler.COUNTED_STEPS + 2):
        compiled(torch.randn(128, 64)).backward()
    parts = list(backend._parts.values())
    assert len(parts) == 2 and all(part.seen and part.released is not None for part in parts)
    runs = dict(backend.runs)
    compiled(torch.randn(128, 64))  # a forward whose backward never runs: once counted, a waiting run
    assert not any(len(part.waiting) for part in parts) and backend.runs == runs
    assert all(part.last_step == backend._steps for part in parts)
    # new shapes compile again: those graphs count their runs, and the step goes on being counted
    steps = backend._steps
    for _ in range(2):
        compiled(torch.randn(32, 64)).backward()
    fresh = [part for part in backend._parts.values() if part not in parts]
    # (the second step is the first to begin after a counted backward)
    assert fresh and backend._steps == steps + 1 and all(part.released is not None for part in fresh)
    expected = TwoGraphs()
    expected.load_state_dict(model.state_dict())
    x = torch.randn(32, 64)
    compiled.zero_grad(), compiled(x).backward()
    expected(x).backward()
    for (name, p), q in zip(model.named_parameters(), expected.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)


class _BrokenLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.up(x))
        torch._dynamo.graph_break()  # as a library's decorator breaks each layer
        return x + self.down(h)


class _BreakInEveryLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_BrokenLayer() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.pow(2).mean()


@pytest.mark.parametrize("replan", [True, False])
def test_a_whole_model_whose_break_resumes_in_every_layer_is_planned_for_its_runs_without_a_warning(replan):
    # the frame the break resumes in runs once per layer: planner.compile plans it again for
    # those runs, as expected, and says nothing; without replanning its runs are outside the
    # budget, and that is said
    import warnings

    torch.manual_seed(0)
    compiled = planner.compile(_BreakInEveryLayer(), memory_budget=0.0, replan=replan, **EAGER)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            compiled(torch.randn(16, 32)).backward()
    said = [w for w in caught if "before its backward" in str(w.message)]
    backend = compiled.planner_backend
    assert max(backend.runs.values()) >= 3
    if replan:
        assert not said
        assert max(part.repeats for part in backend._parts.values()) == max(backend.runs.values())
    else:
        assert said and "outside the memory budget" in str(said[0].message)


def test_compile_plans_each_input_shape_with_static_sizes(monkeypatch):
    """Inputs of a new size compile and plan again with that size, not with symbolic sizes
    (dynamo's default once it sees a size change: GPT-2 from transformers, whose graph break
    resumes in library frames), which a plan cannot count in bytes."""
    seen = []
    call = planner.PlannerBackend.__call__

    def record(self, gm, example_inputs):
        values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
        seen.append([isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(
            isinstance(size, torch.SymInt) for size in v.shape)) for v in values])
        return call(self, gm, example_inputs)

    monkeypatch.setattr(planner.PlannerBackend, "__call__", record)
    pytest.importorskip("transformers")
    from bench.zoo_models import build

    model, (ids, labels) = build("gpt2", "tiny")
    compiled = planner.compile(model, memory_budget=0.5, **EAGER)
    for seq in (32, 24):
        compiled(ids[:, :seq], labels[:, :seq]).backward()
    assert seen and not any(any(symbolic) for symbolic in seen)


def test_a_frame_compiled_for_a_third_input_shape_is_warned_about_once():
    """Each input shape is planned on its own: a frame whose shapes keep changing (batches padded
    to their longest sequence) is told, once, what that costs and how to avoid it."""
    model, batch = gpt_example(TINY)
    compiled = planner.compile(model, memory_budget=0.5, **EAGER)
    import warnings

    messages = []
    for seq in (16, 12, 8, 4):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled(*(x[:, :seq] for x in batch)).backward()
        messages.append([str(w.message) for w in caught if "compiled and planned 3 times" in str(w.message)])
    assert [len(m) for m in messages] == [0, 0, 1, 0]
    assert "pad inputs to a few fixed lengths" in messages[2][0]


def test_a_step_under_autocast_trains_as_torch_compile_does_at_every_budget():
    # mixed precision as most training loops run it: float32 weights, the step inside
    # torch.autocast. The joint graph holds autocast's casts; a plan that recomputes them and the
    # dropouts around them draws the same masks and rounds the same (bitwise, op by op)
    cfg = GPTConfig(n_layer=2, d_model=32, n_head=2, seq_len=16, vocab=64, batch=2, dropout=0.1)

    def step(run, model, batch):
        torch.manual_seed(7)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = run(*batch)
        loss.backward()
        return [loss.detach()] + [p.grad for p in model.parameters()]

    model, batch = gpt_example(cfg)
    twin = __import__("copy").deepcopy(model)
    want = step(torch.compile(twin, backend="aot_eager"), twin, batch)
    torch.manual_seed(7)
    assert not torch.equal(want[0], model(*batch).detach())  # autocast's rounding is in the step
    for budget in (1.0, 0.5, 0.0):
        twin = __import__("copy").deepcopy(model)
        compiled = planner.compile(twin, memory_budget=budget, **EAGER)
        got = step(compiled, twin, batch)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=0, rtol=0)
        if budget == 0.0:
            assert compiled.planner_backend.graphs[0].decision.recompute_seconds > 0


class _BreakInLoop(nn.Module):
    """Layers called in a loop whose body branches on a tensor's value: dynamo cannot resume
    inside the loop, so torch.compile skips the whole frame and hands its backend no graph."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) + x
            if x.norm().item() > 1e9:
                x = x * 0.5
        return x.pow(2).mean()


class _Disabled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)

    @torch.compiler.disable
    def forward(self, x):
        return self.layer(x).pow(2).mean()


def _no_graph_warnings(run) -> list[str]:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if "compiled no graph" in str(w.message)]


@pytest.mark.parametrize("model", [_BreakInLoop, _Disabled])
def test_a_model_torch_compile_runs_eagerly_is_told_that_its_budget_had_no_effect(model):
    torch.manual_seed(0)
    compiled = planner.compile(model(), memory_budget=0.0, **EAGER)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert not _no_graph_warnings(lambda: compiled(x))  # no training call yet: nothing to say
    told = _no_graph_warnings(lambda: compiled(x).backward())
    assert len(told) == 1 and "memory_budget had no effect" in told[0] and "planner.compile_blocks" in told[0]
    assert not compiled.planner_backend.graphs
    assert not _no_graph_warnings(lambda: compiled(x).backward())  # once


def test_a_model_whose_graphs_reach_the_planner_is_not_told_so():
    model, batch = gpt_example(TINY)
    compiled = planner.compile(model, memory_budget=0.5, **EAGER)
    with torch.no_grad():
        compiled(*batch)  # an evaluation call first: its graph reaches the backend too
    assert not _no_graph_warnings(lambda: compiled(*batch).backward())


def test_blocks_torch_compile_runs_eagerly_are_told_once_for_all_of_them():
    blocks = nn.ModuleList(_Disabled() for _ in range(2))
    planner.compile_blocks(blocks, memory_budget=0.5, **EAGER)
    told = _no_graph_warnings(lambda: sum(block(torch.randn(4, 8)) for block in blocks).backward())
    assert len(told) == 1 and "the blocks ran eagerly" in told[0] and "compile_blocks" not in told[0]
