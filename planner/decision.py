"""A solver's answer: which nodes to save, what that costs, and how it was found."""
from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from planner.problem import Evaluation, Problem

__all__ = ["Decision", "Status", "with_plan"]


class Status:
    """How much a decision's objective can be trusted."""

    OPTIMAL = "optimal"  # proven optimal for the problem's objective (recompute plus save seconds)
    FEASIBLE = "feasible"  # an exact solver stopped at its time limit; ``gap`` bounds the loss
    HEURISTIC = "heuristic"  # no optimality claim; ``stats`` says what the solver's own model guarantees


@dataclass(frozen=True)
class Decision:
    """The saved set and its figures, all measured by :func:`planner.problem.evaluate`.

    Attributes
    ----------
    saved : names of the saved forward nodes (views are never saved; their bases are).
    solver : name of the solver that ran (never a stand-in for it).
    budget_bytes : the budget it solved for, bytes.
    memory_bytes : saved bytes plus RNG states for recomputed random ops.
    peak_bytes : peak memory over the step (:func:`planner.problem.memory_profile`).
    recompute_seconds : estimated runtime of the recomputation in the backward, seconds.
    status : one of :class:`Status`.
    gap : relative optimality gap of the objective, ``recompute_seconds + save_seconds``, when
        known (0.0 when proven optimal).
    solve_seconds : wall time of the solver, seconds.
    stats : solver-specific figures (e.g. the dp quantum and its knapsack bound).
    save_seconds : estimated time spent writing the saved values and reading them back, seconds
        (0 with estimators that do not price memory traffic).
    offloaded : names of saved nodes handed to the backward in host memory instead of device
        memory (copied out after the forward's last reader, back before the backward's first).
    transfers : per offloaded name, ``[wait_after, reload_before]``: the forward node after which
        the forward waits for its copy to host, and the backward node before which its copy
        back starts (:class:`planner.emit.Transfer`; missing or None: at its readers).
    """

    saved: tuple[str, ...]
    solver: str
    budget_bytes: int
    memory_bytes: int
    peak_bytes: int
    recompute_seconds: float
    status: str
    gap: float | None
    solve_seconds: float
    stats: dict[str, Any] = field(default_factory=dict)
    save_seconds: float = 0.0
    offloaded: tuple[str, ...] = ()
    transfers: dict[str, list] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """The objective: estimated seconds the plan adds to the step, recomputing and saving."""
        return self.recompute_seconds + self.save_seconds

    def to_dict(self) -> dict[str, Any]:
        """The decision as JSON-ready data: containers as dicts and lists, numbers (NumPy's and
        symbolic sizes too) as Python's.

        Raises
        ------
        TypeError
            If a field or stat holds anything else, naming where it is and its type.
        """
        return {f.name: _plain(getattr(self, f.name), f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Decision":
        return cls(**(data | {"saved": tuple(data["saved"]), "offloaded": tuple(data.get("offloaded", ()))}))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)


def _plain(value: Any, where: str) -> Any:
    """``value`` as JSON-ready data (see :meth:`Decision.to_dict`); ``where`` names it in errors."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        value = value.item()
        if isinstance(value, bool):
            return value
    if isinstance(value, (numbers.Integral, torch.SymInt)):
        return int(value)
    if isinstance(value, (numbers.Real, torch.SymFloat)):
        return float(value)
    raise TypeError(f"decision field {where} holds a {type(value).__module__}.{type(value).__qualname__}, "
                    f"which a plan file or the decision cache cannot keep (numbers, strings, lists and dicts only)")


def with_plan(problem: Problem, decision: Decision, plan: Evaluation, **changes: Any) -> Decision:
    """``decision`` saving what ``plan`` saves, with ``plan``'s figures, and ``changes``."""
    return replace(decision, saved=tuple(problem.names[i] for i in np.flatnonzero(plan.saved)),
                   memory_bytes=plan.memory_bytes, peak_bytes=plan.peak_bytes,
                   recompute_seconds=plan.recompute_seconds, save_seconds=plan.save_seconds, **changes)
