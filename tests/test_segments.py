"""Segment checkpointing from the forward's order: cuts where the fewest bytes cross."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import planner
from solvers.blocks import find_blocks
from solvers.segments import crossing_bytes, segment_saves
from tests.synthetic import random_problem, tiled_problem


def _crossing_by_hand(problem):
    n, owner = len(problem), problem.schedule.owner
    readers = [[] for _ in range(n)]
    for r, ins in enumerate(problem.inputs):
        for i in ins:
            readers[i].append(r)
    out = []
    for cut in range(n + 1):
        total = 0
        for o in range(min(cut, n)):
            if owner[o] == o and any(r >= cut for j in range(n) if owner[j] == o for r in readers[j]):
                total += int(problem.nbytes[o])
        out.append(total)
    return out


@pytest.mark.parametrize("problem", [random_problem(s, 14, timed=True) for s in range(6)] + [tiled_problem(1, 5, 4)])
def test_crossing_bytes_counts_each_storage_read_across_a_cut(problem):
    crossing, _ = crossing_bytes(problem)
    assert crossing.tolist() == _crossing_by_hand(problem)


def test_a_view_read_across_a_cut_keeps_its_base():
    problem = random_problem(3, 14, timed=True)
    owner = problem.schedule.owner.copy()
    owner[5] = 2  # node 5 becomes a view of node 2: its readers read node 2's storage
    viewed = type(problem)(**{**problem.__dict__, "schedule": type(problem.schedule)(**{**problem.schedule.__dict__, "owner": owner})})
    crossing = crossing_bytes(viewed)[0]
    assert crossing.tolist() == _crossing_by_hand(viewed)
    assert (crossing != crossing_bytes(problem)[0]).any()  # node 5's late reader keeps node 2 alive


class UnlikeLayers(nn.Module):
    """A deep residual stack whose layers all differ in width: no two blocks alike, and a narrow
    stream (32 x 8 floats) between the layers' wide hidden values."""

    def __init__(self) -> None:
        super().__init__()
        widths = [40 + (37 * i) % 64 for i in range(48)]
        self.up = nn.ModuleList(nn.Linear(8, w) for w in widths)
        self.down = nn.ModuleList(nn.Linear(w, 8) for w in widths)

    def forward(self, x):
        for up, down in zip(self.up, self.down):
            x = x + down(F.gelu(up(x)))
        return x.square().sum()


def test_segments_cut_a_stack_of_unlike_layers_on_its_narrow_stream():
    torch.manual_seed(0)
    result = planner.plan(UnlikeLayers(), (torch.randn(32, 8),), memory_budget=0.0, solver="greedy",
                          config=planner.PlannerConfig(codegen="eager", time_limit=10))
    problem = result.graph_plan.problem
    assert find_blocks(problem, min_count=3, min_cover=0.25) is None  # no blocks to cut at
    stream = 32 * 8 * 4
    plans = segment_saves(problem, counts=(2, 4, 8, 16, 32))
    assert len(plans) == 5
    for k, saved in zip((2, 4, 8, 16, 32), plans):
        kept = np.flatnonzero(saved)
        assert len(kept) == k - 1 and set(problem.nbytes[kept].tolist()) == {stream}
