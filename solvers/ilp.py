"""Exact integer program on the graph, solved by HiGHS (default) or CBC.

Unlike a knapsack, the model knows that recomputing a node needs its inputs, saved or
recomputed themselves, so chains of recomputation are priced exactly (see
:mod:`solvers.graph_model`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from planner.errors import ConfigError
from planner.problem import Evaluation, Problem, evaluate, evaluate_names
from solvers.backends import BACKENDS, solve_highs, within_peak
from solvers.base import Solution, Solver, relative_gap
from solvers.blocks import block_patterns, find_blocks, in_rank_order, pattern_ranks
from solvers.graph_model import choose_patterns, tie_blocks
from solvers.greedy import GreedySolver
from solvers.mincut import MinCutSolver
from solvers.peak_rows import Steps
from solvers.rounding import improve_near, round_relaxation

__all__ = ["ILPSolver", "Start", "solve_from_start"]


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

    Complexity: NP-hard in general. On the built-in 12-layer GPT the relaxation is within about
    0.5-2.5% of the optimum at budgets 0.3-0.8 and 8-14% below the best plan known at 0.1, where
    no proof comes soon (CP-SAT given 600 s there ends 2.3% short). Near budget 0 HiGHS may not
    prove what ``cpsat`` does: on the 1-layer GPT at 0.0 it stops at 6% after 60 s, CP-SAT
    proves it in 3 s.
    """

    name = "ilp"
    exact = True

    def __init__(self, time_limit: float = 60.0, backend: str = "highs") -> None:
        super().__init__(time_limit)
        if backend not in BACKENDS:
            raise ConfigError(f"ilp backend={backend!r} is not allowed; choose one of: {', '.join(BACKENDS)}")
        self.backend = backend

    def _solve(
        self, problem: Problem, budget_bytes: int, frugal: Evaluation, fast: Evaluation, deadline: float,
        starts: dict[str, Evaluation] | None = None,
    ) -> Solution:
        backend = BACKENDS[self.backend]
        solution = solve_from_start(problem, budget_bytes, frugal, deadline,
                                    lambda model, objective, start, until: backend(model, objective, until), starts)
        solution.stats["backend"] = self.backend
        return solution

    def offload_backend(self, deadline: float):
        backend = BACKENDS[self.backend]
        return lambda model, objective, vector: backend(model, objective, deadline)


HEURISTIC_SECONDS = 0.5
ROUNDING_SHARE = 0.25
NEIGHBOURHOOD_SHARE = 0.15
BLOCKS_SHARE = 0.2
BLOCKS_GAP = 0.01  # the tied program only supplies a start: each of its rounds stops within 1%
PATTERNS_SHARE = 0.6


@dataclass(frozen=True)
class Start:
    """The exact solvers' starting plan, the method that made it, the seconds no plan within
    the budget beats as far as the heuristics proved (0 if nothing), and notes for ``stats``."""

    method: str
    plan: Evaluation
    bound: float
    notes: dict


def solve_from_start(problem: Problem, budget_bytes: int, frugal: Evaluation, deadline: float, backend,
                     starts: dict[str, Evaluation] | None = None) -> Solution:
    """The exact solvers' shape: :func:`heuristic_start`, then :func:`within_peak` from it with
    the memory rows the start needed. ``backend(model, objective, start, until)`` solves one
    program by ``until`` (a ``time.monotonic()`` instant); ``start`` is the starting plan's
    vector on that model (a hint, or the cutoff's value). ``starts``: named plans the caller
    knows, started from where they fit and are fastest."""
    steps = Steps()
    start = heuristic_start(problem, budget_bytes, frugal, deadline, steps, starts, backend)
    solution = within_peak(problem, budget_bytes, start.plan, deadline,
                           lambda model, objective, vector: backend(model, objective, vector, deadline),
                           steps=steps, bound=start.bound)
    solution.stats.update(start=start.method, **start.notes)
    return solution


def heuristic_start(problem: Problem, budget_bytes: int, frugal: Evaluation, deadline: float, steps: Steps,
                    starts: dict[str, Evaluation] | None = None, backend=None) -> Start:
    """The exact solvers' start: the fastest plan within the budget of these, in order.

    1. The ``mincut`` and ``greedy`` plans for this budget and the most frugal plan (near the
       frugal end the greedy capacity search often beats the frugal plan by far).
    2. Plans rounded from the relaxation (:func:`solvers.rounding.round_relaxation`), which
       prices recomputation on the graph; its optimum is the start's bound.
    3. The exact program restricted to the variables where the relaxation and the best plan so
       far disagree (:func:`solvers.rounding.improve_near`, ``"neighbourhood"``).
    4. If the problem repeats a block (:func:`solvers.blocks.find_blocks`: the layers of a
       transformer) and the best plan is not within ``BLOCKS_GAP`` of the bound,
       :func:`_block_search`: the program with every block deciding alike (``"blocks"``), then
       the program with every block saving as one block of a plan found so far does
       (``"patterns"``).

    Each heuristic of 1 gets a tenth of the time left, 2 and 3 ``ROUNDING_SHARE`` and
    ``NEIGHBOURHOOD_SHARE``, each at least ``HEURISTIC_SECONDS`` (the search for the frugal
    plan may have used the whole limit), so the solve can overrun its limit by that much. The
    steps whose memory rows 2-4 needed are added to ``steps``, for the full program.

    Last, a plan of the caller's ``starts`` (PyTorch's own split, by its name) that fits and is
    faster than the best found replaces it. Only last: as the incumbent of 3 and 4, a start
    better than the heuristics' but far from the relaxation led them to worse plans (on BERT at
    budget 1.0, H100 prices, 5 s: 0.651 against 0.371 ms of recomputing and saving).

    ``backend`` is the exact solver's own (:func:`solve_from_start`), for the patterns'
    program; HiGHS without it."""

    def share(fraction: float) -> float:
        return max(HEURISTIC_SECONDS, fraction * (deadline - time.monotonic()))

    found = [("frugal", frugal)]
    for kind in (MinCutSolver, GreedySolver):
        plan = evaluate_names(problem, kind(time_limit=share(0.1)).solve(problem, budget_bytes, frugal=frugal).saved)
        if plan.peak_bytes <= budget_bytes:
            found.append((kind.name, plan))
    rounded = round_relaxation(problem, budget_bytes, time.monotonic() + share(ROUNDING_SHARE), steps)
    if rounded.plan is not None:
        found.append(("rounding", rounded.plan))
    notes = {"relaxation": {"bound_seconds": rounded.bound, "rounds": rounded.rounds}, "blocks": None}
    begin, start = min(found, key=lambda named: named[1].seconds)
    if rounded.values is not None:
        near = improve_near(problem, budget_bytes, start, rounded.values, time.monotonic() + share(NEIGHBOURHOOD_SHARE), steps)
        if near.seconds < start.seconds:
            begin, start = "neighbourhood", near
            found.append((begin, start))
    blocks, gap = find_blocks(problem), relative_gap(start.seconds, rounded.bound)
    if blocks is not None and (gap is None or gap > BLOCKS_GAP):  # else the block programs cannot help
        begin, start = _block_search(problem, budget_bytes, blocks, (begin, start), found, deadline, steps, notes,
                                     backend or (lambda model, objective, vector, until: solve_highs(model, objective, until)))
    for name, plan in (starts or {}).items():  # after the search: a given plan must not steer it
        if plan.peak_bytes <= budget_bytes and plan.seconds < start.seconds:
            begin, start = name, plan
    return Start(begin, start, rounded.bound or 0.0, notes)


def _block_search(problem: Problem, budget_bytes: int, blocks, best: tuple[str, Evaluation], found: list,
                  deadline: float, steps: Steps, notes: dict, backend) -> tuple[str, Evaluation]:
    """The best of ``best`` and two programs restricted by the problem's repeated blocks.

    1. ``"blocks"``: every block deciding alike (:func:`tie_blocks`), solved by HiGHS with the
       best plan's objective as a cutoff to within ``BLOCKS_GAP``, for up to ``BLOCKS_SHARE``
       of the time left. Tying makes the program a fraction of its size, so at tight budgets it
       finds plans the full program does not reach within its limit.
    2. ``"patterns"``: every block saving as one block of one of the plans found so far does
       (:func:`solvers.blocks.block_patterns`, :func:`choose_patterns`), solved to optimality
       by ``backend`` for up to ``PATTERNS_SHARE`` of the time left. Its plans mix the
       blocks' choices, as the optimum does where one choice per block cannot fill the budget:
       on the built-in 12-layer GPT at budget 0.3, the blocks of the proven optimum save in one
       of two ways, five and seven of them; the full program found that plan in 60 s, this
       program (CP-SAT) from the heuristics' plans in under 4 s.
    """
    begin, start = best
    began = time.monotonic()
    until = began + BLOCKS_SHARE * max(0.0, deadline - time.monotonic())
    tied = within_peak(problem, budget_bytes, start, until, lambda model, objective, incumbent: solve_highs(
        model, objective, until, BLOCKS_GAP, cutoff=objective @ incumbent),
        restrict=lambda build, base: tie_blocks(build, base, blocks), steps=steps)
    notes["blocks"] = {"start": blocks.start, "period": blocks.period, "count": blocks.count,
                       "status": tied.status, "gap_limit": BLOCKS_GAP, "rounds": tied.stats["rounds"],
                       "seconds": time.monotonic() - began}
    plan = evaluate(problem, tied.saved)
    found = [named[1] for named in found] + [plan]
    if plan.seconds < start.seconds:
        begin, start = "blocks", plan
    patterns = block_patterns(blocks, found)
    notes["patterns"] = {"count": len(patterns)}
    if len(patterns) > 1:
        began = time.monotonic()
        until = began + PATTERNS_SHARE * max(0.0, deadline - time.monotonic())
        ranks = pattern_ranks(blocks, patterns, problem.nbytes)
        chosen, saved = in_rank_order(blocks, start, patterns, ranks)
        ordered = evaluate(problem, saved)  # the start with its blocks in the program's order
        if ordered.peak_bytes <= budget_bytes and ordered.seconds <= start.seconds:
            start = ordered
        else:  # the start as it is: a hint of its saved values alone
            chosen = None
        columns = []

        def restrict(build, base):
            columns.append(choose_patterns(build, base, blocks, patterns, ranks))

        def run(model, objective, vector):  # the ordered start's choices complete its vector
            if chosen is not None:
                vector = vector.copy()
                vector[columns[0][np.arange(blocks.count), chosen]] = 1.0
            return backend(model, objective, vector, until)

        mixed = within_peak(problem, budget_bytes, start, until, run, restrict=restrict, steps=steps)
        notes["patterns"].update(status=mixed.status, rounds=mixed.stats["rounds"], seconds=time.monotonic() - began)
        plan = evaluate(problem, mixed.saved)
        if plan.seconds < start.seconds:
            begin, start = "patterns", plan
    return begin, start
