"""The most memory-frugal plan: the least peak memory the planner can reach.

Budget 0 means this plan's peak; every solver refuses a budget below it. A local search
(:mod:`solvers.peak_search`) from the runtime-optimal and the least-saved-bytes plans finds a
low peak in seconds; then the graph model with memory rows (:mod:`solvers.peak_rows`) and a
peak variable to minimise, solved by CP-SAT from that plan, lowers it further and proves it
least when it finishes within the time limit (``optimal``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
import hashlib
import time
from typing import Any

import numpy as np

from planner.bounds import min_memory_plan, runtime_optimal_plan
from planner.problem import Evaluation, Problem, evaluate
from solvers.graph_model import build_graph_model
from solvers.peak_rows import solve_within_peak
from solvers.peak_search import lower_peak

__all__ = ["FrugalPlan", "min_peak_plan"]


@dataclass(frozen=True)
class FrugalPlan:
    """The least-peak plan found, and whether that least peak is proven."""

    plan: Evaluation
    optimal: bool
    seconds: float
    stats: dict[str, Any] = field(default_factory=dict)


def min_peak_plan(problem: Problem, time_limit: float = 60.0) -> FrugalPlan:
    """The plan with the least peak memory (:func:`planner.problem.memory_profile`).

    If the time limit passes first, the best plan found is returned with ``optimal=False``;
    the runtime-optimal plan is returned when no plan beats its peak.

    Complexity: a CP-SAT program per round of added memory rows.
    """
    key = _memory_key(problem)
    if key not in _FOUND:
        _FOUND[key] = _min_peak_plan(problem, float(time_limit))
    found = _FOUND[key]
    # The same saved set, costed with this problem's runtimes and save costs.
    return replace(found, plan=evaluate(problem, found.plan.saved))


# One answer per memory model (the first search's), so every budget and every estimator of a
# graph share one frugal end. The least peak does not depend on runtimes.
_FOUND: dict[str, FrugalPlan] = {}


def _memory_key(problem: Problem) -> str:
    h = hashlib.sha256()
    s = problem.schedule
    schedule = [getattr(s, f.name) for f in fields(s) if f.name != "step_names"]  # every array
    for array in (problem.nbytes, problem.saveable, problem.recomputable, problem.random, problem.needed,
                  problem.input_ptr, problem.input_idx, *schedule):
        h.update(np.ascontiguousarray(array).tobytes())
    h.update(str((problem.rng_state_bytes, problem.names)).encode())
    return h.hexdigest()


def _min_peak_plan(problem: Problem, time_limit: float) -> FrugalPlan:
    from solvers.cpsat import run_cpsat
    from solvers.ilp import to_round

    start = time.perf_counter()
    deadline = time.monotonic() + time_limit
    fast = runtime_optimal_plan(problem)
    base, build = build_graph_model(problem)

    searched = [lower_peak(problem, begin, deadline) for begin in (fast, min_memory_plan(problem))]
    start_plan = min((plan for plan, _ in searched), key=lambda p: (p.peak_bytes, p.seconds))
    hint = [start_plan]

    def solve(model, limit):
        found = to_round(problem, model, run_cpsat(model, None, model.vector(hint[-1].saved, hint[-1].recomputed), deadline, 8, limit))
        if found.plan is not None:
            hint.append(found.plan)
        return found

    result, stats = solve_within_peak(problem, base, build, solve, deadline, peak_span=float(fast.peak_bytes + 2**20))
    stats["local_search"] = {"peak_bytes": start_plan.peak_bytes, "moves": [moves for _, moves in searched]}
    seconds = time.perf_counter() - start
    # Every plan's peak is measured exactly; the least wins, whichever search found it.
    found = min((p for p in (result.plan, start_plan, fast) if p is not None), key=lambda p: (p.peak_bytes, p.seconds))
    proven = result.optimal and time.monotonic() <= deadline and found.peak_bytes == getattr(result.plan, "peak_bytes", None)
    return FrugalPlan(found, proven, seconds, stats)
