"""The save-or-recompute problem as a sparse 0/1 program, shared by the exact solvers.

Variables, one per relevant node where meaningful: ``saved[v]`` (v owns storage) and
``recomputed[v]`` (v may be re-run). Rows:

* every value the backward reads is saved or recomputed: ``saved[v] + recomputed[v] >= 1``;
* recomputing a node needs each input saved or recomputed: ``recomputed[v] <= saved[u] + recomputed[u]``;
* the saved bytes plus one RNG state per recomputed random op fit the budget.

The objective is the recompute runtime. Nodes that are neither read by the backward nor
ancestors of such a node are left out. The model is plain scipy/numpy data; each back end
(HiGHS, CBC, CP-SAT) translates it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from planner.problem import Problem

__all__ = ["GraphModel", "build_graph_model", "tie_broken_objective", "MEMORY_TIE_BREAK"]


@dataclass(frozen=True)
class GraphModel:
    """``lower <= rows @ x <= upper`` over binary ``x``; the last row is the budget.

    ``runtime`` and ``memory`` are objective vectors over x (seconds, bytes); ``saved_var[i]``
    is node i's saved variable or -1.
    """

    rows: sp.csr_matrix
    lower: np.ndarray
    upper: np.ndarray
    runtime: np.ndarray
    memory: np.ndarray
    saved_var: np.ndarray
    recomputed_var: np.ndarray

    @property
    def num_vars(self) -> int:
        return self.rows.shape[1]

    def constraints(self):
        """Each row as ``(columns, coefficients, lower, upper)``; infinite bounds are None."""
        rows = self.rows
        for r in range(rows.shape[0]):
            lo, hi = rows.indptr[r], rows.indptr[r + 1]
            yield (rows.indices[lo:hi], rows.data[lo:hi],
                   float(self.lower[r]) if np.isfinite(self.lower[r]) else None,
                   float(self.upper[r]) if np.isfinite(self.upper[r]) else None)

    def saved_mask(self, x: np.ndarray) -> np.ndarray:
        """Node mask of saved nodes from a (possibly fractional-noise) solution vector."""
        has = self.saved_var >= 0
        mask = np.zeros(len(self.saved_var), dtype=bool)
        mask[has] = x[self.saved_var[has]] > 0.5
        return mask

    def vector(self, saved: np.ndarray, recomputed: np.ndarray) -> np.ndarray:
        """The solution vector of a plan given as node masks (for warm starts)."""
        x = np.zeros(self.num_vars)
        for var, mask in ((self.saved_var, saved), (self.recomputed_var, recomputed)):
            has = (var >= 0) & mask
            x[var[has]] = 1.0
        return x


def build_graph_model(problem: Problem, budget_bytes: int) -> GraphModel:
    relevant = _relevant(problem)
    saved_var = np.full(len(problem), -1, dtype=np.int64)
    recomputed_var = np.full(len(problem), -1, dtype=np.int64)
    s_nodes = np.flatnonzero(relevant & problem.saveable)
    r_nodes = np.flatnonzero(relevant & problem.recomputable)
    saved_var[s_nodes] = np.arange(len(s_nodes))
    recomputed_var[r_nodes] = len(s_nodes) + np.arange(len(r_nodes))
    n_vars = len(s_nodes) + len(r_nodes)

    row_ids, col_ids, coefs, lower, upper = [], [], [], [], []

    def add_row(cols, vals, lo, hi):
        row = len(lower)
        row_ids.extend([row] * len(cols))
        col_ids.extend(cols)
        coefs.extend(vals)
        lower.append(lo)
        upper.append(hi)

    def available(i):
        return [v for v in (saved_var[i], recomputed_var[i]) if v >= 0]

    for i in np.flatnonzero(relevant & problem.needed):
        cols = available(i)
        add_row(cols, [1.0] * len(cols), 1.0, np.inf)
    for i in r_nodes:
        for j in problem.inputs[i]:
            cols = available(j)
            add_row([recomputed_var[i], *cols], [1.0] + [-1.0] * len(cols), -np.inf, 0.0)

    memory = np.zeros(n_vars)
    memory[saved_var[s_nodes]] = problem.nbytes[s_nodes]
    random = r_nodes[problem.random[r_nodes]]
    memory[recomputed_var[random]] = problem.rng_state_bytes
    nz = np.flatnonzero(memory)
    add_row(nz.tolist(), memory[nz].tolist(), -np.inf, float(budget_bytes))

    runtime = np.zeros(n_vars)
    runtime[recomputed_var[r_nodes]] = problem.runtime[r_nodes]
    rows = sp.csr_matrix((coefs, (row_ids, col_ids)), shape=(len(lower), n_vars))
    return GraphModel(rows, np.array(lower), np.array(upper), runtime, memory, saved_var, recomputed_var)


def _relevant(problem: Problem) -> np.ndarray:
    """Nodes the backward reads, and their ancestors."""
    seen = np.zeros(len(problem), dtype=bool)
    stack = list(np.flatnonzero(problem.needed))
    while stack:
        i = stack.pop()
        if not seen[i]:
            seen[i] = True
            stack.extend(problem.inputs[i])
    return seen


MEMORY_TIE_BREAK = 1e-4


def tie_broken_objective(model: GraphModel) -> np.ndarray:
    """Runtime scaled so the costliest node weighs 1, plus memory weighing 1e-4 in all.

    Among plans of equal runtime the least memory wins (so memory falls with the budget); the
    runtime given up for it is at most 1e-4 of the costliest node's runtime.
    """
    total = float(model.memory.sum())
    return _scaled(model.runtime) + (MEMORY_TIE_BREAK * model.memory / total if total > 0 else 0.0)


def _scaled(vector: np.ndarray) -> np.ndarray:
    top = float(np.max(vector, initial=0.0))
    return vector / top if top > 0 else vector
