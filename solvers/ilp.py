"""Exact integer program on the graph: save or recompute each node, minimise recompute time.

Unlike a knapsack, the model knows that recomputing a node needs its inputs, saved or
recomputed themselves, so chains of recomputation are priced exactly.
"""
from __future__ import annotations

import time

import numpy as np
import pulp

from planner.decision import Status
from planner.errors import SolverError
from planner.problem import Evaluation, Problem
from solvers.base import Solution, Solver

__all__ = ["ILPSolver"]


class ILPSolver(Solver):
    """Mixed-integer program solved by CBC (bundled with PuLP), in two phases.

    Phase 1 minimises the recompute seconds under the budget; phase 2 keeps that optimum and
    minimises memory, so that plans never use more memory than they need (and memory falls with
    the budget). Runtimes are scaled to microseconds for the solver's tolerances.

    Complexity: NP-hard in general; graphs of a few thousand nodes solve in seconds.
    """

    name = "ilp"

    def _solve(self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation) -> Solution:
        deadline = time.monotonic() + self.time_limit
        model, saved, recomputed, runtime, memory = build_model(problem, budget_bytes)
        model.setObjective(runtime)
        _run(model, deadline)
        mask = _mask(problem, model, saved)
        if mask is None:
            raise SolverError(
                f"ilp: CBC found no feasible plan within its time limit of {self.time_limit:g} s "
                f"(status {pulp.LpStatus[model.status]}); raise time_limit"
            )
        optimal = model.sol_status == pulp.LpSolutionOptimal
        gap = 0.0 if optimal else _gap(model)
        if optimal:
            best = pulp.value(runtime) or 0.0
            model += runtime <= best + 1e-6 * max(1.0, abs(best)), "keep_optimal_runtime"
            model.setObjective(memory)
            _run(model, deadline)
            mask = _mask(problem, model, saved) if model.sol_status in _HAS_SOLUTION else mask
        return Solution(mask, Status.OPTIMAL if optimal else Status.FEASIBLE, gap, {"variables": len(model.variables())})


_HAS_SOLUTION = (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)


def build_model(problem: Problem, budget_bytes: int):
    """The integer program; returns (model, saved vars, recomputed vars, runtime expr, memory expr)."""
    model = pulp.LpProblem("activation_checkpointing", pulp.LpMinimize)
    relevant = _ancestors_of_needed(problem)
    saved = {i: pulp.LpVariable(f"saved_{i}", cat="Binary") for i in relevant if problem.saveable[i]}
    recomputed = {i: pulp.LpVariable(f"recomputed_{i}", cat="Binary") for i in relevant if problem.recomputable[i]}

    def available(i: int):
        return pulp.lpSum(v[i] for v in (saved, recomputed) if i in v)

    for i in relevant:
        if problem.needed[i]:
            # Every value the backward reads is saved or recomputed.
            model += available(i) >= 1, f"needed_{i}"
        if i in recomputed:
            for j in problem.inputs[i]:
                # Recomputing a node needs each of its inputs, saved or recomputed.
                model += recomputed[i] <= available(int(j)), f"input_{j}_of_{i}"
    memory = pulp.lpSum(int(problem.nbytes[i]) * v for i, v in saved.items()) + pulp.lpSum(
        problem.rng_state_bytes * v for i, v in recomputed.items() if problem.random[i]
    )
    # The saved bytes, plus one RNG state per recomputed random op, fit the budget.
    model += memory <= budget_bytes, "budget"
    runtime = pulp.lpSum(float(problem.runtime[i]) * 1e6 * v for i, v in recomputed.items() if problem.runtime[i] > 0)
    return model, saved, recomputed, runtime, memory


def _ancestors_of_needed(problem: Problem) -> list[int]:
    seen = np.zeros(len(problem), dtype=bool)
    stack = list(np.flatnonzero(problem.needed))
    while stack:
        i = stack.pop()
        if not seen[i]:
            seen[i] = True
            stack.extend(problem.inputs[i])
    return [int(i) for i in np.flatnonzero(seen)]


def _run(model: pulp.LpProblem, deadline: float) -> None:
    remaining = max(1, int(deadline - time.monotonic()))
    model.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=remaining, threads=1))


def _mask(problem: Problem, model: pulp.LpProblem, saved: dict) -> np.ndarray | None:
    if model.sol_status not in _HAS_SOLUTION:
        return None
    mask = np.zeros(len(problem), dtype=bool)
    for i, var in saved.items():
        if var.varValue is None:
            return None
        mask[i] = var.varValue > 0.5
    return mask


def _gap(model: pulp.LpProblem) -> float | None:
    """Relative gap to the LP relaxation's bound, for a plan stopped at the time limit."""
    relaxed = model.deepcopy()
    for var in relaxed.variables():
        var.cat = pulp.LpContinuous
    relaxed.solve(pulp.PULP_CBC_CMD(msg=False))
    bound, found = pulp.value(relaxed.objective), pulp.value(model.objective)
    if bound is None or found is None or found <= 0:
        return None
    return max(0.0, (found - bound) / found)
