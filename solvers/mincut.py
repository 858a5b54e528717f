"""Minimum cuts of the split-node graph, priced by memory plus lambda times the plan's seconds.

One cut gives the plan minimising ``bytes saved + lambda * seconds`` (recomputing plus saving) exactly
(networkx max-flow, as PyTorch's default partitioner uses). Searching lambda (Eisner-Severance
on the hull) finds the cheapest of those Pareto points that fits the budget, and every cut
proves a bound:
``seconds >= (cut value - budget) / lambda`` for any plan within the budget.
"""
from __future__ import annotations

from planner.bounds import hull_walk, price_rounding
from planner.decision import Status
from planner.problem import Evaluation, Problem
from solvers.base import Solution, Solver

__all__ = ["MinCutSolver"]


class MinCutSolver(Solver):
    """Lagrangian min-cut: a few max-flows, each at the lambda where the current ends tie.

    At budget 1.0 it returns the runtime-optimal partition (one cut); below, the plan found is on
    the lower convex hull of the memory/runtime trade-off, and ``gap`` is proven by the cuts.
    It is also the warm start the exact solvers can improve on.

    Parameters
    ----------
    time_limit : seconds for the search.
    iterations : largest number of cuts.

    Complexity: ``iterations`` max-flows on 2n nodes.
    """

    name = "mincut"

    def __init__(self, time_limit: float = 60.0, iterations: int = 16) -> None:
        super().__init__(time_limit)
        self.iterations = self._positive_int("iterations", iterations)

    def _solve(
        self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float,
        starts: dict[str, Evaluation] | None = None,  # a heuristic: not read
    ) -> Solution:
        # The frugal plan fits, the fast one does not; the walk keeps the fitting end, and every
        # cut bounds the seconds of any plan within the budget.
        bound, cuts = 0.0, 0
        rounding = price_rounding(problem)

        def on_cut(value: float, lam: float) -> None:
            nonlocal bound, cuts
            cuts += 1
            bound = max(bound, (value - budget_bytes - rounding) / lam)

        fits = hull_walk(problem, frugal, fast, lambda plan: plan.peak_bytes <= budget_bytes, self.iterations,
                         deadline, on_cut)
        found = fits.seconds
        gap = 0.0 if found <= bound * (1 + 1e-9) else (found - bound) / found
        status = Status.OPTIMAL if gap == 0.0 else Status.HEURISTIC
        return Solution(fits.saved, status, gap, {"cuts": cuts, "lower_bound_seconds": bound})
