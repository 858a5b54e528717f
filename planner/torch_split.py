"""PyTorch's own split of a joint graph (what torch.compile saves at its default budget), as the
planner prices it, and where budget 1.0 takes it over the solver's plan."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch.fx as fx

from planner import _torch_compat
from planner.bounds import named_plan
from planner.decision import Decision, Status, with_plan
from planner.emit import store_narrow_casts
from planner.graph import JointGraph
from planner.memory import convolutions_laid_out, simulate
from planner.problem import Evaluation, InfeasibleDecision, Problem

__all__ = ["FAST_END_CHOICE", "FAST_END_KERNELS", "PYTORCH_KERNELS", "PYTORCH_PEAK", "PYTORCH_SIMULATED_PEAK",
           "PYTORCH_SPLIT_SECONDS", "SPLIT_PEAK_MARGIN", "compiles_as_pytorch", "prefer_pytorch_split",
           "pytorch_modules", "pytorch_split", "pytorch_split_plan"]

PYTORCH_PEAK = "pytorch_split_peak_bytes"  # Decision.stats: the peak of PyTorch's own split of the graph
# Decision.stats: the simulated peak of PyTorch's own modules for the graph (planner.memory.simulate)
PYTORCH_SIMULATED_PEAK = "pytorch_split_simulated_peak_bytes"
PYTORCH_SPLIT_SECONDS = "pytorch_split_seconds"  # Decision.stats: the seconds PyTorch's partitioner took on the graph
PYTORCH_KERNELS = "pytorch_split_kernels"  # Decision.stats: the kernels PyTorch's split runs (Timeline.kernels)


@dataclass(frozen=True)
class _Split:
    """What the planner keeps of PyTorch's split of one graph: what it saves, and the peak of
    its modules simulated as the planner's predictions are."""

    names: list[str]
    simulated_peak: int
    seconds: float  # PyTorch's partitioner's wall time on the graph
    kernels: int = 0  # its modules' kernels (Timeline.kernels)


_PYTORCH_SPLITS: dict[tuple[str, bool], _Split] = {}  # (graph fingerprint, fuse) -> PyTorch's split
# the modules of the split weighed last, by the id of the joint graph they were made of, for the
# compile that planned that very graph to take once instead of splitting it again (one slot, so
# nothing else keeps graphs alive; a graph traced again, as plan() does, is split again)
_LAST_SPLIT_MODULES: dict[int, tuple[JointGraph, fx.GraphModule, fx.GraphModule]] = {}
FAST_END_CHOICE = "fast_end_choice"  # Decision.stats: budget 1.0 took PyTorch's split over the solver's plan, and why
FAST_END_KERNELS = "fast_end_kernels"  # Decision.stats: at budget 1.0, the kernels of the solver's plan and of the split
# Budget 1.0 keeps the solver's plan over PyTorch's split only where it holds clearly less: a
# predicted peak lower by more than the memory model's own tolerance at the fast end (the 3% of
# bench/zoo.py's target (d); measured errors there reach 2.9%). Time estimates do not decide it:
# on an H100, plans of about the split's peak that the roofline priced faster measured 3-32%
# slower than torch.compile (Llama, Qwen2, T5, ResNet-50, ConvNeXt, EfficientNet: inductor fuses
# the split's recomputation into kernels it runs anyway, and a host-bound step pays per kernel),
# while the split compiled the planner's way measured as torch.compile does. The split is what
# torch.compile runs at its default budget, which recomputes only cheap fusible ops. Nor is a plan
# that holds clearly less kept where it is estimated slower than the split: on an H200, Qwen2's
# plan 7% under the split's peak, estimated slower, measured 1.035x torch.compile's time.
SPLIT_PEAK_MARGIN = 0.03


def prefer_pytorch_split(problem: Problem, decision: Decision, split: Evaluation,
                         simulated: tuple[int, int] | None = None, kernels: tuple[int, int] | None = None) -> Decision:
    """``decision``, or at budget 1.0 PyTorch's own ``split`` where the solver's plan does not hold
    clearly less (:data:`SPLIT_PEAK_MARGIN`) or is estimated slower than the split (the solver's
    fast end may give up a little time for bytes, :data:`planner.bounds.FAST_END_SLACK`; against
    the split, which torch.compile runs, it may not). The solver is still named, as what ran;
    ``stats["fast_end_choice"]`` says the split was taken and why, with the solver's plan's
    figures, and the status is ``heuristic`` (the split is no optimum of the objective; ``gap``
    bounds it where the solver's gap is known).

    Budget 1.0 resolves to the lower of the fast end's peak and the split's, so where the fast
    end holds a little less (GPT-2's loss head, by 0.05% on an H100's prices) the split is over
    that budget; it is still taken, the budget being the split's peak then, since a fraction
    names no bytes: the margin alone decides.

    ``simulated``: the peaks of the solver's plan and of the split as the planner predicts them
    (:func:`planner.memory.simulate` of the modules each compiles: the emitter's, and PyTorch's
    own), which the margin then compares instead of the problem's figures. The problem prices
    the split through the forward nodes its saved values are named by, which can hold more than
    PyTorch's modules do (on an H100, Qwen2's split was priced 5% over torch.compile's measured
    peak, and the solver's plan, 0.2% under it as measured, ran 1.4% slower).

    ``kernels``: the kernels the solver's plan and the split run (:func:`planner.memory.kernel_count`
    of each one's modules). A plan that runs more than the split gives way to it however it is
    priced: each extra kernel reads again what it recomputes, where the estimates had it fused, and
    pays a launch on a step the host may bound. On an H200, Gemma2's plan 19% under the split's
    peak, priced 26% cheaper in recomputation, ran 411 launches against torch.compile's 374 and
    1.038x its time (GPU busy 1.077x); the solver's plans that stood and ran faster ran fewer
    (T5: 667 against 805, 0.78-0.88x), and Mixtral's, 1.04-1.08x, more (409 against 391)."""
    ours, theirs = simulated if simulated is not None else (decision.peak_bytes, split.peak_bytes)
    figures = "simulated" if simulated is not None else "by the problem"
    smaller = ours < (1 - SPLIT_PEAK_MARGIN) * theirs
    more_kernels = kernels is not None and kernels[0] > kernels[1]
    counted = {} if kernels is None else {FAST_END_KERNELS: {"solver": kernels[0], "split": kernels[1]}}
    if smaller and decision.seconds <= split.seconds and not more_kernels:
        return replace(decision, stats={**decision.stats, **counted})
    bound = None if decision.gap is None else decision.seconds * (1 - decision.gap)
    gap = None if bound is None else (0.0 if split.seconds <= 0 else max(0.0, 1 - bound / split.seconds))
    if not smaller:
        reason = f"not {SPLIT_PEAK_MARGIN:.0%} less; closer than that, the estimates cannot tell the two apart"
    elif decision.seconds > split.seconds:
        reason = "estimated slower: budget 1.0 buys no memory with time"
    else:
        reason = (f"but runs {kernels[0]} kernels against the split's {kernels[1]}: budget 1.0 buys no memory "
                  "with kernels the estimates take as fused")
    why = (f"the solver's plan ({decision.status}) held {ours} bytes ({figures}) at an estimated "
           f"{decision.seconds:.3g} s against the split's {theirs} at {split.seconds:.3g} s, " + reason)
    if split.peak_bytes > decision.budget_bytes:
        why += f"; the budget is the split's peak, over the fast end's {decision.budget_bytes} bytes"
    return with_plan(problem, decision, split, budget_bytes=max(decision.budget_bytes, split.peak_bytes),
                      status=Status.HEURISTIC, gap=gap,
                      stats={**decision.stats, **counted, FAST_END_CHOICE: {"plan": "pytorch split", "why": why,
                                                                 "solver_peak_bytes": decision.peak_bytes,
                                                                 "solver_seconds": decision.seconds,
                                                                 "solver_status": decision.status,
                                                                 "compared": {"solver": ours, "split": theirs,
                                                                              "figures": figures}}})


def compiles_as_pytorch(decision: Decision) -> bool:
    """Whether a graph planned with ``decision`` is split by PyTorch's own partitioner and
    compiled as torch.compile compiles it (inductor's own settings; :func:`planner._torch_compat.
    pytorch_split_modules`): where budget 1.0 took PyTorch's split (:func:`prefer_pytorch_split`)
    and nothing is offloaded. The plan is then torch.compile's step, not a copy of it made by the
    emitter: on an H100, the split emitted by the planner and compiled with the planner's inductor
    settings measured up to 4% slower than torch.compile's (GPT-2 at 1.0, 13.7 against 13.2 ms)."""
    return decision.stats.get(FAST_END_CHOICE, {}).get("plan") == "pytorch split" and not decision.offloaded


def pytorch_modules(joint: JointGraph, problem: Problem,
                     decision: Decision) -> tuple[fx.GraphModule, fx.GraphModule] | None:
    """PyTorch's partitioner's own split of ``joint`` (:func:`compiles_as_pytorch`): the modules
    weighed when this graph's plan was made, where they were the last weighed (the same call on
    the same graph, so the same modules), else split again. None, with a warning, where that
    fails here, or where the split saves other values than ``decision`` (a plan file made with
    another torch): the planner then emits the decision's saved set itself, compiled its own way."""
    weighed = _LAST_SPLIT_MODULES.pop(id(joint), None)  # the slot holds its graph: the id names no other
    if weighed is not None:
        return weighed[1:]
    try:
        forward, backward, names = _split_of(joint, problem, fuse=True)
        saved = named_plan(problem, names).saved
    except Exception as err:  # PyTorch's partitioner is private; the plan stands without it
        warnings.warn(f"PyTorch's partitioner failed to split this graph ({type(err).__name__}: {err}); the planner "
                      "emits PyTorch's saved set itself, compiled with the planner's inductor settings", stacklevel=2)
        return None
    theirs = {problem.names[i] for i in np.flatnonzero(saved)}
    if theirs != set(decision.saved):
        warnings.warn(f"PyTorch's split of this graph saves other values than the plan, which took that split "
                      f"({len(theirs ^ set(decision.saved))} differ; a plan file made with another torch?); the "
                      "planner emits the plan's saved set itself, compiled with the planner's inductor settings",
                      stacklevel=2)
        return None
    return forward, backward


def pytorch_split(joint: JointGraph, problem: Problem, fuse: bool = True) -> tuple[Evaluation | None, dict[str, Any]]:
    """PyTorch's own split of ``joint`` (``torch.compile``'s at its default budget) as the
    planner prices it, and what the decision's stats say of it: ``{PYTORCH_PEAK: peak bytes,
    PYTORCH_SIMULATED_PEAK: its modules' simulated peak}``, or where that split cannot be had or
    read as a plan of ``problem``, ``(None, {"pytorch_split": why})`` (a warning says so, and
    budget 1.0 is the planner's own fast end)."""
    try:
        found = _pytorch_split(joint, problem, fuse)
        split = named_plan(problem, found.names)
    except InfeasibleDecision as err:  # the split recomputes what must not be (a read of a buffer the step updates)
        warnings.warn(f"PyTorch's own split of this graph is not taken: {err}; budget 1.0 is the planner's fast end "
                      "alone (fast_end='model')", stacklevel=2)
        return None, {"pytorch_split": f"not taken ({err})"}
    except Exception as err:  # PyTorch's partitioner is private and may fail on graphs the planner takes
        why = f"{type(err).__name__}: {err}"
        warnings.warn(f"PyTorch's own split of this graph failed ({why}); budget 1.0 is the planner's fast end "
                      "alone (fast_end='model')", stacklevel=2)
        return None, {"pytorch_split": f"failed ({why})"}
    return split, {PYTORCH_PEAK: split.peak_bytes, PYTORCH_SIMULATED_PEAK: found.simulated_peak,
                   PYTORCH_SPLIT_SECONDS: found.seconds, PYTORCH_KERNELS: found.kernels}


def pytorch_split_plan(joint: JointGraph, problem: Problem, fuse: bool = True) -> Evaluation:
    """PyTorch's own split of ``joint`` as a plan of ``problem``: what it saves, named by the
    forward nodes of ``problem`` (a ``detach`` it moved into the forward by the node it reads;
    :func:`planner.bounds.named_plan` takes views to their bases)."""
    return named_plan(problem, _pytorch_split(joint, problem, fuse).names)


def _pytorch_split(joint: JointGraph, problem: Problem, fuse: bool) -> _Split:
    """PyTorch's split of ``joint`` as handed over (:meth:`JointGraph.given_module`), split once
    per graph in a process (kept by fingerprint: a notebook sweeping budgets, a graph planned
    again for the step seen); ``fuse`` as for :func:`planner.memory.simulate`."""
    key = (joint.fingerprint, fuse)
    found = _PYTORCH_SPLITS.get(key)
    if found is None:
        start = time.perf_counter()
        forward, backward, names = _split_of(joint, problem, fuse)
        seconds = time.perf_counter() - start
        timeline = simulate(forward, backward, joint.num_fwd_outputs, fuse=fuse)
        found = _Split(names, timeline.peak, seconds, timeline.kernels)
        _PYTORCH_SPLITS[key] = found
        _LAST_SPLIT_MODULES.clear()
        _LAST_SPLIT_MODULES[id(joint)] = joint, forward, backward
    return found


def _split_of(joint: JointGraph, problem: Problem,
              fuse: bool) -> tuple[fx.GraphModule, fx.GraphModule, list[str]]:
    """PyTorch's partitioner's modules for ``joint`` as handed over, with inductor's arguments
    (:attr:`JointGraph.partition_kwargs`), and what they save, named by nodes of ``problem``.
    With ``fuse``, their widening casts that inductor would store read their narrow input
    stored instead, as the emitter's do (:func:`planner.emit.store_narrow_casts`)."""
    forward, backward = _torch_compat.pytorch_split_modules(joint.given_module(), list(joint.joint_inputs),
                                                            joint.num_fwd_outputs, **joint.partition_kwargs)
    names, inputs = problem.names, problem.inputs
    inputs_of = {name: [names[k] for k in inputs[i]] for i, name in enumerate(names)}
    saved = _torch_compat.split_saved_names(forward, backward, known=set(names), inputs_of=inputs_of)
    if fuse:
        store_narrow_casts(forward, backward, convolutions_laid_out([*joint.primals, *joint.forward_nodes]))
    return forward, backward, saved
