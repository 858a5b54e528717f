"""The fast end (budget 1.0): the least-memory hull plan within a slack of the fastest plan."""
import math

from hypothesis import given, settings, strategies as st

import planner.bounds as bounds
from tests.synthetic import brute_force_min_memory, random_problem


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
