"""Turn a joint graph and an estimator into a torch-free :class:`~planner.problem.Problem`."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
import torch.fx as fx

from estimators.base import Estimator
from planner.graph import JointGraph
from planner.memory import build_schedule, constant_inlined, convolutions_laid_out, freed_output_roots, graph_unchanged
from planner.schedule import with_backward_beside, with_rest_of_step
from planner.ops import aliased_input, first_tensor, is_getitem, is_random, side_effect, storage_bytes
from planner.problem import Problem
from planner.workspace import measure_workspaces

__all__ = ["build_problem", "estimate_step_seconds", "hands_on"]

_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


def build_problem(joint: JointGraph, estimator: Estimator, fuse: bool = False, repeats: int = 1,
                  rest_bytes: int | None = None, beside_backward: int = 0) -> Problem:
    """One row per forward-region node: bytes, runtime, what may be done with it, and when
    each value is alive (its :class:`~planner.schedule.Schedule`; ``fuse`` for inductor;
    ``repeats``: times the graph's forward runs before its backward in one step).

    A graph that hands its outputs on (:func:`hands_on`) keeps its saved values through the
    rest of the step, which runs between its forward and its backward: later graphs (DDP's
    graph per bucket, graph breaks) or the caller's loss. The schedule gets a step for it
    (:func:`planner.schedule.with_rest_of_step`) at which the rest of the step needs
    ``rest_bytes`` (what a step was seen to need there), or, before a step has been seen, this
    graph's own least peak (the frugal reference's): saving more then costs memory however low
    the graph's own peak is, so a budget orders what it holds for the rest of the step. A graph
    that runs several times before its backward gets that step only once a step has been seen
    (its other runs count before): all its runs' saved values and kept outputs are alive there,
    as they are while the graphs after a model's repeated layers run (a layer resumed after a
    graph break, an encoder's layers under a decoder's).
    ``beside_backward`` bytes are alive at every step of its backward besides its own (the
    gradients that graphs whose backwards ran before it leave, once a step has been seen).

    Views and getitems cost nothing to recompute and are never saved (their base is), nor, with
    ``fuse``, is a constant (``iota``, ``full``...) that inductor computes inside every kernel
    reading it: saving it would only add loads to those kernels (and can make inductor store a
    large intermediate they share, see :mod:`planner.memory`). Random ops
    are recomputable by replaying their saved RNG state (where the replay can tell their device);
    side-effecting ops (mutations,
    collectives, opaque calls) and symbolic sizes are never recomputed.
    """
    nodes = joint.forward_nodes
    index = {node: i for i, node in enumerate(nodes)}
    made_in_forward = {node for node in nodes if not backward_born(node)}  # the others run in the backward unless saved
    needed = set(joint.needed_by_backward)
    n = len(nodes)
    estimator.prepare(nodes)
    # library kernels' scratch memory, which the schedule counts
    measure_workspaces((node for node in joint.graph.nodes if node.op == "call_function"), fuse=fuse,
                       channels_last=fuse and convolutions_laid_out([*joint.primals, *nodes]))
    nbytes = np.zeros(n, dtype=np.int64)
    runtime = np.zeros(n, dtype=np.float64)
    save_seconds = np.zeros(n, dtype=np.float64)
    saveable = np.zeros(n, dtype=bool)
    recomputable = np.zeros(n, dtype=bool)
    random = np.zeros(n, dtype=bool)
    reasons: dict[int, str] = {}
    ptr, idx = [0], []
    with graph_unchanged():  # the estimator's questions of the graph, each answered once
        for i, node in enumerate(nodes):
            val = node.meta.get("val")
            view = aliased_input(node) is not None
            if isinstance(val, torch.Tensor) and not view:
                saveable[i], nbytes[i] = not (fuse and constant_inlined(node)), storage_bytes(val)
            reason = _never_recompute(node, val, joint.mutated_primals)
            if reason is None:
                recomputable[i] = True
            else:
                reasons[i] = reason
                saveable[i] = saveable[i] or isinstance(val, _SYM)
            if saveable[i] and nbytes[i]:
                save_seconds[i] = estimator.save_seconds(node, made_in_forward)
            random[i] = is_random(node)
            runtime[i] = (0.0 if view or is_getitem(node) or backward_born(node)
                          else estimator.recompute_seconds(node, made_in_forward))
            idx.extend(index[inp] for inp in node.all_input_nodes if inp in index)
            ptr.append(len(idx))
    problem = Problem(
        names=tuple(node.name for node in nodes),
        nbytes=nbytes,
        runtime=runtime,
        saveable=saveable,
        recomputable=recomputable,
        random=random,
        needed=np.array([node in needed for node in nodes], dtype=bool),
        input_ptr=np.array(ptr, dtype=np.int64),
        input_idx=np.array(idx, dtype=np.int64),
        rng_state_bytes=_rng_state_bytes(nodes),
        must_save_reason=reasons,
        targets=tuple(str(node.target) for node in nodes),
        fingerprint=joint.fingerprint,
        schedule=with_backward_beside(replace(build_schedule(joint, fuse), repeats=repeats), beside_backward),
        save_seconds=save_seconds,
    )
    if (repeats == 1 or rest_bytes is not None) and hands_on(joint):
        problem = _with_rest_of_step(problem, rest_bytes, _released_bytes(joint), repeats)
    return problem


def backward_born(node: fx.Node) -> bool:
    """A forward value AOTAutograd made for the backward (:func:`planner.graph.JointGraph`
    moves it to the forward region): no forward output needs it, so it is computed once
    whatever the plan, in the forward when saved, in the backward when not; recomputing it
    costs nothing more."""
    return node.meta.get("partitioner_tag") == "is_backward"


def hands_on(joint: JointGraph) -> bool:
    """Whether more of the step runs between the graph's forward and its backward: no forward
    output is a one-element floating tensor (a loss, whose backward begins as soon as it is
    computed), so the outputs go on to other graphs or to the caller. A graph that runs several
    times before its backward (``repeats``) counts its other runs instead."""
    return not any(
        isinstance(out, fx.Node) and isinstance(val := out.meta.get("val"), torch.Tensor)
        and val.is_floating_point() and val.numel() == 1
        for out in joint.fwd_outputs
    )


def _with_rest_of_step(problem: Problem, rest_bytes: int | None = None, released: int = 0,
                       repeats: int = 1) -> Problem:
    """``problem`` with the rest of the step between its forward and its backward, needing
    ``rest_bytes``, else the graph's own least peak (see :func:`build_problem`); alive with it
    are the graph's outputs (``released``: the bytes of those the caller frees before the
    backward, which the schedule does not hold), the outputs its other ``repeats`` kept, and
    the input copies its backward reads (the schedule adds the other runs' saved values)."""
    from solvers.reference import reference_plan

    s = problem.schedule
    own = s.owns
    kept = int(problem.nbytes[own & s.held.astype(bool)].sum())
    rest = reference_plan(problem).peak_bytes if rest_bytes is None else rest_bytes
    entry = repeats * kept + released + int(s.fwd_base[-1] if len(s.fwd_base) else 0) + rest
    return replace(problem, schedule=with_rest_of_step(s, entry))


def _released_bytes(joint: JointGraph) -> int:
    """Bytes of the forward outputs the caller frees before the backward
    (:func:`planner.memory.freed_output_roots`; an input's storage is not freed)."""
    return sum(storage_bytes(r.meta["val"]) for r in freed_output_roots(joint)
               if r.op != "placeholder" and isinstance(r.meta.get("val"), torch.Tensor))


def _never_recompute(node: fx.Node, val: object, mutated: frozenset[fx.Node]) -> str | None:
    reason = side_effect(node)
    if reason is not None:
        return reason
    if any(inp in mutated for inp in node.all_input_nodes):
        return "reads an input the step mutates (such as BatchNorm running statistics)"
    if isinstance(val, _SYM):
        return "symbolic size, passed to the backward as a number"
    if node.meta.get("partitioner_tag") == "must_be_in_forward":
        return "tagged must_be_in_forward by AOTAutograd"
    if is_random(node) and _device(val) not in ("cpu", "cuda"):
        return f"random op on {_device(val)}, whose RNG state cannot be replayed"
    if is_random(node) and not _replay_finds_device(node):
        return "random op naming its device by position, whose RNG state torch cannot replay"
    return None


def _replay_finds_device(node: fx.Node) -> bool:
    """Whether torch's RNG-state replay can tell a random op's device: from a ``device`` keyword or a
    tensor argument (inductor's per-step seeds, ``prims.inductor_seeds(count, device)``, have neither)."""
    return node.kwargs.get("device") is not None or any(
        isinstance(a.meta.get("val"), torch.Tensor) for a in node.all_input_nodes)


def _device(val: object) -> str | None:
    tensor = first_tensor(val)
    return tensor.device.type if tensor is not None else None


def _rng_state_bytes(nodes: list[fx.Node]) -> int:
    """Bytes of one saved RNG state: 16 on CUDA (seed and offset), the generator state on CPU."""
    devices = {_device(node.meta.get("val")) for node in nodes if is_random(node)}
    sizes = [16 if d == "cuda" else torch.get_rng_state().numel() for d in devices]
    return max(sizes, default=16)


def estimate_step_seconds(joint: JointGraph, estimator: Estimator) -> float:
    """Estimated runtime of the whole training step without recomputation, seconds."""
    nodes = [node for node in joint.graph.nodes
             if node.op == "call_function" and not is_getitem(node) and aliased_input(node) is None]
    estimator.prepare(nodes)
    with graph_unchanged():
        return sum(estimator.runtime(node) for node in nodes)
