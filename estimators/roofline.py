"""Runtime as a roofline: ``max(flops / peak_flops, bytes moved / peak_bandwidth)`` per op.

The peaks are the current device's, measured once per process by a quick calibration (a large
matrix product per precision, a large device-to-device copy, and a CUDA graph of 100 tiny
kernels for the cost of one more kernel); datasheet figures for common GPUs (:data:`DATASHEET`) are used instead with
``calibrate=False``. Bytes are counted as inductor moves them: a pointwise value that inductor
computes inside the kernels reading it is neither written nor read back, so a fusible
pointwise chain costs one memory pass (its stored inputs read once, its stored output written
once) however many ops it has.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Container

import torch
import torch.fx as fx

from estimators.base import Estimator
from estimators.flops import count_flops
from estimators.timing import run_times
from planner import _torch_compat
from planner.errors import ConfigError
from planner.memory import copies_inputs, fusible, is_reduction, readers, stored_bytes
from planner.ops import aliased_input, device_name, first_tensor, is_getitem, storage_bytes, view_base

__all__ = ["RooflineEstimator", "Rates", "DATASHEET", "device_rates", "measure_rates", "datasheet_rates"]


@dataclass(frozen=True)
class Rates:
    """Peak rates of one device: matrix FLOP/s in 16-bit and in 32-bit floats, bytes/s, launch seconds."""

    half_flops: float
    single_flops: float
    bandwidth: float
    launch: float = 0.0
    source: str = "datasheet"

    def flops_rate(self, dtype: torch.dtype) -> float:
        return self.half_flops if dtype in (torch.bfloat16, torch.float16) else self.single_flops


# Dense tensor-core rates (single = TF32, torch's default for float32 convolutions) and HBM
# bandwidth from NVIDIA's datasheets; SXM parts unless named. Longest name matches first.
DATASHEET: dict[str, Rates] = {
    "H200": Rates(989e12, 494e12, 4.8e12, 4e-6),
    "H100 PCIe": Rates(756e12, 378e12, 2.0e12, 4e-6),
    "H100": Rates(989e12, 494e12, 3.35e12, 4e-6),
    "A100": Rates(312e12, 156e12, 2.039e12, 4e-6),
}


def datasheet_rates(device_name: str) -> Rates | None:
    """The datasheet entry whose name appears in ``device_name`` (``None`` if none does)."""
    for name in sorted(DATASHEET, key=len, reverse=True):
        if name in device_name:
            return DATASHEET[name]
    return None


class RooflineEstimator(Estimator):
    """Parameters
    ----------
    calibrate : measure the device's peaks (default); ``False`` takes them from :data:`DATASHEET`.
    fuse : count bytes as inductor fuses pointwise chains (default; ``False`` for eager codegen).
    flops_per_second, bytes_per_second : fixed rates instead (both or neither).
    save_cost : price saving a value by the memory traffic it adds (default): its write in the
        forward, unless the forward stores it anyway, and its read in the backward when the
        backward would otherwise compute it inside the kernels that read it (a value read by a
        matrix product is read either way). Recomputing a fused pointwise value from inputs
        saved anyway can then beat saving it. ``False``: saving is free.
    """

    name = "roofline"

    def __init__(self, calibrate: bool = True, fuse: bool = True, flops_per_second: float | None = None,
                 bytes_per_second: float | None = None, save_cost: bool = True) -> None:
        if (flops_per_second is None) != (bytes_per_second is None):
            raise ConfigError("roofline: give both flops_per_second and bytes_per_second, or neither")
        self.calibrate, self.fuse, self.save_cost = bool(calibrate), bool(fuse), bool(save_cost)
        self.fixed = None if flops_per_second is None else Rates(flops_per_second, flops_per_second, bytes_per_second, 0.0, "given")
        self.rates: Rates | None = None  # set by the first estimate, for the device of its tensors

    def runtime(self, node: fx.Node) -> float:
        return self._seconds(node, frozenset())

    def recompute_seconds(self, node: fx.Node, forward: Container[fx.Node]) -> float:
        """With ``fuse``, a pointwise op run again in the backward shares its loads: an input that
        a pointwise kernel of the backward reads anyway (the product under a GELU, read by the
        GELU's gradient) is loaded once by the fused kernel, so it is not counted.

        Only where every reader is pointwise: an op read by a reduction is computed inside the
        reduction's kernel, which must finish before any kernel using its result starts, so its
        loads are that kernel's own (BatchNorm's statistics recomputed in the backward read the
        convolution's output once more; with the discount they were priced free, and a ResNet-50
        plan recomputed them all, 100 more reduction kernels and 16% slower than torch.compile
        on an H100)."""
        if not (self.fuse and fusible(node)) or not all(fusible(r) for r in readers(node)):
            return self.runtime(node)
        shared = frozenset(inp for inp in node.all_input_nodes
                           if any(r not in forward and fusible(r) for r in readers(view_base(inp))))
        return self._seconds(node, shared)

    def save_seconds(self, node: fx.Node, forward: Container[fx.Node]) -> float:
        out = node.meta.get("val")
        if not self.save_cost or not isinstance(out, torch.Tensor) or aliased_input(node) is not None:
            return 0.0
        reading = readers(node)
        before = [r for r in reading if r in forward]
        later = [r for r in reading if r not in forward]
        # A reader that lays out its inputs itself (fused attention reading a repeated key)
        # computes an unstored value into a copy of its own: the forward writes those bytes
        # anyway, and a backward reader of that kind, fed the saved value, makes no copy.
        written = bool(before) and (not self.fuse or stored_bytes(node, before, True) > 0
                                    or any(copies_inputs(r) for r in before))
        fused_later = (self.fuse and bool(later) and stored_bytes(node, later, True) == 0
                       and not any(copies_inputs(r) for r in later))
        passes = (0 if written else 1) + (1 if fused_later else 0)
        return storage_bytes(out) * passes / self._rates(out.device).bandwidth

    def _seconds(self, node: fx.Node, shared: frozenset) -> float:
        out = first_tensor(node.meta.get("val"))
        if aliased_input(node) is not None or is_getitem(node) or out is None:
            return 0.0
        flops = count_flops(node)
        moved = self.bytes_moved(node, shared)
        if not flops and not moved:
            return 0.0  # computed inside its readers' kernels from values they load anyway
        # A kernel of its own (it writes or computes): pays one more kernel's GPU time.
        dtype = compute_dtype(node, out)
        rates = self._rates(out.device)
        return max(flops / rates.flops_rate(dtype), moved / rates.bandwidth) + rates.launch

    def _rates(self, device: torch.device) -> Rates:
        if self.rates is None:  # the first estimate's device
            self.rates = self.fixed or device_rates(device, self.calibrate)
        return self.rates

    def bytes_moved(self, node: fx.Node, shared: frozenset = frozenset()) -> int:
        """Bytes the node's kernel reads from and writes to memory, with fused producers free
        and the inputs in ``shared`` (loaded by a kernel it fuses with) free too."""
        written = stored_bytes(node, readers(node), self.fuse) if self.fuse else _nbytes(node)
        read, seen = 0, set()
        reduction = self.fuse and is_reduction(node)
        for inp in node.all_input_nodes:
            if inp in shared:
                continue
            root = view_base(inp)
            if self.fuse and _inlined(root):
                # inlined: its own inputs are what the kernel reads, counted by the op that reads
                # them, except in a reduction's kernel, which loads them itself (below)
                read += _loads_through(root, seen) if reduction else 0
                continue
            read += _nbytes(inp)
        return written + read


def _inlined(node: fx.Node) -> bool:
    """``node`` is computed inside its readers' kernels (inductor stores nothing of it)."""
    return (isinstance(node.meta.get("val"), torch.Tensor) and node.op == "call_function"
            and stored_bytes(node, readers(node), True) == 0)


def _loads_through(node: fx.Node, seen: set, depth: int = 8) -> int:
    """Bytes a kernel that computes the inlined ``node`` inside it loads for it: the stored
    values ``node`` reads, directly or through other inlined ops (up to ``depth`` deep), each
    once (``seen``).

    A reduction runs in a kernel of its own, so it loads these itself, whatever else loads them:
    Llama's RMSNorm statistics, ``mean(pow(float(x)))``, recomputed in the backward, load ``x``
    in a reduction kernel of their own besides the kernel that normalises ``x`` again. Counting
    the cast's load alone (which a pointwise kernel of the backward shares) priced the statistics
    free, and Llama's budget-1.0 plan recomputed all 13 of them: 13 more reduction kernels than
    torch.compile's, 0.28 ms of GPU time on an H200 (``bench.compile_variants --kernels``)."""
    total = 0
    for inp in node.all_input_nodes:
        root = view_base(inp)
        if root in seen:
            continue
        seen.add(root)
        if depth and _inlined(root):
            total += _loads_through(root, seen, depth - 1)
        elif isinstance(root.meta.get("val"), torch.Tensor):
            total += _nbytes(root)
    return total


def _nbytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def _input_tensors(node: fx.Node) -> list[torch.Tensor]:
    return [inp.meta["val"] for inp in node.all_input_nodes if isinstance(inp.meta.get("val"), torch.Tensor)]


def device_rates(device: torch.device, calibrate: bool = True) -> Rates:
    """Measured peaks of ``device``, or with ``calibrate=False`` its datasheet entry.

    Raises
    ------
    ConfigError
        With ``calibrate=False`` on a device the datasheet lacks.
    """
    if calibrate:
        return measure_rates(str(device))
    name = device_name(device)
    rates = datasheet_rates(name)
    if rates is None:
        raise ConfigError(f"roofline: no datasheet rates for {name!r} (known: {', '.join(DATASHEET)}); "
                          f"use estimator_options calibrate=true, or give flops_per_second and bytes_per_second")
    return rates


@lru_cache(maxsize=None)
def measure_rates(device: str) -> Rates:
    """Quick peaks of one device (about a second): best of a few timed runs of each probe,
    on real tensors even when called inside torch.compile."""
    with _torch_compat.real_tensors():
        return _measure_rates(torch.device(device))


def _measure_rates(dev: torch.device) -> Rates:
    big = dev.type == "cuda"
    n = 8192 if big else 512
    half = _best(lambda a, b: a @ b, *(torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2)), dev)
    single = _best(lambda a, b: a @ b, *(torch.randn(n, n, device=dev) for _ in range(2)), dev)
    numel = (2**28 if big else 2**24) // 4
    src, dst = torch.randn(numel, device=dev), torch.empty(numel, device=dev)
    copy = _best(lambda s, d: d.copy_(s), src, dst, dev)
    launch = _kernel_seconds(dev) if big else 0.0
    return Rates(2 * n**3 / half, 2 * n**3 / single, 2 * src.nbytes / copy, launch, f"measured on {dev}")


def _kernel_seconds(dev: torch.device, kernels: int = 100) -> float:
    """GPU time of one more tiny kernel: a CUDA graph of ``kernels`` of them, replayed.

    A graph keeps the host out of the figure, so a busy CPU (compile workers) cannot inflate it.
    """
    tiny = torch.randn(16, device=dev)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(stream):
        tiny.add_(1.0)  # warm-up outside the capture
    torch.cuda.current_stream(dev).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            tiny.add_(1.0)
    return _best(lambda g, _: g.replay(), graph, None, dev) / kernels


def _best(fn, a, b, dev: torch.device, repeats: int = 5) -> float:
    """Least seconds of ``fn(a, b)`` over a few runs after a warm-up."""
    return max(min(run_times(lambda: fn(a, b), dev, repeats)), 1e-9)


def compute_dtype(node: fx.Node, out: torch.Tensor) -> torch.dtype:
    """The dtype an op computes in: that of its largest floating-point input (the widest on a
    tie), else its output's. The largest, not the widest: an attention backward reads bf16
    queries, keys and values beside a float32 log-sum-exp and int64 RNG seeds, and priced at the
    float32 rate its step estimate on an H100 came to 6.6 ms a layer, against about 0.4 measured."""
    floats = [t for t in _input_tensors(node) if t.dtype.is_floating_point]
    if not floats:
        return out.dtype
    return max(floats, key=lambda t: (t.numel(), t.dtype.itemsize)).dtype
