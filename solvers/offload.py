"""Save, recompute or offload: the exact program with offloading as a third choice.

Per value that may be offloaded (a candidate of :class:`planner.schedule.OffloadWindows`), a
0/1 variable ``offloaded[k] <= saved[v]``, and ``offloaded[k] + recomputed[w] <= 1`` for
each reader w whose recomputed copy could read v before its copy back (``conflicts``). Its copies run in fixed windows, so the memory rows
stay exact: an offloaded value is off the device from its wait in the forward to the start of
its copy back in the backward (:func:`planner.schedule.profile` with the windows' ``Offloads``),
and each of those steps' rows takes its bytes off (:class:`solvers.peak_rows.PeakRows`). The
link is a resource: per row of ``windows.link_rows``, the chosen copies' seconds fit the
window's capacity (in whole units of :func:`link_unit`, each copy rounded up). Host memory is bounded by
``host_bytes``: every offloaded value is on the host at the end of the forward.

The objective is the plan's seconds, recomputation and saving as in
:mod:`solvers.graph_model`, plus ``windows.op_seconds`` per offloaded value. Solved by the exact
solver's own back end in the lazy loop of :func:`solvers.peak_rows.solve_within_peak`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from planner.decision import Status
from planner.errors import SolverError
from planner.problem import Evaluation, Problem, evaluate, memory_profile
from planner.schedule import OffloadWindows
from solvers.base import relative_gap
from solvers.graph_model import build_graph_model, seconds_bound, tie_broken_objective
from solvers.peak_rows import Round, memory_unit, solve_within_peak

__all__ = ["OffloadSolution", "solve_offloading", "link_unit"]


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
                     run, host_bytes: int | None = None) -> OffloadSolution:
    """The fastest plan within ``budget_bytes`` that saves, recomputes or offloads each value.

    ``start`` is a plan that offloads nothing (the save-or-recompute solver's); it is returned,
    with status ``feasible``, if nothing faster within the budget is found by ``deadline``,
    and it may itself be over the budget (a budget below the least peak without offloading),
    in which case a plan over the budget at the deadline is no answer: the start is returned
    with status ``infeasible`` if the program proved that no plan meets the budget, else
    ``none``. ``run(model,
    objective, vector)`` is the exact solver's back end on one program
    (:class:`solvers.backends.Answer`).
    """
    base, build = build_graph_model(problem)
    cols = build.add_vars(len(windows), integral=True)
    saved_var = base.saved_var[windows.nodes]
    for col, var in zip(cols, saved_var):
        build.add_row([int(col), int(var)], [1.0, -1.0], -math.inf, 0.0)
    for k, w in windows.conflicts:  # offload k or recompute w, not both
        if base.recomputed_var[w] >= 0:
            build.add_row([int(cols[k]), int(base.recomputed_var[w])], [1.0, 1.0], -math.inf, 1.0)
    unit = link_unit(windows)
    ticks = np.ceil(windows.seconds / unit)
    for members, capacity in windows.link_rows:
        build.add_row([int(cols[m]) for m in members], ticks[members].tolist(), -math.inf,
                      float(math.floor(capacity / unit)))
    if host_bytes is not None:
        unit = memory_unit(problem)
        build.add_row([int(c) for c in cols], (problem.nbytes[windows.nodes] / unit).tolist(), -math.inf,
                      host_bytes / unit, unit=unit)
    objective = tie_broken_objective(base)
    scale = float(np.max(base.runtime, initial=0.0)) or 1.0
    bounds, proven_none = [], [False]

    def evaluated(x: np.ndarray) -> tuple[Evaluation, np.ndarray]:
        saved = base.saved_mask(x)
        plain = evaluate(problem, saved)
        chosen = (x[cols] > 0.5) & plain.saved[windows.nodes]  # a value the backward never reads is not copied
        return evaluate(problem, saved, windows.offloads(len(problem), chosen)), chosen

    def solve(model, limit) -> Round:
        padded = np.pad(objective, (0, model.num_vars - len(objective)))
        padded[cols] += windows.op_seconds / scale
        answer = run(model, padded, model.vector(start.saved, start.recomputed))
        if answer.bound is not None:
            bounds.append(seconds_bound(answer.bound, base))
        if answer.x is None:
            proven_none[0] |= answer.infeasible
            return Round(None, None, answer.optimal)
        plan, chosen = evaluated(answer.x)
        return Round(plan, answer.x, answer.optimal, windows.offloads(len(problem), chosen))

    result, stats = solve_within_peak(problem, base, build, solve, deadline, limit_bytes=budget_bytes,
                                      offload=(windows, cols))
    stats.update(candidates=len(windows), link_rows=len(windows.link_rows), start_seconds=start.seconds,
                 proven_infeasible=proven_none[0])
    none = np.zeros(len(windows), dtype=bool)
    if result.plan is not None and result.optimal and result.plan.peak_bytes > budget_bytes:
        raise SolverError(f"the offload program's optimum peaks at {result.plan.peak_bytes} bytes, over its budget of "
                          f"{budget_bytes}; its memory rows disagree with the memory model, a bug: please report it")
    if result.plan is not None and result.plan.peak_bytes <= budget_bytes:
        _, chosen = evaluated(result.x)
        seconds = result.plan.seconds + windows.op_seconds * int(chosen.sum())
        if result.optimal:
            return OffloadSolution(result.plan.saved, chosen, result.plan, seconds, Status.OPTIMAL, 0.0, stats)
        if start.peak_bytes > budget_bytes or seconds < start.seconds:
            return OffloadSolution(result.plan.saved, chosen, result.plan, seconds, Status.FEASIBLE,
                                   relative_gap(seconds, max(bounds, default=None)), stats)
    if start.peak_bytes > budget_bytes:
        return OffloadSolution(start.saved, none, start, start.seconds, "infeasible" if proven_none[0] else "none",
                               None, stats)
    stats["answer"] = "the starting plan: the time limit passed before a faster plan within the budget was found"
    return OffloadSolution(start.saved, none, start, start.seconds, Status.FEASIBLE,
                           relative_gap(start.seconds, max(bounds, default=None)), stats)
