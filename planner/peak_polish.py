"""Budget 0's polish sweeps checked against the predicted peak, and given back where inductor's
code contradicts a drop."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Collection

from planner.decision import Decision, with_plan
from planner.graph import JointGraph
from planner.memory import Timeline
from planner.predict import simulated_timeline
from planner.problem import Problem, evaluate_names
from solvers.base import relative_gap

if TYPE_CHECKING:
    from planner.solve import GraphPlan

__all__ = ["POLISH_CHECKS", "POLISH_PEAK_SLACK", "least_peak_polish", "restore_polish_drops"]


def least_peak_polish(joint: JointGraph, problem: Problem, decision: Decision, fuse: bool = True,
                      checks: int | None = None) -> Decision:
    """``decision`` at budget 0 with those of its polish sweeps' saves (:mod:`solvers.polish`)
    that leave the predicted peak (:func:`simulated_peak`) where the solver's answer had it.

    Budget 0 asks for the least memory. The least peak is searched in the solvers' schedule,
    whose peak bounds the simulation's from above; the sweeps save values while that bound holds,
    which can still raise the simulated peak (on an H200, timm's ViT went from 0.566 to 0.602
    GiB measured, above timm's checkpointing at 0.585). The sweeps' saves are simulated together;
    where the peak rises, those of them alive at the simulated peak are dropped, the ones whose
    loss costs the fewest seconds per byte first, until their bytes cover the rise, and the rest
    is simulated again. Where none of them is alive there (the rise comes from what saving them
    changed elsewhere), the longest run of the rest in the sweeps' order that keeps the peak (and
    the schedule's peak within the budget) is found by bisection and kept, the save after it is
    dropped, and the search goes on after it. At most ``checks`` simulations
    (:data:`POLISH_CHECKS`); only saves seen to fit are kept. ``stats["polish"]`` says what was
    kept and dropped (``dropped_at_peak``: how many of the dropped were alive at a simulated
    peak; ``at_peak_stop``: why that stopped), the peaks, and the simulations run. "Where it
    was" allows :data:`POLISH_PEAK_SLACK` of it, far under the simulation's own error against
    the device (1-3% on the zoo): on timm's Swin (captured on a CPU) the sweeps' 112 saves raised
    the simulated peak by 0.03%, at a step where none of them was alive.

    On timm's ResNet-50 at budget 0 (captured on a CPU, H100 datasheet rates) the sweeps' 61 saves
    came to 3216 us of estimated recomputation from 4581: bisection kept 26 of them in 13
    simulations (3948 us), dropping those alive at the peak keeps 57 in 3 (3247 us)."""
    report = decision.stats.get("polish") or {}
    added = list(report.get("added") or [])
    if not added or "start" not in report:
        return decision
    checks = POLISH_CHECKS if checks is None else checks
    start, runs = time.perf_counter(), [0]
    base = tuple(report["start"])
    before_peak = simulated_timeline(joint, problem, base, fuse).peak
    limit = before_peak + int(POLISH_PEAK_SLACK * before_peak)

    def timeline(saves: list[str]) -> Timeline:
        runs[0] += 1
        return simulated_timeline(joint, problem, base + tuple(saves), fuse)

    kept, dropped, rest, stop = [], [], added, "out of checks"
    while rest and runs[0] < checks:  # drop the saves alive at the simulated peak
        current = evaluate_names(problem, base + tuple(rest))
        if current.peak_bytes > decision.budget_bytes:
            stop = "the schedule's peak over the budget"
            break
        line = timeline(rest)
        if line.peak <= limit:
            kept, rest, stop = rest, [], "fits"
            break
        alive = set(line.saved_at_peak).intersection(rest)
        drop = _cheapest_losses(problem, base, rest, current.seconds, alive, line.peak - limit, decision.budget_bytes)
        if not drop:
            stop = ("no save alive at the peak" if not alive else
                    "each save alive at the peak, dropped, takes the schedule's peak over the budget")
            break
        dropped += drop
        rest = [n for n in rest if n not in drop]
    at_peak = len(dropped)

    def fits(saves: list[str]) -> bool:
        return (evaluate_names(problem, base + tuple(saves)).peak_bytes <= decision.budget_bytes
                and timeline(saves).peak <= limit)

    while rest and runs[0] < checks:  # bisection over what is left, in the sweeps' order
        if fits(kept + rest):
            kept += rest
            rest = []
            break
        low, high = 0, len(rest)  # kept + rest[:low] fits, kept + rest[:high] does not
        while high - low > 1 and runs[0] < checks:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(kept + rest[:middle]) else (low, middle)
        if high - low > 1:  # out of checks: only what was seen to fit is kept
            kept += rest[:low]
            break
        kept += rest[:low]
        dropped.append(rest[low])
        rest = rest[high:]
    chosen = set(kept)
    kept = [n for n in added if n in chosen]
    unchecked = len(added) - len(kept) - len(dropped)
    plan, before = evaluate_names(problem, base + tuple(kept)), evaluate_names(problem, base)
    if plan.seconds >= before.seconds:  # what fits gains nothing: the solver's answer stands
        plan, kept = before, []
    gap = None if decision.gap is None else relative_gap(plan.seconds, decision.seconds * (1 - decision.gap))
    note = {**report, "added": kept, "kept": len(kept), "dropped": dropped, "dropped_at_peak": at_peak,
            "at_peak_stop": stop, "unchecked": unchecked,
            "objective_after": plan.seconds, "simulated_peak_before": before_peak,
            "simulated_peak_limit": limit, "simulations": 1 + runs[0],
            "check_seconds": round(time.perf_counter() - start, 3)}
    return with_plan(problem, decision, plan, gap=gap, stats={**decision.stats, "polish": note})


def _cheapest_losses(problem: Problem, base: tuple[str, ...], saves: list[str], seconds: float, alive: set[str],
                     excess: int, budget_bytes: int) -> list[str]:
    """Of the saves in ``alive``, those to drop so that their bytes cover ``excess``: fewest
    seconds lost per byte first (each loss measured with every other save kept, against the
    ``seconds`` of keeping them all), leaving out a save whose loss alone takes the schedule's
    peak over ``budget_bytes`` (its recomputation)."""
    names = sorted(alive, key=saves.index)
    size = {name: int(problem.nbytes[i]) for name, i in zip(names, problem.index(names))}
    costs = {}
    for name in names:
        without = evaluate_names(problem, base + tuple(n for n in saves if n != name))
        if without.peak_bytes <= budget_bytes:
            costs[name] = (without.seconds - seconds) / max(1, size[name])
    chosen, covered = [], 0
    for name in sorted(costs, key=lambda n: (costs[n], saves.index(n))):
        chosen.append(name)
        covered += size[name]
        if covered >= excess:
            break
    return chosen


def restore_polish_drops(joint: JointGraph, plan: GraphPlan, compiled_peak: int, among: Collection[str],
                         fuse: bool = True) -> tuple[GraphPlan | None, dict[str, Any]]:
    """``plan`` with the saves budget 0's polish dropped (:func:`least_peak_polish`, those of
    ``among``) saved again, where the code inductor wrote for a plan that dropped them was found
    to hold ``compiled_peak`` (:meth:`PlannerBackend.compiled_timelines`), more than the plan
    restored is predicted to; None where nothing is to restore, the schedule's peak would pass
    the budget, or the restored plan is predicted no lower. Beside it, what was tried and how it
    ended (``outcome``), for :attr:`PlannerBackend.polish_restores`.

    The polish drops a save alive at the simulated peak on the memory model's word. Dropping it
    lengthens what the backward recomputes, and a long pointwise expression is one inductor
    stores as it lowers it (past ``realize_opcount_threshold`` ops), which the model does not
    count: on an H200, ConvNeXt-V2's budget 0 without 5 of its sweeps' saves measured 0.835 GiB
    against 0.684 predicted, inductor having stored each first-stage block's float32 GELU
    gradient (294 MiB)."""
    polish = plan.decision.stats.get("polish") or {}
    saved = set(plan.decision.saved)
    dropped = [name for name in polish.get("dropped") or [] if name in set(among) and name not in saved]
    info: dict[str, Any] = {"dropped": dropped, "compiled_peak": compiled_peak}
    if not dropped:
        return None, {**info, "outcome": "no save of the polish's to restore"}
    names = tuple(plan.decision.saved) + tuple(dropped)
    evaluation = evaluate_names(plan.problem, names)
    if evaluation.peak_bytes > plan.decision.budget_bytes:
        return None, {**info, "outcome": "the schedule's peak would pass the budget"}
    info["restored_peak"] = predicted = simulated_timeline(joint, plan.problem, names, fuse, joint.released).peak
    if predicted >= compiled_peak:
        return None, {**info, "outcome": "the plan restored is predicted no lower"}
    note = {**polish, "restored": dropped, "restored_for": {"compiled_peak": compiled_peak, "restored_peak": predicted}}
    return (replace(plan, decision=with_plan(plan.problem, plan.decision, evaluation,
                                              stats={**plan.decision.stats, "polish": note})),
            {**info, "outcome": "restored"})


# Budget 0: the most simulations spent keeping the polish sweeps' saves that leave the predicted
# peak as it was (each emits and simulates the graph: on the H200 machine's CPU about 1.1 s on the
# zoo's ViT and 2.6 s on ResNet-50, before the simulation was made a third faster)
POLISH_CHECKS = 12
# ... and the share by which the kept saves may raise the simulated peak of the solver's answer
POLISH_PEAK_SLACK = 0.002
