"""The knapsack view of a problem, shared by the greedy and dp solvers.

Starting from the most frugal plan, each item is one more node to save: its weight is its bytes,
its value the seconds of recomputation it avoids *locally* (its own runtime, plus that of the
unsaveable nodes it is read from, such as the multi-output op behind a getitem) less what
saving it costs (:attr:`planner.problem.Problem.save_seconds`). Items are
treated as independent, as in PyTorch's knapsack partitioner; the true cost of the chosen set is
then measured on the graph by :func:`planner.problem.evaluate`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.problem import Evaluation, Problem

__all__ = ["Items", "knapsack_items", "fractional_upper_bound"]


@dataclass(frozen=True)
class Items:
    index: np.ndarray  # node index of each item
    weight: np.ndarray  # bytes, int64
    value: np.ndarray  # seconds saved, float64


def knapsack_items(problem: Problem, frugal: Evaluation) -> Items:
    """Items: saveable, recomputable nodes that the most frugal plan recomputes."""
    candidates = np.flatnonzero(frugal.recomputed & problem.saveable & ~frugal.saved)
    value = np.array([_local_runtime(problem, int(i)) for i in candidates], dtype=np.float64)
    value -= problem.save_seconds[candidates]
    keep = value > 0
    index = candidates[keep]
    return Items(index, problem.nbytes[index].astype(np.int64), value[keep])


def _local_runtime(problem: Problem, i: int) -> float:
    """Runtime of node i plus the unsaveable nodes that must run again to produce it."""
    total, stack, seen = 0.0, [i], set()
    while stack:
        j = stack.pop()
        if j in seen:
            continue
        seen.add(j)
        total += float(problem.runtime[j])
        stack.extend(int(k) for k in problem.inputs[j] if not problem.saveable[k])
    return total


def fractional_upper_bound(items: Items, capacity: int) -> float:
    """Best value of the fractional (LP) relaxation: an upper bound on any 0/1 choice."""
    order = np.argsort(-items.value / np.maximum(items.weight, 1), kind="stable")
    room, total = float(capacity), 0.0
    for k in order:
        w, v = float(items.weight[k]), float(items.value[k])
        if w <= room:
            room -= w
            total += v
        else:
            total += v * room / w
            break
    return total
