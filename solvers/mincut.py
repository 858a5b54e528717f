"""Minimum cuts of the split-node graph, priced by memory plus lambda times the plan's seconds.

One cut gives the plan minimising ``bytes saved + lambda * seconds`` (recomputing plus saving) exactly
(networkx max-flow, as PyTorch's default partitioner uses). Searching lambda (Eisner-Severance
on the hull) finds the cheapest of those Pareto points that fits the budget, and every cut
proves a bound:
``seconds >= (cut value - budget) / lambda`` for any plan within the budget.
"""
from __future__ import annotations

import time

import numpy as np

from planner.bounds import cut_network
from planner.decision import Status
from planner.problem import Evaluation, Problem, evaluate
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
        self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float
    ) -> Solution:
        # prices are rounded to whole bytes
        rounding = 0.5 * int((problem.runtime > 0).sum() + (problem.save_seconds > 0).sum())
        # The frugal plan fits, the fast one does not; each cut at the lambda where the two tie
        # either finds a plan below the segment joining them (which replaces one end) or proves
        # the segment is an edge of the lower convex hull, whose fitting end is the answer.
        fits, over, bound, cuts = frugal, fast, 0.0, 0
        while (cuts < self.iterations and time.monotonic() < deadline and fits.seconds > over.seconds
               and over.memory_bytes > fits.memory_bytes):
            lam = (over.memory_bytes - fits.memory_bytes) / (fits.seconds - over.seconds)
            plan, value = self._cut(problem, lam)
            cuts += 1
            bound = max(bound, (value - budget_bytes - rounding) / lam)
            if value >= fits.memory_bytes + lam * fits.seconds - rounding - 1:
                break  # nothing below the segment: it is a hull edge
            if plan.peak_bytes <= budget_bytes:
                fits = plan
            else:
                over = plan
        found = fits.seconds
        gap = 0.0 if found <= bound * (1 + 1e-9) else (found - bound) / found
        status = Status.OPTIMAL if gap == 0.0 else Status.HEURISTIC
        return Solution(fits.saved, status, gap, {"cuts": cuts, "lower_bound_seconds": bound})

    @staticmethod
    def _cut(problem: Problem, lam: float) -> tuple[Evaluation, float]:
        """The plan of one priced cut, and its value ``memory + lam * seconds`` (byte units)."""
        price, save = np.rint(lam * problem.runtime), np.rint(lam * problem.save_seconds)
        plan = evaluate(problem, cut_network(problem).cut(price, save))
        return plan, plan.memory_bytes + float(price[plan.recomputed].sum() + save[plan.saved].sum())
