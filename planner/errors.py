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
        The smallest budget, in bytes, for which a plan is known.
    proven : bool
        Whether no plan exists below ``min_feasible_bytes`` (an exact search proved it, or ran
        out of time without going lower), or it is the peak of the fast frugal reference, which
        only an exact solver searches below.
    """

    def __init__(self, budget_bytes: int, min_feasible_bytes: int, proven: bool = True, note: str = ""):
        self.budget_bytes = int(budget_bytes)
        self.min_feasible_bytes = int(min_feasible_bytes)
        self.proven = proven
        smallest = ("the smallest feasible budget" if proven
                    else "the least peak of the frugal reference, the smallest budget this solver can meet,")
        hint = ("" if proven else "; the exact least-peak search looks below it (budget 0.0 with solver 'cpsat' or "
                                  "'ilp', or frugal_search='exact')")
        super().__init__(
            f"memory budget of {format_bytes(budget_bytes)} for peak activation memory is below {smallest} "
            f"{format_bytes(min_feasible_bytes)} ({self.min_feasible_bytes} bytes); raise memory_budget to at "
            f"least {self.min_feasible_bytes} bytes, or use the fraction 0.0 for the most memory-frugal plan{hint}"
            + (f" ({note})" if note else "")
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

