"""Scratch memory that library kernels allocate while they run, measured on the device.

A matrix product, a convolution or an attention kernel from a library (cuBLAS, cuDNN, the
attention kernels) may allocate memory through PyTorch's caching allocator for the time it runs
and free it before it returns: a cuDNN workspace, an attention backward's float32 accumulators.
No value of the graph accounts for it, yet it is alive at that step's peak. Measured on an H100
(bf16): the depthwise convolution backward of ConvNeXt-T's last stage at batch 128 allocated
73.5 MiB inside cuDNN, T5's attention backward with a position bias two 16 MiB blocks; the
memory model had been that much under the traced peak at those steps.

Inductor generates pointwise, reduction and indexing kernels itself, lowers some other ops to
generated code too (``cat``, ``index_put``, ``sort``) or to libraries that keep no scratch of
their own (cuBLAS products: measured, none on an H100), and calls the rest as library (extern)
kernels with the arguments the graph gives them: the ops it falls back to, and convolutions
(:func:`planner.memory.library_kernel`; run op by op, every op but a pointwise one). Each of
those is run once per distinct signature (:func:`planner.real_ops.signature`) on random real tensors of its
arguments' metadata, after a first run that makes the library's lasting allocations (cuBLAS's
workspace, lazy initialisation): its scratch memory is the peak allocated during the second run
less what is allocated after it (its outputs held). The ops run in a child process
(:func:`planner.real_ops.run_in_child`): the program's RNG streams and peak-memory statistics
are untouched, and a kernel that crashes on random inputs (T5's attention backward with dropout did, on an H100) is
reported as not measured, counted as needing no scratch (:func:`failed_workspaces`), rather than
taking the program down. Results are cached on disk per torch version and device name, as
profiled times are, so a graph's ops run once per machine.

Only CUDA graphs are measured (a CPU step's memory is the host's, which
``torch.cuda.max_memory_allocated`` does not see).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.fx as fx

from planner import _torch_compat
from planner.cache import default_cache_dir
from planner.ops import aliased_input, is_getitem, side_effect, written_input
from planner.real_ops import (cache_file, measurement_job, merge_into_cache, read_cache, run_in_child, signature,
                              unrunnable)
from planner.units import format_bytes

__all__ = ["measure_workspaces", "workspace_bytes", "measured_workspaces", "failed_workspaces", "scratch_summary"]

_BYTES: dict[str, int] = {}  # signature -> scratch bytes, for every signature measured or read in this process
# a convolution's signature -> the key it was measured under, channels-last (see measure_workspaces)
_LAID_OUT: dict[str, str] = {}
CHANNELS_LAST = "|channels-last"
_FAILED: dict[str, str] = {}  # signature -> why it could not run (counted as no scratch memory)
_LOADED: set[Path] = set()


def workspace_bytes(node: fx.Node, fuse: bool = True) -> int:
    """The scratch bytes ``node``'s library kernel allocates while it runs, as measured on its
    device (0 where nothing was measured: generated kernels, CPU graphs, ops not run); ``fuse``:
    compiled by inductor (else run op by op)."""
    call = _library_call(node, fuse)
    if call is None:
        return 0
    return _BYTES.get(_measured_key(node, call), 0)


def _measured_key(node: fx.Node, call: tuple) -> str:
    """The key ``node``'s library call was measured under: its signature, or for a convolution
    measured channels-last, that signature's own key."""
    key = signature(node, *call)
    return _LAID_OUT.get(key, key)


def measured_workspaces() -> dict[str, int]:
    """Every signature measured or read from the cache in this process, with its bytes."""
    return dict(_BYTES)


def failed_workspaces() -> dict[str, str]:
    """Signatures that could not be measured in this process (counted as no scratch), and why."""
    return dict(_FAILED)


def scratch_summary(nodes: Iterable[fx.Node], fuse: bool = True) -> str | None:
    """What the memory model counts of the library kernels among ``nodes`` (measured ones with
    scratch, the largest, those that could not be measured), in words; None where none runs on
    a device whose scratch is measured (a CPU graph)."""
    kernels = {}
    for node in nodes:
        call = _library_call(node, fuse)
        if call is not None:
            kernels[_measured_key(node, call)] = node
    if not kernels:
        return None
    sizes = {key: _BYTES.get(key, 0) for key in kernels}
    with_scratch = {key: size for key, size in sizes.items() if size}
    failed = [key for key in kernels if key in _FAILED]
    text = f"{len(kernels)} library kernels, {len(with_scratch)} with scratch memory"
    if with_scratch:
        key = max(with_scratch, key=with_scratch.__getitem__)
        text += f" (largest {format_bytes(with_scratch[key])}, {key.split('|')[0]} at {kernels[key].name})"
    if failed:
        text += f"; {len(failed)} not measured, counted as none ({', '.join(sorted({k.split('|')[0] for k in failed}))})"
    return text


def measure_workspaces(nodes: Iterable[fx.Node], cache_dir: str | Path | None = None, cache: bool = True,
                       fuse: bool = True, channels_last: bool = False) -> int:
    """Measure the scratch memory of every library kernel among ``nodes`` not known yet (read
    from the disk cache in ``cache_dir``, default :func:`~planner.cache.default_cache_dir`, or
    run on the device); ``fuse``: the graph is compiled by inductor (else run op by op). Returns
    how many were run here.

    ``channels_last``: inductor lays the graph's convolutions out channels-last (its layout
    optimisation, :func:`planner.memory.convolutions_laid_out`). They then run so, forward and
    backward (the backward's read the forward's channels-last activations), though the traced
    graph's tensors are contiguous: they are measured channels-last, under their own key. cuDNN
    picks its algorithm, and with it its workspace, by the layout: on an H200, a convolution
    backward of timm's MobileNetV3 allocated a 93.75 MiB block at the measured peak that the
    model measured contiguous had not counted."""
    from planner.memory import CONVOLUTIONS  # the memory model reads this module's figures

    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    todo: dict[str, tuple[fx.Node, tuple]] = {}
    for node in nodes:
        call = _library_call(node, fuse)
        if call is None:
            continue
        if cache:
            _load(cache_file(cache_dir, "workspace", _device(node)))
        key = signature(node, *call)
        if channels_last and fuse and call[0] in CONVOLUTIONS:
            _LAID_OUT[key] = key = key + CHANNELS_LAST
        else:
            _LAID_OUT.pop(key, None)
        if key not in _BYTES and key not in _FAILED:
            todo.setdefault(key, (node, call))
    jobs = {key: _job(key, node, *call) for key, (node, call) in todo.items()}
    measured = run_in_child([job for job in jobs.values() if not isinstance(job, str)]) if jobs else {}
    fresh: dict[Path, dict[str, int]] = {}
    failed: list[str] = []
    for key, (node, call) in todo.items():
        result = jobs[key] if isinstance(jobs[key], str) else measured[key]
        if isinstance(result, str):
            _FAILED[key] = result
            failed.append(f"{key.split('|')[0]} ({node.name}): {result}")
            continue
        _BYTES[key] = result = max(0, int(result))
        fresh.setdefault(cache_file(cache_dir, "workspace", _device(node)), {})[key] = result
    if failed:  # kernels whose scratch is unknown, counted as none: say so
        warnings.warn(f"the scratch memory of {len(failed)} library kernel(s) could not be measured and is counted as "
                      f"none in the planner's memory model: {'; '.join(failed[:3])}{'; ...' if len(failed) > 3 else ''}",
                      stacklevel=2)
    if cache:
        for path, entries in fresh.items():
            merge_into_cache(path, "bytes", entries)
    return sum(len(entries) for entries in fresh.values())


def _load(path: Path) -> None:
    if path not in _LOADED:
        _LOADED.add(path)
        for key, value in read_cache(path, "bytes", int).items():
            _BYTES.setdefault(key, value)


def _library_call(node: fx.Node, fuse: bool) -> tuple[Callable, tuple, dict] | None:
    """The op, arguments and keyword arguments ``node`` runs as a library kernel on a CUDA
    device (a random op's own, where the node replays or saves its RNG state), or None."""
    if node.op != "call_function" or is_getitem(node) or not isinstance(node.meta.get("val"), (torch.Tensor, tuple, list)):
        return None
    target, args, kwargs = node.target, node.args, node.kwargs
    if target is _torch_compat.run_and_save_rng_state():
        target, args = args[0], args[1:]
    elif target is _torch_compat.run_with_rng_state():
        target, args = args[1], args[2:]
    elif aliased_input(node) is not None or written_input(node) is not None or side_effect(node):
        return None
    if not isinstance(target, torch._ops.OpOverload):
        return None
    if _device(node) is None:
        return None
    from planner.memory import library_kernel  # the memory model reads this module's figures

    if not library_kernel(target, fuse):
        return None  # inductor generates its kernel
    return target, tuple(args), dict(kwargs)


def _cuda_scratch(call: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated while ``call`` runs, less those allocated after it (its outputs)."""
    out = call()  # the library's lasting allocations and lazy set-up happen here
    del out
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = call()
    torch.cuda.synchronize(device)
    scratch = torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device)
    del out
    return scratch


# device type -> "module:function" measuring a call's scratch memory there (the devices whose
# memory a budget bounds); run in a child process, by name
_DEVICES: dict[str, str] = {"cuda": "planner.workspace:_cuda_scratch"}


def _device(node: fx.Node) -> torch.device | None:
    """The device of ``node``'s tensor inputs, where scratch memory is measured there."""
    for inp in node.all_input_nodes:
        val = inp.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type in _DEVICES:
            return val.device
    return None


def _job(key: str, node: fx.Node, target: Callable, args: tuple, kwargs: dict) -> tuple | str:
    """What a measuring process needs to run ``target`` on ``node``'s arguments, or why it cannot."""
    reason = unrunnable(node, target, args, kwargs)
    if reason is not None:
        return reason
    device = _device(node)
    return measurement_job(key, target, args, kwargs, device, _DEVICES[device.type],
                           laid_out=key.endswith(CHANNELS_LAST))


