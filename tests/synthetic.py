"""Random planning problems (torch-free), for property tests of the solvers."""
from __future__ import annotations

import itertools

import numpy as np
from hypothesis import strategies as st

from planner.problem import InfeasibleDecision, Problem, evaluate


def random_problem(seed: int, n: int) -> Problem:
    """A random DAG in topological order: some views, random ops, side effects and needed nodes."""
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
    return Problem(
        names=tuple(f"n{i}" for i in range(n)),
        nbytes=np.where(saveable, rng.integers(1, 100, n), 0).astype(np.int64),
        runtime=np.where(view, 0.0, rng.integers(1, 50, n) / 10.0),
        saveable=saveable,
        recomputable=recomputable,
        random=(rng.random(n) < 0.15) & recomputable,
        needed=needed,
        input_ptr=np.array(ptr, dtype=np.int64),
        input_idx=np.array(idx, dtype=np.int64),
        rng_state_bytes=int(rng.integers(1, 20)),
    )


problems = st.builds(random_problem, st.integers(0, 2**31 - 1), st.integers(2, 14))


def brute_force(problem: Problem, budget: int):
    """Least recompute seconds over every saved set within the budget (None if none fits)."""
    best = None
    saveable = np.flatnonzero(problem.saveable)
    for r in range(len(saveable) + 1):
        for subset in itertools.combinations(saveable, r):
            try:
                result = evaluate(problem, problem.mask(subset))
            except InfeasibleDecision:
                continue
            if result.memory_bytes <= budget and (best is None or result.recompute_seconds < best.recompute_seconds):
                best = result
    return best


def brute_force_min_memory(problem: Problem) -> int:
    memories = []
    for r in range(int(problem.saveable.sum()) + 1):
        for subset in itertools.combinations(np.flatnonzero(problem.saveable), r):
            try:
                memories.append(evaluate(problem, problem.mask(subset)).memory_bytes)
            except InfeasibleDecision:
                pass
    return min(memories)
