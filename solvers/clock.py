"""The clock a search's time limit is read on: the wall clock, or seconds counted from work done.

A search stopped by the wall clock answers differently on a loaded machine than on an idle one
(the least-peak search on T5's graph stopped its local search at a different plan in each of
three runs under load). Under :func:`counting_work`, :func:`now` counts the work the search has
done instead: each plan evaluated (:func:`planner.problem.evaluations`) costs what it takes on
the reference machine (a 2-core CPU), and a CP-SAT solve the deterministic time it reports, run
in CP-SAT's deterministic mode (:func:`solve_cpsat`). The same search then stops at the same
plan on any machine and under any load, taking less wall time on a faster one.

The wall clock stays a backstop: :func:`now` is never less than the wall seconds elapsed divided
by :data:`BACKSTOP`, so a machine several times slower than the reference still stops in
bounded time; :attr:`WorkClock.wall_stopped` then says the answer may differ from run to run.

Outside :func:`counting_work` (the solvers' own time limits), :func:`now` is ``time.monotonic()``.
"""
from __future__ import annotations

import contextvars
import time
from contextlib import contextmanager
from typing import Iterator

from planner.problem import evaluations

__all__ = ["BACKSTOP", "WorkClock", "counting_work", "now", "passed", "solve_cpsat"]

# Seconds one evaluation of a plan takes on the reference machine (2-core CPU, torch 2.13):
# a fixed part and a part per node of the problem (fitted on GPT graphs of 344-1924 nodes:
# 0.35 ms at 344, 1.1 ms at 1924).
EVALUATION_SECONDS = 1.8e-4
NODE_SECONDS = 4.9e-7

# The wall clock takes over where it runs this many times ahead of the work counted.
BACKSTOP = 3.0


class WorkClock:
    """Seconds of work since the clock was made: plans evaluated and CP-SAT's deterministic time."""

    def __init__(self) -> None:
        self.start_evaluations, self.start_nodes = evaluations()
        self.start_wall = time.monotonic()
        self.solver_seconds = 0.0
        self.wall_stopped = False  # whether the backstop, not the work, ended a wait

    def work(self) -> float:
        done, nodes = evaluations()
        return ((done - self.start_evaluations) * EVALUATION_SECONDS + (nodes - self.start_nodes) * NODE_SECONDS
                + self.solver_seconds)

    def now(self) -> float:
        return self.start_wall + max(self.work(), (time.monotonic() - self.start_wall) / BACKSTOP)


_CLOCK: contextvars.ContextVar[WorkClock | None] = contextvars.ContextVar("search_clock", default=None)


def now() -> float:
    """The current instant on the search's clock (comparable with deadlines made from it)."""
    clock = _CLOCK.get()
    return time.monotonic() if clock is None else clock.now()


def passed(deadline: float) -> bool:
    """Whether ``deadline`` has passed on the search's clock."""
    clock = _CLOCK.get()
    if clock is None:
        return time.monotonic() > deadline
    if clock.start_wall + clock.work() > deadline:
        return True
    if clock.now() > deadline:
        clock.wall_stopped = True
        return True
    return False


@contextmanager
def counting_work() -> Iterator[WorkClock]:
    """Read every deadline inside on a :class:`WorkClock` (and run CP-SAT deterministically)."""
    clock = WorkClock()
    token = _CLOCK.set(clock)
    try:
        yield clock
    finally:
        _CLOCK.reset(token)


def solve_cpsat(solver, model, seconds: float) -> int:
    """``solver.Solve(model)`` given ``seconds`` on the search's clock: wall seconds, or under
    :func:`counting_work` deterministic seconds in CP-SAT's deterministic parallel mode
    (``interleave_search``), counted on the clock once spent, with the wall clock's backstop."""
    seconds = max(0.1, seconds)
    clock = _CLOCK.get()
    if clock is None:
        solver.parameters.max_time_in_seconds = seconds
        return solver.Solve(model)
    solver.parameters.interleave_search = True
    solver.parameters.max_deterministic_time = seconds
    solver.parameters.max_time_in_seconds = seconds * BACKSTOP
    status = solver.Solve(model)
    clock.solver_seconds += float(solver.deterministic_time)
    if solver.wall_time >= seconds * BACKSTOP * 0.99 and solver.deterministic_time < seconds:
        clock.wall_stopped = True
    return status
