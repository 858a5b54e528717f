"""The planner as a torch.compile backend: every joint graph is planned, then split and compiled."""
from __future__ import annotations

import os
import time
from functools import partial
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn

from estimators import get_estimator
from planner import _torch_compat
from planner.bounds import runtime_optimal_plan
from planner.build import build_problem, estimate_step_seconds
from planner.tracing import make_backend
from planner.config import PlannerConfig
from planner.decision import Decision
from planner.decisions import decision_key, reuse_or_solve
from planner.distributed import agree_on_graph, decide_on_rank0
from planner.emit import emit
from planner.errors import PlanFileError
from planner.frames import own_frame
from planner.graph import JointGraph
from planner.memory import Timeline, simulate
from planner.problem import Evaluation, InfeasibleDecision, Problem, evaluate_names
from solvers import get_solver
from solvers.base import Solver
from solvers.frugal import min_peak_plan
from solvers.reference import reference_plan

__all__ = ["backend", "compile", "named_backend", "named_plans", "PlannerBackend", "GraphPlan", "solve_graph", "replay_graph"]


@dataclass(frozen=True)
class GraphPlan:
    """The plan of one joint graph: its problem, the solver's decision, and estimates."""

    fingerprint: str
    problem: Problem
    decision: Decision
    step_seconds: float  # estimated runtime of the step without recomputation
    plan_seconds: float  # problem building and solving, wall time
    estimator: str  # the estimator that priced the graph, as reports name it


def solve_graph(joint: JointGraph, config: PlannerConfig, held_bytes: int = 0) -> GraphPlan:
    """Estimate, build the problem, resolve the budget and solve, for one joint graph.

    ``held_bytes`` are kept alive while this graph runs by graphs that ran before it in the
    step (their saved values and outputs): an absolute budget bounds the step's peak, so this
    graph gets what they leave of it. A fraction is of this graph's own range.

    A graph solved before with the same settings reuses that decision (:mod:`planner.decisions`).
    Under ``torch.distributed``, the ranks check that they compiled the same graph and rank 0
    decides for all of them (:mod:`planner.distributed`).
    """

    def solve(problem: Problem) -> Decision:
        solver = get_solver(config.solver, time_limit=config.time_limit, **config.solver_options)
        budget = config.budget
        exact = exact_frugal_search(config, solver, problem, held_bytes)
        least = min_peak_plan(problem, config.time_limit) if exact else None
        nbytes = budget.resolve(problem, least.plan.peak_bytes if least else None)
        if budget.nbytes is not None:
            nbytes = max(0, nbytes - held_bytes)
        if least is None:
            return solver.solve(problem, nbytes)
        return solver.solve(problem, nbytes, frugal=least.plan, frugal_proven=least.optimal)

    def decide(problem: Problem) -> Decision:
        agree_on_graph(joint.fingerprint)
        kept = partial(_fits, problem, "a decision kept in the cache", "it is solved again")
        received = partial(_fits, problem, "rank 0's decision", "give every rank the same model and settings")

        def on_rank0() -> Decision:  # the deciding rank alone hashes the key and looks it up
            return reuse_or_solve(decision_key(joint, config, held_bytes), lambda: solve(problem), kept)

        return decide_on_rank0(on_rank0, received)

    return _plan_graph(joint, config, decide)


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


def frugal_floor(config: PlannerConfig, problem: Problem, held_bytes: int = 0) -> Evaluation:
    """The frugal end (budget 0) that planning this graph with ``config`` uses: the exact
    least-peak plan where :func:`exact_frugal_search` says it runs (kept once searched), else the
    frugal reference."""
    solver = get_solver(config.solver, time_limit=config.time_limit, **config.solver_options)
    if exact_frugal_search(config, solver, problem, held_bytes):
        return min_peak_plan(problem, config.time_limit).plan
    return reference_plan(problem)


def replay_graph(joint: JointGraph, config: PlannerConfig, decision: Decision) -> GraphPlan:
    """A GraphPlan for a decision solved before (a plan file): checked whole, not solved again.

    Raises
    ------
    PlanFileError
        If the decision names nodes this graph lacks or does not give the backward what it needs.
    """

    def check(problem: Problem) -> Decision:
        return _fits(problem, "the stored plan", "delete the plan file to plan again", decision)

    return _plan_graph(joint, config, check)


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


def _plan_graph(joint: JointGraph, config: PlannerConfig, decide: Callable[[Problem], Decision]) -> GraphPlan:
    """Estimate and build the problem, then ``decide`` on it; timed as a whole."""
    start = time.perf_counter()
    estimator = get_estimator(config.estimator, **config.estimator_options)
    problem = build_problem(joint, estimator, fuse=config.codegen == "inductor")
    decision = decide(problem)
    return GraphPlan(joint.fingerprint, problem, decision, estimate_step_seconds(joint, estimator),
                     time.perf_counter() - start, str(estimator))


class PlannerBackend:
    """A torch.compile backend that plans each joint graph it is given.

    With ``fixed`` set, the graph must be the one that plan was made for (same fingerprint) and
    no solver runs. ``graphs`` lists a :class:`GraphPlan` per planned graph, in compile order,
    and ``timelines`` the simulated memory of each emitted pair of modules.
    """

    def __init__(self, config: PlannerConfig, fixed: GraphPlan | None = None) -> None:
        self.config = config
        self.fixed = fixed
        self.graphs: list[GraphPlan] = []
        self.timelines: list[Timeline] = []
        # the latest timeline of each part of the step (a frame's graph, or each graph one compile
        # of a frame hands over), in the order they first compiled: a recompile of a frame (new
        # shapes) replaces its graphs in the step, it does not add to them
        self._step: dict[Any, Timeline] = {}
        self._compiling: tuple[int, int] | None = None  # dynamo's (frame, compile) ids of the graph compiling
        self._place = 0  # its place among the graphs that compile handed over
        self._compile: Callable = make_backend(self.partition, config.codegen, config.inductor_options)

    def partition(self, joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **_: Any):
        """AOTAutograd partition function: plan the joint graph and split it accordingly."""
        joint = JointGraph(joint_module, num_fwd_outputs, list(joint_inputs))
        if self.fixed is None:
            graph_plan = solve_graph(joint, self.config, self.held_bytes)
        elif joint.fingerprint == self.fixed.fingerprint:
            graph_plan = self.fixed
        else:
            raise PlanFileError(
                f"the compiled graph (fingerprint {joint.fingerprint}) is not the one the plan was made for "
                f"({self.fixed.fingerprint}); the model, its input shapes or the codegen changed, so plan again"
            )
        self.graphs.append(graph_plan)
        num_fwd_outputs = joint.num_fwd_outputs
        forward, backward = emit(joint, graph_plan.problem, graph_plan.decision.saved)
        self.timelines.append(simulate(forward, backward, num_fwd_outputs, fuse=self.config.codegen == "inductor"))
        part = self._part
        self._step[part if part is not None else len(self.timelines)] = self.timelines[-1]
        return forward, backward

    @property
    def held_bytes(self) -> int:
        """Bytes the graphs before this one in the step keep alive once their forwards ran
        (saved values and outputs): the graphs of one step run their forwards in the order their
        frames first compiled, then their backwards in reverse, so a later graph runs while
        these are held. A graph compiled again for its frame (new shapes) counts once."""
        held = 0
        for part, timeline in self._step.items():
            if part == self._part:
                break
            held += timeline.held_after_forward
        return held

    @property
    def step(self) -> list[Timeline]:
        """The simulated memory of each graph of the step, in the order they run their forwards
        (the latest compile of each part of each frame)."""
        return list(self._step.values())

    @property
    def predicted_forward(self) -> tuple[int, int]:
        """Predicted peak of the step's forwards, and the bytes they leave alive for the backward."""
        return self._step_peak(lambda t: t.forward_peak), sum(t.held_after_forward for t in self.step)

    @property
    def predicted_step_peak(self) -> int:
        """Predicted peak activation memory of the step, over the latest graph of each part:
        the largest of each graph's simulated peak plus what the graphs before it hold."""
        return self._step_peak(lambda t: t.peak)

    def _step_peak(self, peak_of: Callable[[Timeline], int]) -> int:
        """The largest ``peak_of`` a graph of the step plus what the graphs before it hold."""
        held = peak = 0
        for timeline in self.step:
            peak = max(peak, held + peak_of(timeline))
            held += timeline.held_after_forward
        return peak

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        compiling = _torch_compat.compiling_frame()
        # one compile of a frame may hand over several graphs, each its own part of the step
        # (DDP's graph splitting compiles one per gradient bucket): they are told apart by their
        # place in that compile, and a recompile of the frame replaces them place by place
        self._place = self._place + 1 if compiling is not None and compiling == self._compiling else 0
        self._compiling = compiling
        return self._compile(gm, example_inputs)

    @property
    def _part(self) -> tuple[int, int] | None:
        """The part of the step the graph compiling now is: its frame and place; None outside
        torch.compile's frames."""
        return None if self._compiling is None else (self._compiling[0], self._place)


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
    compiled before. ``planner_backend`` on the returned module is the backend, whose ``graphs``
    and ``timelines`` describe each planned graph once the first call has compiled them.
    """
    planned = backend(config, **overrides)
    compiled = torch.compile(own_frame(model), backend=planned)
    compiled.planner_backend = planned
    return compiled
