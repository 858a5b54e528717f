"""Plans rounded from the linear relaxation of the graph model, the bound it proves, and the
plans of the program restricted to the variables where the relaxation and a plan disagree.

The relaxation (every 0/1 variable in [0, 1]) with memory rows added lazily, as the exact
solvers add them, is solved by HiGHS in a fraction of a second even at 48 layers. Its optimum
bounds every plan within the budget from below, and saving the nodes whose ``saved`` value
passes a threshold (the rest recomputed as needed) gives plans that often fit the budget: on
the 12-layer built-in GPT at budget 0.1 such a plan costs two thirds of what the exact solvers
found in 10 s without it, and at 48 layers and budget 0.1 it comes within 0.8% of the bound.

:func:`improve_near` then solves the exact program with every 0/1 variable on which the
relaxation agrees with the plan fixed to that value (relaxation induced neighbourhood search):
a few hundred variables stay free, and HiGHS solves it in a second, at 48 layers and budget
0.5 from 5.3% above the relaxation's bound to 1.6%.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.problem import Evaluation, Problem, evaluate
from solvers.backends import solve_highs, within_peak
from solvers.graph_model import build_graph_model, seconds_bound, tie_broken_objective
from solvers.peak_rows import Round, Steps, solve_within_peak

__all__ = ["Rounded", "improve_near", "round_relaxation", "THRESHOLDS"]

THRESHOLDS = (0.5, 0.3, 0.7, 0.1, 0.9, 0.01, 0.99)


@dataclass(frozen=True)
class Rounded:
    """The fastest rounded plan within the budget (None if none fitted), the relaxation's bound
    in seconds (None if no relaxation was solved), its last solution's 0/1 variables (None
    likewise), and the lazy loop's rounds."""

    plan: Evaluation | None
    bound: float | None
    values: np.ndarray | None
    rounds: int


def round_relaxation(problem: Problem, budget_bytes: int, deadline: float, steps: Steps | None = None) -> Rounded:
    """Solve the relaxation with memory rows added lazily (at the steps where the plan rounded at
    0.5 exceeds the budget) and round every round's solution at each of ``THRESHOLDS``.

    ``steps`` is grown in place with the steps the loop needed, for the exact program after it.
    """
    base, build = build_graph_model(problem)
    objective = tie_broken_objective(base)
    fitting: list[Evaluation] = []
    bounds: list[float] = []
    last: list[np.ndarray] = []
    must = _must_save(problem)

    def solve(model, limit) -> Round:
        answer = solve_highs(model.relaxed(), np.pad(objective, (0, model.num_vars - len(objective))), deadline)
        if answer.x is None:
            return Round(None, None, False)
        if answer.bound is not None:
            bounds.append(seconds_bound(answer.bound, base))
        last.append(answer.x[: len(objective)])
        values = base.saved_values(answer.x)
        # Saving a node the backward does not reach costs nothing (evaluate counts what is
        # used), so each rounding also saves every node that cannot be recomputed: it is a plan.
        plans = {threshold: evaluate(problem, (values > threshold) | must) for threshold in THRESHOLDS}
        fitting.extend(plan for plan in plans.values() if plan.peak_bytes <= budget_bytes)
        return Round(plans[0.5], answer.x, False)

    _, stats = solve_within_peak(problem, base, build, solve, deadline, limit_bytes=budget_bytes, steps=steps)
    best = min(fitting, key=lambda plan: plan.seconds, default=None)
    return Rounded(best, max(bounds, default=None), last[-1] if last else None, stats["rounds"])


def _must_save(problem: Problem) -> np.ndarray:
    """Saveable nodes that cannot be recomputed: not recomputable, or reading (through nodes
    that cannot be saved) one that is not. Saving them all, whatever else is saved, leaves
    every node the backward needs saved or recomputable."""
    blocked = ~problem.recomputable
    for i in range(len(problem)):  # topological order: inputs come first
        blocked[i] |= any(blocked[j] and not problem.saveable[j] for j in problem.inputs[i])
    return problem.saveable & blocked


def improve_near(problem: Problem, budget_bytes: int, plan: Evaluation, values: np.ndarray, deadline: float,
                 steps: Steps) -> Evaluation:
    """The best plan of the exact program with every 0/1 variable fixed where ``values`` (the
    relaxation's) equals ``plan``'s, solved by HiGHS with ``plan``'s objective as cutoff
    until ``deadline``; ``plan`` if none is faster. ``steps`` as in :func:`round_relaxation`."""
    def fix(build, base):
        current = base.vector(plan.saved, plan.recomputed)[: len(values)]
        for k in np.flatnonzero(np.abs(values - current) < 1e-6):
            build.add_row([int(k)], [1.0], float(current[k]), float(current[k]))

    found = within_peak(problem, budget_bytes, plan, deadline, lambda model, objective, start: solve_highs(
        model, objective, deadline, cutoff=objective @ start), restrict=fix, steps=steps)
    better = evaluate(problem, found.saved)
    return better if better.seconds < plan.seconds and better.peak_bytes <= budget_bytes else plan
