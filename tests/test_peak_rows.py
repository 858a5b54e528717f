"""The exact solvers' memory rows say the same as the schedule's profile, plan by plan."""
import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import Bounds, LinearConstraint, milp

from planner.bounds import runtime_optimal_plan
from planner.decision import Status
from planner.problem import evaluate, memory_profile
from solvers.frugal import min_peak_plan
from solvers.graph_model import build_graph_model
from solvers.backends import solve_highs, within_peak
from solvers.peak_rows import Limit, PeakRows, Steps, memory_unit
from tests.synthetic import all_plans, fusible_problems, on_demand_problems, timed_problems, undonated_problems


def _least_memory_the_rows_allow(model, plan, peak_col: int, span: float) -> float:
    """With the plan's binaries fixed, the least ``span * p`` the rows allow (the helper
    variables are free in [0, 1], so this is the memory the rows count for the plan)."""
    x = model.vector(plan.saved, plan.recomputed)
    lower = np.where(model.integral, x, 0.0)
    upper = np.where(model.integral, x, 1.0)
    cost = np.zeros(model.num_vars)
    cost[peak_col] = 1.0
    result = milp(cost, constraints=LinearConstraint(model.rows, model.lower, model.upper),
                  bounds=Bounds(lower, upper), integrality=np.zeros(model.num_vars))
    assert result.success, result.message
    return float(result.x[peak_col]) * span


def _repeated(problem, repeats: int):
    """The problem of a graph run ``repeats`` times before its backward."""
    return dataclasses.replace(problem, schedule=dataclasses.replace(problem.schedule, repeats=repeats))


@settings(max_examples=25, deadline=None)
@given(timed_problems, st.integers(1, 3))
def test_memory_rows_equal_the_profile_at_every_step_for_every_plan(problem, repeats):
    _rows_equal_the_profile(_repeated(problem, repeats))


@settings(max_examples=25, deadline=None)
@given(undonated_problems)
def test_memory_rows_count_no_in_place_write_into_a_value_its_last_reader_may_not_write(problem):
    # a kernel may not write into a value it reads at another index (Schedule.no_reuse), nor
    # into a saved value the caller's output shares, not donated to the backward (Schedule.undonated)
    _rows_equal_the_profile(problem)


@settings(max_examples=25, deadline=None)
@given(on_demand_problems)
def test_memory_rows_count_values_on_demand_only_where_the_plan_computes_them_in_the_forward(problem):
    _rows_equal_the_profile(problem)


@settings(max_examples=40, deadline=None)
@given(fusible_problems)
def test_memory_rows_count_a_copy_fused_where_the_plan_saves_a_producer_that_lets_inductor_fuse_it(problem):
    # stored (its bytes, its inputs read when it is made) where the plan saves none of the
    # producers Schedule.fused_if_saved names, fused (no bytes, inputs read up to its last
    # reader's) where it saves one, as the profile counts it
    _rows_equal_the_profile(problem)


def test_memory_rows_count_a_real_graphs_copies_fused_where_its_plan_saves_their_producers():
    # the test GPT's frugal plan, saving also a producer the schedule names for each copy it
    # counts stored (a block input among them): inductor computes those copies inside their
    # readers (Schedule.fused_if_saved), which the profile counts; so do the rows, at every step
    # where counting those copies stored differs
    import planner
    from estimators import get_estimator
    from planner.build import build_problem
    from planner.models import GPTConfig, gpt_example
    from solvers.reference import reference_plan

    model, batch = gpt_example(GPTConfig(n_layer=2, d_model=64, seq_len=64))
    problem = build_problem(planner.capture(model, list(batch), codegen="inductor"), get_estimator("flops"), fuse=True)
    saved = reference_plan(problem).saved.copy()
    rows = problem.schedule.fused_if_saved
    for i in np.flatnonzero((rows >= 0).any(axis=1)):
        saved[rows[i][rows[i] >= 0][0]] = True
    plan = evaluate(problem, saved)
    fused = memory_profile(problem, plan)
    unfused = dataclasses.replace(problem, schedule=dataclasses.replace(problem.schedule, fused_if_saved=None))
    stored = memory_profile(unfused, plan)
    steps = np.flatnonzero(stored.backward != fused.backward)
    assert (stored.backward[steps] > fused.backward[steps]).any()
    base, build = build_graph_model(problem)
    rows, unit, span = PeakRows(problem, base), memory_unit(problem), 2.0 * stored.peak
    for t in steps.tolist():
        trial = build.copy()
        (col,) = trial.add_vars(1, integral=False)
        rows.add(trial, [], [t], Limit(0.0, unit, int(col), span))
        counted = _least_memory_the_rows_allow(trial.freeze(base), plan, int(col), span)
        assert counted == pytest.approx(fused.backward[t], rel=1e-6)


def _rows_equal_the_profile(problem):
    base, build = build_graph_model(problem)
    rows, unit = PeakRows(problem, base), memory_unit(problem)
    plans = list(itertools.islice(all_plans(problem), 12))
    profiles = [memory_profile(problem, plan) for plan in plans]
    span = 2.0 * max(p.peak for p in profiles) + 1.0  # room to show a count above the profile
    steps = [("forward", f) for f in range(len(problem))]
    steps += [("backward", t) for t in range(problem.schedule.num_steps)]
    for phase, step in steps:
        trial = build.copy()
        (col,) = trial.add_vars(1, integral=False)
        forward, backward = ([step], []) if phase == "forward" else ([], [step])
        rows.add(trial, forward, backward, Limit(0.0, unit, int(col), span))
        model = trial.freeze(base)
        for plan, prof in zip(plans, profiles):
            expected = getattr(prof, phase)[step]
            assert _least_memory_the_rows_allow(model, plan, int(col), span) == pytest.approx(expected, abs=1e-3)


@settings(max_examples=25, deadline=None)
@given(timed_problems, st.floats(0, 1), st.data())
def test_rows_at_more_steps_change_no_optimum(problem, fraction, data):
    # The full program starts with the steps the tied one needed: any steps, the same optimum.
    plans = list(all_plans(problem))
    frugal = min(plans, key=lambda p: p.peak_bytes)
    budget = frugal.peak_bytes + int((runtime_optimal_plan(problem).peak_bytes - frugal.peak_bytes) * fraction)
    given_forward = data.draw(st.sets(st.integers(0, len(problem) - 1)))
    given_backward = data.draw(st.sets(st.integers(0, problem.schedule.num_steps - 1)))
    steps = Steps(set(given_forward), set(given_backward))
    found = within_peak(problem, budget, frugal, float("inf"), lambda m, o, s: solve_highs(m, o, float("inf")), steps=steps)
    best = min((p.seconds for p in plans if p.peak_bytes <= budget))
    assert found.status == Status.OPTIMAL
    assert evaluate(problem, found.saved).seconds == pytest.approx(best, abs=1e-4 * problem.runtime.max() + 1e-12)
    assert steps.forward >= given_forward and steps.backward >= given_backward


@settings(max_examples=25, deadline=None)
@given(timed_problems, st.floats(0, 1))
def test_the_programs_of_one_solve_make_each_steps_memory_rows_once(problem, fraction):
    # The lazy rounds of a program add rows at the new steps only, and a later program of the
    # same limit (the full one after the rounding's and the restricted ones) takes every row made
    # before, its own columns (a restriction's, as the patterns program adds) numbered first:
    # each step's rows are made once, and the optimum is every plan's best.
    plans = list(all_plans(problem))
    frugal = min(plans, key=lambda p: p.peak_bytes)
    budget = frugal.peak_bytes + int((runtime_optimal_plan(problem).peak_bytes - frugal.peak_bytes) * fraction)
    best = min((p.seconds for p in plans if p.peak_bytes <= budget))
    made = {"forward": 0, "backward": 0}
    own = {name: getattr(PeakRows, f"_{name}") for name in made}

    def counted(name):
        def step(self, *args):
            made[name] += 1
            return own[name](self, *args)
        return step

    def restrict(build, base):  # a column of the program's own, before the memory rows
        (extra,) = build.add_vars(1, integral=True)
        build.add_row([int(extra)], [1.0], 0.0, 1.0)

    def run(model, objective, start):
        return solve_highs(model, objective, float("inf"))

    steps = Steps()
    for name in made:
        setattr(PeakRows, f"_{name}", counted(name))
    try:
        found = [within_peak(problem, budget, frugal, float("inf"), run, restrict=restrict, steps=steps)]
        assert made == {"forward": len(steps.forward), "backward": len(steps.backward)}
        found.append(within_peak(problem, budget, frugal, float("inf"), run, steps=steps))
        assert made == {"forward": len(steps.forward), "backward": len(steps.backward)}
    finally:
        for name in made:
            setattr(PeakRows, f"_{name}", own[name])
    for solution in found:
        assert solution.status == Status.OPTIMAL
        assert evaluate(problem, solution.saved).seconds == pytest.approx(best, abs=1e-4 * problem.runtime.max() + 1e-12)


@settings(max_examples=15, deadline=None)
@given(timed_problems, st.integers(2, 4))
def test_a_repeated_graph_counts_its_other_runs_saved_values_and_the_least_peak_search_sees_them(problem, repeats):
    repeated = _repeated(problem, repeats)
    plans = list(all_plans(problem))
    for plan in plans:  # the same plan, run `repeats` times: every other run holds its saved bytes
        again = evaluate(repeated, plan.saved)
        assert again.peak_bytes == plan.peak_bytes + (repeats - 1) * plan.memory_bytes
    found = min_peak_plan(repeated, 10)
    assert found.optimal
    assert found.plan.peak_bytes == min(evaluate(repeated, p.saved).peak_bytes for p in plans)
