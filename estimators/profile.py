"""Runtime measured on the device: every distinct op runs on real random tensors.

An op is identified by its signature: target, argument shapes, strides and dtypes, and its
non-tensor arguments. Each distinct signature runs on the device its tensors live on (CUDA
events there, ``perf_counter`` on the CPU), after warm-up runs; its runtime is the median of
the timed repeats. Results are cached on disk per torch version and device name, so a graph
is profiled once per machine; the cache is merged and replaced atomically under a file lock,
so concurrent runs cannot corrupt it or drop each other's entries.

With inductor (``fuse``, the default), pointwise ops, casts and reductions are not run: inductor
generates fused kernels for them, whose cost is the roofline's fused memory pass, not the eager
op's (an eager ``var_mean`` of the GPT's LayerNorm measured 167 µs on an H100). Matrix products,
attention, convolutions and the other library kernels are measured.

Integer inputs are zeros (a valid index for any embedding, gather or loss), floating inputs
standard normal. The ops run in a child process (:func:`planner.real_ops.run_in_child`), so one
that crashes on such inputs (T5's efficient-attention backward with dropout did, on an H100) is
priced by the roofline and reported instead of taking the program down; an op registered only in
this process (a custom op) is run here. Ops that cannot run on real tensors (custom ops with only
a fake implementation, symbolic shapes, ops that are not ATen operators) are priced by the roofline
estimator instead and listed in :attr:`ProfileEstimator.fallbacks`.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable, Container, Sequence

import torch
import torch.fx as fx

from estimators.base import Estimator
from estimators.roofline import RooflineEstimator
from estimators.timing import run_times
from planner import _torch_compat
from planner.cache import default_cache_dir
from planner.memory import generated
from planner.ops import aliased_input, first_tensor, is_getitem
from planner.real_ops import (UNKNOWN_OP, cache_file, cannot_run, measurement_job, merge_into_cache, read_cache, real_call,
                              run_in_child, signature, unrunnable)

__all__ = ["ProfileEstimator", "signature", "default_cache_dir"]


class ProfileEstimator(Estimator):
    """Parameters
    ----------
    repeats : timed runs per op (median taken), default 10.
    warmup : untimed runs before them, default 3.
    cache_dir : where the cache files live (default :func:`default_cache_dir`); ``None`` with
        ``cache=False`` keeps results in memory only.
    cache : read and write the disk cache (default True).
    progress : show a progress bar while profiling (default True).
    fuse : price pointwise ops, casts and reductions, which inductor generates fused kernels
        for, by the roofline's fused memory pass instead of their eager time (default; ``False``
        for eager codegen, where each op runs as measured).
    save_cost : price saving a value by the roofline's memory traffic for it (default; see
        :class:`~estimators.roofline.RooflineEstimator`).

    After estimating, ``measured`` counts the signatures run here, ``cached`` those read from
    disk, and ``fallbacks`` maps each signature priced by the roofline instead to the reason.
    """

    name = "profile"

    def __init__(self, repeats: int = 10, warmup: int = 3, cache_dir: str | Path | None = None, cache: bool = True,
                 progress: bool = True, fuse: bool = True, save_cost: bool = True) -> None:
        self.repeats, self.warmup = max(1, int(repeats)), max(0, int(warmup))
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache, self.progress = bool(cache), bool(progress)
        self.seconds: dict[str, float] = {}
        self.fallbacks: dict[str, str] = {}
        self.measured = self.cached = 0
        self.fuse = bool(fuse)
        self._roofline = RooflineEstimator(fuse=self.fuse, save_cost=save_cost)
        self._loaded: set[Path] = set()

    def prepare(self, nodes: Sequence[fx.Node]) -> None:
        """Profile every distinct op of ``nodes`` not yet known, with a progress bar."""
        from tqdm.auto import tqdm

        todo: dict[str, fx.Node] = {}
        for node in nodes:
            if self._measures(node):
                self._load(node)
                key = signature(node)
                if key not in self.seconds and key not in self.fallbacks:
                    todo.setdefault(key, node)
        jobs = []
        for key, node in todo.items():
            reason = unrunnable(node)
            if reason is not None:
                self.fallbacks[key] = reason
                continue
            jobs.append(measurement_job(key, node.target, node.args, node.kwargs, first_tensor(node.meta["val"]).device,
                                        "estimators.profile:median_seconds", repeats=self.repeats, warmup=self.warmup))
        with tqdm(total=len(jobs), desc="profiling ops", disable=not self.progress or not jobs, leave=False) as bar:
            results = run_in_child(jobs, lambda key: bar.update()) if jobs else {}
        fresh = {}
        for key, value in results.items():
            if isinstance(value, str) and value.startswith(UNKNOWN_OP):  # registered in this process only
                value = self._profile_here(todo[key])
            if isinstance(value, str):
                self.fallbacks[key] = value
                continue
            self.seconds[key] = fresh[key] = value
            self.measured += 1
        if fresh and self.cache:
            by_file: dict[Path, dict] = {}
            for key, node in todo.items():
                if key in fresh:
                    by_file.setdefault(self._file(node), {})[key] = fresh[key]
            for path, entries in by_file.items():
                merge_into_cache(path, "seconds", entries)

    def runtime(self, node: fx.Node) -> float:
        if not _priced(node):
            return 0.0
        if not self._measures(node):
            return self._roofline.runtime(node)
        key = signature(node)
        if key not in self.seconds and key not in self.fallbacks:
            self.prepare([node])
        if key in self.fallbacks:
            return self._roofline.runtime(node)
        return self.seconds[key]

    def recompute_seconds(self, node: fx.Node, forward: Container[fx.Node]) -> float:
        """Measured ops as measured; fused ones by the roofline, which shares their loads."""
        if self._measures(node):
            return self.runtime(node)
        return self._roofline.recompute_seconds(node, forward) if _priced(node) else 0.0

    def save_seconds(self, node: fx.Node, forward: Container[fx.Node]) -> float:
        """Saving moves memory, which the roofline prices (its ``save_cost``)."""
        return self._roofline.save_seconds(node, forward)

    def report(self) -> str:
        """How many ops were measured, read from the cache, or priced by the roofline (and why)."""
        lines = [f"profile: {self.measured} ops measured, {self.cached} from the cache, {len(self.fallbacks)} priced by roofline"]
        lines += [f"  {key.split('|', 1)[0]}: {reason}" for key, reason in sorted(self.fallbacks.items())]
        return "\n".join(lines)

    def _measures(self, node: fx.Node) -> bool:
        """Whether the node's own measured time is its cost (with ``fuse``, not for generated ones)."""
        return _priced(node) and not (self.fuse and generated(node))

    def _file(self, node: fx.Node) -> Path:
        return cache_file(self.cache_dir, "profile", first_tensor(node.meta.get("val")).device)

    def _load(self, node: fx.Node) -> None:
        if not self.cache:
            return
        path = self._file(node)
        if path in self._loaded:
            return
        self._loaded.add(path)
        entries = read_cache(path, "seconds")
        self.cached += sum(1 for key in entries if key not in self.seconds)
        self.seconds.update(entries)

    def _profile_here(self, node: fx.Node) -> float | str:
        """Seconds of an op measured in this process (one a new process does not know), or why not."""
        try:
            return _time_op(node, self.repeats, self.warmup)
        except Exception as err:  # any failure to run it on real tensors prices it by roofline
            return cannot_run(err)


def _priced(node: fx.Node) -> bool:
    return (node.op == "call_function" and not is_getitem(node) and aliased_input(node) is None
            and first_tensor(node.meta.get("val")) is not None)


def _time_op(node: fx.Node, repeats: int, warmup: int) -> float:
    with _torch_compat.real_tensors():  # inside torch.compile, ops on fake tensors run no kernels
        return _time_real_op(node, repeats, warmup)


def _time_real_op(node: fx.Node, repeats: int, warmup: int) -> float:
    with torch.no_grad():
        return median_seconds(real_call(node), first_tensor(node.meta["val"]).device, repeats, warmup)


def median_seconds(call: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> float:
    """The median seconds of ``repeats`` timed calls after ``warmup`` (run in a measuring process)."""
    return statistics.median(run_times(call, device, repeats, warmup))
