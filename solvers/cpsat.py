"""The graph model of :mod:`solvers.graph_model` solved by OR-Tools CP-SAT, multi-threaded."""
from __future__ import annotations

import math
import os

import numpy as np
from ortools.sat.python import cp_model

from planner.errors import SolverError
from planner.problem import Evaluation, Problem
from solvers.base import Solution, Solver
from solvers.clock import now, passed, solve_cpsat
from solvers.graph_model import GraphModel
from solvers.backends import Answer
from solvers.ilp import solve_from_start
from solvers.peak_rows import Limit

__all__ = ["CPSATSolver", "run_cpsat"]

# CP-SAT needs integer weights: the objective of the ilp solver, times this, rounded.
OBJECTIVE_SCALE = 1e8


class CPSATSolver(Solver):
    """Constraint programming with clause learning (CP-SAT), started from the best heuristic plan.

    Same objective as ``ilp`` (recompute plus save seconds, memory as a tie-break), in integers:
    each variable's weight is rounded to 1e-8 of the costliest one's. ``gap`` is CP-SAT's
    relative distance between the plan and its proven bound.

    Parameters
    ----------
    time_limit : seconds; at the limit the best plan found is returned with its gap.
    workers : parallel search workers (default: 8, or every core if more). CP-SAT runs a
        portfolio of different strategies, one per worker; the LP-based ones that close this
        model quickly only start from 8 workers, so 8 pays off even on a 2-core machine.
    """

    name = "cpsat"
    exact = True

    def __init__(self, time_limit: float = 60.0, workers: int | None = None) -> None:
        super().__init__(time_limit)
        self.workers = max(8, os.cpu_count() or 1) if workers is None else self._positive_int("workers", workers)

    def _solve(
        self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float,
        starts: dict[str, Evaluation] | None = None,
    ) -> Solution:
        solution = solve_from_start(problem, budget_bytes, frugal, deadline,
                                    lambda model, objective, start, until: run_cpsat(model, objective, start, until,
                                                                                     self.workers, may_be_infeasible=True),
                                    starts)
        solution.stats["workers"] = self.workers
        return solution

    def offload_backend(self, deadline: float):
        return lambda model, objective, vector: run_cpsat(model, objective, vector, deadline, self.workers,
                                                          may_be_infeasible=True)


def run_cpsat(model: GraphModel, objective: np.ndarray | None, hint: np.ndarray, deadline: float, workers: int,
              peak: Limit | None = None, may_be_infeasible: bool = False) -> Answer:
    """Solve one graph model with CP-SAT, hinted with a plan's vector on the model
    (:meth:`GraphModel.vector`).

    With ``peak`` (a limit with a column), that column becomes a whole number of bytes and is
    the objective; otherwise ``objective`` is scaled to integers. A program proven infeasible
    is a bug in the model unless ``may_be_infeasible``: then the answer says so. The exact
    solvers' restricted programs (blocks tied, patterns chosen) and offloading programs below the
    least peak may be (:func:`solvers.backends.within_peak` tells a restricted program from the
    full one).
    """
    built = _to_cp_model(model, peak, deadline)
    if built is None or passed(deadline):
        return Answer(None, False)  # the time limit passed while building
    cp, x, peak_bytes = built
    if peak_bytes is not None:
        cp.Minimize(peak_bytes)
    else:
        weights = np.rint(objective * OBJECTIVE_SCALE).astype(np.int64)
        used = np.flatnonzero(weights)
        cp.Minimize(cp_model.LinearExpr.WeightedSum([x[k] for k in used], [int(w) for w in weights[used]]))
    hinted = np.flatnonzero(model.integral)
    hints = cp.proto.solution_hint
    hints.vars.extend([x[k].Index() for k in hinted])
    hints.values.extend([int(v) for v in hint[hinted]])
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.relative_gap_limit = 0.0
    status = solve_cpsat(solver, cp, deadline - now())
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.INFEASIBLE and may_be_infeasible:
            return Answer(None, False, infeasible=True)
        if status == cp_model.INFEASIBLE:
            raise SolverError("cpsat proved the memory rows infeasible; this is a bug in the model, please report it")
        return Answer(None, False)
    values = np.array([solver.Value(v) for v in x], dtype=float)
    if peak_bytes is not None:
        values[peak.col] = solver.Value(peak_bytes) / peak.span
        bound = None  # in bytes, not in the objective's units
    else:
        # Rounding the weights moves it by at most 0.5e-8 per variable set, far inside the
        # tie-break's 1e-4 that graph_model.seconds_bound takes off.
        bound = solver.BestObjectiveBound() / OBJECTIVE_SCALE
    return Answer(values, status == cp_model.OPTIMAL, bound)


def _to_cp_model(model: GraphModel, peak: Limit | None = None,
                 deadline: float = math.inf) -> tuple[cp_model.CpModel, list, object] | None:
    """One Boolean per variable (continuous ones are pinned to 0/1 by their rows); each row as a
    linear constraint, memory rows scaled back to whole bytes. A peak column becomes a
    whole number of bytes in ``[0, span]``, returned third (None without one). None if the
    deadline passes while building.

    The rows are written into the model's proto directly, one constraint with both bounds per
    row: building them as CP-SAT linear expressions took about 11 s of a DenseNet-121 plan at
    budget 0 on a 2-core CPU, and each row's terms are whole numbers already. The terms are
    scaled and rounded for all rows at once (numpy), each row then handed its slice: per term in
    Python, a model of the built-in GPT at budget 0 (127 thousand rows, 45 thousand variables)
    took 1.6 s to build, 0.7 s so (2-core CPU); the time counts against the solver's limit."""
    cp = cp_model.CpModel()
    x = [cp.NewBoolVar(f"x{k}") for k in range(model.num_vars)]
    peak_bytes = None
    if peak is not None:
        peak_bytes = cp.NewIntVar(0, int(math.ceil(peak.span)), "peak_bytes")
        x[peak.col] = peak_bytes
    index = np.array([v.Index() for v in x], dtype=np.int64)
    rows = model.rows
    if not rows.has_canonical_format:  # each column once per row, in order
        rows = rows.copy()
        rows.sum_duplicates()
    unit = np.asarray(model.row_unit, dtype=float)
    data = rows.data * np.repeat(unit, np.diff(rows.indptr))
    if peak is not None:
        data = np.where(rows.indices == peak.col, data / peak.span, data)
    weights = np.rint(data).astype(np.int64)
    used = weights != 0
    starts = np.concatenate(([0], np.cumsum(used)))[rows.indptr].tolist()
    variables, coefficients = index[rows.indices[used]].tolist(), weights[used].tolist()
    lower, upper = np.asarray(model.lower, dtype=float) * unit, np.asarray(model.upper, dtype=float) * unit
    lows = [math.ceil(v - 1e-6) if math.isfinite(v) else cp_model.INT_MIN for v in lower.tolist()]
    highs = [math.floor(v + 1e-6) if math.isfinite(v) else cp_model.INT_MAX for v in upper.tolist()]
    add = cp.proto.constraints.add
    for r, (a, b, low, high) in enumerate(zip(starts, starts[1:], lows, highs)):
        if not r & 4095 and passed(deadline):
            return None
        linear = add().linear
        linear.vars.extend(variables[a:b])
        linear.coeffs.extend(coefficients[a:b])
        linear.domain.extend((low, high))
    return cp, x, peak_bytes
