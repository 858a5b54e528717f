"""``plan()``: capture a model, choose what to save, and return a module that trains with it."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from planner.compiler import PlannerBackend
from planner.solve import TIME_LIMIT, GraphPlan, frugal_floor, replay_graph, solve_graph
from planner.torch_split import FAST_END_CHOICE, PYTORCH_PEAK, SPLIT_PEAK_MARGIN
from planner.bounds import fast_end_plan
from planner.budget import Budget
from planner.memory import Timeline
from planner.tracing import as_inputs, capture
from planner.config import PlannerConfig
from planner.decision import Decision
from planner.distributed import from_rank0, world
from planner.errors import PlanFileError
from planner.frames import own_frame
from planner.plan_file import PlanFile, read_plan_file, write_plan_file
from planner.schedule import REST_OF_STEP
from planner.problem import evaluate_names
from planner.units import format_bytes
from planner.workspace import scratch_summary

__all__ = ["plan", "Plan", "Prediction"]


@dataclass(frozen=True)
class Prediction:
    """What the planner expects of the plan (estimates, not measurements)."""

    saved_bytes: int  # activations kept for the backward (plus RNG states), bytes
    peak_bytes: int  # peak activation memory over the step, as the solvers bound it, bytes
    recompute_seconds: float  # extra runtime spent recomputing in the backward, seconds
    step_seconds: float  # estimated runtime of the step without recomputation, seconds
    min_peak_bytes: int  # peak of the frugal end (budget 0.0): the frugal reference, or the exact search's plan where it ran
    max_peak_bytes: int  # peak of budget 1.0: the fast end (planner.bounds.fast_end_plan), or PyTorch's split where lower

    @property
    def overhead(self) -> float:
        """Recompute time as a fraction of the step time."""
        return self.recompute_seconds / self.step_seconds if self.step_seconds > 0 else 0.0


def _time_limit(decision: Decision) -> str:
    """The solver's time limit as the summary quotes it (decisions from before it was kept: none)."""
    limit = decision.stats.get(TIME_LIMIT)
    return "" if limit is None else f"; limit {limit['seconds']:.3g} s, {limit['rule']}"


def polish_summary(decision: Decision) -> str | None:
    """What the polish sweeps did to an unproven answer (:mod:`solvers.polish`; at budget 0
    after :func:`planner.peak_polish.least_peak_polish`), as the summary says it; None where they
    did not run."""
    report = decision.stats.get("polish")
    if not report:
        return None
    before, after = report["objective_before"] * 1e3, report["objective_after"] * 1e3
    sweeps = f"{report['sweeps']} sweep" + ("" if report["sweeps"] == 1 else "s")
    text = (f"{report['saved_values']} more values saved in {sweeps} ({report['seconds']:.2g} s, "
            f"{report['stopped_by']}): {before:.4g} -> {after:.4g} ms estimated")
    if "kept" in report:
        text += (f"; budget 0 kept {report['kept']}, dropped {len(report['dropped'])} that raised the predicted "
                 f"peak, left {report['unchecked']} unchecked ({report['simulations']} simulations)")
    return text


class Plan:
    """A solved plan for one model and input shape.

    ``module`` is ``torch.compile(model)`` with this plan as its partitioner: it trains exactly
    like the model. The model is compiled on its first call, with no solving at that point.
    """

    def __init__(self, model: nn.Module, graph_plan: GraphPlan, config: PlannerConfig, scratch: str | None = None) -> None:
        self.config = config
        self.graph_plan = graph_plan
        self.scratch = scratch  # the library kernels' scratch memory, in words (planner.workspace.scratch_summary)
        self.backend = PlannerBackend(config, fixed=graph_plan)
        self.module = torch.compile(own_frame(model), backend=self.backend, fullgraph=True, dynamic=False)

    @property
    def decision(self) -> Decision:
        return self.graph_plan.decision

    @property
    def saved(self) -> list[str]:
        return list(self.decision.saved)

    @property
    def recomputed(self) -> list[str]:
        problem = self.graph_plan.problem
        result = evaluate_names(problem, self.decision.saved)
        return [problem.names[i] for i in np.flatnonzero(result.recomputed)]

    @property
    def predicted(self) -> Prediction:
        problem = self.graph_plan.problem
        planned_with = self.decision.stats.get(TIME_LIMIT, {}).get("seconds")  # the kept least-peak search answers
        return Prediction(
            saved_bytes=self.decision.memory_bytes,
            peak_bytes=self.decision.peak_bytes,
            recompute_seconds=self.decision.recompute_seconds,
            step_seconds=self.graph_plan.step_seconds,
            min_peak_bytes=(floor := frugal_floor(self.config, problem, time_limit=planned_with).peak_bytes),
            max_peak_bytes=Budget(fraction=1.0).resolve(problem, floor, self.decision.stats.get(PYTORCH_PEAK)),
        )

    @property
    def timeline(self) -> Timeline | None:
        """Simulated memory of the emitted graphs (:func:`planner.memory.simulate`), once
        ``module`` has been compiled by its first call; None before."""
        return self.backend.timelines[-1] if self.backend.timelines else None

    def _fast_end(self) -> str:
        """What budget 1.0 is for this plan, in words."""
        stats = self.decision.stats
        if FAST_END_CHOICE in stats:
            choice = stats[FAST_END_CHOICE]
            compared = choice.get("compared")  # absent from plan files written before it was kept
            if compared is None:
                return (f"PyTorch's own split, taken over the solver's plan "
                        f"({format_bytes(choice['solver_peak_bytes'])}, not {SPLIT_PEAK_MARGIN:.0%} less)")
            return (f"PyTorch's own split, taken over the solver's plan ({format_bytes(compared['solver'])} against "
                    f"{format_bytes(compared['split'])} {compared['figures']}, not {SPLIT_PEAK_MARGIN:.0%} less)")
        if "pytorch_split" in stats:
            return f"the planner's fast end; PyTorch's own split {stats['pytorch_split']}"
        if stats.get(PYTORCH_PEAK, float("inf")) < fast_end_plan(self.graph_plan.problem).peak_bytes:
            return "PyTorch's own split, below the planner's fast end"
        return "the planner's fast end"

    def summary(self) -> str:
        """A readable table of the plan."""
        d, p = self.decision, self.predicted
        gap = "n/a" if d.gap is None else f"{d.gap:.2%}"
        rows = [
            ("solver", f"{d.solver} ({d.status}, gap {gap}{_time_limit(d)})"),
            ("estimator", self.graph_plan.estimator),
            ("budget", f"{self.config.budget} -> {format_bytes(d.budget_bytes)}"),
            ("predicted peak", format_bytes(p.peak_bytes)),
            ("saved activations", f"{format_bytes(p.saved_bytes)} ({len(d.saved)} tensors)"),
            ("budget range", f"{format_bytes(p.min_peak_bytes)} (0.0) .. {format_bytes(p.max_peak_bytes)} "
                             f"(1.0: {self._fast_end()})"),
            ("recomputed ops", str(len(self.recomputed))),
            ("predicted recompute", f"{p.recompute_seconds:.3g} s ({p.overhead:.1%} of the step)"),
            ("plan time", f"{self.graph_plan.plan_seconds * 1e3:.0f} ms (solver {d.solve_seconds * 1e3:.0f} ms)"),
            ("graph", f"{len(self.graph_plan.problem)} forward nodes, fingerprint {self.graph_plan.fingerprint}"),
        ]
        if (polished := polish_summary(d)) is not None:
            rows.insert(1, ("polish", polished))
        if self.scratch:
            rows.insert(4, ("library scratch", self.scratch))
        if isinstance(note := d.stats.get("offload"), dict):
            moved = f"{note['offloaded']} values, {format_bytes(note['offloaded_bytes'])} to host memory"
            rows.insert(4, ("offloaded", f"{moved} ({note.get('method', 'greedy')}; "
                                         f"{format_bytes(note['peak_bytes_on_device_alone'])} peak without)"))
        schedule = self.graph_plan.problem.schedule
        if schedule.step_names[:1] == (REST_OF_STEP,):
            rows.insert(4, ("rest of the step", f"{format_bytes(int(schedule.base[0]))} besides the saved values, between "
                                                "forward and backward (the outputs go on to more of the step)"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def save(self, path: str | Path) -> Path:
        """Write the plan file (decision, graph fingerprint, settings, predictions) atomically."""
        record = PlanFile(self.graph_plan.fingerprint, plan_settings(self.config), self.decision, asdict(self.predicted))
        return write_plan_file(record, path)

    def __repr__(self) -> str:
        return f"Plan(solver={self.decision.solver!r}, peak={format_bytes(self.decision.peak_bytes)})"


def plan(
    model: nn.Module,
    example_inputs: Any,
    memory_budget: float | int | str | PlannerConfig | None = None,
    solver: str | None = None,
    estimator: str | None = None,
    config: PlannerConfig | None = None,
    plan_file: str | Path | None = None,
    mode: str | None = None,
    **overrides: Any,
) -> Plan:
    """Plan activation checkpointing for ``model`` on inputs shaped like ``example_inputs``.

    Keyword arguments override the fields of ``config`` (default :class:`PlannerConfig`), any
    of them as :func:`planner.compile` takes them (``time_limit=5``, ``codegen="eager"``); a
    config may also be passed third, ``plan(model, inputs, config)``. ``mode`` is one of
    ``torch.compile``'s (:meth:`PlannerConfig.with_compile_arguments`).
    With ``plan_file``, an existing file is reused without solving when it was made for this
    graph and these settings (and refused otherwise); a missing one is written after solving.
    Under ``torch.distributed`` every rank calls ``plan`` alike: rank 0 solves, the others get its
    decision (:mod:`planner.distributed`), and rank 0 alone writes ``plan_file``.

    Raises
    ------
    CaptureError
        If the model cannot be captured as one graph.
    InfeasibleBudget
        If the budget is below the most frugal plan; the error names the smallest budget.
    ConfigError, UnknownNameError
        For a bad budget, solver or estimator, or a setting PlannerConfig does not have.
    PlanFileError
        If ``plan_file`` is malformed, or was made for another graph or other settings.
    """
    if isinstance(memory_budget, PlannerConfig) and config is None:  # plan(model, inputs, config)
        memory_budget, config = None, memory_budget
    config = (config or PlannerConfig()).replace(memory_budget=memory_budget, solver=solver, estimator=estimator,
                                                 **overrides).with_compile_arguments(mode)
    joint = capture(model, as_inputs(example_inputs), codegen=config.codegen, inductor_options=config.inductor_settings())
    # every rank takes rank 0's view of the file, so all of them replay it or all solve together
    if plan_file is not None and from_rank0(Path(plan_file).exists):
        stored = read_plan_file(plan_file)
        if stored.fingerprint != joint.fingerprint:
            raise PlanFileError(
                f"plan file {plan_file} was solved for another graph (fingerprint {stored.fingerprint}, this one "
                f"{joint.fingerprint}): the model, its input shapes or the codegen changed; delete it to plan again"
            )
        if stored.settings != plan_settings(config):
            raise PlanFileError(
                f"plan file {plan_file} was solved with {stored.settings}, not {plan_settings(config)}; "
                f"use those settings or delete it to plan again"
            )
        graph_plan, solved = replay_graph(joint, config, stored.decision), False
    else:
        graph_plan, solved = solve_graph(joint, config), True
    result = Plan(model, graph_plan, config, scratch_summary(joint.graph.nodes, config.codegen == "inductor"))
    if solved and plan_file is not None and world()[0] == 0:
        result.save(plan_file)
    return result


def plan_settings(config: PlannerConfig) -> dict[str, Any]:
    """The settings a plan file records: what decides the plan besides the graph."""
    budget = config.budget
    return {"memory_budget": budget.fraction if budget.fraction is not None else budget.nbytes,
            "solver": config.solver, "estimator": config.estimator, "solver_options": dict(config.solver_options),
            "estimator_options": dict(config.estimator_options), "fast_end": config.fast_end,
            # offloading settings only where they are on, so plan files from before them still match
            **({"offload": config.offload, "offload_bandwidth": config.offload_bandwidth,
                "offload_min_bytes": config.offload_min_bytes,
                # the host bound only where it is set, so plan files from before it still match
                **({"offload_host_bytes": config.offload_host_bytes} if config.offload_host_bytes is not None else {}),
                # the price of an offload's ops where it is not the default, for the same reason
                **({"offload_op_seconds": config.offload_op_seconds}
                   if config.offload_op_seconds != PlannerConfig.offload_op_seconds else {})}
               if config.offload != "off" else {})}
