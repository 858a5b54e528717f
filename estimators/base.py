"""The interface of a runtime estimator."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Container, Sequence

import torch.fx as fx

__all__ = ["Estimator"]


class Estimator(ABC):
    """Estimates how long one node of a joint graph takes to run, in seconds.

    Nodes carry FakeTensor metadata in ``node.meta["val"]``; an estimator reads shapes and dtypes
    from there. Memory is not an estimator's business: it comes from the tensor metadata.
    """

    name: ClassVar[str]

    def __str__(self) -> str:
        """The name reports give this estimator (``auto`` adds the one it chose)."""
        return self.name

    def prepare(self, nodes: Sequence[fx.Node]) -> None:
        """Called once with every node about to be estimated (the profiler measures them here)."""

    @abstractmethod
    def runtime(self, node: fx.Node) -> float:
        """Seconds to run ``node`` once (a call_function node of the forward region)."""

    def recompute_seconds(self, node: fx.Node, forward: Container[fx.Node]) -> float:
        """Seconds to run ``node`` again in the backward (default: :meth:`runtime`).

        ``forward`` holds the forward-region nodes; every other reader is in the backward. An
        estimator that models kernel fusion may discount loads the backward makes anyway.
        """
        return self.runtime(node)

    def save_seconds(self, node: fx.Node, forward: Container[fx.Node]) -> float:
        """Seconds that saving ``node``'s value for the backward adds to the step (default: none).

        A saved value is written by the forward unless the forward stores it anyway for its
        readers in ``forward``, and read by the backward where a recomputation could have been
        fused into the reading kernels instead.
        """
        return 0.0
