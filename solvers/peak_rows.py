"""A plan's memory at chosen steps of the training step, as linear rows of the graph model.

The rows encode :func:`planner.schedule.profile` exactly. For a backward step ``t`` and a node
``e`` that may be recomputed, ``made[e, t]`` (continuous, pinned to 0/1 by its rows) says that
e's copy exists by step t: e is recomputed and read directly by step t, or a copy that reads
e exists by then::

    made[e,t] >= made[w,t] + recomputed[e] - 1     for each reader w of e
    made[e,t] <= recomputed[e],  made[e,t] <= sum_w made[w,t]     (when e is not read by t)

A saved node is alive at t while it is read at t or later, directly or by a copy not yet made
before t (``recomputed[w] - made[w,t-1]``); a copy is alive at t if made by t and alive in the
same sense; a library kernel's scratch counts at the step its copy is made
(``made[e,t] - made[e,t-1]``). A fused copy reads its inputs at every kernel up to its last
reader's, so its readers' copies count too. A copy that inductor fuses only where the plan saves
one of some producers (``Schedule.fused_if_saved``) is either, by ``fused[e] >= saved[j]`` for
each such j, ``fused[e] <= sum_j saved[j]`` and ``stored[e] = 1 - fused[e]``: its bytes, and its
reads when it is made, count with ``stored[e]`` as a factor, its reads up to its last reader's
with ``fused[e]``. A multi-output op's outputs are made with it; a step whose kernel may write
its output into a value it reads last subtracts that output's bytes, through a variable at most
1 when such a value ends there (never a fused copy, which has no storage). Forward rows need the
saved variables, and for values on demand (computed in the forward only where the plan saves
them or a value computed there reads them), ``computed[i] >= saved[i]``, ``computed[i] >=
computed[k]`` for each on-demand reader k, and an unsaved value alive at f through on-demand
readers only: ``alive[i,f] >= computed[k] - saved[i]`` for each reader k reading it at f or later.
With offloading (:mod:`solvers.offload`), a saved value chosen to be offloaded is off the device
after its forward wait and before its copy back: there its term is ``saved - offloaded``, or,
where only recomputed copies keep it alive, a variable at least ``alive - offloaded``.

:func:`solve_within_peak` adds rows lazily: solve with rows at a few steps, measure the plan
at every step, add the steps over the limit, solve again. A row is exact at its step, so no
step is added twice; steps are finite, so the loop ends; each program relaxes the full one,
so its optimum (and its bound, if stopped early) holds for the full program too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from planner.problem import Evaluation, Problem, memory_profile
from planner.schedule import Offloads, computed_in_forward
from solvers.clock import passed
from solvers.graph_model import GraphModel, RowBuilder

__all__ = ["PeakRows", "Limit", "Round", "Steps", "solve_within_peak", "memory_unit"]



def memory_unit(problem: Problem) -> float:
    """Bytes per unit of the memory rows: a power of two (so scaling is exact) that keeps the
    rows' values under about 2**20, where the back ends' absolute tolerances are far below a byte."""
    s = problem.schedule
    total = int(s.repeats * problem.nbytes.sum() + s.transient.sum() + s.copy_bytes.sum() + s.copy_scratch.sum()
                + max(s.base.max(initial=0), s.fwd_base.max(initial=0))) + 1
    return float(2 ** max(0, total.bit_length() - 21))


class PeakRows:
    """Builds memory rows over the variables of a :class:`GraphModel` of ``problem``."""

    def __init__(self, problem: Problem, base: GraphModel, offload=None) -> None:
        s = problem.schedule
        n = len(problem)
        self.problem, self.base, self.schedule = problem, base, s
        self.own = s.owns
        self.cons = problem.consumers
        self.rvar, self.svar = base.recomputed_var, base.saved_var
        # values on demand that some plan computes in the forward (it saves them, or a value it
        # computes reads them), and what each needs and is read by there
        self.needs: dict[int, list[int]] = {}
        for i, k in s.demand_needs.tolist():
            self.needs.setdefault(i, []).append(k)
        self.demand_reads: dict[int, list[tuple[int, int]]] = {}
        for i, k, f in s.demand_reads.tolist():
            self.demand_reads.setdefault(i, []).append((k, f))
        self.computable = s.on_demand & computed_in_forward(s, self.svar >= 0)
        # copies stored unless the plan saves one of some producers, which lets inductor fuse
        # them into their readers (Schedule.fused_if_saved): the saved variables of those producers
        self.fusible: dict[int, list[int]] = {}
        for e in np.flatnonzero(self.own & (self.rvar >= 0) & ~s.fused):
            savers = sorted({int(self.svar[j]) for j in s.fused_if_saved[e] if j >= 0 and self.svar[j] >= 0})
            if savers:
                self.fusible[int(e)] = savers
        never = s.num_steps + 1
        earliest = np.full(n, never, dtype=np.int64)
        for e in range(n - 1, -1, -1):
            if self.own[e] and self.rvar[e] >= 0:
                earliest[e] = min([int(s.first_read[e])] + [int(earliest[w]) for w in self.cons[e] if self.rvar[w] >= 0])
        self.earliest = earliest
        self.scratchy = [int(e) for e in np.flatnonzero(self.own & (self.rvar >= 0) & (s.copy_scratch > 0))]
        # outputs of a multi-output op: made with the op
        self.outputs = [(int(g), int(s.made_with[g])) for g in np.flatnonzero(self.own & (self.rvar >= 0))
                        if s.made_with[g] != g]
        if any(self.svar[op] >= 0 for _, op in self.outputs):
            raise ValueError("Schedule.made_with names an op that can be saved; "
                             "only a multi-output op's outputs are made with it")
        # values read last by a step whose output may be written into them (in-place reuse)
        self.reusable: dict[int, list[int]] = {}
        for e in np.flatnonzero(self.own & ~s.held & ~s.no_reuse & (s.last_read >= 0)):
            t = int(s.last_read[e])
            if s.reuse[t] and not s.reuse_base[t] and s.reuse[t] in (problem.nbytes[e], s.copy_bytes[e]):
                self.reusable.setdefault(t, []).append(int(e))
        # terms of every row: RNG states of recomputed random ops, and for a graph run several
        # times before its backward, the saved values its other runs hold
        random = np.flatnonzero(problem.random & (self.rvar >= 0))
        self.every_step = [(int(self.rvar[i]), float(problem.rng_state_bytes * s.repeats)) for i in random]
        if s.repeats > 1:
            kept = np.flatnonzero(self.own & (self.svar >= 0) & (problem.nbytes > 0))
            self.every_step += [(int(self.svar[e]), float((s.repeats - 1) * problem.nbytes[e])) for e in kept]
        # offload variables (windows, columns): a chosen value is off the device after its
        # forward wait and before its copy back starts (solvers.offload)
        self.away_after: list[tuple[int, int, float]] = []  # (forward wait, column, bytes) per window
        self.away_until: dict[int, list[tuple[int, int]]] = {}  # node -> (copy back's step, column) per window
        if offload is not None:
            windows, cols = offload
            for v, f, b, c in zip(windows.nodes, windows.freed_after, windows.back_from, cols):
                self.away_after.append((int(f), int(c), float(problem.nbytes[v])))
                self.away_until.setdefault(int(v), []).append((int(b), int(c)))

    def add(self, build: RowBuilder, forward_steps, backward_steps, limit: "Limit", kept: dict | None = None) -> None:
        """Rows ``memory(step) <= limit`` at the given forward and backward steps. ``kept``: the
        columns rows added to ``build`` before made (so that more steps' rows can be added)."""
        kept = {} if kept is None else kept
        made_cache: dict[int, dict[int, int]] = kept.setdefault("made", {})
        computed_cache: dict = kept.setdefault("computed", {})
        for f in sorted(forward_steps):
            limit.row(build, *self._forward(build, f, computed_cache))
        if "fusion" not in kept:
            kept["fusion"] = self._fusion(build)
        fusion = kept["fusion"]
        for t in sorted(backward_steps):
            made_now = self._made(build, t, made_cache)
            made_before = self._made(build, t - 1, made_cache)
            limit.row(build, *self._backward(build, t, made_now, made_before, fusion))

    def _fusion(self, build: RowBuilder) -> dict[int, tuple[int, int]]:
        """Columns ``(fused[e], stored[e])`` per copy of :attr:`fusible`: fused where the plan
        saves one of its producers, stored where it saves none."""
        columns = {}
        for e, savers in self.fusible.items():
            fused, stored = (int(c) for c in build.add_vars(2, integral=False))
            for j in savers:  # fused >= saved[j]
                build.add_row([fused, j], [1.0, -1.0], 0.0, np.inf)
            build.add_row([fused, *savers], [1.0] + [-1.0] * len(savers), -np.inf, 0.0)  # fused <= sum saved[j]
            build.add_row([stored, fused], [1.0, 1.0], 1.0, 1.0)  # stored = 1 - fused
            columns[e] = (fused, stored)
        return columns

    def _forward(self, build: RowBuilder, f: int, cache: dict) -> tuple[float, list]:
        s, nbytes = self.schedule, self.problem.nbytes
        const, terms = float(s.fwd_base[f]), list(self.every_step)
        for e in np.flatnonzero(self.own[: f + 1]):
            e = int(e)
            live = not s.on_demand[e] and s.fwd_last[e] >= f
            if live:
                const += float(s.transient[e])
            elif s.transient[e]:
                # alive at f only where the forward computes an on-demand value reading it then
                readers = [k for k, until in self.demand_reads.get(e, ()) if until >= f and self.computable[k]]
                if s.on_demand[e] and e == f and self.computable[e]:
                    readers.append(e)
                if readers:
                    terms.append((self._alive(build, e, readers, cache), float(s.transient[e])))
            coef = float(nbytes[e]) - (float(s.transient[e]) if live else 0.0)
            if self.svar[e] >= 0 and coef:
                terms.append((int(self.svar[e]), coef))
        terms += [(col, -size) for freed, col, size in self.away_after if freed < f]
        return const, terms

    def _alive(self, build: RowBuilder, e: int, readers: list[int], cache: dict) -> int:
        """Column at least ``computed[k] - saved[e]`` for every k of ``readers``."""
        key = (e, tuple(sorted(readers)))
        if key not in cache:
            (col,) = build.add_vars(1, integral=False)
            for k in readers:
                cols, vals = [col, self._computed(build, k, cache)], [1.0, -1.0]
                if self.svar[e] >= 0:
                    cols, vals = [*cols, int(self.svar[e])], [*vals, 1.0]
                build.add_row(cols, vals, 0.0, np.inf)
            cache[key] = int(col)
        return cache[key]

    def _computed(self, build: RowBuilder, i: int, cache: dict) -> int:
        """Column of ``computed[i]`` for a computable on-demand node: at least its saved variable
        and the columns of the computable on-demand nodes reading it (rows made once per build)."""
        pending = [i]
        while pending:  # depth first, a node's column after its readers' columns
            k = pending[-1]
            if k in cache:
                pending.pop()
                continue
            later = [w for w in self.needs.get(k, ()) if self.computable[w] and w not in cache]
            if later:
                pending.extend(later)
                continue
            pending.pop()
            (col,) = build.add_vars(1, integral=False)
            if self.svar[k] >= 0:
                build.add_row([col, int(self.svar[k])], [1.0, -1.0], 0.0, np.inf)
            for w in self.needs.get(k, ()):
                if self.computable[w]:
                    build.add_row([col, cache[w]], [1.0, -1.0], 0.0, np.inf)
            cache[k] = int(col)
        return cache[i]

    def made(self, build: RowBuilder, tau: int, cache: dict) -> dict[int, int]:
        """Column of ``made[e, tau]`` per node whose copy can exist by step tau (exact rows on
        ``build``; ``cache`` keeps each step's columns)."""
        return self._made(build, tau, cache)

    def _made(self, build: RowBuilder, tau: int, cache: dict) -> dict[int, int]:
        """Column of ``made[e, tau]`` per node that can have a copy by step tau."""
        if tau in cache:
            return cache[tau]
        s, made = self.schedule, {}
        for e in np.flatnonzero(self.own & (self.earliest <= tau))[::-1]:
            e = int(e)
            r = int(self.rvar[e])
            if s.first_read[e] <= tau:
                made[e] = r
                continue
            readers = [made[w] for w in self.cons[e] if w in made]
            (col,) = build.add_vars(1, integral=False)
            build.add_row([col, r], [1.0, -1.0], -np.inf, 0.0)
            build.add_row([col, *readers], [1.0] + [-1.0] * len(readers), -np.inf, 0.0)
            for w in readers:
                build.add_row([col, w, r], [1.0, -1.0, -1.0], -1.0, np.inf)
            made[e] = int(col)
        for g, op in self.outputs:  # made[g] = made[op] AND recomputed[g]
            if op in made:
                (col,) = build.add_vars(1, integral=False)
                r = int(self.rvar[g])
                build.add_row([col, made[op]], [1.0, -1.0], -np.inf, 0.0)
                build.add_row([col, r], [1.0, -1.0], -np.inf, 0.0)
                build.add_row([col, made[op], r], [1.0, -1.0, -1.0], -1.0, np.inf)
                made[g] = int(col)
        cache[tau] = made
        return made

    def _backward(self, build: RowBuilder, t: int, made_now: dict, made_before: dict,
                  fusion: dict[int, tuple[int, int]]) -> tuple[float, list]:
        s, nbytes = self.schedule, self.problem.nbytes
        terms = list(self.every_step)
        reading: dict[int, list] = {}
        for e in np.flatnonzero(self.own & ~s.held):
            e = int(e)
            # copies of readers of e that read it at t or later: each keeps e alive at t
            later = [c for w in self.cons[e] for c in self._reads_at(t, int(w), made_before, reading, fusion)]
            # the windows of e's offloads that have it off the device at t
            away = [c for b, c in self.away_until.get(e, ()) if t < b]
            for present, size in ((self.svar[e], nbytes[e]), (made_now.get(e, -1), s.copy_bytes[e])):
                if present < 0 or not size:
                    continue
                is_saved = present == self.svar[e]
                off = away if is_saved else []  # only a saved value is offloaded
                # a copy inductor may fuse holds its bytes only where it is stored
                stored = [[(fusion[e][1], 1.0)]] if e in fusion and not is_saved else []
                if s.last_read[e] >= t:
                    here = self._all_of(build, [[(int(present), 1.0)], *stored]) if stored else int(present)
                    terms.append((here, float(size)))
                    terms += [(c, -float(size)) for c in off]  # the offloads (one at most) <= saved
                elif later:
                    (alive,) = build.add_vars(1, integral=False)
                    for conj in later:  # alive >= present AND every factor of conj
                        self._at_least_all(build, alive, [[(int(present), 1.0)], *stored, *conj])
                    if off:  # on the device: alive AND NOT offloaded, at least alive - offloaded
                        (here,) = build.add_vars(1, integral=False)
                        build.add_row([here, alive, *off], [1.0, -1.0] + [1.0] * len(off), 0.0, np.inf)
                        alive = here
                    terms.append((int(alive), float(size)))
        for e in self.scratchy:  # a library kernel's scratch while its copy is made: made[e,t] - made[e,t-1]
            if e in made_now:
                terms.append((made_now[e], float(s.copy_scratch[e])))
                if e in made_before:
                    terms.append((made_before[e], -float(s.copy_scratch[e])))
        return (float(s.base[t]) - (float(s.reuse[t]) if s.reuse_base[t] else 0.0),
                terms + self._reuse(build, t, made_now, fusion))

    @classmethod
    def _all_of(cls, build: RowBuilder, factors: list) -> int:
        """A new column at least the AND of ``factors`` (0/1 linear expressions)."""
        (col,) = build.add_vars(1, integral=False)
        cls._at_least_all(build, int(col), factors)
        return int(col)

    @staticmethod
    def _at_least_all(build: RowBuilder, col: int, factors: list) -> None:
        """The row ``col >= AND(factors)``: col - sum(factors) >= 1 - len(factors)."""
        build.add_row([col] + [c for f in factors for c, _ in f], [1.0] + [-v for f in factors for _, v in f],
                      1.0 - len(factors), np.inf)

    def _reuse(self, build: RowBuilder, t: int, made_now: dict, fusion: dict[int, tuple[int, int]]) -> list:
        """``-reuse[t] * x`` for x in [0, 1] that is at most 1 when a saved value or copy of
        that size is read last at step t (no copy reads it later), else 0."""
        s, nbytes = self.schedule, self.problem.nbytes
        ends, reading = [], {}
        for e in self.reusable.get(t, []):
            saved = -1 if s.undonated[e] else self.svar[e]  # a saved value not donated is not written into
            for present, size in ((saved, nbytes[e]), (made_now.get(e, -1), s.copy_bytes[e])):
                if present < 0 or size != s.reuse[t]:
                    continue
                (end,) = build.add_vars(1, integral=False)
                build.add_row([end, int(present)], [1.0, -1.0], -np.inf, 0.0)
                if e in fusion and present != saved:  # a fused copy has no storage to write into
                    build.add_row([end, fusion[e][1]], [1.0, -1.0], -np.inf, 0.0)
                for w in self.cons[e]:  # end <= 1 - AND(conj): no copy reads e after t
                    for conj in self._reads_at(t + 1, int(w), made_now, reading, fusion):
                        build.add_row([end] + [c for f in conj for c, _ in f], [1.0] + [v for f in conj for _, v in f],
                                      -np.inf, float(len(conj)))
                ends.append(int(end))
        if not ends:
            return []
        (x,) = build.add_vars(1, integral=False)
        build.add_row([x, *ends], [1.0] + [-1.0] * len(ends), -np.inf, 0.0)
        return [(int(x), -float(s.reuse[t]))]

    def _reads_at(self, t: int, w: int, made_before: dict, cache: dict, fusion: dict[int, tuple[int, int]]) -> list:
        """When w's copy reads its inputs at step t or later, as a disjunction of conjunctions
        of 0/1 linear expressions (an empty list: never). A stored copy reads them once, when
        it is made; a fused copy in every kernel that computes it, up to its last reader's; a
        copy that is either (:attr:`fusible`) as the one or the other, by its columns."""
        if w in cache:
            return cache[w]
        r = int(self.rvar[w])
        found: list = []
        if r >= 0 and not self.schedule.fused[w]:
            m = made_before.get(w)  # made[w, t-1]: the copy is made at t or later
            if m != r:
                found = [[[(r, 1.0)] + ([(m, -1.0)] if m is not None else [])]]
        if r >= 0 and (self.schedule.fused[w] or w in fusion):
            if self.schedule.last_read[w] >= t or made_before.get(w) is None:
                fused = [[[(r, 1.0)]]]
            else:  # w is recomputed and one of its readers reads it at t or later
                fused = [[[(r, 1.0)], *conj] for u in self.cons[w]
                         for conj in self._reads_at(t, int(u), made_before, cache, fusion)]
            if w in fusion:  # stored where the plan saves none of its producers, else fused
                fused_col, stored_col = fusion[w]
                found = ([[*conj, [(stored_col, 1.0)]] for conj in found]
                         + [[*conj, [(fused_col, 1.0)]] for conj in fused])
            else:
                found = fused
        cache[w] = found
        return found


@dataclass(frozen=True)
class Limit:
    """``bytes + span * x[col]``: a fixed budget (no column), or a peak to minimise (x in [0, 1]).

    Rows are written in units of ``unit`` bytes (see :func:`memory_unit`).
    """

    bytes: float
    unit: float
    col: int | None = None
    span: float = 0.0

    def row(self, build: RowBuilder, const: float, terms: list) -> None:
        cols = [c for c, _ in terms] + ([self.col] if self.col is not None else [])
        vals = [v / self.unit for _, v in terms] + ([-self.span / self.unit] if self.col is not None else [])
        build.add_row(cols, vals, -np.inf, (self.bytes - const) / self.unit, unit=self.unit)

    def value(self, x: np.ndarray) -> float:
        return self.bytes + (self.span * float(x[self.col]) if self.col is not None else 0.0)


@dataclass
class Round:
    """One solve of the lazy loop: the plan found (None if none), the back end's verdict, and
    the values the plan offloads (None: none)."""

    plan: Evaluation | None
    x: np.ndarray | None
    optimal: bool
    offloads: Offloads | None = None


@dataclass
class Steps:
    """The steps that have memory rows. A loop given one starts from its steps and adds to it,
    so a later program of the same problem and limit (the full one after the tied one) starts
    with every row an earlier one needed; a row at any step holds for every plan, so starting
    with more rows changes no optimum."""

    forward: set[int] = field(default_factory=set)
    backward: set[int] = field(default_factory=set)
    # per fixed limit, its memory rows made so far (:class:`_Rows`), which a later program takes
    # instead of making them again (on timm's RexNet-100 they took 2.5 s per program)
    rows: dict = field(default_factory=dict)


@dataclass
class _Rows:
    """Memory rows over a model's ``first`` binaries, the columns they add numbered from
    ``first``; the steps they are at, and what :meth:`PeakRows.add` keeps to add more."""

    first: int
    build: RowBuilder
    forward: set[int] = field(default_factory=set)
    backward: set[int] = field(default_factory=set)
    kept: dict = field(default_factory=dict)

    def grown(self, rows: PeakRows, forward_steps: set[int], backward_steps: set[int], limit: "Limit") -> RowBuilder:
        """The rows at every given step, those not made yet added."""
        rows.add(self.build, forward_steps - self.forward, backward_steps - self.backward, limit, self.kept)
        self.forward |= forward_steps
        self.backward |= backward_steps
        return self.build


def solve_within_peak(
    problem: Problem,
    base: GraphModel,
    build: RowBuilder,
    solve: Callable[[GraphModel, "Limit"], Round],
    deadline: float,
    limit_bytes: float = 0.0,
    peak_span: float | None = None,
    steps: Steps | None = None,
    offload=None,
) -> tuple[Round, dict]:
    """Solve with memory rows added lazily until no step of the plan exceeds the limit.

    The limit is ``limit_bytes``; with ``peak_span`` it is ``limit_bytes + peak_span * p`` for
    a new variable p in [0, 1] that ``solve`` should minimise (the most frugal plan). ``solve``
    gets the model and the limit, and returns a :class:`Round`. Returns the last round and
    loop statistics. At the deadline, if the last round's plan exceeds a fixed limit, the
    fastest plan of an earlier round that fitted it is returned instead (not optimal, no gap).
    ``offload``: the offload variables, ``(windows, columns)`` (:mod:`solvers.offload`), whose
    plans ``solve`` gives with their offloads.
    """
    rows = PeakRows(problem, base, offload)
    unit = memory_unit(problem)
    if peak_span is None:
        limit = Limit(limit_bytes, unit)
    else:
        limit = Limit(limit_bytes, unit, int(build.add_vars(1, integral=False)[0]), peak_span)
    steps = Steps() if steps is None else steps
    forward_steps, backward_steps = steps.forward, steps.backward  # grown in place
    forward_steps.add(len(problem) - 1)
    backward_steps.update((0, int(np.argmax(problem.schedule.base))))
    rounds, fitting = 0, None
    shared = None  # the memory rows of a fixed limit, kept for the later rounds and programs
    if peak_span is None and offload is None:
        first = len(base.runtime)
        shared = steps.rows.setdefault((float(limit_bytes), unit, first),
                                       _Rows(first, RowBuilder(first, [False] * first)))
    while True:
        if shared is None:
            trial = build.copy()
            rows.add(trial, forward_steps, backward_steps, limit)
        else:
            trial = build.with_rows_of(shared.grown(rows, forward_steps, backward_steps, limit), shared.first)
        result = solve(trial.freeze(base), limit)
        rounds += 1
        stats = {"rounds": rounds, "memory_rows": len(forward_steps) + len(backward_steps), "variables": trial.num_vars}
        if result.plan is None:
            return result, stats
        allowed = limit.value(result.x)
        prof = memory_profile(problem, result.plan, result.offloads)
        new_f = _over(prof.forward, allowed, forward_steps)
        new_b = _over(prof.backward, allowed, backward_steps)
        if not (new_f or new_b):
            return result, stats
        if peak_span is None and result.plan.peak_bytes <= allowed and (
                fitting is None or result.plan.seconds < fitting.plan.seconds):
            fitting = Round(result.plan, result.x, False, result.offloads)
        if passed(deadline):
            if peak_span is None and result.plan.peak_bytes > allowed and fitting is not None:
                stats["answer"] = f"round {rounds} exceeded the budget at the time limit; an earlier round's plan fitted"
                return fitting, stats
            return result, stats
        forward_steps |= new_f
        backward_steps |= new_b


def _over(memory: np.ndarray, allowed: float, known: set[int], most: int = 64) -> set[int]:
    """Up to ``most`` steps over ``allowed`` not yet in ``known``, highest first, spread apart."""
    picked: list[int] = []
    for k in np.argsort(-memory, kind="stable"):
        if memory[k] <= allowed or len(picked) >= most:
            break
        k = int(k)
        if k not in known and all(abs(k - p) > 2 for p in picked):
            picked.append(k)
    return set(picked)
