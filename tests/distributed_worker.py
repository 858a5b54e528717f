"""One rank of the distributed tests (tests/test_distributed.py): gloo on CPU, fp32.

Each scenario runs on every rank and writes what the parent process checks to
``<out>/rank<r>.json``: per-step losses and gradients of the planned and the eager engine,
the decisions each rank planned with, and the errors raised.
"""
from __future__ import annotations

import copy
import faulthandler
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import planner
from planner.models import GPTConfig, gpt_example
from planner.problem import evaluate_names

CFG = GPTConfig(n_layer=2, d_model=128, n_head=4, seq_len=16, vocab=256, dropout=0.0, batch=2)
STEPS = 3
# a cpsat plan (multi-threaded, time-limited: not the same from run to run by itself) that recomputes
SETTINGS = dict(memory_budget=0.3, solver="cpsat", time_limit=5.0, codegen="eager")
FILE_SETTINGS = planner.PlannerConfig(**SETTINGS)


def rank_batch(rank: int, seq: int = CFG.seq_len) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    idx = torch.randint(0, CFG.vocab, (CFG.batch, seq), generator=gen)
    return idx, idx.roll(-1, dims=1)


def train(module: nn.Module, params: nn.Module, batch) -> tuple[list[float], dict[str, list]]:
    """Losses of ``STEPS`` SGD steps, and this rank's gradients (local shards) of the last step."""
    opt = torch.optim.SGD(params.parameters(), lr=0.1)
    losses, grads = [], {}
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = module(*batch)
        loss.backward()
        losses.append(loss.item())
        # a compiled block's parameters are named under its compiled module (``_orig_mod``)
        grads = {n.replace("._orig_mod", ""): _local(p.grad).flatten().tolist() for n, p in params.named_parameters()}
        opt.step()
    return losses, grads


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def planned_run(wrap, compile_model) -> dict:
    """Train the eager engine (``wrap(model)``) and the planned one (``compile_model(model)``,
    returning the module and the planner backend) from the same weights; report both."""
    rank = dist.get_rank()
    eager_model, _ = gpt_example(CFG, seed=0)
    eager = wrap(eager_model)
    expected = train(eager, eager_model, rank_batch(rank))
    model, _ = gpt_example(CFG, seed=0)
    module, backend = compile_model(model)
    actual = train(module, model, rank_batch(rank))
    return {"eager": expected, "planned": actual,
            "decisions": [{"fingerprint": g.fingerprint, "saved": sorted(g.decision.saved), "stats": g.decision.stats,
                           "recomputed": int(evaluate_names(g.problem, g.decision.saved).recomputed.sum())}
                          for g in backend.graphs],
            "step_graphs": len(backend.step), "runs": list(backend.runs.values()), "repeats": backend.repeats}


def ddp_whole_model() -> dict:
    # 1 MB buckets (the least DDP allows): its graph splitting gives this 1.8 MB model several graphs
    wrap = lambda m: DDP(m, bucket_cap_mb=1)

    def compile_model(model: nn.Module):
        backend = planner.backend(**SETTINGS)
        return torch.compile(wrap(model), backend=backend), backend

    return planned_run(wrap, compile_model)


def fsdp2_per_block() -> dict:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    def wrap(model: nn.Module) -> nn.Module:
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    def compile_model(model: nn.Module):
        # as torchtitan does: each block compiled on its own, then sharded
        backend = planner.compile_blocks(model.blocks, **SETTINGS)
        return wrap(model), backend

    return planned_run(wrap, compile_model)


class AllReduceMLP(nn.Module):
    """Collectives inside the graph: a value reduced across ranks, and an all-gather with autograd."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        scale = funcol.all_reduce(h.detach().sum(-1, keepdim=True), "sum", dist.group.WORLD)
        gathered = funcol.all_gather_tensor_autograd(h, 0, dist.group.WORLD)
        return self.fc2(torch.tanh(gathered * scale.repeat(dist.get_world_size(), 1))).pow(2).mean()


def collectives_in_graph() -> dict:
    torch.manual_seed(0)
    model = AllReduceMLP()
    twin = copy.deepcopy(model)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(dist.get_rank()))
    expected = train(model, model, (x,))
    result = planner.plan(twin, (x,), memory_budget=0.0, solver="greedy", config=planner.PlannerConfig(codegen="eager"))
    actual = train(result.module, twin, (x,))
    problem = result.graph_plan.problem
    collectives = [problem.names[i] for i, reason in problem.must_save_reason.items() if reason == "collective"]
    return {"eager": expected, "planned": actual, "collectives": collectives, "recomputed": result.recomputed}


def mismatched_shapes() -> dict:
    rank = dist.get_rank()
    model, _ = gpt_example(CFG, seed=0)
    return _error_of(lambda: planner.plan(model, rank_batch(rank, seq=16 if rank == 0 else 8), solver="greedy"))


def rank0_fails() -> dict:
    model, batch = gpt_example(CFG, seed=0)
    return _error_of(lambda: planner.plan(model, batch, memory_budget="1KiB", solver="greedy"))


def plan_file(out: Path) -> dict:
    path = out / "plan.json"
    model, batch = gpt_example(CFG, seed=0)
    first = planner.plan(model, batch, config=FILE_SETTINGS, plan_file=path)
    dist.barrier()
    written = path.exists()
    second = planner.plan(model, batch, config=FILE_SETTINGS, plan_file=path)
    return {"written": written, "first": sorted(first.saved), "second": sorted(second.saved),
            "second_stats": second.decision.stats}


def _error_of(call) -> dict:
    try:
        call()
    except Exception as err:
        return {"error": type(err).__name__, "message": str(err)}
    return {"error": None}


def main(out: str) -> None:
    faulthandler.dump_traceback_later(240, exit=True)  # a hang prints every thread's stack, then fails
    dist.init_process_group("gloo")
    out_dir = Path(out)
    results = {}
    for name, scenario in [("ddp", ddp_whole_model), ("fsdp2", fsdp2_per_block), ("collectives", collectives_in_graph),
                           ("mismatch", mismatched_shapes), ("rank0_fails", rank0_fails),
                           ("plan_file", lambda: plan_file(out_dir))]:
        torch._dynamo.reset()
        print(f"rank {dist.get_rank()} scenario {name}", file=sys.stderr, flush=True)
        try:
            results[name] = scenario()
        except Exception:
            results[name] = {"crashed": traceback.format_exc()}
        dist.barrier()
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
