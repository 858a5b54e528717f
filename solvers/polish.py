"""Local improvement of a plan an exact solver left unproven: save more while the budget holds.

A time-limited exact solver may stop at its starting plan. At budget 0 that start is the
least-peak plan, which recomputes everything it can: on the zoo's Llama (763 problem nodes,
priced at H200 datasheet rates on a CPU) CP-SAT's default limit returned it unchanged, 2.110 ms
of recomputation, and 60 s of CP-SAT found 1.798 ms. Sweeping the recomputed values, each saved
where the plan's peak stays within the budget and its seconds fall, found 1.787 ms in 0.8 s:
most values whose recomputation the least peak does not need can be kept, the peak being set by
a few steps elsewhere.

A value read from a multi-output op (a batch norm's statistics, an attention's output and its
log-sum-exp) gains nothing saved alone while its siblings still need the op run again, so where
one save gains nothing the sweep tries it with its recomputed siblings. On timm's ResNet-50 at
budget 0 (captured on a CPU, H100 datasheet rates, each BatchNorm's ``var_mean`` read through two
getitems) the sweeps then came to 1610 us of recomputation, against 3216 us saving one value at a
time.
"""
from __future__ import annotations

import time

import numpy as np

from planner.problem import Evaluation, InfeasibleDecision, Problem, evaluate
from solvers.clock import passed

__all__ = ["polish"]


def polish(problem: Problem, plan: Evaluation, budget_bytes: int, deadline: float) -> tuple[Evaluation, dict]:
    """``plan`` improved by first-improvement sweeps: each recomputed value that owns its
    storage, most recompute seconds per byte first, is saved (alone, else with its recomputed
    siblings) where the plan stays within ``budget_bytes`` and gets faster; sweeps repeat until
    one changes nothing or ``deadline`` (an instant of :func:`solvers.clock.now`) passes. Returns the plan
    and what the sweeps did: values saved, plans evaluated, sweeps, seconds, the seconds before
    and after, the names of the values ``plan`` saved (``"start"``) and of those the sweeps saved,
    in the order they saved them (``"added"``: each a gain given those before it)."""
    start = time.monotonic()
    own = problem.schedule.owns
    siblings = _siblings(problem)
    best, added, tried, sweeps, stopped_by = plan, [], 0, 0, None
    while stopped_by is None:
        sweeps += 1
        candidates = np.flatnonzero(best.recomputed & problem.saveable & own & (problem.nbytes > 0))
        order = candidates[np.argsort(-problem.runtime[candidates] / problem.nbytes[candidates], kind="stable")]
        improved = False
        for i in order:
            if passed(deadline):
                stopped_by = "time limit"
                break
            if not best.recomputed[i]:
                continue  # a save earlier in this sweep made it unneeded
            together = [j for j in siblings.get(int(i), ()) if best.recomputed[j] and problem.saveable[j]]
            for move in ([i], [i, *together]) if together else ([i],):
                saved = best.saved.copy()
                saved[move] = True
                try:
                    candidate = evaluate(problem, saved)
                except InfeasibleDecision:
                    continue
                tried += 1
                if candidate.peak_bytes <= budget_bytes and candidate.seconds < best.seconds:
                    best, improved = candidate, True
                    added += [problem.names[j] for j in move]
                    break
        if stopped_by is None and not improved:
            stopped_by = "no gain"
    return best, {"saved_values": len(added), "plans_evaluated": tried, "sweeps": sweeps,
                  "seconds": round(time.monotonic() - start, 3), "objective_before": plan.seconds,
                  "objective_after": best.seconds, "stopped_by": stopped_by,
                  "start": [problem.names[i] for i in np.flatnonzero(plan.saved)], "added": added}


def _siblings(problem: Problem) -> dict[int, list[int]]:
    """Per node read from a multi-output op (its one input, an op that computes but owns no
    storage of its own), the other nodes read from that op alone."""
    children: dict[int, list[int]] = {}
    for i, inputs in enumerate(problem.inputs):
        if len(inputs) == 1 and not problem.saveable[inputs[0]] and problem.runtime[inputs[0]] > 0:
            children.setdefault(int(inputs[0]), []).append(i)
    return {i: [j for j in group if j != i] for group in children.values() if len(group) > 1 for i in group}
