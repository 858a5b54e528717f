"""Solver benchmark: plan time, objective and gap to the best, on the built-in GPT.

For each model size and budget, every registered solver, plus PyTorch's own knapsack solvers
(``torch._functorch._activation_checkpointing.knapsack``) run on the same candidate items as
the ``greedy``/``dp`` solvers. Every objective is measured on the graph by
``planner.problem.evaluate``; the gap is to the best plan any method found at that budget.

    python -m bench.solvers [--layers 4 12 48] [--budgets 0.1 0.3 0.5 0.8] [--time-limit 30]
    python -m bench.solvers --cold [--layers 4 12 48 96] [--methods greedy dp mincut cpsat ilp] [--repeats 3]

Budget fractions are of the range from the most frugal plan's peak to the runtime-optimal
plan's. The most frugal plan is searched once per model and kept in the planner's cache
directory (:func:`solvers.frugal.min_peak_plan`), so a second run on the machine solves the same
budgets in bytes; the run says where budget 0 came from.

Prints a markdown table and writes ``bench/results/solvers.json``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from estimators import get_estimator
from planner import _torch_compat
from planner.bounds import min_memory_plan
from planner.budget import Budget
from planner.cli import time_limit_arg
from planner.build import build_problem
from planner.errors import SolverError
from planner.models import GPTConfig, gpt_example
from planner.problem import Problem, evaluate
from planner.tracing import capture
from solvers import available_solvers, get_solver
from solvers.frugal import min_peak_plan
from solvers.knapsack_items import knapsack_items

RESULTS = Path(__file__).parent / "results"


def our_solvers(time_limit: float) -> dict:
    methods = {name: (lambda name=name: get_solver(name, time_limit=time_limit)) for name in available_solvers()}
    methods["ilp-cbc"] = lambda: get_solver("ilp", time_limit=time_limit, backend="cbc")
    return methods


def run_ours(problem: Problem, budget: int, make) -> dict:
    try:
        d = make().solve(problem, budget)
    except SolverError as err:
        return {"error": str(err)}
    return {"seconds": d.solve_seconds, "objective": d.seconds, "memory": d.memory_bytes,
            "status": d.status, "proven_gap": d.gap}


def run_pytorch(problem: Problem, budget: int, solve) -> dict:
    """PyTorch's knapsack on our candidate items (memory as fractions of their total, as PyTorch does)."""
    start = time.perf_counter()
    frugal = min_memory_plan(problem)
    items = knapsack_items(problem, frugal)
    total = float(items.weight.sum()) or 1.0
    capacity = (budget - frugal.memory_bytes) / total
    _, saved, _ = solve((items.weight / total).tolist(), items.value.tolist(), capacity)
    mask = frugal.saved.copy()
    mask[items.index[np.asarray(saved, dtype=np.int64)]] = True
    result = evaluate(problem, mask)
    return {"seconds": time.perf_counter() - start, "objective": result.seconds,
            "memory": result.memory_bytes, "status": "heuristic", "proven_gap": None,
            "over_budget": result.memory_bytes > budget}


def bench(layers: list[int], budgets: list[float], time_limit: float, methods: list[str] | None) -> list[dict]:
    ours, theirs = our_solvers(time_limit), _torch_compat.pytorch_knapsack_solvers()
    rows = []
    for n_layer in layers:
        model, batch = gpt_example(GPTConfig(n_layer=n_layer))
        joint = capture(model, batch)
        problem = build_problem(joint, get_estimator("flops"))
        min_memory_plan(problem)  # shared by every solver: not part of any one's time
        end = min_peak_plan(problem)  # budget 0, searched once per model (and kept on disk)
        frugal = {"frugal_peak_bytes": int(end.plan.peak_bytes), "frugal_proven": end.optimal,
                  "frugal_cache": end.stats.get("cache")}
        for fraction in budgets:
            budget = Budget(fraction=fraction).resolve(problem)
            results = {}
            for name, make in ours.items():
                if methods is None or name in methods:
                    results[name] = run_ours(problem, budget, make)
            for name, solve in theirs.items():
                if methods is None or name in methods:
                    results[name] = run_pytorch(problem, budget, solve)
            best = min(r["objective"] for r in results.values() if "objective" in r and not r.get("over_budget"))
            for name, r in results.items():
                gap = (r["objective"] - best) / best if "objective" in r and best > 0 else None
                rows.append({"layers": n_layer, "joint_nodes": len(joint), "forward_nodes": len(problem),
                             "budget": fraction, "budget_bytes": budget, **frugal, "method": name, "gap_to_best": gap, **r})
                print(_row(rows[-1]), flush=True)
    return rows


def cold(layers: list[int], budgets: list[float], solvers: list[str], time_limit: float | str, repeats: int = 3,
         best_known: float | None = None) -> list[dict]:
    """Cold plan time against PyTorch's partition time on the same joint graph, each the median
    of ``repeats`` runs (a 2-core machine's single runs move by up to 2x).

    Ours: :func:`planner.solve.solve_graph` (estimate, build the problem, resolve the budget,
    solve) and :func:`planner.emit.emit` (the forward and backward modules), as a new process
    with an empty cache directory plans it (the process-wide caches emptied before each run).
    PyTorch's: ``min_cut_rematerialization_partition`` at ``activation_memory_budget`` = the
    fraction (its own knapsack and split). Both on a fresh copy of the captured joint graph (the
    copy is not timed).

    With ``best_known`` (seconds), one ``cpsat`` solve of that length per budget, warm (not
    timed), on the same problem and budget in bytes, and every row's ``gap_to_best``: its
    objective over the best of that solve's and every row's at the budget, less one.
    """
    import copy
    import statistics
    import tempfile

    from planner.solve import solve_graph
    from planner.config import PlannerConfig
    from planner.emit import emit
    from planner.graph import JointGraph

    partition = _torch_compat.pytorch_partition()

    def pytorch_seconds(joint, fraction: float) -> float:
        gm = copy.deepcopy(joint.module)
        start = time.perf_counter()
        with torch._functorch.config.patch(activation_memory_budget=fraction):
            partition(gm, joint.joint_inputs, num_fwd_outputs=joint.num_fwd_outputs)
        return time.perf_counter() - start

    def our_seconds(joint, config: PlannerConfig):
        mine = JointGraph(copy.deepcopy(joint.module), joint.num_fwd_outputs, joint.joint_inputs)
        with tempfile.TemporaryDirectory() as cache, cache_dir(cache):  # cold, and the setting left as it was
            forget_what_the_process_found()
            start = time.perf_counter()
            graph_plan = solve_graph(mine, config)
            emit(mine, graph_plan.problem, graph_plan.decision.saved)
            return time.perf_counter() - start, graph_plan.decision, graph_plan.problem

    rows = []
    for n_layer in layers:
        model, batch = gpt_example(GPTConfig(n_layer=n_layer))
        joint = capture(model, batch)
        for fraction in budgets:
            theirs = statistics.median(pytorch_seconds(joint, fraction) for _ in range(repeats))
            point = []
            for solver in solvers:
                config = PlannerConfig(memory_budget=fraction, solver=solver, estimator="flops",
                                       time_limit=time_limit, codegen="eager")
                runs = [our_seconds(joint, config) for _ in range(repeats)]
                seconds, d, problem = statistics.median(r[0] for r in runs), runs[-1][1], runs[-1][2]
                point.append({"layers": n_layer, "joint_nodes": len(joint), "budget": fraction, "method": solver,
                              "cold_seconds": seconds, "pytorch_partition_seconds": theirs,
                              "ratio": seconds / theirs, "objective": d.seconds, "peak_bytes": d.peak_bytes,
                              "budget_bytes": d.budget_bytes, "status": d.status, "proven_gap": d.gap,
                              "time_limit_s": d.stats["time_limit"]["seconds"], "time_limit_rule": d.stats["time_limit"]["rule"],
                              "repeats": repeats})
                if best_known is None:
                    print(_cold_row(point[-1]), flush=True)
            if best_known is not None:
                long = get_solver("cpsat", time_limit=best_known).solve(problem, point[0]["budget_bytes"])
                best = min([long.seconds] + [r["objective"] for r in point])
                for r in point:
                    r.update(gap_to_best=r["objective"] / best - 1, best_known=best, best_known_status=long.status,
                             best_known_seconds=best_known)
                    print(_cold_row(r), flush=True)
            rows += point
    return rows


def forget_what_the_process_found() -> None:
    """Empty what plans leave in the process (frugal and reference plans, flop counts, PyTorch's
    splits, decisions): what a new process starts without, for a cold plan."""
    from estimators import flops
    from planner import torch_split
    from planner.decisions import forget_decisions
    from solvers import frugal, reference

    for found in (frugal._FOUND, reference._FOUND, flops._COUNTED, torch_split._PYTORCH_SPLITS):
        found.clear()
    forget_decisions()


@contextlib.contextmanager
def cache_dir(path: str):
    """``ACPLAN_CACHE_DIR`` set to ``path`` inside, as it was after."""
    before = os.environ.get("ACPLAN_CACHE_DIR")
    os.environ["ACPLAN_CACHE_DIR"] = path
    try:
        yield
    finally:
        if before is None:
            del os.environ["ACPLAN_CACHE_DIR"]
        else:
            os.environ["ACPLAN_CACHE_DIR"] = before


COLD_HEADER = ("| layers | joint nodes | budget | method | cold plan s | PyTorch partition s | ratio | status | proven gap "
               "| gap to best known |\n|---|---|---|---|---|---|---|---|---|---|")


def _cold_row(r: dict) -> str:
    proven = "-" if r["proven_gap"] is None else f"{r['proven_gap']:.2%}"
    return (f"| {r['layers']} | {r['joint_nodes']} | {r['budget']} | {r['method']} | {r['cold_seconds']:.3f} "
            f"| {r['pytorch_partition_seconds']:.3f} | {r['ratio']:.2f}x | {r['status']} | {proven} "
            f"| {'-' if 'gap_to_best' not in r else format(r['gap_to_best'], '.2%')} |")


HEADER = ("| layers | joint nodes | budget | method | plan time s | objective (estimated µs) "
          "| gap to best | status | proven gap |\n|---|---|---|---|---|---|---|---|---|")


def _row(r: dict) -> str:
    if "error" in r:
        return f"| {r['layers']} | {r['joint_nodes']} | {r['budget']} | {r['method']} | - | - | - | {r['error']} | - |"
    proven = "-" if r["proven_gap"] is None else f"{r['proven_gap']:.2%}"
    status = r["status"] + (" (over budget)" if r.get("over_budget") else "")
    return (f"| {r['layers']} | {r['joint_nodes']} | {r['budget']} | {r['method']} | {r['seconds']:.3f} | "
            f"{r['objective'] * 1e6:.3f} | {r['gap_to_best']:.2%} | {status} | {proven} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Compare solvers on the built-in GPT.")
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 12, 48])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.8])
    parser.add_argument("--time-limit", type=time_limit_arg, default=None,
                        help="seconds per solve (default 30; --cold: auto, the planner's default)")
    parser.add_argument("--methods", nargs="+", help="only these methods (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS / "solvers.json")
    parser.add_argument("--cold", action="store_true",
                        help="cold plan time (empty cache, budget resolution included) against PyTorch's partition "
                             "time, per solver of --methods (default greedy dp mincut cpsat ilp)")
    parser.add_argument("--repeats", type=int, default=3, help="--cold: runs per point, the median reported (default 3)")
    parser.add_argument("--best-known", type=float, default=None,
                        help="--cold: seconds of one cpsat solve per budget, for each row's gap to the best plan known")
    args = parser.parse_args(argv)
    if args.cold:
        args.time_limit = "auto" if args.time_limit is None else args.time_limit
        print(COLD_HEADER, flush=True)
        rows = cold(args.layers, args.budgets, args.methods or ["greedy", "dp", "mincut", "cpsat", "ilp"], args.time_limit,
                    args.repeats, args.best_known)
        out = args.out.with_name(args.out.stem + "-cold.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": {"torch": torch.__version__, "cpus": os.cpu_count(),
                                            "time_limit": args.time_limit, "repeats": args.repeats,
                                            "best_known": args.best_known}, "rows": rows}, indent=1))
        print(f"wrote {out}")
        return
    args.time_limit = 30.0 if args.time_limit is None else args.time_limit
    if args.time_limit == "auto":
        parser.error("--time-limit auto is for --cold; give seconds")
    print(HEADER, flush=True)
    rows = bench(args.layers, args.budgets, args.time_limit, args.methods)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "machine": platform.machine(), "cpus": __import__("os").cpu_count(),
            "time_limit": args.time_limit}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print()
    for r in {r["layers"]: r for r in rows}.values():
        print(f"{r['layers']} layers: budget 0 = {r['frugal_peak_bytes']} bytes, "
              f"{'proven least' if r['frugal_proven'] else 'not proven least'}"
              + (f", read from {r['frugal_cache']}" if r["frugal_cache"] else ", searched in this run"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
