"""Repeated blocks are found from a problem's arrays, and tying them restricts the program."""
import pytest

from planner.bounds import min_memory_plan, runtime_optimal_plan
from planner.problem import evaluate
from solvers import get_solver
from solvers.blocks import find_blocks
from solvers.graph_model import tie_blocks
from solvers.ilp import solve_highs, within_peak
from tests.synthetic import random_problem, tiled_problem


@pytest.mark.parametrize("seed,size,count", [(0, 7, 4), (1, 12, 3), (2, 5, 9)])
def test_blocks_of_a_tiled_problem_are_its_tiles(seed, size, count):
    blocks = find_blocks(tiled_problem(seed, size, count))
    # The first tile reads no earlier tile, so its first node may not correspond; every later
    # tile does, one period apart.
    assert blocks is not None and blocks.period == size
    assert blocks.count >= count - 1 and blocks.start + blocks.count * size <= size * count


@pytest.mark.parametrize("seed", range(4))
def test_a_random_problem_has_no_blocks(seed):
    assert find_blocks(random_problem(seed, 40)) is None


def test_tied_program_decides_alike_in_every_block_and_fits():
    problem = tiled_problem(4, 8, 5)
    blocks = find_blocks(problem)
    frugal, fast = min_memory_plan(problem), runtime_optimal_plan(problem)
    budget = (frugal.peak_bytes + fast.peak_bytes) // 2
    tied = within_peak(problem, budget, frugal, float("inf"), lambda m, o, s: solve_highs(m, o, float("inf")),
                       restrict=lambda build, base: tie_blocks(build, base, blocks))
    plan = evaluate(problem, tied.saved)
    assert plan.peak_bytes <= budget
    for i, j in blocks.pairs():
        assert plan.saved[i] == plan.saved[j] and plan.recomputed[i] == plan.recomputed[j]
    # tying restricts: the full program is never worse, and the solver reports the blocks it used
    decision = get_solver("ilp").solve(problem, budget)
    assert decision.seconds <= plan.seconds + 1e-4 * problem.runtime.max()
    assert decision.stats["blocks"]["period"] == blocks.period
