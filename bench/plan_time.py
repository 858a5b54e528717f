"""Where a cold plan's time goes on real models: the capture, the problem (the memory model's
schedule), one plan's simulation, and whole plans.

Per model of ``bench/zoo_models.py`` (bench size unless ``--size tiny``; float32 on a CPU, bf16 on CUDA), in one
process: the seconds to capture the joint graph with inductor's code generation, to build its
problem, to simulate the emitted modules of one fixed plan (the runtime-optimal one; the least
and the median of ``--repeats``), and a cold ``planner.plan`` per budget (an empty cache and
nothing kept in the process, the default solver and time limit); a model that graph breaks is
planned as ``planner.compile`` plans it, graph by graph in its first step, and has its plans'
seconds summed alone. The plans' predicted peaks and estimated seconds are printed
beside their times: the time-limited searches may end on other plans from run to run, so two
commits compare on the capture, problem and simulation columns, and on whole plans only where
the plans are the same.

    python -m bench.plan_time [--models t5 deberta qwen2] [--budgets 0] [--repeats 7] [--device cpu]
                              [--prices H100]

``--prices H100`` prices the graphs as the default planner prices them on that GPU (the
``roofline`` estimator at the datasheet's bf16 rates, :data:`estimators.roofline.DATASHEET`),
the models in bf16 as on the GPU, while they are captured on the CPU; by default the default
estimator prices them (``flops`` on a CPU).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench import save_rows
from estimators.roofline import DATASHEET

RESULTS = Path(__file__).parent / "results"


def main(argv: list[str] | None = None) -> None:
    import planner
    from bench.zoo_models import build
    from estimators import get_estimator
    from planner.bounds import runtime_optimal_plan
    from planner.build import build_problem
    from planner.predict import simulated_timeline

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["t5", "deberta", "qwen2"])
    parser.add_argument("--budgets", type=float, nargs="*", default=[0.0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=["bench", "tiny"], default="bench")
    parser.add_argument("--prices", choices=sorted(DATASHEET), default=None,
                        help="price the graphs with the roofline at this GPU's datasheet rates (default: the default estimator)")
    parser.add_argument("--out", type=Path, default=RESULTS / "plan_time.json")
    args = parser.parse_args(argv)
    settings = _estimator_settings(args.prices)
    config = planner.PlannerConfig(**settings)  # the problem column prices as the plans do
    dtype = torch.float32 if args.device == "cpu" and not args.prices else torch.bfloat16
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    print(f"{device}, torch {torch.__version__}, {'roofline at ' + args.prices + ' datasheet rates' if args.prices else 'default estimator'}")
    print("| model | joint nodes | capture s | problem s | simulation s (least / median) | budget | plan s | "
          "predicted peak GiB | estimated ms |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for name in args.models:
        model, batch = build(name, args.size, args.device, dtype)
        start = time.perf_counter()
        try:
            joint = planner.capture(model, list(batch), codegen="inductor")
        except planner.CaptureError as err:
            if not str(err).startswith("graph break"):
                raise
            for budget in args.budgets:  # planned graph by graph, as planner.compile plans them
                rows.append(_compiled_plans(name, model, batch, budget, settings))
                save_rows(args.out, device, torch.__version__, rows)
                print(_line(rows[-1]), flush=True)
            continue
        capture = time.perf_counter() - start
        start = time.perf_counter()
        estimator = get_estimator(config.estimator, **config.estimator_options)
        problem = build_problem(joint, estimator, fuse=True)
        problem_seconds = time.perf_counter() - start
        saved = tuple(problem.names[i] for i in np.flatnonzero(runtime_optimal_plan(problem).saved))
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            simulated_timeline(joint, problem, saved, True)
            times.append(time.perf_counter() - start)
        row = {"model": name, "nodes": len(joint.graph.nodes), "capture_seconds": capture, "problem_seconds": problem_seconds,
               "simulation_seconds_least": min(times), "simulation_seconds_median": statistics.median(times),
               "estimator": str(estimator)}
        for budget in args.budgets or [None]:  # no budgets: the parts alone
            point = {**row, "budget": budget}
            if budget is not None:
                with _cold():  # the flop counts of the problem above forgotten too
                    start = time.perf_counter()
                    found = planner.plan(model, list(batch), memory_budget=budget, config=config)
                    point.update(plan_seconds=time.perf_counter() - start, predicted_peak_bytes=found.decision.peak_bytes,
                                 estimated_seconds=found.decision.seconds, plan_estimator=found.graph_plan.estimator)
            rows.append(point)
            save_rows(args.out, device, torch.__version__, rows)
            print(_line(point), flush=True)


@contextlib.contextmanager
def _cold():
    """A cold plan: an empty cache of its own, and nothing solved or counted before kept in the process."""
    from bench.solvers import cache_dir, forget_what_the_process_found

    with tempfile.TemporaryDirectory() as cache, cache_dir(cache):
        forget_what_the_process_found()
        yield


def _estimator_settings(prices: str | None) -> dict:
    """The planner's settings for ``--prices``: none (the defaults), or the roofline at that GPU's
    datasheet rates, which the default estimator (``auto``) would calibrate on the GPU itself."""
    if prices is None:
        return {}
    rates = DATASHEET[prices]
    return {"estimator": "roofline", "estimator_options": {"calibrate": False, "flops_per_second": rates.half_flops,
                                                          "bytes_per_second": rates.bandwidth}}


def _compiled_plans(name: str, model: torch.nn.Module, batch: tuple, budget: float, settings: dict) -> dict:
    """A model that graph breaks, cold at ``budget``: ``planner.compile``'s first step plans each
    graph; the row has the plans' seconds summed (the capture, problem and simulation columns are
    single-graph figures, so none), and the step's predicted peak."""
    import copy

    import planner

    with _cold():
        torch._dynamo.reset()
        compiled = planner.compile(copy.deepcopy(model), memory_budget=budget, **settings)
        compiled(*batch).backward()
    graphs = compiled.planner_backend.graphs
    return {"model": name, "graphs": len(graphs), "nodes": sum(len(g.problem.names) for g in graphs), "budget": budget,
            "plan_seconds": sum(g.plan_seconds for g in graphs),
            "predicted_peak_bytes": compiled.planner_backend.predicted_step_peak,
            "estimated_seconds": sum(g.decision.seconds for g in graphs)}


def _line(row: dict) -> str:
    plan = (f"{row['budget']} | {row['plan_seconds']:.1f} | {row['predicted_peak_bytes'] / 2**30:.3f} | "
            f"{row['estimated_seconds'] * 1e3:.3f}" if row["budget"] is not None else "- | - | - | -")
    if "graphs" in row:  # a model planned graph by graph: no single-graph columns
        return f"| {row['model']} | {row['graphs']} graphs, {row['nodes']} forward nodes | - | - | - | {plan} |"
    return (f"| {row['model']} | {row['nodes']} | {row['capture_seconds']:.2f} | {row['problem_seconds']:.2f} | "
            f"{row['simulation_seconds_least']:.2f} / {row['simulation_seconds_median']:.2f} | {plan} |")


if __name__ == "__main__":
    main()
