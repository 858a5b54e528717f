"""When each value of a training step is alive, and the peak memory of a plan (torch-free).

Time runs over the forward nodes in order (step ``f`` is forward node ``f`` running), then over
the backward steps in the order the emitter writes them. A plan's memory at each step is:

* forward step f: every storage computed so far that is still read in the forward, or saved,
  or a forward output the caller keeps, and the storages no plan changes (``fwd_base[f]``:
  copies the compiler makes of inputs). A forward value no forward output needs (on demand) is
  computed only where the plan saves it or a value it computes reads it, as the emitted forward
  holds only what its outputs and saved values need;
* backward step t: the backward's own values alive at t (``base[t]``: gradients, to the
  backward's end, tangents, to its end where the autograd engine holds them, and temporaries),
  saved storages still to be read, and recomputed copies already made and still to be read. A
  recomputed node is made just before its first reader (a backward step, or another copy), as
  :mod:`planner.emit` places it; the copies made for step t are counted as alive together at t
  (an upper bound on the transient peak while they are made), with the scratch memory of their
  library kernels (``copy_scratch``). A copy that is fused (computed inside the kernels that
  read it, never stored) reads its inputs in each of those kernels, so its inputs stay alive
  until its last reader has run. The outputs of a recomputed multi-output op are made together,
  with the op. A backward kernel may write its output into a storage of the same size that it
  reads last (inductor's in-place reuse): a backward value other than a tangent, or a saved
  value or copy whose last reader it is; the output then adds nothing at that step.

A graph that runs ``repeats`` times before its backward (one compiled block run for each
layer) keeps the saved values and RNG states of its other runs alive at every step of one run:
``repeats - 1`` times the plan's saved bytes are added to every step.

RNG states of recomputed random ops are counted at every step. :func:`profile` computes the
memory at every step for a plan; the exact solvers encode the same sums as linear rows, so a
plan's peak here is what they bound.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

__all__ = ["Schedule", "Profile", "Offloads", "OffloadWindows", "made_at", "profile", "consumers", "with_rest_of_step",
           "with_backward_beside", "computed_in_forward", "forward_reads_until", "last_forward_read"]


@dataclass(frozen=True, eq=False)
class Schedule:
    """Lifetimes of a problem's values over one training step.

    Arrays have one entry per problem node (``n``) or per backward step (``T``); bytes are int64.

    Attributes
    ----------
    owner : index of the node whose storage node i's value lives in: i itself, the base of a
        view, or -1 for storage held before the step (a view of an input or a parameter).
    transient : bytes node i occupies in the forward while it is read there, if not saved
        (0 for views, tuples, and values fused into the kernels that read them).
    copy_bytes : bytes of node i's recomputed copy in the backward (0 if fused or a view).
    fused : node i's recomputed copy is computed inside the kernels that read it, not stored.
    made_with : the node whose kernel makes node i's copy: i itself, or for an output of a
        multi-output op (a getitem), the op, which cannot be saved.
    fwd_last : last forward node reading node i's storage (i itself if none; ``n-1`` for
        forward outputs).
    first_read, last_read : first and last backward step reading node i's storage directly
        (``T`` and -1 if none).
    held : node i is a forward output the caller keeps through the backward.
    base : bytes of backward values alive at each backward step, plus held forward outputs and
        the scratch memory of the step's library kernel (:mod:`planner.workspace`).
    reuse : bytes of step t's output if its kernel may write it in place into a storage of the
        same size that it reads last (0 if not).
    reuse_base : a backward value (counted in ``base``) is such a storage at step t.
    step_names : the backward steps, in order.
    fwd_base : bytes alive at each forward step whatever the plan (copies of inputs that the
        compiler makes before the forward, counted in ``base`` while read there; the scratch
        memory of the step's library kernel).
    repeats : times the graph's forward runs before its backward in one training step (the
        blocks of a model compiled block by block share one graph): each other run holds the
        plan's saved values at every step of this one.
    copy_scratch : bytes of scratch memory node i's library kernel holds while it runs
        (:mod:`planner.workspace`), counted for its recomputed copy at the step the copy is made
        (``None``: none anywhere).
    no_reuse : the kernel of node i's ``last_read`` step may not write its output into node i's
        storage (of another dtype, or read at another index:
        :func:`planner.memory.not_written_in_place`; ``None``: none).
    undonated : node i saved may not be written into by the backward (its storage is an output
        the caller got, which AOTAutograd does not donate); its recomputed copy, the backward's
        own, may (``None``: none).
    fused_if_saved : per node i, a row of nodes any one of which, saved, makes node i's
        recomputed copy fused (``copy_bytes`` 0, ``fused``), where the copy is counted stored
        because it is computed from their producers
        (:func:`planner.memory.inlined_once_saved`); -1 pads the row (``None``: none anywhere).
        A plan's evaluation (:func:`profile`) and the solvers' memory rows
        (:mod:`solvers.peak_rows`) count the copy fused where the plan saves one of them.
    on_demand : node i is a forward value no forward output needs (a piece of the backward that
        reads no tangent, such as a derivative's ``erf`` merged with the forward's): the emitted
        forward computes it only where the plan saves it or an on-demand value it computes reads
        it (:func:`computed_in_forward`). ``fwd_last`` counts the readers computed whatever the
        plan (``None``: none on demand).
    demand_reads : rows ``(i, k, f)``: on-demand node k reads node i's storage, in the kernel of
        forward step f; where the forward computes k, i is read until f at least (``None``: none).
    demand_needs : rows ``(i, k)``: on-demand node k reads node i directly, so computing k
        computes i (``None``: none).
    """

    owner: np.ndarray
    transient: np.ndarray
    copy_bytes: np.ndarray
    fused: np.ndarray
    made_with: np.ndarray
    fwd_last: np.ndarray
    first_read: np.ndarray
    last_read: np.ndarray
    held: np.ndarray
    base: np.ndarray
    reuse: np.ndarray
    reuse_base: np.ndarray
    step_names: tuple[str, ...]
    fwd_base: np.ndarray
    repeats: int = 1
    copy_scratch: np.ndarray | None = None
    no_reuse: np.ndarray | None = None
    undonated: np.ndarray | None = None
    fused_if_saved: np.ndarray | None = None
    on_demand: np.ndarray | None = None
    demand_reads: np.ndarray | None = None
    demand_needs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.copy_scratch is None:
            object.__setattr__(self, "copy_scratch", np.zeros(len(self.owner), dtype=np.int64))
        if self.no_reuse is None:
            object.__setattr__(self, "no_reuse", np.zeros(len(self.owner), dtype=bool))
        if self.undonated is None:
            object.__setattr__(self, "undonated", np.zeros(len(self.owner), dtype=bool))
        if self.fused_if_saved is None:
            object.__setattr__(self, "fused_if_saved", np.full((len(self.owner), 1), -1, dtype=np.int64))
        if self.on_demand is None:
            object.__setattr__(self, "on_demand", np.zeros(len(self.owner), dtype=bool))
        if self.demand_reads is None:
            object.__setattr__(self, "demand_reads", np.zeros((0, 3), dtype=np.int64))
        if self.demand_needs is None:
            object.__setattr__(self, "demand_needs", np.zeros((0, 2), dtype=np.int64))

    @property
    def num_steps(self) -> int:
        return len(self.base)

    @property
    def owns(self) -> np.ndarray:
        """Node i's value lives in a storage of its own (``owner[i] == i``): not a view, nor
        held before the step."""
        return self.owner == np.arange(len(self.owner))

    @classmethod
    def saved_bytes_only(cls, needed: np.ndarray) -> "Schedule":
        """One backward step reading every needed node and nothing else alive: the peak of a
        plan is then its saved bytes (plus RNG states)."""
        n = len(needed)
        zeros = np.zeros(n, dtype=np.int64)
        return cls(
            owner=np.arange(n, dtype=np.int64),
            transient=zeros,
            copy_bytes=zeros,
            fused=np.zeros(n, dtype=bool),
            made_with=np.arange(n, dtype=np.int64),
            fwd_last=np.arange(n, dtype=np.int64),
            first_read=np.where(needed, 0, 1).astype(np.int64),
            last_read=np.where(needed, 0, -1).astype(np.int64),
            held=np.zeros(n, dtype=bool),
            base=np.zeros(1, dtype=np.int64),
            reuse=np.zeros(1, dtype=np.int64),
            reuse_base=np.zeros(1, dtype=bool),
            step_names=("backward",),
            fwd_base=zeros,
        )

    def check(self, n: int) -> None:
        """Raise ValueError if the arrays do not fit a problem of ``n`` nodes."""
        for name in ("owner", "transient", "copy_bytes", "fused", "made_with", "fwd_last", "first_read", "last_read",
                     "held", "fwd_base", "copy_scratch", "no_reuse", "undonated", "fused_if_saved",
                     "on_demand"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Schedule.{name} has {len(getattr(self, name))} rows, expected {n}")
        for name in ("reuse", "reuse_base"):
            if len(getattr(self, name)) != self.num_steps:
                raise ValueError(f"Schedule.{name} must have one entry per backward step")
        for name, width in (("demand_reads", 3), ("demand_needs", 2)):
            pairs = getattr(self, name)
            if pairs.ndim != 2 or pairs.shape[1] != width or (len(pairs) and not (
                    (pairs[:, :2] >= 0).all() and (pairs[:, :2] < n).all() and (pairs[:, 0] < pairs[:, 1]).all()
                    and self.on_demand[pairs[:, 1]].all())):
                raise ValueError(f"Schedule.{name} must have rows of {width} (a node, an on-demand node after it"
                                 f"{', a forward step' if width == 3 else ''})")
        if len(self.step_names) != self.num_steps:
            raise ValueError("Schedule.step_names must name every backward step")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"Schedule.repeats must be a positive int, got {self.repeats!r}")


@dataclass(frozen=True)
class Profile:
    """A plan's memory at every step, bytes: ``forward[f]`` and ``backward[t]``."""

    forward: np.ndarray
    backward: np.ndarray

    @property
    def peak(self) -> int:
        return int(max(self.forward.max(initial=0), self.backward.max(initial=0)))


def consumers(inputs: list[np.ndarray], owner: np.ndarray) -> list[list[int]]:
    """Per node, the non-view nodes that read its storage (directly or through views)."""
    result: list[list[int]] = [[] for _ in range(len(owner))]
    for i, ins in enumerate(inputs):
        if owner[i] != i:
            continue  # a view: its readers are counted as readers of its base
        for j in ins:
            o = owner[j]
            if o >= 0 and (not result[o] or result[o][-1] != i):
                result[o].append(i)
    return result


def profile(
    schedule: Schedule,
    inputs: list[np.ndarray],
    nbytes: np.ndarray,
    saved: np.ndarray,
    recomputed: np.ndarray,
    rng_bytes: int,
    cons: list[list[int]] | None = None,
    offloads: "Offloads | None" = None,
) -> Profile:
    """Memory at every forward and backward step for a pruned plan (see the module docstring).

    ``saved`` and ``recomputed`` are the masks of :func:`planner.problem.evaluate`; ``rng_bytes``
    is the RNG state kept for all recomputed random ops together; ``cons`` is
    :func:`consumers` of ``inputs``, computed here when not given. ``offloads`` marks saved
    values kept in host memory between the forward and the backward (:class:`Offloads`).
    """
    s = with_saved_fusions(schedule, saved)
    n, steps = len(s.owner), s.num_steps
    cons = consumers(inputs, s.owner) if cons is None else cons
    own = s.owns
    made = made_at(s, cons, recomputed & own)
    until = _read_until(s, cons, recomputed & own, made)
    fwd = np.zeros(n + 1, dtype=np.int64)
    kept = np.flatnonzero(own & saved)
    np.add.at(fwd, kept, nbytes[kept])
    read_until = forward_reads_until(s, computed_in_forward(s, saved))
    away = np.flatnonzero(own & saved & offloads.mask) if offloads is not None else np.zeros(0, dtype=np.int64)
    if len(away):
        freed = np.maximum(read_until[away], offloads.freed_after[away])
        np.add.at(fwd, freed + 1, -nbytes[away])
    passing = np.flatnonzero(own & ~saved & (s.transient > 0) & (read_until >= 0))
    np.add.at(fwd, passing, s.transient[passing])
    np.add.at(fwd, read_until[passing] + 1, -s.transient[passing])
    # backward: each saved value and recomputed copy is alive from its start to its end step
    alive = np.flatnonzero(own & (saved | recomputed) & ~s.held.astype(bool))
    until_at = np.full(n + 1, -1, dtype=np.int64)  # slot n: a reader that is not a recomputed copy
    until_at[list(until)] = list(until.values())
    end = s.last_read[alive].astype(np.int64)
    lengths = np.array([len(cons[e]) for e in alive], dtype=np.int64)
    if lengths.any():
        readers = np.fromiter((w for e in alive for w in cons[e]), dtype=np.int64, count=int(lengths.sum()))
        read_until = np.where(recomputed[readers], until_at[readers], -1)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        has = lengths > 0
        end[has] = np.maximum(end[has], np.maximum.reduceat(read_until, starts[has]))
    live = end >= 0
    alive, end = alive[live], end[live]
    is_saved = saved[alive]
    size = np.where(is_saved, nbytes[alive], s.copy_bytes[alive]).astype(np.int64)
    start = np.array([0 if k else made[int(e)] for e, k in zip(alive, is_saved)], dtype=np.int64)
    if len(away):
        back = {}
        for e in away.tolist():
            read = min([int(s.first_read[e])] + [made[w] for w in cons[e] if recomputed[w] and w in made])
            back[e] = min(read, int(offloads.back_from[e])) if offloads.back_from[e] >= 0 else read
        start = np.array([back.get(int(e), b) for e, b in zip(alive, start)], dtype=np.int64)
    bwd = np.zeros(steps + 1, dtype=np.int64)
    np.add.at(bwd, start, size)
    np.add.at(bwd, end + 1, -size)
    for e, step in made.items():  # a recomputed library kernel's scratch, while its copy is made
        if s.copy_scratch[e] and step < steps:
            bwd[step] += s.copy_scratch[e]
            bwd[step + 1] -= s.copy_scratch[e]
    reused = s.reuse_base.copy()
    last = ((end == s.last_read[alive]) & (size > 0) & (s.reuse[np.minimum(end, steps - 1)] == size) & (end < steps)
            & ~s.no_reuse[alive] & ~(s.undonated[alive] & is_saved))
    reused[end[last]] = True  # read last by the kernel of step `end`, which writes into it
    memory = np.cumsum(bwd)[:steps] + s.base + rng_bytes - np.where(reused, s.reuse, 0)
    others = (s.repeats - 1) * (int(nbytes[kept].sum()) - int(nbytes[away].sum()) + rng_bytes)  # the other runs' saved values
    return Profile(np.cumsum(fwd)[:n] + s.fwd_base + rng_bytes + others, memory + others)


@dataclass(frozen=True)
class Offloads:
    """Saved values kept in host memory between the forward and the backward.

    ``mask`` marks them. Each is freed on the device after forward node ``freed_after[i]`` (the
    wait for its copy; never before its last forward reader, ``fwd_last``) and is there again
    from backward step ``back_from[i]`` (its copy back starting; never after the first step that
    reads it, directly or through a recomputed copy made then). -1 in either: at those readers.
    """

    mask: np.ndarray
    freed_after: np.ndarray
    back_from: np.ndarray

    @classmethod
    def at_readers(cls, mask: np.ndarray) -> "Offloads":
        none = np.full(len(mask), -1, dtype=np.int64)
        return cls(np.asarray(mask, dtype=bool), none, none.copy())


@dataclass(frozen=True, eq=False)
class OffloadWindows:
    """Where each value that may be offloaded would have its copies, fixed before a plan is
    chosen, so that offloading is a third choice of the exact programs (:mod:`solvers.offload`).

    Per candidate ``k``: its node ``nodes[k]`` (a node may have several candidates, its
    windows; a plan takes one at most), the forward node after which the forward waits
    for its copy to host (``freed_after[k]``, not before its last forward reader), the backward
    step from which its copy back is under way (``back_from[k]``, at or before the first step
    that can read it under any plan), and ``seconds[k]``, one copy's time on the link.
    ``link_rows`` keep each direction of the link within its time: per row, the candidates
    whose copies must all run within ``capacity`` seconds (a copy to host starts no sooner than
    its value is made and ends by its wait; a copy back starts no sooner than its step and
    ends by its first reader). ``op_seconds`` is what offloading one value adds to the step
    beside its copies (the host's work on the transfer ops). ``conflicts`` are triples
    ``(k, w, t)``: a recomputed copy of node w reads candidate k's value when it is made, so a
    plan that offloads k does not make that copy by step t (the step before k's copy back).
    ``out_window`` and ``in_window`` give each candidate's windows in estimated seconds from the
    start of the forward and of the backward: when its copy to host may start and must end, and
    when its copy back may start and must end (the start of the span of its first read).
    """

    nodes: np.ndarray
    freed_after: np.ndarray
    back_from: np.ndarray
    seconds: np.ndarray
    link_rows: tuple[tuple[np.ndarray, float], ...] = ()
    op_seconds: float = 0.0
    conflicts: tuple[tuple[int, int, int], ...] = ()
    out_window: np.ndarray | None = None  # per candidate, (made, waited for) in the forward's estimated seconds
    in_window: np.ndarray | None = None  # per candidate, (copy back issued, first read at latest) in the backward's

    def __len__(self) -> int:
        return len(self.nodes)

    def offloads(self, n: int, chosen: np.ndarray) -> Offloads:
        """The :class:`Offloads` of the candidates in ``chosen`` (a mask over candidates) in a
        problem of ``n`` nodes."""
        where = np.asarray(chosen, dtype=bool)
        result = Offloads.at_readers(np.isin(np.arange(n), self.nodes[where]))
        result.freed_after[self.nodes[where]] = self.freed_after[where]
        result.back_from[self.nodes[where]] = self.back_from[where]
        return result


def computed_in_forward(schedule: Schedule, saved: np.ndarray) -> np.ndarray:
    """Per node, whether the emitted forward computes it under a plan saving ``saved`` (the
    pruned mask of :func:`planner.problem.evaluate`): every node not on demand, every saved
    node, and every node an on-demand node it computes reads."""
    computed = ~schedule.on_demand | saved
    needs = schedule.demand_needs
    for i, k in needs[np.argsort(-needs[:, 1], kind="stable")].tolist():  # a reader before what it reads
        if computed[k]:
            computed[i] = True
    return computed


def forward_reads_until(schedule: Schedule, computed: np.ndarray) -> np.ndarray:
    """Per node, the last forward step at which its storage is read when the forward computes
    ``computed`` (:func:`computed_in_forward`): ``fwd_last``, or where an on-demand reader it
    computes reads it later, that reader's step; an on-demand node not computed gets -1."""
    n = len(schedule.owner)
    end = np.where(schedule.on_demand, np.where(computed, np.arange(n), -1), schedule.fwd_last)
    reads = schedule.demand_reads
    active = reads[computed[reads[:, 1]]]
    np.maximum.at(end, active[:, 0], active[:, 2])
    return end


def last_forward_read(schedule: Schedule) -> np.ndarray:
    """Per node, the last forward step that may read its storage under any plan (every
    on-demand reader computed)."""
    return forward_reads_until(schedule, np.ones(len(schedule.owner), dtype=bool))


def with_saved_fusions(schedule: Schedule, saved: np.ndarray) -> Schedule:
    """``schedule`` with the recomputed copies that ``saved`` makes fused
    (:attr:`Schedule.fused_if_saved`) counted fused."""
    when = schedule.fused_if_saved
    on = ((when >= 0) & saved[np.maximum(when, 0)]).any(axis=1)
    if not on.any():
        return schedule
    return replace(schedule, fused=schedule.fused | on, copy_bytes=np.where(on, 0, schedule.copy_bytes))


def made_at(schedule: Schedule, cons: list[list[int]], recomputed: np.ndarray) -> dict[int, int]:
    """Backward step at which each recomputed node's copy is made: its first direct reader, or
    the earliest copy that reads it, whichever comes first; an op's outputs with the op."""
    order = np.flatnonzero(recomputed)[::-1].tolist()
    first_read = schedule.first_read.tolist()
    at: dict[int, int] = {}  # node -> step, filled in reverse topological order
    for e in order:
        m = first_read[e]
        for w in cons[e]:
            v = at.get(w)
            if v is not None and v < m:
                m = v
        at[e] = m
    made_with = schedule.made_with
    return {e: at.get(int(made_with[e]), m) for e, m in at.items()}


def _read_until(schedule: Schedule, cons: list[list[int]], recomputed: np.ndarray, made: dict[int, int]) -> dict[int, int]:
    """Last backward step at which each recomputed node's copy reads its inputs: the step it is
    made at, or for a fused copy, the last kernel that computes it (its last reader's)."""
    until: dict[int, int] = {}
    fused, last_read = schedule.fused.tolist(), schedule.last_read.tolist()
    for e in np.flatnonzero(recomputed)[::-1].tolist():
        m = made[e]
        if fused[e]:
            m = max(m, last_read[e])
            for w in cons[e]:
                v = until.get(w)
                if v is not None and v > m:
                    m = v
        until[e] = m
    return until


REST_OF_STEP = "(rest of the step)"


def with_backward_beside(schedule: Schedule, nbytes: int) -> Schedule:
    """``schedule`` with ``nbytes`` more alive at every backward step: what the step keeps
    beside this graph's backward (the gradients of graphs whose backwards ran before it)."""
    return replace(schedule, base=schedule.base + np.int64(nbytes))


def with_rest_of_step(schedule: Schedule, entry_bytes: int) -> Schedule:
    """``schedule`` with a first backward step at which nothing of this graph is read and
    ``entry_bytes`` are alive besides its saved values: the rest of the training step (later
    graphs, the caller's loss) running between this graph's forward and its backward."""
    return replace(
        schedule,
        first_read=schedule.first_read + 1,
        last_read=np.where(schedule.last_read < 0, -1, schedule.last_read + 1),
        base=np.concatenate(([entry_bytes], schedule.base)).astype(np.int64),
        reuse=np.concatenate(([0], schedule.reuse)).astype(np.int64),
        reuse_base=np.concatenate(([False], schedule.reuse_base)),
        step_names=(REST_OF_STEP, *schedule.step_names),
    )
