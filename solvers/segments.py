"""Checkpoint segments found from the forward's order alone: cuts where few bytes cross.

A cut before forward node ``c`` splits the forward in two; the values computed before it and read
at or after it cross it (their storages: a view crossing keeps its base). Saving what crosses a
set of cuts, and recomputing the rest, is segment checkpointing: the backward of a segment
recomputes that segment only, from the values saved at its cuts, so the backward holds one
segment's copies at a time besides the saved cuts. Gradient checkpointing per layer is the
special case whose cuts are the layers' boundaries, where only the residual stream and the
values every layer reads (masks, a shared position bias, an encoder's output) cross.

Unlike :mod:`solvers.blocks`, nothing here needs repeated blocks: an encoder-decoder, whose
two stacks differ, or a CNN whose stages differ, is cut where its forward is narrow. For ``k``
segments, the ``j``-th cut is taken where the fewest bytes cross among the positions whose
recomputed bytes so far lie within half a segment of ``j/k`` of the total.
"""
from __future__ import annotations

import numpy as np

from planner.problem import Problem

__all__ = ["crossing_bytes", "last_forward_reader", "segment_saves"]

SEGMENT_COUNTS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def crossing_bytes(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Per position ``c`` (0..n): the bytes of the storages computed before node ``c`` and read by
    node ``c`` or later in the forward; and per node, the last forward node reading its storage
    (-1 if none)."""
    n = len(problem)
    owner = problem.schedule.owner
    last_reader = last_forward_reader(problem)
    storage_last = np.full(n, -1, dtype=np.int64)
    viewed = owner >= 0
    np.maximum.at(storage_last, owner[viewed], last_reader[viewed])
    own = np.flatnonzero(problem.schedule.owns & (storage_last > np.arange(n)))
    delta = np.zeros(n + 2, dtype=np.int64)
    np.add.at(delta, own + 1, problem.nbytes[own])
    np.add.at(delta, storage_last[own] + 1, -problem.nbytes[own])
    return np.cumsum(delta)[: n + 1], storage_last


def last_forward_reader(problem: Problem) -> np.ndarray:
    """Per node, the last forward node that reads it directly (-1 if none)."""
    n = len(problem)
    last = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last, problem.input_idx, np.repeat(np.arange(n), np.diff(problem.input_ptr)))
    return last


def segment_saves(problem: Problem, counts: tuple[int, ...] = SEGMENT_COUNTS) -> list[np.ndarray]:
    """Per segment count ``k`` (at most one segment per node): the saved set holding every
    storage that crosses one of the ``k - 1`` cuts; what the backward cannot recompute is not
    added here (the caller adds it)."""
    n = len(problem)
    if n < 2:
        return []
    crossing, storage_last = crossing_bytes(problem)
    own = problem.schedule.owns
    work = np.concatenate(([0], np.cumsum(np.where(own, problem.schedule.copy_bytes, 0))))  # before node c
    total = int(work[-1])
    if total == 0:
        return []
    index = np.arange(n)
    plans, seen = [], set()
    for k in counts:
        if k > n:
            break
        cuts = []
        for j in range(1, k):
            lo, hi = np.searchsorted(work, [(j - 0.5) * total / k, (j + 0.5) * total / k])
            window = np.arange(max(int(lo), 1), min(int(hi), n) + 1)
            if len(window) == 0:
                continue
            cuts.append(int(window[np.argmin(crossing[window])]))  # first of the narrowest
        saved = np.zeros(n, dtype=bool)
        for cut in sorted(set(cuts)):
            saved |= (index < cut) & (storage_last >= cut) & own
        key = saved.tobytes()
        if key not in seen:
            seen.add(key)
            plans.append(saved & problem.saveable)
    return plans
