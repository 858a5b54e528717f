"""Which values a plan offloads to host memory (``offload="auto"``): greedily after the solver's
plan, or by the exact solver's own program that weighs save, recompute and offload per value."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

import numpy as np
import torch.fx as fx

from estimators.base import Estimator
from planner import offload
from planner.bounds import runtime_optimal_plan
from planner.config import PlannerConfig
from planner.decision import Decision
from planner.errors import InfeasibleBudget
from planner.graph import JointGraph
from planner.problem import Evaluation, Problem, evaluate_names
from solvers.base import Solver
from solvers.offload import least_peak_offloading, solve_offloading
from solvers.reference import reference_plan

__all__ = ["auto_offload", "exact_offload", "offload_goes_lower", "offload_guides"]


def auto_offload(joint: JointGraph, problem: Problem, config: PlannerConfig, solver: Solver, estimator: Estimator,
                 decision: Decision) -> Decision:
    """``offload="auto"``: the budget's plan with the offloads the host link hides
    (:func:`planner.offload.offloaded_decision`, lowering its peak), or the fastest plan with
    offloads that bring its peak under the budget where that is estimated faster.
    ``stats["offload"]`` says which, and what was offloaded; on a CPU graph, that nothing is."""
    link = offload.host_link(joint, config.offload_bandwidth)
    if link is None:
        return replace(decision, stats={**decision.stats, "offload": "none: the graph runs on the CPU, whose memory "
                                                                     "is the host's"})
    estimator.prepare([n for n in joint.graph.nodes if n.op == "call_function"])  # the backward's ops too
    runtime = offload.op_seconds(estimator, fuse=config.codegen == "inductor")
    if solver.offload_backend(time.monotonic()) is not None:
        return exact_offload(joint, problem, config, solver, runtime, link, decision)
    budget = decision.budget_bytes
    fast = runtime_optimal_plan(problem)
    if fast.peak_bytes > budget and fast.seconds < decision.seconds:
        moved = offload.offloaded_decision(joint, problem, solver.solve(problem, fast.peak_bytes), runtime, budget,
                                           link, config.offload_min_bytes, config.offload_host_bytes)
        if moved.peak_bytes <= budget and moved.seconds < decision.seconds:
            note = {**moved.stats["offload"], "plan": "the fastest plan, offloaded under the budget",
                    "seconds_without_offload": decision.seconds, "method": GREEDY_OFFLOADS.format(solver.name)}
            return replace(moved, budget_bytes=budget, stats={**moved.stats, "offload": note})
    kept = offload.offloaded_decision(joint, problem, decision, runtime, 0, link, config.offload_min_bytes,
                                      config.offload_host_bytes)
    return replace(kept, stats={**kept.stats, "offload": {**kept.stats["offload"], "plan": "the budget's plan",
                                                          "method": GREEDY_OFFLOADS.format(solver.name)}})


GREEDY_OFFLOADS = ("greedy offloads after the {} plan (planner.offload.choose_offloads): the solver does not weigh "
                   "offloading")


def offload_goes_lower(joint: JointGraph, config: PlannerConfig, solver: Solver) -> bool:
    """Whether a budget below the least peak without offloading may still be met: ``offload
    = "auto"``, a solver that weighs offloading, and a host to offload to."""
    return (config.offload == "auto" and solver.offload_backend(time.monotonic()) is not None
            and offload.host_link(joint, config.offload_bandwidth) is not None)


def offload_guides(problem: Problem, start: Evaluation) -> tuple:
    """The reads the offload windows follow (:func:`planner.offload.offload_windows`): those of
    the plan the exact program starts from, of the frugal reference (each block's boundary saved
    and read where the block's backward begins), and of the direct readers."""
    return start.recomputed, reference_plan(problem).recomputed, None


def exact_offload(joint: JointGraph, problem: Problem, config: PlannerConfig, solver: Solver,
                  runtime: Callable[[fx.Node], float], link: float, decision: Decision) -> Decision:
    """The fastest plan within the decision's budget that saves, recomputes or offloads each
    value, by the exact solver's own back end (:func:`solvers.offload.solve_offloading`),
    started from ``decision`` (which may be over the budget, where offloading is to reach
    below the least peak without it). At budget 0.0, the least peak with offloading first
    (:func:`solvers.offload.least_peak_offloading`), then the fastest plan at that peak, each
    within the solver's time limit. Its copies run in the windows the program priced
    (:func:`planner.offload.offload_windows`). Where it offloads nothing, the budget's own plan
    stands as it was (PyTorch's split at 1.0 among them). ``stats["offload"]`` says what was offloaded,
    the program's status and gap, and the plan's seconds with and without offloading."""
    began = time.perf_counter()
    start = evaluate_names(problem, decision.saved)
    windows = offload.offload_windows(joint, problem, runtime, link, config.offload_min_bytes,
                                      config.offload_op_seconds, guides=offload_guides(problem, start))
    budget, least = decision.budget_bytes, None
    if config.budget.fraction == 0.0:  # the most frugal plan: the least peak with offloading, then the fastest there
        least = least_peak_offloading(problem, windows, start, time.monotonic() + solver.time_limit,
                                      config.offload_host_bytes)
        budget = min(budget, least.plan.peak_bytes)
    deadline = time.monotonic() + solver.time_limit
    found = solve_offloading(problem, budget, windows, start if least is None else least.plan, deadline,
                             solver.offload_backend(deadline), config.offload_host_bytes,
                             None if least is None else least.offloaded)
    if found.plan.peak_bytes > budget:
        verdict = ("proved that no plan within it exists" if found.status == "infeasible"
                   else f"found no plan within it in {solver.time_limit:g} s")
        raise InfeasibleBudget(decision.budget_bytes, start.peak_bytes, proven=False,
                               note=f"with offloading, {solver.name} {verdict}, {len(windows)} values that may be "
                                    "offloaded, in the windows of planner.offload.offload_windows")
    names = problem.names
    offloaded = tuple(names[int(windows.nodes[k])] for k in np.flatnonzero(found.offloaded))
    note = {"method": f"{solver.name}: save, recompute or offload per value (solvers.offload)",
            "plan": "the budget's plan with offloading weighed", "offloaded": len(offloaded),
            "offloaded_bytes": int(problem.nbytes[windows.nodes[found.offloaded]].sum()),
            "peak_bytes_on_device_alone": start.peak_bytes, "bytes_per_second": link,
            "host_bytes_limit": config.offload_host_bytes, "status": found.status, "gap": found.gap,
            "seconds_with_offload": found.seconds, "seconds_without_offload": start.seconds,
            "op_seconds": windows.op_seconds, "solve_seconds": time.perf_counter() - began,
            **({} if least is None else {"least_peak": {"peak_bytes": least.plan.peak_bytes, "status": least.status,
                                                        "rounds": least.stats.get("rounds")}}),
            **{f"program_{k}": v for k, v in found.stats.items()}}
    if not offloaded and decision.peak_bytes <= budget:  # offloading buys nothing: the budget's own plan
        note["plan"] = "the budget's plan: the program offloads nothing"
        return replace(decision, stats={**decision.stats, "offload": note})
    plan = found.plan
    return replace(decision, budget_bytes=budget, saved=tuple(names[i] for i in np.flatnonzero(plan.saved)),
                   offloaded=offloaded,
                   transfers=offload.windows_decision(problem, windows, found.offloaded), peak_bytes=plan.peak_bytes,
                   memory_bytes=plan.memory_bytes, recompute_seconds=plan.recompute_seconds,
                   save_seconds=plan.save_seconds, status=found.status, gap=found.gap,
                   stats={**decision.stats, "offload": note})
