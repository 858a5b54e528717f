"""Estimators against the GPU: predicted recompute overhead vs measured step-time increase.

On the GPT-style stack of ``bench.gpu_memory`` (8 layers, d_model 1024, seq 2048, batch 8, bf16),
the planner (``--solver``, through torch.compile with inductor) plans at each budget with each
estimator. A plan's predicted overhead is its estimated seconds (recomputing, plus saving where
the estimator prices memory traffic) minus those of the plan that saves everything the backward
reads; its measured overhead is its median step time minus that of that no-recompute plan
(budget 1 with ``flops``, which saves everything whatever the budget), measured at the start and again at the end of the run
(their difference is the run's noise). Per estimator: Spearman's rank correlation between
predicted and measured overhead over the budgets, and the mean absolute error as a fraction of
the mean measured overhead (``constant`` counts ops, not seconds, so it has no error figure).
Per budget: each estimator's step time over the ``flops`` plan's.

    python -m bench.estimators [--estimators flops roofline profile] [--budgets 0.8 0.6 0.4 0.2 0]
    python -m bench.estimators --report part1.json part2.json   # merge runs of one device
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench import merge_runs, save_rows

RESULTS = Path(__file__).parent / "results"
ESTIMATORS = ["constant", "flops", "roofline", "profile"]


def run(args) -> list[dict]:
    import torch

    import planner
    from bench.gpu_memory import run_point
    from bench.workloads import WORKLOADS
    from estimators.profile import ProfileEstimator

    base, batch = WORKLOADS["gpt"]()
    if "profile" in args.estimators:  # profile once up front (fills the disk cache) and say what fell back
        joint = planner.capture(base, batch, codegen="inductor")
        profiler = ProfileEstimator()
        profiler.prepare([n for n in joint.graph.nodes if n.op == "call_function"])
        print(profiler.report(), flush=True)
        del joint
    rows = []

    def point(budget, estimator, role):
        row = {"role": role, **run_point(base, batch, budget, args.solver, args.time_limit, args.steps, estimator)}
        rows.append(row)
        save_rows(args.out, torch.cuda.get_device_name(), torch.__version__, rows)
        print(f"| {role} | {estimator} | {budget:g} | {row['step_ms']:.2f} | {_overhead(row) * 1e3:.3f} "
              f"| {row['peak_activation_bytes'] / 2**30:.3f} | {row['status']} |", flush=True)

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, solver {args.solver}")
    print("| role | estimator | budget | step ms | predicted overhead ms | peak GiB | status |\n|---|---|---|---|---|---|---|")
    point(1.0, "flops", "baseline")
    for estimator in args.estimators:
        for budget in args.budgets:
            point(budget, estimator, "plan")
    point(1.0, "flops", "baseline")
    return rows


def summarise(rows: list[dict]) -> list[str]:
    """The per-estimator accuracy table and the per-budget step-time comparison, as markdown."""
    from scipy.stats import spearmanr

    baselines = [r["step_ms"] for r in rows if r["role"] == "baseline"]
    base = statistics.median(baselines)
    plans = [r for r in rows if r["role"] == "plan"]
    lines = [f"No-recompute plan: {', '.join(f'{b:.2f}' for b in baselines)} ms (median {base:.2f}; "
             f"spread {max(baselines) - min(baselines):.2f} ms).", "",
             "| estimator | budget | predicted overhead ms | measured overhead ms | step ms |", "|---|---|---|---|---|"]
    for r in plans:
        lines.append(f"| {r['estimator']} | {r['budget']:g} | {_overhead(r) * 1e3:.3f} | {r['step_ms'] - base:.2f} | {r['step_ms']:.2f} |")
    lines += ["", "| estimator | Spearman | mean abs error / mean measured overhead | target |", "|---|---|---|---|"]
    for est in dict.fromkeys(r["estimator"] for r in plans):
        mine = [r for r in plans if r["estimator"] == est]
        predicted = [_overhead(r) * 1e3 for r in mine]
        measured = [r["step_ms"] - base for r in mine]
        rho = spearmanr(predicted, measured)[0] if len(mine) > 1 else float("nan")
        error = None if est == "constant" else statistics.mean(abs(p - m) for p, m in zip(predicted, measured)) / statistics.mean(measured)
        target = "-" if est not in ("profile", "roofline") else ("met" if rho >= 0.9 and error is not None and error <= 0.2 else "missed")
        lines.append(f"| {est} | {rho:.2f} | {'-' if error is None else f'{error:.0%}'} | {target} |")
    flops = {r["budget"]: r["step_ms"] for r in plans if r["estimator"] == "flops"}
    others = [e for e in dict.fromkeys(r["estimator"] for r in plans) if e in ("roofline", "profile")]
    if flops and others:
        lines += ["", "| budget | flops step ms | " + " | ".join(f"{e} / flops" for e in others) + " |",
                  "|---|---|" + "---|" * len(others)]
        for budget, ms in flops.items():
            ratios = [next((f"{r['step_ms'] / ms:.3f}" for r in plans if r["estimator"] == e and r["budget"] == budget), "-") for e in others]
            lines.append(f"| {budget:g} | {ms:.2f} | " + " | ".join(ratios) + " |")
    return lines


def _overhead(row: dict) -> float:
    """Predicted step-time change over the save-everything plan (runs before save costs: recompute)."""
    return row.get("overhead_seconds", row["recompute_seconds"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--estimators", nargs="+", default=ESTIMATORS)
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.8, 0.6, 0.4, 0.2, 0.0])
    parser.add_argument("--solver", default="cpsat")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS / "estimators.json")
    parser.add_argument("--report", type=Path, nargs="+", help="merge these JSON files instead of measuring")
    args = parser.parse_args(argv)
    if args.report:
        try:
            device, version, rows = merge_runs(args.report)
        except ValueError as err:
            parser.error(str(err))
    else:
        import torch

        if not torch.cuda.is_available():
            parser.error("this benchmark measures GPU step time and needs CUDA; run it on a GPU machine")
        device, version, rows = torch.cuda.get_device_name(), torch.__version__, run(args)
    save_rows(args.out, device, version, rows)
    text = "\n".join([f"{device}, torch {version}", "", *summarise(rows)])
    args.out.with_suffix(".md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
