"""Local search on peak memory: move single nodes between saved and recomputed.

From a plan, look at the step where memory peaks; try recomputing each of the largest saved
values alive there, and saving each of the largest recomputed copies alive there; keep the
move that lowers the peak most (ties: least recompute time). Stops when no move lowers the
peak. Every plan is measured by :func:`planner.problem.evaluate`, so the result is exact for
what it is: a good least-peak plan found fast, with no optimality claim. It gives the exact
least-peak search its starting point.
"""
from __future__ import annotations

import numpy as np

from planner.problem import Evaluation, InfeasibleDecision, Problem, evaluate, memory_profile
from solvers.clock import passed

__all__ = ["lower_peak"]


def lower_peak(problem: Problem, start: Evaluation, deadline: float, width: int = 16) -> tuple[Evaluation, int]:
    """The plan the search ends at from ``start``, and the number of moves it made.

    ``width`` is how many of the largest values alive at the peak step are tried each way.
    """
    plan, moves = start, 0
    while not passed(deadline):
        best = None
        for candidate in _neighbours(problem, plan, width):
            if candidate.peak_bytes < plan.peak_bytes and (
                best is None or (candidate.peak_bytes, candidate.seconds) < (best.peak_bytes, best.seconds)
            ):
                best = candidate
        if best is None:
            break
        plan, moves = best, moves + 1
    return plan, moves


def _neighbours(problem: Problem, plan: Evaluation, width: int):
    s = problem.schedule
    prof = memory_profile(problem, plan)
    own = s.owns
    if prof.forward.max(initial=0) >= prof.backward.max(initial=0):
        f = int(np.argmax(prof.forward))
        alive_saved = plan.saved & (np.arange(len(problem)) <= f)
        alive_copies = np.zeros(len(problem), dtype=bool)
    else:
        t = int(np.argmax(prof.backward))
        alive_saved = plan.saved & own  # saved values live from the forward; the size ranks them
        alive_copies = plan.recomputed & own & (s.first_read <= t) & (s.last_read >= t)
    for mask, size, flip in ((alive_saved, problem.nbytes, False), (alive_copies, s.copy_bytes + s.copy_scratch, True)):
        nodes = np.flatnonzero(mask & (size > 0))
        allowed = problem.saveable if flip else problem.recomputable
        for i in nodes[np.argsort(-size[nodes], kind="stable")][:width]:
            if not allowed[i]:
                continue
            saved = plan.saved.copy()
            saved[i] = flip
            try:
                yield evaluate(problem, saved)
            except InfeasibleDecision:
                continue
