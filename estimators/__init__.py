"""Estimators: give every node of the joint graph a runtime, in seconds.

    >>> from estimators import available_estimators
    >>> available_estimators()
    ['constant', 'flops']
"""
from __future__ import annotations

from estimators.base import Estimator
from estimators.constant import ConstantEstimator
from estimators.flops import FlopsEstimator
from planner.errors import UnknownNameError

__all__ = ["Estimator", "get_estimator", "available_estimators"]

_REGISTRY: dict[str, type[Estimator]] = {cls.name: cls for cls in (ConstantEstimator, FlopsEstimator)}


def available_estimators() -> list[str]:
    return sorted(_REGISTRY)


def get_estimator(name: str, **options) -> Estimator:
    """A new estimator by name.

    Raises
    ------
    UnknownNameError
        If no estimator has that name; the message lists the available ones.
    """
    try:
        cls = _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownNameError("estimator", str(name), available_estimators()) from None
    return cls(**options)
