"""Planning under ``torch.distributed``: one decision per graph, the same on every rank.

Every rank of a data-parallel job (DDP, FSDP2) compiles the same graphs, and each graph's plan
must be the same on all of them: a rank that recomputes what another saves runs a different
schedule and, with time-limited or multi-threaded solvers, could get another saved set. So the
ranks first check that they compiled the same graph (its fingerprint), then rank 0 decides and
sends its decision to the others, which only check it against their graph.

Both steps are object collectives on a gloo group of all ranks that the planner makes when it
first plans, so every rank must plan its graphs in the same order (torch.compile does: each rank
runs the same program). They wait as long as the default timeout of process groups allows.
Without an initialised group, or with one rank, nothing is sent.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, TypeVar

import torch.distributed as dist

from planner import _torch_compat
from planner.decision import Decision
from planner.errors import PlannerError

__all__ = ["RankMismatch", "RankPlanningError", "world", "agree_on_graph", "from_rank0", "decide_on_rank0"]

T = TypeVar("T")


class RankMismatch(PlannerError):
    """The ranks compiled different graphs, so no one plan fits them all."""


class RankPlanningError(PlannerError):
    """Rank 0 failed to plan a graph; every other rank raises this with rank 0's message."""


def world() -> tuple[int, int]:
    """This process's rank and the world size; ``(0, 1)`` outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def agree_on_graph(fingerprint: str) -> None:
    """Check that every rank is planning the graph with this fingerprint.

    Raises
    ------
    RankMismatch
        On every rank, naming which ranks compiled which graph, when they differ.
    """
    rank, size = world()
    if size == 1:
        return
    fingerprints: list = [None] * size
    with _torch_compat.eager_collectives():  # the partitioner runs inside torch.compile
        dist.all_gather_object(fingerprints, fingerprint, group=_group())
    if len(set(fingerprints)) == 1:
        return
    groups: dict[str, list[int]] = {}
    for r, fp in enumerate(fingerprints):
        groups.setdefault(fp, []).append(r)
    which = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: graph {fp}"
                      for fp, ranks in groups.items())
    raise RankMismatch(
        f"the ranks compiled different graphs ({which}), so one plan cannot serve them all; give every "
        f"rank the same model, input shapes, dtypes and compile settings (rank {rank} raised this)"
    )


def from_rank0(make: Callable[[], T]) -> T:
    """Rank 0's ``make()`` (a picklable value) on every rank; the other ranks do not call it.

    Raises
    ------
    RankPlanningError
        On the other ranks when rank 0's ``make`` raised (rank 0 raises its own error), so no
        rank waits for a value that never comes.
    """
    rank, size = world()
    if size == 1:
        return make()
    message: list = [None]
    if rank == 0:
        try:
            value = make()
        except Exception as err:
            message[0] = ("error", f"{type(err).__name__}: {err}")
            _broadcast(message)
            raise
        message[0] = ("value", value)
    _broadcast(message)
    kind, payload = message[0]
    if kind == "error":
        raise RankPlanningError(f"rank 0 could not plan this graph, so rank {rank} has no plan either: {payload}")
    return payload


def _broadcast(message: list) -> None:
    with _torch_compat.eager_collectives():
        dist.broadcast_object_list(message, src=0, group=_group())


_groups: dict = {}


def _group():
    """A gloo group of all ranks for the planner's own exchanges, made the first time a rank
    plans (every rank plans its first graph at the same point of the program): the engine's
    collectives on the default group (FSDP2's prefetched all-gathers may be in flight while a
    block compiles) never queue behind the planner's, and objects travel on the CPU."""
    default = dist.group.WORLD
    if default not in _groups:
        _groups[default] = dist.new_group(backend="gloo")
    return _groups[default]


def decide_on_rank0(decide: Callable[[], Decision], check: Callable[[Decision], Decision]) -> Decision:
    """Rank 0's ``decide()``, on every rank: the other ranks receive it and pass it to ``check``
    (which raises if it does not fit their graph) instead of deciding themselves; it says so in
    ``stats["decided_on_rank"]``.

    Raises
    ------
    RankPlanningError
        As :func:`from_rank0`.
    """
    decided: list[Decision] = []

    def on_rank0() -> dict | None:
        decided.append(decide())
        return decided[0].to_dict() if world()[1] > 1 else None  # plain data, sent to the other ranks

    sent = from_rank0(on_rank0)
    if decided:
        return decided[0]
    received = Decision.from_dict(sent)
    return check(replace(received, stats={**received.stats, "decided_on_rank": 0}))
