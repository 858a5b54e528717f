"""What is alive on the GPU at a step's measured peak, next to the simulator's view of it.

Runs one planned training step under ``torch.cuda.memory._record_memory_history``, replays
the allocator trace to find the peak, and prints the largest blocks alive there with the
innermost Python frames that allocated them; then the simulated peak step. For finding what
the memory model misses.

    python -m bench.gpu_trace --model resnet --budget 1.0
"""
from __future__ import annotations

import argparse
import copy
import linecache

import torch

import planner
from bench.gpu_memory import MODELS
from bench.gpu_step import WARM_UP_STEPS

MIB = 2**20


def trace_step(run, params, batch) -> list[dict]:
    for _ in range(WARM_UP_STEPS):  # compiles, then plans again for the step seen
        for p in params:
            p.grad = None
        run(*batch).backward()
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    run(*batch).backward()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    return [e for trace in snapshot["device_traces"] for e in trace]


def alive_at_peak(events: list[dict]) -> tuple[int, list[dict]]:
    """The traced peak and the blocks alive there, in allocation order (the last one set the peak)."""
    alive, total, peak, at_peak = {}, 0, 0, []
    for e in events:
        if e["action"] == "alloc":
            alive[e["addr"]] = e
            total += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in alive:
            total -= alive.pop(e["addr"])["size"]
        if total > peak:
            peak, at_peak = total, list(alive.values())
    return peak, at_peak


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt")
    parser.add_argument("--budget", type=float, default=1.0)
    parser.add_argument("--solver", default="cpsat")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    base, batch = MODELS[args.model]()
    model = copy.deepcopy(base)
    backend = planner.backend(planner.PlannerConfig(codegen="inductor", memory_budget=args.budget, solver=args.solver,
                                                    time_limit=args.time_limit))
    events = trace_step(torch.compile(model, backend=backend), list(model.parameters()), batch)
    peak, blocks = alive_at_peak(events)
    print(f"traced peak of blocks allocated in the step: {peak / MIB:.1f} MiB; simulated: "
          f"{backend.timelines[0].peak / MIB:.1f} MiB at {backend.timelines[0].peak_step}")
    forward = [s for s in backend.timelines[0].steps if s[0] == "forward"]
    if forward:
        top = max(forward, key=lambda s: s[2])
        print(f"simulated forward peak: {top[2] / MIB:.1f} MiB at {top[1]}")
        for phase, name, nbytes in forward[: args.top]:
            print(f"    {phase} {name:40s} {nbytes / MIB:9.1f} MiB")
    if blocks:
        print(f"set by {blocks[-1]['size'] / MIB:.1f} MiB at {where(blocks[-1])}: {source(blocks[-1])}")
    for e in sorted(blocks, key=lambda e: -e["size"])[: args.top]:
        print(f"{e['size'] / MIB:9.1f} MiB  {where(e)}  | {source(e)}")


if __name__ == "__main__":
    main()
