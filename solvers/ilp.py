"""Exact integer program on the graph, solved by HiGHS (default) or CBC.

Unlike a knapsack, the model knows that recomputing a node needs its inputs, saved or
recomputed themselves, so chains of recomputation are priced exactly (see
:mod:`solvers.graph_model`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from planner.decision import Status
from planner.errors import ConfigError
from planner.problem import Evaluation, Problem, evaluate, evaluate_names
from solvers.base import Solution, Solver, relative_gap
from solvers.blocks import Blocks, find_blocks
from solvers.graph_model import MEMORY_TIE_BREAK, GraphModel, build_graph_model, tie_blocks, tie_broken_objective
from solvers.peak_rows import Round, Steps, solve_within_peak

__all__ = ["ILPSolver", "BACKENDS", "lp_bound", "solve_highs", "to_round", "within_peak"]


@dataclass
class Answer:
    """A back end's answer: the solution vector (None if none found) and its proof status."""

    x: np.ndarray | None
    optimal: bool
    gap: float | None


class ILPSolver(Solver):
    """Mixed-integer program on the graph model.

    Minimises the recompute seconds under the budget, with memory as a tie-break (see
    :func:`tie_broken_objective`), so plans hold no more memory than they need and memory falls
    with the budget. Status ``optimal`` means proven optimal (zero gap) for that objective.

    Parameters
    ----------
    time_limit : seconds; at the limit the best plan found is returned with status
        ``feasible`` and its relative gap to the best bound.
    backend : ``"highs"`` (scipy.optimize.milp) or ``"cbc"`` (PuLP's bundled CBC).

    Complexity: NP-hard in general; the LP relaxation of this model is tight on most graphs.
    """

    name = "ilp"

    def __init__(self, time_limit: float = 60.0, backend: str = "highs") -> None:
        super().__init__(time_limit)
        if backend not in BACKENDS:
            raise ConfigError(f"ilp backend={backend!r} is not allowed; choose one of: {', '.join(BACKENDS)}")
        self.backend = backend

    def _solve(
        self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float
    ) -> Solution:
        backend = BACKENDS[self.backend]
        steps = Steps()
        begin, start, notes = heuristic_start(problem, budget_bytes, frugal, deadline, steps)
        solution = within_peak(problem, budget_bytes, start, deadline,
                               lambda model, objective: backend(model, objective, deadline), steps=steps)
        solution.stats.update(backend=self.backend, start=begin, **notes)
        return solution


HEURISTIC_SECONDS = 0.5
BLOCKS_SHARE = 0.5
BLOCKS_GAP = 0.01  # the tied program only supplies a start: each of its rounds stops within 1%


def heuristic_start(problem: Problem, budget_bytes: int, frugal: Evaluation,
                    deadline: float, steps: Steps) -> tuple[str, Evaluation, dict]:
    """The exact solvers' starting plan, which method made it, and notes for ``stats``.

    The fastest of the ``mincut`` and ``greedy`` plans for this budget and the most frugal
    plan, each of which fits the budget; near the frugal end the greedy capacity search often
    beats the frugal plan by far in a fraction of a second. Each heuristic gets a tenth of the
    time left, and at least ``HEURISTIC_SECONDS`` (the search for the frugal plan may have used
    the whole limit), so the solve can overrun its limit by that much.

    Then, if the problem repeats a block (:func:`solvers.blocks.find_blocks`: the layers of a
    transformer), the program with every block deciding alike, solved by HiGHS from that start
    for up to ``BLOCKS_SHARE`` of the time left (``"blocks"`` if it wins). Tying makes the
    program a fraction of its size, so at tight budgets it finds in seconds plans the full
    program does not reach within its limit; the full program then improves on it or proves
    it optimal, starting with the memory rows the tied program needed (added to ``steps``)."""
    from solvers.greedy import GreedySolver
    from solvers.mincut import MinCutSolver

    found = [("frugal", frugal)]
    for kind in (MinCutSolver, GreedySolver):
        share = max(HEURISTIC_SECONDS, 0.1 * (deadline - time.monotonic()))
        plan = evaluate_names(problem, kind(time_limit=share).solve(problem, budget_bytes).saved)
        if plan.peak_bytes <= budget_bytes:
            found.append((kind.name, plan))
    begin, start = min(found, key=lambda named: named[1].seconds)
    blocks = find_blocks(problem)
    if blocks is None:
        return begin, start, {"blocks": None}
    until = time.monotonic() + BLOCKS_SHARE * max(0.0, deadline - time.monotonic())
    tied = within_peak(problem, budget_bytes, start, until,
                       lambda model, objective: solve_highs(model, objective, until, BLOCKS_GAP), blocks=blocks, steps=steps)
    notes = {"blocks": {"start": blocks.start, "period": blocks.period, "count": blocks.count,
                        "status": tied.status, "gap_limit": BLOCKS_GAP, "rounds": tied.stats["rounds"]}}
    plan = evaluate(problem, tied.saved)
    return ("blocks", plan, notes) if plan.seconds < start.seconds else (begin, start, notes)


def within_peak(problem: Problem, budget_bytes: int, start: Evaluation, deadline: float, run,
                blocks: Blocks | None = None, steps: Steps | None = None) -> Solution:
    """The least-runtime plan whose peak fits, by :func:`solvers.peak_rows.solve_within_peak`.

    ``run(model, objective)`` solves one program and returns an :class:`Answer`. ``start`` is
    a plan within the budget (:func:`heuristic_start`'s): if the time limit
    passes before a faster plan within the budget is found, it is returned with status
    ``feasible``, and ``stats`` says so. A plan that is not proven optimal gets its gap to the
    best bound any round proved (each round relaxes the full program, so its bound holds).
    With ``blocks``, the program is the tied restriction (:func:`tie_blocks`), and the status and
    gap are of that program only. ``steps`` (:class:`solvers.peak_rows.Steps`) carries the
    memory rows' steps from one call to the next.
    """
    base, build = build_graph_model(problem)
    if blocks is not None:
        tie_blocks(build, base, blocks)
    objective = tie_broken_objective(base)
    top = float(np.max(base.runtime, initial=0.0))
    bounds = [0.0]

    def solve(model, limit):
        padded = np.pad(objective, (0, model.num_vars - len(objective)))
        answer = run(model, padded)
        if answer.x is not None and answer.gap is not None:
            # The bound of the scaled, tie-broken objective, back in seconds: the tie-break
            # weighs at most MEMORY_TIE_BREAK in all.
            bounds.append(max(0.0, float(padded @ answer.x) * (1.0 - answer.gap) - MEMORY_TIE_BREAK) * top)
        return to_round(problem, model, answer)

    result, stats = solve_within_peak(problem, base, build, solve, deadline, limit_bytes=budget_bytes, steps=steps)
    stats["start_seconds"] = start.seconds
    if result.plan is not None and result.optimal and result.plan.peak_bytes <= budget_bytes:
        return Solution(result.plan.saved, Status.OPTIMAL, 0.0, stats)
    if result.plan is None or result.plan.peak_bytes > budget_bytes or result.plan.seconds > start.seconds:
        stats["answer"] = "the starting plan: the time limit passed before a faster plan within the budget was found"
        found = start
    else:
        found = result.plan
    return Solution(found.saved, Status.FEASIBLE, relative_gap(found.seconds, max(bounds)), stats)


def to_round(problem: Problem, model: GraphModel, answer: "Answer") -> Round:
    plan = evaluate(problem, model.saved_mask(answer.x)) if answer.x is not None else None
    return Round(plan, answer.x, answer.optimal, answer.gap)


def solve_highs(model: GraphModel, objective: np.ndarray, deadline: float, gap: float = 0.0) -> Answer:
    """HiGHS branch-and-cut through ``scipy.optimize.milp``, to relative gap ``gap`` (optimal
    means within it)."""
    result = milp(
        objective,
        integrality=model.integral.astype(int),
        bounds=Bounds(0, 1),
        constraints=LinearConstraint(model.rows, model.lower, model.upper),
        options={"time_limit": max(0.1, deadline - time.monotonic()), "mip_rel_gap": gap, "disp": False},
    )
    if result.x is None:
        return Answer(None, False, None)
    x = np.where(model.integral, np.round(result.x), result.x)
    return Answer(x, result.status == 0, getattr(result, "mip_gap", None))


def solve_cbc(model: GraphModel, objective: np.ndarray, deadline: float) -> Answer:
    """CBC (bundled with PuLP), to zero relative gap; the gap at a time limit is to the LP bound."""
    import pulp

    lp = pulp.LpProblem("activation_checkpointing", pulp.LpMinimize)
    x = [pulp.LpVariable(f"x{k}", 0, 1, cat="Integer" if integral else "Continuous")
         for k, integral in enumerate(model.integral)]
    lp.setObjective(pulp.LpAffineExpression([(x[k], float(c)) for k, c in enumerate(objective) if c]))
    for r, (cols, coefs, lower, upper) in enumerate(model.constraints()):
        if r % 4096 == 0 and time.monotonic() > deadline:
            return Answer(None, False, None)  # PuLP builds about 15 µs per nonzero: stop at the limit
        terms = [(x[k], float(c)) for k, c in zip(cols, coefs)]
        for sense, rhs in ((pulp.LpConstraintGE, lower), (pulp.LpConstraintLE, upper)):
            if rhs is not None:
                lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), sense, rhs=rhs))
    limit = max(1, int(deadline - time.monotonic()))
    lp.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=limit, threads=1, gapRel=0.0))
    if lp.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return Answer(None, False, None)
    values = np.array([v.varValue or 0.0 for v in x])
    values = np.where(model.integral, np.round(values), values)
    optimal = lp.sol_status == pulp.LpSolutionOptimal
    return Answer(values, optimal, None if optimal else relative_gap(float(objective @ values), lp_bound(model, objective)))


def lp_bound(model: GraphModel, objective: np.ndarray) -> float | None:
    """Optimum of the LP relaxation: no 0/1 plan does better."""
    rows = model.rows
    finite_lo, finite_hi = np.isfinite(model.lower), np.isfinite(model.upper)
    a_ub = sp.vstack([-rows[finite_lo], rows[finite_hi]], format="csr")
    b_ub = np.concatenate([-model.lower[finite_lo], model.upper[finite_hi]])
    result = linprog(objective, A_ub=a_ub, b_ub=b_ub, bounds=(0, 1), method="highs")
    return float(result.fun) if result.status == 0 else None


BACKENDS = {"highs": solve_highs, "cbc": solve_cbc}
