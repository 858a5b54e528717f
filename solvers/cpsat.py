"""The graph model of :mod:`solvers.graph_model` solved by OR-Tools CP-SAT, multi-threaded."""
from __future__ import annotations

import os
import time

import numpy as np
from ortools.sat.python import cp_model

from planner.decision import Status
from planner.errors import SolverError
from planner.problem import Evaluation, Problem
from solvers.base import Solution, Solver, relative_gap
from solvers.graph_model import GraphModel, build_graph_model, tie_broken_objective

__all__ = ["CPSATSolver"]

# CP-SAT needs integer weights: the objective of the ilp solver, times this, rounded.
OBJECTIVE_SCALE = 1e8


class CPSATSolver(Solver):
    """Constraint programming with clause learning (CP-SAT), started from the most frugal plan.

    Same objective as ``ilp`` (recompute runtime, memory as a tie-break), in integers: each
    node's weight is rounded to 1e-8 of the costliest node's runtime. ``gap`` is CP-SAT's
    relative distance between the plan and its proven bound.

    Parameters
    ----------
    time_limit : seconds; at the limit the best plan found is returned with its gap.
    workers : parallel search workers (default: 8, or every core if more). CP-SAT runs a
        portfolio of different strategies, one per worker; the LP-based ones that close this
        model quickly only start from 8 workers, so 8 pays off even on a 2-core machine.
    """

    name = "cpsat"

    def __init__(self, time_limit: float = 60.0, workers: int | None = None) -> None:
        super().__init__(time_limit)
        self.workers = max(8, os.cpu_count() or 1) if workers is None else self._positive_int("workers", workers)

    def _solve(
        self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float
    ) -> Solution:
        model = build_graph_model(problem, budget_bytes)
        cp, x = _to_cp_model(model)
        cp.Minimize(sum(int(w) * x[k] for k, w in enumerate(_integer_weights(model)) if w))
        for k, value in enumerate(model.vector(frugal.saved, frugal.recomputed)):
            cp.AddHint(x[k], int(value))
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.1, deadline - time.monotonic())
        solver.parameters.num_workers = self.workers
        solver.parameters.relative_gap_limit = 0.0
        status = solver.Solve(cp)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            raise SolverError(
                f"cpsat found no feasible plan within its time limit of {self.time_limit:g} s "
                f"(status {solver.StatusName(status)}); raise time_limit"
            )
        values = np.array([solver.Value(v) for v in x], dtype=float)
        optimal = status == cp_model.OPTIMAL
        gap = 0.0 if optimal else relative_gap(solver.ObjectiveValue(), solver.BestObjectiveBound())
        stats = {"workers": self.workers, "variables": model.num_vars, "branches": solver.NumBranches()}
        return Solution(model.saved_mask(values), Status.OPTIMAL if optimal else Status.FEASIBLE, gap, stats)


def _integer_weights(model: GraphModel) -> np.ndarray:
    return np.rint(tie_broken_objective(model) * OBJECTIVE_SCALE).astype(np.int64)


def _to_cp_model(model: GraphModel) -> tuple[cp_model.CpModel, list]:
    """One Boolean per variable; each row as a linear constraint with integer coefficients."""
    cp = cp_model.CpModel()
    x = [cp.NewBoolVar(f"x{k}") for k in range(model.num_vars)]
    for cols, coefs, lower, upper in model.constraints():
        expr = sum(int(c) * x[k] for k, c in zip(cols, coefs))
        if lower is not None:
            cp.Add(expr >= int(lower))
        if upper is not None:
            cp.Add(expr <= int(upper))
    return cp, x
