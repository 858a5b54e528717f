"""Predicted vs measured peak activation memory on the GPU, per peak-memory budget.

For the GPT-style stack (8 layers, d_model 1024, 16 heads, seq 2048, batch 8, vocab 8192, bf16)
and a ResNet-18-style CNN (batch 64, 224x224, bf16), the planner runs through torch.compile with
inductor at each budget. Per point: the simulated peak of the emitted graphs
(:func:`planner.memory.simulate`, the prediction), the peak the solver bounded, the measured
peak activation memory (``max_memory_allocated`` during a step minus ``memory_allocated``
before it), the median step time over ``--steps`` CUDA-event-timed steps after the warm-up steps,
and the plan time.

    python -m bench.gpu_memory [--models gpt resnet] [--budgets 1 0.8 0.6 0.4 0.2 0] [--solver cpsat]
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch

import planner
from planner.bounds import save_all_plan
from bench import save_rows
from bench.gpu_step import measure
from bench.workloads import WORKLOADS, own_frame

RESULTS = Path(__file__).parent / "results"
GIB = 2**30


MODELS = {name: WORKLOADS[name] for name in ("gpt", "resnet")}


def run_point(base, batch, budget: float | int, solver: str, time_limit: float, steps: int, estimator: str = "flops",
              keep: list | None = None) -> dict:
    """Plan ``base`` through torch.compile at ``budget`` (a fraction, or bytes); measured and
    predicted figures of one step. With ``keep``, the compiled model and its parameters are
    appended to it, to be measured and timed again (:func:`bench.gpu_step.again_together`)."""
    model = copy.deepcopy(base)
    config = planner.PlannerConfig(codegen="inductor", memory_budget=budget, solver=solver, time_limit=time_limit,
                                   estimator=estimator)
    backend = planner.backend(config)
    start = time.perf_counter()
    compiled, params = torch.compile(own_frame(model), backend=backend), list(model.parameters())
    result = measure(compiled, params, batch, steps)
    (graph,) = backend.graphs
    (timeline,) = backend.timelines
    if keep is not None:
        keep.append((compiled, params))
    return {
        "budget": budget,
        "solver": solver,
        "estimator": estimator,
        **result,
        "predicted_peak_bytes": timeline.peak,
        "predicted_peak_step": timeline.peak_step,
        "bounded_peak_bytes": graph.decision.peak_bytes,
        "budget_bytes": graph.decision.budget_bytes,
        "status": graph.decision.status,
        "gap": graph.decision.gap,
        "recompute_seconds": graph.decision.recompute_seconds,
        "save_seconds": graph.decision.save_seconds,
        # predicted step-time change against the plan that saves everything the backward reads
        "overhead_seconds": graph.decision.seconds - save_all_plan(graph.problem).seconds,
        "forward_seconds": float(graph.problem.runtime.sum()),  # every forward node once, as estimated
        "estimated_step_seconds": graph.step_seconds,
        "plan_seconds": graph.plan_seconds,
        "first_step_seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["gpt", "resnet"])
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.8, 0.6, 0.4, 0.2, 0.0])
    parser.add_argument("--solver", default="cpsat")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_memory.json")
    args = parser.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, solver {args.solver}")
    print("| model | budget | predicted peak GiB | measured peak GiB | error | step ms | solver bound GiB | status | plan s |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for name in args.models:
        base, batch = MODELS[name]()
        for budget in args.budgets:
            row = {"model": name, **run_point(base, batch, budget, args.solver, args.time_limit, args.steps)}
            rows.append(row)
            measured, predicted = row["peak_activation_bytes"], row["predicted_peak_bytes"]
            print(f"| {name} | {budget:g} | {predicted / GIB:.3f} | {measured / GIB:.3f} | {(predicted - measured) / measured:+.1%} "
                  f"| {row['step_ms']:.1f} | {row['bounded_peak_bytes'] / GIB:.3f} | {row['status']} | {row['plan_seconds']:.1f} |",
                  flush=True)
        del base, batch
        torch.cuda.empty_cache()
    save_rows(args.out, torch.cuda.get_device_name(), torch.__version__, rows)


if __name__ == "__main__":
    main()
