"""The exact least-peak plan is searched once per memory model and kept on disk, so budget 0 (and
fractions with ``frugal_search="exact"``) resolve to the same bytes from run to run."""
import json
from dataclasses import replace

import numpy as np
import pytest

from planner.bounds import runtime_optimal_plan
from planner.budget import Budget
from solvers import frugal
from tests.synthetic import brute_force_min_peak, random_problem


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory, and a process that has searched for nothing yet."""
    monkeypatch.setenv("ACPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(frugal, "_FOUND", {})
    return tmp_path


def new_process(monkeypatch, search=None):
    """Forget the in-process answers; ``search`` replaces the search (None: it must not run)."""
    monkeypatch.setattr(frugal, "_FOUND", {})

    def refuse(problem, time_limit):
        raise AssertionError("the frugal search ran although the cache answers")

    monkeypatch.setattr(frugal, "_min_peak_plan", search or refuse)


def cache_file(cache):
    (path,) = cache.glob("frugal-*.json")
    return path


def rewrite(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


PROBLEM = random_problem(0, 12, timed=True)  # the fastest plan peaks above the least peak


def test_a_later_process_reads_the_plan_and_resolves_the_same_budget(cache, monkeypatch):
    first = frugal.min_peak_plan(PROBLEM)
    assert first.plan.peak_bytes == brute_force_min_peak(PROBLEM)
    budget = Budget(fraction=0.3).resolve(PROBLEM, first.plan.peak_bytes)
    new_process(monkeypatch)
    again = frugal.min_peak_plan(PROBLEM)
    assert np.array_equal(again.plan.saved, first.plan.saved) and again.optimal == first.optimal
    assert again.stats["cache"] == str(cache_file(cache))
    assert Budget(fraction=0.3).resolve(PROBLEM, again.plan.peak_bytes) == budget


def test_an_unproven_plan_searched_for_less_time_is_searched_again_keeping_the_lower_peak(cache, monkeypatch):
    frugal.min_peak_plan(PROBLEM)
    path = cache_file(cache)
    rewrite(path, optimal=False, searched_for=1.0)
    fast = runtime_optimal_plan(PROBLEM)
    assert fast.peak_bytes > brute_force_min_peak(PROBLEM)  # else this test shows nothing
    # The new search ends at a worse plan than the cached one: the cached one stays.
    new_process(monkeypatch, lambda problem, limit: frugal.FrugalPlan(fast, False, limit))
    kept = frugal.min_peak_plan(PROBLEM, time_limit=5.0)
    assert kept.plan.peak_bytes == brute_force_min_peak(PROBLEM) and "searched_again" in kept.stats
    assert json.loads(path.read_text())["searched_for"] == 5.0
    # Searched for 5 s now: a call allowing 5 s or less reads it back.
    new_process(monkeypatch)
    assert frugal.min_peak_plan(PROBLEM, time_limit=5.0).plan.peak_bytes == kept.plan.peak_bytes


@pytest.mark.parametrize("damage", ["not json", "wrong peak", "unsaveable node", "node out of range"])
def test_a_damaged_or_stale_file_is_searched_again_and_replaced(cache, monkeypatch, damage):
    first = frugal.min_peak_plan(PROBLEM)
    path = cache_file(cache)
    if damage == "not json":
        path.write_text("{")
    elif damage == "wrong peak":
        rewrite(path, peak_bytes=first.plan.peak_bytes + 1)
    elif damage == "unsaveable node":
        rewrite(path, saved=[int(np.flatnonzero(~PROBLEM.saveable)[0])])
    else:
        rewrite(path, saved=[len(PROBLEM)])
    searched = []

    def search(problem, limit):
        searched.append(limit)
        return replace(first, stats={})

    new_process(monkeypatch, search)
    if damage == "wrong peak":  # a plan whose peak changed: the memory model's code changed
        found = frugal.min_peak_plan(PROBLEM)
    else:
        with pytest.warns(UserWarning, match="unreadable frugal-plan cache file"):
            found = frugal.min_peak_plan(PROBLEM)
    assert searched == [60.0] and found.plan.peak_bytes == first.plan.peak_bytes
    assert json.loads(path.read_text())["peak_bytes"] == first.plan.peak_bytes


def test_a_longer_time_limit_searches_again_in_the_same_process(cache, monkeypatch):
    problem = random_problem(3, 14)
    calls = []
    search = frugal._min_peak_plan

    def unproven_then_real(problem, time_limit):  # the first search stops short of a proof
        calls.append(time_limit)
        found = search(problem, time_limit)
        return replace(found, optimal=False) if len(calls) == 1 else found

    monkeypatch.setattr(frugal, "_min_peak_plan", unproven_then_real)
    assert not frugal.min_peak_plan(problem, 1.0).optimal
    assert not frugal.min_peak_plan(problem, 0.5).optimal and calls == [1.0]  # searched for long enough
    assert frugal.min_peak_plan(problem, 30.0).optimal and calls == [1.0, 30.0]
    assert frugal.min_peak_plan(problem, 60.0).optimal and calls == [1.0, 30.0]  # proven: kept
