"""Minimum cuts of the split-node graph, priced by memory plus lambda times recompute time.

One cut gives the plan minimising ``bytes saved + lambda * seconds recomputed`` exactly
(networkx max-flow, as PyTorch's default partitioner uses). Searching lambda finds the
cheapest plan that fits the budget among those Pareto points, and every cut proves a bound:
``seconds >= (cut value - budget) / lambda`` for any plan within the budget.
"""
from __future__ import annotations

import math
import time

import numpy as np

from planner.bounds import cut_graph, cut_plan
from planner.decision import Status
from planner.errors import ConfigError
from planner.problem import Evaluation, Problem, evaluate
from solvers.base import Solution, Solver

__all__ = ["MinCutSolver"]


class MinCutSolver(Solver):
    """Lagrangian min-cut: bisection on lambda, a few max-flows.

    At budget 1.0 it returns the runtime-optimal partition (one cut); below, the plan found is on
    the lower convex hull of the memory/runtime trade-off, and ``gap`` is proven by the cuts.
    It is also the warm start the exact solvers can improve on.

    Parameters
    ----------
    time_limit : seconds for the search.
    iterations : largest number of cuts (bisection steps on log lambda).

    Complexity: ``iterations`` max-flows on 2n nodes.
    """

    name = "mincut"

    def __init__(self, time_limit: float = 60.0, iterations: int = 16) -> None:
        super().__init__(time_limit)
        if not (isinstance(iterations, int) and iterations >= 1):
            raise ConfigError(f"mincut iterations must be a positive int, got {iterations!r}")
        self.iterations = iterations

    def _solve(self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation) -> Solution:
        deadline = time.monotonic() + self.time_limit
        best, bound, cuts = frugal, 0.0, 0
        positive = problem.runtime[problem.runtime > 0]
        rounding = 0.5 * len(positive)  # prices are rounded to whole bytes: at most this much in all
        # Below lo the frugal plan is optimal for the priced cut; above hi nothing is worth recomputing.
        lo = 1.0 / max(float(problem.runtime.sum()), 1e-30)
        hi = 2.0 * float(fast.memory_bytes) / max(float(positive.min(initial=1.0)), 1e-30)
        while cuts < self.iterations and time.monotonic() < deadline:
            lam = math.sqrt(lo * hi)
            plan, value = self._cut(problem, lam)
            cuts += 1
            bound = max(bound, (value - budget_bytes - rounding) / lam)
            if plan.memory_bytes <= budget_bytes:
                best = plan if plan.recompute_seconds < best.recompute_seconds else best
                lo = lam
            else:
                hi = lam
        found = best.recompute_seconds
        gap = 0.0 if found <= bound * (1 + 1e-9) else (found - bound) / found
        status = Status.OPTIMAL if gap == 0.0 else Status.HEURISTIC
        return Solution(best.saved, status, gap, {"cuts": cuts, "lower_bound_seconds": bound})

    @staticmethod
    def _cut(problem: Problem, lam: float) -> tuple[Evaluation, float]:
        """The plan of one priced cut, and its value ``memory + lam * runtime`` (byte units)."""
        price = np.rint(lam * problem.runtime)
        plan = evaluate(problem, cut_plan(cut_graph(problem, price), len(problem)))
        recomputed_price = float(price[plan.recomputed].sum())
        return plan, plan.memory_bytes + recomputed_price
