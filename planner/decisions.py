"""Decisions kept per distinct graph and settings, so that identical graphs are solved once.

A transformer compiled block by block, a model planned again in the same process, a notebook
comparing budgets, every run of a training script: each meets graphs it has solved before. A
decision is kept under a key of everything that decides it: the graph's fingerprint, every
planner setting, the device the graph runs on (estimators price per device), the torch version,
the planner's own code (a hash of its sources, so a changed planner never reuses an older one's
decisions),
the times the graph runs before its backward, what the rest of the step was seen to need and
to keep beside its backward, and, for an absolute budget, the bytes earlier graphs of the step
hold. It is kept in memory for the process and in ``<cache dir>/decisions/``
(:func:`planner.cache.default_cache_dir`) for later ones; deleting that folder only makes the
next run solve again. A reused decision says where
it came from in ``stats["reused"]`` (``"memory"`` or ``"disk"``).
"""
from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch

from planner.cache import default_cache_dir, write_json
from planner.config import PlannerConfig
from planner.decision import Decision
from planner.errors import PlannerError
from planner.graph import JointGraph
from planner.ops import device_name

__all__ = ["decision_key", "reuse_or_solve", "forget_decisions", "keep_decision", "KEY"]

KEY = "decision_key"  # Decision.stats: the key a decision was solved and kept under

_kept: dict[str, Decision] = {}


def decision_key(joint: JointGraph, config: PlannerConfig, held_bytes: int = 0, repeats: int = 1,
                 rest_bytes: int | None = None, beside_backward: int = 0) -> str:
    """A hash of everything that decides the plan of ``joint`` under ``config``, run ``repeats``
    times before its backward, with ``rest_bytes`` seen between its forward and its backward and
    ``beside_backward`` alive during that backward."""
    held = held_bytes if config.budget.nbytes is not None else 0  # a fraction is of the graph's own range
    settings = {k: v for k, v in asdict(config).items() if k != "replan"}  # when to plan, not how
    parts = {"graph": joint.fingerprint, "settings": settings, "device": _device_name(joint),
             "torch": torch.__version__, "planner": planner_code_hash(), "held_bytes": held, "repeats": repeats}
    if rest_bytes is not None:
        parts["rest_bytes"] = rest_bytes
    if beside_backward:
        parts["beside_backward"] = beside_backward
    if joint.released:
        parts["released"] = list(joint.released)
    if config.offload == "auto":  # the host link's measured speed decides what is offloaded (two digits)
        from planner.offload import host_link

        link = host_link(joint, config.offload_bandwidth)
        parts["host_link"] = None if link is None else float(f"{link:.2g}")
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@lru_cache(maxsize=None)
def planner_code_hash() -> str:
    """A hash of the sources of the packages that decide a plan (planner, solvers, estimators)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in ("planner", "solvers", "estimators"):
        for path in sorted((root / package).glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def reuse_or_solve(key: str, solve: Callable[[], Decision], check: Callable[[Decision], Decision]) -> Decision:
    """The decision kept under ``key`` (from memory, else from the disk cache, passed through
    ``check``, which raises if it does not fit), else ``solve()``'s, then kept under ``key``.
    An unreadable cache file, or one ``check`` refuses, is solved again and overwritten."""
    if key in _kept:
        return _reused(_kept[key], "memory")
    path = _path(key)
    stored = _read(path)
    if stored is not None:
        try:
            decision = check(stored)
        except PlannerError:
            pass  # a damaged file: solve again and overwrite it
        else:
            _kept[key] = decision
            return _reused(decision, "disk")
    decision = solve()
    decision = replace(decision, stats={**decision.stats, KEY: key})
    keep_decision(key, decision)
    return decision


def keep_decision(key: str, decision: Decision) -> None:
    """Keep ``decision`` under ``key``, in memory and on disk, in place of what was kept there
    (a decision corrected once its graph was compiled: see
    :func:`planner.peak_polish.restore_polish_drops`)."""
    _kept[key] = decision
    try:
        record = decision.to_dict()
    except TypeError as err:  # kept in memory all the same; the step goes on
        warnings.warn(f"the decision was not written to the disk cache: {err}", stacklevel=2)
    else:
        write_json(_path(key), record)


def forget_decisions() -> None:
    """Drop the decisions kept in memory (the disk cache stays)."""
    _kept.clear()


def _reused(decision: Decision, where: str) -> Decision:
    return replace(decision, stats={**decision.stats, "reused": where})


def _path(key: str) -> Path:
    return default_cache_dir() / "decisions" / f"{key}.json"


def _read(path: Path) -> Decision | None:
    try:
        return Decision.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _device_name(joint: JointGraph) -> str:
    return device_name(joint.device) if joint.device is not None else "none"
