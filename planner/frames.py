"""A module behind a frame of its own, so torch.compile keeps its compiled graphs apart.

torch.compile keeps compiled graphs per code object (the ``forward`` of a class), guarded on the
instance, shapes and backend; past ``recompile_limit`` entries for one code object it stops
compiling, and with ``fullgraph=True`` it fails (``FailOnRecompileLimitHit``). Every plan of a
fresh instance of one model class would add an entry to that class's ``forward``, so the ninth
``plan()`` in a loop failed. Behind a forward whose code object is new, each plan (and each
capture) compiles on its own and depends on no earlier one.
"""
from __future__ import annotations

import itertools
import types

import torch.nn as nn

__all__ = ["own_frame", "own_forward"]

_frames = itertools.count()


def _forward(self, *args, **kwargs):
    return self.inner(*args, **kwargs)


class _Framed(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model


def own_frame(model: nn.Module) -> nn.Module:
    """``model`` behind a ``forward`` with a code object of its own (same parameters, same
    training mode, same outputs); compiling it adds no entry to the cache of ``model``'s class."""
    name = f"frame_{next(_frames)}"
    cls = type(name, (_Framed,), {"forward": _renamed(_forward, name)})
    return cls(model)


def _renamed(function, name: str):
    """A copy of ``function`` with a code object of its own, named ``name``."""
    return types.FunctionType(function.__code__.replace(co_name=name), function.__globals__, name)


def _inherited_forward(self, *args, **kwargs):
    return self._frame_base.forward(self, *args, **kwargs)


def own_forward(modules) -> None:
    """Give ``modules`` (the blocks of one model) a ``forward`` whose code object is new and
    shared by them alone, in place: each one's class becomes a subclass of its own class made
    for this call, so parameter names, state dicts and ``isinstance`` are unchanged, and the
    blocks compiled after this share one cache entry that no earlier compile added to."""
    made: dict[type, type] = {}
    for module in modules:
        base = type(module)
        if base not in made:
            forward = _renamed(_inherited_forward, f"{base.__name__}_frame_{next(_frames)}")
            made[base] = type(base.__name__, (base,), {"forward": forward, "_frame_base": base})
        module.__class__ = made[base]
