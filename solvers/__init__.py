"""Solvers: choose which activations to save under a memory budget.

Every solver has the same interface, :meth:`Solver.solve(problem, budget_bytes) -> Decision`,
so they can be swapped by name::

    >>> from solvers import get_solver, available_solvers
    >>> available_solvers()
    ['cpsat', 'dp', 'greedy', 'ilp', 'mincut']
    >>> get_solver("greedy").name
    'greedy'
"""
from __future__ import annotations

from planner.registry import Registry
from solvers.base import Solution, Solver
from solvers.cpsat import CPSATSolver
from solvers.greedy import GreedySolver
from solvers.ilp import ILPSolver
from solvers.knapsack_dp import DPSolver
from solvers.mincut import MinCutSolver

__all__ = ["Solver", "Solution", "get_solver", "available_solvers", "register_solver"]

REGISTRY: Registry[Solver] = Registry("solver", (GreedySolver, DPSolver, MinCutSolver, ILPSolver, CPSATSolver))
available_solvers = REGISTRY.names
get_solver = REGISTRY.create
register_solver = REGISTRY.register
