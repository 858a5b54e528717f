"""Every solver, on the same random problems: feasible, honest about its figures, and ordered."""
import itertools
import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.bounds import min_memory_plan, runtime_optimal_plan
from planner.decision import Decision, Status
from planner.errors import ConfigError, InfeasibleBudget, UnknownNameError
from planner.problem import evaluate_names
from solvers import available_solvers, get_solver
from solvers.knapsack_items import knapsack_items
from solvers.frugal import min_peak_plan
from solvers.reference import reference_plan
from tests.synthetic import all_plans, brute_force, brute_force_min_peak, priced_problems, problems, random_problem, timed_problems

SOLVERS = available_solvers()


def budget_in_range(problem, fraction):
    lo, hi = min_memory_plan(problem).memory_bytes, runtime_optimal_plan(problem).memory_bytes
    return lo + int((hi - lo) * fraction)


@settings(max_examples=40, deadline=None)
@given(problems, st.floats(0, 1.2))
@pytest.mark.parametrize("name", SOLVERS)
def test_decision_is_feasible_and_its_figures_are_recomputable(name, problem, fraction):
    budget = budget_in_range(problem, fraction)
    decision = get_solver(name).solve(problem, budget)
    result = evaluate_names(problem, decision.saved)
    assert decision.solver == name
    assert result.memory_bytes == decision.memory_bytes <= budget
    assert result.recompute_seconds == pytest.approx(decision.recompute_seconds)
    assert result.save_seconds == pytest.approx(decision.save_seconds)
    assert decision.status in (Status.OPTIMAL, Status.FEASIBLE, Status.HEURISTIC)


EXACT = [("ilp", {"backend": "highs"}), ("ilp", {"backend": "cbc"}), ("cpsat", {})]


@settings(max_examples=50, deadline=None)
@given(problems, st.floats(0, 1))
@pytest.mark.parametrize("name,options", EXACT)
def test_exact_solvers_equal_brute_force(name, options, problem, fraction):
    budget = budget_in_range(problem, fraction)
    decision = get_solver(name, **options).solve(problem, budget)
    assert decision.status == Status.OPTIMAL and decision.gap == 0.0
    # Exact up to the documented memory tie-break: 1e-4 of the costliest node's runtime.
    tolerance = 1e-4 * problem.runtime.max() + 1e-12
    assert decision.seconds == pytest.approx(brute_force(problem, budget).seconds, abs=tolerance)


@settings(max_examples=40, deadline=None)
@given(timed_problems, st.floats(0, 1))
@pytest.mark.parametrize("name,options", EXACT)
def test_exact_solvers_equal_brute_force_on_peak_memory(name, options, problem, fraction):
    # Random schedules: the time-indexed memory rows, added lazily, must reach the true optimum.
    frugal, fast = brute_force_min_peak(problem), runtime_optimal_plan(problem).peak_bytes
    least = min_peak_plan(problem)
    assert least.plan.peak_bytes == frugal and least.optimal
    budget = frugal + int((fast - frugal) * fraction)
    decision = get_solver(name, **options).solve(problem, budget, frugal=least.plan, frugal_proven=True)
    assert decision.status == Status.OPTIMAL and decision.peak_bytes <= budget
    tolerance = 1e-4 * problem.runtime.max() + 1e-12
    assert decision.seconds == pytest.approx(brute_force(problem, budget).seconds, abs=tolerance)


@settings(max_examples=40, deadline=None)
@given(timed_problems, st.floats(0, 1))
@pytest.mark.parametrize("name", ["greedy", "dp", "mincut"])
def test_heuristics_fit_the_peak_budget(name, problem, fraction):
    frugal, fast = reference_plan(problem).peak_bytes, runtime_optimal_plan(problem).peak_bytes
    budget = frugal + int((fast - frugal) * fraction)
    decision = get_solver(name).solve(problem, budget)
    assert decision.peak_bytes == evaluate_names(problem, decision.saved).peak_bytes <= budget


@settings(max_examples=60, deadline=None)
@given(problems, st.floats(0, 1))
def test_ilp_is_never_worse_than_the_heuristics(problem, fraction):
    budget = budget_in_range(problem, fraction)
    best = get_solver("ilp").solve(problem, budget).seconds
    for name in ("greedy", "dp", "mincut"):
        assert best <= get_solver(name).solve(problem, budget).seconds + 1e-9
    assert get_solver("cpsat").solve(problem, budget).seconds == pytest.approx(best, abs=2e-4 * problem.runtime.max())


@settings(max_examples=60, deadline=None)
@given(problems)
def test_ilp_memory_never_rises_as_the_budget_falls(problem):
    # Guaranteed for ilp: its second phase takes the least memory among runtime-optimal plans.
    # The knapsack heuristics guarantee it for their own item weights only; saving an item can
    # make earlier saves unnecessary, so their pruned memory is checked on real models instead.
    solver = get_solver("ilp")
    memories = [solver.solve(problem, budget_in_range(problem, f)).memory_bytes for f in (1.0, 0.75, 0.5, 0.25, 0.0)]
    assert memories == sorted(memories, reverse=True)


@pytest.mark.parametrize("name", SOLVERS)
def test_both_ends_of_the_range(name):
    problem = random_problem(7, 40)
    fast = get_solver(name).solve(problem, runtime_optimal_plan(problem).memory_bytes)
    assert fast.recompute_seconds == 0.0 and fast.status == Status.OPTIMAL
    frugal = min_memory_plan(problem).memory_bytes
    assert get_solver(name).solve(problem, frugal).memory_bytes == frugal


@pytest.mark.parametrize("name", SOLVERS)
def test_budget_below_the_minimum_names_the_minimum(name):
    problem = random_problem(3, 30)
    frugal = min_memory_plan(problem).memory_bytes
    assert frugal > 0
    with pytest.raises(InfeasibleBudget, match=f"at least {frugal} bytes") as err:
        get_solver(name).solve(problem, frugal - 1)
    assert err.value.min_feasible_bytes == frugal


def test_dp_reports_its_quantisation_bound():
    problem = random_problem(11, 60)
    decision = get_solver("dp", resolution=64).solve(problem, budget_in_range(problem, 0.4))
    stats = decision.stats
    assert stats["quantum_bytes"] >= 1
    assert stats["knapsack_value_seconds"] <= stats["knapsack_upper_bound_seconds"] + 1e-12
    assert 0.0 <= stats["knapsack_gap"] <= 1.0


@settings(max_examples=40, deadline=None)
@given(problems, st.floats(0, 1))
def test_dp_with_unit_quantum_solves_its_knapsack_exactly(problem, fraction):
    # The knapsack core, at a capacity of saved bytes (the peak budget searches over these).
    frugal, fast = min_memory_plan(problem), runtime_optimal_plan(problem)
    capacity = budget_in_range(problem, fraction)
    items = knapsack_items(problem, frugal)
    solver = get_solver("dp", resolution=10**6)
    stats = solver._solve_capacity(problem, capacity, frugal, fast, time.monotonic() + 60).stats
    assert stats["quantum_bytes"] == 1
    room = capacity - frugal.memory_bytes
    best = max(
        (sum(items.value[list(c)]) for r in range(len(items.index) + 1)
         for c in itertools.combinations(range(len(items.index)), r) if sum(items.weight[list(c)]) <= room),
    )
    assert stats["knapsack_value_seconds"] == pytest.approx(best)


def test_unknown_solver_lists_the_available_ones():
    with pytest.raises(UnknownNameError, match="unknown solver 'magic'; available solvers: " + ", ".join(SOLVERS)):
        get_solver("magic")


def test_decision_round_trips_through_json():
    problem = random_problem(5, 30)
    decision = get_solver("ilp").solve(problem, budget_in_range(problem, 0.5))
    import json

    assert Decision.from_dict(json.loads(decision.to_json())) == decision


@settings(max_examples=60, deadline=None)
@given(problems, st.floats(0, 1))
def test_mincut_gap_is_a_proven_bound(problem, fraction):
    budget = budget_in_range(problem, fraction)
    decision = get_solver("mincut").solve(problem, budget)
    optimum = brute_force(problem, budget).seconds
    assert decision.gap is not None
    # The bound the cuts prove never exceeds the true optimum.
    assert decision.seconds * (1 - decision.gap) <= optimum + 1e-9


@pytest.mark.parametrize("name,options", [("ilp", {"backend": "highs"}), ("ilp", {"backend": "cbc"}), ("cpsat", {}), ("mincut", {})])
def test_time_limit_returns_a_plan_with_its_gap(name, options):
    problem = random_problem(17, 400)
    budget = budget_in_range(problem, 0.3)
    decision = get_solver(name, time_limit=1.0, **options).solve(problem, budget)
    assert decision.peak_bytes <= budget
    if decision.status == Status.OPTIMAL:
        assert decision.gap == 0.0
    else:
        assert decision.gap is not None and decision.gap >= 0.0


@pytest.mark.parametrize("name,options", EXACT)
def test_an_exact_solver_stopped_by_its_time_limit_is_no_slower_than_the_heuristics(name, options):
    problem = random_problem(17, 1500)
    budget = budget_in_range(problem, 0.02)
    decision = get_solver(name, time_limit=0.1, **options).solve(problem, budget)
    assert decision.stats["start"] in ("frugal", "mincut", "greedy", "rounding", "neighbourhood")
    for heuristic in ("mincut", "greedy"):
        assert decision.seconds <= get_solver(heuristic).solve(problem, budget).seconds + 1e-12


def test_unknown_ilp_backend_names_the_choices():
    with pytest.raises(ConfigError, match="ilp backend='gurobi' is not allowed; choose one of: highs, cbc"):
        get_solver("ilp", backend="gurobi")


@pytest.mark.parametrize("name,option", [("dp", "resolution"), ("mincut", "iterations"), ("cpsat", "workers")])
@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_bad_solver_options_name_the_option(name, option, value):
    with pytest.raises(ConfigError, match=f"{name} {option} must be a positive int"):
        get_solver(name, **{option: value})


# Save costs: saving a value costs seconds (its write and read back), so recomputing can win.

@settings(max_examples=60, deadline=None)
@given(priced_problems)
def test_runtime_optimal_plan_is_the_least_seconds_of_all_plans(problem):
    fast = runtime_optimal_plan(problem)
    plans = list(all_plans(problem))
    least = min(p.seconds for p in plans)
    # The cut prices seconds in whole nanoseconds; the synthetic runtimes are whole tenths.
    assert fast.seconds == pytest.approx(least, abs=1e-9 * len(problem))
    # Among the fastest plans, the least memory.
    assert fast.memory_bytes == min(p.memory_bytes for p in plans if p.seconds <= least + 1e-9 * len(problem))


@settings(max_examples=30, deadline=None)
@given(priced_problems, st.floats(0, 1))
@pytest.mark.parametrize("name,options", EXACT)
def test_exact_solvers_equal_brute_force_with_save_costs(name, options, problem, fraction):
    least = min_peak_plan(problem)
    frugal, fast = least.plan.peak_bytes, runtime_optimal_plan(problem).peak_bytes
    budget = frugal + int((fast - frugal) * fraction)
    decision = get_solver(name, **options).solve(problem, budget, frugal=least.plan, frugal_proven=least.optimal)
    assert decision.status == Status.OPTIMAL and decision.peak_bytes <= budget
    tolerance = 1e-4 * max(problem.runtime.max(), problem.save_seconds.max()) + 1e-9 * len(problem)
    assert decision.seconds == pytest.approx(brute_force(problem, budget).seconds, abs=tolerance)


@settings(max_examples=30, deadline=None)
@given(priced_problems, st.floats(0, 1))
@pytest.mark.parametrize("name", SOLVERS)
def test_every_solver_reports_the_save_seconds_of_its_plan(name, problem, fraction):
    frugal, fast = reference_plan(problem).peak_bytes, runtime_optimal_plan(problem).peak_bytes
    budget = frugal + int((fast - frugal) * fraction)
    decision = get_solver(name).solve(problem, budget)
    result = evaluate_names(problem, decision.saved)
    assert decision.peak_bytes == result.peak_bytes <= budget
    assert decision.save_seconds == pytest.approx(result.save_seconds)
    assert decision.save_seconds == pytest.approx(problem.save_seconds[result.saved].sum())
    if name == "mincut":
        # The cuts' bound holds for the objective with save costs too.
        assert decision.seconds * (1 - decision.gap) <= brute_force(problem, budget).seconds + 1e-9


@settings(max_examples=25, deadline=None)
@given(timed_problems, st.floats(0, 1))
@pytest.mark.parametrize("name,options", [("ilp", {"backend": "highs"}), ("cpsat", {})])
def test_exact_solvers_start_from_a_given_plan_that_fits_and_is_fastest(name, options, problem, fraction):
    least, fast = min_peak_plan(problem), runtime_optimal_plan(problem).peak_bytes
    budget = least.plan.peak_bytes + int((fast - least.plan.peak_bytes) * fraction)
    assume(budget < fast)  # else the fastest plan is returned without a search
    best = brute_force(problem, budget)
    over = max(all_plans(problem), key=lambda p: p.peak_bytes)  # a start over the budget is passed over
    starts = {"given": best, "too big": over} if over.peak_bytes > budget else {"given": best}
    decision = get_solver(name, **options).solve(problem, budget, frugal=least.plan, frugal_proven=True, starts=starts)
    assert decision.peak_bytes <= budget and decision.stats["start"] != "too big"
    if decision.stats["start"] == "given":  # taken only where the solver's own start was slower
        assert best.seconds < least.plan.seconds
    assert decision.seconds <= best.seconds + 1e-4 * problem.runtime.max() + 1e-12


def test_polish_saves_recomputed_values_while_the_budget_holds_and_stops_at_its_deadline():
    """From the least-peak plan at a budget above its peak, the sweeps save values the budget
    still has room for, each accepted save lowering the plan's seconds; with no time left they
    return the plan as given."""
    import time as clock

    from solvers.polish import polish

    problem = random_problem(17, 400)
    frugal = reference_plan(problem)
    budget = budget_in_range(problem, 0.3)
    polished, report = polish(problem, frugal, budget, clock.monotonic() + 30)
    assert polished.peak_bytes <= budget and polished.seconds < frugal.seconds
    assert report["saved_values"] > 0 and report["stopped_by"] == "no gain"
    assert report["objective_after"] == polished.seconds and report["objective_before"] == frugal.seconds
    assert (polished.saved | frugal.saved).sum() >= frugal.saved.sum()
    again, _ = polish(problem, polished, budget, clock.monotonic() + 30)  # a local optimum of the sweep
    assert again.seconds == polished.seconds
    late, late_report = polish(problem, frugal, budget, clock.monotonic() - 1)
    assert late.seconds == frugal.seconds and late_report["stopped_by"] == "time limit"


def test_polish_saves_the_outputs_of_a_multi_output_op_together(monkeypatch):
    """A BatchNorm's statistics come from one ``var_mean`` read through getitems: saving one of
    them alone leaves the op to run again for the other, so gains nothing. Where a save alone
    gains nothing the sweep tries it with its recomputed siblings, and so reaches plans the
    one-at-a-time sweep cannot."""
    import time as clock

    import planner
    import solvers.polish as polishing
    from tests import models

    model, inputs = models.cnn()
    rates = {"flops_per_second": 1e12, "bytes_per_second": 1e11}  # fixed: no calibration
    problem = planner.plan(model, inputs, memory_budget=0.0, solver="greedy", estimator="roofline",
                           config=planner.PlannerConfig(estimator_options=rates)).graph_plan.problem
    start = reference_plan(problem)
    budget = int(1.2 * start.peak_bytes)
    siblings = polishing._siblings(problem)
    assert {problem.targets[i] for i in siblings} == {"<built-in function getitem>"}  # the statistics
    together, report = polishing.polish(problem, start, budget, clock.monotonic() + 30)
    saved = set(report["added"])
    assert any(problem.names[i] in saved and all(problem.names[j] in saved for j in group) for i, group in siblings.items())
    monkeypatch.setattr(polishing, "_siblings", lambda problem: {})
    alone, _ = polishing.polish(problem, start, budget, clock.monotonic() + 30)
    assert together.peak_bytes <= budget and together.seconds < alone.seconds


@pytest.mark.parametrize("name,options", EXACT)
def test_an_exact_solver_polishes_the_answer_it_could_not_prove(name, options):
    """Stopped by its time limit, an exact solver's answer is swept (stats["polish"]): it is no
    slower than before the sweeps, its gap is measured against the solver's bound again, and
    the status still says the answer is unproven."""
    for size in (1500, 3000):  # a solver that proves the smaller one in time gets the larger
        problem = random_problem(17, size)
        budget = budget_in_range(problem, 0.02)
        decision = get_solver(name, time_limit=0.5, **options).solve(problem, budget)
        if decision.status != Status.OPTIMAL:
            break
    else:
        pytest.skip("proven within the limit: nothing to polish")
    report = decision.stats["polish"]
    assert report["objective_after"] <= report["objective_before"]
    assert decision.seconds == pytest.approx(report["objective_after"])
    assert decision.status == Status.FEASIBLE and decision.peak_bytes <= budget


def test_the_plan_summary_says_what_the_polish_sweeps_did():
    """The summary's polish row quotes the sweeps' report, and at budget 0 what the peak check
    kept, dropped and left unchecked; a decision the sweeps did not touch has no such row."""
    from dataclasses import replace

    from planner.api import polish_summary

    problem = random_problem(17, 400)
    decision = get_solver("greedy").solve(problem, budget_in_range(problem, 0.3))
    assert polish_summary(decision) is None
    report = {"saved_values": 7, "sweeps": 2, "seconds": 0.25, "stopped_by": "no gain",
              "objective_before": 2.5e-3, "objective_after": 2.0e-3}
    line = polish_summary(replace(decision, stats={"polish": report}))
    assert line.startswith("7 more values saved in 2 sweeps") and "2.5 -> 2 ms" in line and "budget 0" not in line
    checked = {**report, "kept": 5, "dropped": ["a", "b"], "unchecked": 0, "simulations": 9}
    assert "budget 0 kept 5, dropped 2 that raised the predicted peak, left 0 unchecked (9 simulations)" in \
        polish_summary(replace(decision, stats={"polish": checked}))


def test_cpsat_writes_each_row_of_the_graph_model_as_one_linear_constraint(monkeypatch):
    """``_to_cp_model`` scales and rounds every row's terms at once; each constraint must still
    be its row, term by term: the row's columns (a peak column as its whole-bytes variable) with
    the coefficients in bytes, rounded (over the peak's span for that column), zeros left out,
    and the row's bounds in bytes, rounded inwards. Checked on the models the frugal search and
    the budget's solve build for random problems."""
    import math

    import numpy as np
    from ortools.sat.python import cp_model

    import solvers.cpsat as cpsat

    built, real = [], cpsat._to_cp_model

    def spy(model, peak=None, deadline=math.inf):
        out = real(model, peak, deadline)
        built.append((model, peak, out))
        return out

    monkeypatch.setattr(cpsat, "_to_cp_model", spy)
    for seed in range(3):
        problem = random_problem(seed, 14, timed=True)
        frugal = min_peak_plan(problem, 5.0)
        get_solver("cpsat", time_limit=5.0).solve(problem, frugal.plan.peak_bytes, frugal=frugal.plan)
    assert any(peak is not None and peak.col is not None for _, peak, _ in built)
    for model, peak, (cp, x, peak_bytes) in built:
        constraints = cp.proto.constraints
        assert len(constraints) == model.rows.shape[0]
        for r, (cols, coefs, lower, upper) in enumerate(model.constraints(whole=True)):
            want = {}
            for k, c in zip(cols.tolist(), coefs.tolist()):
                weight = round(c / (peak.span if peak is not None and k == peak.col else 1.0))
                if weight:
                    want[x[k].Index()] = want.get(x[k].Index(), 0) + weight
            linear = constraints[r].linear
            assert dict(zip(linear.vars, linear.coeffs)) == want and list(linear.vars) == list(want)
            assert list(linear.domain) == [cp_model.INT_MIN if lower is None else math.ceil(lower - 1e-6),
                                           cp_model.INT_MAX if upper is None else math.floor(upper + 1e-6)]
        if peak_bytes is not None:
            assert x[peak.col] is peak_bytes and np.isfinite(peak.span)


@settings(max_examples=10, deadline=None)
@given(timed_problems)
def test_full_memory_rows_proven_infeasible_are_a_bug_and_a_restricted_program_returns_the_start(problem):
    """The memory rows count every plan as its profile does, so the full program proven
    infeasible at a budget its start meets is a bug in the model, and raises; a restricted
    program (blocks tied, patterns chosen) may exclude every plan within the budget, and
    returns the start, saying so."""
    from planner.errors import SolverError
    from solvers.backends import Answer, within_peak

    start = reference_plan(problem)
    deadline = time.monotonic() + 10

    def proven_infeasible(model, objective, vector):
        return Answer(None, False, infeasible=True)

    with pytest.raises(SolverError, match="bug in the model"):
        within_peak(problem, start.peak_bytes, start, deadline, proven_infeasible)
    restricted = within_peak(problem, start.peak_bytes, start, deadline, proven_infeasible,
                             restrict=lambda build, base: None)
    assert (restricted.saved == start.saved).all() and "restricted program" in restricted.stats["answer"]
