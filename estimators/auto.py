"""The estimator that fits the device the graph runs on: a GPU cost model on CUDA, FLOPs elsewhere.

``flops`` prices saving as free, so its fastest plan (budget 1.0) saves every value the backward
reads, including pointwise values that inductor would recompute inside the backward's kernels at
no cost; on CUDA that plan held more memory and ran slower than plain torch.compile (GPT-2 on an
H100: 2.605 GiB / 14.9 ms with ``flops`` against 1.716 GiB / 12.5 ms with ``roofline``, whose
peaks are measured on the device in about a second). On a CPU there are no device peaks to
measure worth the name, and ``flops`` is what the CPU tests are written against.
"""
from __future__ import annotations

from typing import Any, Container, Sequence

import torch.fx as fx

from estimators.base import Estimator
from planner.ops import first_tensor

__all__ = ["AutoEstimator"]


class AutoEstimator(Estimator):
    """Parameters
    ----------
    cuda : name of the estimator used for graphs on a CUDA device (default ``"roofline"``).
    other : name of the estimator used for graphs on any other device (default ``"flops"``).
    options : keyword arguments for the chosen estimator.

    ``chosen`` is the estimator in use once the first graph's nodes were seen (``None`` before);
    reports name it, so a plan says which cost model made it.
    """

    name = "auto"

    def __init__(self, cuda: str = "roofline", other: str = "flops", **options: Any) -> None:
        from estimators import available_estimators
        from planner.errors import UnknownNameError

        for choice in (cuda, other):
            if choice not in available_estimators() or choice == self.name:
                raise UnknownNameError("estimator", str(choice), [n for n in available_estimators() if n != self.name])
        self.by_device = {"cuda": cuda, "other": other}
        self.options = options
        self.chosen: Estimator | None = None

    def prepare(self, nodes: Sequence[fx.Node]) -> None:
        if self.chosen is None:
            from estimators import get_estimator

            cuda = any(_device_type(node) == "cuda" for node in nodes)
            self.chosen = get_estimator(self.by_device["cuda" if cuda else "other"], **self.options)
        self.chosen.prepare(nodes)

    def runtime(self, node: fx.Node) -> float:
        return self._inner(node).runtime(node)

    def recompute_seconds(self, node: fx.Node, forward: Container[fx.Node]) -> float:
        return self._inner(node).recompute_seconds(node, forward)

    def save_seconds(self, node: fx.Node, forward: Container[fx.Node]) -> float:
        return self._inner(node).save_seconds(node, forward)

    def _inner(self, node: fx.Node) -> Estimator:
        if self.chosen is None:
            self.prepare([node])
        return self.chosen

    def __str__(self) -> str:
        return f"auto ({self.chosen.name})" if self.chosen is not None else "auto"


def _device_type(node: fx.Node) -> str | None:
    tensor = first_tensor(node.meta.get("val"))
    return tensor.device.type if tensor is not None else None
