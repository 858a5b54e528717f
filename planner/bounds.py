"""The ends of the budget range: the most memory-frugal plan, the runtime-optimal plan and the
fast end (budget 1.0); the priced minimum cuts and the hull walk they are found by."""
from __future__ import annotations

import time
from functools import lru_cache
from typing import Sequence

import networkx as nx
from networkx.algorithms.flow import boykov_kolmogorov
import numpy as np

from planner.problem import Evaluation, Problem, evaluate

__all__ = ["min_memory_plan", "runtime_optimal_plan", "fast_end_plan", "save_all_plan", "cut_network", "CutNetwork",
           "SECONDS_UNIT", "FAST_END_SLACK", "hull_walk", "priced_cut", "price_rounding", "named_plan"]

_SOURCE, _SINK = "source", "sink"


def min_memory_plan(problem: Problem) -> Evaluation:
    """The feasible plan with the least saved memory, as a minimum vertex cut.

    Each node is split into ``in -> out`` with capacity its bytes (infinite if it cannot be
    saved); cutting that edge means saving the node. Values the backward needs drain into the
    sink; nodes that cannot be recomputed hang off the source, so they are reachable only by
    saving them; a random node is fed by the source through an edge of ``rng_state_bytes``, the
    price of recomputing it. The cut value is then exactly :func:`evaluate`'s memory.

    Complexity: one max-flow on 2n nodes (networkx Boykov-Kolmogorov).
    """
    return _min_memory_plan(problem)


@lru_cache(maxsize=16)
def _min_memory_plan(problem: Problem) -> Evaluation:
    return evaluate(problem, cut_network(problem).cut())


def cut_network(problem: Problem) -> "CutNetwork":
    """The problem's split-node flow network, built once and re-priced for every cut."""
    return _cut_network(problem)


@lru_cache(maxsize=4)
def _cut_network(problem: Problem) -> "CutNetwork":
    return CutNetwork(problem)


class CutNetwork:
    """The split-node flow network whose minimum cut is the least ``bytes + price`` plan.

    The residual network is built once; :meth:`cut` only rewrites the capacities that carry
    prices, so a search over prices pays for the max-flows alone.
    """

    def __init__(self, problem: Problem) -> None:
        self.n = len(problem)
        self.nbytes = [int(b) for b in problem.nbytes]
        self.rng = [problem.rng_state_bytes if r else 0 for r in problem.random]
        self.priced = [int(i) for i in np.flatnonzero(problem.recomputable)]
        self.stored = [int(i) for i in np.flatnonzero(problem.saveable)]
        g = nx.DiGraph()
        g.add_nodes_from([_SOURCE, _SINK])
        self.infinite: list[tuple] = []
        for i in range(self.n):
            if problem.saveable[i]:
                g.add_edge(("in", i), ("out", i), capacity=0)
            else:
                g.add_edge(("in", i), ("out", i))
                self.infinite.append((("in", i), ("out", i)))
            if problem.needed[i]:
                g.add_edge(("out", i), _SINK)
                self.infinite.append((("out", i), _SINK))
            if not problem.recomputable[i]:
                g.add_edge(_SOURCE, ("in", i))
                self.infinite.append((_SOURCE, ("in", i)))
                continue
            for j in problem.inputs[i]:
                g.add_edge(("out", int(j)), ("in", i))
                self.infinite.append((("out", int(j)), ("in", i)))
            g.add_edge(_SOURCE, ("in", i), capacity=0)
        self.graph = g
        residual = nx.DiGraph()
        residual.__networkx_cache__ = None
        residual.add_nodes_from(g)
        for u, v in g.edges:
            residual.add_edge(u, v, capacity=0)
            residual.add_edge(v, u, capacity=0)
        self.residual = residual

    def cut(self, price: Sequence[float] | None = None, save_price: Sequence[float] | None = None) -> np.ndarray:
        """Saved mask of a minimum cut of ``bytes + price of recomputed + save_price of saved``.

        Prices are in byte units (rounded to whole ones; Python ints are taken exactly). With
        none, the cut is the most memory-frugal plan. The saved nodes are those whose ``in``
        half is on the source side and ``out`` half is not.
        """
        r = self.residual
        total = 0
        for i in self.priced:
            cap = self.rng[i] + (_whole(price[i]) if price is not None else 0)
            r[_SOURCE][("in", i)]["capacity"] = cap
            total += cap
        for i in self.stored:
            cap = self.nbytes[i] + (_whole(save_price[i]) if save_price is not None else 0)
            r[("in", i)][("out", i)]["capacity"] = cap
            total += cap
        # Infinity as networkx simulates it: three times the finite capacities, so no finite cut
        # can reach it.
        inf = 3 * total or 1
        for u, v in self.infinite:
            r[u][v]["capacity"] = inf
        r.graph["inf"] = inf
        # Boykov-Kolmogorov: 1.3-4x faster than the default preflow-push on these split-node
        # graphs. The sink side is what can still reach the sink through unsaturated edges,
        # the same for any max flow (the cut networkx's minimum_cut returns, found here without
        # editing the residual network).
        boykov_kolmogorov(self.graph, _SOURCE, _SINK, residual=r, value_only=True)
        sink_side, stack = {_SINK}, [_SINK]
        while stack:
            v = stack.pop()
            for u, edge in r.pred[v].items():
                if u not in sink_side and edge["flow"] < edge["capacity"]:
                    sink_side.add(u)
                    stack.append(u)
        return np.array([("in", i) not in sink_side and ("out", i) in sink_side for i in range(self.n)], dtype=bool)


def _whole(x) -> int:
    return x if isinstance(x, int) else int(round(float(x)))


def runtime_optimal_plan(problem: Problem) -> Evaluation:
    """The plan of least estimated seconds, recomputation plus saving (budget 1.0).

    A minimum cut of the seconds, in nanoseconds, with the saved bytes breaking ties. Without
    save costs it saves every value the backward reads whose recomputation costs anything, and
    of those that cost nothing (views, values made for the backward, such as ReLU's mask), the
    ones that hold fewer bytes than what they are computed from. With save costs, recomputing a
    value can be cheaper than writing and reading it back (a fused pointwise op whose inputs are
    saved anyway).
    """
    return _runtime_optimal_plan(problem)


SECONDS_UNIT = 1e-9  # the fast plan's cut prices seconds in whole nanoseconds


@lru_cache(maxsize=16)
def _runtime_optimal_plan(problem: Problem) -> Evaluation:
    # Lexicographic: one nanosecond outweighs every byte the plan could save.
    scale = int(problem.nbytes.sum()) + problem.rng_state_bytes * len(problem) + 1
    if problem.save_seconds.any():
        price = [scale * round(t / SECONDS_UNIT) for t in problem.runtime.tolist()]
        save = [scale * round(t / SECONDS_UNIT) for t in problem.save_seconds.tolist()]
        return evaluate(problem, cut_network(problem).cut(price, save))
    # Saving is free: recompute only what costs nothing (values made for the backward, planner.
    # build.backward_born, and fused values the backward's kernels compute from loads they make
    # anyway), where that holds fewer bytes than saving them.
    price = [scale if t > 0 else 0 for t in problem.runtime.tolist()]
    return evaluate(problem, cut_network(problem).cut(price, [0] * len(problem)))


# Budget 1.0 may cost this fraction of the forward's estimated seconds (about 1% of the step's)
# over the fastest plan, spent on recomputation that frees memory. On the Llama of bench/zoo.py
# (H100 rates) 1% and 2% moved 47 MiB; 3% moved 0.23 GiB for 75 us, 0.5% of its step.
FAST_END_SLACK = 0.03


def fast_end_plan(problem: Problem) -> Evaluation:
    """The plan a budget of 1.0 means: of the plans on the lower convex hull of saved bytes
    against seconds, the one with the least bytes within :data:`FAST_END_SLACK` of the forward's
    estimated seconds of the fastest plan.

    The fastest plan keeps every value whose recomputation costs anything, however little: in
    the Llama of ``bench/zoo.py`` (priced at H100 rates) fp32 copies of the residual stream,
    among others, to save copy kernels of a few microseconds; on the H100 that plan held 0.30
    GiB more than torch.compile, the fast end 0.06 GiB (measured before saving the repeated
    keys and values of grouped-query attention was priced free, as it now is). Without save
    costs (``flops``, ``constant``) saving is free, and it is the fastest plan.
    """
    return _fast_end_plan(problem)


@lru_cache(maxsize=16)
def _fast_end_plan(problem: Problem) -> Evaluation:
    fast = runtime_optimal_plan(problem)
    if not problem.save_seconds.any():
        return fast
    limit = fast.seconds + FAST_END_SLACK * float(problem.runtime.sum())
    return hull_walk(problem, fast, min_memory_plan(problem), lambda plan: plan.seconds <= limit)


def hull_walk(problem: Problem, kept: Evaluation, other: Evaluation, accept, iterations: int = 16,
              deadline: float = float("inf"), on_cut=None) -> Evaluation:
    """Walk the lower convex hull of saved bytes against seconds between two plans by priced
    minimum cuts (Eisner-Severance): each cut at the price where the two ends tie either finds
    a plan below the segment joining them, which replaces ``kept`` if ``accept(plan)`` and
    ``other`` if not, or proves the segment a hull edge. Returns the last ``kept``, or ``other``
    itself if it is accepted (the end sought lies towards ``other``).

    ``on_cut(value, price)`` sees each cut's value (bytes + price x seconds) and price.
    """
    if accept(other):
        return other
    rounding = price_rounding(problem)
    for _ in range(iterations):
        if time.monotonic() >= deadline or kept.seconds == other.seconds or kept.memory_bytes == other.memory_bytes:
            break
        price = (kept.memory_bytes - other.memory_bytes) / (other.seconds - kept.seconds)
        if price <= 0:
            break
        plan, value = priced_cut(problem, price)
        if on_cut is not None:
            on_cut(value, price)
        if value >= kept.memory_bytes + price * kept.seconds - rounding - 1:
            break  # nothing below the segment: it is a hull edge
        if accept(plan):
            kept = plan
        else:
            other = plan
    return kept


def price_rounding(problem: Problem) -> float:
    """Most a priced cut's value can differ from its exact price, in bytes: prices are rounded to
    whole bytes, half a byte for each priced node."""
    return 0.5 * int((problem.runtime > 0).sum() + (problem.save_seconds > 0).sum())


def priced_cut(problem: Problem, price: float) -> tuple[Evaluation, float]:
    """The plan of one minimum cut of ``bytes + price x seconds`` (recomputing plus saving),
    and its value, in byte units."""
    recompute, save = np.rint(price * problem.runtime), np.rint(price * problem.save_seconds)
    plan = evaluate(problem, cut_network(problem).cut(recompute, save))
    return plan, plan.memory_bytes + float(recompute[plan.recomputed].sum() + save[plan.saved].sum())


def named_plan(problem: Problem, names) -> Evaluation:
    """The plan that saves the named values, as another partitioner names them: a view or
    tuple item stands for the storage it reads (its base is saved), and names the problem does
    not hold (primals, sizes) are left out.

    Raises
    ------
    InfeasibleDecision
        If from these values the backward cannot get one it needs (:func:`evaluate`).
    """
    lookup = {name: i for i, name in enumerate(problem.names)}
    saved = np.zeros(len(problem), dtype=bool)
    for name in names:
        i = lookup.get(name)
        while i is not None and not problem.saveable[i] and len(problem.inputs[i]):
            i = int(problem.inputs[i][0])
        if i is not None and problem.saveable[i]:
            saved[i] = True
    return evaluate(problem, saved)


def save_all_plan(problem: Problem) -> Evaluation:
    """The plan that recomputes nothing but free views: save every value the backward reads.

    Views and tuples are not saved but rebuilt from their (saved) bases at no cost.
    """
    return _save_all_plan(problem)


@lru_cache(maxsize=16)
def _save_all_plan(problem: Problem) -> Evaluation:
    saved = np.zeros(len(problem), dtype=bool)
    seen = np.zeros(len(problem), dtype=bool)
    stack = list(np.flatnonzero(problem.needed))
    while stack:
        i = stack.pop()
        if seen[i]:
            continue
        seen[i] = True
        if problem.saveable[i]:
            saved[i] = True
        else:
            stack.extend(problem.inputs[i])
    return evaluate(problem, saved)
