"""The fast end (budget 1.0): the least-memory hull plan within a slack of the fastest plan."""
import math

import pytest

from hypothesis import given, settings, strategies as st

import planner.bounds as bounds
from solvers.reference import reference_plan
from tests.synthetic import all_plans, brute_force_min_memory, random_problem


def _fast_end(problem, slack, monkeypatch):
    monkeypatch.setattr(bounds, "FAST_END_SLACK", slack)
    bounds._fast_end_plan.cache_clear()
    return bounds.fast_end_plan(problem)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 9))
def test_fast_end_stays_within_its_slack_and_holds_no_more_than_the_fastest(seed, n):
    import pytest

    with pytest.MonkeyPatch.context() as monkeypatch:
        problem = random_problem(seed, n, timed=True, priced=True)
        fastest = bounds.runtime_optimal_plan(problem)
        end = _fast_end(problem, bounds.FAST_END_SLACK, monkeypatch)
        assert end.seconds <= fastest.seconds + bounds.FAST_END_SLACK * float(problem.runtime.sum()) + 1e-12
        assert end.memory_bytes <= fastest.memory_bytes
        # no slack: as fast as the fastest plan; unbounded slack: the walk reaches the least memory
        assert math.isclose(_fast_end(problem, 0.0, monkeypatch).seconds, fastest.seconds, rel_tol=1e-9, abs_tol=1e-12)
        if problem.save_seconds.any():
            assert _fast_end(problem, math.inf, monkeypatch).memory_bytes == brute_force_min_memory(problem)
    bounds._fast_end_plan.cache_clear()


def test_without_save_costs_the_fast_end_is_the_fastest_plan():
    problem = random_problem(7, 8, timed=True, priced=False)
    assert not problem.save_seconds.any()
    assert bounds.fast_end_plan(problem) is bounds.runtime_optimal_plan(problem)


def _frugal_split(joint, problem, fuse=True):
    """PyTorch's split stubbed as the frugal reference: a split below the planner's fast end,
    which the test models do not have."""
    return _split_as(reference_plan(problem), joint, problem, fuse)


def _split_as(plan, joint, problem, fuse=True):
    """PyTorch's split stubbed as ``plan``, with the figures :func:`planner.torch_split.pytorch_split` gives."""
    import numpy as np

    from planner.predict import simulated_peak
    from planner.torch_split import PYTORCH_PEAK, PYTORCH_SIMULATED_PEAK

    names = tuple(problem.names[i] for i in np.flatnonzero(plan.saved))
    return plan, {PYTORCH_PEAK: plan.peak_bytes, PYTORCH_SIMULATED_PEAK: simulated_peak(joint, problem, names, fuse)}


def test_budget_one_holds_no_more_than_pytorchs_own_split(monkeypatch, tmp_path):
    """Budget 1.0 resolves to the least of the planner's fast end and PyTorch's split: on the
    small CNN and GPT the fast end holds no more than the split by the problem's figures (on
    the CNN it saves ReLU's mask where the split, named by the nodes it saves, is priced with
    the output), and simulated, PyTorch's modules hold about what the fast end's do, so 1.0 is
    the split itself, its budget the split's peak; where a split holds less (here one stubbed as the
    most frugal plan), 1.0 is that split's peak and the plan holds no more; with
    fast_end="model" it is the planner's fast end alone."""
    import numpy as np

    import planner.solve as solve
    from planner import torch_split
    from planner.solve import solve_graph
    from planner.torch_split import FAST_END_CHOICE, PYTORCH_PEAK, PYTORCH_SIMULATED_PEAK, pytorch_split_plan
    from planner.decisions import forget_decisions
    from planner.config import PlannerConfig
    from planner.tracing import as_inputs, capture
    from tests import models

    for make in (models.cnn, models.gpt):
        model, inputs = make()
        joint = capture(model, as_inputs(inputs), codegen="inductor")
        anchored = solve_graph(joint, PlannerConfig(memory_budget=1.0, fast_end="pytorch", time_limit=5))
        theirs = pytorch_split_plan(joint, anchored.problem)
        fast_end = bounds.fast_end_plan(anchored.problem).peak_bytes
        assert fast_end <= theirs.peak_bytes
        assert anchored.decision.stats[PYTORCH_PEAK] == theirs.peak_bytes
        compared = anchored.decision.stats[FAST_END_CHOICE]["compared"]
        assert compared["figures"] == "simulated" and compared["split"] == anchored.decision.stats[PYTORCH_SIMULATED_PEAK]
        assert compared["solver"] >= (1 - torch_split.SPLIT_PEAK_MARGIN) * compared["split"]
        assert anchored.decision.saved == tuple(anchored.problem.names[i] for i in np.flatnonzero(theirs.saved))
        assert anchored.decision.budget_bytes == theirs.peak_bytes

        frugal = reference_plan(anchored.problem)
        assert frugal.peak_bytes < fast_end
        forget_decisions()  # solved again, not the decision above read back
        monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path / make.__name__))
        monkeypatch.setattr(solve, "pytorch_split", _frugal_split)
        stubbed = solve_graph(joint, PlannerConfig(memory_budget=1.0, fast_end="pytorch", time_limit=5))
        own = solve_graph(joint, PlannerConfig(memory_budget=1.0, fast_end="model", time_limit=5))
        monkeypatch.undo()
        forget_decisions()
        assert stubbed.decision.stats[PYTORCH_PEAK] == stubbed.decision.budget_bytes == frugal.peak_bytes
        assert stubbed.decision.peak_bytes <= frugal.peak_bytes
        assert stubbed.decision.seconds <= frugal.seconds + 1e-12  # the split is among cpsat's starts
        assert PYTORCH_PEAK not in own.decision.stats and own.decision.budget_bytes == fast_end


def test_a_split_named_by_its_views_saves_their_bases():
    """PyTorch's split names views among its saved values (the GPT's transposed weights'
    products, reshaped); each stands for the storage it reads."""
    from planner import _torch_compat
    from planner.solve import solve_graph
    from planner.config import PlannerConfig
    from planner.tracing import as_inputs, capture
    from tests import models

    model, inputs = models.gpt()
    joint = capture(model, as_inputs(inputs), codegen="inductor")
    graph_plan = solve_graph(joint, PlannerConfig(memory_budget=1.0, fast_end="model", time_limit=5))
    problem = graph_plan.problem
    names = _torch_compat.pytorch_saved_names(joint.copy().module, joint.joint_inputs, joint.num_fwd_outputs)
    plan = bounds.named_plan(problem, names)
    index = {name: i for i, name in enumerate(problem.names)}
    views = [index[n] for n in names if n in index and not problem.saveable[index[n]]]
    assert views, "PyTorch's split of the GPT names no view; the test needs one"
    for i in views:
        while not problem.saveable[i] and len(problem.inputs[i]):
            i = int(problem.inputs[i][0])
        assert plan.saved[i] or not len(problem.inputs[i])  # the view's base is kept (or is a graph input)


def test_pytorchs_split_runs_once_per_graph(monkeypatch, tmp_path):
    """Budgets swept on one graph (a notebook) split it with PyTorch's partitioner once."""
    from planner import _torch_compat, solve, torch_split
    from planner.config import PlannerConfig
    from planner.decisions import forget_decisions
    from planner.tracing import as_inputs, capture
    from tests import models

    calls = []
    split = _torch_compat.pytorch_split_modules
    monkeypatch.setattr(_torch_compat, "pytorch_split_modules", lambda *a, **kw: calls.append(1) or split(*a, **kw))
    monkeypatch.setattr(torch_split, "_PYTORCH_SPLITS", {})
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    forget_decisions()  # each budget solved afresh, not reused from an earlier test
    model, inputs = models.cnn()
    joint = capture(model, as_inputs(inputs), codegen="inductor")
    peaks = {solve.solve_graph(joint, PlannerConfig(memory_budget=b, time_limit=5)).decision.stats[torch_split.PYTORCH_PEAK]
             for b in (1.0, 0.5, 0.2)}
    assert len(calls) == 1 and len(peaks) == 1


def test_a_split_that_fails_is_said_and_budget_one_is_the_planners_fast_end(monkeypatch, tmp_path):
    import pytest

    from planner import _torch_compat, solve, torch_split
    from planner.decisions import forget_decisions
    from planner.config import PlannerConfig
    from planner.tracing import as_inputs, capture
    from tests import models

    def broken(*_, **__):
        raise RuntimeError("no split here")

    monkeypatch.setattr(_torch_compat, "pytorch_split_modules", broken)
    monkeypatch.setattr(torch_split, "_PYTORCH_SPLITS", {})
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    forget_decisions()  # solved afresh, not reused from an earlier test
    model, inputs = models.cnn()
    joint = capture(model, as_inputs(inputs), codegen="inductor")
    with pytest.warns(UserWarning, match="PyTorch's own split of this graph failed .*no split here"):
        plan = solve.solve_graph(joint, PlannerConfig(memory_budget=1.0, time_limit=5))
    assert "no split here" in plan.decision.stats["pytorch_split"]
    assert torch_split.PYTORCH_PEAK not in plan.decision.stats
    assert plan.decision.budget_bytes == bounds.fast_end_plan(plan.problem).peak_bytes
    forget_decisions()  # a decision made without the split is not one for later tests to reuse


def test_the_plan_summary_says_what_budget_one_is(monkeypatch, tmp_path):
    import planner
    import planner.solve as solve
    from planner.decisions import forget_decisions
    from tests import models

    def summary(make, **settings):
        model, inputs = make()
        return planner.plan(model, inputs, planner.PlannerConfig(time_limit=5, **settings)).summary()

    # on the GPT and the CNN (flops) the solver's plan at 1.0 simulates at the split's peak: the split is the plan
    for make in (models.gpt, models.cnn):
        taken = summary(make, memory_budget=1.0)
        assert "(1.0: PyTorch's own split, taken over the solver's plan (" in taken and "simulated, not 3% less)" in taken
        assert "(heuristic, gap" in taken
    assert "(1.0: the planner's fast end)" in summary(models.cnn, memory_budget=0.5, fast_end="model")
    # a split below the fast end (stubbed as the frugal reference) is what 1.0 means
    forget_decisions()
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(solve, "pytorch_split", _frugal_split)
    assert "(1.0: PyTorch's own split, below the planner's fast end)" in summary(models.cnn, memory_budget=0.5)
    forget_decisions()


def test_budget_one_takes_pytorchs_split_unless_the_solvers_plan_holds_clearly_less():
    """Within SPLIT_PEAK_MARGIN of the split's peak, budget 1.0 is the split itself (what
    torch.compile runs), said in the stats, with the solver still named; below it, the solver's,
    unless that is estimated slower than the split."""
    import numpy as np

    from planner.torch_split import FAST_END_CHOICE, FAST_END_KERNELS, SPLIT_PEAK_MARGIN, prefer_pytorch_split
    from planner.decision import Decision

    problem = random_problem(seed=7, n=9, timed=True, priced=True)
    names = lambda plan: tuple(problem.names[i] for i in np.flatnonzero(plan.saved))  # noqa: E731

    def solved(plan, budget):
        return Decision(saved=names(plan), solver="cpsat", budget_bytes=budget, memory_bytes=plan.memory_bytes,
                        peak_bytes=plan.peak_bytes, recompute_seconds=plan.recompute_seconds, status="optimal",
                        gap=0.0, solve_seconds=0.0, save_seconds=plan.save_seconds)

    plans = sorted(all_plans(problem), key=lambda plan: plan.peak_bytes)

    def clearly_under(split):  # the plans clearly under the split's peak
        return [plan for plan in plans if plan.peak_bytes < (1 - SPLIT_PEAK_MARGIN) * split.peak_bytes]

    # as split, the plan of most memory with plans clearly under it both faster and slower than it
    split = next(plan for plan in reversed(plans)
                 if len({small.seconds <= plan.seconds for small in clearly_under(plan)}) == 2)
    # a plan just inside the margin (at worst the split's own peak) gives way to the split
    close = next(plan for plan in plans if plan.peak_bytes >= (1 - SPLIT_PEAK_MARGIN) * split.peak_bytes
                 and plan.saved.tolist() != split.saved.tolist())
    taken = prefer_pytorch_split(problem, solved(close, split.peak_bytes), split)
    assert taken.saved == names(split) and taken.peak_bytes == split.peak_bytes and taken.solver == "cpsat"
    assert taken.status == "heuristic" and 0.0 <= taken.gap <= 1.0
    choice = taken.stats[FAST_END_CHOICE]
    assert choice["plan"] == "pytorch split" and choice["solver_peak_bytes"] == close.peak_bytes
    # clearly less and estimated no slower: the solver's plan stands; clearly less but estimated
    # slower: the split, whose time is torch.compile's
    lean = next(plan for plan in clearly_under(split) if plan.seconds <= split.seconds)
    slow = next(plan for plan in clearly_under(split) if plan.seconds > split.seconds)
    kept = prefer_pytorch_split(problem, solved(lean, split.peak_bytes), split)
    assert kept.saved == names(lean) and FAST_END_CHOICE not in kept.stats and kept.status == "optimal"
    slower = prefer_pytorch_split(problem, solved(slow, split.peak_bytes), split)
    assert slower.saved == names(split) and "estimated slower" in slower.stats[FAST_END_CHOICE]["why"]
    # a fast end a little under the split resolves budget 1.0 below it: the margin alone decides
    assert close.peak_bytes < split.peak_bytes
    under = prefer_pytorch_split(problem, solved(close, close.peak_bytes), split)
    assert under.saved == names(split) and under.budget_bytes == split.peak_bytes >= under.peak_bytes
    assert "the budget is the split's peak" in under.stats[FAST_END_CHOICE]["why"]
    assert prefer_pytorch_split(problem, solved(lean, lean.peak_bytes), split).saved == names(lean)
    # given, the simulated peaks decide: the lean plan close to the split there gives way to it
    simulated = prefer_pytorch_split(problem, solved(lean, split.peak_bytes), split, simulated=(1000, 1010))
    assert simulated.saved == names(split)
    assert simulated.stats[FAST_END_CHOICE]["compared"] == {"solver": 1000, "split": 1010, "figures": "simulated"}
    assert prefer_pytorch_split(problem, solved(close, split.peak_bytes), split, simulated=(900, 1010)).saved == names(close)
    # clearly less and estimated no slower, but running more kernels than the split: the split
    more = prefer_pytorch_split(problem, solved(lean, split.peak_bytes), split, kernels=(120, 100))
    assert more.saved == names(split) and more.stats[FAST_END_KERNELS] == {"solver": 120, "split": 100}
    assert "runs 120 kernels against the split's 100" in more.stats[FAST_END_CHOICE]["why"]
    fewer = prefer_pytorch_split(problem, solved(lean, split.peak_bytes), split, kernels=(100, 100))
    assert fewer.saved == names(lean) and fewer.stats[FAST_END_KERNELS] == {"solver": 100, "split": 100}



def test_the_auto_time_limit_is_a_multiple_of_pytorchs_partition_where_that_was_timed(monkeypatch, tmp_path):
    """A fraction budget times PyTorch's split of the graph; the auto limit is then no more than
    AUTO_PARTITION_MULTIPLE times that (AUTO_FAST_END_MULTIPLE at 1.0), and the decision says
    which rule set it."""
    import planner.config as config_module
    from planner import solve, torch_split
    from planner.config import AUTO_FAST_END_MULTIPLE, AUTO_PARTITION_MULTIPLE, PlannerConfig
    from planner.decisions import forget_decisions
    from planner.tracing import as_inputs, capture
    from tests import models

    monkeypatch.setattr(torch_split, "_PYTORCH_SPLITS", {})
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    forget_decisions()
    model, inputs = models.cnn()
    joint = capture(model, as_inputs(inputs), codegen="inductor")
    # a per-node rule far above any partition time, and no floor: the partition's multiple decides
    monkeypatch.setattr(config_module, "AUTO_TIME_LIMIT", (10.0, 1e-3, 1e4))
    stats = solve.solve_graph(joint, PlannerConfig(memory_budget=0.5, solver="greedy")).decision.stats
    partition = stats[torch_split.PYTORCH_SPLIT_SECONDS]
    assert 0 < partition and stats["time_limit"]["seconds"] == pytest.approx(AUTO_PARTITION_MULTIPLE * partition)
    assert "PyTorch's partition of the graph" in stats["time_limit"]["rule"]
    # at 1.0 the split runs unless the solver's plan holds clearly less: a smaller multiple
    forget_decisions()
    stats = solve.solve_graph(joint, PlannerConfig(memory_budget=1.0, solver="greedy")).decision.stats
    assert AUTO_FAST_END_MULTIPLE < AUTO_PARTITION_MULTIPLE
    assert stats["time_limit"]["seconds"] == pytest.approx(AUTO_FAST_END_MULTIPLE * stats[torch_split.PYTORCH_SPLIT_SECONDS])
    assert f"{AUTO_FAST_END_MULTIPLE:g}x PyTorch's partition" in stats["time_limit"]["rule"]
    # an absolute budget makes no split: the per-node rule
    forget_decisions()
    plan = solve.solve_graph(joint, PlannerConfig(memory_budget=10**9, solver="greedy"))
    assert torch_split.PYTORCH_SPLIT_SECONDS not in plan.decision.stats
    assert plan.decision.stats["time_limit"]["seconds"] == pytest.approx(10.0 * len(plan.problem))
    assert "ms per node" in plan.decision.stats["time_limit"]["rule"]
    forget_decisions()


def test_the_predicted_frugal_end_reuses_the_least_peak_search_of_the_solve(monkeypatch, tmp_path):
    """Plan.predicted looks up the exact least-peak plan with the time limit the graph was solved
    with (here 10x PyTorch's partition), so the search kept by the solve answers it and does not
    run again under the per-node limit."""
    import planner
    import planner.config as config_module
    from planner import solve, torch_split
    from planner.decisions import forget_decisions
    from tests import models

    limits = []
    search = solve.min_peak_plan
    monkeypatch.setattr(solve, "min_peak_plan", lambda problem, time_limit: limits.append(time_limit) or search(problem, time_limit))
    monkeypatch.setattr(config_module, "AUTO_TIME_LIMIT", (10.0, 1e-3, 1e4))  # the partition's multiple decides
    monkeypatch.setattr(torch_split, "_PYTORCH_SPLITS", {})
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    forget_decisions()
    model, inputs = models.cnn()
    plan = planner.plan(model, inputs, memory_budget=0.0, solver="cpsat")
    solved_with = plan.decision.stats["time_limit"]["seconds"]
    assert "PyTorch's partition" in plan.decision.stats["time_limit"]["rule"]
    assert plan.predicted.min_peak_bytes == plan.decision.budget_bytes
    assert limits and all(limit == solved_with for limit in limits)
    forget_decisions()


def test_budget_zero_keeps_only_the_polish_saves_that_leave_the_predicted_peak_where_it_was(monkeypatch, tmp_path):
    """At budget 0 the polish sweeps' saves (here a few recomputed values that alone leave the
    simulated peak as it is, among the largest ones, which raise it) are filtered: what is kept
    leaves the solver's answer's simulated peak (within POLISH_PEAK_SLACK) and the budget as they
    were, in the sweeps' order; with too few simulations allowed, what was not checked is not
    kept."""
    import numpy as np
    from dataclasses import replace
    from itertools import islice
    from planner.solve import solve_graph
    from planner.peak_polish import POLISH_PEAK_SLACK, least_peak_polish
    from planner.predict import simulated_peak
    from planner.config import PlannerConfig
    from planner.decisions import forget_decisions
    from planner.problem import evaluate_names
    from planner.models import GPTConfig, gpt_example
    from planner.tracing import as_inputs, capture

    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    forget_decisions()
    # a GPT wide enough that its greedy budget-0 plan leaves recomputed values worth saving
    model, inputs = gpt_example(GPTConfig(n_layer=3, d_model=64, n_head=4, seq_len=32, vocab=128, batch=2, dropout=0.1))
    joint = capture(model, as_inputs(inputs), codegen="inductor")
    graph_plan = solve_graph(joint, PlannerConfig(memory_budget=0.0, solver="greedy"))
    problem, decision = graph_plan.problem, graph_plan.decision
    base = tuple(decision.saved)
    recomputed = np.flatnonzero(evaluate_names(problem, base).recomputed & problem.saveable & problem.schedule.owns
                                & (problem.nbytes > 0))
    limit = simulated_peak(joint, problem, base)
    limit += int(POLISH_PEAK_SLACK * limit)  # what "where it was" allows

    def fits(names):
        return (evaluate_names(problem, base + tuple(names)).peak_bytes <= decision.budget_bytes
                and simulated_peak(joint, problem, base + tuple(names)) <= limit)

    costly = recomputed[problem.runtime[recomputed] > 0]  # saving them gains
    harmless = list(islice((n for n in (problem.names[i] for i in costly[::-1]) if fits([n])), 3))
    largest = [problem.names[i] for i in recomputed[np.argsort(-problem.nbytes[recomputed], kind="stable")][:8]]
    added = list(dict.fromkeys(largest[:1] + harmless[:1] + largest[1:3] + harmless[1:] + largest[3:]))
    assert len(harmless) == 3 and not fits(added)  # the case at hand
    polished = replace(decision, saved=base + tuple(added),
                       stats={**decision.stats, "polish": {"start": list(base), "added": added}})

    kept = least_peak_polish(joint, problem, polished, checks=100)

    note = kept.stats["polish"]
    assert note["unchecked"] == 0 and note["dropped"] and set(harmless) <= set(note["added"])
    assert sorted(note["added"] + note["dropped"], key=added.index) == added  # in the sweeps' order
    assert note["added"] == [n for n in added if n in note["added"]]
    assert fits(note["added"])
    expected = evaluate_names(problem, base + tuple(note["added"]))
    assert set(kept.saved) == {problem.names[i] for i in np.flatnonzero(expected.saved)}
    assert kept.recompute_seconds == expected.recompute_seconds and kept.peak_bytes == expected.peak_bytes
    hurried = least_peak_polish(joint, problem, polished, checks=1).stats["polish"]
    assert hurried["simulations"] <= 2 and hurried["unchecked"] > 0 and fits(hurried["added"])
    untouched = least_peak_polish(joint, problem, replace(decision, stats={**decision.stats, "polish": {"added": []}}))
    assert untouched.saved == decision.saved

    # saves that keep the schedule's peak within the budget (made roomier than the plan's, so that
    # the sweeps could make them), one of which raises the simulated peak: that one, alive at the
    # raised peak, is dropped, the rest kept
    def raises_simulated(name):
        return simulated_peak(joint, problem, base + (name,)) > limit

    raiser = next(n for n in (problem.names[i] for i in costly) if n not in harmless and raises_simulated(n))
    swept = harmless[:1] + [raiser] + harmless[1:]
    roomy = replace(decision, budget_bytes=max(decision.budget_bytes, evaluate_names(problem, base + tuple(swept)).peak_bytes))
    swept_plan = replace(roomy, saved=base + tuple(swept),
                         stats={**decision.stats, "polish": {"start": list(base), "added": swept}})
    note = least_peak_polish(joint, problem, swept_plan).stats["polish"]
    assert note["dropped"] == [raiser] and note["dropped_at_peak"] == 1 and note["added"] == harmless
    assert note["simulations"] == 3  # the start's, all the saves', and all but the one dropped


def test_budget_one_with_pytorchs_split_searches_for_no_frugal_plan(monkeypatch, tmp_path):
    """Budget 1.0 is the peak of a plan, the fast end's or the split's, so nothing below it is
    looked for: the frugal reference's local search (seconds on a large graph: 2 s of ConvFormer's
    plan at 1.0 on a 2-core CPU) does not run, and the plan is the one it was with it. The split
    is stubbed as the plan of budget 0.5, below the fastest plan's peak, so that the solver
    searches below the fastest plan, as on a GPU's prices."""
    from planner import budget, solve
    from planner.config import PlannerConfig
    from planner.decisions import forget_decisions
    from planner.problem import evaluate_names
    from planner.torch_split import PYTORCH_PEAK
    from planner.tracing import as_inputs, capture
    from solvers import reference
    from tests import models

    model, inputs = models.gpt()
    joint = capture(model, as_inputs(inputs), codegen="inductor")
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    forget_decisions()
    half = solve.solve_graph(joint, PlannerConfig(memory_budget=0.5, time_limit=5)).decision.saved
    monkeypatch.setattr(solve, "pytorch_split", lambda joint, problem, fuse=True: _split_as(
        evaluate_names(problem, half), joint, problem, fuse))
    config = PlannerConfig(memory_budget=1.0, time_limit=5)
    forget_decisions()
    monkeypatch.setattr(reference, "_FOUND", {})
    searched = []
    starting = reference.starting_plans
    monkeypatch.setattr(reference, "starting_plans", lambda problem: searched.append(1) or starting(problem))
    plan = solve.solve_graph(joint, config)
    split_peak = plan.decision.stats[PYTORCH_PEAK]
    assert split_peak < bounds.runtime_optimal_plan(plan.problem).peak_bytes  # so the solver searched
    assert plan.decision.peak_bytes <= plan.decision.budget_bytes == split_peak
    assert budget.Budget(fraction=1.0).resolve(plan.problem, None, split_peak) == split_peak
    assert searched == []

    # with the frugal reference as the solver's floor, as before, the same plan comes out
    forget_decisions()
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path / "floor"))
    floor = reference_plan(plan.problem)
    assert searched and floor.peak_bytes < split_peak
    given = solve.configured_solver
    monkeypatch.setattr(solve, "configured_solver", lambda *a: _with_floor(given(*a), floor))
    again = solve.solve_graph(joint, config).decision
    assert again.saved == plan.decision.saved
    assert _solvers_own(again) == _solvers_own(plan.decision)


def _solvers_own(decision):
    """The peak, seconds and status of the solver's plan, whether or not budget 1.0 took the split."""
    from planner.torch_split import FAST_END_CHOICE

    choice = decision.stats.get(FAST_END_CHOICE)
    if choice is None:
        return decision.peak_bytes, decision.seconds, decision.status
    return choice["solver_peak_bytes"], choice["solver_seconds"], choice["solver_status"]


def _with_floor(solver, floor):
    """``solver`` whose ``solve`` is given ``floor`` as the frugal plan whatever it is called with."""
    solve = solver.solve
    solver.solve = lambda problem, nbytes, frugal=None, **kw: solve(problem, nbytes, frugal=floor, **kw)
    return solver
