"""When an offloaded value's copies run: one link per direction, in order, beside compute.

A plan that offloads a saved value copies it to host memory in the forward and back in the
backward (:mod:`planner.offload_ops`). Each direction of the host link carries one copy at a
time, in the order they are issued. :func:`place_transfers` times the copies against the
estimated compute of the step, op by op:

* forward: a value's copy starts once the value is made and the link is free; the forward waits
  for it after the first op that ends once the copy is done, and not before the value's last
  forward reader (the wait frees the value);
* backward: copies back are timed from their deadlines, the start of their value's first
  backward reader, latest first: each ends by its deadline and before the next one starts, and
  is issued before the last op that starts no later than it must start (the first op of the
  backward if the link cannot finish it in time there).

The placement does not change what is saved; it decides how long each offloaded value is away
from the device, which the memory model counts (:func:`planner.schedule.profile`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Iterable

import numpy as np
import torch
import torch.fx as fx

from planner import _torch_compat
from planner.decision import Decision
from planner.emit import Transfer
from planner.graph import JointGraph
from planner.ops import storage_bytes
from planner.problem import Problem, evaluate_names, memory_profile, offloads_of
from planner.schedule import OffloadWindows, last_forward_read, made_at
from planner.units import format_bytes

__all__ = ["Placement", "place_transfers", "offload_windows", "windows_decision", "explain_windows", "LINK_SEGMENTS",
           "LINK_SHARE", "choose_offloads", "op_seconds", "offloaded_decision", "host_link",
           "measure_link", "LINK_BYTES_PER_SECOND"]

# one direction of the host link: about what pinned copies reach over PCIe 5 x16 (bytes/s)
LINK_BYTES_PER_SECOND = 25e9


@dataclass(frozen=True)
class Placement:
    """Where the copies run (a :class:`~planner.emit.Transfer` per offloaded name), and the
    seconds of link time they cannot hide: copies to host still running when the forward ends,
    and copies back that would have to start before the backward does."""

    transfers: dict[str, Transfer]
    stall_seconds: float

    def as_decision(self) -> dict[str, list]:
        """The placement as :attr:`planner.decision.Decision.transfers`."""
        return {name: [t.wait_after, t.reload_before] for name, t in self.transfers.items()}


def place_transfers(joint: JointGraph, problem: Problem, offloaded: Iterable[str], runtime: Callable[[fx.Node], float],
                    bytes_per_second: float = LINK_BYTES_PER_SECOND) -> Placement:
    """A :class:`~planner.emit.Transfer` per offloaded name; ``runtime(node)`` is an op's
    estimated seconds (0 for views and getitems is fine). Waits and copies back are placed at
    nodes of ``problem`` and steps of its schedule, so that its memory model counts them
    (:func:`planner.problem.evaluate_names` with the transfers)."""
    names = set(offloaded)
    steps = set(problem.schedule.step_names)
    known = set(problem.names)
    forward = [n for n in joint.forward_nodes if n.name in known]
    backward = [n for n in joint.graph.nodes if n.name in steps]
    by_name = {n.name: n for n in forward}
    graph_order = {n: i for i, n in enumerate(joint.graph.nodes)}
    values = sorted((by_name[name] for name in names), key=graph_order.__getitem__)  # ties go the same way every run
    seconds = {n: _seconds(storage_bytes(n.meta["val"]), bytes_per_second) for n in values}

    end, clock = {}, 0.0
    for node in forward:
        clock += runtime(node)
        end[node] = clock
    position = {n: i for i, n in enumerate(forward)}
    waits, link = {}, 0.0
    for value in sorted(values, key=position.__getitem__):
        link = max(link, end[value]) + seconds[value]
        last = max((position[u] for u in value.users if u in position), default=position[value])
        after = next((n for n in forward[last:] if end[n] >= link), forward[-1])
        waits[value] = after

    link_out = link  # when the last copy to host ends
    start, clock = {}, 0.0
    for node in backward:
        start[node] = clock
        clock += runtime(node)
    order = {n: i for i, n in enumerate(backward)}
    readers = {v: min((u for u in v.users if u in order), key=order.__getitem__, default=None) for v in values}
    reloads, link = {}, float("inf")
    for value in sorted((v for v in values if readers[v] is not None), key=lambda v: -start[readers[v]]):
        link = min(start[readers[value]], link) - seconds[value]  # when this copy must start
        # where the joint graph puts backward ops before forward ones, the copy back still follows the wait
        allowed = [n for n in backward[: order[readers[value]] + 1] if graph_order[n] > graph_order[waits[value]]]
        issue = next((n for n in reversed(allowed) if start[n] <= link), allowed[0] if allowed else readers[value])
        reloads[value] = issue.name
    forward_end = end[forward[-1]] if forward else 0.0
    late = max(0.0, link_out - forward_end)
    early = max(0.0, -link) if reloads else 0.0
    return Placement({v.name: Transfer(waits[v].name, reloads.get(v)) for v in values}, late + early)


# The exact programs' windows (offload_windows): each direction of the step cut into this many
# spans of equal estimated time, a copy given until the end of the span after its own
LINK_SEGMENTS = 24
LINK_SHARE = 0.8  # of a window's estimated seconds, what its copies may take of the link


def offload_windows(joint: JointGraph, problem: Problem, runtime: Callable[[fx.Node], float],
                    bytes_per_second: float = LINK_BYTES_PER_SECOND, min_bytes: int = 1 << 20,
                    op_seconds: float = 0.0, segments: int = LINK_SEGMENTS, share: float = LINK_SHARE,
                    guides: tuple = (None,)) -> OffloadWindows:
    """Fixed windows for every value that may be offloaded, so that the exact programs choose
    offloads with the memory and the link priced exactly (:class:`~planner.schedule.OffloadWindows`).

    The forward's and the backward's estimated seconds (``runtime(node)`` per op, as for
    :func:`place_transfers`) are each cut into ``segments`` spans of equal time. A value made
    in forward span k is copied to host by the end of span k + 1 (the forward's end at the
    latest), where the forward waits for it; a value whose first backward reader is in
    backward span j is copied back from the start of span j - 1 (the backward's start at the
    earliest). When a value is first read depends on the plan (a recomputed copy reads it when
    made), so each of ``guides`` gives each value one window: a node mask of the nodes a plan
    recomputes, whose copies' reads the window follows, or None, the first direct reader (for
    a value only recomputed copies read, the earliest step one of them could be made under any
    plan). Windows alike are given once, and a plan offloads a value in one of its windows at
    most. A plan whose recomputed copy would read the value before its copy back is under way
    cannot offload it: ``conflicts`` name those readers, and the programs forbid the pair
    exactly (a copy made by the step before the copy back). Each direction carries its copies
    in order; for every run of spans i..j, the copies of the values of those spans must fit in
    ``share`` of the seconds between the latest start and the earliest end any of them is
    allowed: then, copied in order, each ends in its window (the rows are sufficient, not
    necessary). Candidates: saved values that
    :func:`planner.emit.offloadable` allows, of at least ``min_bytes``, read by the backward and
    not kept by the caller; none where the graph runs several times before its backward.
    """
    from planner.emit import offloadable

    s = problem.schedule
    n = len(problem)
    by_name = {node.name: node for node in joint.graph.nodes}
    graph_order = {node: i for i, node in enumerate(joint.graph.nodes)}
    forward_end = np.cumsum([runtime(by_name[name]) for name in problem.names]) if n else np.zeros(0)
    steps = [by_name.get(name) for name in s.step_names]  # None: a step of the rest of the training step
    step_start = np.concatenate(([0.0], np.cumsum([runtime(node) if node is not None else 0.0 for node in steps])))
    first = _first_possible_read(problem)
    forward_read = last_forward_read(s)
    guided = [{} if guide is None else made_at(s, problem.consumers, np.asarray(guide, dtype=bool) & s.owns)
              for guide in guides]
    empty = OffloadWindows(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                           np.zeros(0), (), op_seconds, ())
    if n == 0 or not steps or s.repeats > 1:
        return empty
    f_total, b_total = float(forward_end[-1]), float(step_start[-1])
    f_bounds = np.linspace(0.0, f_total, segments + 1)
    b_bounds = np.linspace(0.0, b_total, segments + 1)
    nodes, freed, back, seconds, out_span, in_span, conflicts = [], [], [], [], [], [], []
    out_window, in_window = [], []
    for i in range(n):
        node = by_name[problem.names[i]]
        if not (s.owner[i] == i and problem.saveable[i] and not s.held[i] and first[i] < s.num_steps
                and problem.nbytes[i] >= max(min_bytes, 1) and offloadable(node, min_bytes)):
            continue
        k = _span(f_bounds, forward_end[i])
        deadline = f_bounds[min(k + 2, segments)]
        wait = max(int(np.searchsorted(forward_end, deadline - 1e-15 * max(f_total, 1.0))), int(forward_read[i]), i)
        wait = min(wait, n - 1)
        direct = int(s.first_read[i]) if s.first_read[i] < s.num_steps else int(first[i])
        reloads = {}  # reload step -> span of the first read
        for made in guided:
            read = min([direct] + [made[w] for w in problem.consumers[i] if w in made])
            j = _span(b_bounds, step_start[read])
            issue = b_bounds[max(j - 1, 0)]
            allowed = [t for t in range(read + 1)
                       if steps[t] is not None and graph_order[steps[t]] > graph_order[by_name[problem.names[wait]]]]
            if allowed:  # else the joint graph puts every possible reader before the wait
                later = [t for t in allowed if step_start[t] >= issue - 1e-15 * max(b_total, 1.0)]
                reloads.setdefault(later[0] if later else allowed[-1], j)
        for reload, j in sorted(reloads.items()):
            conflicts += [(len(nodes), int(w), reload - 1) for w in problem.consumers[i]
                          if problem.recomputable[w] and first[w] < reload]
            nodes.append(i)
            freed.append(wait)
            back.append(reload)
            out_window.append((float(forward_end[i]), float(deadline)))
            in_window.append((float(b_bounds[max(j - 1, 0)]), float(b_bounds[j])))
            seconds.append(_seconds(int(problem.nbytes[i]), bytes_per_second))
            out_span.append(k)
            in_span.append(j)
    if not nodes:
        return empty
    out_span, in_span, seconds = np.array(out_span), np.array(in_span), np.array(seconds)
    rows = []
    for spans, start_of, end_of in ((out_span, lambda i: f_bounds[i + 1], lambda j: f_bounds[min(j + 2, segments)]),
                                    (in_span, lambda i: b_bounds[max(i - 1, 0)], lambda j: b_bounds[j])):
        for i in np.unique(spans):
            for j in np.unique(spans[spans >= i]):
                members = np.flatnonzero((spans >= i) & (spans <= j))
                rows.append((members, share * max(0.0, float(end_of(j) - start_of(i)))))
    return OffloadWindows(np.array(nodes, dtype=np.int64), np.array(freed, dtype=np.int64),
                          np.array(back, dtype=np.int64), seconds, tuple(rows), op_seconds, tuple(conflicts),
                          np.array(out_window), np.array(in_window))


def _span(bounds: np.ndarray, t: float) -> int:
    """The span of ``bounds`` holding instant ``t`` (the last span for the end)."""
    return int(min(max(np.searchsorted(bounds, t, side="right") - 1, 0), len(bounds) - 2))


def _first_possible_read(problem: Problem) -> np.ndarray:
    """Per node, the earliest backward step that can read it under any plan: its first direct
    reader, or the earliest step at which a recomputed copy reading it could be made."""
    s = problem.schedule
    first = s.first_read.astype(np.int64).copy()
    cons = problem.consumers
    for e in range(len(problem) - 1, -1, -1):
        for w in cons[e]:
            if problem.recomputable[w]:
                first[e] = min(first[e], first[w], first[int(s.made_with[w])])
    return first


def explain_windows(joint: JointGraph, problem: Problem, windows: OffloadWindows, plan, count: int = 20) -> list[str]:
    """Why the largest values a plan (an :class:`~planner.problem.Evaluation`) saves can or
    cannot leave the device, one line each for its ``count`` largest: the first direct backward
    reader, the first step at which the plan's recomputed copies read the value, and per window
    the step of its copy back and whether the plan's copies read the value before it (or why
    the value has no window)."""
    from planner.emit import offloadable

    s = problem.schedule
    by_name = {node.name: node for node in joint.graph.nodes}
    made = made_at(s, problem.consumers, plan.recomputed & s.owns)
    saved = [int(i) for i in np.flatnonzero(plan.saved) if problem.nbytes[i] > 0]

    def step(t: int) -> str:
        return f"{t} {s.step_names[t]}" if 0 <= t < s.num_steps else "none"

    lines = []
    for i in sorted(saved, key=lambda i: -int(problem.nbytes[i]))[:count]:
        reads = [(made[w], problem.names[w]) for w in problem.consumers[i] if w in made]
        early = min(reads, default=None)
        copies = f"{step(early[0])} ({early[1]})" if early else "none"
        head = (f"{problem.names[i]} {format_bytes(int(problem.nbytes[i]))}: read directly at step "
                f"{step(int(s.first_read[i]))}, by the plan's copies from step {copies}")
        mine = np.flatnonzero(windows.nodes == i)
        if not len(mine):
            why = ("not its own storage" if s.owner[i] != i else "kept by the caller" if s.held[i]
                   else "a view, written in place, viewed or returned" if not offloadable(by_name[problem.names[i]])
                   else "too small, unread by the backward, or no step after its wait")
            lines.append(f"{head}; no window: {why}")
            continue
        parts = []
        for k in mine:
            blocked = [problem.names[w] for kk, w, t in windows.conflicts if kk == k and w in made and made[w] <= t]
            parts.append(f"waited for after {problem.names[windows.freed_after[k]]}, back from step "
                         f"{step(int(windows.back_from[k]))}" + (f", read before by {blocked[0]}" if blocked else ""))
        lines.append(f"{head}; {windows.seconds[mine[0]] * 1e6:.1f} µs each way; windows: " + "; ".join(parts))
    return lines


def windows_decision(problem: Problem, windows: OffloadWindows, chosen: np.ndarray) -> dict[str, list]:
    """The chosen candidates' copies as :attr:`planner.decision.Decision.transfers`."""
    names, steps = problem.names, problem.schedule.step_names
    return {names[int(windows.nodes[k])]: [names[int(windows.freed_after[k])], steps[int(windows.back_from[k])]]
            for k in np.flatnonzero(chosen)}


def op_seconds(estimator, fuse: bool) -> Callable[[fx.Node], float]:
    """``runtime(node)`` for :func:`place_transfers`: the estimator's seconds per op, where with
    ``fuse`` (inductor) a pointwise op counts nothing: it runs inside a fused kernel that the
    estimator prices again op by op. An estimate low rather than high: a copy timed against too
    little compute waits later and starts back earlier than it needs to (more memory), one
    timed against too much stalls the step. (On the H100 the roofline put the 8-layer GPT's
    step at 26.2 ms against 28.3 measured, and its kernels without the pointwise ops at 20.2.)"""
    from planner.memory import fusible
    from planner.ops import aliased_input, is_getitem

    def runtime(node: fx.Node) -> float:
        if node.op != "call_function" or is_getitem(node) or aliased_input(node) is not None or (fuse and fusible(node)):
            return 0.0  # views and getitems run no kernel
        return float(estimator.runtime(node))

    return runtime


def _seconds(nbytes: int, bytes_per_second: float) -> float:
    return nbytes / bytes_per_second if bytes_per_second > 0 else 0.0


def choose_offloads(joint: JointGraph, problem: Problem, saved: Iterable[str], runtime: Callable[[fx.Node], float],
                    target_bytes: int, bytes_per_second: float = LINK_BYTES_PER_SECOND,
                    min_bytes: int = 1 << 20, host_bytes: int | None = None) -> tuple[tuple[str, ...], Placement, int]:
    """Saved values to offload so that the plan's peak falls to ``target_bytes`` or as near as
    it gets, with no link time left unhidden: ``(offloaded, placement, peak_bytes)``.

    Greedy, largest value first: a value is kept if, with every copy placed again, the link
    still hides every copy and the memory profile improves: the peak does not rise and the
    bytes summed over the steps fall (the peak may sit where several values are held at once). Values
    of fewer than ``min_bytes`` are left on the device, and none is taken that would bring the
    offloaded bytes over ``host_bytes`` (all of them are in host memory at the end of the
    forward; None: no bound). A heuristic: it proves nothing about the best set.
    """
    from planner.emit import offloadable

    saved = tuple(saved)
    by_name = {n.name: n for n in joint.graph.nodes}
    offloadable_names = [n for n in saved if offloadable(by_name[n], min_bytes)]
    sizes = dict(zip(offloadable_names, problem.nbytes[problem.index(offloadable_names)].tolist()))
    candidates = sorted(offloadable_names, key=lambda n: -sizes[n])
    chosen: list[str] = []
    placement = Placement({}, 0.0)
    plan = evaluate_names(problem, saved)
    best = _peak_and_area(problem, plan, chosen, placement)
    room = float("inf") if host_bytes is None else host_bytes
    for name in candidates:
        if best[0] <= target_bytes:
            break
        size = sizes[name]
        if size > room:
            continue
        trial = place_transfers(joint, problem, [*chosen, name], runtime, bytes_per_second)
        if trial.stall_seconds > 0:
            continue
        found = _peak_and_area(problem, plan, [*chosen, name], trial)
        if found[0] <= best[0] and found < best:
            chosen, placement, best, room = [*chosen, name], trial, found, room - size
    return tuple(chosen), placement, best[0]


def _peak_and_area(problem: Problem, plan, offloaded: list[str], placement: Placement) -> tuple[int, int]:
    """The peak, and the bytes summed over every step: a value whose absence does not lower
    the peak yet (others hold it up at another step) still lowers the area."""
    found = memory_profile(problem, plan, offloads_of(problem, offloaded, placement.as_decision()))
    return int(found.peak), int(found.forward.sum() + found.backward.sum())


def offloaded_decision(joint: JointGraph, problem: Problem, decision: Decision, runtime: Callable[[fx.Node], float],
                       target_bytes: int, bytes_per_second: float, min_bytes: int,
                       host_bytes: int | None = None) -> Decision:
    """``decision`` with the offloads :func:`choose_offloads` picks towards ``target_bytes``
    (within ``host_bytes`` of host memory): its peak is the profile's with them, and
    ``stats["offload"]`` says what was offloaded."""
    chosen, placement, peak = choose_offloads(joint, problem, decision.saved, runtime, target_bytes, bytes_per_second,
                                              min_bytes, host_bytes)
    moved = int(problem.nbytes[problem.index(chosen)].sum()) if chosen else 0
    note = {"offloaded": len(chosen), "offloaded_bytes": moved, "peak_bytes_on_device_alone": decision.peak_bytes,
            "bytes_per_second": bytes_per_second, "host_bytes_limit": host_bytes}
    return replace(decision, offloaded=chosen, transfers=placement.as_decision(), peak_bytes=peak,
                   stats={**decision.stats, "offload": note})


def host_link(joint: JointGraph, bytes_per_second: float | None) -> float | None:
    """Bytes per second of one direction of the host link of the device ``joint`` runs on:
    ``bytes_per_second`` if given, else measured (:func:`measure_link`, the slower direction);
    ``None`` where there is nothing to offload to (a CPU graph: host memory is its memory)."""
    device = joint.device
    if device is None or device.type != "cuda":
        return None
    return float(bytes_per_second) if bytes_per_second else min(measure_link(str(device)).values())


@lru_cache(maxsize=None)
def measure_link(device: str, nbytes: int = 256 << 20, repeats: int = 5) -> dict[str, float]:
    """Bytes per second of pinned copies device to host and host to device on a CUDA device,
    measured once per process (on real tensors, also when called inside torch.compile)."""
    with _torch_compat.real_tensors():
        on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        rates = {}
        for name, (dst, src) in (("device_to_host", (host, on_device)), ("host_to_device", (on_device, host))):
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                dst.copy_(src, non_blocking=True)
            end.record()
            torch.cuda.synchronize(device)
            rates[name] = repeats * nbytes / (start.elapsed_time(end) / 1e3)
        return rates
