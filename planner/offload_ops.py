"""The copies an offloading plan inserts: device to host in the forward, host to device in the
backward, each on a transfer stream of its own, and the waits that order them with compute.

Three ops, registered as ``torch.ops.acplan.*`` so that fx, AOTAutograd and inductor keep them as
opaque calls in the emitted modules:

* ``offload(x) -> h``: copy ``x`` into pinned host memory on the device's transfer stream, after
  what the compute stream has queued so far (``x`` is complete);
* ``reload(h, device, size, stride) -> y``: copy ``h`` back into a new tensor on ``device``,
  laid out as the original was;
* ``wait(t, keepalive) -> t``: the compute stream waits for the copy that made ``t``. Passing
  the copy's source as ``keepalive`` makes the wait its last reader, so the emitted code frees
  the source right after the wait, when the copy is done and later compute is ordered after it.

The wait's output is its input (an alias, as the schema says), so no bytes move at the wait.
None of the ops is marked as having side effects: each one's output is read (the forward returns
its waits' outputs, the backward's readers read theirs), and an op marked so would be copied into
the forward module too, wherever its inputs are there.
On a CPU the host is the device itself: the copies are plain copies and the waits do nothing,
which is how the CPU tests run an offloading plan. Pinned buffers come from torch's caching host
allocator (``pin_memory=True``), so a step's offloads reuse the blocks of earlier steps.
"""
from __future__ import annotations

import torch

__all__ = ["OFFLOAD", "RELOAD", "WAIT"]

_lib = torch.library.Library("acplan", "DEF")
_lib.define("offload(Tensor x) -> Tensor")
_lib.define("reload(Tensor h, Device device, SymInt[] size, SymInt[] stride) -> Tensor")
_lib.define("wait(Tensor(a) t, Tensor? keepalive=None) -> Tensor(a)")

_streams: dict[torch.device, torch.Stream] = {}
_pending: dict[int, torch.Event] = {}  # the copy that made a tensor, by its data pointer


def _transfer_stream(device: torch.device) -> torch.Stream:
    if device not in _streams:
        _streams[device] = torch.Stream(device=device)
    return _streams[device]


def _copy_on_transfer_stream(out: torch.Tensor, src: torch.Tensor, device: torch.device) -> torch.Tensor:
    compute = torch.accelerator.current_stream(device)
    transfer = _transfer_stream(device)
    transfer.wait_stream(compute)  # the source is complete once what compute queued has run
    event = torch.Event(device=device)
    torch.accelerator.set_stream(transfer)
    try:
        out.copy_(src, non_blocking=True)
        transfer.record_event(event)
    finally:
        torch.accelerator.set_stream(compute)
    _pending[out.data_ptr()] = event
    return out


def _on_host(x: torch.Tensor) -> bool:
    return x.device.type == "cpu"


@torch.library.impl(_lib, "offload", "CompositeExplicitAutograd")
def _offload(x: torch.Tensor) -> torch.Tensor:
    if _on_host(x):
        return x.clone(memory_format=torch.preserve_format)
    h = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="cpu", pin_memory=True)
    return _copy_on_transfer_stream(h, x, x.device)


@torch.library.impl(_lib, "reload", "CompositeExplicitAutograd")
def _reload(h: torch.Tensor, device: torch.device, size: list[int], stride: list[int]) -> torch.Tensor:
    y = torch.empty_strided(size, stride, dtype=h.dtype, device=device)
    if _on_host(y):
        return y.copy_(h)
    return _copy_on_transfer_stream(y, h, y.device)


@torch.library.impl(_lib, "wait", "CompositeExplicitAutograd")
def _wait(t: torch.Tensor, keepalive: torch.Tensor | None = None) -> torch.Tensor:
    event = _pending.pop(t.data_ptr(), None)
    if event is not None:
        device = keepalive.device if keepalive is not None and not _on_host(keepalive) else t.device
        torch.accelerator.current_stream(device).wait_event(event)
    return t


@torch.library.register_fake("acplan::offload")
def _offload_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="cpu")


@torch.library.register_fake("acplan::reload")
def _reload_fake(h: torch.Tensor, device: torch.device, size: list[int], stride: list[int]) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=h.dtype, device=device)


@torch.library.register_fake("acplan::wait")
def _wait_fake(t: torch.Tensor, keepalive: torch.Tensor | None = None) -> torch.Tensor:
    return t


OFFLOAD = torch.ops.acplan.offload.default
RELOAD = torch.ops.acplan.reload.default
WAIT = torch.ops.acplan.wait.default
