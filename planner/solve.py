"""Planning one joint graph: estimate its ops, build its problem, resolve the budget and solve,
or check a decision made before (a plan file)."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

from estimators import get_estimator
from estimators.base import Estimator
from planner.bounds import runtime_optimal_plan
from planner.build import build_problem, estimate_step_seconds
from planner.config import PlannerConfig
from planner.decision import Decision
from planner.decisions import decision_key, reuse_or_solve
from planner.distributed import agree_on_graph, decide_on_rank0
from planner.errors import InfeasibleBudget, PlanFileError
from planner.graph import JointGraph
from planner.offload_choice import auto_offload, offload_goes_lower
from planner.peak_polish import least_peak_polish
from planner.predict import simulated_timeline
from planner.problem import Evaluation, InfeasibleDecision, Problem, evaluate_names
from planner.torch_split import (PYTORCH_KERNELS, PYTORCH_PEAK, PYTORCH_SIMULATED_PEAK, PYTORCH_SPLIT_SECONDS,
                                 prefer_pytorch_split, pytorch_split)
from solvers import get_solver
from solvers.base import Solver
from solvers.frugal import min_peak_plan
from solvers.reference import reference_plan

__all__ = ["FRUGAL_SEARCH", "GraphPlan", "TIME_LIMIT", "configured_solver", "exact_frugal_search", "frugal_floor",
           "replay_graph", "solve_graph"]


@dataclass(frozen=True)
class GraphPlan:
    """The plan of one joint graph: its problem, the solver's decision, and estimates."""

    fingerprint: str
    problem: Problem
    decision: Decision
    step_seconds: float  # estimated runtime of the step without recomputation
    plan_seconds: float  # problem building and solving, wall time
    estimator: str  # the estimator that priced the graph, as reports name it


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
        # at 1.0 the split is the floor: the budget is its peak or the fast end's, below which
        # nothing is searched, so the frugal reference (seconds on a large graph) is not needed
        floor = least.plan if least else split if budget.fraction == 1.0 else None
        settings = dict(frugal=floor, frugal_proven=bool(least and least.optimal),
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


TIME_LIMIT = "time_limit"  # Decision.stats: the solver's time limit on the graph and the rule that set it
FRUGAL_SEARCH = "frugal_search"  # Decision.stats: the exact least-peak search budget 0 resolved against, where it ran


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
