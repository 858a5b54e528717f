"""The frugal reference: budget fractions resolve against it, fast, with no exact search, and
the same on every run; the exact least-peak search runs only where it changes the answer."""
import dataclasses

import numpy as np
import pytest

import planner
from planner.bounds import fast_end_plan, runtime_optimal_plan
from planner.errors import InfeasibleBudget
from solvers import base, frugal, get_solver, reference
from solvers.blocks import boundary_saves, find_blocks
from tests.models import MODELS
from tests.synthetic import brute_force_min_peak, random_problem, tiled_problem


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache directory and a process that has found nothing yet."""
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(frugal, "_FOUND", {})
    monkeypatch.setattr(reference, "_FOUND", {})
    searches = []

    def count(problem, time_limit, search=frugal._min_peak_plan):
        searches.append(problem)
        return search(problem, time_limit)

    monkeypatch.setattr(frugal, "_min_peak_plan", count)
    return searches


@pytest.mark.parametrize("seed,size,count", [(0, 7, 4), (1, 12, 3), (2, 5, 9)])
def test_the_per_block_plan_saves_the_values_crossing_each_cut(seed, size, count):
    problem = tiled_problem(seed, size, count)
    blocks = find_blocks(problem)
    n, end = len(problem), blocks.start + blocks.count * blocks.period
    # In a chain of tiles only a block's last node is read across a cut (by the next first node).
    for stride, saved in enumerate(boundary_saves(problem, blocks), start=1):
        cuts = {blocks.start + k * blocks.period for k in range(0, blocks.count + 1, stride)}
        cuts |= {end, blocks.start - blocks.period, end + blocks.period}
        assert set(np.flatnonzero(saved)) == {c - 1 for c in cuts if 0 < c < n}


@pytest.mark.parametrize("problem", [random_problem(0, 12, timed=True), tiled_problem(3, 4, 3)], ids=["random", "tiled"])
def test_the_reference_is_the_same_in_a_new_process_and_never_below_the_least_peak(fresh, monkeypatch, problem):
    first = reference.reference_plan(problem)
    monkeypatch.setattr(reference, "_FOUND", {})
    again = reference.reference_plan(problem)
    assert np.array_equal(first.saved, again.saved) and first.peak_bytes == again.peak_bytes
    assert first.peak_bytes >= brute_force_min_peak(problem)
    assert planner.Budget(fraction=0.0).resolve(problem) == first.peak_bytes
    assert fresh == []  # the exact search never ran


def test_a_fraction_plans_cold_without_the_exact_search_and_budget_zero_runs_it_for_exact_solvers(fresh):
    model, inputs = MODELS["gpt"]()
    config = planner.PlannerConfig(codegen="eager", time_limit=10)
    for solver in ("greedy", "mincut", "dp"):
        for fraction in (0.5, 0.0):
            planner.plan(model, inputs, memory_budget=fraction, solver=solver, config=config)
    for fraction in (0.5, 0.2):
        planner.plan(model, inputs, memory_budget=fraction, solver="cpsat", config=config)
    assert fresh == []
    zero = planner.plan(model, inputs, memory_budget=0.0, solver="cpsat", config=config)
    assert len(fresh) == 1
    problem = zero.graph_plan.problem  # the answer the plan used: one searched for the plan's time limit
    least = frugal.min_peak_plan(problem, config.solver_seconds(len(problem))).plan.peak_bytes
    assert zero.decision.peak_bytes <= zero.decision.budget_bytes == least == zero.predicted.min_peak_bytes
    assert least <= reference.reference_plan(zero.graph_plan.problem).peak_bytes
    # asked for: fractions resolve against the exact least peak (searched once, kept)
    half = planner.plan(model, inputs, memory_budget=0.5, solver="greedy", config=config.replace(frugal_search="exact"))
    assert half.predicted.min_peak_bytes == least and len(fresh) == 1


def test_a_heuristic_below_the_reference_says_so_and_names_the_exact_search():
    problem = random_problem(0, 12, timed=True)
    floor = reference.reference_plan(problem).peak_bytes
    with pytest.raises(InfeasibleBudget, match="frugal_search='exact'") as err:
        get_solver("greedy").solve(problem, floor - 1)
    assert err.value.min_feasible_bytes == floor and not err.value.proven


@pytest.mark.parametrize("seed", [46, 58])
def test_the_least_peak_search_polishes_above_the_peak_where_within_it_leads_nowhere(seed, monkeypatch):
    """Random problems where the frugal reference's peak is reached at several steps: the rounds
    that save only within the peak stop above the least peak (found by brute force); a round
    that saves up to a kick above it, then takes the peak down, reaches it."""
    import time

    problem = random_problem(seed, 14, timed=True)
    start = reference.reference_plan(problem)
    least = brute_force_min_peak(problem)
    with monkeypatch.context() as within_only:
        within_only.setattr(frugal, "_KICKS", (0.0,))
        stuck, _ = frugal._off_plateaus(problem, start, time.monotonic() + 60)
    kicked, rounds = frugal._off_plateaus(problem, start, time.monotonic() + 60)
    assert stuck.peak_bytes > least
    assert kicked.peak_bytes == least and rounds >= 1


def test_the_least_peak_search_leaves_a_plateau_by_saving_within_its_peak(fresh):
    """On a GPT of alike layers the frugal reference ends where no single move lowers the peak
    (every layer's backward reaches it alike); saving values within that peak (the polish) opens
    a way down that the local search then takes, and the exact search starts there."""
    import time

    from estimators import get_estimator
    from planner.build import build_problem
    from planner.models import GPTConfig, gpt_example
    from solvers.peak_search import lower_peak

    model, batch = gpt_example(GPTConfig(n_layer=4, d_model=64, seq_len=128, dropout=0.0))
    joint = planner.capture(model, list(batch), codegen="inductor")
    problem = build_problem(joint, get_estimator("flops"), fuse=True)
    start = reference.reference_plan(problem)
    assert lower_peak(problem, start, deadline=float("inf"))[1] == 0  # no single move lowers it
    lowered, rounds = frugal._off_plateaus(problem, start, time.monotonic() + 60)
    assert rounds >= 1 and lowered.peak_bytes < start.peak_bytes
    found = frugal.min_peak_plan(problem, time_limit=5)
    assert found.stats["local_search"]["plateau_rounds"][-1] >= 1  # the reference's end, searched last
    assert found.plan.peak_bytes <= lowered.peak_bytes


def test_a_fast_end_below_the_reference_is_the_floor_budgets_resolve_and_solve_to(monkeypatch):
    # With save costs the fast end holds fewer bytes than the fastest plan, and on a small graph
    # its peak may lie below the reference's: budget 1.0 then asked for less than the reference
    # and raised (a graph of GPT-2 on an H200). The fast end is a plan; nothing above it is a floor.
    problem = random_problem(12, 12, timed=True, priced=True)
    end = fast_end_plan(problem)
    assert end.peak_bytes < runtime_optimal_plan(problem).peak_bytes  # the solve looks for a floor
    above = dataclasses.replace(end, peak_bytes=end.peak_bytes + 10)  # a reference 10 bytes over it
    monkeypatch.setattr(reference, "reference_plan", lambda problem: above)
    monkeypatch.setattr(base, "reference_plan", lambda problem: above)
    for fraction in (1.0, 0.5, 0.0):
        assert planner.Budget(fraction=fraction).resolve(problem) == end.peak_bytes
    for solver in ("greedy", "cpsat"):
        decision = get_solver(solver, time_limit=5).solve(problem, end.peak_bytes)
        assert decision.peak_bytes <= end.peak_bytes
        with pytest.raises(InfeasibleBudget) as err:
            get_solver(solver, time_limit=5).solve(problem, end.peak_bytes - 1)
        assert err.value.min_feasible_bytes == end.peak_bytes
