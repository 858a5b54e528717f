"""The torch-free planning problem: which forward values to save, which to recompute.

A :class:`Problem` holds one row per node of the forward region of a joint graph, as numpy
arrays. Solvers see nothing else, so they can be tested on synthetic graphs. The functions here
define what a decision *means* (which nodes get recomputed, how many bytes stay alive, how many
seconds recomputation costs); every solver's reported figures come from :func:`evaluate`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable
from functools import cached_property

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order

from planner.errors import PlannerError
from planner.schedule import Offloads, Profile, Schedule, consumers, profile

__all__ = ["Problem", "Evaluation", "InfeasibleDecision", "evaluate", "evaluate_names", "evaluations", "memory_profile",
           "offloads_of"]


class InfeasibleDecision(PlannerError):
    """A set of saved nodes from which the backward cannot get a value it needs."""


@dataclass(frozen=True, eq=False)
class Problem:
    """Forward-region nodes of a joint graph, in topological order.

    Attributes
    ----------
    names : node names, unique.
    nbytes : bytes of storage kept alive if the node is saved (0 for views and tuples).
    runtime : seconds to run the node once (0 for views and getitems).
    saveable : the node owns a tensor storage (or is a SymInt) that can be saved.
    recomputable : the node may be run again in the backward. False for side effects
        (mutations, collectives, opaque calls); ``must_save_reason`` says why.
    random : the node draws from the RNG; recomputing it also keeps ``rng_state_bytes`` alive.
    needed : the backward reads the node directly.
    input_ptr, input_idx : CSR adjacency, the forward-region inputs of node i are
        ``input_idx[input_ptr[i]:input_ptr[i+1]]`` (primals are always available and not listed).
    schedule : lifetimes over the step, for peak memory (:mod:`planner.schedule`). Without one,
        a single backward step reads every needed node, so a plan's peak is its saved bytes.
    save_seconds : seconds that saving the node adds to the step (its write in the forward and
        read in the backward, where the estimator prices memory traffic); zeros if not given.
    """

    names: tuple[str, ...]
    nbytes: np.ndarray
    runtime: np.ndarray
    saveable: np.ndarray
    recomputable: np.ndarray
    random: np.ndarray
    needed: np.ndarray
    input_ptr: np.ndarray
    input_idx: np.ndarray
    rng_state_bytes: int = 16
    must_save_reason: dict[int, str] = field(default_factory=dict)
    targets: tuple[str, ...] = ()
    fingerprint: str = ""
    schedule: Schedule | None = None
    save_seconds: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.names)
        if self.save_seconds is None:
            object.__setattr__(self, "save_seconds", np.zeros(n, dtype=np.float64))
        for name in ("nbytes", "runtime", "saveable", "recomputable", "random", "needed", "save_seconds"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Problem.{name} has {len(getattr(self, name))} rows, expected {n}")
        if len(self.input_ptr) != n + 1:
            raise ValueError("Problem.input_ptr must have one more entry than there are nodes")
        if np.any(self.input_idx >= np.repeat(np.arange(n), np.diff(self.input_ptr))):
            raise ValueError("Problem nodes must be in topological order (an input comes after its user)")
        blocked = self.needed & ~self.saveable & ~self.recomputable
        if blocked.any():
            i = int(np.flatnonzero(blocked)[0])
            raise ValueError(f"node {self.names[i]} is needed by the backward but can be neither saved nor recomputed")
        if self.schedule is None:
            object.__setattr__(self, "schedule", Schedule.saved_bytes_only(self.needed))
        self.schedule.check(n)

    def __len__(self) -> int:
        return len(self.names)

    @cached_property
    def inputs(self) -> list[np.ndarray]:
        """Per node, the indices of its forward-region inputs."""
        return np.split(self.input_idx, self.input_ptr[1:-1])

    def index(self, names) -> np.ndarray:
        """Indices of the named nodes."""
        lookup = self._index_of
        try:
            return np.array([lookup[n] for n in names], dtype=np.int64)
        except KeyError as err:
            raise InfeasibleDecision(f"node {err.args[0]!r} is not a node of this problem") from None

    @cached_property
    def consumers(self) -> list[list[int]]:
        """Per node, the non-view nodes that read its storage (:func:`planner.schedule.consumers`)."""
        return consumers(self.inputs, self.schedule.owner)

    @cached_property
    def _index_of(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def mask(self, indices) -> np.ndarray:
        m = np.zeros(len(self), dtype=bool)
        m[np.asarray(list(indices), dtype=np.int64)] = True
        return m


@dataclass(frozen=True)
class Evaluation:
    """What a set of saved nodes costs.

    ``saved`` is pruned to the nodes the backward actually reads (directly, or as inputs of a
    recomputation); ``memory_bytes`` counts them plus one RNG state per recomputed random node;
    ``peak_bytes`` is the plan's peak memory over the step (:func:`memory_profile`);
    ``save_seconds`` is what writing and reading back the saved values costs. The objective
    every solver minimises is ``seconds``, recomputation plus saving.
    """

    saved: np.ndarray
    recomputed: np.ndarray
    memory_bytes: int
    recompute_seconds: float
    peak_bytes: int
    save_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        """The plan's objective: recompute seconds plus save seconds."""
        return self.recompute_seconds + self.save_seconds


# Plans evaluated in this process, and their problems' nodes summed: the work a search limited
# by work rather than the wall clock counts (:mod:`solvers.clock`).
_EVALUATED = [0, 0]


def evaluations() -> tuple[int, int]:
    """How many plans this process has evaluated (:func:`evaluate`), and their nodes summed."""
    return _EVALUATED[0], _EVALUATED[1]


def evaluate(problem: Problem, saved: np.ndarray, offloads: Offloads | None = None) -> Evaluation:
    """Follow the backward's needs from a saved set: what must be recomputed, and what it costs.

    Parameters
    ----------
    problem : Problem
    saved : bool array, one entry per node; True where the node is saved.
    offloads : saved nodes kept in host memory between the forward and the backward, and when
        (:class:`planner.schedule.Offloads`); the peak counts them off the device there.

    Raises
    ------
    InfeasibleDecision
        If the backward needs a node that is neither saved nor recomputable, or a saved node
        cannot be saved (a view: save its base instead).
    """
    _EVALUATED[0] += 1
    _EVALUATED[1] += len(problem)
    saved = np.asarray(saved, dtype=bool)
    if saved.shape != (len(problem),):
        raise InfeasibleDecision(f"decision has {saved.shape[0]} entries, the problem {len(problem)} nodes")
    bad = saved & ~problem.saveable
    if bad.any():
        raise InfeasibleDecision(f"node {problem.names[int(np.flatnonzero(bad)[0])]} cannot be saved (it owns no storage)")
    reached = _reached(problem, saved)
    used, recomputed = reached & saved, reached & ~saved
    blocked = recomputed & ~problem.recomputable
    if blocked.any():
        i = int(np.flatnonzero(blocked)[-1])
        raise InfeasibleDecision(
            f"node {problem.names[i]} is needed by the backward but is not saved and cannot be "
            f"recomputed ({problem.must_save_reason.get(i, 'not recomputable')})"
        )
    memory = int(problem.nbytes[used].sum()) + _rng_bytes(problem, recomputed)
    if offloads is not None and (offloads.mask & ~saved).any():
        i = int(np.flatnonzero(offloads.mask & ~saved)[0])
        raise InfeasibleDecision(f"node {problem.names[i]} is offloaded but not saved; only saved values can be offloaded")
    peak = _profile(problem, used, recomputed, offloads).peak
    return Evaluation(used, recomputed, memory, float(problem.runtime[recomputed].sum()), peak,
                      float(problem.save_seconds[used].sum()))


def _reached(problem: Problem, saved: np.ndarray) -> np.ndarray:
    """Nodes the backward reaches from what it reads, through the inputs of the nodes it
    recomputes (a saved node is reached, its inputs are not): a breadth-first search from a
    source linked to every needed node, over the input edges of the nodes not saved."""
    n = len(problem)
    lengths = np.diff(problem.input_ptr)
    needed = np.flatnonzero(problem.needed)
    kept = np.repeat(~saved, lengths)
    indices = np.concatenate((problem.input_idx[kept], needed))
    indptr = np.concatenate(([0], np.cumsum(np.where(saved, 0, lengths)), [len(indices)]))
    graph = csr_matrix((np.ones(len(indices), dtype=np.int8), indices, indptr), shape=(n + 1, n + 1))
    reached = np.zeros(n + 1, dtype=bool)
    reached[breadth_first_order(graph, n, directed=True, return_predecessors=False)] = True
    return reached[:n]


def memory_profile(problem: Problem, plan: Evaluation, offloads: Offloads | None = None) -> Profile:
    """Memory at every forward and backward step of an evaluated plan, bytes (with
    ``offloads``, those saved values off the device between their transfers)."""
    return _profile(problem, plan.saved, plan.recomputed, offloads)


def _rng_bytes(problem: Problem, recomputed: np.ndarray) -> int:
    return problem.rng_state_bytes * int((recomputed & problem.random).sum())


def _profile(problem: Problem, saved: np.ndarray, recomputed: np.ndarray, offloads: Offloads | None = None) -> Profile:
    rng = _rng_bytes(problem, recomputed)
    return profile(problem.schedule, problem.inputs, problem.nbytes, saved, recomputed, rng, problem.consumers, offloads)


def evaluate_names(problem: Problem, saved: Iterable[str], offloaded: Iterable[str] = (),
                   transfers: dict[str, list] | None = None) -> Evaluation:
    """:func:`evaluate` for a decision given as the names of its saved (and offloaded) nodes;
    ``transfers`` as :attr:`planner.decision.Decision.transfers` (names of a forward node and a
    backward step; others count as at the value's readers).

    Raises
    ------
    InfeasibleDecision
        If a name is not a node of the problem, or as :func:`evaluate`.
    """
    offloads = offloads_of(problem, offloaded, transfers)
    return evaluate(problem, problem.mask(problem.index(saved)), offloads)


def offloads_of(problem: Problem, offloaded: Iterable[str], transfers: dict[str, list] | None = None) -> Offloads | None:
    """The :class:`~planner.schedule.Offloads` of offloaded names and their transfers (as
    :attr:`planner.decision.Decision.transfers`), or None when nothing is offloaded."""
    offloaded = list(offloaded)
    if not offloaded:
        return None
    offloads = Offloads.at_readers(problem.mask(problem.index(offloaded)))
    steps = {name: t for t, name in enumerate(problem.schedule.step_names)}
    for name, (wait_after, reload_before) in (transfers or {}).items():
        i = problem._index_of.get(name)
        if i is not None and offloads.mask[i]:
            offloads.freed_after[i] = problem._index_of.get(wait_after, -1)
            offloads.back_from[i] = steps.get(reload_before, -1)
    return offloads
