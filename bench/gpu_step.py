"""One training step on the GPU: measured peak activation memory and step time per method.

Methods: eager, torch.compile with PyTorch's ``activation_memory_budget``, and the planner as
the torch.compile backend (inductor) at the same budgets. Peak activation memory is
``max_memory_allocated`` during a step minus ``memory_allocated`` before it, measured from an
emptied cache (the caching allocator hands out whole cached blocks a little larger than asked
for, so one program measured after another could read a few hundred KiB apart); the peak of the
bytes tensors asked for (``requested_bytes``) is kept beside it. Step time is the
median of ``--steps`` CUDA-event-timed steps after two warm-up steps: the first compiles, and in
the second the planner plans graphs again for the step it saw (``PlannerConfig.replan``).

    python -m bench.gpu_step [--layers 8] [--budgets 1.0 0.5 0.0] [--solver ilp]
"""
from __future__ import annotations

import argparse
import copy
import re
import statistics
import time
from pathlib import Path

import torch

import planner
from bench import save_rows
from planner.models import GPTConfig, gpt_example

RESULTS = Path(__file__).parent / "results"
WARM_UP_STEPS = 2


def measure(run, params, batch, steps: int) -> dict:
    """Peak activation memory (bytes) and median step time (ms) of ``run(*batch).backward()``,
    and of one step's forward: its peak and the bytes it leaves alive for the backward.
    ``peak_requested_bytes``: the step's peak of the bytes its tensors asked for, which no
    earlier allocation in the process changes."""
    for _ in range(WARM_UP_STEPS):  # the first compiles; the second may compile graphs planned again
        _clear(params)
        run(*batch).backward()
    times: list[float] = []
    peaks = step_peaks(run, params, batch, then=lambda: times.extend(step_times(run, params, batch, steps)))
    return {**peaks, "step_ms": statistics.median(times)}


def step_peaks(run, params, batch, then=lambda: None) -> dict:
    """The peaks of one step of a run already compiled, measured from an emptied cache (cached
    blocks left by earlier runs would round this one's allocations), the forward's apart;
    ``then`` runs after the step, inside the peaks (:func:`measure`'s timed steps)."""
    torch.cuda.synchronize()
    _clear(params)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    requested_before = _requested()
    torch.cuda.reset_peak_memory_stats()
    loss = run(*batch)  # one step in halves: what the forward peaks at and keeps for the backward
    torch.cuda.synchronize()
    forward = {"forward_peak_bytes": torch.cuda.max_memory_allocated() - before,
               "held_after_forward_bytes": torch.cuda.memory_allocated() - before}
    loss.backward()
    del loss
    _clear(params)
    then()
    return {"peak_activation_bytes": torch.cuda.max_memory_allocated() - before,
            "peak_requested_bytes": _requested("peak") - requested_before, **forward}


PEAKS = ("peak_activation_bytes", "peak_requested_bytes", "forward_peak_bytes", "held_after_forward_bytes")


def again_together(rows: list[dict], runs: list, batch, rounds: int, steps: int) -> list[float]:
    """Each row's peaks measured again and its step timed again (:func:`retime`, where
    ``rounds``; the step times of every run returned), with every run of ``runs`` (its
    ``(run, params)``, the first ones each a row's; any past the rows are timed alone) built; the
    first figures are kept as ``<name>_alone``.

    A step's first measured peak depends on the runs measured before it: the caching allocator
    hands a request a whole free block up to 1 MiB larger than asked for, and which blocks are
    free follows what the process allocated so far. On an H100, ResNet-50's torch.compile and
    planner 1.0 steps (the same kernels, the same requested bytes) measured 5499552256 bytes
    whichever came first after eager, and 5498012160 each when measured again, in either order.
    Measured again once all are built, every run finds the allocator as every other does.
    """
    for row, (run, params) in zip(rows, runs):
        peaks = step_peaks(run, params, batch)
        for name in PEAKS:
            row[f"{name}_alone"], row[name] = row.get(name), peaks[name]
    times = retime(runs, batch, rounds, steps) if rounds else []
    for row, ms in zip(rows, times):
        row["step_ms_alone"], row["step_ms"] = row["step_ms"], ms
    return times


def _requested(which: str = "current") -> int:
    """Bytes the live tensors asked for (``current``) or their peak since the last reset."""
    return torch.cuda.memory_stats().get(f"requested_bytes.all.{which}", 0)


def step_times(run, params, batch, steps: int) -> list[float]:
    """Milliseconds of each of ``steps`` steps, timed with CUDA events (gradients cleared between)."""
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(*batch).backward()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        _clear(params)
    return times


def retime(runs: list, batch, rounds: int, steps: int) -> list[float]:
    """Median step time (ms) of each ``(run, params)`` in ``runs``, timed again together.

    ``rounds`` passes each take one untimed step of every run, then ``steps`` sweeps of one
    timed step of every run in turn, the order reversed every other sweep. A drift of the GPU's
    clocks or of the host's speed (at the zoo's sizes the host's launches take most of a step,
    and the same compiled step was timed 17 and 38 ms apart minutes apart on an H100 machine)
    then falls on every run alike instead of on whichever ran at the time.
    """
    times: list[list[float]] = [[] for _ in runs]
    order = list(zip(times, runs))
    for _ in range(rounds):
        for _, (run, params) in order:
            step_times(run, params, batch, 1)
        for sweep in range(steps):
            for mine, (run, params) in (order if sweep % 2 == 0 else order[::-1]):
                mine.extend(step_times(run, params, batch, 1))
    return [statistics.median(t) for t in times]


def kernel_and_host(run, params, batch, steps: int = 3) -> dict:
    """Where a step's time goes: ``kernel_ms``, the GPU's busy time per step (kernels, copies and
    fills as the profiler records them, over ``steps`` steps), ``launches``, how many of those
    the step runs (each one the host launches), and ``host_ms``, the median time
    the host takes to launch a step (from the call until ``backward()`` returns, the GPU idle at
    the start). Where ``host_ms`` is most of the step time, the step is bound by the host: the
    GPU waits on launches, and two steps of the same kernels time apart by the host's noise.
    ``kernel_names``: per kernel name (:func:`kernel_name`), its GPU ms and launches per step."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    hosts = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run(*batch).backward()
        hosts.append(1e3 * (time.perf_counter() - start))
        torch.cuda.synchronize()
        _clear(params)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run(*batch).backward()
            _clear(params)
        torch.cuda.synchronize()
    work = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy = sum(e.device_time for e in work)  # microseconds
    return {"kernel_ms": busy / 1e3 / steps, "launches": len(work) / steps, "host_ms": statistics.median(hosts),
            "kernel_names": kernel_times(work, steps)}


def kernel_times(events, steps: int = 1) -> dict[str, list[float]]:
    """GPU milliseconds and launches per step of each kernel name (:func:`kernel_name`) among
    the profiler's GPU ``events`` of ``steps`` steps."""
    names: dict[str, list[float]] = {}
    for e in events:
        total = names.setdefault(kernel_name(e.name), [0.0, 0])
        total[0] += e.device_time / 1e3 / steps
        total[1] += 1 / steps
    return {k: [round(ms, 4), round(n, 2)] for k, (ms, n) in names.items()}


def kernel_name(name: str) -> str:
    """A kernel's name without launch arguments or a trailing number (inductor numbers its
    kernels in the order it generates them, which differs between two compiles of alike code).
    ATen's kernels in an anonymous namespace keep their names (``at::native::(anonymous
    namespace)::conv_depthwise2d_backward_kernel<...>``: the launch arguments are the first
    parenthesis after the namespace's)."""
    name = name.replace("(anonymous namespace)::", "")
    return re.sub(r"_\d+$", "", name.split("(")[0])[:120]


def differing_kernels(row: dict, ref: dict, most: int = 3) -> list[tuple[str, float, float]]:
    """The kernel names whose GPU ms per step differ most between ``ref`` and ``row`` (rows with
    :func:`kernel_and_host`'s ``kernel_names``): ``(name, ref's ms, row's ms)``, largest first."""
    mine, theirs = row.get("kernel_names") or {}, ref.get("kernel_names") or {}
    ms = {k: (theirs.get(k, (0.0, 0))[0], mine.get(k, (0.0, 0))[0]) for k in set(mine) | set(theirs)}
    order = sorted(ms, key=lambda k: (-abs(ms[k][1] - ms[k][0]), k))[:most]
    return [(k, *ms[k]) for k in order]


def _clear(params) -> None:
    for p in params:
        p.grad = None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.5, 0.0])
    parser.add_argument("--solver", default="ilp")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_step.json")
    args = parser.parse_args(argv)
    cfg = GPTConfig(n_layer=args.layers, d_model=1024, n_head=16, seq_len=2048, vocab=8192, dropout=0.0, batch=8)
    base, batch = gpt_example(cfg, device="cuda")
    base = base.to(torch.bfloat16)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; GPT {cfg}")
    print("| method | budget | peak activation GiB | step ms | predicted saved GiB |\n|---|---|---|---|---|", flush=True)
    rows = []

    def record(method, budget, result, predicted=None):
        rows.append({"method": method, "budget": budget, **result, "predicted_saved_bytes": predicted})
        pred = "-" if predicted is None else f"{predicted / 2**30:.2f}"
        print(f"| {method} | {budget} | {result['peak_activation_bytes'] / 2**30:.2f} | {result['step_ms']:.1f} | {pred} |", flush=True)

    model = copy.deepcopy(base)
    record("eager", "-", measure(model, list(model.parameters()), batch, args.steps))
    for budget in args.budgets:
        torch._dynamo.reset()
        model = copy.deepcopy(base)
        with torch._functorch.config.patch(activation_memory_budget=budget):
            record("torch.compile", budget, measure(torch.compile(model), list(model.parameters()), batch, args.steps))
    for budget in args.budgets:
        torch._dynamo.reset()
        model = copy.deepcopy(base)
        be = planner.backend(planner.PlannerConfig(codegen="inductor"), memory_budget=budget, solver=args.solver)
        result = measure(torch.compile(model, backend=be), list(model.parameters()), batch, args.steps)
        record(f"planner-{args.solver}", budget, result, sum(g.decision.memory_bytes for g in be.graphs))
    save_rows(args.out, torch.cuda.get_device_name(), torch.__version__, rows)


if __name__ == "__main__":
    main()
