"""Distributed training step, per rank: the planner against PyTorch's activation_memory_budget,
per-block checkpointing (torchtitan's ``full`` mode) and selective op checkpointing (torchtitan's
``selective``: matmul and attention outputs saved, the rest recomputed), under FSDP2 (each block
``fully_shard``ed and compiled on its own, as torchtitan does) and DDP (the whole model compiled).

    torchrun --nproc-per-node N -m bench.distributed [--engines fsdp2 ddp] [--layers 8]
        [--budgets 1 0.5 0.2 0] [--torch-budgets 1 0.5 0.2 0.1] [--steps 5] [--rounds 2]

A bf16 Llama-style model (``bench.llama``), each rank its own batch. Peak memory is
``max_memory_allocated`` during a step minus ``memory_allocated`` before it, on each rank: it
includes what the engine allocates during the step (FSDP2's unsharded parameters and gradient
buffers, DDP's buckets) besides activations. Step time is forward and backward (gradients
reduced), the median of CUDA-event-timed steps, timed interleaved across the methods of an engine
and each one's peaks measured again once all are built (``bench.gpu_step.again_together``). Every
method of an engine is built before any is timed, from the same weights. Rank 0 prints a table
per rank and the targets, and writes ``--out``.
"""
from __future__ import annotations

import argparse
import hashlib
import os
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import planner
from bench import fastest_within, save_rows
from bench.gpu_step import again_together, measure
from bench.llama import LlamaConfig, llama_example

RESULTS = Path(__file__).parent / "results"
GIB = 2**30
aten = torch.ops.aten
# torchtitan's selective op checkpointing keeps these ops' outputs and recomputes the rest
SAVED_OPS = {aten.mm.default, aten._scaled_dot_product_flash_attention.default,
             aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_cudnn_attention.default}


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _inductor():
    """PyTorch's inductor backend as a new callable: dynamo keeps one cache per code object (every
    block shares its forward's), and a new backend object keeps each method's compile apart
    instead of reusing the graph another method's ``activation_memory_budget`` partitioned."""
    from torch._inductor.compile_fx import compile_fx

    return lambda gm, example_inputs: compile_fx(gm, example_inputs)


def methods(args) -> list[tuple[str, float | None]]:
    """(method, budget) in the order they are built."""
    return ([("eager", None)] + [("torch.compile", b) for b in args.torch_budgets]
            + [("full", None), ("selective", None)] + [("planner", b) for b in args.budgets])


def build(engine: str, method: str, budget: float | None, cfg: LlamaConfig, args, mesh, dtype=torch.bfloat16):
    """The model for one method, its step function and the planner backend (or None)."""
    rank = dist.get_rank()
    model, batch = llama_example(cfg, device="cuda", dtype=dtype, seed=0, batch_seed=rank)
    backend = None
    settings = dict(memory_budget=budget, solver=args.solver, time_limit=args.time_limit)
    if method == "planner" and engine == "fsdp2":  # one graph for every block, planned for all their runs
        backend = planner.compile_blocks(model.blocks, **settings)
    elif method == "planner":
        backend = planner.backend(**settings)
    compile_fn = None  # eager, or the planner's blocks, compiled already
    if method == "planner" and engine == "ddp":
        compile_fn = partial(torch.compile, backend=backend)
    elif method not in ("eager", "planner"):
        compile_fn = partial(torch.compile, backend=_inductor())
    for i, block in enumerate(model.blocks):
        if method == "full":
            block = checkpoint_wrapper(block, preserve_rng_state=False)
        elif method == "selective":
            block = checkpoint_wrapper(block, preserve_rng_state=False,
                                       context_fn=partial(create_selective_checkpoint_contexts, _save_matmuls))
        if engine == "fsdp2":
            block = compile_fn(block) if compile_fn else block
            fully_shard(block, mesh=mesh)
        model.blocks[i] = block
    if engine == "fsdp2":
        module: nn.Module = fully_shard(model, mesh=mesh)
    else:
        module = DDP(model, bucket_cap_mb=args.ddp_bucket_mb)
        module = compile_fn(module) if compile_fn else module
    if method == "torch.compile":
        def run(*inputs):  # PyTorch reads the budget when it compiles, at the first call
            with torch._functorch.config.patch(activation_memory_budget=budget):
                return module(*inputs)
    else:
        run = module
    return model, run, batch, backend


def planning(backend) -> dict:
    """How the planner's graphs were decided on this rank."""
    if backend is None:
        return {}
    graphs = backend.graphs
    solved = [g for g in graphs if not {"reused", "decided_on_rank"} & g.decision.stats.keys()]
    return {"graphs": len(graphs), "distinct_graphs": len({g.fingerprint for g in graphs}), "solves": len(solved),
            "fingerprints": [g.fingerprint for g in graphs], "saved": [len(g.decision.saved) for g in graphs],
            "predicted_peak_bytes": backend.predicted_step_peak, "planned_runs": backend.repeats,
            "runs": list(backend.runs.values()),
            "plan_seconds": sum(g.plan_seconds for g in graphs)}


def run_engine(engine: str, cfg: LlamaConfig, args, mesh) -> list[dict]:
    rows, runs = [], []
    batch = None
    torch._dynamo.reset()
    for method, budget in methods(args):
        model, run, batch, backend = build(engine, method, budget, cfg, args, mesh)
        params = list(model.parameters())
        result = measure(run, params, batch, args.steps)
        rows.append({"engine": engine, "method": method, "budget": budget, "rank": dist.get_rank(), **result,
                     **planning(backend)})
        runs.append((run, params))
        if dist.get_rank() == 0:
            print(f"  {engine} {method} {'' if budget is None else budget}: "
                  f"{result['peak_activation_bytes'] / GIB:.3f} GiB, {result['step_ms']:.1f} ms", flush=True)
    again_together(rows, runs, batch, args.rounds, args.steps)
    return rows


def check_losses(engine: str, cfg: LlamaConfig, args, mesh) -> dict:
    """fp32: losses of ``args.check_steps`` SGD steps of eager and of the planner at the lowest
    ``--budgets`` on the same engine, and the planner's decisions on this rank."""
    losses = {}
    for method, budget in (("eager", None), ("planner", min(args.budgets))):
        model, run, batch, backend = build(engine, method, budget, cfg, args, mesh, dtype=torch.float32)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        losses[method] = []
        for _ in range(args.check_steps):
            opt.zero_grad(set_to_none=True)
            loss = run(*batch)
            loss.backward()
            opt.step()
            losses[method].append(loss.item())
    plans = [(g.fingerprint, len(g.decision.saved), hash_saved(g.decision.saved)) for g in backend.graphs]
    worst = max(abs(a - b) for a, b in zip(losses["eager"], losses["planner"]))
    return {"engine": engine, "method": "check", "rank": dist.get_rank(), "budget": min(args.budgets), **losses, "max_difference": worst,
            "plans": plans}


def hash_saved(saved) -> str:
    return hashlib.sha256("\n".join(sorted(saved)).encode()).hexdigest()[:12]


def table(rows: list[dict]) -> list[str]:
    lines = ["| engine | rank | method | budget | peak GiB | step ms | planner graphs / solves "
             "| most runs before backward / planned for | predicted GiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        budget = "-" if r["budget"] is None else f"{r['budget']:g}"
        graphs = f"{r['graphs']} / {r['solves']}" if "graphs" in r else "-"
        runs = f"{max(r['runs'], default=0)} / {r['planned_runs']}" if "runs" in r else "-"
        pred = f"{r['predicted_peak_bytes'] / GIB:.3f}" if "predicted_peak_bytes" in r else "-"
        lines.append(f"| {r['engine']} | {r['rank']} | {r['method']} | {budget} | {r['peak_activation_bytes'] / GIB:.3f} "
                     f"| {r['step_ms']:.1f} | {graphs} | {runs} | {pred} |")
    return lines


def targets(rows: list[dict]) -> list[str]:
    """Per engine and rank: is every PyTorch budget point and both torchtitan modes dominated by
    a planner point (no more peak, at most 1.01x the step time)?"""
    lines = ["| engine | rank | point | its GiB / ms | best planner point with no more memory | time ratio | dominated |",
             "|---|---|---|---|---|---|---|"]
    for key in sorted({(r["engine"], r["rank"]) for r in rows}):
        mine = [r for r in rows if (r["engine"], r["rank"]) == key]
        ours = [r for r in mine if r["method"] == "planner"]
        for other in (r for r in mine if r["method"] in ("torch.compile", "full", "selective")):
            best = fastest_within(ours, other)
            ok = best is not None and best["step_ms"] <= 1.01 * other["step_ms"]
            name = other["method"] + ("" if other["budget"] is None else f" {other['budget']:g}")
            found = "none" if best is None else (f"planner {best['budget']:g}: {best['peak_activation_bytes'] / GIB:.3f} / "
                                                 f"{best['step_ms']:.1f}")
            ratio = "-" if best is None else f"{best['step_ms'] / other['step_ms']:.3f}"
            lines.append(f"| {key[0]} | {key[1]} | {name} | {other['peak_activation_bytes'] / GIB:.3f} / "
                         f"{other['step_ms']:.1f} | {found} | {ratio} | {'yes' if ok else 'no'} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["fsdp2", "ddp"], choices=["fsdp2", "ddp"])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.5, 0.2, 0.0])
    parser.add_argument("--torch-budgets", type=float, nargs="+", default=[1.0, 0.5, 0.2, 0.1])
    parser.add_argument("--solver", default="cpsat")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--ddp-bucket-mb", type=float, default=250.0,
                        help="DDP's bucket size; DDP's graph splitting compiles one graph per bucket")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--check-steps", type=int, default=0,
                        help="first train this many fp32 steps, eager and planned, and print the losses per rank")
    parser.add_argument("--out", type=Path, default=RESULTS / "distributed.json")
    args = parser.parse_args(argv)

    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world = dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,))
    # every method compiles the same block code with another backend: keep them all compiled
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 4096
    cfg = LlamaConfig(n_layer=args.layers, d_model=args.d_model, n_head=args.d_model // 128, n_kv_head=args.d_model // 256,
                      d_ff=int(args.d_model * 11 / 4), seq_len=args.seq, batch=args.batch)
    rows: list[dict] = []
    rows_checks: list[dict] = []
    if dist.get_rank() == 0:
        print(f"{torch.cuda.get_device_name()} x {world}, torch {torch.__version__}; {cfg}", flush=True)
    for engine in args.engines if args.check_steps else ():
        checks: list = [None] * world
        dist.all_gather_object(checks, check_losses(engine, cfg, args, mesh))
        if dist.get_rank() == 0:
            for c in checks:
                print(f"check {c['engine']} rank {c['rank']} budget {c['budget']:g}: eager {c['eager']} planner {c['planner']} "
                      f"max difference {c['max_difference']:.2e}; graphs (fingerprint, saved, saved-set hash) {c['plans']}",
                      flush=True)
        rows_checks.extend(checks)
    for engine in args.engines:
        mine = run_engine(engine, cfg, args, mesh)
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine)
        rows += [row for rank_rows in gathered for row in rank_rows]
        torch.cuda.empty_cache()
        if dist.get_rank() == 0:
            save_rows(args.out, f"{torch.cuda.get_device_name()} x {world}", torch.__version__, rows + rows_checks)
    if dist.get_rank() == 0:
        print("\n".join(["", *table(rows), "", *targets(rows)]), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
