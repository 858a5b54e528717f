"""Timing one call on a device: CUDA events on a GPU, ``perf_counter`` on the CPU.

On a GPU each timed call is queued behind a kernel that keeps the GPU busy for a few
milliseconds, so the events time the call's kernels alone, not the host's launch of them (which
for a short kernel takes longer than the kernel). On an H100, five runs of an 8192x8192 bf16
matrix product measured 1.384-1.389 ms behind the spin and 1.388-1.510 ms without it.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from planner import _torch_compat

__all__ = ["run_times"]

# GPU clock cycles of the kernel queued ahead of each timed call: about 3 ms at 1.7 GHz, more
# than the host needs to launch any one op.
SPIN_CYCLES = 5_000_000


def run_times(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            _torch_compat.gpu_spin(SPIN_CYCLES)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times
