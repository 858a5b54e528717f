"""Offloading on the GPU: plans that save and recompute only, against the same plans with the
saved values the host link can carry offloaded (:func:`planner.offload.offloaded_decision`).

The GPT of ``bench/gpu_step.py`` (bf16) in one process: the link measured first (pinned copies
each way), then per budget the planner's plan, and that plan with every saved value offloaded
that lowers its memory without the placed copies outrunning the estimated compute. Peak
activation memory and step time as ``bench/zoo.py`` measures them, timed again interleaved at
the end; the predicted peak (the schedule's, with the transfers) and the simulated one beside
the measured.

    python -m bench.offload [--layers 8] [--budgets 1.0 0.5 0.0] [--rounds 3]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import time
from pathlib import Path

from bench import save_rows

RESULTS = Path(__file__).parent / "results"
GIB = 2**30


def main(argv: list[str] | None = None) -> None:
    import torch

    import planner
    from bench.gpu_step import measure, retime
    from estimators import get_estimator
    from planner.compiler import PlannerBackend
    from planner.frames import own_frame
    from planner.models import GPTConfig, gpt_example
    from planner.offload import measure_link, offloaded_decision, op_seconds

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.5, 0.0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--min-mib", type=float, default=1.0, help="offload no value smaller than this")
    parser.add_argument("--out", type=Path, default=RESULTS / "offload.json")
    args = parser.parse_args(argv)

    cfg = GPTConfig(n_layer=args.layers, d_model=1024, n_head=16, seq_len=2048, vocab=8192, dropout=0.0, batch=8)
    base, batch = gpt_example(cfg, device="cuda")
    base = base.to(torch.bfloat16)
    link = measure_link("cuda")
    bandwidth = min(link.values())
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; GPT {cfg}")
    print(f"link: device to host {link['device_to_host'] / 1e9:.1f} GB/s, host to device "
          f"{link['host_to_device'] / 1e9:.1f} GB/s", flush=True)
    joint = planner.capture(base, batch, codegen="inductor")
    estimator = get_estimator("roofline")
    estimator.prepare([n for n in joint.graph.nodes if n.op == "call_function"])
    runtime = op_seconds(estimator, fuse=True)

    rows, kept = [], []
    device = torch.cuda.get_device_name()

    def record(row: dict, graph_plan, config) -> None:
        model = copy.deepcopy(base)
        backend = PlannerBackend(config, fixed=graph_plan)
        run = torch.compile(own_frame(model), backend=backend, fullgraph=True, dynamic=False)
        row.update(measure(run, list(model.parameters()), batch, args.steps))
        row["simulated_peak_bytes"] = backend.timelines[-1].peak
        kept.append((run, list(model.parameters())))
        rows.append(row)
        save_rows(args.out, device, torch.__version__, rows)
        print(_line(row), flush=True)

    print(_HEADER, flush=True)
    for budget in args.budgets:
        plan = planner.plan(base, batch, planner.PlannerConfig(memory_budget=budget))
        problem, decision = plan.graph_plan.problem, plan.decision
        record({"method": "planner", "budget": budget, "offloaded": 0, "offloaded_bytes": 0,
                "predicted_peak_bytes": decision.peak_bytes}, plan.graph_plan, plan.config)
        start = time.perf_counter()
        offloaded = offloaded_decision(joint, problem, decision, runtime, 0, bandwidth, int(args.min_mib * 2**20))
        seconds = time.perf_counter() - start
        note = offloaded.stats["offload"]
        record({"method": "planner + offload", "budget": budget, "offloaded": note["offloaded"],
                "offloaded_bytes": note["offloaded_bytes"], "predicted_peak_bytes": offloaded.peak_bytes,
                "choose_seconds": seconds}, dataclasses.replace(plan.graph_plan, decision=offloaded), plan.config)
    for row, ms in zip(rows, retime(kept, batch, args.rounds, args.steps)):
        row["step_ms_alone"], row["step_ms"] = row["step_ms"], ms
    rows.append({"method": "link", **{f"{k}_bytes_per_second": v for k, v in link.items()}})
    save_rows(args.out, device, torch.__version__, rows)
    print("\ntimed again, interleaved:\n" + _HEADER)
    print("\n".join(_line(r) for r in rows if r["method"] != "link"))


_HEADER = ("| method | budget | offloaded (MiB) | peak activation GiB | predicted | simulated | step ms |\n"
           "|---|---|---|---|---|---|---|")


def _line(row: dict) -> str:
    return (f"| {row['method']} | {row['budget']} | {row['offloaded']} ({row['offloaded_bytes'] / 2**20:.0f}) | "
            f"{row['peak_activation_bytes'] / GIB:.3f} | {row['predicted_peak_bytes'] / GIB:.3f} | "
            f"{row['simulated_peak_bytes'] / GIB:.3f} | {row['step_ms']:.2f} |")


if __name__ == "__main__":
    main()
