"""Save, recompute or offload: the exact program with offloading as a third choice.

Per value that may be offloaded (a candidate of :class:`planner.schedule.OffloadWindows`), a
0/1 variable ``offloaded[k] <= saved[v]``, and ``offloaded[k] + made[w, t] <= 1`` for each
reader w whose recomputed copy could read v before its copy back starts (``conflicts``;
``made`` as in :mod:`solvers.peak_rows`, exact at its step). Its copies run in fixed windows,
so the memory rows stay exact: an offloaded value is off the device from its wait in the
forward to the start of its copy back in the backward (:func:`planner.schedule.profile` with
the windows' ``Offloads``), and each of those steps' rows takes its bytes off
(:class:`solvers.peak_rows.PeakRows`). The link is a resource: per row of
``windows.link_rows``, the chosen copies' seconds fit the window's capacity (in whole units of
:func:`link_unit`, each copy rounded up). Host memory is bounded by ``host_bytes``: every
offloaded value is on the host at the end of the forward.

The objective is the plan's seconds, recomputation and saving as in
:mod:`solvers.graph_model`, plus ``windows.op_seconds`` per offloaded value. Solved by the exact
solver's own back end in the lazy loop of :func:`solvers.peak_rows.solve_within_peak`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from planner.decision import Status
from planner.errors import SolverError
from planner.problem import Evaluation, Problem, evaluate
from planner.schedule import OffloadWindows, made_at
from solvers.base import relative_gap
from solvers.graph_model import build_graph_model, seconds_bound, tie_broken_objective
from solvers.peak_rows import PeakRows, Round, memory_unit, solve_within_peak
from solvers.reference import reference_plan

__all__ = ["OffloadSolution", "solve_offloading", "least_peak_offloading", "link_unit"]


def link_unit(windows: OffloadWindows) -> float:
    """Seconds per unit of the link rows: about 2**-20 of the largest time in them, so that
    rounding each copy up to whole units (as CP-SAT needs) costs at most that per copy."""
    largest = max([float(np.max(windows.seconds, initial=0.0))] + [c for _, c in windows.link_rows])
    return largest / 2 ** 20 if largest > 0 else 1.0


@dataclass
class OffloadSolution:
    """The plan found: its saved mask, the candidates it offloads (a mask over the windows'
    candidates), its evaluation with them, its seconds with the offloads' own, how sure it is,
    and the loop's figures."""

    saved: np.ndarray
    offloaded: np.ndarray
    plan: Evaluation
    seconds: float
    status: str
    gap: float | None = None
    stats: dict = field(default_factory=dict)


def solve_offloading(problem: Problem, budget_bytes: int, windows: OffloadWindows, start: Evaluation, deadline: float,
                     run, host_bytes: int | None = None, start_offloaded: np.ndarray | None = None) -> OffloadSolution:
    """The fastest plan within ``budget_bytes`` that saves, recomputes or offloads each value.

    ``start`` is the plan to start from, offloading ``start_offloaded`` (a mask over the
    candidates; none if None): the save-or-recompute solver's plan, or the least-peak plan of
    :func:`least_peak_offloading`. It is returned, with status ``feasible``, if nothing faster
    within the budget is found by ``deadline``. It may itself be over the budget (a budget
    below the least peak without offloading); if no plan within the budget is found, the start
    is returned with status ``infeasible`` where the program proved that none exists, else
    ``none``. ``run(model, objective, vector)`` is the exact solver's back end on one program
    (:class:`solvers.backends.Answer`).
    """
    program = _Program(problem, windows, host_bytes)
    base, cols = program.base, program.cols
    begun = program.start(start, start_offloaded)
    if start_offloaded is None:  # the start with what fits offloaded, where that meets the budget
        seeded = program.start(start, program.what_fits(start))
        if seeded.plan.peak_bytes <= budget_bytes < begun.plan.peak_bytes:
            begun = seeded
    objective = tie_broken_objective(base)
    scale = float(np.max(base.runtime, initial=0.0)) or 1.0
    bounds, proven_none = [], [False]

    def solve(model, limit) -> Round:
        padded = np.pad(objective, (0, model.num_vars - len(objective)))
        padded[cols] += windows.op_seconds / scale
        answer = run(model, padded, program.vector(model, begun))
        if answer.bound is not None:
            bounds.append(seconds_bound(answer.bound, base))
        proven_none[0] |= answer.infeasible
        return program.round(answer)

    result, stats = solve_within_peak(problem, base, program.build, solve, deadline, limit_bytes=budget_bytes,
                                      offload=(windows, cols))
    stats.update(candidates=len(windows), link_rows=len(windows.link_rows), start_seconds=begun.seconds,
                 proven_infeasible=proven_none[0])
    if result.plan is not None and result.optimal and result.plan.peak_bytes > budget_bytes:
        raise SolverError(f"the offload program's optimum peaks at {result.plan.peak_bytes} bytes, over its budget of "
                          f"{budget_bytes}; its memory rows disagree with the memory model, a bug: please report it")
    if result.plan is not None and result.plan.peak_bytes <= budget_bytes:
        found = program.solution(result.x)
        if result.optimal:
            return replace(found, status=Status.OPTIMAL, gap=0.0, stats=stats)
        if begun.plan.peak_bytes > budget_bytes or found.seconds < begun.seconds:
            return replace(found, status=Status.FEASIBLE, gap=relative_gap(found.seconds, max(bounds, default=None)),
                           stats=stats)
    if begun.plan.peak_bytes > budget_bytes:
        return replace(begun, status="infeasible" if proven_none[0] else "none", stats=stats)
    stats["answer"] = "the starting plan: the time limit passed before a faster plan within the budget was found"
    return replace(begun, status=Status.FEASIBLE, gap=relative_gap(begun.seconds, max(bounds, default=None)),
                   stats=stats)


def least_peak_offloading(problem: Problem, windows: OffloadWindows, start: Evaluation, deadline: float,
                          host_bytes: int | None = None, workers: int = 8) -> OffloadSolution:
    """The plan of least peak that saves, recomputes or offloads each value: the offload
    program with the peak as its objective, by CP-SAT (as the least peak without offloading is
    found, :mod:`solvers.frugal`), started from the least of ``start`` (which offloads nothing)
    and it and the frugal reference plan with what fits offloaded (:meth:`_Program.what_fits`).
    Status ``optimal`` if proven least by ``deadline``, else ``feasible`` (the least found,
    never above the start's)."""
    from solvers.cpsat import run_cpsat  # the methods sit above this module

    program = _Program(problem, windows, host_bytes)
    begun = program.start(start, None)
    # starts: the plan given, and it and the frugal reference (the blocks' boundaries saved,
    # read where their blocks' backward begins) each with what fits offloaded
    reference = reference_plan(problem)
    hint = [begun, program.start(start, program.what_fits(start)),
            program.start(reference, program.what_fits(reference))]

    def solve(model, limit) -> Round:
        best = min(hint, key=lambda s: (s.plan.peak_bytes, s.seconds))
        answer = run_cpsat(model, None, program.vector(model, best), deadline, workers, limit)
        found = program.round(answer)
        if found.plan is not None:
            hint.append(program.solution(found.x))
        return found

    result, stats = solve_within_peak(problem, program.base, program.build, solve, deadline, limit_bytes=0.0,
                                      peak_span=float(start.peak_bytes), offload=(windows, program.cols))
    stats.update(candidates=len(windows), link_rows=len(windows.link_rows))
    found = min(hint, key=lambda s: (s.plan.peak_bytes, s.seconds))
    proven = result.optimal and result.plan is not None and found.plan.peak_bytes == result.plan.peak_bytes
    return replace(found, status=Status.OPTIMAL if proven else Status.FEASIBLE, gap=None, stats=stats)


class _Program:
    """The offload program's variables and rows (before the memory rows), and its plans."""

    def __init__(self, problem: Problem, windows: OffloadWindows, host_bytes: int | None) -> None:
        self.problem, self.windows = problem, windows
        base, build = build_graph_model(problem)
        cols = build.add_vars(len(windows), integral=True)
        for node in np.unique(windows.nodes):  # one window at most, and only for a saved value
            mine = [int(c) for c in cols[windows.nodes == node]]
            build.add_row(mine + [int(base.saved_var[node])], [1.0] * len(mine) + [-1.0], -math.inf, 0.0)
        rows, made = PeakRows(problem, base), {}
        for k, w, t in windows.conflicts:  # offload k, or make w's copy by step t, not both
            column = rows.made(build, t, made).get(w) if t >= 0 else None
            if column is not None:
                build.add_row([int(cols[k]), int(column)], [1.0, 1.0], -math.inf, 1.0)
        unit = link_unit(windows)
        self.ticks = np.ceil(windows.seconds / unit)  # the link rows in whole units
        self.capacity = [float(math.floor(capacity / unit)) for _, capacity in windows.link_rows]
        for (members, _), capacity in zip(windows.link_rows, self.capacity):
            build.add_row([int(cols[m]) for m in members], self.ticks[members].tolist(), -math.inf, capacity)
        if host_bytes is not None:
            unit = memory_unit(problem)
            build.add_row([int(c) for c in cols], (problem.nbytes[windows.nodes] / unit).tolist(), -math.inf,
                          host_bytes / unit, unit=unit)
        self.base, self.build, self.cols, self.host_bytes = base, build, cols, host_bytes

    def what_fits(self, plan: Evaluation) -> np.ndarray:
        """The candidates ``plan`` saves, largest first, each taken where the link rows and the
        host bound still hold and no copy the plan recomputes reads it before its copy back (a
        mask over the candidates: a start for the programs, no optimum)."""
        windows, problem = self.windows, self.problem
        made = made_at(problem.schedule, problem.consumers, plan.recomputed & problem.schedule.owns)
        early = {k for k, w, t in windows.conflicts if w in made and made[w] <= t}
        load = [0.0] * len(windows.link_rows)
        rows_of: dict[int, list[int]] = {}
        for r, (members, _) in enumerate(windows.link_rows):
            for m in members:
                rows_of.setdefault(int(m), []).append(r)
        room = math.inf if self.host_bytes is None else float(self.host_bytes)
        chosen = np.zeros(len(windows), dtype=bool)
        sizes = problem.nbytes[windows.nodes]
        taken = set()
        for k in np.lexsort((-windows.back_from, -sizes)):  # largest first, the latest copy back first
            k = int(k)
            node = int(windows.nodes[k])
            if not plan.saved[node] or node in taken or k in early or sizes[k] > room:
                continue
            rows = rows_of.get(k, [])
            if all(load[r] + self.ticks[k] <= self.capacity[r] for r in rows):
                for r in rows:
                    load[r] += self.ticks[k]
                room -= sizes[k]
                chosen[k] = True
                taken.add(node)
        return chosen

    def evaluated(self, saved: np.ndarray, offloaded: np.ndarray) -> tuple[Evaluation, np.ndarray]:
        """A plan and the candidates it offloads, of those chosen, that the backward reads."""
        plain = evaluate(self.problem, saved)
        chosen = np.asarray(offloaded, dtype=bool) & plain.saved[self.windows.nodes]
        return evaluate(self.problem, saved, self.windows.offloads(len(self.problem), chosen)), chosen

    def solution(self, x: np.ndarray) -> OffloadSolution:
        """The plan of a solution vector (status left to the caller)."""
        return self.start_of(self.base.saved_mask(x), x[self.cols] > 0.5)

    def start(self, plan: Evaluation, offloaded: np.ndarray | None) -> OffloadSolution:
        """``plan`` offloading ``offloaded`` (a mask over the candidates; None: nothing)."""
        return self.start_of(plan.saved, np.zeros(len(self.windows), dtype=bool) if offloaded is None else offloaded)

    def start_of(self, saved: np.ndarray, offloaded: np.ndarray) -> OffloadSolution:
        plan, chosen = self.evaluated(saved, offloaded)
        return OffloadSolution(plan.saved, chosen, plan, plan.seconds + self.windows.op_seconds * int(chosen.sum()), "")

    def vector(self, model, begun: OffloadSolution) -> np.ndarray:
        """A plan's vector on ``model`` (a hint), its offload variables set."""
        x = model.vector(begun.plan.saved, begun.plan.recomputed)
        x[self.cols[begun.offloaded]] = 1.0
        return x

    def round(self, answer) -> Round:
        if answer.x is None:
            return Round(None, None, answer.optimal)
        found = self.solution(answer.x)
        return Round(found.plan, answer.x, answer.optimal,
                     self.windows.offloads(len(self.problem), found.offloaded))
