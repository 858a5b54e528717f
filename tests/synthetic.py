"""Random planning problems (torch-free), for property tests of the solvers."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from planner.problem import InfeasibleDecision, Problem, evaluate
from planner.schedule import Schedule


def random_problem(seed: int, n: int, timed: bool = False, priced: bool = False, on_demand: bool = False,
                   undonated: bool = False, fusible: bool = False) -> Problem:
    """A random DAG in topological order: some views, random ops, side effects and needed nodes.

    With ``timed``, a random schedule (backward reads, transients, backward memory, values the
    forward computes on demand, with ``on_demand``; values their last reader may not write into
    (or not into the saved value), with ``undonated``; copies fused where the plan saves one of
    a few other nodes, with ``fusible``) makes peak memory differ from saved bytes; without, the
    peak is the saved bytes. With ``priced``, saving costs seconds too, on the scale of the
    runtimes, so recomputing can beat saving.
    """
    rng = np.random.default_rng(seed)
    ptr, idx = [0], []
    for i in range(n):
        k = int(rng.integers(0, min(i, 3) + 1))
        idx.extend(sorted(rng.choice(i, size=k, replace=False).tolist()) if k else [])
        ptr.append(len(idx))
    view = rng.random(n) < 0.15
    recomputable = rng.random(n) > 0.1
    needed = rng.random(n) < 0.35
    needed[-1] = True
    saveable = ~view | ~recomputable  # a node that cannot be recomputed owns its storage
    nbytes = np.where(saveable, rng.integers(1, 100, n), 0).astype(np.int64)
    problem = Problem(
        names=tuple(f"n{i}" for i in range(n)),
        nbytes=nbytes,
        runtime=np.where(view, 0.0, rng.integers(1, 50, n) / 10.0),
        saveable=saveable,
        recomputable=recomputable,
        random=(rng.random(n) < 0.15) & recomputable,
        needed=needed,
        input_ptr=np.array(ptr, dtype=np.int64),
        input_idx=np.array(idx, dtype=np.int64),
        rng_state_bytes=int(rng.integers(1, 20)),
        schedule=_random_schedule(rng, nbytes, needed, ptr, idx, saveable) if timed else None,
        save_seconds=np.where(saveable & (rng.random(n) < 0.7), rng.integers(0, 30, n) / 10.0, 0.0) if priced else None,
    )
    if timed and on_demand:
        problem = replace(problem, schedule=_on_demand(problem.schedule, seed, ptr, idx))
    if timed and undonated:  # drawn apart (their own generator), so the rest of a seed's problem is unchanged
        draw = np.random.default_rng([seed, 2]).random((2, n)) < 0.4
        problem = replace(problem, schedule=replace(problem.schedule, no_reuse=draw[0], undonated=draw[1]))
    if timed and fusible:
        problem = replace(problem, schedule=_fusible(problem.schedule, seed, saveable))
    return problem


def _random_schedule(rng: np.random.Generator, nbytes: np.ndarray, needed: np.ndarray, ptr: list, idx: list,
                     saveable: np.ndarray) -> Schedule:
    n, steps = len(nbytes), int(rng.integers(2, 7))
    # a node whose one input cannot be saved is sometimes an output of it, as a getitem is of a
    # multi-output op
    made_with = np.array([idx[ptr[i]] if ptr[i + 1] - ptr[i] == 1 and not saveable[idx[ptr[i]]] and rng.random() < 0.5
                          else i for i in range(n)])
    first = np.where(needed, rng.integers(0, steps, n), steps)
    copy_bytes = np.where(rng.random(n) < 0.8, nbytes, 0).astype(np.int64)
    last_read = np.where(needed, np.maximum(first, rng.integers(0, steps, n)), -1).astype(np.int64)
    base = rng.integers(0, 150, steps).astype(np.int64)
    # a step's output may be written into a value it reads last, of the same size
    read_last = [np.flatnonzero(last_read == t) for t in range(steps)]
    reuse = np.array([nbytes[rng.choice(r)] if len(r) and rng.random() < 0.6 else 0 for r in read_last], dtype=np.int64)
    reuse = np.minimum(reuse, base)  # the output is a backward value, counted in base
    return Schedule(
        owner=np.arange(n, dtype=np.int64),
        transient=np.where(rng.random(n) < 0.7, nbytes, 0).astype(np.int64),
        copy_bytes=copy_bytes,
        fused=(copy_bytes == 0) & (rng.random(n) < 0.7),
        made_with=made_with.astype(np.int64),
        fwd_last=np.array([int(rng.integers(i, n)) for i in range(n)], dtype=np.int64),
        first_read=first.astype(np.int64),
        last_read=last_read,
        held=np.zeros(n, dtype=bool),
        base=base,
        reuse=reuse,
        reuse_base=(reuse > 0) & (rng.random(steps) < 0.2),
        step_names=tuple(f"b{t}" for t in range(steps)),
        fwd_base=np.sort(rng.integers(0, 40, n))[::-1].astype(np.int64) * (rng.random() < 0.5),
        copy_scratch=np.where(rng.random(n) < 0.3, rng.integers(1, 60, n), 0).astype(np.int64),  # library kernels'
    )


def _on_demand(schedule: Schedule, seed: int, ptr: list, idx: list) -> Schedule:
    """``schedule`` with values on demand: the forward computes one only where it is saved or an
    on-demand value computed there reads it; their readers read them until a step at or after
    their own. Drawn apart (their own generator), so the rest of a seed's problem is unchanged."""
    rng = np.random.default_rng([seed, 1])
    n = len(schedule.owner)
    on_demand = rng.random(n) < 0.3
    needs = [(i, k) for k in np.flatnonzero(on_demand).tolist() for i in idx[ptr[k]:ptr[k + 1]]]
    reads = [(i, k, int(rng.integers(k, n))) for i, k in needs if rng.random() < 0.8]
    return replace(schedule, on_demand=on_demand, demand_reads=np.array(reads, dtype=np.int64).reshape(-1, 3),
                   demand_needs=np.array(needs, dtype=np.int64).reshape(-1, 2))


def _fusible(schedule: Schedule, seed: int, saveable: np.ndarray) -> Schedule:
    """``schedule`` with copies stored unless the plan saves one of up to three other nodes
    (``Schedule.fused_if_saved``), drawn apart (their own generator) as ``_on_demand`` is."""
    rng = np.random.default_rng([seed, 3])
    n = len(schedule.owner)
    when = np.full((n, 3), -1, dtype=np.int64)
    for i in np.flatnonzero(~schedule.fused & (rng.random(n) < 0.5)).tolist():
        others = np.flatnonzero(saveable & (np.arange(n) != i))
        if len(others):
            picked = rng.choice(others, size=min(len(others), int(rng.integers(1, 4))), replace=False)
            when[i, :len(picked)] = np.sort(picked)
    return replace(schedule, fused_if_saved=when)


problems = st.builds(random_problem, st.integers(0, 2**31 - 1), st.integers(2, 14))
timed_problems = st.builds(random_problem, st.integers(0, 2**31 - 1), st.integers(2, 12), st.just(True),
                           on_demand=st.booleans(), undonated=st.booleans())
on_demand_problems = st.builds(random_problem, st.integers(0, 2**31 - 1), st.integers(2, 12), st.just(True),
                               on_demand=st.just(True))
undonated_problems = st.builds(random_problem, st.integers(0, 2**31 - 1), st.integers(2, 12), st.just(True),
                               undonated=st.just(True))
fusible_problems = st.builds(random_problem, st.integers(0, 2**31 - 1), st.integers(2, 12), st.just(True),
                             on_demand=st.booleans(), undonated=st.booleans(), fusible=st.just(True))
priced_problems = st.builds(random_problem, st.integers(0, 2**31 - 1), st.integers(2, 12), st.booleans(), st.just(True))


def all_plans(problem: Problem):
    """Every feasible saved set, evaluated."""
    saveable = np.flatnonzero(problem.saveable)
    for r in range(len(saveable) + 1):
        for subset in itertools.combinations(saveable, r):
            try:
                yield evaluate(problem, problem.mask(subset))
            except InfeasibleDecision:
                continue


def brute_force(problem: Problem, budget: int):
    """Least seconds (recomputing plus saving) over every saved set whose peak fits the budget
    (None if none)."""
    fitting = [p for p in all_plans(problem) if p.peak_bytes <= budget]
    return min(fitting, key=lambda p: p.seconds, default=None)


def brute_force_min_memory(problem: Problem) -> int:
    return min(p.memory_bytes for p in all_plans(problem))


def brute_force_min_peak(problem: Problem) -> int:
    return min(p.peak_bytes for p in all_plans(problem))


def tiled_problem(seed: int, size: int, count: int) -> Problem:
    """``count`` copies of one random block of ``size`` nodes, in a chain: each block's first
    node reads the previous block's last node, as a transformer layer reads the one before."""
    rng = np.random.default_rng(seed)
    inputs = [sorted(rng.choice(i, size=int(rng.integers(1, min(i, 2) + 1)), replace=False).tolist()) if i else []
              for i in range(size)]
    runtime, nbytes = rng.integers(1, 50, size) / 10.0, rng.integers(1, 100, size).astype(np.int64)
    needed = rng.random(size) < 0.4
    ptr, idx = [0], []
    for b in range(count):
        for i in range(size):
            idx.extend([b * size + j for j in inputs[i]] + ([b * size - 1] if b and i == 0 else []))
            ptr.append(len(idx))
    n = size * count
    return Problem(
        names=tuple(f"op{i}_{b}" for b in range(count) for i in range(size)),
        nbytes=np.tile(nbytes, count),
        runtime=np.tile(runtime, count),
        saveable=np.ones(n, dtype=bool),
        recomputable=np.ones(n, dtype=bool),
        random=np.zeros(n, dtype=bool),
        needed=np.tile(needed, count),
        input_ptr=np.array(ptr, dtype=np.int64),
        input_idx=np.array(idx, dtype=np.int64),
    )
