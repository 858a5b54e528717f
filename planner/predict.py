"""What the planner predicts for a plan: the modules the emitter makes of it, simulated."""
from __future__ import annotations

from typing import Collection

from planner import _torch_compat
from planner.emit import emit
from planner.graph import JointGraph
from planner.memory import Timeline, simulate
from planner.problem import Problem

__all__ = ["simulated_peak", "simulated_timeline"]


def simulated_peak(joint: JointGraph, problem: Problem, saved: tuple[str, ...], fuse: bool = True) -> int:
    """The simulated peak (:func:`planner.memory.simulate`) of the modules the emitter makes of
    ``joint`` saving ``saved``: what the planner predicts for that plan. ``joint`` is left as is."""
    return simulated_timeline(joint, problem, saved, fuse).peak


def simulated_timeline(joint: JointGraph, problem: Problem, saved: tuple[str, ...], fuse: bool = True,
                       released: Collection[int] = ()) -> Timeline:
    """:func:`simulated_peak`'s whole timeline, with what is alive at its peak and the kernels
    the modules run; ``released``: the places of the outputs the caller frees before the
    backward (``JointGraph.released``), as the backend counts its graphs."""
    with _torch_compat.lazy_graph_modules():  # walked, never run
        forward, backward = emit(joint.copy(), problem, saved, fuse=fuse)
        return simulate(forward, backward, joint.num_fwd_outputs, fuse=fuse, released=released)
