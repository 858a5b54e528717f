"""The interface of a runtime estimator."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Sequence

import torch.fx as fx

__all__ = ["Estimator"]


class Estimator(ABC):
    """Estimates how long one node of a joint graph takes to run, in seconds.

    Nodes carry FakeTensor metadata in ``node.meta["val"]``; an estimator reads shapes and dtypes
    from there. Memory is not an estimator's business: it comes from the tensor metadata.
    """

    name: ClassVar[str]

    def prepare(self, nodes: Sequence[fx.Node]) -> None:
        """Called once with every node about to be estimated (the profiler measures them here)."""

    @abstractmethod
    def runtime(self, node: fx.Node) -> float:
        """Seconds to run ``node`` once (a call_function node of the forward region)."""
