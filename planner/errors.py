"""Exceptions raised by the planner, each naming the problem and the fix."""
from __future__ import annotations

from planner.units import format_bytes

__all__ = [
    "PlannerError",
    "CaptureError",
    "InfeasibleBudget",
    "ConfigError",
    "UnknownNameError",
    "PlanFileError",
    "SolverError",
]


class PlannerError(Exception):
    """Base class of every error the planner raises on purpose."""


class CaptureError(PlannerError):
    """The model could not be captured as one joint forward+backward graph."""


class InfeasibleBudget(PlannerError):
    """No plan fits the budget.

    Attributes
    ----------
    budget_bytes : int
        The budget that was asked for, in bytes.
    min_feasible_bytes : int
        The smallest budget, in bytes, for which a plan exists.
    """

    def __init__(self, budget_bytes: int, min_feasible_bytes: int, what: str = "saved activations"):
        self.budget_bytes = int(budget_bytes)
        self.min_feasible_bytes = int(min_feasible_bytes)
        super().__init__(
            f"memory budget of {format_bytes(budget_bytes)} for {what} is below the smallest "
            f"feasible budget of {format_bytes(min_feasible_bytes)} ({self.min_feasible_bytes} bytes); "
            f"raise memory_budget to at least {self.min_feasible_bytes} bytes, or use the fraction 0.0 "
            f"for the most memory-frugal plan"
        )


class ConfigError(PlannerError, ValueError):
    """A configuration field has a value outside its allowed range."""


class UnknownNameError(PlannerError, KeyError):
    """An unknown solver or estimator name was asked for."""

    def __init__(self, kind: str, name: str, available: list[str]):
        self.kind, self.name, self.available = kind, name, list(available)
        super().__init__(f"unknown {kind} {name!r}; available {kind}s: {', '.join(available)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class PlanFileError(PlannerError):
    """A plan file is malformed or was solved for another graph."""


class SolverError(PlannerError):
    """A solver failed without producing any feasible plan (its back end crashed or found none in time)."""

