"""What is alive on the GPU at a step's measured peak, next to the simulator's view of it.

Runs one planned training step under ``torch.cuda.memory._record_memory_history``, replays
the allocator trace to find the peak, and prints the largest blocks alive there with the
innermost Python frames that allocated them; then the simulated peak step. For finding what
the memory model misses.

    python -m bench.gpu_trace --model resnet --budget 1.0
    python -m bench.gpu_trace --model qwen2 --budget 0 --codegen eager   (a zoo model, pip install .[zoo])
"""
from __future__ import annotations

import argparse
import copy
import linecache
from collections import Counter

import torch

import planner
from bench.gpu_memory import MODELS
from bench.gpu_step import WARM_UP_STEPS

MIB = 2**20


def trace_step(run, params, batch) -> tuple[list[dict], int]:
    """The allocator's events of one step after warm-up, and how many of them the forward made."""
    for _ in range(WARM_UP_STEPS):  # compiles, then plans again for the step seen
        for p in params:
            p.grad = None
        run(*batch).backward()
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    loss = run(*batch)
    torch.cuda.synchronize()
    forward = sum(len(trace) for trace in torch.cuda.memory._snapshot()["device_traces"])
    loss.backward()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    return [e for trace in snapshot["device_traces"] for e in trace], forward


def _model(name: str):
    if name in MODELS:
        return MODELS[name]()
    from bench.zoo_models import build

    return build(name, "bench", device="cuda", dtype=torch.bfloat16)


def _model_names() -> list[str]:
    from bench.zoo_models import MODELS as ZOO  # imports transformers and timm only when built

    return sorted(MODELS) + sorted(ZOO)


def alive_at_peak(events: list[dict]) -> tuple[int, list[dict], int]:
    """The traced peak, the blocks alive there in allocation order (the last one set the peak),
    and the index of the event that reached it."""
    return _most_alive(events, lambda e: True)


def _most_alive(events: list[dict], counted) -> tuple[int, list[dict], int]:
    """The most bytes alive at an allocation that ``counted`` accepts, the blocks alive there in
    allocation order, and that allocation's index (0 where there is none)."""
    alive, total, most, at_most, where_k = {}, 0, 0, [], 0
    for k, e in enumerate(events):
        if e["action"] == "alloc":
            alive[e["addr"]] = e
            total += e["size"]
            if total > most and counted(e):
                most, at_most, where_k = total, list(alive.values()), k
        elif e["action"] == "free_completed" and e["addr"] in alive:
            total -= alive.pop(e["addr"])["size"]
    return most, at_most, where_k


def _own_frames(event: dict) -> list[dict]:
    """The allocating frames in generated or user code (not torch's own)."""
    return [f for f in event.get("frames", []) if f.get("filename", "").endswith(".py") and "torch/" not in f["filename"]]


def where(event: dict) -> str:
    frames = _own_frames(event) or event.get("frames", [])
    return " < ".join(f"{f.get('name')}:{f.get('line')}" for f in frames[:3])


def source(event: dict) -> str:
    """The line of generated (or user) code that allocated the block, when it can be read."""
    frames = _own_frames(event)
    return linecache.getline(frames[0]["filename"], frames[0].get("line", 0)).strip()[:110] if frames else ""


def _print_peak(title: str, timeline, top: int) -> None:
    """A simulated timeline's peak and the largest storages alive there."""
    print(f"{title}: simulated peak {timeline.peak / MIB:.1f} MiB at {timeline.peak_step}")
    for phase, name, nbytes in timeline.at_peak[:top]:
        print(f"    {phase:8s} {name:48s} {nbytes / MIB:9.1f} MiB")


def alive_at_op(events: list[dict], op: str) -> tuple[int, list[dict], dict | None]:
    """The most bytes alive at an allocation made by a line of generated code naming ``op``
    (its library kernel's scratch and outputs), the blocks alive there, and that allocation."""
    most, blocks, k = _most_alive(events, lambda e: op in source(e))
    return most, blocks, events[k] if blocks else None


def _print_at_op(events: list[dict], op: str, backend, top: int) -> None:
    most, blocks, which = alive_at_op(events, op)
    if which is None:
        print(f"no line of generated code naming {op} allocated in the step")
        return
    print(f"at {op}: {most / MIB:.1f} MiB alive, set by {which['size'] / MIB:.1f} MiB at {where(which)}: {source(which)}")
    for e in sorted(blocks, key=lambda e: -e["size"])[:top]:
        print(f"{e['size'] / MIB:9.1f} MiB  {where(e)}  | {source(e)}")
    for i, timeline in enumerate(backend.timelines):
        steps = [(b, phase, name) for phase, name, b in timeline.steps if op in name]
        if steps:
            b, phase, name = max(steps)
            print(f"graph {i}: simulated {b / MIB:.1f} MiB at its {phase} step {name} (the graph's own bytes)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=_model_names(), default="gpt")
    parser.add_argument("--budget", type=float, default=1.0)
    parser.add_argument("--solver", help="default: the planner's")
    parser.add_argument("--codegen", choices=["inductor", "eager"], help="default: the planner's")
    parser.add_argument("--time-limit", type=float, help="default: the planner's (so a zoo run's plans, kept in "
                        "$ACPLAN_CACHE_DIR, are the ones traced)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--op", help="also print what is alive where a line of generated code naming this op "
                        "allocates (the most at any such line), beside the simulation's step at that op")
    args = parser.parse_args(argv)
    base, batch = _model(args.model)
    model = copy.deepcopy(base)
    chosen = {"codegen": args.codegen, "solver": args.solver, "time_limit": args.time_limit}
    backend = planner.backend(memory_budget=args.budget, **{k: v for k, v in chosen.items() if v is not None})
    events, forward_events = trace_step(torch.compile(planner.own_frame(model), backend=backend),
                                        list(model.parameters()), batch)
    peak, blocks, k = alive_at_peak(events)
    phase = "forward" if k < forward_events else "backward"
    print(f"traced peak of blocks allocated in the step: {peak / MIB:.1f} MiB, in the {phase} "
          f"(event {k} of {len(events)}; the forward made {forward_events}); predicted step peak "
          f"{backend.predicted_step_peak / MIB:.1f} MiB" + ("" if backend.compiled_step_peak is None else
                                                           f", {backend.compiled_step_peak / MIB:.1f} MiB counting "
                                                           "what inductor's code stores (compiled_step_peak)"))
    for i, timeline in enumerate(backend.timelines):
        _print_peak(f"graph {i}", timeline, args.top)
    for i, report in enumerate(backend.stores_against_inductor()):
        for phase, found in report.items():
            named = sorted(found.get("unmodelled", {}).items(), key=lambda kv: -kv[1])
            print(f"graph {i} {phase}: stored by inductor, fused in the memory model: "
                  + (found["error"] if "error" in found else ", ".join(f"{n} {b / MIB:.1f}" for n, b in named[: args.top])))
    for i, timeline in enumerate(backend.compiled_timelines()):
        if timeline is not None:
            _print_peak(f"graph {i}, counting what inductor's code stores", timeline, args.top)
    if blocks:
        print(f"set by {blocks[-1]['size'] / MIB:.1f} MiB at {where(blocks[-1])}: {source(blocks[-1])}")
    for e in sorted(blocks, key=lambda e: -e["size"])[: args.top]:
        print(f"{e['size'] / MIB:9.1f} MiB  {where(e)}  | {source(e)}")
    if args.op:
        _print_at_op(events, args.op, backend, args.top)
    simulated = Counter(nbytes for timeline in backend.timelines for _, _, nbytes in timeline.at_peak)
    traced = Counter(e["size"] for e in blocks)
    print("blocks by size at the peak, traced against simulated (allocator sizes are rounded up):")
    for size in sorted(set(simulated) | set(traced), reverse=True)[: args.top]:
        print(f"{size / MIB:12.3f} MiB  traced {traced[size]:4d}  simulated {simulated[size]:4d}")


if __name__ == "__main__":
    main()
