"""Estimators: give every node of the joint graph a runtime, in seconds.

    >>> from estimators import available_estimators
    >>> available_estimators()
    ['auto', 'constant', 'flops', 'profile', 'roofline']
"""
from __future__ import annotations

from estimators.auto import AutoEstimator
from estimators.base import Estimator
from estimators.constant import ConstantEstimator
from estimators.flops import FlopsEstimator
from estimators.profile import ProfileEstimator
from estimators.roofline import RooflineEstimator
from planner.registry import Registry

__all__ = ["Estimator", "get_estimator", "available_estimators", "register_estimator"]

REGISTRY: Registry[Estimator] = Registry("estimator", (AutoEstimator, ConstantEstimator, FlopsEstimator, ProfileEstimator, RooflineEstimator))
available_estimators = REGISTRY.names
get_estimator = REGISTRY.create
register_estimator = REGISTRY.register
