"""Repeated blocks of a problem (the layers of a transformer), found from its arrays alone.

Node ``i + P`` corresponds to node ``i`` when both are the same kind of op (the name without
its numeric suffix) with the same bytes, runtime and flags, and each input of ``i + P`` is the
matching input of ``i`` moved on by ``P`` (a node of the next block) or the same node (a value
every block reads). The period ``P`` whose run of corresponding nodes covers the most nodes
gives the blocks: that run, cut every ``P`` nodes.

The exact solvers use the blocks for a starting plan: the same program with every block
deciding alike (``saved[i] == saved[i + P]``), a fraction of its size once presolved. Tying
is a restriction, so its plan is feasible for the full program and proves nothing about it.

They also supply the patterns of a second restriction: every block saving as some block of a
plan found so far does (:func:`block_patterns`), the blocks between the first and the last in
order of the bytes their patterns save (:func:`pattern_ranks`, :func:`in_rank_order`). Plans
near the frugal end mix a few such patterns, and the order takes away the choice of which
blocks take which, which otherwise leaves a search as many equal plans as there are orders.

The least-peak search starts, among others, from the plans that save only what flows across
block boundaries (:func:`boundary_saves`): the classic per-layer checkpointing, which a local
search from the runtime-optimal or least-saved-bytes plans does not reach on deep models.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np

from planner.problem import Problem
from solvers.segments import last_forward_reader

__all__ = ["Blocks", "block_masks", "block_patterns", "boundary_saves", "find_blocks", "in_rank_order", "pattern_ranks"]

_SUFFIX = re.compile(r"_\d+$")
_PAD = -(1 << 40)  # an input slot a node does not have; no shift maps it onto a real index


@dataclass(frozen=True)
class Blocks:
    """``count`` blocks of ``period`` nodes each, the first starting at node ``start``."""

    start: int
    period: int
    count: int

    def pairs(self) -> Iterator[tuple[int, int]]:
        """``(i, i + period)`` for every node i of every block but the last."""
        for i in range(self.start, self.start + (self.count - 1) * self.period):
            yield i, i + self.period


@lru_cache(maxsize=16)
def find_blocks(problem: Problem, min_count: int = 2, min_cover: float = 0.5) -> Blocks | None:
    """The repeated blocks covering the most nodes, or None if none repeat ``min_count`` times
    and cover at least ``min_cover`` of the nodes (a few alike nodes in a row are no blocks).

    Complexity: O(n^2 d / 2) comparisons for n nodes of at most d inputs, in numpy (0.12 s on a
    3.6k-node problem); found once per problem, as every exact solve of it asks.
    """
    n = len(problem)
    kinds: dict[tuple, int] = {}
    signature = np.array([kinds.setdefault(key, len(kinds)) for key in zip(
        (_SUFFIX.sub("", name) for name in problem.names), problem.nbytes.tolist(), problem.runtime.tolist(),
        problem.saveable.tolist(), problem.recomputable.tolist(), problem.random.tolist(), problem.needed.tolist(),
        problem.schedule.copy_bytes.tolist(), problem.schedule.fused.tolist(), problem.schedule.copy_scratch.tolist())],
        dtype=np.int64)
    degree = np.diff(problem.input_ptr)
    inputs = np.full((n, int(degree.max(initial=0))), _PAD, dtype=np.int64)
    for i, ins in enumerate(problem.inputs):
        inputs[i, : len(ins)] = ins
    best: Blocks | None = None
    for period in range(1, n // min_count + 1):
        a, b = inputs[:-period], inputs[period:]
        matches = (signature[:-period] == signature[period:]) & (degree[:-period] == degree[period:])
        matches &= ((b == a + period) | (b == a)).all(axis=1)
        start, length = _longest_run(matches)
        count = (length + period) // period
        if count >= min_count and (best is None or count * period > best.count * best.period):
            best = Blocks(start, period, count)
    if best is None or best.count * best.period < min_cover * n:
        return None
    return best


def block_masks(blocks: Blocks, saved: np.ndarray) -> list[np.ndarray]:
    """Per block, the part of a saved mask over its nodes (views: offsets ``0 .. period - 1``)."""
    return [saved[blocks.start + k * blocks.period: blocks.start + (k + 1) * blocks.period]
            for k in range(blocks.count)]


def block_patterns(blocks: Blocks, plans) -> list[np.ndarray]:
    """The distinct block masks (:func:`block_masks`) of ``plans``, in first-seen order."""
    found: dict[bytes, np.ndarray] = {}
    for plan in plans:
        for mask in block_masks(blocks, plan.saved):
            found.setdefault(mask.tobytes(), mask.copy())
    return list(found.values())


def pattern_ranks(blocks: Blocks, patterns: list[np.ndarray], nbytes: np.ndarray) -> np.ndarray:
    """Each pattern's place (0, 1, ...) among ``patterns`` by the bytes it saves, ties in
    their order (``nbytes``: the problem's; every block has the first block's)."""
    first = nbytes[blocks.start: blocks.start + blocks.period]
    saved = [int(first[pattern].sum()) for pattern in patterns]
    return np.argsort(np.argsort(saved, kind="stable"), kind="stable")


def in_rank_order(blocks: Blocks, plan, patterns: list[np.ndarray], ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``plan``'s block masks (each one of ``patterns``) given to its blocks again in order of
    rank: per block the pattern it then takes, and the saved mask of that plan."""
    index = {pattern.tobytes(): p for p, pattern in enumerate(patterns)}
    chosen = np.array([index[mask.tobytes()] for mask in block_masks(blocks, plan.saved)])
    chosen[1:-1] = sorted(chosen[1:-1], key=lambda p: ranks[p])
    saved = plan.saved.copy()
    for mask, p in zip(block_masks(blocks, saved), chosen):
        mask[:] = patterns[p]
    return chosen, saved


def _longest_run(flags: np.ndarray) -> tuple[int, int]:
    """Start and length of the longest run of True (0, 0 if none)."""
    edges = np.diff(np.concatenate(([0], flags.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if len(starts) == 0:
        return 0, 0
    k = int(np.argmax(ends - starts))
    return int(starts[k]), int(ends[k] - starts[k])


def boundary_saves(problem: Problem, blocks: Blocks, strides: tuple[int, ...] = (1, 2, 3)) -> list[np.ndarray]:
    """Per stride ``k``: the saved set holding every value read across a cut before every
    ``k``-th block (and after the last, and one period before and after the blocks), the nodes
    between two cuts left to recompute; what the backward cannot recompute is not added here
    (the caller adds it).

    Stride 1 is per-block checkpointing; larger strides keep fewer boundaries and recompute
    more blocks at once, which lowers the peak where the boundaries outweigh a block's work.
    """
    n = len(problem)
    last_reader = last_forward_reader(problem)
    index = np.arange(n)
    plans = []
    for stride in strides:
        if stride > blocks.count:
            break
        cuts = [blocks.start + k * blocks.period for k in range(0, blocks.count + 1, stride)]
        end = blocks.start + blocks.count * blocks.period
        # and a block's length beyond each end: the first and last layers of a model often
        # differ a little from the rest (they read the embedding, feed the head), so the
        # blocks found miss them
        cuts += [end, blocks.start - blocks.period, end + blocks.period]
        saved = np.zeros(n, dtype=bool)
        for cut in sorted({c for c in cuts if 0 < c < n}):
            saved |= (index < cut) & (last_reader >= cut)
        saved[problem.schedule.owner[saved]] = True  # a view crossing a cut keeps its base
        plans.append(saved & problem.saveable)
    return plans
