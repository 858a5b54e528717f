"""Pareto curves of measured peak activation memory against step time: the planner and PyTorch.

In one process on one GPU, for one workload (``--model``): eager without checkpointing; eager
with ``torch.utils.checkpoint`` on every block; ``torch.compile`` with PyTorch's own
``activation_memory_budget`` at each budget; and the planner as the torch.compile backend
(inductor, ``--estimator profile`` by default) for each solver at the same budgets and at
``--extra-budgets`` between them, and (``--matched``, on by default) at each torch.compile
point's measured peak activation memory given as an absolute budget: the planner's answer to
"the fastest step in this much memory". Per point: measured peak activation memory
(``max_memory_allocated`` during the steps minus ``memory_allocated`` before them), the median
step time, the first step's wall time (tracing, planning and compiling), and for the planner its
plan time and predictions (simulated peak, recompute seconds, solver status).

Step time: each point is first timed alone (``--steps`` CUDA-event-timed steps after a warm-up
step; kept as ``step_ms_alone``). Every point stays compiled (each behind a frame of its own,
:func:`bench.workloads.own_frame`), and after the last one all are timed again in ``--rounds``
interleaved rounds; ``step_ms`` is the median of those steps, so a drift of the GPU's clocks
over the run falls on every method alike. Before that, every point's peaks are measured again
with all of them built (:func:`bench.gpu_step.again_together`; the first measure kept as
``*_alone``), so that no point's peak depends on which points the process measured before it.

Writes ``<out>.json``, ``<out>.md`` (the table and the targets) and ``<out>.png`` (memory on x,
step time on y, a line per method).

    python -m bench.pareto [--model gpt|gpt-large|resnet] [--solvers mincut greedy dp ilp cpsat]
    python -m bench.pareto --methods torch planner --solvers cpsat --out part2   # a subset
    python -m bench.pareto --report part1.json part2.json --out merged        # merge runs
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

from bench import fastest_within, merge_runs, save_rows
from planner.comparison import curve_label

RESULTS = Path(__file__).parent / "results"
GIB = 2**30
BUDGETS = [1.0, 0.8, 0.6, 0.4, 0.2, 0.1, 0.05, 0.0]  # PyTorch's and the planner's
EXTRA = [0.9, 0.7, 0.5, 0.3]  # the planner's too (--extra-budgets), between them
METHODS = ["eager", "checkpoint", "torch", "planner"]
SOLVERS = ["mincut", "greedy", "dp", "ilp", "cpsat"]


def budget_text(row: dict) -> str:
    """A row's budget as the table shows it: a fraction, or torch.compile's memory it was given."""
    if row.get("matched") is not None:
        return f"{row['budget'] / GIB:.3f} GiB (torch {row['matched']:g})"
    return "-" if row.get("budget") is None else f"{row['budget']:g}"


def _point(row: dict) -> str:
    if row.get("matched") is not None:
        return f"planner {row['solver']} at torch {row['matched']:g}'s memory ({row['budget'] / GIB:.3f} GiB)"
    return f"{curve_label(row)} at {budget_text(row)}"


def run(args, out: Path) -> list[dict]:
    import torch

    from bench.gpu_memory import run_point
    from bench.gpu_step import again_together, measure
    from bench.workloads import WORKLOADS, checkpoint_blocks, own_frame
    from planner.errors import PlannerError

    base, batch = WORKLOADS[args.model]()
    rows: list[dict] = []
    kept: list = []  # (compiled model, parameters) per row, for the interleaved timing

    def save() -> None:
        save_rows(out.with_suffix(".json"), torch.cuda.get_device_name(), torch.__version__, rows)

    def record(row: dict) -> None:
        rows.append({"model": args.model, **row})
        save()
        print(_table_row(rows[-1]), flush=True)

    def timed(model, compiled) -> dict:
        params = list(model.parameters())
        kept.append((compiled, params))
        return _timed(lambda: measure(compiled, params, batch, args.steps))

    def planner_point(solver: str, budget, **extra) -> None:
        try:
            point = run_point(base, batch, budget, solver, args.time_limit, args.steps, args.estimator, keep=kept)
        except PlannerError as err:
            print(f"planner {solver} at {budget}: {err}", flush=True)
            return
        record({"method": "planner", **point, **extra})

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, model {args.model}")
    print(_HEADER, flush=True)
    if "eager" in args.methods:
        model = copy.deepcopy(base)
        record({"method": "eager", "budget": None, **timed(model, model)})
    if "checkpoint" in args.methods:
        model = checkpoint_blocks(copy.deepcopy(base))
        record({"method": "checkpoint", "budget": None, **timed(model, model)})
    if "torch" in args.methods:
        for budget in args.budgets:
            model = copy.deepcopy(base)
            with torch._functorch.config.patch(activation_memory_budget=budget):
                result = timed(model, torch.compile(own_frame(model)))  # compiles inside the patch
            record({"method": "torch.compile", "budget": budget, **result})
    if "planner" in args.methods:
        for solver in args.solvers:
            for budget in sorted(set(args.budgets) | set(args.extra_budgets), reverse=True):
                planner_point(solver, budget)
            if args.matched:
                for t in [r for r in rows if r["method"] == "torch.compile"]:
                    planner_point(solver, int(t["peak_activation_bytes"]), matched=t["budget"])
    if args.rounds and kept:
        print(f"timing every point again: {args.rounds} rounds of {args.steps} steps each, the points in turn", flush=True)
        again_together(rows, kept, batch, args.rounds, args.steps)
        save()
        print(_HEADER)
        print("\n".join(map(_table_row, rows)), flush=True)
    return rows


def _timed(measure_step) -> dict:
    start = time.perf_counter()
    result = measure_step()
    return {**result, "first_step_seconds": time.perf_counter() - start}


_HEADER = ("| method | budget | peak activation GiB | step ms | predicted peak GiB | plan s | status |\n"
           "|---|---|---|---|---|---|---|")


def _table_row(row: dict) -> str:
    def fmt(key, scale=1.0, spec=".3f"):
        return "-" if row.get(key) is None else format(row[key] / scale, spec)

    return (f"| {curve_label(row)} | {budget_text(row)} | {fmt('peak_activation_bytes', GIB)} | {fmt('step_ms', spec='.1f')} "
            f"| {fmt('predicted_peak_bytes', GIB)} | {fmt('plan_seconds', spec='.1f')} | {row.get('status') or '-'} |")


def targets(rows: list[dict]) -> list[str]:
    """The Pareto targets, as markdown lines with the figures that decide them.

    1. For every torch.compile point, a planner point with no more memory and no more step time.
    2. A planner point with at most 0.8x the memory of torch.compile's smallest-memory point
       at no more than its step time.
    """
    torch_rows = [r for r in rows if r["method"] == "torch.compile"]
    ours = [r for r in rows if r["method"] == "planner"]
    if not torch_rows or not ours:
        return ["targets need torch.compile and planner rows"]
    lines = ["| torch.compile budget | its GiB / ms | best planner point with no more memory | ratio of step time | dominated |",
             "|---|---|---|---|---|"]
    met = 0
    for t in torch_rows:
        best = fastest_within(ours, t)
        ok = best is not None and best["step_ms"] <= t["step_ms"]
        met += ok
        point = "none" if best is None else f"{_point(best)}: {best['peak_activation_bytes'] / GIB:.3f} GiB / {best['step_ms']:.1f} ms"
        ratio = "-" if best is None else f"{best['step_ms'] / t['step_ms']:.3f}"
        lines.append(f"| {t['budget']:g} | {t['peak_activation_bytes'] / GIB:.3f} / {t['step_ms']:.1f} | {point} | {ratio} | {'yes' if ok else 'no'} |")
    smallest = min(torch_rows, key=lambda r: r["peak_activation_bytes"])
    small = [r for r in ours if r["peak_activation_bytes"] <= 0.8 * smallest["peak_activation_bytes"] and r["step_ms"] <= smallest["step_ms"]]
    best = min(small, key=lambda r: r["peak_activation_bytes"], default=None)
    lines += ["", f"- Dominated torch.compile points: {met} of {len(torch_rows)} (target: all)."]
    lines.append(f"- torch.compile's smallest-memory point: budget {smallest['budget']:g}, "
                 f"{smallest['peak_activation_bytes'] / GIB:.3f} GiB at {smallest['step_ms']:.1f} ms; planner points with at most "
                 f"0.8x that memory and no more step time: {len(small)}"
                 + ("" if best is None else f" (least memory: {_point(best)}, "
                    f"{best['peak_activation_bytes'] / GIB:.3f} GiB = {best['peak_activation_bytes'] / smallest['peak_activation_bytes']:.2f}x, "
                    f"{best['step_ms']:.1f} ms)") + " (target: at least one).")
    return lines


def write(rows: list[dict], out: Path, device: str, torch_version: str) -> None:
    """``out``.json, .md and .png of the rows."""
    from planner.comparison import plot_measured

    save_rows(out.with_suffix(".json"), device, torch_version, rows)
    model = rows[0]["model"] if rows else "?"
    text = [f"{device}, torch {torch_version}, model {model}", "", _HEADER, *map(_table_row, rows), "", *targets(rows)]
    out.with_suffix(".md").write_text("\n".join(text) + "\n")
    plot_measured(rows, out.with_suffix(".png"), title=f"{model} on {device}")
    print("\n".join(targets(rows)))
    print(f"wrote {out.with_suffix('.json')}, .md, .png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt", choices=["gpt", "gpt-large", "resnet"])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=METHODS)
    parser.add_argument("--solvers", nargs="+", default=SOLVERS)
    parser.add_argument("--budgets", type=float, nargs="+", default=BUDGETS)
    parser.add_argument("--extra-budgets", type=float, nargs="*", default=EXTRA, help="planned too, between --budgets")
    parser.add_argument("--estimator", default="profile")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve (ilp, cpsat, the frugal end)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3,
                        help="after all points ran, time them again in this many interleaved rounds of --steps "
                             "steps each and report those medians (0: keep each point's own timing)")
    parser.add_argument("--matched", action=argparse.BooleanOptionalAction, default=True,
                        help="also plan each solver at each torch.compile point's measured peak activation memory "
                             "as an absolute budget (default on)")
    parser.add_argument("--out", type=Path, default=None, help="output path without suffix (default bench/results/pareto-<model>)")
    parser.add_argument("--report", type=Path, nargs="+", help="merge these JSON files instead of measuring")
    args = parser.parse_args(argv)
    out = args.out or RESULTS / f"pareto-{args.model}"
    if args.report:
        try:
            device, version, rows = merge_runs(args.report)
        except ValueError as err:
            parser.error(str(err))
        write(rows, out, device, version)
        return
    import torch

    if not torch.cuda.is_available():
        parser.error("this benchmark measures GPU memory and needs CUDA; run it on a GPU machine")
    write(run(args, out), out, torch.cuda.get_device_name(), torch.__version__)


if __name__ == "__main__":
    main()
