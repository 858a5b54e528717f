"""0/1 knapsack by dynamic programming over quantised weights (vectorised numpy)."""
from __future__ import annotations

import time

import numpy as np

from planner.decision import Status
from planner.problem import Evaluation, Problem
from solvers.base import CapacitySolver, Solution
from solvers.knapsack_items import fractional_upper_bound, knapsack_items

__all__ = ["DPSolver"]


class DPSolver(CapacitySolver):
    """Exact 0/1 knapsack on weights rounded *up* to a quantum of bytes.

    The quantum is ``(runtime-optimal memory - frugal memory) / resolution``, the same for every
    budget of a problem, so plans are comparable across budgets. Rounding up keeps every plan
    within the budget; what it can cost is bounded and reported: ``stats["knapsack_gap"]`` is the
    relative distance of the chosen value to the fractional-knapsack upper bound (exact weights),
    so no 0/1 choice can avoid more than ``(1 + gap)`` times the seconds this one avoids.
    Among equally good choices the lightest is taken.

    Complexity: O(items x resolution) time, O(items x resolution) bits of memory.

    Parameters
    ----------
    resolution : number of weight buckets between the frugal and the runtime-optimal plan.
    """

    name = "dp"

    def __init__(self, time_limit: float = 60.0, resolution: int = 4096) -> None:
        super().__init__(time_limit)
        self.resolution = self._positive_int("resolution", resolution)

    def _solve_capacity(
        self, problem: Problem, capacity_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float
    ) -> Solution:
        items = knapsack_items(problem, frugal)
        quantum = max(1, -(-(fast.memory_bytes - frugal.memory_bytes) // self.resolution))
        capacity = capacity_bytes - frugal.memory_bytes
        weights = -(-items.weight // quantum)  # ceil: never under-count a weight
        slots = capacity // quantum
        chosen, timed_out = _knapsack(weights, items.value, slots, deadline)
        value = float(items.value[chosen].sum())
        bound = fractional_upper_bound(items, capacity)
        gap = 0.0 if bound <= 0 else max(0.0, (bound - value) / bound)
        saved = frugal.saved.copy()
        saved[items.index[chosen]] = True
        stats = {
            "items": len(items.index),
            "quantum_bytes": int(quantum),
            "knapsack_value_seconds": value,
            "knapsack_upper_bound_seconds": bound,
            "knapsack_gap": gap,
            "timed_out": timed_out,
        }
        return Solution(saved, Status.HEURISTIC, None, stats)


def _knapsack(weights: np.ndarray, values: np.ndarray, slots: int, deadline: float) -> tuple[np.ndarray, bool]:
    """Indices of the best items within ``slots``; the lightest among equal values.

    If the deadline passes, the items not yet considered are left out (the answer stays feasible).
    """
    best = np.zeros(slots + 1)
    took = np.zeros((len(weights), slots + 1), dtype=bool)
    timed_out = False
    for k, (w, v) in enumerate(zip(weights, values)):
        if time.monotonic() > deadline:
            timed_out = True
            break
        if w > slots:
            continue
        candidate = best[: slots + 1 - w] + v
        better = candidate > best[w:]
        took[k, w:] = better
        best[w:] = np.where(better, candidate, best[w:])
    # best[] is non-decreasing in capacity; the first slot reaching the maximum is the lightest plan.
    slot = int(np.flatnonzero(best >= best[-1])[0])
    chosen = []
    for k in range(len(weights) - 1, -1, -1):
        if took[k, slot]:
            chosen.append(k)
            slot -= int(weights[k])
    return np.array(chosen[::-1], dtype=np.int64), timed_out
