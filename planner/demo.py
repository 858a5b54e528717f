"""Demo: plan the built-in GPT with every solver at three budgets, and train one step with each.

    python -m planner.demo [--layers 4] [--codegen eager|inductor]
"""
from __future__ import annotations

import argparse
import copy

import torch

from planner.api import Plan
from planner.check import train_step
from planner.solve import solve_graph
from planner.config import PlannerConfig
from planner.models import GPTConfig, gpt_example
from planner.tracing import capture
from solvers import available_solvers

BUDGETS = (1.0, 0.5, 0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    parser.add_argument("--codegen", choices=("eager", "inductor"), default="eager",
                        help="how the planned graphs run (default eager: fast to compile on CPU)")
    parser.add_argument("--estimator", default="auto", help="runtime estimator (default auto: roofline on CUDA, flops elsewhere)")
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve (default 10)")
    args = parser.parse_args(argv)

    cfg = GPTConfig(n_layer=args.layers)
    model, batch = gpt_example(cfg)
    reference = copy.deepcopy(model)
    eager = train_step(reference, reference, batch)
    eager_loss, eager_grads = eager.output.item(), eager.grads
    joint = capture(model, batch, codegen=args.codegen)
    print(f"GPT: {cfg.n_layer} layers, d_model {cfg.d_model}, seq {cfg.seq_len}, batch {cfg.batch}; "
          f"joint graph of {len(joint)} nodes; eager loss {eager_loss:.6f}\n")
    print("| solver | budget | predicted peak MiB | saved MiB | predicted recompute overhead | plan time ms | status | loss | max grad diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for solver in available_solvers():
        for budget in BUDGETS:
            config = PlannerConfig(memory_budget=budget, solver=solver, estimator=args.estimator, codegen=args.codegen,
                                   time_limit=args.time_limit)
            graph_plan = solve_graph(joint, config)
            torch._dynamo.reset()  # each plan compiles a fresh copy; keep dynamo's per-code cache small
            twin = copy.deepcopy(model)
            planned = Plan(twin, graph_plan, config)
            done = train_step(planned.module, twin, batch)
            loss, grads = done.output.item(), done.grads
            diff = max((grads[n] - g).abs().max().item() for n, g in eager_grads.items())
            worst = max(worst, diff, abs(loss - eager_loss))
            p = planned.predicted
            print(f"| {solver} | {budget} | {p.peak_bytes / 2**20:.3f} | {p.saved_bytes / 2**20:.3f} | {p.overhead:.1%} | "
                  f"{graph_plan.plan_seconds * 1e3:.0f} | {planned.decision.status} | {loss:.6f} | {diff:.1e} |")
    ok = worst <= 1e-5
    print(f"\nevery planned step {'matches' if ok else 'DOES NOT match'} eager (largest difference {worst:.1e})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
