"""Sweep budgets x solvers x estimators on one captured graph; tables and Pareto plots."""
from __future__ import annotations

from itertools import product
from pathlib import Path
from typing import Any, Iterable

import torch.nn as nn

from planner.solve import solve_graph
from planner.config import PlannerConfig
from planner.tracing import as_inputs, capture

__all__ = ["sweep", "to_markdown", "plot_pareto", "plot_measured", "curve_label"]

COLUMNS = ("solver", "estimator", "budget", "saved_mib", "recompute_ms", "overhead", "plan_ms", "status", "gap")


def sweep(
    model: nn.Module,
    example_inputs: Any,
    budgets: Iterable[float | int | str],
    solvers: Iterable[str],
    estimators: Iterable[str] = ("auto",),
    config: PlannerConfig | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Plan every combination on one capture of the model; one plain-dict record per plan.

    Records hold predictions (no training step runs): ``saved_bytes`` (activations kept for the
    backward), ``recompute_seconds``, ``overhead`` (recompute time over the estimated step
    time), ``plan_seconds``, the solver's ``status`` and ``gap``.
    """
    from tqdm.auto import tqdm

    base = config or PlannerConfig(codegen="eager")
    joint = capture(model, as_inputs(example_inputs), codegen=base.codegen)
    combos = list(product(list(estimators), list(solvers), list(budgets)))
    records = []
    for estimator, solver, budget in tqdm(combos, desc="planning", disable=not progress):
        graph_plan = solve_graph(joint, base.replace(memory_budget=budget, solver=solver, estimator=estimator))
        d = graph_plan.decision
        records.append({
            "solver": solver, "estimator": estimator, "budget": budget, "budget_bytes": d.budget_bytes,
            "saved_bytes": d.memory_bytes, "saved_mib": d.memory_bytes / 2**20,
            "recompute_seconds": d.recompute_seconds, "recompute_ms": d.recompute_seconds * 1e3,
            "step_seconds": graph_plan.step_seconds,
            "overhead": d.recompute_seconds / graph_plan.step_seconds if graph_plan.step_seconds else 0.0,
            "plan_seconds": graph_plan.plan_seconds, "plan_ms": graph_plan.plan_seconds * 1e3,
            "solve_seconds": d.solve_seconds, "status": d.status, "gap": d.gap,
        })
    return records


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def to_markdown(records: list[dict[str, Any]], columns: Iterable[str] = COLUMNS) -> str:
    """A markdown table of the records, one row each."""
    columns = list(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in records]
    return "\n".join(lines)


def plot_pareto(records: list[dict[str, Any]], path: str | Path, title: str = "Predicted memory vs recompute time") -> Path:
    """Saved activation memory (x) against predicted recompute time (y), a line per solver/estimator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key in sorted({(r["solver"], r["estimator"]) for r in records}):
        points = sorted((r["saved_mib"], r["recompute_ms"]) for r in records if (r["solver"], r["estimator"]) == key)
        ax.plot(*zip(*points), marker="o", label=f"{key[0]} ({key[1]})")
    return _finish(fig, ax, path, title, "saved activations (MiB, predicted)", "recompute time (ms, predicted)")


def plot_measured(rows: list[dict[str, Any]], path: str | Path, title: str = "Measured peak memory vs step time") -> Path:
    """Measured peak activation memory (x, GiB) against step time (y, ms), a line per method.

    ``rows`` are the records of ``bench/pareto.py`` (``method``, ``solver``, ``budget``,
    ``peak_activation_bytes``, ``step_ms``); methods with one point (eager, checkpointing) are
    drawn as markers, each budget sweep as a line through its points from the largest budget to
    the smallest (so a curve that turns back shows memory rising as the budget falls), and
    planner points planned at torch.compile's measured memory (``matched``) as diamonds.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for key in sorted({curve_label(r) for r in rows}, key=lambda k: (k.startswith("planner"), k)):
        mine = sorted((r for r in rows if curve_label(r) == key), key=lambda r: -(r.get("budget") or 0))  # budget order
        points = [(r["peak_activation_bytes"] / 2**30, r["step_ms"]) for r in mine]
        style = {"linestyle": "none", "marker": "s", "markersize": 8} if len(points) == 1 else {"marker": "o"}
        if mine[0].get("matched") is not None:
            style = {"linestyle": "none", "marker": "D", "markersize": 6}  # answers to torch.compile's points
        if key == "torch.compile":
            style.update(color="black", linewidth=2)
        ax.plot(*zip(*points), label=key, **style)
    return _finish(fig, ax, path, title, "peak activation memory (GiB, measured)", "step time (ms, median)")


def curve_label(row: dict[str, Any]) -> str:
    """The curve a measured row belongs to: eager, checkpoint, torch.compile, planner <solver>,
    or planner <solver> given torch.compile's measured memory as its budget (``matched``)."""
    if row["method"] != "planner":
        return row["method"]
    return f"planner {row['solver']}" + (" at torch.compile's memory" if row.get("matched") is not None else "")


def _finish(fig, ax, path: str | Path, title: str, xlabel: str, ylabel: str) -> Path:
    """Label, save as PNG and close one plot."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
