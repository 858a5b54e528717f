"""The planner as a torch.compile backend: every joint graph is planned, then split and compiled."""
from __future__ import annotations

import os
import time
import warnings
import weakref
from functools import partial, wraps
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Callable, Collection

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn

from estimators import get_estimator
from estimators.base import Estimator
from planner import _torch_compat, offload
from planner.bounds import named_plan, runtime_optimal_plan
from planner.build import build_problem, estimate_step_seconds, hands_on
from planner.tracing import make_backend
from planner.config import PlannerConfig
from planner.decision import Decision, Status
from planner.decisions import KEY, decision_key, keep_decision, reuse_or_solve
from planner.distributed import agree_on_graph, decide_on_rank0, world
from planner.emit import Transfer, emit, store_narrow_casts
from planner.errors import InfeasibleBudget, PlanFileError
from planner.frames import own_forward, own_frame
from planner.graph import JointGraph, copy_module
from planner.memory import Timeline, convolutions_laid_out, saved_outputs, simulate, stores_against_inductor
from planner.problem import Evaluation, InfeasibleDecision, Problem, evaluate_names
from planner.units import format_bytes
from solvers import get_solver
from solvers.base import Solver, relative_gap
from solvers.frugal import min_peak_plan
from solvers.offload import least_peak_offloading, solve_offloading
from solvers.reference import reference_plan

__all__ = ["backend", "compile", "compile_blocks", "named_backend", "named_plans", "PlannerBackend", "GraphPlan", "solve_graph", "replay_graph"]


@dataclass(frozen=True)
class GraphPlan:
    """The plan of one joint graph: its problem, the solver's decision, and estimates."""

    fingerprint: str
    problem: Problem
    decision: Decision
    step_seconds: float  # estimated runtime of the step without recomputation
    plan_seconds: float  # problem building and solving, wall time
    estimator: str  # the estimator that priced the graph, as reports name it


def autocast_state() -> tuple[tuple[str, torch.dtype], ...]:
    """The ``torch.autocast`` in force: ``(device type, type)`` per device type it is on for."""
    return tuple((device, torch.get_autocast_dtype(device)) for device in ("cpu", "cuda")
                 if torch.is_autocast_enabled(device))


def _autocast_text(state: tuple[tuple[str, torch.dtype], ...]) -> str:
    if not state:
        return "outside torch.autocast"
    return "inside " + " and ".join(f"torch.autocast({device!r}, dtype={dtype})" for device, dtype in state)


def solve_graph(joint: JointGraph, config: PlannerConfig, held_bytes: int = 0, repeats: int = 1,
                rest_bytes: int | None = None, beside_backward: int = 0) -> GraphPlan:
    """Estimate, build the problem, resolve the budget and solve, for one joint graph.

    ``held_bytes`` are kept alive while this graph runs by graphs that ran before it in the
    step (their saved values and outputs): an absolute budget bounds the step's peak, so this
    graph gets what they leave of it. A fraction is of this graph's own range. ``repeats`` is
    how many times the graph's forward runs before its backward (the blocks of a model compiled
    block by block): the peak the budget bounds, and a fraction's range, count the saved
    values of every run. ``rest_bytes``: what the rest of the step needs between the graph's
    forward and its backward, and ``beside_backward``: what it keeps alive during that backward,
    where a step has been seen (:func:`planner.build.build_problem`).

    A graph solved before with the same settings reuses that decision (:mod:`planner.decisions`).
    Under ``torch.distributed``, the ranks check that they compiled the same graph and rank 0
    decides for all of them (:mod:`planner.distributed`).
    """

    def solve(problem: Problem, estimator: Estimator) -> Decision:
        budget = config.budget
        fuse = config.codegen == "inductor"
        split, theirs = (pytorch_split(joint, problem, fuse) if budget.fraction is not None and config.fast_end == "pytorch"
                         else (None, {}))
        seconds, rule = config.solver_time_limit(len(problem), theirs.get(PYTORCH_SPLIT_SECONDS))
        solver = configured_solver(config, problem, seconds)
        exact = exact_frugal_search(config, solver, problem, held_bytes)
        least = min_peak_plan(problem, solver.time_limit) if exact else None
        nbytes = budget.resolve(problem, least.plan.peak_bytes if least else None, theirs.get(PYTORCH_PEAK))
        if budget.nbytes is not None:
            nbytes = max(0, nbytes - held_bytes)
        settings = dict(frugal=least.plan if least else None, frugal_proven=bool(least and least.optimal),
                        starts={"pytorch split": split} if split is not None else None)
        try:
            decision = solver.solve(problem, nbytes, **settings)
        except InfeasibleBudget as below:
            if not offload_goes_lower(joint, config, solver):
                raise
            # offloading may reach below the least peak without it: start from that plan
            decision = replace(solver.solve(problem, below.min_feasible_bytes, **settings), budget_bytes=nbytes)
        if budget.fraction == 0.0:
            decision = least_peak_polish(joint, problem, decision, fuse)
        if budget.fraction == 1.0 and split is not None:
            timeline = simulated_timeline(joint, problem, decision.saved, fuse)
            kernels = None if PYTORCH_KERNELS not in theirs else (timeline.kernels, theirs[PYTORCH_KERNELS])
            decision = prefer_pytorch_split(problem, decision, split, (timeline.peak, theirs[PYTORCH_SIMULATED_PEAK]),
                                            kernels=kernels)
        if config.offload == "auto":
            decision = auto_offload(joint, problem, config, solver, estimator, decision)
        limit = {TIME_LIMIT: {"seconds": seconds, "rule": rule}}
        if least is not None:  # where budget 0 lies, and whether the work clock ended its search
            limit[FRUGAL_SEARCH] = {"peak_bytes": int(least.plan.peak_bytes), "proven": bool(least.optimal),
                                    "clock": least.stats.get("clock"), "cache": least.stats.get("cache")}
        return replace(decision, stats={**decision.stats, **theirs, **limit})

    def decide(problem: Problem, estimator: Estimator) -> Decision:
        agree_on_graph(joint.fingerprint)
        kept = partial(_fits, problem, "a decision kept in the cache", "it is solved again")
        received = partial(_fits, problem, "rank 0's decision", "give every rank the same model and settings")

        def on_rank0() -> Decision:  # the deciding rank alone hashes the key and looks it up
            key = decision_key(joint, config, held_bytes, repeats, rest_bytes, beside_backward)
            return reuse_or_solve(key, lambda: solve(problem, estimator), kept)

        return decide_on_rank0(on_rank0, received)

    return _plan_graph(joint, config, decide, repeats, rest_bytes, beside_backward)


PYTORCH_PEAK = "pytorch_split_peak_bytes"  # Decision.stats: the peak of PyTorch's own split of the graph
# Decision.stats: the simulated peak of PyTorch's own modules for the graph (planner.memory.simulate)
PYTORCH_SIMULATED_PEAK = "pytorch_split_simulated_peak_bytes"
PYTORCH_SPLIT_SECONDS = "pytorch_split_seconds"  # Decision.stats: the seconds PyTorch's partitioner took on the graph
PYTORCH_KERNELS = "pytorch_split_kernels"  # Decision.stats: the kernels PyTorch's split runs (Timeline.kernels)
TIME_LIMIT = "time_limit"  # Decision.stats: the solver's time limit on the graph and the rule that set it
FRUGAL_SEARCH = "frugal_search"  # Decision.stats: the exact least-peak search budget 0 resolved against, where it ran


@dataclass(frozen=True)
class _Split:
    """What the planner keeps of PyTorch's split of one graph: what it saves, and the peak of
    its modules simulated as the planner's predictions are."""

    names: list[str]
    simulated_peak: int
    seconds: float  # PyTorch's partitioner's wall time on the graph
    kernels: int = 0  # its modules' kernels (Timeline.kernels)


_PYTORCH_SPLITS: dict[tuple[str, bool], _Split] = {}  # (graph fingerprint, fuse) -> PyTorch's split
# the modules of the split weighed last, by the id of the joint graph they were made of, for the
# compile that planned that very graph to take once instead of splitting it again (one slot, so
# nothing else keeps graphs alive; a graph traced again, as plan() does, is split again)
_LAST_SPLIT_MODULES: dict[int, tuple[JointGraph, fx.GraphModule, fx.GraphModule]] = {}
FAST_END_CHOICE = "fast_end_choice"  # Decision.stats: budget 1.0 took PyTorch's split over the solver's plan, and why
FAST_END_KERNELS = "fast_end_kernels"  # Decision.stats: at budget 1.0, the kernels of the solver's plan and of the split
# Budget 1.0 keeps the solver's plan over PyTorch's split only where it holds clearly less: a
# predicted peak lower by more than the memory model's own tolerance at the fast end (the 3% of
# bench/zoo.py's target (d); measured errors there reach 2.9%). Time estimates do not decide it:
# on an H100, plans of about the split's peak that the roofline priced faster measured 3-32%
# slower than torch.compile (Llama, Qwen2, T5, ResNet-50, ConvNeXt, EfficientNet: inductor fuses
# the split's recomputation into kernels it runs anyway, and a host-bound step pays per kernel),
# while the split compiled the planner's way measured as torch.compile does. The split is what
# torch.compile runs at its default budget, which recomputes only cheap fusible ops. Nor is a plan
# that holds clearly less kept where it is estimated slower than the split: on an H200, Qwen2's
# plan 7% under the split's peak, estimated slower, measured 1.035x torch.compile's time.
SPLIT_PEAK_MARGIN = 0.03


def prefer_pytorch_split(problem: Problem, decision: Decision, split: Evaluation,
                         simulated: tuple[int, int] | None = None, kernels: tuple[int, int] | None = None) -> Decision:
    """``decision``, or at budget 1.0 PyTorch's own ``split`` where the solver's plan does not hold
    clearly less (:data:`SPLIT_PEAK_MARGIN`) or is estimated slower than the split (the solver's
    fast end may give up a little time for bytes, :data:`planner.bounds.FAST_END_SLACK`; against
    the split, which torch.compile runs, it may not). The solver is still named, as what ran;
    ``stats["fast_end_choice"]`` says the split was taken and why, with the solver's plan's
    figures, and the status is ``heuristic`` (the split is no optimum of the objective; ``gap``
    bounds it where the solver's gap is known).

    Budget 1.0 resolves to the lower of the fast end's peak and the split's, so where the fast
    end holds a little less (GPT-2's loss head, by 0.05% on an H100's prices) the split is over
    that budget; it is still taken, the budget being the split's peak then, since a fraction
    names no bytes: the margin alone decides.

    ``simulated``: the peaks of the solver's plan and of the split as the planner predicts them
    (:func:`planner.memory.simulate` of the modules each compiles: the emitter's, and PyTorch's
    own), which the margin then compares instead of the problem's figures. The problem prices
    the split through the forward nodes its saved values are named by, which can hold more than
    PyTorch's modules do (on an H100, Qwen2's split was priced 5% over torch.compile's measured
    peak, and the solver's plan, 0.2% under it as measured, ran 1.4% slower).

    ``kernels``: the kernels the solver's plan and the split run (:func:`planner.memory.kernel_count`
    of each one's modules). A plan that runs more than the split gives way to it however it is
    priced: each extra kernel reads again what it recomputes, where the estimates had it fused, and
    pays a launch on a step the host may bound. On an H200, Gemma2's plan 19% under the split's
    peak, priced 26% cheaper in recomputation, ran 411 launches against torch.compile's 374 and
    1.038x its time (GPU busy 1.077x); the solver's plans that stood and ran faster ran fewer
    (T5: 667 against 805, 0.78-0.88x), and Mixtral's, 1.04-1.08x, more (409 against 391)."""
    ours, theirs = simulated if simulated is not None else (decision.peak_bytes, split.peak_bytes)
    figures = "simulated" if simulated is not None else "by the problem"
    smaller = ours < (1 - SPLIT_PEAK_MARGIN) * theirs
    more_kernels = kernels is not None and kernels[0] > kernels[1]
    counted = {} if kernels is None else {FAST_END_KERNELS: {"solver": kernels[0], "split": kernels[1]}}
    if smaller and decision.seconds <= split.seconds and not more_kernels:
        return replace(decision, stats={**decision.stats, **counted})
    bound = None if decision.gap is None else decision.seconds * (1 - decision.gap)
    gap = None if bound is None else (0.0 if split.seconds <= 0 else max(0.0, 1 - bound / split.seconds))
    if not smaller:
        reason = f"not {SPLIT_PEAK_MARGIN:.0%} less; closer than that, the estimates cannot tell the two apart"
    elif decision.seconds > split.seconds:
        reason = "estimated slower: budget 1.0 buys no memory with time"
    else:
        reason = (f"but runs {kernels[0]} kernels against the split's {kernels[1]}: budget 1.0 buys no memory "
                  "with kernels the estimates take as fused")
    why = (f"the solver's plan ({decision.status}) held {ours} bytes ({figures}) at an estimated "
           f"{decision.seconds:.3g} s against the split's {theirs} at {split.seconds:.3g} s, " + reason)
    if split.peak_bytes > decision.budget_bytes:
        why += f"; the budget is the split's peak, over the fast end's {decision.budget_bytes} bytes"
    return _with_plan(problem, decision, split, budget_bytes=max(decision.budget_bytes, split.peak_bytes),
                      status=Status.HEURISTIC, gap=gap,
                      stats={**decision.stats, **counted, FAST_END_CHOICE: {"plan": "pytorch split", "why": why,
                                                                 "solver_peak_bytes": decision.peak_bytes,
                                                                 "solver_seconds": decision.seconds,
                                                                 "solver_status": decision.status,
                                                                 "compared": {"solver": ours, "split": theirs,
                                                                              "figures": figures}}})


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
    return _with_plan(problem, decision, plan, gap=gap, stats={**decision.stats, "polish": note})


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


def _with_plan(problem: Problem, decision: Decision, plan: Evaluation, **changes: Any) -> Decision:
    """``decision`` saving what ``plan`` saves, with ``plan``'s figures, and ``changes``."""
    return replace(decision, saved=tuple(problem.names[i] for i in np.flatnonzero(plan.saved)),
                   memory_bytes=plan.memory_bytes, peak_bytes=plan.peak_bytes,
                   recompute_seconds=plan.recompute_seconds, save_seconds=plan.save_seconds, **changes)


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
    return (replace(plan, decision=_with_plan(plan.problem, plan.decision, evaluation,
                                              stats={**plan.decision.stats, "polish": note})),
            {**info, "outcome": "restored"})


# Budget 0: the most simulations spent keeping the polish sweeps' saves that leave the predicted
# peak as it was (each emits and simulates the graph: on the H200 machine's CPU about 1.1 s on the
# zoo's ViT and 2.6 s on ResNet-50, before the simulation was made a third faster)
POLISH_CHECKS = 12
# ... and the share by which the kept saves may raise the simulated peak of the solver's answer
POLISH_PEAK_SLACK = 0.002


def compiles_as_pytorch(decision: Decision) -> bool:
    """Whether a graph planned with ``decision`` is split by PyTorch's own partitioner and
    compiled as torch.compile compiles it (inductor's own settings; :func:`planner._torch_compat.
    pytorch_split_modules`): where budget 1.0 took PyTorch's split (:func:`prefer_pytorch_split`)
    and nothing is offloaded. The plan is then torch.compile's step, not a copy of it made by the
    emitter: on an H100, the split emitted by the planner and compiled with the planner's inductor
    settings measured up to 4% slower than torch.compile's (GPT-2 at 1.0, 13.7 against 13.2 ms)."""
    return decision.stats.get(FAST_END_CHOICE, {}).get("plan") == "pytorch split" and not decision.offloaded


def _pytorch_modules(joint: JointGraph, problem: Problem,
                     decision: Decision) -> tuple[fx.GraphModule, fx.GraphModule] | None:
    """PyTorch's partitioner's own split of ``joint`` (:func:`compiles_as_pytorch`): the modules
    weighed when this graph's plan was made, where they were the last weighed (the same call on
    the same graph, so the same modules), else split again. None, with a warning, where that
    fails here, or where the split saves other values than ``decision`` (a plan file made with
    another torch): the planner then emits the decision's saved set itself, compiled its own way."""
    weighed = _LAST_SPLIT_MODULES.pop(id(joint), None)  # the slot holds its graph: the id names no other
    if weighed is not None:
        return weighed[1:]
    try:
        forward, backward, names = _split_of(joint, problem, fuse=True)
        saved = named_plan(problem, names).saved
    except Exception as err:  # PyTorch's partitioner is private; the plan stands without it
        warnings.warn(f"PyTorch's partitioner failed to split this graph ({type(err).__name__}: {err}); the planner "
                      "emits PyTorch's saved set itself, compiled with the planner's inductor settings", stacklevel=2)
        return None
    theirs = {problem.names[i] for i in np.flatnonzero(saved)}
    if theirs != set(decision.saved):
        warnings.warn(f"PyTorch's split of this graph saves other values than the plan, which took that split "
                      f"({len(theirs ^ set(decision.saved))} differ; a plan file made with another torch?); the "
                      "planner emits the plan's saved set itself, compiled with the planner's inductor settings",
                      stacklevel=2)
        return None
    return forward, backward


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


def pytorch_split(joint: JointGraph, problem: Problem, fuse: bool = True) -> tuple[Evaluation | None, dict[str, Any]]:
    """PyTorch's own split of ``joint`` (``torch.compile``'s at its default budget) as the
    planner prices it, and what the decision's stats say of it: ``{PYTORCH_PEAK: peak bytes,
    PYTORCH_SIMULATED_PEAK: its modules' simulated peak}``, or where that split cannot be had or
    read as a plan of ``problem``, ``(None, {"pytorch_split": why})`` (a warning says so, and
    budget 1.0 is the planner's own fast end)."""
    try:
        found = _pytorch_split(joint, problem, fuse)
        split = named_plan(problem, found.names)
    except Exception as err:  # PyTorch's partitioner is private and may fail on graphs the planner takes
        why = f"{type(err).__name__}: {err}"
        warnings.warn(f"PyTorch's own split of this graph failed ({why}); budget 1.0 is the planner's fast end "
                      "alone (fast_end='model')", stacklevel=2)
        return None, {"pytorch_split": f"failed ({why})"}
    return split, {PYTORCH_PEAK: split.peak_bytes, PYTORCH_SIMULATED_PEAK: found.simulated_peak,
                   PYTORCH_SPLIT_SECONDS: found.seconds, PYTORCH_KERNELS: found.kernels}


def pytorch_split_plan(joint: JointGraph, problem: Problem, fuse: bool = True) -> Evaluation:
    """PyTorch's own split of ``joint`` as a plan of ``problem``: what it saves, named by the
    forward nodes of ``problem`` (a ``detach`` it moved into the forward by the node it reads;
    :func:`planner.bounds.named_plan` takes views to their bases)."""
    return named_plan(problem, _pytorch_split(joint, problem, fuse).names)


def _pytorch_split(joint: JointGraph, problem: Problem, fuse: bool) -> _Split:
    """PyTorch's split of ``joint`` as handed over (:meth:`JointGraph.given_module`), split once
    per graph in a process (kept by fingerprint: a notebook sweeping budgets, a graph planned
    again for the step seen); ``fuse`` as for :func:`planner.memory.simulate`."""
    key = (joint.fingerprint, fuse)
    found = _PYTORCH_SPLITS.get(key)
    if found is None:
        start = time.perf_counter()
        forward, backward, names = _split_of(joint, problem, fuse)
        seconds = time.perf_counter() - start
        timeline = simulate(forward, backward, joint.num_fwd_outputs, fuse=fuse)
        found = _Split(names, timeline.peak, seconds, timeline.kernels)
        _PYTORCH_SPLITS[key] = found
        _LAST_SPLIT_MODULES.clear()
        _LAST_SPLIT_MODULES[id(joint)] = joint, forward, backward
    return found


def _split_of(joint: JointGraph, problem: Problem,
              fuse: bool) -> tuple[fx.GraphModule, fx.GraphModule, list[str]]:
    """PyTorch's partitioner's modules for ``joint`` as handed over, with inductor's arguments
    (:attr:`JointGraph.partition_kwargs`), and what they save, named by nodes of ``problem``.
    With ``fuse``, their widening casts that inductor would store read their narrow input
    stored instead, as the emitter's do (:func:`planner.emit.store_narrow_casts`)."""
    forward, backward = _torch_compat.pytorch_split_modules(joint.given_module(), list(joint.joint_inputs),
                                                            joint.num_fwd_outputs, **joint.partition_kwargs)
    names, inputs = problem.names, problem.inputs
    inputs_of = {name: [names[k] for k in inputs[i]] for i, name in enumerate(names)}
    saved = _torch_compat.split_saved_names(forward, backward, known=set(names), inputs_of=inputs_of)
    if fuse:
        store_narrow_casts(forward, backward, convolutions_laid_out([*joint.primals, *joint.forward_nodes]))
    return forward, backward, saved


def simulated_peak(joint: JointGraph, problem: Problem, saved: tuple[str, ...], fuse: bool = True) -> int:
    """The simulated peak (:func:`planner.memory.simulate`) of the modules the emitter makes of
    ``joint`` saving ``saved``: what the planner predicts for that plan. ``joint`` is left as is."""
    return simulated_timeline(joint, problem, saved, fuse).peak


def simulated_timeline(joint: JointGraph, problem: Problem, saved: tuple[str, ...], fuse: bool = True,
                       released: Collection[int] = ()) -> Timeline:
    """:func:`simulated_peak`'s whole timeline, with what is alive at its peak and the kernels
    the modules run; ``released``: the places of the outputs the caller frees before the
    backward (``JointGraph.released``), as the backend counts its graphs."""
    with _torch_compat.lazy_graph_modules():  # walked, never run
        forward, backward = emit(joint.copy(), problem, saved, fuse=fuse)
        return simulate(forward, backward, joint.num_fwd_outputs, fuse=fuse, released=released)


def configured_solver(config: PlannerConfig, problem: Problem, time_limit: float | None = None) -> Solver:
    """The solver ``config`` names, with its options and ``time_limit``, by default its time limit
    for ``problem`` (:meth:`PlannerConfig.solver_seconds`)."""
    seconds = config.solver_seconds(len(problem)) if time_limit is None else time_limit
    return get_solver(config.solver, time_limit=seconds, **config.solver_options)


def exact_frugal_search(config: PlannerConfig, solver: Solver, problem: Problem, held_bytes: int = 0) -> bool:
    """Whether planning this graph runs the exact least-peak search (``config.frugal_search``):
    where it changes the answer, budget 0 with an exact solver or an absolute budget below the
    frugal reference's peak given to one; always with ``"exact"``; never with ``"reference"``."""
    if config.frugal_search != "auto":
        return config.frugal_search == "exact"
    if not solver.exact:
        return False
    budget = config.budget
    if budget.fraction is not None:
        return budget.fraction == 0.0
    below = budget.nbytes - held_bytes
    return below < runtime_optimal_plan(problem).peak_bytes and below < reference_plan(problem).peak_bytes


def frugal_floor(config: PlannerConfig, problem: Problem, held_bytes: int = 0,
                 time_limit: float | None = None) -> Evaluation:
    """The frugal end (budget 0) that planning this graph with ``config`` uses: the exact
    least-peak plan where :func:`exact_frugal_search` says it runs (kept once searched), else the
    frugal reference. ``time_limit``: the one the graph was planned with
    (``Decision.stats["time_limit"]``), so that the search kept then answers; by default the
    config's for the problem without PyTorch's partition time."""
    solver = configured_solver(config, problem, time_limit)
    if exact_frugal_search(config, solver, problem, held_bytes):
        return min_peak_plan(problem, solver.time_limit).plan
    return reference_plan(problem)


def replay_graph(joint: JointGraph, config: PlannerConfig, decision: Decision, repeats: int = 1) -> GraphPlan:
    """A GraphPlan for a decision solved before (a plan file): checked whole, not solved again.

    Raises
    ------
    PlanFileError
        If the decision names nodes this graph lacks or does not give the backward what it needs.
    """

    def check(problem: Problem, _: Estimator) -> Decision:
        return _fits(problem, "the stored plan", "delete the plan file to plan again", decision)

    return _plan_graph(joint, config, check, repeats)


def _fits(problem: Problem, what: str, fix: str, decision: Decision) -> Decision:
    """``decision`` if it names only nodes of ``problem`` and gives the backward what it needs.

    Raises
    ------
    PlanFileError
        Naming ``what``, the node that does not fit, and the ``fix``.
    """
    try:
        evaluate_names(problem, decision.saved)
    except InfeasibleDecision as err:
        raise PlanFileError(f"{what} does not fit this graph: {err}; {fix}") from None
    return decision


def _plan_graph(joint: JointGraph, config: PlannerConfig, decide: Callable[[Problem, Estimator], Decision],
                repeats: int = 1, rest_bytes: int | None = None, beside_backward: int = 0) -> GraphPlan:
    """Estimate and build the problem, then ``decide`` on it; timed as a whole."""
    start = time.perf_counter()
    estimator = get_estimator(config.estimator, **config.estimator_options)
    problem = build_problem(joint, estimator, fuse=config.codegen == "inductor", repeats=repeats, rest_bytes=rest_bytes,
                            beside_backward=beside_backward)
    decision = decide(problem, estimator)
    return GraphPlan(joint.fingerprint, problem, decision, estimate_step_seconds(joint, estimator),
                     time.perf_counter() - start, str(estimator))


@dataclass
class _Part:
    """What the backend keeps of one part of the step to plan it again: the graph dynamo gave
    it, its joint graph, its place in ``graphs``, and how it was planned."""

    gm: fx.GraphModule | None
    joint: JointGraph | None = None
    index: int = -1
    repeats: int = 1
    rest_bytes: int | None = None
    beside_backward: int = 0
    grad_bytes: int | None = None  # gradients one run's backward leaves in leaf tensors (parameters), from a real run
    # every leaf tensor its runs of a step read, by storage: their gradients are all alive once
    # the runs' backwards are done (a layer compiled once and run for each layer of a model)
    grad_leaves: dict = field(default_factory=dict)
    seen: bool = False  # planned again for a step seen (or found right as it was)
    plan: GraphPlan | None = None  # the plan its compile for the step seen uses
    # places of the outputs a run's caller had freed when its backward began (None: not seen yet),
    # and the emitted modules kept until then to count its memory again (planner.memory.simulate)
    released: tuple[int, ...] | None = None
    simulated: tuple | None = None
    waiting: Any = ()  # its compiled graph's runs waiting for their backward (_CountedRuns.waiting)
    last_step: int | None = None  # the backend's count of steps at its latest training run
    # bytes alive as its runs began that no planned graph holds (code outside the compiled graphs),
    # measured on a CUDA device in the step ``outside_step`` (PlannerBackend._measure_outside)
    outside: int = 0
    outside_step: int | None = None
    # where planned again with the polish's saves restored (restore_polish_drops): the compiled
    # graph, plan, timeline, emitted modules and code report it replaced, and that code's peak
    restored_from: tuple | None = None


# A frame compiled this many times is warned about (:meth:`PlannerBackend._warn_on_recompiles`):
# its inputs' shapes keep changing, and each shape is planned on its own.
RECOMPILES_WARNED = 3


class PlannerBackend:
    """A torch.compile backend that plans each joint graph it is given.

    With ``fixed`` set, the graph must be the one that plan was made for (same fingerprint) and
    no solver runs. ``graphs`` lists a :class:`GraphPlan` per planned graph, in compile order,
    and ``timelines`` the simulated memory of each emitted pair of modules.

    ``repeats`` is how many times each of its graphs runs its forward before its backward in one
    step (:func:`compile_blocks` gives the number of blocks). The compiled graphs count it as
    they run, in the first :data:`COUNTED_STEPS` steps: ``runs`` holds, per part of the step,
    the most runs seen waiting for their backward at once.

    A graph is planned as it compiles, before the graphs after it in the step exist. Once a step
    has run (``config.replan``), the first run of a graph after its own backward began plans it
    again for what that step showed: the times it ran before its backward, and, for a graph that
    hands its outputs on, what the graphs after it needed while its saved values waited
    (:meth:`rest_after`) instead of its own least peak. Where the plan changes, the graph is
    compiled again (once) and the new modules run from then on; ``replanned`` lists those parts.
    That plan also gets back the saves budget 0's polish dropped where the code inductor wrote for
    the graph, counted stored where the memory model fused (:meth:`compiled_timelines`), holds
    more than :data:`STORES_TOLD` over the plan's peak and more than the plan with them saved is
    predicted to (:func:`restore_polish_drops`).

    ``whole_model`` (set by :func:`compile`): the backend compiles a whole model, where a graph
    run more often than it was planned for is a frame a graph break resumes in, run once per
    layer; it is planned again for its runs without a warning (a warning still says when it
    cannot be, and for blocks compiled one by one, names :func:`compile_blocks`).

    ``fusions_refused`` (``refused``, ``refused_across``) counts, over its compiled graphs, the
    fusions inductor would have made in planned backwards that the compile guard refused
    (:func:`planner._torch_compat.fusion_distance_guard`; inductor codegen only).

    ``kept`` holds, per planned graph (as ``graphs``), what inductor's code for each of its
    phases compiled so far keeps (:func:`planner._torch_compat.kept_buffers`), and
    :meth:`stores_against_inductor` where that differs from the simulation.
    """

    def __init__(self, config: PlannerConfig, fixed: GraphPlan | None = None, repeats: int = 1) -> None:
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            from planner.errors import ConfigError

            raise ConfigError(f"repeats={repeats!r} is invalid; give the number of times a graph runs before its "
                              "backward in one step (a positive int, 1 for a model compiled whole)")
        self.config = config
        self.fixed = fixed
        # with ``fixed``: the autocast the plan's graph was captured under, and the one of the
        # graph compiling now (a new autocast makes another graph: its casts and saved bytes),
        # read as dynamo hands the graph over: AOTAutograd partitions it with autocast off
        self.fixed_autocast = self._autocast = autocast_state()
        self.repeats = repeats
        self.runs: dict[Any, int] = {}
        self.graphs: list[GraphPlan] = []
        self.timelines: list[Timeline] = []
        self.kept: list[dict[str, Any]] = []
        # per planned graph, copies of its emitted modules as simulated (inductor rewrites its own)
        self._emitted: list[list | None] = []
        # per planned graph, its latest compiled timeline, with the emitted modules and facts it was simulated for
        self._compiled_seen: dict[int, tuple] = {}
        self.replanned: list[Any] = []
        # per graph whose compiled code held more than its plan, the polish's saves tried again (restore_polish_drops)
        self.polish_restores: list[dict[str, Any]] = []
        # the latest timeline of each part of the step (a frame's graph, or each graph one compile
        # of a frame hands over), in the order they first compiled: a recompile of a frame (new
        # shapes) replaces its graphs in the step, it does not add to them
        self._step: dict[Any, Timeline] = {}
        self._parts: dict[Any, _Part] = {}
        self._compiling: tuple[int, int] | None = None  # dynamo's (frame, compile) ids of the graph compiling
        self._frame_compiles: dict[int, set[int]] = {}  # per dynamo frame id, the compiles of it seen
        self._place = 0  # its place among the graphs that compile handed over
        self._variant = False  # a compile of a frame whose earlier compile runs in the same step
        self._steps, self._backward_begun = 0, False  # training steps seen, told apart by backwards
        # the step measured, the device's allocated bytes as its first run began, and the bytes
        # the planned graphs that ran since are predicted to hold (see _measure_outside)
        self._step_start: tuple[int, int, int] | None = None
        self._replanning: Any = None  # the part planned again now, outside dynamo's compile
        # fusions inductor would have made in the planned backwards that the compile guard refused
        # (planner._torch_compat.fusion_distance_guard), over every graph compiled so far
        self.fusions_refused = SimpleNamespace(refused=0, refused_across=0)
        self.whole_model = False  # compiles a whole model (planner.compile), not blocks one by one
        self._compile: Callable = make_backend(self.partition, config.codegen, config.inductor_settings(),
                                               self.fusions_refused)

    def partition(self, joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any):
        """AOTAutograd partition function: plan the joint graph and split it accordingly. Where
        the plan is PyTorch's own split (:func:`compiles_as_pytorch`), the split is PyTorch's
        partitioner's own modules, compiled as torch.compile compiles them."""
        joint_module = _torch_compat.merge_common_subexpressions(joint_module)
        joint = JointGraph(joint_module, num_fwd_outputs, list(joint_inputs), kwargs)
        key = self._step_key
        part = self._parts.get(key)
        if part is not None and part.released:
            joint.released = part.released  # seen on a step: not held through its backward
        if part is not None and part.plan is not None and part.plan.fingerprint == joint.fingerprint:
            graph_plan = part.plan  # planned again for the step seen, on this graph's copy
        elif self.fixed is None:
            repeats, rest, beside = ((part.repeats, part.rest_bytes, part.beside_backward) if part is not None
                                     else (self.repeats, None, 0))
            graph_plan = solve_graph(joint, self.config, self._held_before(key), repeats, rest, beside)
        elif joint.fingerprint == self.fixed.fingerprint:
            graph_plan = self.fixed
        elif self._autocast != self.fixed_autocast:
            raise PlanFileError(
                f"the plan was made for the model {_autocast_text(self.fixed_autocast)} and it now runs "
                f"{_autocast_text(self._autocast)}, which makes another graph (autocast's casts, the bytes of "
                "what it saves); call plan() inside the same autocast as the training step's forward"
            )
        else:
            raise PlanFileError(
                f"the compiled graph (fingerprint {joint.fingerprint}) is not the one the plan was made for "
                f"({self.fixed.fingerprint}); the model, its input shapes or the codegen changed, so plan again"
            )
        if part is not None and self._replans(key) and not part.seen:
            part.joint = joint.copy()  # before the split below consumes the joint graph
        decision = graph_plan.decision
        split = (_pytorch_modules(joint, graph_plan.problem, decision)
                 if self.config.codegen == "inductor" and compiles_as_pytorch(decision) else None)
        fuse = self.config.codegen == "inductor"
        if split is not None:
            forward, backward = split
        else:
            transfers = {n: Transfer(*decision.transfers.get(n, (None, None))) for n in decision.offloaded}
            forward, backward = emit(joint, graph_plan.problem, decision.saved, transfers, fuse=fuse)
        timeline = simulate(forward, backward, joint.num_fwd_outputs, fuse=fuse, released=joint.released)
        kept: dict[str, Any] = {}  # filled as inductor compiles each module
        emitted = None
        recount = part is not None and part.released is None  # to count again once a step shows what it frees
        # one copy of the modules as simulated serves both (inductor rewrites its own; simulate reads only)
        copies = (copy_module(forward), copy_module(backward)) if fuse or recount else None
        if fuse:
            _torch_compat.report_kept_buffers(forward, kept, "forward")
            _torch_compat.report_kept_buffers(backward, kept, "backward")
            emitted = [*copies, joint.num_fwd_outputs, joint.released]
        if recount:
            part.simulated = (*copies, joint.num_fwd_outputs, fuse)
        if self._replanning is not None and part is not None and part.index >= 0:  # replaces its earlier plan
            self.graphs[part.index], self.timelines[part.index], self.kept[part.index] = graph_plan, timeline, kept
            self._emitted[part.index] = emitted
        else:
            self.graphs.append(graph_plan)
            self.timelines.append(timeline)
            self.kept.append(kept)
            self._emitted.append(emitted)
            if part is not None:
                part.index = len(self.graphs) - 1
        self._step[key] = timeline
        return forward, backward

    @property
    def held_bytes(self) -> int:
        """Bytes the graphs before this one in the step keep alive once their forwards ran
        (saved values and outputs): the graphs of one step run their forwards in the order their
        frames first compiled, then their backwards in reverse, so a later graph runs while
        these are held. A graph compiled again for its frame (new shapes) counts once."""
        return self._held_before(self._step_key)

    @property
    def _live(self) -> dict[Any, Timeline]:
        """The parts of ``_step`` that still run: a part that ran no training run in the latest
        step or the one before it was superseded (a compile of its frame kept apart as a variant
        of the same step, which dynamo later sends that step's runs past) and no longer counts."""
        return {part: timeline for part, timeline in self._step.items()
                if part not in self._parts or self._parts[part].last_step is None
                or self._parts[part].last_step >= self._steps - 1}

    def _held_before(self, key: Any) -> int:
        held = 0
        for part, timeline in self._live.items():
            if part == key:
                break
            held += self._repeats_of(part) * timeline.held_after_forward
        return held + self._outside(key)

    def _outside(self, part: Any) -> int:
        return self._parts[part].outside if part in self._parts else 0

    def _measure_outside(self, key: Any, args: tuple) -> None:
        """Before a training run of ``key``'s graph: the bytes the device has allocated since the
        step's first run began, less what the planned graphs that ran since hold, are held by
        code outside the compiled graphs (eager code between graph breaks: a mask, a norm, what
        autograd saves for them). Measured on a CUDA device only, in the first
        ``OUTSIDE_MEASURED_STEPS`` steps; the latest of them counts."""
        now = _allocated(args)
        part = self._parts.get(key)
        if now is None or part is None:
            return
        if self._step_start is None or self._step_start[0] != self._steps:
            self._step_start = (self._steps, now, 0)
        step, start, held = self._step_start
        outside = max(0, now - start - held)
        part.outside = outside if part.outside_step != step else max(part.outside, outside)
        part.outside_step = step
        timeline = self._step.get(key)
        self._step_start = (step, start, held + (timeline.held_after_forward if timeline is not None else 0))

    def _planned_repeats(self, part: Any) -> int:
        return self._parts[part].repeats if part in self._parts else self.repeats

    def _repeats_of(self, part: Any) -> int:
        """The runs of ``part`` before its backward: as planned, or as many as a step showed."""
        return max(self._planned_repeats(part), self.runs.get(part, 0))

    @property
    def step(self) -> list[Timeline]:
        """The simulated memory of each graph of the step, in the order they run their forwards
        (the latest compile of each part of each frame)."""
        return list(self._live.values())

    @property
    def predicted_forward(self) -> tuple[int, int]:
        """Predicted peak of the step's forwards, and the bytes they leave alive for the backward."""
        held = sum(self._repeats_of(part) * t.held_after_forward for part, t in self._live.items())
        return self._step_peak(backward=False), held

    def stores_against_inductor(self) -> list[dict[str, dict[str, dict[str, int]]]]:
        """Per planned graph, where the code inductor wrote for each phase compiled so far stores
        values otherwise than the graph's simulation (:func:`planner.memory.stores_against_inductor`):
        what the memory model misses, or counts that inductor does not make."""
        return [self._stores_report(index) for index in range(len(self.timelines))]

    def _stores_report(self, index: int) -> dict[str, dict[str, dict[str, int]]]:
        """:func:`planner.memory.stores_against_inductor` for graph ``index``, with its emitted
        phases' graphs where it has them."""
        emitted = self._emitted[index] if index < len(self._emitted) else None
        graphs = {"forward": emitted[0].graph, "backward": emitted[1].graph} if emitted is not None else None
        return stores_against_inductor(self.timelines[index], self.kept[index], graphs)

    def compiled_timelines(self) -> list[Timeline | None]:
        """Per planned graph, its simulation again with the values inductor's code was seen to
        store that the simulation had computed in their readers (:meth:`stores_against_inductor`)
        counted stored, with the bytes of inductor's buffers; None for a graph whose two phases
        are not both compiled and read (or not compiled by inductor)."""
        return [self._compiled_timeline(index, report) for index, report in enumerate(self.stores_against_inductor())]

    def _compiled_timeline(self, index: int, report: dict | None = None) -> Timeline | None:
        emitted, kept = self._emitted[index], self.kept[index]
        if report is None:
            report = self._stores_report(index)
        if emitted is None or set(kept) != {"forward", "backward"} or any("error" in r for r in report.values()):
            return None
        forward, backward, outputs, released = emitted
        stored = {(phase, name): nbytes for phase, r in report.items() for name, nbytes in r["unmodelled"].items()}
        seen = self._compiled_seen.get(index)  # the replan, the settling run and reports ask alike
        facts = (tuple(released), tuple(sorted(stored.items())))
        if seen is not None and seen[0] is emitted and seen[1] == facts:
            return seen[2]
        timeline = simulate(forward, backward, outputs, fuse=True, released=released, stored=stored)
        self._compiled_seen[index] = (emitted, facts, timeline)
        return timeline

    def _compiled_peak_over(self, part: _Part) -> int | None:
        """The peak of ``part``'s graph counting what inductor's code stores
        (:meth:`compiled_timelines`), where that is more than :data:`STORES_TOLD` over its plan's;
        else (or where the code is not read yet) None."""
        if not 0 <= part.index < len(self._emitted):
            return None
        try:  # inside a training run: a failure here must not stop the step
            compiled = self._compiled_timeline(part.index)
        except Exception:  # noqa: BLE001 - the plan stands; _tell_stores reports the failure
            return None
        peak = self.timelines[part.index].peak
        return compiled.peak if compiled is not None and compiled.peak > (1 + STORES_TOLD) * peak else None

    def _settle(self, run: "_CountedRuns", part: _Part) -> None:
        """As ``run``'s graph settles (counted, measured and planned again): where it was planned
        again with the polish's saves restored, keep that plan only if its code, counted as
        :meth:`compiled_timelines` counts it, holds less than the code it replaced (else the
        replaced code runs again: what inductor stored was not the drops' doing); then tell the
        user what the code stores (:meth:`_tell_stores`)."""
        before, part.restored_from = part.restored_from, None
        if before is not None and 0 <= part.index < len(self.timelines):
            try:  # inside a training run: a failure here keeps the restored plan
                compiled = self._compiled_timeline(part.index)
            except Exception:  # noqa: BLE001 - _tell_stores reports it
                compiled = None
            peak = (compiled or self.timelines[part.index]).peak
            outcome = "kept" if peak < before[-1] else "reverted"
            self.polish_restores.append({"graph": part.index, "outcome": outcome, "restored_code_peak": peak,
                                         "compiled_peak": before[-1]})
            decision = self.graphs[part.index].decision
            if outcome == "kept" and decision.stats.get(KEY):  # later compiles of the graph start from it
                keep_decision(decision.stats[KEY], decision)
            if outcome == "reverted":
                run.compiled, self.graphs[part.index], timeline, self._emitted[part.index], self.kept[part.index], _ = before
                self.timelines[part.index] = timeline
                if run.part in self._step:
                    self._step[run.part] = timeline
        self._tell_stores(part)

    def _tell_stores(self, part: _Part) -> None:
        """Warn, once a graph's code is written for both phases, where counting what that code
        stores (:meth:`compiled_timelines`) raises the graph's simulated peak by more than
        :data:`STORES_TOLD` over the plan's: the budget was planned on the lower figure."""
        if part.index < 0 or part.index >= len(self._emitted):
            return
        timeline = self.timelines[part.index]
        try:  # inside a training run: a failure here must not stop the step
            report = self._stores_report(part.index)
            compiled = self._compiled_timeline(part.index, report)
        except Exception as err:  # noqa: BLE001 - reported, and the run goes on
            warnings.warn(f"counting what inductor's code for planned graph {part.index} stores failed "
                          f"({type(err).__name__}: {err})", stacklevel=3)
            return
        if compiled is None or compiled.peak <= (1 + STORES_TOLD) * timeline.peak:
            return
        named = sorted(((nbytes, name) for r in report.values() for name, nbytes in r["unmodelled"].items()), reverse=True)
        largest = ", ".join(f"{name} {format_bytes(nbytes)}" for nbytes, name in named[:3])
        warnings.warn(f"inductor's code for planned graph {part.index} stores values the memory model computes "
                      f"inside their readers ({largest}; {len(named)} in all): counted stored, the graph's peak is "
                      f"{format_bytes(compiled.peak)} against the {format_bytes(timeline.peak)} it was planned "
                      f"for ({compiled.peak / timeline.peak - 1:+.1%}). The step's peak so counted is the backend's "
                      "compiled_step_peak; with an absolute memory_budget, lowering it by the difference leaves room for it",
                      stacklevel=3)

    @property
    def compiled_step_peak(self) -> int | None:
        """:attr:`predicted_step_peak` with each graph's :meth:`compiled_timelines` in place of
        its simulation: the step's peak as the memory model counts it once told which values
        inductor's code stores. None until every graph of the step is compiled and read."""
        compiled = self.compiled_timelines()
        index = {key: part.index for key, part in self._parts.items() if part.index >= 0}
        timelines = {}
        for key in self._live:
            timeline = compiled[index[key]] if key in index and index[key] < len(compiled) else None
            if timeline is None:
                return None
            timelines[key] = timeline
        return self._step_peak(timelines=timelines)

    @property
    def predicted_step_peak(self) -> int:
        """Predicted peak activation memory of the step, over the latest graph of each part:
        the largest of each graph's simulated peak plus what the graphs before it hold, and in
        its backward, the gradients the graphs after it left (their backwards ran first). On a
        CUDA device, once a step has run, what code outside the compiled graphs held as each
        graph began counts beside it, forward and backward (eager code between graph breaks
        is freed by its own backward, after the graphs after it ran theirs)."""
        return self._step_peak()

    def _step_peak(self, backward: bool = True, after: Any = None, timelines: dict | None = None) -> int:
        """The largest peak of a graph of the step (its forward's alone, unless ``backward``)
        plus what the graphs before it and its own other runs hold, and during its backward the
        gradients of the graphs after it; only the graphs after the part ``after``, where given;
        with ``timelines`` (part -> timeline) in place of the parts' own."""
        live = self._live if timelines is None else timelines
        parts = list(live)
        held = peak = 0
        before = self._outside(after) if after is not None else 0  # counted with ``after``'s own holds
        for part in parts[parts.index(after) + 1:] if after is not None else parts:
            timeline, repeats = live[part], self._repeats_of(part)
            # its other runs: their saved values, all held while the last run's forward and
            # backward run; their gradients, all alive while the first run's backward runs last
            others = (repeats - 1) * timeline.held_after_forward
            others_grads = max(0, self._grad_bytes(part) - (self._parts[part].grad_bytes or 0)) if part in self._parts else 0
            own = timeline.forward_peak + others
            if backward:
                own = max(own, timeline.backward_peak + self.grads_after(part) + max(others, others_grads))
            outside = max(0, self._outside(part) - before)
            peak = max(peak, held + outside + own)
            held += repeats * timeline.held_after_forward
        return peak

    def _grad_bytes(self, part: Any) -> int:
        """Bytes of the gradients all of ``part``'s runs leave in leaf tensors, each storage once."""
        if part not in self._parts:
            return 0
        found = self._parts[part]
        return max(found.grad_bytes or 0, sum(found.grad_leaves.values()))

    def rest_after(self, part: Any) -> int:
        """Predicted peak of what runs between the forward and the backward of ``part``: the
        graphs after it in the step (their forwards, then their backwards), beside what ``part``
        itself holds, with what code outside the compiled graphs made after it began (measured
        on a CUDA device, see :meth:`predicted_step_peak`)."""
        return self._step_peak(after=part)

    def grads_after(self, part: Any) -> int:
        """Bytes of the gradients that the graphs after ``part`` leave in leaf tensors (their
        parameters' ``.grad``), alive while ``part``'s backward runs after theirs."""
        parts = list(self._live)
        return sum(self._grad_bytes(q) for q in parts[parts.index(part) + 1:])

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        compiling = _torch_compat.compiling_frame()
        # one compile of a frame may hand over several graphs, each its own part of the step
        # (DDP's graph splitting compiles one per gradient bucket): they are told apart by their
        # place in that compile, and a recompile of the frame replaces them place by place
        self._place = self._place + 1 if compiling is not None and compiling == self._compiling else 0
        self._compiling, self._variant = compiling, False
        self._autocast = autocast_state()
        if compiling is not None:
            self._warn_on_recompiles(*compiling)
        earlier = self._parts.get(self._step_key)
        # A recompile of a frame replaces its graphs in the step, unless the earlier compile has
        # runs waiting for their backward: then both run in this step (one code object reached
        # through other modules or another path, as a decorator's wrapper shared by a model's
        # encoder and decoder layers is), and each is its own part, counted and planned apart.
        self._variant = earlier is not None and bool(earlier.waiting)
        key = self._step_key
        self._parts[key] = _Part(gm, repeats=self.repeats)
        compiled = _CountedRuns(self._compile(gm, example_inputs), self, key)
        self._parts[key].waiting = compiled.waiting
        return compiled

    def _warn_on_recompiles(self, frame: int, compile_id: int) -> None:
        """Warn once per frame when dynamo compiles it for the :data:`RECOMPILES_WARNED`-th time:
        every compile is planned at the sizes it was given (a plan counts bytes), so inputs whose
        shapes keep changing pay a plan and an inductor compile per shape, where ``torch.compile``
        alone would compile one graph with symbolic sizes."""
        seen = self._frame_compiles.setdefault(frame, set())
        seen.add(compile_id)
        if len(seen) == RECOMPILES_WARNED:
            warnings.warn(
                f"this code frame has now been compiled and planned {RECOMPILES_WARNED} times (dynamo compiles it again for "
                "new input shapes or other failed guards; TORCH_LOGS=recompiles names them). Plans are made at the "
                "sizes given, so each new input shape costs a plan and a compile: pad inputs to a few fixed lengths "
                "(e.g. bucket sequence lengths to multiples of 64) rather than to the longest in each batch",
                stacklevel=3)

    def _released(self, key: Any, released: tuple[int, ...], outputs: int, dropped: tuple[int, ...] = ()) -> None:
        """The first run of ``key``'s graph began its backward with the outputs at the places
        ``released`` freed (of its ``outputs``), and those at ``dropped`` no longer held by the
        caller: its memory is counted again without them. A dropped output counts as freed
        where its storage is a value the graph saves for its backward, which is what still holds
        it (AOTAutograd saves such an output for the backward as its own tensor); elsewhere
        whatever holds the storage (a view the caller kept, a later graph's saved value) is not
        known to let it go, and it stays counted."""
        part = self._parts.get(key)
        if part is None or part.released is not None:
            return
        simulated, part.simulated = part.simulated, None
        if simulated is not None and dropped:
            own = saved_outputs(simulated[0], simulated[2])
            released = tuple(sorted(set(released) | {k for k in dropped if k in own}))
        # places are the graph's outputs only where the run returned exactly those (no input
        # mutations or aliases AOTAutograd adds or takes away)
        part.released = released if simulated is not None and outputs == simulated[2] else ()
        if part.released and part.index >= 0:
            try:  # inside the step's backward: a failure here must not stop the training step
                timeline = simulate(*simulated[:2], simulated[2], fuse=simulated[3], released=released)
            except Exception as err:  # noqa: BLE001 - reported, and the earlier count kept
                part.released = ()
                warnings.warn(f"counting a graph's memory without the outputs its caller freed failed "
                              f"({type(err).__name__}: {err}); its prediction keeps them", stacklevel=2)
                return
            self.timelines[part.index] = timeline
            if self._emitted[part.index] is not None:
                self._emitted[part.index][3] = released
            if key in self._step:
                self._step[key] = timeline

    def _ran(self, part: Any, waiting: int) -> None:
        """A run of the graph of ``part`` begins its backward while ``waiting`` runs (itself
        included) wait for theirs."""
        if waiting > self.runs.get(part, 0):
            self.runs[part] = waiting
            planned = self._planned_repeats(part)
            # in a whole model (planner.compile), a graph run more often than planned is a frame a
            # graph break resumes in, run once per layer: planned again, as expected, unless it cannot be
            if waiting > planned and not (self.whole_model and self._replans(part)):
                then = (f"it is planned again for {waiting} runs when it next runs" if self._replans(part) else
                        "the saved values of its other runs are outside the memory budget")
                warnings.warn(
                    f"a planned graph ran its forward {waiting} times before its backward, and was planned for "
                    f"{planned}: {then}. For a model compiled block by block, compile the blocks with "
                    f"planner.compile_blocks(blocks, ...), which plans for every block's run", stacklevel=2)

    def _training_run(self, part: _Part) -> None:
        """A training run of ``part``'s graph begins: the first after a backward began (seen by a
        graph still counting its runs) begins a new step, and the part ran in this one."""
        if self._backward_begun:
            self._steps, self._backward_begun = self._steps + 1, False
        part.last_step = self._steps

    def _replans(self, part: Any) -> bool:
        return self.config.replan and self.fixed is None and part in self._parts

    def _plan_again(self, run: "_CountedRuns", inputs: list) -> None:
        """Plan ``run``'s part for the step seen (see the class); compile it again if the plan
        changed. ``inputs``: the arguments of the run about to begin, as example inputs. A
        compile that fails warns and leaves the first plan running."""
        key = run.part
        part = self._parts[key]
        part.seen = True
        joint, gm, part.joint, part.gm = part.joint, part.gm, None, None  # kept for this alone
        if joint is None:
            return
        repeats = self._repeats_of(key)
        old = self.graphs[part.index]
        # the rest of the step after a repeated graph's last run: none where nothing planned runs
        # there (a model compiled block by block), as its other runs count before it is seen
        rest = self.rest_after(key) if hands_on(joint) else None
        if repeats > 1 and not rest:
            rest = None
        seen = repeats, rest, self.grads_after(key), part.released or ()
        planned = part.repeats, part.rest_bytes, part.beside_backward, joint.released
        compiled = self._compiled_peak_over(part)  # what inductor's code was found to hold, where past the plan
        if seen == planned and compiled is None:
            return
        again = old
        if seen != planned:
            part.repeats, part.rest_bytes, part.beside_backward, joint.released = seen
            again = solve_graph(joint, self.config, self._held_before(key), *seen[:3])
            again = replace(again, plan_seconds=old.plan_seconds + again.plan_seconds)
        if compiled is not None:
            dropped = (old.decision.stats.get("polish") or {}).get("dropped") or ()
            restored, info = restore_polish_drops(joint, again, compiled, dropped, self.config.codegen == "inductor")
            self.polish_restores.append({"graph": part.index, **info})
            again = restored or again
        if set(again.decision.saved) == set(old.decision.saved):
            self.graphs[part.index] = again  # the same modules: nothing to compile
            return
        index = part.index
        before = (run.compiled, old, self.timelines[index], self._emitted[index], self.kept[index], compiled)
        self._replanning, part.plan = key, again
        try:
            compiled = self._compile(gm, inputs)
        except Exception as err:  # the first plan keeps running, and the user is told
            part.repeats, part.rest_bytes, part.beside_backward, _ = planned
            warnings.warn(f"planning a graph again for the step seen failed to compile ({type(err).__name__}: "
                          f"{err}); it keeps the plan made when it first compiled. Set replan=False to skip this",
                          stacklevel=3)
            return
        finally:
            self._replanning, part.plan = None, None
        run.compiled = compiled
        self.replanned.append(key)
        if "restored" in (again.decision.stats.get("polish") or {}):
            part.restored_from = before

    @property
    def _part(self) -> tuple[int, ...] | None:
        """The part of the step the graph compiling now is: its frame and place, and for a
        compile of the frame beside an earlier one in the same step, that compile's id too;
        None outside torch.compile's frames."""
        if self._compiling is None:
            return None
        frame, compile_id = self._compiling
        return (frame, self._place, compile_id) if self._variant else (frame, self._place)

    @property
    def _step_key(self) -> Any:
        """The key of the graph compiling now in ``_step`` and ``runs``: its part, or outside
        torch.compile's frames, its number among the planned graphs."""
        if self._replanning is not None:
            return self._replanning
        part = self._part
        return part if part is not None else len(self.timelines)


def _call_inputs(args: tuple) -> list:
    """A compiled graph's inputs, as a call passes them (a boxed call passes one list)."""
    return list(args[0]) if len(args) == 1 and isinstance(args[0], list) else list(args)


def _leaf_grads(inputs: list, gm: fx.GraphModule | None) -> dict[int, int]:
    """The gradients a run's backward leaves in leaf tensors that require one (its parameters,
    as inputs or as attributes of ``gm``): bytes by storage."""
    params = list(gm.parameters()) if gm is not None else []
    return {t.data_ptr(): t.numel() * t.element_size() for t in [*inputs, *params]
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf}


# how far counting what inductor's code stores may raise a graph's simulated peak over its plan's
# before the user is told (PlannerBackend._tell_stores)
STORES_TOLD = 0.03

# the first steps in which what code outside the compiled graphs holds is measured (the replans
# and the predictions read it); later steps skip the allocator's statistics: a dictionary of every
# counter a read, 127 µs a call on the H200 machine's host (scratch timing, torch 2.11)
OUTSIDE_MEASURED_STEPS = 3
# the steps in which each compiled graph counts its runs waiting for their backward (a token and a
# hook on each output's autograd node per run); once a graph has been counted that long, measured
# and planned again, its runs go straight through (on a 2-core CPU, a 12-layer model with a graph
# break in each layer ran its steps 1.25x slower than torch.compile's with the counting on,
# 1.05x with it off: scratch timing, torch 2.13)
COUNTED_STEPS = OUTSIDE_MEASURED_STEPS


class _CountedRuns:
    """A compiled graph that tells its backend how many of its runs wait for their backward
    when one begins it: each training run leaves a token, alive until its backward starts or
    its autograd graph is freed unused. The first run after a backward began, with no run
    waiting, lets the backend plan the graph again for the step it saw.

    Once the graph has been counted for :data:`COUNTED_STEPS` steps, measured (its gradients'
    bytes, the outputs its caller frees) and planned again for the step seen, its runs only
    mark the step they belong to and go straight through: a change in how often it runs
    before its backward after that is not seen (a frame compiled again for new shapes is
    counted afresh)."""

    def __init__(self, compiled: Callable, backend: PlannerBackend, part: Any) -> None:
        self.compiled, self.backend, self.part = compiled, backend, part
        self.waiting: weakref.WeakSet = weakref.WeakSet()
        self._boxed_call = getattr(compiled, "_boxed_call", False)  # dynamo's calling convention
        self.settled: _Part | None = None  # its part, once counted, measured and planned again

    def __call__(self, *args: Any) -> Any:
        backend, settled = self.backend, self.settled
        if settled is not None:
            if torch.is_grad_enabled():
                backend._training_run(settled)
            return self.compiled(*args)
        part = backend._parts.get(self.part)
        if part is not None and torch.is_grad_enabled() and not _fake_call(args):  # a training run
            backend._training_run(part)
            if backend._steps < OUTSIDE_MEASURED_STEPS:
                backend._measure_outside(self.part, args)
            if backend._steps < COUNTED_STEPS:  # each run's own parameters (a layer's, run for each layer)
                part.grad_leaves.update(_leaf_grads(_call_inputs(args), part.gm))
            if (backend._steps >= COUNTED_STEPS and part.grad_bytes is not None and part.released is not None
                    and (part.seen or not backend._replans(self.part))):
                self.settled = part
                backend._settle(self, part)
                return self.compiled(*args)
        replan = (part is not None and not part.seen and not self.waiting and self.part in backend.runs
                  and backend._replans(self.part))
        if part is not None and (part.grad_bytes is None or replan):  # until measured and planned again
            inputs = _call_inputs(args)
            if not any(isinstance(x, torch.Tensor) and _torch_compat.is_fake(x) for x in inputs):
                if part.grad_bytes is None:
                    part.grad_bytes = sum(_leaf_grads(inputs, part.gm).values())
                if replan:
                    backend._plan_again(self, inputs)
        out = self.compiled(*args)
        # every output's node: the backward may reach the run through any of them (an output
        # the step does not use never gets a gradient); a run on fake tensors is a compile's
        tensors = _tensors(out)
        nodes = {id(t.grad_fn): t.grad_fn for t in tensors if t.grad_fn is not None}
        if nodes and not any(_torch_compat.is_fake(t) for t in tensors):
            token = _Run()
            self.waiting.add(token)
            # whether the caller still holds each output when the backward begins, seen once: its
            # storage, and the tensor itself, for an output whose storage a value the graph saves
            # for its backward holds (freed at its last backward reader once the caller drops it)
            watched = part is not None and part.released is None
            outputs = _outputs(out)
            refs = [(weakref.ref(t), _torch_compat.storage_weakref(t)) if isinstance(t, torch.Tensor) else None
                    for t in outputs] if watched else []

            def begin_backward(grad_outputs, token=token, refs=refs, count=len(outputs)):
                self.backend._backward_begun = True
                if token in self.waiting:
                    self.backend._ran(self.part, len(self.waiting))
                    self.waiting.discard(token)
                    if refs:
                        dropped = tuple(k for k, ref in enumerate(refs) if ref is not None and ref[0]() is None)
                        freed = tuple(k for k, ref in enumerate(refs) if ref is not None and ref[1].expired())
                        self.backend._released(self.part, freed, count, dropped)
                        refs.clear()

            for node in nodes.values():
                node.register_prehook(begin_backward)
        return out


def _first_tensor(args: tuple) -> torch.Tensor | None:
    """A run's first tensor argument (:func:`_call_inputs`)."""
    return next((x for x in _call_inputs(args) if isinstance(x, torch.Tensor)), None)


def _allocated(args: tuple) -> int | None:
    """Bytes the CUDA allocator holds for tensors on the device of a run's first tensor
    argument; None off CUDA (no allocator statistics to read), off the process's current
    device (a model spread over devices in one process: one device's figures are not another's)
    and across several ranks, whose plans must not depend on what each rank measures (each
    would plan again on its own)."""
    first = _first_tensor(args)
    if first is None or first.device.type != "cuda" or first.device.index not in (None, torch.cuda.current_device()):
        return None
    if world()[1] > 1:
        return None
    return torch.cuda.memory_allocated(first.device)


def _fake_call(args: tuple) -> bool:
    """A call on fake tensors (a compile's), told by its first tensor argument."""
    first = _first_tensor(args)
    return first is not None and _torch_compat.is_fake(first)


class _Run:
    """One run of a compiled graph waiting for its backward (a weak-referenceable token)."""


def _outputs(out: Any) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in _outputs(out) if isinstance(t, torch.Tensor)]


def backend(config: PlannerConfig | None = None, **overrides: Any) -> PlannerBackend:
    """A backend for ``torch.compile(model, backend=planner.backend(memory_budget=0.5))``.

    Graph breaks are allowed. A fraction applies to each graph's own range; an absolute budget
    bounds the step's peak, each graph getting what the graphs before it in the step leave of it
    (``predicted_step_peak`` is the step's predicted peak). torch.compile keeps compiled graphs
    per class of model, and after ``recompile_limit`` (8) compiles of one class with other
    backends it runs that class eagerly, unplanned; :func:`compile` does not share that limit.
    """
    config = (config or PlannerConfig()).replace(**overrides)
    return PlannerBackend(config)


CONFIG_VARIABLE = "ACPLAN_CONFIG"
named_plans: list[GraphPlan] = []  # every graph the named backend planned in this process, in order


def named_backend(gm: fx.GraphModule, example_inputs: list) -> Callable:
    """The backend ``torch.compile(model, backend="acplanner")`` finds by name (registered as
    a ``torch_dynamo_backends`` entry point, so tools that take a backend name, such as the
    transformers Trainer's ``torch_compile_backend``, can use it without importing the planner).

    Settings come from the TOML or YAML file named by ``$ACPLAN_CONFIG``, read as each graph is
    compiled (defaults without it). Each graph is planned on its own: an absolute budget bounds
    each graph's peak, not the step's (:func:`compile` and :func:`backend` plan the graphs of one
    step together). Each graph's plan is appended to :data:`named_plans`.

    Raises
    ------
    ConfigError
        If ``$ACPLAN_CONFIG`` names a missing or invalid file (torch.compile wraps it).
    """
    path = os.environ.get(CONFIG_VARIABLE)
    planned = PlannerBackend(PlannerConfig.from_file(path) if path else PlannerConfig())
    compiled = planned(gm, example_inputs)
    named_plans.extend(planned.graphs)
    return compiled


def compile(model: nn.Module, config: PlannerConfig | None = None, **overrides: Any) -> nn.Module:
    """``torch.compile(model)`` with a new planner backend: the module trains like ``model``.

    The model is compiled behind a frame of its own (:func:`planner.frames.own_frame`), so its
    graphs depend on no earlier compile in the process, however many instances of its class were
    compiled before, and with static shapes (``dynamic=False``): a plan is made for sizes it can
    count in bytes, and an input of a new shape compiles and plans again. Left to dynamo, a size
    seen to change, in this compile or an earlier one of the same library code (the frames a graph
    break resumes in are shared), turns symbolic. ``planner_backend`` on the returned module is
    the backend, whose ``graphs`` and ``timelines`` describe each planned graph once the first
    call has compiled them.
    """
    planned = backend(config, **overrides)
    planned.whole_model = True
    compiled = _past_compile_limits(torch.compile(own_frame(model), backend=planned, dynamic=False))
    compiled.planner_backend = planned
    return compiled


def _past_compile_limits(compiled: nn.Module) -> nn.Module:
    """``compiled`` (a ``torch.compile``d module), running with dynamo's per-code-object compile
    limits lifted (:func:`planner._torch_compat.compile_limits_lifted`): the library frames its
    graph breaks resume in are shared by every model in the process, and past the limit they
    would run unplanned. The module's own frame is its own (:func:`own_frame`)."""
    run = compiled.forward

    @wraps(run)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with _torch_compat.compile_limits_lifted():
            return run(*args, **kwargs)

    compiled.forward = forward
    return compiled


def compile_blocks(blocks: nn.Module, config: PlannerConfig | None = None, **overrides: Any) -> PlannerBackend:
    """Compile each block of ``blocks`` (a model's ``nn.ModuleList``, ``nn.Sequential`` or
    ``nn.ModuleDict`` of repeated layers) on its own with one planner backend, replacing it with
    its compiled module as torchtitan does before sharding (``fully_shard`` then wraps the
    compiled block, so its hooks run outside the graph; state-dict keys gain ``_orig_mod.``,
    as with ``torch.compile``). The blocks share one graph, planned for ``len(blocks)`` runs
    before its backward: the budget bounds the step's peak with every block's saved values in
    it, and a fraction is of that peak's range.

    The blocks get a ``forward`` of their own (:func:`planner.frames.own_forward`; names and
    types unchanged), so their compile depends on no earlier one in the process; that class is
    made at run time, so save the model's ``state_dict``, not the pickled module. Returns the
    backend (``graphs``, ``predicted_step_peak``, ``runs``).

    Raises
    ------
    ConfigError
        If ``blocks`` is not such a container, or is empty.
    """
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential, nn.ModuleDict)) or not len(blocks):
        from planner.errors import ConfigError

        raise ConfigError(f"compile_blocks takes a model's non-empty nn.ModuleList, nn.Sequential or nn.ModuleDict of "
                          f"blocks (such as model.layers), got {type(blocks).__name__}")
    planned = PlannerBackend((config or PlannerConfig()).replace(**overrides), repeats=len(blocks))
    named = list(blocks.named_children())
    own_forward([block for _, block in named])
    for name, block in named:
        setattr(blocks, name, _past_compile_limits(torch.compile(block, backend=planned, dynamic=False)))
    return planned
