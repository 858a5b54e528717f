"""Offloading on the GPU: plans that save and recompute only, against the same plans with the
saved values the host link can carry offloaded (:func:`planner.offload.offloaded_decision`).

The GPT of ``bench/gpu_step.py`` or the Llama-style model of ``bench/llama.py`` (16 layers by
default; bf16) in one process: the link measured first (pinned copies each way), then per
budget the planner's plan, and that plan with every saved value offloaded that lowers its memory
without the placed copies outrunning the estimated compute. Then the anchors, offloading what
they can: ``torch.compile`` with PyTorch's partitioner offloading every forward value it can
(``enable_activation_offloading`` on a separate stream, with its wait sinking and, where the
torch has it, its reload prefetching; every node marked ``should_offload``), and stock
``torch.compile`` with every saved activation offloaded through ``saved_tensors_hooks`` on a side
stream (:class:`OffloadAll`, torchtune's ``OffloadActivations`` in outline). An anchor that
fails says why in its row. Peak activation memory and step time as ``bench/zoo.py`` measures
them, timed again interleaved at the end; the predicted peak (the schedule's, with the
transfers) and the simulated one beside the measured.

Beside those, per budget, ``offload="auto"`` with the exact solver (``cpsat``), which chooses per
value whether to save, recompute or offload it (:mod:`solvers.offload`); and the same at absolute
budgets below the least peak without offloading (``--below``, fractions of it), where a budget
no plan meets is reported as such.

    python -m bench.offload [--model gpt|llama] [--layers N] [--batch B] [--budgets 1.0 0.5 0.0] [--rounds 3]
        [--no-greedy] [--below 0.9 0.75 0.6 0.5] [--time-limit S] [--explain N]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import time
from pathlib import Path

import torch

from bench import save_rows

RESULTS = Path(__file__).parent / "results"
GIB = 2**30


def main(argv: list[str] | None = None) -> None:
    import planner
    from bench.gpu_step import again_together, measure
    from estimators import get_estimator
    from planner.compiler import PlannerBackend
    from planner.offload_choice import offload_guides
    from planner.frames import own_frame
    from planner.models import GPTConfig, gpt_example
    from planner.offload import explain_windows, measure_link, offload_windows, offloaded_decision, op_seconds
    from planner.problem import evaluate_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["gpt", "llama"], default="gpt")
    parser.add_argument("--layers", type=int, default=None, help="default: 8 (gpt), 16 (llama)")
    parser.add_argument("--batch", type=int, default=None, help="default: 8 (gpt), 2 (llama)")
    parser.add_argument("--anchors", nargs="*", choices=list(ANCHORS), default=list(ANCHORS))
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.5, 0.0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--min-mib", type=float, default=1.0, help="offload no value smaller than this")
    parser.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=True,
                        help="also each budget's plan with the greedy offloads (planner.offload.offloaded_decision)")
    parser.add_argument("--below", type=float, nargs="*", default=[0.9, 0.75, 0.6, 0.5],
                        help="absolute budgets for offload='auto', as fractions of the least peak without offloading")
    parser.add_argument("--time-limit", type=float, default=None, help="the exact solver's, for offload='auto' plans")
    parser.add_argument("--explain", type=int, default=0, metavar="N",
                        help="after each offload='auto' plan, why its N largest saved values can or cannot leave")
    parser.add_argument("--out", type=Path, default=RESULTS / "offload.json")
    args = parser.parse_args(argv)

    if args.model == "gpt":
        cfg = GPTConfig(n_layer=args.layers or 8, d_model=1024, n_head=16, seq_len=2048, vocab=8192, dropout=0.0, batch=args.batch or 8)
        base, batch = gpt_example(cfg, device="cuda")
        base = base.to(torch.bfloat16)
    else:
        from bench.llama import LlamaConfig, llama_example

        cfg = LlamaConfig(n_layer=args.layers or 16, d_model=2048, n_head=16, n_kv_head=8, d_ff=5632, seq_len=2048,
                          vocab=32000, batch=args.batch or 2)
        base, batch = llama_example(cfg, device="cuda", dtype=torch.bfloat16)
    link = measure_link("cuda")
    bandwidth = min(link.values())
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.model} {cfg}")
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

    def exact(budget, label) -> None:
        """offload='auto' at ``budget``: the exact solver weighs save, recompute and offload."""
        settings = dict(offload="auto", offload_bandwidth=bandwidth, offload_min_bytes=int(args.min_mib * 2**20))
        if args.time_limit is not None:
            settings["time_limit"] = args.time_limit
        try:
            plan = planner.plan(base, batch, planner.PlannerConfig(memory_budget=budget, **settings))
        except planner.InfeasibleBudget as err:
            print(f"| offload auto | {label} | infeasible: {err} |", flush=True)
            failed.append({"method": "planner, offload auto", "budget": label, "failed": str(err)})
            return
        note = plan.decision.stats["offload"]
        if args.explain:
            problem = plan.graph_plan.problem
            chosen = evaluate_names(problem, plan.decision.saved)
            windows = offload_windows(joint, problem, runtime, bandwidth, settings["offload_min_bytes"],
                                      plan.config.offload_op_seconds, guides=offload_guides(problem, chosen))
            print("\n".join(f"  {line}" for line in explain_windows(joint, problem, windows, chosen, args.explain)),
                  flush=True)
        record({"method": f"planner, offload auto ({plan.decision.solver})", "budget": label,
                "offloaded": note["offloaded"], "offloaded_bytes": note["offloaded_bytes"],
                "predicted_peak_bytes": plan.decision.peak_bytes, "status": note["status"], "gap": note["gap"],
                "plan_seconds": plan.graph_plan.plan_seconds, "estimated_seconds": note["seconds_with_offload"],
                "estimated_seconds_without_offload": note["seconds_without_offload"]}, plan.graph_plan, plan.config)

    failed, floor = [], None
    print(_HEADER, flush=True)
    for budget in args.budgets:
        plan = planner.plan(base, batch, planner.PlannerConfig(memory_budget=budget))
        problem, decision = plan.graph_plan.problem, plan.decision
        record({"method": "planner", "budget": budget, "offloaded": 0, "offloaded_bytes": 0,
                "predicted_peak_bytes": decision.peak_bytes}, plan.graph_plan, plan.config)
        if budget == 0.0:
            floor = decision.peak_bytes
        if args.greedy:
            start = time.perf_counter()
            offloaded = offloaded_decision(joint, problem, decision, runtime, 0, bandwidth, int(args.min_mib * 2**20))
            seconds = time.perf_counter() - start
            note = offloaded.stats["offload"]
            record({"method": "planner + offload", "budget": budget, "offloaded": note["offloaded"],
                    "offloaded_bytes": note["offloaded_bytes"], "predicted_peak_bytes": offloaded.peak_bytes,
                    "choose_seconds": seconds}, dataclasses.replace(plan.graph_plan, decision=offloaded), plan.config)
        exact(budget, budget)
    if floor is None and args.below:
        floor = planner.plan(base, batch, planner.PlannerConfig(memory_budget=0.0)).decision.peak_bytes
    for fraction in args.below:
        exact(int(fraction * floor), f"{fraction:g} x least ({fraction * floor / GIB:.3f} GiB)")
    for name in args.anchors:
        model = copy.deepcopy(base)
        row = {"method": name, "budget": "-", "offloaded": "-", "offloaded_bytes": 0, "predicted_peak_bytes": 0,
               "simulated_peak_bytes": 0}
        try:
            run = ANCHORS[name](model)
            row.update(measure(run, list(model.parameters()), batch, args.steps))
        except Exception as err:  # an anchor this torch cannot run is reported, not fatal
            row["failed"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            print(f"| {name} | failed: {row['failed']} |", flush=True)
            failed.append(row)
            continue
        kept.append((run, list(model.parameters())))
        rows.append(row)
        save_rows(args.out, device, torch.__version__, rows)
        print(_line(row), flush=True)
    again_together(rows, kept, batch, args.rounds, args.steps)
    rows += failed
    rows.append({"method": "link", **{f"{k}_bytes_per_second": v for k, v in link.items()}})
    save_rows(args.out, device, torch.__version__, rows)
    print("\ntimed again, interleaved:\n" + _HEADER)
    print("\n".join(_line(r) for r in rows if r["method"] != "link" and "failed" not in r))


_HEADER = ("| method | budget | offloaded (MiB) | peak activation GiB | predicted | simulated | step ms |\n"
           "|---|---|---|---|---|---|---|")


def _line(row: dict) -> str:
    planned = [f"{row[k] / GIB:.3f}" if row[k] else "-" for k in ("predicted_peak_bytes", "simulated_peak_bytes")]
    return (f"| {row['method']} | {row['budget']} | {row['offloaded']} ({row['offloaded_bytes'] / 2**20:.0f}) | "
            f"{row['peak_activation_bytes'] / GIB:.3f} | {planned[0]} | {planned[1]} | {row['step_ms']:.2f} |")


class OffloadAll:
    """Every saved activation of at least ``min_bytes`` copied to host memory during the forward
    and back on its first use in the backward, through ``torch.autograd.graph.saved_tensors_hooks``
    (torchtune's ``OffloadActivations`` in outline). On CUDA the host copy is pinned and made on a
    side stream (``stream``), which the backward's copy back waits for; parameters (storages of
    ``params``) stay where they are. On a CPU the "host copy" is a clone, so the hooks can be
    tested there. ``packed`` and ``unpacked`` count the copies made each way."""

    def __init__(self, params=(), min_bytes: int = 1 << 20, stream: bool = True) -> None:
        self.keep = {p.untyped_storage().data_ptr() for p in params}
        self.min_bytes = min_bytes
        self.stream = torch.cuda.Stream() if stream and torch.cuda.is_available() else None
        self.packed = self.unpacked = 0

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)

    def _pack(self, t: torch.Tensor):
        if t.numel() * t.element_size() < self.min_bytes or t.untyped_storage().data_ptr() in self.keep:
            return t
        self.packed += 1
        layout = (t.size(), t.stride(), t.device)  # a compiled backward checks its saved views' strides
        if t.device.type != "cuda":
            return t.contiguous().clone(), layout, None
        host = torch.empty(t.size(), dtype=t.dtype, device="cpu", pin_memory=True)  # dense: a view's gaps stay behind
        event = None
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                host.copy_(t, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.stream)
            t.record_stream(self.stream)  # the allocator keeps t's block until the copy is done
        else:
            host.copy_(t, non_blocking=True)
        return host, layout, event

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        self.unpacked += 1
        host, (size, stride, device), event = packed
        if event is not None:
            torch.cuda.current_stream().wait_event(event)
        back = torch.empty_strided(size, stride, dtype=host.dtype, device=device)
        return back.copy_(host, non_blocking=True)


def _offload_hooks(model, min_bytes: int = 1 << 20):
    """Stock torch.compile, every saved activation offloaded by :class:`OffloadAll` (``run.hooks``)."""
    compiled = torch.compile(model)
    hooks = OffloadAll(list(model.parameters()), min_bytes=min_bytes)

    def run(*batch):
        with hooks:
            return compiled(*batch)

    run.hooks = hooks
    return run


def _pytorch_offload(model, separate_stream: bool = True):
    """torch.compile with PyTorch's partitioner offloading every forward value it can: on a
    separate stream with its wait sinking and (torch 2.13) reload prefetching, or on the compute
    stream (``separate_stream=False``; torch 2.11's separate-stream ops failed on an H200 with
    ``TypeError: _() missing 1 required positional argument: 'to_dealloc'``)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    def mark(graph) -> None:
        for node in graph.nodes:
            node.meta["should_offload"] = True

    options = {"enable_activation_offloading": True}
    if separate_stream:
        options.update(activation_offload_separate_stream=True, activation_offload_sink_wait=True)
        if hasattr(functorch_config, "activation_reload_prefetch"):  # torch 2.13
            options["activation_reload_prefetch"] = True
    compiled = torch.compile(model)

    def run(*batch):
        with functorch_config.patch(**options), inductor_config.patch(joint_custom_post_pass=mark):
            return compiled(*batch)

    return run


ANCHORS = {"torch.compile offload": _pytorch_offload,
           "torch.compile offload, one stream": lambda model: _pytorch_offload(model, separate_stream=False),
           "saved_tensors_hooks offload": _offload_hooks}


if __name__ == "__main__":
    main()
