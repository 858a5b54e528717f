"""The least-peak search's time limit is counted in work, not wall seconds, so budget 0 resolves to
the same plan on a loaded machine as on an idle one (and on a slow machine as on a fast one)."""
import itertools
import time

import numpy as np
import pytest

from estimators import get_estimator
from planner.build import build_problem
from planner.models import GPTConfig, gpt_example
from planner.problem import evaluate, evaluations
from planner.tracing import capture
from solvers import clock, frugal


@pytest.fixture(scope="module")
def problem():
    model, batch = gpt_example(GPTConfig(n_layer=3, d_model=64, n_head=4, seq_len=64, vocab=128, batch=2))
    return build_problem(capture(model, batch), get_estimator("flops"))


def slowed(monkeypatch, factor: float):
    """The wall clock as a machine ``factor`` times slower would read it while doing this work:
    every reading of ``time.monotonic`` moves it on by ``factor`` times the real time since the
    last reading."""
    real = time.monotonic
    last, shown = [real()], [real()]

    def reading() -> float:
        now = real()
        shown[0] += (now - last[0]) * factor
        last[0] = now
        return shown[0]

    monkeypatch.setattr(time, "monotonic", reading)


def search(problem, monkeypatch, factor):
    with monkeypatch.context() as patch:
        slowed(patch, factor)
        patch.setattr(clock, "BACKSTOP", 1e9)  # no backstop: the slowest machine still counts work
        return frugal._min_peak_plan(problem, 1.5)


def test_the_least_peak_search_ends_at_the_same_plan_however_slow_the_machine(problem, monkeypatch):
    idle = search(problem, monkeypatch, 1.0)
    loaded = search(problem, monkeypatch, 40.0)  # each second of work read as 40
    assert idle.stats["clock"] == loaded.stats["clock"] == "work (deterministic)"
    assert np.array_equal(idle.plan.saved, loaded.plan.saved)
    assert idle.plan.peak_bytes == loaded.plan.peak_bytes
    # the search did run past its start: the plan is lower than the local search's reference
    assert idle.plan.peak_bytes < idle.stats["local_search"]["reference_peak_bytes"]


def test_a_deadline_on_the_work_clock_passes_after_the_work_it_stands_for(problem, monkeypatch):
    # no backstop: on a loaded machine (the suite runs one worker per core) an evaluation can take
    # more than BACKSTOP times the reference's time, and the wall clock would end the wait early
    monkeypatch.setattr(clock, "BACKSTOP", 1e9)
    empty = np.zeros(len(problem), dtype=bool)
    one = clock.EVALUATION_SECONDS + clock.NODE_SECONDS * len(problem)
    with clock.counting_work() as work:
        deadline = clock.now() + 10.5 * one
        done = evaluations()[0]
        for count in itertools.count():
            if clock.passed(deadline):
                break
            evaluate(problem, empty)
    assert evaluations()[0] - done == count == 11
    assert not work.wall_stopped
    assert clock.now() == pytest.approx(time.monotonic(), abs=5.0)  # outside, the wall clock again


def test_the_wall_clock_stops_a_search_far_slower_than_the_reference_and_says_so(problem, monkeypatch):
    with monkeypatch.context() as patch:
        slowed(patch, 1e4)
        found = frugal._min_peak_plan(problem, 1.5)
    assert found.stats["clock"].startswith("wall")


def test_a_plan_at_budget_0_says_which_clock_ended_its_least_peak_search(tmp_path, monkeypatch):
    import planner
    from tests.models import gpt

    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(frugal, "_FOUND", {})
    monkeypatch.setattr(clock, "BACKSTOP", 1e9)  # a loaded machine's wall clock does not end it
    model, inputs = gpt()
    planned = planner.plan(model, inputs, planner.PlannerConfig(memory_budget=0.0, solver="cpsat", time_limit=2.0))
    searched = planned.decision.stats["frugal_search"]
    assert searched["clock"] == "work (deterministic)" and searched["cache"] is None
    (kept,) = tmp_path.glob("frugal-*.json")  # a later process reads the answer with its clock
    monkeypatch.setattr(frugal, "_FOUND", {})
    again = frugal.min_peak_plan(planned.graph_plan.problem, 2.0)
    assert again.stats == {"cache": str(kept), "clock": searched["clock"]}
