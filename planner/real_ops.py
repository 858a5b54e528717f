"""Running one op of a graph on real tensors, as the device measurements do, and their caches.

An op is identified by its :func:`signature`: target, argument shapes, strides and dtypes, and
its non-tensor arguments. :func:`real_call` makes random real tensors of an op's argument
metadata (integer inputs zeros, a valid index for any embedding, gather or loss; floating inputs
standard normal) and returns the call. Measurements are cached on disk per torch version and
device name (:func:`cache_file`), merged under a file lock and replaced atomically, so
concurrent runs cannot corrupt a cache or drop each other's entries. :func:`run_in_child` runs
measurements in a child process, so that a kernel crashing on random inputs cannot take the
program down.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_map

from planner.cache import write_json
from planner.ops import device_name

__all__ = ["signature", "unrunnable", "real_call", "TensorSpec", "argument_specs", "op_named", "spec_call", "cache_file",
           "read_cache", "merge_into_cache", "measurement_job", "cannot_run", "run_in_child"]


def _describe(value: object) -> str:
    if isinstance(value, fx.Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor):
        return f"T({tuple(value.shape)},{tuple(value.stride())},{value.dtype},{value.device.type})"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_describe(v) for v in value) + "]"
    return repr(value)


def signature(node: fx.Node, target: object = None, args: tuple | None = None, kwargs: dict | None = None) -> str:
    """``target|sha1`` of the op and its argument shapes, strides, dtypes and other arguments
    (``node``'s, or ``target`` on ``args`` and ``kwargs``)."""
    target = node.target if target is None else target
    args, kwargs = node.args if args is None else args, node.kwargs if kwargs is None else kwargs
    described = _describe(list(args)) + _describe(sorted(kwargs.items()))
    return f"{target}|{hashlib.sha1(described.encode()).hexdigest()[:20]}"


def unrunnable(node: fx.Node, target: object = None, args: tuple | None = None,
               kwargs: dict | None = None) -> str | None:
    """Why ``node``'s op (or ``target`` on ``args`` and ``kwargs``) cannot run on real tensors
    (not an ATen operator, symbolic sizes), or None."""
    target = node.target if target is None else target
    args, kwargs = node.args if args is None else args, node.kwargs if kwargs is None else kwargs
    if not isinstance(target, torch._ops.OpOverload):
        return f"not an ATen operator ({target})"
    values, _ = tree_flatten([_val(a) for a in args] + [_val(v) for v in kwargs.values()])
    if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in values):
        return "symbolic sizes"
    if any(isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape) for v in values):
        return "symbolic shapes"
    return None


def _val(arg):
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument's metadata, picklable: what a real tensor is made of."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str


def argument_specs(args: object) -> object:
    """``args`` with each node replaced by its value, and each tensor by its :class:`TensorSpec`."""
    def spec(arg):
        val = _val(arg)
        if isinstance(val, torch.Tensor):
            return TensorSpec(tuple(int(s) for s in val.shape), tuple(int(s) for s in val.stride()), val.dtype,
                              str(val.device))
        return val

    return tree_map(spec, args, is_leaf=lambda x: isinstance(x, fx.Node))


def channels_last(specs: object) -> object:
    """``specs`` (:func:`argument_specs`) with every 4-D tensor laid out channels-last."""
    def lay_out(spec):
        if isinstance(spec, TensorSpec) and len(spec.shape) == 4:
            stride = torch.empty(spec.shape, device="meta").contiguous(memory_format=torch.channels_last).stride()
            return TensorSpec(spec.shape, tuple(int(s) for s in stride), spec.dtype, spec.device)
        return spec

    return tree_map(lay_out, specs)


def op_named(name: str) -> torch._ops.OpOverload:
    """The ATen operator overload called ``name`` (``str(op)``, e.g. ``aten.mm.default``)."""
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def spec_call(target: Callable, args: object, kwargs: object) -> Callable[[], object]:
    """A call of ``target`` on new random real tensors made of the :class:`TensorSpec` in
    ``args`` and ``kwargs``."""
    def make(arg):
        return _real(arg) if isinstance(arg, TensorSpec) else arg

    args, kwargs = tree_map(make, args), tree_map(make, kwargs)
    return lambda: target(*args, **kwargs)


def _real(fake: torch.Tensor | TensorSpec) -> torch.Tensor:
    shape, stride = tuple(fake.shape), tuple(fake.stride) if isinstance(fake, TensorSpec) else tuple(fake.stride())
    t = torch.empty_strided(shape, stride, dtype=fake.dtype, device=fake.device)
    if fake.dtype.is_floating_point or fake.dtype.is_complex:
        return t.normal_()
    if fake.dtype == torch.bool:
        return t.copy_(torch.rand(t.shape, device=t.device) < 0.5)
    return t.zero_()


def real_call(node: fx.Node, target: Callable | None = None, args: tuple | None = None,
              kwargs: dict | None = None) -> Callable[[], object]:
    """A call of ``node``'s op (or ``target`` on ``args`` and ``kwargs``, nodes among them) on
    new random real tensors of the arguments' metadata, to be made and run where tensors are
    real (:func:`planner._torch_compat.real_tensors`)."""
    target = node.target if target is None else target
    args, kwargs = node.args if args is None else args, node.kwargs if kwargs is None else kwargs
    return spec_call(target, argument_specs(args), argument_specs(kwargs))


def cache_file(cache_dir: Path, kind: str, device: torch.device) -> Path:
    """The cache file of ``kind`` for ``device``, with this torch."""
    name = device_name(device)
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{torch.__version__}-{name}").strip("-")
    return cache_dir / f"{kind}-{slug}.json"


def read_cache(path: Path, field: str, kind: type = float) -> dict:
    """The cache file's entries under ``field``; a missing or unreadable file is an empty cache
    (it is rewritten)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    entries = data.get(field) if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        return {}
    return {k: kind(v) for k, v in entries.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def merge_into_cache(path: Path, field: str, entries: dict) -> None:
    """Add ``entries`` to the cache file: under a lock, read, merge, write a temp file, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = {**read_cache(path, field), **entries}
        write_json(path, {"torch": torch.__version__, field: merged}, indent=0)


CHILD_SECONDS = 120.0  # the most one measuring process may run before it is stopped
UNKNOWN_OP = "unknown operator"  # a job's op is not registered in the measuring process


def measurement_job(key: str, target: object, args: tuple, kwargs: dict, device: torch.device, measurer: str,
                    laid_out: bool = False, **options: object) -> tuple:
    """A job for :func:`run_in_child`: ``measurer`` (``"module:function"``) called on a call of
    ``target`` with random tensors of the metadata of ``args`` and ``kwargs`` (nodes among them;
    with ``laid_out``, their 4-D tensors channels-last, :func:`channels_last`), the device, and
    ``options``."""
    specs, keywords = argument_specs(args), argument_specs(kwargs)
    if laid_out:
        specs, keywords = channels_last(specs), channels_last(keywords)
    return key, str(target), specs, keywords, str(device), measurer, options


def cannot_run(err: Exception) -> str:
    """Why an op could not run on random real tensors, in one line."""
    return f"cannot run on real tensors: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def run_in_child(jobs: list[tuple], on_result: Callable[[str], None] | None = None) -> dict[str, float | str]:
    """Run measurements in a child process, so that a kernel that crashes on random inputs (a
    segmentation fault) or hangs takes only that process down: its job is reported as failed
    and a new process goes on with the rest.

    A job is ``(key, op name, argument specs, keyword argument specs, device, measurer,
    options)`` (:func:`measurement_job`): the op (:func:`op_named`) is called on random tensors made of the specs
    (:func:`spec_call`) and ``measurer`` (``"module:function"``) is called with the call, the
    device and ``options``, returning a number. Returns the number, or why there is none, per
    key; ``on_result`` is called with each key as its result comes (a progress bar's update)."""
    results: dict[str, float | str] = {}
    pending = list(jobs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
    while pending:
        proc = subprocess.Popen([sys.executable, "-m", "planner.real_ops"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        timer = threading.Timer(CHILD_SECONDS, proc.kill)
        timer.start()
        try:
            proc.stdin.write(pickle.dumps(pending))
            proc.stdin.close()
            for line in proc.stdout:
                try:
                    key, value = json.loads(line)
                except ValueError:
                    continue
                results[key] = value if isinstance(value, str) else float(value)
                if on_result is not None:
                    on_result(key)
            proc.wait()
        except BrokenPipeError:  # the process died before it read its jobs
            proc.wait()
        finally:
            timer.cancel()
        pending = [job for job in pending if job[0] not in results]
        if pending:  # the process died (or ran out of time) on the first job it did not report
            results[pending[0][0]] = (f"stopped the measuring process (exit status {proc.returncode}; "
                                      f"stopped after {CHILD_SECONDS:.0f} s if negative 9)")
            if on_result is not None:
                on_result(pending[0][0])
            pending = pending[1:]
    return results


def _child() -> None:
    """The measuring process: jobs pickled on stdin, one JSON line per job on stdout."""
    import importlib

    for key, name, args, kwargs, device, measurer, options in pickle.loads(sys.stdin.buffer.read()):
        module, function = measurer.split(":")
        try:
            op = op_named(name)
        except AttributeError:
            print(json.dumps([key, f"{UNKNOWN_OP}: {name} is not registered in a new process"]), flush=True)
            continue
        try:
            with torch.no_grad():
                value: float | str = float(getattr(importlib.import_module(module), function)(
                    spec_call(op, args, kwargs), torch.device(device), **options))
        except Exception as err:  # an op that cannot run on random tensors is reported, not raised
            value = cannot_run(err)
        print(json.dumps([key, value]), flush=True)


if __name__ == "__main__":  # run as the module itself, whose TensorSpec the jobs were pickled with
    from planner.real_ops import _child as child

    child()
