"""The interface every solver implements, and the checks they all share."""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from planner.bounds import SECONDS_UNIT, fast_end_plan, runtime_optimal_plan
from planner.decision import Decision, Status
from planner.errors import ConfigError, InfeasibleBudget, SolverError
from planner.problem import Evaluation, Problem, evaluate
from solvers.polish import polish
from solvers.reference import reference_plan

__all__ = ["Solver", "CapacitySolver", "Solution", "relative_gap"]


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
    """Chooses the saved set of a :class:`Problem` under a peak-memory budget in bytes.

    The budget bounds the plan's peak memory over the step (:func:`planner.problem.memory_profile`).
    Subclasses implement :meth:`_solve` for budgets strictly between the peaks of the most
    frugal and the runtime-optimal plan; :meth:`solve` handles both ends, the budget checks,
    timing and the evaluation of the answer, so every solver reports its figures the same way.

    Parameters
    ----------
    time_limit : seconds the solver may run before returning its best plan so far.
    """

    name: ClassVar[str]
    # Whether the solver bounds its plans' peak exactly (memory rows), so that it can use the
    # exact least-peak plan: budget 0 with it runs the exact search (planner.solve.solve_graph).
    exact: ClassVar[bool] = False

    def __init__(self, time_limit: float = 60.0) -> None:
        if not time_limit > 0:
            raise ConfigError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
        self.time_limit = float(time_limit)

    def _positive_int(self, option: str, value: object) -> int:
        """``value`` if it is a positive int, else a ConfigError naming the solver and option."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{self.name} {option} must be a positive int, got {value!r}")
        return value

    def solve(self, problem: Problem, budget_bytes: int, frugal: Evaluation | None = None,
              frugal_proven: bool = False, starts: dict[str, Evaluation] | None = None) -> Decision:
        """Return a feasible decision whose peak memory is at most ``budget_bytes``.

        ``frugal`` is the lowest-peak plan known, the search's floor: by default the frugal
        reference (:func:`solvers.reference.reference_plan`, fast and deterministic), or the fast
        end (:func:`planner.bounds.fast_end_plan`) where that holds less; the
        exact least-peak plan (:func:`solvers.frugal.min_peak_plan`) where the caller ran that
        search, with ``frugal_proven`` when it proved no plan lies below. ``starts`` names other
        plans the caller knows (PyTorch's own split): the exact solvers start from the fastest
        plan within the budget among them and their own heuristics, and ``stats["start"]`` says
        which; the heuristic solvers do not look at them.

        Raises
        ------
        InfeasibleBudget
            If the budget is below ``frugal``'s peak; it carries that peak.
        SolverError
            If the back end fails to produce a plan within the budget.
        """
        start = time.perf_counter()
        deadline = time.monotonic() + self.time_limit  # the limit covers the whole solve
        # an exact solver leaves a share of it to polishing an unproven answer
        search_deadline = deadline - (POLISH_SHARE * self.time_limit if self.exact else 0.0)
        fast = runtime_optimal_plan(problem)
        if budget_bytes >= fast.peak_bytes:  # no frugal plan needed: the fastest plan fits
            solution = Solution(fast.saved, *_fast_status(problem, fast))
        else:
            frugal = reference_plan(problem) if frugal is None else frugal
            end = fast_end_plan(problem)
            if end.peak_bytes < frugal.peak_bytes:
                # the fast end (budget 1.0) is a plan too: with save costs it holds fewer bytes
                # than the fastest, and on a small graph its peak may lie below the reference's
                # (on an H200, a graph of GPT-2 by less than 0.01 MiB: budget 1.0 raised)
                frugal, frugal_proven = end, False
            if budget_bytes < frugal.peak_bytes:
                raise InfeasibleBudget(budget_bytes, frugal.peak_bytes, proven=frugal_proven)
            solution = self._solve(problem, int(budget_bytes), frugal, fast, search_deadline, starts=starts)
        result = evaluate(problem, solution.saved)
        if self.exact and solution.status != Status.OPTIMAL and result.peak_bytes <= budget_bytes:
            # the sweeps get their share even where the search ran over its own part
            polish_deadline = max(deadline, time.monotonic() + POLISH_SHARE * self.time_limit)
            solution, result = _polished(problem, solution, result, budget_bytes, polish_deadline)
        if result.peak_bytes > budget_bytes:
            raise SolverError(
                f"solver {self.name} returned a plan of peak {result.peak_bytes} bytes over the budget of "
                f"{budget_bytes} bytes; this is a bug in the solver, please report it"
            )
        return Decision(
            saved=tuple(problem.names[i] for i in np.flatnonzero(result.saved)),
            solver=self.name,
            budget_bytes=int(budget_bytes),
            memory_bytes=result.memory_bytes,
            peak_bytes=result.peak_bytes,
            recompute_seconds=result.recompute_seconds,
            status=solution.status,
            gap=solution.gap,
            solve_seconds=time.perf_counter() - start,
            stats=solution.stats,
            save_seconds=result.save_seconds,
        )

    def offload_backend(self, deadline: float):
        """How the solver solves one program of the offload model (:mod:`solvers.offload`):
        ``run(model, objective, vector)`` returning a :class:`solvers.backends.Answer` by
        ``deadline``, or None for a solver that does not weigh offloading."""
        return None

    @abstractmethod
    def _solve(
        self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float,
        starts: dict[str, Evaluation] | None = None,
    ) -> Solution:
        """Solve for a budget with ``frugal.peak_bytes <= budget_bytes < fast.peak_bytes``.

        ``frugal`` is the least-peak plan, ``fast`` the runtime-optimal one. ``deadline`` is a
        ``time.monotonic()`` instant: return the best plan found by then. ``starts``: named
        plans the caller knows, which an exact solver may start from (:meth:`solve`).
        """


class CapacitySolver(Solver):
    """A solver whose plans are chosen under a capacity of saved bytes (a knapsack).

    The peak budget is met by searching the capacity between the frugal plan's saved bytes
    (whose plan fits by construction) and the runtime-optimal plan's: bisection on "the plan
    at this capacity fits the peak budget". Peak memory is not always monotone in the
    capacity, so the fastest fitting plan seen is kept, and ``stats`` records the search.
    """

    def _solve(
        self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float,
        starts: dict[str, Evaluation] | None = None,  # a heuristic: not read
    ) -> Solution:
        lo, hi = frugal.memory_bytes, fast.memory_bytes
        best, best_plan, tries = Solution(frugal.saved, Status.HEURISTIC), frugal, 0
        while hi - lo > max(1, (fast.memory_bytes - frugal.memory_bytes) >> 12) and tries < 24:
            if time.monotonic() > deadline:
                break
            mid = (lo + hi) // 2
            candidate = self._solve_capacity(problem, mid, frugal, fast, deadline)
            plan = evaluate(problem, candidate.saved)
            tries += 1
            if plan.peak_bytes <= budget_bytes:
                lo = mid
                if plan.seconds < best_plan.seconds:
                    best, best_plan = candidate, plan
            else:
                hi = mid
        best.stats.update({"capacity_bytes": int(lo), "capacity_tries": tries})
        return best

    @abstractmethod
    def _solve_capacity(
        self, problem: Problem, capacity_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float
    ) -> Solution:
        """A plan whose saved bytes (RNG states included) are at most ``capacity_bytes``."""


# The share of an exact solver's time limit kept for polishing an answer it could not prove
# (solvers.polish), and the least time the sweeps get where the search ran over its own part:
# on the zoo's Llama at budget 0 they took 0.8 s of an 18 s solve.
POLISH_SHARE = 0.1


def _polished(problem: Problem, solution: Solution, result: Evaluation, budget_bytes: int,
              deadline: float) -> tuple[Solution, Evaluation]:
    """The unproven ``solution`` (``result``) after :func:`solvers.polish.polish`, its gap
    measured again against the solver's bound; ``stats["polish"]`` says what the sweeps did."""
    polished, report = polish(problem, result, budget_bytes, deadline)
    gap = solution.gap
    if gap is not None and polished.seconds < result.seconds:
        gap = relative_gap(polished.seconds, result.seconds * (1 - gap))
    stats = {**solution.stats, "polish": report}
    return Solution(polished.saved, solution.status, gap, stats), polished


def _fast_status(problem: Problem, fast: Evaluation) -> tuple[str, float | None]:
    """How sure the runtime-optimal plan is: optimal when it recomputes nothing costly, or when
    it is the exact cut of the seconds (:func:`planner.bounds.runtime_optimal_plan`), whose
    nanosecond rounding bounds the gap."""
    if problem.save_seconds.any():
        rounding = 0.5 * SECONDS_UNIT * int((problem.runtime > 0).sum() + (problem.save_seconds > 0).sum())
        return Status.OPTIMAL, relative_gap(fast.seconds, fast.seconds - rounding) or 0.0
    if fast.recompute_seconds == 0:
        return Status.OPTIMAL, 0.0
    return Status.HEURISTIC, None
