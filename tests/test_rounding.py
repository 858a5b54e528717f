"""The relaxation's bound holds, its rounded plans fit, and the neighbourhood search is exact
where nothing is fixed and changes nothing where everything is."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from estimators import get_estimator
from planner.bounds import runtime_optimal_plan
from planner.build import build_problem
from planner.problem import evaluate
from solvers.graph_model import build_graph_model
from solvers.peak_rows import Steps
from solvers.rounding import THRESHOLDS, _must_save, improve_near, round_relaxation
from tests.models import MODELS
from tests.synthetic import all_plans, brute_force, brute_force_min_peak, priced_problems, problems


def _budget(problem, fraction):
    lo, hi = brute_force_min_peak(problem), runtime_optimal_plan(problem).peak_bytes
    return lo + int((hi - lo) * fraction)


@settings(max_examples=40, deadline=None)
@given(st.one_of(problems, priced_problems), st.floats(0, 1))
def test_relaxation_bounds_the_optimum_and_its_roundings_fit(problem, fraction):
    budget = _budget(problem, fraction)
    optimum = brute_force(problem, budget)
    rounded = round_relaxation(problem, budget, float("inf"), Steps())
    assert rounded.bound is not None and rounded.bound <= optimum.seconds + 1e-9
    if rounded.plan is not None:
        assert rounded.plan.peak_bytes <= budget
        assert rounded.plan.seconds >= optimum.seconds - 1e-12


@settings(max_examples=30, deadline=None)
@given(problems, st.floats(0, 1))
def test_neighbourhood_with_nothing_fixed_is_the_exact_program(problem, fraction):
    budget = _budget(problem, fraction)
    frugal = min(all_plans(problem), key=lambda plan: (plan.peak_bytes, plan.seconds))
    base, _ = build_graph_model(problem)
    nowhere = 1.0 - base.vector(frugal.saved, frugal.recomputed)[: len(base.runtime)]  # disagrees everywhere
    found = improve_near(problem, budget, frugal, nowhere, float("inf"), Steps())
    assert found.peak_bytes <= budget
    optimum = brute_force(problem, budget).seconds
    assert abs(found.seconds - optimum) <= 1e-9 * max(1.0, optimum)


@settings(max_examples=30, deadline=None)
@given(problems, st.floats(0, 1))
def test_neighbourhood_with_everything_fixed_keeps_the_plan(problem, fraction):
    budget = _budget(problem, fraction)
    rounded = round_relaxation(problem, budget, float("inf"), Steps())
    plan = rounded.plan if rounded.plan is not None else brute_force(problem, budget)
    base, _ = build_graph_model(problem)
    everywhere = base.vector(plan.saved, plan.recomputed)[: len(base.runtime)]
    found = improve_near(problem, budget, plan, everywhere, float("inf"), Steps())
    assert np.array_equal(found.saved, plan.saved)




@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_rounding_of_any_values_is_a_plan(name):
    # The CNN's BatchNorm op can be neither saved nor recomputed (it mutates its running
    # statistics): what reads it must be saved, though it is recomputable itself.
    model, inputs = MODELS[name]()
    problem = build_problem(planner.capture(model, inputs), get_estimator("flops"))
    must = _must_save(problem)
    for seed in range(20):
        values = np.random.default_rng(seed).random(len(problem)) * problem.saveable  # as the relaxation has them
        for threshold in THRESHOLDS:
            evaluate(problem, (values > threshold) | must)  # raises if the backward lacks a value
