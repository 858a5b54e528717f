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

__all__ = ["own_frame"]

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
    code = _forward.__code__.replace(co_name=name)
    cls = type(name, (_Framed,), {"forward": types.FunctionType(code, _forward.__globals__, name)})
    return cls(model)
