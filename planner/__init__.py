"""Activation-checkpointing planner for PyTorch training.

    >>> import planner
    >>> p = planner.plan(model, example_inputs, memory_budget=0.5, solver="ilp")  # doctest: +SKIP
    >>> loss = p.module(x); loss.backward()                                      # doctest: +SKIP

The torch-free core (``planner.problem``, ``planner.decision``, ``planner.bounds``) imports no
torch, so solvers can be used and tested on synthetic problems; the rest loads on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "plan": "planner.api",
    "Plan": "planner.api",
    "Prediction": "planner.api",
    "capture": "planner.tracing",
    "backend": "planner.compiler",
    "compile": "planner.compiler",
    "compile_blocks": "planner.compiler",
    "own_frame": "planner.frames",
    "PlannerBackend": "planner.compiler",
    "PlannerConfig": "planner.config",
    "Budget": "planner.budget",
    "sweep": "planner.comparison",
    "to_markdown": "planner.comparison",
    "plot_pareto": "planner.comparison",
    "plot_measured": "planner.comparison",
    "read_plan_file": "planner.plan_file",
    "JointGraph": "planner.graph",
    "build_problem": "planner.build",
    "Problem": "planner.problem",
    "evaluate": "planner.problem",
    "Decision": "planner.decision",
    "CaptureError": "planner.errors",
    "InfeasibleBudget": "planner.errors",
    "ConfigError": "planner.errors",
    "UnknownNameError": "planner.errors",
    "PlanFileError": "planner.errors",
    "PlannerError": "planner.errors",
    "SolverError": "planner.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__
