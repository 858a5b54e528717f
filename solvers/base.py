"""The interface every solver implements, and the checks they all share."""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from planner.bounds import min_memory_plan, runtime_optimal_plan
from planner.decision import Decision, Status
from planner.errors import ConfigError, InfeasibleBudget, SolverError
from planner.problem import Evaluation, Problem, evaluate

__all__ = ["Solver", "Solution", "relative_gap"]


def relative_gap(found: float, bound: float | None) -> float | None:
    """``(found - bound) / found``, at least 0; None when there is no bound or nothing to divide by."""
    if bound is None or found <= 0:
        return None
    return max(0.0, (found - bound) / found)


@dataclass
class Solution:
    """What a solver's core returns: a saved mask, how sure it is, and its own figures."""

    saved: np.ndarray
    status: str
    gap: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)


class Solver(ABC):
    """Chooses the saved set of a :class:`Problem` under a memory budget in bytes.

    Subclasses implement :meth:`_solve` for budgets strictly between the most frugal and the
    runtime-optimal plan; :meth:`solve` handles both ends, the budget checks, timing and the
    evaluation of the answer, so every solver reports its figures the same way.

    Parameters
    ----------
    time_limit : seconds the solver may run before returning its best plan so far.
    """

    name: ClassVar[str]

    def __init__(self, time_limit: float = 60.0) -> None:
        if not time_limit > 0:
            raise ConfigError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
        self.time_limit = float(time_limit)

    def _positive_int(self, option: str, value: object) -> int:
        """``value`` if it is a positive int, else a ConfigError naming the solver and option."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{self.name} {option} must be a positive int, got {value!r}")
        return value

    def solve(self, problem: Problem, budget_bytes: int) -> Decision:
        """Return a feasible decision whose memory is at most ``budget_bytes``.

        Raises
        ------
        InfeasibleBudget
            If the budget is below the most frugal plan's memory; it carries that memory.
        SolverError
            If the back end fails to produce a plan within the budget.
        """
        start = time.perf_counter()
        deadline = time.monotonic() + self.time_limit  # the limit covers the whole solve
        frugal = min_memory_plan(problem)
        if budget_bytes < frugal.memory_bytes:
            raise InfeasibleBudget(budget_bytes, frugal.memory_bytes)
        fast = runtime_optimal_plan(problem)
        if budget_bytes >= fast.memory_bytes:
            status = Status.OPTIMAL if fast.recompute_seconds == 0 else Status.HEURISTIC
            solution = Solution(fast.saved, status, 0.0 if status == Status.OPTIMAL else None)
        else:
            solution = self._solve(problem, int(budget_bytes), frugal, fast, deadline)
        result = evaluate(problem, solution.saved)
        if result.memory_bytes > budget_bytes:
            raise SolverError(
                f"solver {self.name} returned a plan of {result.memory_bytes} bytes over the budget of "
                f"{budget_bytes} bytes; this is a bug in the solver, please report it"
            )
        return Decision(
            saved=tuple(problem.names[i] for i in np.flatnonzero(result.saved)),
            solver=self.name,
            budget_bytes=int(budget_bytes),
            memory_bytes=result.memory_bytes,
            recompute_seconds=result.recompute_seconds,
            status=solution.status,
            gap=solution.gap,
            solve_seconds=time.perf_counter() - start,
            stats=solution.stats,
        )

    @abstractmethod
    def _solve(
        self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float
    ) -> Solution:
        """Solve for a budget with ``frugal.memory_bytes <= budget_bytes < fast.memory_bytes``.

        ``deadline`` is a ``time.monotonic()`` instant: return the best plan found by then.
        """
