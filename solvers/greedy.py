"""Greedy knapsack: save the nodes that avoid the most recompute seconds per byte."""
from __future__ import annotations

import numpy as np

from planner.decision import Status
from planner.problem import Evaluation, Problem
from solvers.base import CapacitySolver, Solution
from solvers.knapsack_items import knapsack_items

__all__ = ["GreedySolver"]


class GreedySolver(CapacitySolver):
    """Take items in order of value per byte and stop at the first that does not fit.

    Stopping (rather than skipping to smaller items) makes plans nested: a larger budget saves a
    superset of what a smaller budget saves, so memory never rises as the budget falls.

    Complexity: O(n log n) for n candidate nodes.
    """

    name = "greedy"

    def _solve_capacity(
        self, problem: Problem, capacity_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float
    ) -> Solution:
        items = knapsack_items(problem, frugal)
        density = items.value / np.maximum(items.weight, 1)
        order = np.argsort(-density, kind="stable")
        room = capacity_bytes - frugal.memory_bytes
        fits = np.cumsum(items.weight[order]) <= room
        taken = order[: int(np.argmin(fits)) if not fits.all() else len(order)]
        saved = frugal.saved.copy()
        saved[items.index[taken]] = True
        return Solution(saved, Status.HEURISTIC, None, {"items": len(items.index), "taken": len(taken)})
