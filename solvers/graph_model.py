"""The save-or-recompute problem as a sparse 0/1 program, shared by the exact solvers.

Variables, one per relevant node where meaningful: ``saved[v]`` (v owns storage) and
``recomputed[v]`` (v may be re-run). Rows:

* every value the backward reads is saved or recomputed: ``saved[v] + recomputed[v] >= 1``;
* recomputing a node needs each input saved or recomputed: ``recomputed[v] <= saved[u] + recomputed[u]``;
* a node is not both: ``saved[v] + recomputed[v] <= 1``. A plan never needs both, and the memory
  rows price the pair as no plan runs (:func:`planner.problem.evaluate` drops the copy): on one
  random schedule they priced it a byte under the plan at a step whose row was already in, so
  the lazy loop returned a plan over its limit as the proven least peak.

Memory rows (the plan's memory at chosen steps of the training step, within the budget) are
added by :mod:`solvers.peak_rows`, with continuous helper variables. The objective is the
plan's seconds: the runtime of recomputed nodes plus the save cost of saved ones. Nodes that are neither read by the backward nor ancestors of such a node
are left out. The model is plain scipy/numpy data; each back end (HiGHS, CBC, CP-SAT)
translates it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp

from planner.problem import Problem

__all__ = ["GraphModel", "RowBuilder", "build_graph_model", "choose_patterns", "tie_blocks", "tie_broken_objective", "seconds_bound", "MEMORY_TIE_BREAK"]


@dataclass(frozen=True)
class GraphModel:
    """``lower <= rows @ x <= upper``, ``0 <= x <= 1``, x integral where ``integral``.

    ``runtime`` and ``memory`` are objective vectors over x (seconds recomputing and saving,
    saved bytes);
    ``saved_var[i]`` and ``recomputed_var[i]`` are node i's variables or -1. Continuous
    variables only appear in memory rows, where their bounds pin them to 0 or 1 once the
    binaries are fixed.
    """

    rows: sp.csr_matrix
    lower: np.ndarray
    upper: np.ndarray
    runtime: np.ndarray
    memory: np.ndarray
    saved_var: np.ndarray
    recomputed_var: np.ndarray
    integral: np.ndarray
    row_unit: np.ndarray  # bytes per unit of each row (memory rows: a power of two; others 1)

    @property
    def num_vars(self) -> int:
        return self.rows.shape[1]

    def constraints(self, whole: bool = False):
        """Each row as ``(columns, coefficients, lower, upper)``; infinite bounds are None.

        With ``whole``, memory rows are scaled back to bytes (whole numbers).
        """
        rows = self.rows
        for r in range(rows.shape[0]):
            lo, hi = rows.indptr[r], rows.indptr[r + 1]
            unit = float(self.row_unit[r]) if whole else 1.0
            yield (rows.indices[lo:hi], rows.data[lo:hi] * unit,
                   float(self.lower[r]) * unit if np.isfinite(self.lower[r]) else None,
                   float(self.upper[r]) * unit if np.isfinite(self.upper[r]) else None)

    def relaxed(self) -> "GraphModel":
        """The linear relaxation: the same rows, every variable continuous in [0, 1]."""
        return replace(self, integral=np.zeros_like(self.integral))

    def saved_values(self, x: np.ndarray) -> np.ndarray:
        """Per node, its ``saved`` variable's value in x (0 for nodes without one)."""
        has = self.saved_var >= 0
        values = np.zeros(len(self.saved_var))
        values[has] = x[self.saved_var[has]]
        return values

    def saved_mask(self, x: np.ndarray) -> np.ndarray:
        """Node mask of saved nodes from a (possibly fractional-noise) solution vector."""
        return self.saved_values(x) > 0.5

    def vector(self, saved: np.ndarray, recomputed: np.ndarray) -> np.ndarray:
        """The binary part of the solution vector of a plan given as node masks (warm starts)."""
        x = np.zeros(self.num_vars)
        for var, mask in ((self.saved_var, saved), (self.recomputed_var, recomputed)):
            has = (var >= 0) & mask
            x[var[has]] = 1.0
        return x


@dataclass
class RowBuilder:
    """Rows and variables added one at a time, then frozen into a :class:`GraphModel`."""

    num_vars: int = 0
    integral: list = field(default_factory=list)
    row_ids: list = field(default_factory=list)
    col_ids: list = field(default_factory=list)
    coefs: list = field(default_factory=list)
    lower: list = field(default_factory=list)
    upper: list = field(default_factory=list)
    unit: list = field(default_factory=list)

    def add_vars(self, count: int, integral: bool) -> np.ndarray:
        first = self.num_vars
        self.num_vars += count
        self.integral.extend([integral] * count)
        return np.arange(first, self.num_vars)

    def add_row(self, cols, vals, lo: float, hi: float, unit: float = 1.0) -> None:
        row = len(self.lower)
        self.unit.append(unit)
        self.row_ids.extend([row] * len(cols))
        self.col_ids.extend(cols)
        self.coefs.extend(vals)
        self.lower.append(lo)
        self.upper.append(hi)

    def copy(self) -> "RowBuilder":
        return RowBuilder(self.num_vars, *(list(getattr(self, f)) for f in
                                           ("integral", "row_ids", "col_ids", "coefs", "lower", "upper", "unit")))

    def with_rows_of(self, other: "RowBuilder", first: int) -> "RowBuilder":
        """A copy with ``other``'s rows after its own, ``other``'s columns from ``first`` on (the
        ones it added) numbered after this one's columns; those below ``first`` are shared."""
        out = self.copy()
        cols = np.asarray(other.col_ids, dtype=np.int64)
        out.col_ids.extend(np.where(cols >= first, cols + (self.num_vars - first), cols).tolist())
        out.row_ids.extend((np.asarray(other.row_ids, dtype=np.int64) + len(self.lower)).tolist())
        for name in ("coefs", "lower", "upper", "unit"):
            getattr(out, name).extend(getattr(other, name))
        out.integral.extend(other.integral[first:])
        out.num_vars += other.num_vars - first
        return out

    def freeze(self, base: "GraphModel") -> GraphModel:
        """The model with these rows and variables, objectives and node maps taken from ``base``."""
        rows = sp.csr_matrix((self.coefs, (self.row_ids, self.col_ids)), shape=(len(self.lower), self.num_vars))
        pad = self.num_vars - len(base.runtime)
        return GraphModel(
            rows, np.array(self.lower, dtype=float), np.array(self.upper, dtype=float),
            np.pad(base.runtime, (0, pad)), np.pad(base.memory, (0, pad)),
            base.saved_var, base.recomputed_var, np.array(self.integral, dtype=bool), np.array(self.unit, dtype=float),
        )


def build_graph_model(problem: Problem) -> tuple[GraphModel, RowBuilder]:
    """The binaries and the availability rows; memory rows go on the returned builder."""
    relevant = _relevant(problem)
    saved_var = np.full(len(problem), -1, dtype=np.int64)
    recomputed_var = np.full(len(problem), -1, dtype=np.int64)
    s_nodes = np.flatnonzero(relevant & problem.saveable)
    r_nodes = np.flatnonzero(relevant & problem.recomputable)
    build = RowBuilder()
    saved_var[s_nodes] = build.add_vars(len(s_nodes), integral=True)
    recomputed_var[r_nodes] = build.add_vars(len(r_nodes), integral=True)

    def available(i):
        return [v for v in (saved_var[i], recomputed_var[i]) if v >= 0]

    for i in np.flatnonzero(relevant & problem.needed):
        cols = available(i)
        build.add_row(cols, [1.0] * len(cols), 1.0, np.inf)
    for i in np.flatnonzero((saved_var >= 0) & (recomputed_var >= 0)):
        build.add_row([saved_var[i], recomputed_var[i]], [1.0, 1.0], -np.inf, 1.0)
    for i in r_nodes:
        for j in problem.inputs[i]:
            cols = available(j)
            build.add_row([recomputed_var[i], *cols], [1.0] + [-1.0] * len(cols), -np.inf, 0.0)

    memory = np.zeros(build.num_vars)
    memory[saved_var[s_nodes]] = problem.nbytes[s_nodes]
    random = r_nodes[problem.random[r_nodes]]
    memory[recomputed_var[random]] = problem.rng_state_bytes
    runtime = np.zeros(build.num_vars)
    runtime[recomputed_var[r_nodes]] = problem.runtime[r_nodes]
    runtime[saved_var[s_nodes]] = problem.save_seconds[s_nodes]
    base = GraphModel(sp.csr_matrix((0, build.num_vars)), np.zeros(0), np.zeros(0), runtime, memory,
                      saved_var, recomputed_var, np.ones(build.num_vars, dtype=bool), np.zeros(0))
    return base, build


def tie_blocks(build: RowBuilder, base: GraphModel, blocks) -> None:
    """Rows making corresponding nodes of consecutive blocks decide alike (a restriction):
    ``saved[i] == saved[i + P]`` and ``recomputed[i] == recomputed[i + P]``."""
    for i, j in blocks.pairs():
        for var in (base.saved_var, base.recomputed_var):
            if var[i] >= 0 and var[j] >= 0:
                build.add_row([var[i], var[j]], [1.0, -1.0], 0.0, 0.0)


def choose_patterns(build: RowBuilder, base: GraphModel, blocks, patterns: list[np.ndarray],
                    ranks: np.ndarray) -> np.ndarray:
    """Rows making every block save as one of ``patterns`` does, the blocks in order of the
    bytes their patterns save (a restriction).

    Per block a 0/1 choice of pattern, exactly one chosen, and each saved variable of the block
    equal to the chosen pattern's entry, ``saved[start + k * period + o] == sum_p choice[k, p] *
    patterns[p][o]``. Recomputed variables stay free: the availability rows decide them. No
    block takes a pattern of lower rank (:func:`solvers.blocks.pattern_ranks`: by the bytes it
    saves) than the block before it: blocks alike but for their place would otherwise give
    as many equal plans as orders of their choices, which no search gets through, and the
    order kept is the one that holds least through the forward and the backward (what a
    block saves is alive from it on in the forward and until its own backward). Returns the
    choice variables' columns, ``(blocks.count, len(patterns))``."""
    rank = np.asarray(ranks, dtype=float)
    columns = np.zeros((blocks.count, len(patterns)), dtype=np.int64)
    for k in range(blocks.count):
        choice = columns[k] = build.add_vars(len(patterns), integral=True)
        build.add_row(list(choice), [1.0] * len(patterns), 1.0, 1.0)
        start = blocks.start + k * blocks.period
        for o in range(blocks.period):
            var = int(base.saved_var[start + o])
            if var >= 0:
                cols = [var] + [int(c) for c, pattern in zip(choice, patterns) if pattern[o]]
                build.add_row(cols, [1.0] + [-1.0] * (len(cols) - 1), 0.0, 0.0)
        if 1 < k < blocks.count - 1:  # rank(k - 1) <= rank(k), one row per rank: [rank(k - 1) >= r] <= [rank(k) >= r]
            for r in range(1, len(patterns)):
                above = [int(p) for p in np.flatnonzero(rank >= r)]
                build.add_row([*columns[k - 1][above], *choice[above]], [1.0] * len(above) + [-1.0] * len(above),
                              -np.inf, 0.0)
    return columns


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


def seconds_bound(value: float, model: GraphModel) -> float:
    """A bound on :func:`tie_broken_objective` back in seconds: the tie-break weighs at most
    ``MEMORY_TIE_BREAK`` in all, and the runtime is scaled by the costliest node's."""
    return max(0.0, float(value) - MEMORY_TIE_BREAK) * float(np.max(model.runtime, initial=0.0))


def _scaled(vector: np.ndarray) -> np.ndarray:
    top = float(np.max(vector, initial=0.0))
    return vector / top if top > 0 else vector
