"""The planner as a torch.compile backend: every joint graph is planned, then split and compiled."""
from __future__ import annotations

import os
import sys
import warnings
import weakref
from functools import wraps
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn

from planner import _torch_compat
from planner.build import hands_on
from planner.tracing import make_backend
from planner.config import PlannerConfig
from planner.decisions import KEY, keep_decision
from planner.distributed import world
from planner.emit import Transfer, emit
from planner.errors import PlanFileError
from planner.frames import own_forward, own_frame
from planner.graph import JointGraph, copy_module
from planner.memory import Timeline, saved_outputs, simulate, stores_against_inductor
from planner.peak_polish import restore_polish_drops
from planner.solve import GraphPlan, solve_graph
from planner.torch_split import compiles_as_pytorch, pytorch_modules
from planner.units import format_bytes

__all__ = ["backend", "compile", "compile_blocks", "named_backend", "named_plans", "PlannerBackend"]


def autocast_state() -> tuple[tuple[str, torch.dtype], ...]:
    """The ``torch.autocast`` in force: ``(device type, type)`` per device type it is on for."""
    return tuple((device, torch.get_autocast_dtype(device)) for device in ("cpu", "cuda")
                 if torch.is_autocast_enabled(device))


def _autocast_text(state: tuple[tuple[str, torch.dtype], ...]) -> str:
    if not state:
        return "outside torch.autocast"
    return "inside " + " and ".join(f"torch.autocast({device!r}, dtype={dtype})" for device, dtype in state)


@dataclass
class _Part:
    """What the backend keeps of one part of the step to plan it again: the graph dynamo gave
    it, its joint graph, its place in ``graphs``, and how it was planned."""

    gm: fx.GraphModule | None
    joint: JointGraph | None = None
    index: int = -1
    repeats: int = 1
    rest_bytes: int | None = None
    beside_backward: int = 0
    grad_bytes: int | None = None  # gradients one run's backward leaves in leaf tensors (parameters), from a real run
    # every leaf tensor its runs of a step read, by storage: their gradients are all alive once
    # the runs' backwards are done (a layer compiled once and run for each layer of a model)
    grad_leaves: dict = field(default_factory=dict)
    seen: bool = False  # planned again for a step seen (or found right as it was)
    plan: GraphPlan | None = None  # the plan its compile for the step seen uses
    # places of the outputs a run's caller had freed when its backward began (None: not seen yet),
    # and the emitted modules kept until then to count its memory again (planner.memory.simulate)
    released: tuple[int, ...] | None = None
    simulated: tuple | None = None
    waiting: Any = ()  # its compiled graph's runs waiting for their backward (_CountedRuns.waiting)
    last_step: int | None = None  # the backend's count of steps at its latest training run
    # bytes alive as its runs began that no planned graph holds (code outside the compiled graphs),
    # measured on a CUDA device in the step ``outside_step`` (PlannerBackend._measure_outside)
    outside: int = 0
    outside_step: int | None = None
    # where planned again with the polish's saves restored (restore_polish_drops): the compiled
    # graph, plan, timeline, emitted modules and code report it replaced, and that code's peak
    restored_from: tuple | None = None


# A frame compiled this many times is warned about (:meth:`PlannerBackend._warn_on_recompiles`):
# its inputs' shapes keep changing, and each shape is planned on its own.
RECOMPILES_WARNED = 3


class PlannerBackend:
    """A torch.compile backend that plans each joint graph it is given.

    With ``fixed`` set, the graph must be the one that plan was made for (same fingerprint) and
    no solver runs. ``graphs`` lists a :class:`GraphPlan` per planned graph, in compile order,
    and ``timelines`` the simulated memory of each emitted pair of modules.

    ``repeats`` is how many times each of its graphs runs its forward before its backward in one
    step (:func:`compile_blocks` gives the number of blocks). The compiled graphs count it as
    they run, in the first :data:`COUNTED_STEPS` steps: ``runs`` holds, per part of the step,
    the most runs seen waiting for their backward at once.

    A graph is planned as it compiles, before the graphs after it in the step exist. Once a step
    has run (``config.replan``), the first run of a graph after its own backward began plans it
    again for what that step showed: the times it ran before its backward, and, for a graph that
    hands its outputs on, what the graphs after it needed while its saved values waited
    (:meth:`rest_after`) instead of its own least peak. Where the plan changes, the graph is
    compiled again (once) and the new modules run from then on; ``replanned`` lists those parts.
    That plan also gets back the saves budget 0's polish dropped where the code inductor wrote for
    the graph, counted stored where the memory model fused (:meth:`compiled_timelines`), holds
    more than :data:`STORES_TOLD` over the plan's peak and more than the plan with them saved is
    predicted to (:func:`restore_polish_drops`).

    ``whole_model`` (set by :func:`compile`): the backend compiles a whole model, where a graph
    run more often than it was planned for is a frame a graph break resumes in, run once per
    layer; it is planned again for its runs without a warning (a warning still says when it
    cannot be, and for blocks compiled one by one, names :func:`compile_blocks`).

    ``fusions_refused`` (``refused``, ``refused_across``) counts, over its compiled graphs, the
    fusions inductor would have made in planned backwards that the compile guard refused
    (:func:`planner._torch_compat.fusion_distance_guard`; inductor codegen only).

    ``kept`` holds, per planned graph (as ``graphs``), what inductor's code for each of its
    phases compiled so far keeps (:func:`planner._torch_compat.kept_buffers`), and
    :meth:`stores_against_inductor` where that differs from the simulation.
    """

    def __init__(self, config: PlannerConfig, fixed: GraphPlan | None = None, repeats: int = 1) -> None:
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            from planner.errors import ConfigError

            raise ConfigError(f"repeats={repeats!r} is invalid; give the number of times a graph runs before its "
                              "backward in one step (a positive int, 1 for a model compiled whole)")
        self._given = None  # the config before torch.compile's mode and options, once they came
        self.fixed = fixed
        # with ``fixed``: the autocast the plan's graph was captured under, and the one of the
        # graph compiling now (a new autocast makes another graph: its casts and saved bytes),
        # read as dynamo hands the graph over: AOTAutograd partitions it with autocast off
        self.fixed_autocast = self._autocast = autocast_state()
        self.repeats = repeats
        self.runs: dict[Any, int] = {}
        self.graphs: list[GraphPlan] = []
        self.timelines: list[Timeline] = []
        self.kept: list[dict[str, Any]] = []
        # per planned graph, copies of its emitted modules as simulated (inductor rewrites its own)
        self._emitted: list[list | None] = []
        # per planned graph, its latest compiled timeline, with the emitted modules and facts it was simulated for
        self._compiled_seen: dict[int, tuple] = {}
        self.replanned: list[Any] = []
        # per graph whose compiled code held more than its plan, the polish's saves tried again (restore_polish_drops)
        self.polish_restores: list[dict[str, Any]] = []
        # the latest timeline of each part of the step (a frame's graph, or each graph one compile
        # of a frame hands over), in the order they first compiled: a recompile of a frame (new
        # shapes) replaces its graphs in the step, it does not add to them
        self._step: dict[Any, Timeline] = {}
        self._parts: dict[Any, _Part] = {}
        self._compiling: tuple[int, int] | None = None  # dynamo's (frame, compile) ids of the graph compiling
        self._frame_compiles: dict[int, set[int]] = {}  # per dynamo frame id, the compiles of it seen
        self._place = 0  # its place among the graphs that compile handed over
        self._variant = False  # a compile of a frame whose earlier compile runs in the same step
        self._steps, self._backward_begun = 0, False  # training steps seen, told apart by backwards
        # the step measured, the device's allocated bytes as its first run began, and the bytes
        # the planned graphs that ran since are predicted to hold (see _measure_outside)
        self._step_start: tuple[int, int, int] | None = None
        self._replanning: Any = None  # the part planned again now, outside dynamo's compile
        # fusions inductor would have made in the planned backwards that the compile guard refused
        # (planner._torch_compat.fusion_distance_guard), over every graph compiled so far
        self.fusions_refused = SimpleNamespace(refused=0, refused_across=0)
        self.whole_model = False  # compiles a whole model (planner.compile), not blocks one by one
        self._checked_compiled = False  # whether a training call has shown that a graph reached this backend
        self._use(config)

    def _use(self, config: PlannerConfig) -> None:
        """Plan and compile with ``config`` from now on."""
        self.config = config
        self._compile: Callable = make_backend(self.partition, config.codegen, config.inductor_settings(),
                                               self.fusions_refused)

    def partition(self, joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any):
        """AOTAutograd partition function: plan the joint graph and split it accordingly. Where
        the plan is PyTorch's own split (:func:`compiles_as_pytorch`), the split is PyTorch's
        partitioner's own modules, compiled as torch.compile compiles them."""
        joint_module = _torch_compat.merge_common_subexpressions(joint_module)
        joint = JointGraph(joint_module, num_fwd_outputs, list(joint_inputs), kwargs)
        key = self._step_key
        part = self._parts.get(key)
        if part is not None and part.released:
            joint.released = part.released  # seen on a step: not held through its backward
        if part is not None and part.plan is not None and part.plan.fingerprint == joint.fingerprint:
            graph_plan = part.plan  # planned again for the step seen, on this graph's copy
        elif self.fixed is None:
            repeats, rest, beside = ((part.repeats, part.rest_bytes, part.beside_backward) if part is not None
                                     else (self.repeats, None, 0))
            graph_plan = solve_graph(joint, self.config, self._held_before(key), repeats, rest, beside)
        elif joint.fingerprint == self.fixed.fingerprint:
            graph_plan = self.fixed
        elif self._autocast != self.fixed_autocast:
            raise PlanFileError(
                f"the plan was made for the model {_autocast_text(self.fixed_autocast)} and it now runs "
                f"{_autocast_text(self._autocast)}, which makes another graph (autocast's casts, the bytes of "
                "what it saves); call plan() inside the same autocast as the training step's forward"
            )
        else:
            raise PlanFileError(
                f"the compiled graph (fingerprint {joint.fingerprint}) is not the one the plan was made for "
                f"({self.fixed.fingerprint}); the model, its input shapes or the codegen changed, so plan again"
            )
        if part is not None and self._replans(key) and not part.seen:
            part.joint = joint.copy()  # before the split below consumes the joint graph
        decision = graph_plan.decision
        split = (pytorch_modules(joint, graph_plan.problem, decision)
                 if self.config.codegen == "inductor" and compiles_as_pytorch(decision) else None)
        fuse = self.config.codegen == "inductor"
        if split is not None:
            forward, backward = split
        else:
            transfers = {n: Transfer(*decision.transfers.get(n, (None, None))) for n in decision.offloaded}
            forward, backward = emit(joint, graph_plan.problem, decision.saved, transfers, fuse=fuse)
        timeline = simulate(forward, backward, joint.num_fwd_outputs, fuse=fuse, released=joint.released)
        kept: dict[str, Any] = {}  # filled as inductor compiles each module
        emitted = None
        recount = part is not None and part.released is None  # to count again once a step shows what it frees
        # one copy of the modules as simulated serves both (inductor rewrites its own; simulate reads only)
        copies = (copy_module(forward), copy_module(backward)) if fuse or recount else None
        if fuse:
            _torch_compat.report_kept_buffers(forward, kept, "forward")
            _torch_compat.report_kept_buffers(backward, kept, "backward")
            emitted = [*copies, joint.num_fwd_outputs, joint.released]
        if recount:
            part.simulated = (*copies, joint.num_fwd_outputs, fuse)
        if self._replanning is not None and part is not None and part.index >= 0:  # replaces its earlier plan
            self.graphs[part.index], self.timelines[part.index], self.kept[part.index] = graph_plan, timeline, kept
            self._emitted[part.index] = emitted
        else:
            self.graphs.append(graph_plan)
            self.timelines.append(timeline)
            self.kept.append(kept)
            self._emitted.append(emitted)
            if part is not None:
                part.index = len(self.graphs) - 1
        self._step[key] = timeline
        return forward, backward

    @property
    def held_bytes(self) -> int:
        """Bytes the graphs before this one in the step keep alive once their forwards ran
        (saved values and outputs): the graphs of one step run their forwards in the order their
        frames first compiled, then their backwards in reverse, so a later graph runs while
        these are held. A graph compiled again for its frame (new shapes) counts once."""
        return self._held_before(self._step_key)

    @property
    def _live(self) -> dict[Any, Timeline]:
        """The parts of ``_step`` that still run: a part that ran no training run in the latest
        step or the one before it was superseded (a compile of its frame kept apart as a variant
        of the same step, which dynamo later sends that step's runs past) and no longer counts."""
        return {part: timeline for part, timeline in self._step.items()
                if part not in self._parts or self._parts[part].last_step is None
                or self._parts[part].last_step >= self._steps - 1}

    def _held_before(self, key: Any) -> int:
        held = 0
        for part, timeline in self._live.items():
            if part == key:
                break
            held += self._repeats_of(part) * timeline.held_after_forward
        return held + self._outside(key)

    def _outside(self, part: Any) -> int:
        return self._parts[part].outside if part in self._parts else 0

    def _measure_outside(self, key: Any, args: tuple) -> None:
        """Before a training run of ``key``'s graph: the bytes the device has allocated since the
        step's first run began, less what the planned graphs that ran since hold, are held by
        code outside the compiled graphs (eager code between graph breaks: a mask, a norm, what
        autograd saves for them). Measured on a CUDA device only, in the first
        ``OUTSIDE_MEASURED_STEPS`` steps; the latest of them counts."""
        now = _allocated(args)
        part = self._parts.get(key)
        if now is None or part is None:
            return
        if self._step_start is None or self._step_start[0] != self._steps:
            self._step_start = (self._steps, now, 0)
        step, start, held = self._step_start
        outside = max(0, now - start - held)
        part.outside = outside if part.outside_step != step else max(part.outside, outside)
        part.outside_step = step
        timeline = self._step.get(key)
        self._step_start = (step, start, held + (timeline.held_after_forward if timeline is not None else 0))

    def _planned_repeats(self, part: Any) -> int:
        return self._parts[part].repeats if part in self._parts else self.repeats

    def _repeats_of(self, part: Any) -> int:
        """The runs of ``part`` before its backward: as planned, or as many as a step showed."""
        return max(self._planned_repeats(part), self.runs.get(part, 0))

    @property
    def step(self) -> list[Timeline]:
        """The simulated memory of each graph of the step, in the order they run their forwards
        (the latest compile of each part of each frame)."""
        return list(self._live.values())

    @property
    def predicted_forward(self) -> tuple[int, int]:
        """Predicted peak of the step's forwards, and the bytes they leave alive for the backward."""
        held = sum(self._repeats_of(part) * t.held_after_forward for part, t in self._live.items())
        return self._step_peak(backward=False), held

    def stores_against_inductor(self) -> list[dict[str, dict[str, dict[str, int]]]]:
        """Per planned graph, where the code inductor wrote for each phase compiled so far stores
        values otherwise than the graph's simulation (:func:`planner.memory.stores_against_inductor`):
        what the memory model misses, or counts that inductor does not make."""
        return [self._stores_report(index) for index in range(len(self.timelines))]

    def _stores_report(self, index: int) -> dict[str, dict[str, dict[str, int]]]:
        """:func:`planner.memory.stores_against_inductor` for graph ``index``, with its emitted
        phases' graphs where it has them."""
        emitted = self._emitted[index] if index < len(self._emitted) else None
        graphs = {"forward": emitted[0].graph, "backward": emitted[1].graph} if emitted is not None else None
        return stores_against_inductor(self.timelines[index], self.kept[index], graphs)

    def compiled_timelines(self) -> list[Timeline | None]:
        """Per planned graph, its simulation again with the values inductor's code was seen to
        store that the simulation had computed in their readers (:meth:`stores_against_inductor`)
        counted stored, with the bytes of inductor's buffers; None for a graph whose two phases
        are not both compiled and read (or not compiled by inductor)."""
        return [self._compiled_timeline(index, report) for index, report in enumerate(self.stores_against_inductor())]

    def _compiled_timeline(self, index: int, report: dict | None = None) -> Timeline | None:
        emitted, kept = self._emitted[index], self.kept[index]
        if report is None:
            report = self._stores_report(index)
        if emitted is None or set(kept) != {"forward", "backward"} or any("error" in r for r in report.values()):
            return None
        forward, backward, outputs, released = emitted
        stored = {(phase, name): nbytes for phase, r in report.items() for name, nbytes in r["unmodelled"].items()}
        seen = self._compiled_seen.get(index)  # the replan, the settling run and reports ask alike
        facts = (tuple(released), tuple(sorted(stored.items())))
        if seen is not None and seen[0] is emitted and seen[1] == facts:
            return seen[2]
        timeline = simulate(forward, backward, outputs, fuse=True, released=released, stored=stored)
        self._compiled_seen[index] = (emitted, facts, timeline)
        return timeline

    def _compiled_peak_over(self, part: _Part) -> int | None:
        """The peak of ``part``'s graph counting what inductor's code stores
        (:meth:`compiled_timelines`), where that is more than :data:`STORES_TOLD` over its plan's;
        else (or where the code is not read yet) None."""
        if not 0 <= part.index < len(self._emitted):
            return None
        try:  # inside a training run: a failure here must not stop the step
            compiled = self._compiled_timeline(part.index)
        except Exception:  # noqa: BLE001 - the plan stands; _tell_stores reports the failure
            return None
        peak = self.timelines[part.index].peak
        return compiled.peak if compiled is not None and compiled.peak > (1 + STORES_TOLD) * peak else None

    def _settle(self, run: "_CountedRuns", part: _Part) -> None:
        """As ``run``'s graph settles (counted, measured and planned again): where it was planned
        again with the polish's saves restored, keep that plan only if its code, counted as
        :meth:`compiled_timelines` counts it, holds less than the code it replaced (else the
        replaced code runs again: what inductor stored was not the drops' doing); then tell the
        user what the code stores (:meth:`_tell_stores`)."""
        before, part.restored_from = part.restored_from, None
        if before is not None and 0 <= part.index < len(self.timelines):
            try:  # inside a training run: a failure here keeps the restored plan
                compiled = self._compiled_timeline(part.index)
            except Exception:  # noqa: BLE001 - _tell_stores reports it
                compiled = None
            peak = (compiled or self.timelines[part.index]).peak
            outcome = "kept" if peak < before[-1] else "reverted"
            self.polish_restores.append({"graph": part.index, "outcome": outcome, "restored_code_peak": peak,
                                         "compiled_peak": before[-1]})
            decision = self.graphs[part.index].decision
            if outcome == "kept" and decision.stats.get(KEY):  # later compiles of the graph start from it
                keep_decision(decision.stats[KEY], decision)
            if outcome == "reverted":
                run.compiled, self.graphs[part.index], timeline, self._emitted[part.index], self.kept[part.index], _ = before
                self.timelines[part.index] = timeline
                if run.part in self._step:
                    self._step[run.part] = timeline
        self._tell_stores(part)

    def _tell_stores(self, part: _Part) -> None:
        """Warn, once a graph's code is written for both phases, where counting what that code
        stores (:meth:`compiled_timelines`) raises the graph's simulated peak by more than
        :data:`STORES_TOLD` over the plan's: the budget was planned on the lower figure."""
        if part.index < 0 or part.index >= len(self._emitted):
            return
        timeline = self.timelines[part.index]
        try:  # inside a training run: a failure here must not stop the step
            report = self._stores_report(part.index)
            compiled = self._compiled_timeline(part.index, report)
        except Exception as err:  # noqa: BLE001 - reported, and the run goes on
            warnings.warn(f"counting what inductor's code for planned graph {part.index} stores failed "
                          f"({type(err).__name__}: {err})", stacklevel=3)
            return
        if compiled is None or compiled.peak <= (1 + STORES_TOLD) * timeline.peak:
            return
        named = sorted(((nbytes, name) for r in report.values() for name, nbytes in r["unmodelled"].items()), reverse=True)
        largest = ", ".join(f"{name} {format_bytes(nbytes)}" for nbytes, name in named[:3])
        warnings.warn(f"inductor's code for planned graph {part.index} stores values the memory model computes "
                      f"inside their readers ({largest}; {len(named)} in all): counted stored, the graph's peak is "
                      f"{format_bytes(compiled.peak)} against the {format_bytes(timeline.peak)} it was planned "
                      f"for ({compiled.peak / timeline.peak - 1:+.1%}). The step's peak so counted is the backend's "
                      "compiled_step_peak; with an absolute memory_budget, lowering it by the difference leaves room for it",
                      stacklevel=3)

    @property
    def compiled_step_peak(self) -> int | None:
        """:attr:`predicted_step_peak` with each graph's :meth:`compiled_timelines` in place of
        its simulation: the step's peak as the memory model counts it once told which values
        inductor's code stores. None until every graph of the step is compiled and read."""
        compiled = self.compiled_timelines()
        index = {key: part.index for key, part in self._parts.items() if part.index >= 0}
        timelines = {}
        for key in self._live:
            timeline = compiled[index[key]] if key in index and index[key] < len(compiled) else None
            if timeline is None:
                return None
            timelines[key] = timeline
        return self._step_peak(timelines=timelines)

    @property
    def predicted_step_peak(self) -> int:
        """Predicted peak activation memory of the step, over the latest graph of each part:
        the largest of each graph's simulated peak plus what the graphs before it hold, and in
        its backward, the gradients the graphs after it left (their backwards ran first). On a
        CUDA device, once a step has run, what code outside the compiled graphs held as each
        graph began counts beside it, forward and backward (eager code between graph breaks
        is freed by its own backward, after the graphs after it ran theirs)."""
        return self._step_peak()

    def _step_peak(self, backward: bool = True, after: Any = None, timelines: dict | None = None) -> int:
        """The largest peak of a graph of the step (its forward's alone, unless ``backward``)
        plus what the graphs before it and its own other runs hold, and during its backward the
        gradients of the graphs after it; only the graphs after the part ``after``, where given;
        with ``timelines`` (part -> timeline) in place of the parts' own."""
        live = self._live if timelines is None else timelines
        parts = list(live)
        held = peak = 0
        before = self._outside(after) if after is not None else 0  # counted with ``after``'s own holds
        for part in parts[parts.index(after) + 1:] if after is not None else parts:
            timeline, repeats = live[part], self._repeats_of(part)
            # its other runs: their saved values, all held while the last run's forward and
            # backward run; their gradients, all alive while the first run's backward runs last
            others = (repeats - 1) * timeline.held_after_forward
            others_grads = max(0, self._grad_bytes(part) - (self._parts[part].grad_bytes or 0)) if part in self._parts else 0
            own = timeline.forward_peak + others
            if backward:
                own = max(own, timeline.backward_peak + self.grads_after(part) + max(others, others_grads))
            outside = max(0, self._outside(part) - before)
            peak = max(peak, held + outside + own)
            held += repeats * timeline.held_after_forward
        return peak

    def _grad_bytes(self, part: Any) -> int:
        """Bytes of the gradients all of ``part``'s runs leave in leaf tensors, each storage once."""
        if part not in self._parts:
            return 0
        found = self._parts[part]
        return max(found.grad_bytes or 0, sum(found.grad_leaves.values()))

    def rest_after(self, part: Any) -> int:
        """Predicted peak of what runs between the forward and the backward of ``part``: the
        graphs after it in the step (their forwards, then their backwards), beside what ``part``
        itself holds, with what code outside the compiled graphs made after it began (measured
        on a CUDA device, see :meth:`predicted_step_peak`)."""
        return self._step_peak(after=part)

    def grads_after(self, part: Any) -> int:
        """Bytes of the gradients that the graphs after ``part`` leave in leaf tensors (their
        parameters' ``.grad``), alive while ``part``'s backward runs after theirs."""
        parts = list(self._live)
        return sum(self._grad_bytes(q) for q in parts[parts.index(part) + 1:])

    def __call__(self, gm: fx.GraphModule, example_inputs: list, mode: str | None = None,
                 options: dict[str, Any] | None = None) -> Callable:
        if mode is not None or options is not None:  # torch.compile's own (PlannerConfig.with_compile_arguments)
            if self._given is None:
                self._given = self.config
            config = self._given.with_compile_arguments(mode, options)
            if config != self.config:
                self._use(config)
        compiling = _torch_compat.compiling_frame()
        # one compile of a frame may hand over several graphs, each its own part of the step
        # (DDP's graph splitting compiles one per gradient bucket): they are told apart by their
        # place in that compile, and a recompile of the frame replaces them place by place
        self._place = self._place + 1 if compiling is not None and compiling == self._compiling else 0
        self._compiling, self._variant = compiling, False
        self._autocast = autocast_state()
        if compiling is not None:
            self._warn_on_recompiles(*compiling)
        earlier = self._parts.get(self._step_key)
        # A recompile of a frame replaces its graphs in the step, unless the earlier compile has
        # runs waiting for their backward: then both run in this step (one code object reached
        # through other modules or another path, as a decorator's wrapper shared by a model's
        # encoder and decoder layers is), and each is its own part, counted and planned apart.
        self._variant = earlier is not None and bool(earlier.waiting)
        key = self._step_key
        self._parts[key] = _Part(gm, repeats=self.repeats)
        compiled = _CountedRuns(self._compile(gm, example_inputs), self, key)
        self._parts[key].waiting = compiled.waiting
        return compiled

    def _warn_on_recompiles(self, frame: int, compile_id: int) -> None:
        """Warn once per frame when dynamo compiles it for the :data:`RECOMPILES_WARNED`-th time:
        every compile is planned at the sizes it was given (a plan counts bytes), so inputs whose
        shapes keep changing pay a plan and an inductor compile per shape, where ``torch.compile``
        alone would compile one graph with symbolic sizes."""
        seen = self._frame_compiles.setdefault(frame, set())
        seen.add(compile_id)
        if len(seen) == RECOMPILES_WARNED:
            warnings.warn(
                f"this code frame has now been compiled and planned {RECOMPILES_WARNED} times (dynamo compiles it again for "
                "new input shapes or other failed guards; TORCH_LOGS=recompiles names them). Plans are made at the "
                "sizes given, so each new input shape costs a plan and a compile: pad inputs to a few fixed lengths "
                "(e.g. bucket sequence lengths to multiples of 64) rather than to the longest in each batch",
                stacklevel=3)

    def _released(self, key: Any, released: tuple[int, ...], outputs: int, dropped: tuple[int, ...] = ()) -> None:
        """The first run of ``key``'s graph began its backward with the outputs at the places
        ``released`` freed (of its ``outputs``), and those at ``dropped`` no longer held by the
        caller: its memory is counted again without them. A dropped output counts as freed
        where its storage is a value the graph saves for its backward, which is what still holds
        it (AOTAutograd saves such an output for the backward as its own tensor); elsewhere
        whatever holds the storage (a view the caller kept, a later graph's saved value) is not
        known to let it go, and it stays counted."""
        part = self._parts.get(key)
        if part is None or part.released is not None:
            return
        simulated, part.simulated = part.simulated, None
        if simulated is not None and dropped:
            own = saved_outputs(simulated[0], simulated[2])
            released = tuple(sorted(set(released) | {k for k in dropped if k in own}))
        # places are the graph's outputs only where the run returned exactly those (no input
        # mutations or aliases AOTAutograd adds or takes away)
        part.released = released if simulated is not None and outputs == simulated[2] else ()
        if part.released and part.index >= 0:
            try:  # inside the step's backward: a failure here must not stop the training step
                timeline = simulate(*simulated[:2], simulated[2], fuse=simulated[3], released=released)
            except Exception as err:  # noqa: BLE001 - reported, and the earlier count kept
                part.released = ()
                warnings.warn(f"counting a graph's memory without the outputs its caller freed failed "
                              f"({type(err).__name__}: {err}); its prediction keeps them", stacklevel=2)
                return
            self.timelines[part.index] = timeline
            if self._emitted[part.index] is not None:
                self._emitted[part.index][3] = released
            if key in self._step:
                self._step[key] = timeline

    def _ran(self, part: Any, waiting: int) -> None:
        """A run of the graph of ``part`` begins its backward while ``waiting`` runs (itself
        included) wait for theirs."""
        if waiting > self.runs.get(part, 0):
            self.runs[part] = waiting
            planned = self._planned_repeats(part)
            # in a whole model (planner.compile), a graph run more often than planned is a frame a
            # graph break resumes in, run once per layer: planned again, as expected, unless it cannot be
            if waiting > planned and not (self.whole_model and self._replans(part)):
                then = (f"it is planned again for {waiting} runs when it next runs" if self._replans(part) else
                        "the saved values of its other runs are outside the memory budget")
                warnings.warn(
                    f"a planned graph ran its forward {waiting} times before its backward, and was planned for "
                    f"{planned}: {then}. For a model compiled block by block, compile the blocks with "
                    f"planner.compile_blocks(blocks, ...), which plans for every block's run", stacklevel=2)

    def _training_run(self, part: _Part) -> None:
        """A training run of ``part``'s graph begins: the first after a backward began (seen by a
        graph still counting its runs) begins a new step, and the part ran in this one."""
        if self._backward_begun:
            self._steps, self._backward_begun = self._steps + 1, False
        part.last_step = self._steps

    def _replans(self, part: Any) -> bool:
        return self.config.replan and self.fixed is None and part in self._parts

    def _plan_again(self, run: "_CountedRuns", inputs: list) -> None:
        """Plan ``run``'s part for the step seen (see the class); compile it again if the plan
        changed. ``inputs``: the arguments of the run about to begin, as example inputs. A
        compile that fails warns and leaves the first plan running."""
        key = run.part
        part = self._parts[key]
        part.seen = True
        joint, gm, part.joint, part.gm = part.joint, part.gm, None, None  # kept for this alone
        if joint is None:
            return
        repeats = self._repeats_of(key)
        old = self.graphs[part.index]
        # the rest of the step after a repeated graph's last run: none where nothing planned runs
        # there (a model compiled block by block), as its other runs count before it is seen
        rest = self.rest_after(key) if hands_on(joint) else None
        if repeats > 1 and not rest:
            rest = None
        seen = repeats, rest, self.grads_after(key), part.released or ()
        planned = part.repeats, part.rest_bytes, part.beside_backward, joint.released
        compiled = self._compiled_peak_over(part)  # what inductor's code was found to hold, where past the plan
        if seen == planned and compiled is None:
            return
        again = old
        if seen != planned:
            part.repeats, part.rest_bytes, part.beside_backward, joint.released = seen
            again = solve_graph(joint, self.config, self._held_before(key), *seen[:3])
            again = replace(again, plan_seconds=old.plan_seconds + again.plan_seconds)
        if compiled is not None:
            dropped = (old.decision.stats.get("polish") or {}).get("dropped") or ()
            restored, info = restore_polish_drops(joint, again, compiled, dropped, self.config.codegen == "inductor")
            self.polish_restores.append({"graph": part.index, **info})
            again = restored or again
        if set(again.decision.saved) == set(old.decision.saved):
            self.graphs[part.index] = again  # the same modules: nothing to compile
            return
        index = part.index
        before = (run.compiled, old, self.timelines[index], self._emitted[index], self.kept[index], compiled)
        self._replanning, part.plan = key, again
        try:
            compiled = self._compile(gm, inputs)
        except Exception as err:  # the first plan keeps running, and the user is told
            part.repeats, part.rest_bytes, part.beside_backward, _ = planned
            warnings.warn(f"planning a graph again for the step seen failed to compile ({type(err).__name__}: "
                          f"{err}); it keeps the plan made when it first compiled. Set replan=False to skip this",
                          stacklevel=3)
            return
        finally:
            self._replanning, part.plan = None, None
        run.compiled = compiled
        self.replanned.append(key)
        if "restored" in (again.decision.stats.get("polish") or {}):
            part.restored_from = before

    @property
    def _part(self) -> tuple[int, ...] | None:
        """The part of the step the graph compiling now is: its frame and place, and for a
        compile of the frame beside an earlier one in the same step, that compile's id too;
        None outside torch.compile's frames."""
        if self._compiling is None:
            return None
        frame, compile_id = self._compiling
        return (frame, self._place, compile_id) if self._variant else (frame, self._place)

    @property
    def _step_key(self) -> Any:
        """The key of the graph compiling now in ``_step`` and ``runs``: its part, or outside
        torch.compile's frames, its number among the planned graphs."""
        if self._replanning is not None:
            return self._replanning
        part = self._part
        return part if part is not None else len(self.timelines)


def _call_inputs(args: tuple) -> list:
    """A compiled graph's inputs, as a call passes them (a boxed call passes one list)."""
    return list(args[0]) if len(args) == 1 and isinstance(args[0], list) else list(args)


def _leaf_grads(inputs: list, gm: fx.GraphModule | None) -> dict[int, int]:
    """The gradients a run's backward leaves in leaf tensors that require one (its parameters,
    as inputs or as attributes of ``gm``): bytes by storage."""
    params = list(gm.parameters()) if gm is not None else []
    return {t.data_ptr(): t.numel() * t.element_size() for t in [*inputs, *params]
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf}


# how far counting what inductor's code stores may raise a graph's simulated peak over its plan's
# before the user is told (PlannerBackend._tell_stores)
STORES_TOLD = 0.03

# the first steps in which what code outside the compiled graphs holds is measured (the replans
# and the predictions read it); later steps skip the allocator's statistics: a dictionary of every
# counter a read, 127 µs a call on the H200 machine's host (scratch timing, torch 2.11)
OUTSIDE_MEASURED_STEPS = 3
# the steps in which each compiled graph counts its runs waiting for their backward (a token and a
# hook on each output's autograd node per run); once a graph has been counted that long, measured
# and planned again, its runs go straight through (on a 2-core CPU, a 12-layer model with a graph
# break in each layer ran its steps 1.25x slower than torch.compile's with the counting on,
# 1.05x with it off: scratch timing, torch 2.13)
COUNTED_STEPS = OUTSIDE_MEASURED_STEPS


class _CountedRuns:
    """A compiled graph that tells its backend how many of its runs wait for their backward
    when one begins it: each training run leaves a token, alive until its backward starts or
    its autograd graph is freed unused. The first run after a backward began, with no run
    waiting, lets the backend plan the graph again for the step it saw.

    Once the graph has been counted for :data:`COUNTED_STEPS` steps, measured (its gradients'
    bytes, the outputs its caller frees) and planned again for the step seen, its runs only
    mark the step they belong to and go straight through: a change in how often it runs
    before its backward after that is not seen (a frame compiled again for new shapes is
    counted afresh)."""

    def __init__(self, compiled: Callable, backend: PlannerBackend, part: Any) -> None:
        self.compiled, self.backend, self.part = compiled, backend, part
        self.waiting: weakref.WeakSet = weakref.WeakSet()
        self._boxed_call = getattr(compiled, "_boxed_call", False)  # dynamo's calling convention
        self.settled: _Part | None = None  # its part, once counted, measured and planned again

    def __call__(self, *args: Any) -> Any:
        backend, settled = self.backend, self.settled
        if settled is not None:
            if torch.is_grad_enabled():
                backend._training_run(settled)
            return self.compiled(*args)
        part = backend._parts.get(self.part)
        if part is not None and torch.is_grad_enabled() and not _fake_call(args):  # a training run
            backend._training_run(part)
            if backend._steps < OUTSIDE_MEASURED_STEPS:
                backend._measure_outside(self.part, args)
            if backend._steps < COUNTED_STEPS:  # each run's own parameters (a layer's, run for each layer)
                part.grad_leaves.update(_leaf_grads(_call_inputs(args), part.gm))
            if (backend._steps >= COUNTED_STEPS and part.grad_bytes is not None and part.released is not None
                    and (part.seen or not backend._replans(self.part))):
                self.settled = part
                backend._settle(self, part)
                return self.compiled(*args)
        replan = (part is not None and not part.seen and not self.waiting and self.part in backend.runs
                  and backend._replans(self.part))
        if part is not None and (part.grad_bytes is None or replan):  # until measured and planned again
            inputs = _call_inputs(args)
            if not any(isinstance(x, torch.Tensor) and _torch_compat.is_fake(x) for x in inputs):
                if part.grad_bytes is None:
                    part.grad_bytes = sum(_leaf_grads(inputs, part.gm).values())
                if replan:
                    backend._plan_again(self, inputs)
        out = self.compiled(*args)
        # every output's node: the backward may reach the run through any of them (an output
        # the step does not use never gets a gradient); a run on fake tensors is a compile's
        tensors = _tensors(out)
        nodes = {id(t.grad_fn): t.grad_fn for t in tensors if t.grad_fn is not None}
        if nodes and not any(_torch_compat.is_fake(t) for t in tensors):
            token = _Run()
            self.waiting.add(token)
            # whether the caller still holds each output when the backward begins, seen once: its
            # storage, and the tensor itself, for an output whose storage a value the graph saves
            # for its backward holds (freed at its last backward reader once the caller drops it)
            watched = part is not None and part.released is None
            outputs = _outputs(out)
            refs = [(weakref.ref(t), _torch_compat.storage_weakref(t)) if isinstance(t, torch.Tensor) else None
                    for t in outputs] if watched else []

            def begin_backward(grad_outputs, token=token, refs=refs, count=len(outputs)):
                self.backend._backward_begun = True
                if token in self.waiting:
                    self.backend._ran(self.part, len(self.waiting))
                    self.waiting.discard(token)
                    if refs:
                        dropped = tuple(k for k, ref in enumerate(refs) if ref is not None and ref[0]() is None)
                        freed = tuple(k for k, ref in enumerate(refs) if ref is not None and ref[1].expired())
                        self.backend._released(self.part, freed, count, dropped)
                        refs.clear()

            for node in nodes.values():
                node.register_prehook(begin_backward)
        return out


def _first_tensor(args: tuple) -> torch.Tensor | None:
    """A run's first tensor argument (:func:`_call_inputs`)."""
    return next((x for x in _call_inputs(args) if isinstance(x, torch.Tensor)), None)


def _allocated(args: tuple) -> int | None:
    """Bytes the CUDA allocator holds for tensors on the device of a run's first tensor
    argument; None off CUDA (no allocator statistics to read), off the process's current
    device (a model spread over devices in one process: one device's figures are not another's)
    and across several ranks, whose plans must not depend on what each rank measures (each
    would plan again on its own)."""
    first = _first_tensor(args)
    if first is None or first.device.type != "cuda" or first.device.index not in (None, torch.cuda.current_device()):
        return None
    if world()[1] > 1:
        return None
    return torch.cuda.memory_allocated(first.device)


def _fake_call(args: tuple) -> bool:
    """A call on fake tensors (a compile's), told by its first tensor argument."""
    first = _first_tensor(args)
    return first is not None and _torch_compat.is_fake(first)


class _Run:
    """One run of a compiled graph waiting for its backward (a weak-referenceable token)."""


def _outputs(out: Any) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in _outputs(out) if isinstance(t, torch.Tensor)]


def backend(config: PlannerConfig | None = None, mode: str | None = None, **overrides: Any) -> PlannerBackend:
    """A backend for ``torch.compile(model, backend=planner.backend(memory_budget=0.5))``.
    ``mode`` is one of ``torch.compile``'s, as :func:`compile` and :func:`compile_blocks` take it
    too (:meth:`PlannerConfig.with_compile_arguments`); ``torch.compile``'s own ``mode`` and
    ``options`` reach the backend the same way.

    Graph breaks are allowed. A fraction applies to each graph's own range; an absolute budget
    bounds the step's peak, each graph getting what the graphs before it in the step leave of it
    (``predicted_step_peak`` is the step's predicted peak). torch.compile keeps compiled graphs
    per class of model, and after ``recompile_limit`` (8) compiles of one class with other
    backends it runs that class eagerly, unplanned; :func:`compile` does not share that limit.
    """
    config = (config or PlannerConfig()).replace(**overrides).with_compile_arguments(mode)
    return PlannerBackend(config)


CONFIG_VARIABLE = "ACPLAN_CONFIG"
named_plans: list[GraphPlan] = []  # every graph the named backend planned in this process, in order


def named_backend(gm: fx.GraphModule, example_inputs: list, mode: str | None = None,
                  options: dict[str, Any] | None = None) -> Callable:
    """The backend ``torch.compile(model, backend="acplanner")`` finds by name (registered as
    a ``torch_dynamo_backends`` entry point, so tools that take a backend name, such as the
    transformers Trainer's ``torch_compile_backend``, can use it without importing the planner).

    Settings come from the TOML or YAML file named by ``$ACPLAN_CONFIG``, read as each graph is
    compiled (defaults without it), and from ``torch.compile``'s ``options`` (planner settings
    over the file's) and ``mode`` (:meth:`PlannerConfig.with_compile_arguments`), e.g.
    ``torch.compile(model, backend="acplanner", options={"memory_budget": 0.5},
    mode="max-autotune-no-cudagraphs")``. Each graph is planned on its own: an absolute budget bounds
    each graph's peak, not the step's (:func:`compile` and :func:`backend` plan the graphs of one
    step together). Each graph's plan is appended to :data:`named_plans`.

    Raises
    ------
    ConfigError
        If ``$ACPLAN_CONFIG`` names a missing or invalid file (torch.compile wraps it).
    """
    path = os.environ.get(CONFIG_VARIABLE)
    config = PlannerConfig.from_file(path) if path else PlannerConfig()
    planned = PlannerBackend(config.with_compile_arguments(mode, options))
    compiled = planned(gm, example_inputs)
    named_plans.extend(planned.graphs)
    return compiled


def compile(model: nn.Module, config: PlannerConfig | None = None, **overrides: Any) -> nn.Module:
    """``torch.compile(model)`` with a new planner backend: the module trains like ``model``.

    The model is compiled behind a frame of its own (:func:`planner.frames.own_frame`), so its
    graphs depend on no earlier compile in the process, however many instances of its class were
    compiled before, and with static shapes (``dynamic=False``): a plan is made for sizes it can
    count in bytes, and an input of a new shape compiles and plans again. Left to dynamo, a size
    seen to change, in this compile or an earlier one of the same library code (the frames a graph
    break resumes in are shared), turns symbolic. ``planner_backend`` on the returned module is
    the backend, whose ``graphs`` and ``timelines`` describe each planned graph once the first
    call has compiled them.
    """
    planned = backend(config, **overrides)
    planned.whole_model = True
    compiled = _past_compile_limits(torch.compile(own_frame(model), backend=planned, dynamic=False), planned,
                                    "the model")
    compiled.planner_backend = planned
    return compiled


def _past_compile_limits(compiled: nn.Module, backend: PlannerBackend, what: str) -> nn.Module:
    """``compiled`` (a ``torch.compile``d module), running with dynamo's per-code-object compile
    limits lifted (:func:`planner._torch_compat.compile_limits_lifted`): the library frames its
    graph breaks resume in are shared by every model in the process, and past the limit they
    would run unplanned. The module's own frame is its own (:func:`own_frame`).

    The first call with gradients on that hands ``backend`` no graph at all warns, once per
    backend: ``what`` (the model, its blocks) then ran eagerly, and the budget had no effect."""
    run = compiled.forward

    @wraps(run)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with _torch_compat.compile_limits_lifted():
            out = run(*args, **kwargs)
        if not backend._checked_compiled and torch.is_grad_enabled():
            backend._checked_compiled = True
            if not backend._parts:
                warnings.warn(_NO_GRAPH.format(what=what, fix=_NO_GRAPH_FIX[what]), stacklevel=_callers_level())
        return out

    compiled.forward = forward
    return compiled


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame, counted from the caller of this function, outside
    torch and this module: the line of the training script that called the compiled module."""
    frame, level, own = sys._getframe(2), 2, (os.path.dirname(torch.__file__) + os.sep, __file__)
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1
    return level


_NO_GRAPH = (
    "the planner compiled no graph in {what}'s first training call, so {what} ran eagerly and unplanned: "
    "memory_budget had no effect. torch.compile skipped the frame, as it does for a graph break it cannot "
    "resume from (one inside a loop of the forward, such as a .item() or a branch on a tensor's value; "
    "torch's warnings above name it) or for code under torch.compiler.disable. {fix}")
_NO_GRAPH_FIX = {"the model": "Remove the break, or compile the repeated blocks the loop calls on their own: "
                              "planner.compile_blocks(model.layers)",
                 "the blocks": "Remove the break from the blocks' forward"}


def compile_blocks(blocks: nn.Module, config: PlannerConfig | None = None, mode: str | None = None,
                   **overrides: Any) -> PlannerBackend:
    """Compile each block of ``blocks`` (a model's ``nn.ModuleList``, ``nn.Sequential`` or
    ``nn.ModuleDict`` of repeated layers) on its own with one planner backend, replacing it with
    its compiled module as torchtitan does before sharding (``fully_shard`` then wraps the
    compiled block, so its hooks run outside the graph; state-dict keys gain ``_orig_mod.``,
    as with ``torch.compile``). The blocks share one graph, planned for ``len(blocks)`` runs
    before its backward: the budget bounds the step's peak with every block's saved values in
    it, and a fraction is of that peak's range.

    The blocks get a ``forward`` of their own (:func:`planner.frames.own_forward`; names and
    types unchanged), so their compile depends on no earlier one in the process; that class is
    made at run time, so save the model's ``state_dict``, not the pickled module. Returns the
    backend (``graphs``, ``predicted_step_peak``, ``runs``).

    Raises
    ------
    ConfigError
        If ``blocks`` is not such a container, or is empty.
    """
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential, nn.ModuleDict)) or not len(blocks):
        from planner.errors import ConfigError

        raise ConfigError(f"compile_blocks takes a model's non-empty nn.ModuleList, nn.Sequential or nn.ModuleDict of "
                          f"blocks (such as model.layers), got {type(blocks).__name__}")
    planned = PlannerBackend((config or PlannerConfig()).replace(**overrides).with_compile_arguments(mode),
                             repeats=len(blocks))
    named = list(blocks.named_children())
    own_forward([block for _, block in named])
    for name, block in named:
        setattr(blocks, name, _past_compile_limits(torch.compile(block, backend=planned, dynamic=False), planned,
                                                   "the blocks"))
    return planned
