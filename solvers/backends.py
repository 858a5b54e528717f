"""The back ends an exact program of the graph model is solved by (HiGHS, CBC), what they
answer, and the loop that solves such a program under a peak budget from a starting plan.

Below every exact method (:mod:`solvers.rounding`, :mod:`solvers.ilp`, :mod:`solvers.cpsat`,
:mod:`solvers.frugal`), above the model (:mod:`solvers.graph_model`, :mod:`solvers.peak_rows`):
it imports none of the methods.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from planner.decision import Status
from planner.errors import SolverError
from planner.problem import Evaluation, Problem, evaluate
from solvers.base import Solution, relative_gap
from solvers.graph_model import GraphModel, build_graph_model, seconds_bound, tie_broken_objective
from solvers.peak_rows import Round, Steps, solve_within_peak

__all__ = ["Answer", "BACKENDS", "CUTOFF_SLACK", "lp_bound", "solve_cbc", "solve_highs", "to_round", "within_peak"]

CUTOFF_SLACK = 1e-9  # the cutoff row admits the starting plan itself, whatever HiGHS's rounding


@dataclass
class Answer:
    """A back end's answer: the solution vector (None if none found), whether it is proven
    optimal, the objective no solution of the program beats (None if none proven), and
    whether the program was proven to have no solution."""

    x: np.ndarray | None
    optimal: bool
    bound: float | None = None
    infeasible: bool = False


def within_peak(problem: Problem, budget_bytes: int, start: Evaluation, deadline: float, run,
                restrict=None, steps: Steps | None = None, bound: float = 0.0) -> Solution:
    """The least-runtime plan whose peak fits, by :func:`solvers.peak_rows.solve_within_peak`.

    ``run(model, objective, start)`` solves one program and returns an :class:`Answer`;
    ``start`` is the vector of ``start``, a plan within the budget (:func:`heuristic_start`'s):
    if the time limit passes before a faster plan within the budget is found, it is returned
    with status ``feasible``, and ``stats`` says so. A plan that is not proven optimal gets its
    gap to the best bound any round proved (each round relaxes the full program, so its bound
    holds) or ``bound``, seconds known beforehand to be a bound, whichever is higher.
    ``restrict(build, base)`` adds rows that restrict the program (:func:`tie_blocks`); the
    status and gap are then of that program only. A restricted program proven infeasible returns
    the start (it may exclude every plan within the budget); the full program, whose rows count
    the start as its profile does, proven infeasible raises :class:`SolverError`, a bug in the
    model. ``steps`` (:class:`solvers.peak_rows.Steps`) carries the memory rows' steps from one
    call to the next.
    """
    base, build = build_graph_model(problem)
    if restrict is not None:
        restrict(build, base)
    objective = tie_broken_objective(base)
    bounds = [bound]
    infeasible = []

    def solve(model, limit):
        padded = np.pad(objective, (0, model.num_vars - len(objective)))
        answer = run(model, padded, model.vector(start.saved, start.recomputed))
        if answer.bound is not None:
            bounds.append(seconds_bound(answer.bound, base))
        if answer.infeasible:
            infeasible.append(True)
        return to_round(problem, model, answer)

    result, stats = solve_within_peak(problem, base, build, solve, deadline, limit_bytes=budget_bytes, steps=steps)
    stats["start_seconds"] = start.seconds
    if result.plan is not None and result.optimal and result.plan.peak_bytes <= budget_bytes:
        return Solution(result.plan.saved, Status.OPTIMAL, 0.0, stats)
    if infeasible and result.plan is None and restrict is not None:
        # the restriction (blocks tied, patterns chosen) may exclude every plan within the budget
        stats["answer"] = "the starting plan: the restricted program admits no plan within the budget"
        found = start
    elif infeasible and result.plan is None:  # the rows count the start as its profile does
        raise SolverError(f"the memory rows were proven infeasible at {budget_bytes} bytes, which the starting "
                          f"plan meets ({start.peak_bytes} bytes); this is a bug in the model, please report it")
    elif result.plan is None or result.plan.peak_bytes > budget_bytes or result.plan.seconds > start.seconds:
        stats["answer"] = "the starting plan: the time limit passed before a faster plan within the budget was found"
        found = start
    else:
        found = result.plan
    return Solution(found.saved, Status.FEASIBLE, relative_gap(found.seconds, max(bounds)), stats)


def to_round(problem: Problem, model: GraphModel, answer: "Answer") -> Round:
    plan = evaluate(problem, model.saved_mask(answer.x)) if answer.x is not None else None
    return Round(plan, answer.x, answer.optimal)


def solve_highs(model: GraphModel, objective: np.ndarray, deadline: float, gap: float = 0.0,
                cutoff: float | None = None) -> Answer:
    """HiGHS branch-and-cut through ``scipy.optimize.milp``, to relative gap ``gap`` (optimal
    means within it). With ``cutoff``, a row keeps the objective at most that (plus
    ``CUTOFF_SLACK``): HiGHS prunes every branch whose bound passes it, as a known plan of that
    value would let it (scipy passes it no starting solution)."""
    rows, lower, upper = model.rows, model.lower, model.upper
    if cutoff is not None:
        rows = sp.vstack([rows, sp.csr_matrix(objective)], format="csr")
        lower, upper = np.append(lower, -np.inf), np.append(upper, cutoff * (1 + CUTOFF_SLACK) + CUTOFF_SLACK)
    result = milp(
        objective,
        integrality=model.integral.astype(int),
        bounds=Bounds(0, 1),
        constraints=LinearConstraint(rows, lower, upper),
        options={"time_limit": max(0.1, deadline - time.monotonic()), "mip_rel_gap": gap, "disp": False},
    )
    bound = getattr(result, "mip_dual_bound", None)
    if not model.integral.any() and result.status == 0:
        bound = float(result.fun)  # a linear program: its optimum
    if result.x is None:
        return Answer(None, False, bound, infeasible=result.status == 2)
    x = np.where(model.integral, np.round(result.x), result.x)
    return Answer(x, result.status == 0, bound)


def solve_cbc(model: GraphModel, objective: np.ndarray, deadline: float) -> Answer:
    """CBC (bundled with PuLP), to zero relative gap; the gap at a time limit is to the LP bound."""
    import pulp

    began = time.monotonic()
    lp = pulp.LpProblem("activation_checkpointing", pulp.LpMinimize)
    x = [pulp.LpVariable(f"x{k}", 0, 1, cat="Integer" if integral else "Continuous")
         for k, integral in enumerate(model.integral)]
    lp.setObjective(pulp.LpAffineExpression([(x[k], float(c)) for k, c in enumerate(objective) if c]))
    for r, (cols, coefs, lower, upper) in enumerate(model.constraints()):
        if r % 4096 == 0 and time.monotonic() > deadline:
            return Answer(None, False)  # PuLP builds about 15 µs per nonzero: stop at the limit
        terms = [(x[k], float(c)) for k, c in zip(cols, coefs)]
        for sense, rhs in ((pulp.LpConstraintGE, lower), (pulp.LpConstraintLE, upper)):
            if rhs is not None:
                lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), sense, rhs=rhs))
    # PuLP writes the program to a file for CBC, which reads it: about as long again as building
    # it, kept out of CBC's whole seconds. CBC itself can run past its limit (by 3-7 s on the
    # 48-layer programs); stopping it sooner would mean killing it and losing its plan.
    now = time.monotonic()
    limit = int(deadline - now - (now - began))
    if limit < 1:
        return Answer(None, False)
    lp.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=limit, threads=1, gapRel=0.0))
    if lp.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return Answer(None, False)
    values = np.array([v.varValue or 0.0 for v in x])
    values = np.where(model.integral, np.round(values), values)
    optimal = lp.sol_status == pulp.LpSolutionOptimal
    if optimal:
        bound = float(objective @ values)
    else:  # the relaxation of these rows, unless the limit has passed (the start's bound stands)
        bound = lp_bound(model, objective, deadline) if time.monotonic() < deadline else None
    return Answer(values, optimal, bound)


def lp_bound(model: GraphModel, objective: np.ndarray, deadline: float) -> float | None:
    """Optimum of the LP relaxation (HiGHS, until ``deadline``): no 0/1 plan does better."""
    return solve_highs(model.relaxed(), objective, deadline).bound


BACKENDS = {"highs": solve_highs, "cbc": solve_cbc}
