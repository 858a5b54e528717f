"""Solvers: choose which activations to save under a memory budget.

Every solver has the same interface, :meth:`Solver.solve(problem, budget_bytes) -> Decision`,
so they can be swapped by name::

    >>> from solvers import get_solver, available_solvers
    >>> available_solvers()
    ['dp', 'greedy', 'ilp']
    >>> get_solver("greedy").name
    'greedy'
"""
from __future__ import annotations

from planner.errors import UnknownNameError
from solvers.base import Solution, Solver
from solvers.greedy import GreedySolver
from solvers.ilp import ILPSolver
from solvers.knapsack_dp import DPSolver

__all__ = ["Solver", "Solution", "get_solver", "available_solvers", "register_solver"]

_REGISTRY: dict[str, type[Solver]] = {cls.name: cls for cls in (GreedySolver, DPSolver, ILPSolver)}


def available_solvers() -> list[str]:
    """Names accepted by :func:`get_solver`, sorted."""
    return sorted(_REGISTRY)


def get_solver(name: str, **options) -> Solver:
    """A new solver by name; ``options`` go to its constructor (e.g. ``time_limit``).

    Raises
    ------
    UnknownNameError
        If no solver has that name; the message lists the available ones.
    """
    try:
        cls = _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownNameError("solver", str(name), available_solvers()) from None
    return cls(**options)


def register_solver(cls: type[Solver]) -> type[Solver]:
    """Add a solver class to the registry under ``cls.name`` (usable as a decorator)."""
    _REGISTRY[cls.name] = cls
    return cls
