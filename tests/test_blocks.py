"""Repeated blocks are found from a problem's arrays, and tying them restricts the program."""
import numpy as np
import pytest

from planner.bounds import min_memory_plan, runtime_optimal_plan
from planner.problem import evaluate
from solvers import get_solver
from solvers.blocks import block_masks, block_patterns, find_blocks, in_rank_order, pattern_ranks
from solvers.graph_model import choose_patterns, tie_blocks
from solvers.backends import solve_highs, within_peak
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


def _block_masks(plan, blocks):
    return [mask.tobytes() for mask in block_masks(blocks, plan.saved)]


def test_block_patterns_are_the_distinct_block_masks_of_the_plans():
    problem = tiled_problem(5, 8, 5)
    blocks = find_blocks(problem)
    frugal, fast = min_memory_plan(problem), runtime_optimal_plan(problem)
    patterns = block_patterns(blocks, [frugal, fast, frugal])
    keys = [p.tobytes() for p in patterns]
    assert len(keys) == len(set(keys))
    assert set(keys) == set(_block_masks(frugal, blocks)) | set(_block_masks(fast, blocks))


@pytest.mark.parametrize("seed", [4, 6])
def test_patterns_program_mixes_the_plans_blocks_in_rank_order_and_fits(seed):
    problem = tiled_problem(seed, 8, 6)
    blocks = find_blocks(problem)
    frugal, fast = min_memory_plan(problem), runtime_optimal_plan(problem)
    budget = (frugal.peak_bytes + fast.peak_bytes) // 2
    patterns = block_patterns(blocks, [frugal, fast])
    ranks = pattern_ranks(blocks, patterns, problem.nbytes)
    mixed = within_peak(problem, budget, frugal, float("inf"), lambda m, o, s: solve_highs(m, o, float("inf")),
                        restrict=lambda build, base: choose_patterns(build, base, blocks, patterns, ranks))
    plan = evaluate(problem, mixed.saved)
    assert plan.peak_bytes <= budget and mixed.status == "optimal"
    index = {p.tobytes(): k for k, p in enumerate(patterns)}
    chosen = [index[mask] for mask in _block_masks(plan, blocks)]  # every block saves as a pattern does
    inner = [ranks[p] for p in chosen[1:-1]]
    assert inner == sorted(inner)  # the blocks between the first and the last in rank order
    # the frugal plan is one choice of the restricted program: it is never beaten the other way
    assert plan.seconds <= frugal.seconds
    # and the full program is never worse than the restriction
    decision = get_solver("ilp").solve(problem, budget)
    assert decision.seconds <= plan.seconds + 1e-4 * problem.runtime.max()


def test_ranks_follow_saved_bytes_and_rank_order_keeps_a_plans_patterns():
    problem = tiled_problem(7, 8, 6)
    blocks = find_blocks(problem)
    first = problem.nbytes[blocks.start: blocks.start + blocks.period]
    frugal, fast = min_memory_plan(problem), runtime_optimal_plan(problem)
    mixed = frugal.saved.copy()  # blocks saving as fast does, then as frugal does, alternately
    for k in range(0, blocks.count, 2):
        lo = blocks.start + k * blocks.period
        mixed[lo: lo + blocks.period] = fast.saved[lo: lo + blocks.period]
    plan = evaluate(problem, mixed)
    patterns = block_patterns(blocks, [plan])
    ranks = pattern_ranks(blocks, patterns, problem.nbytes)
    assert [int(first[patterns[p]].sum()) for p in np.argsort(ranks)] == sorted(int(first[q].sum()) for q in patterns)
    chosen, saved = in_rank_order(blocks, plan, patterns, ranks)
    assert sorted(_block_masks(plan, blocks)) == sorted(_block_masks(evaluate(problem, saved), blocks))
    assert [ranks[p] for p in chosen[1:-1]] == sorted(ranks[p] for p in chosen[1:-1])
    masks = _block_masks(plan, blocks)  # the first and the last block keep theirs
    assert patterns[chosen[0]].tobytes() == masks[0] and patterns[chosen[-1]].tobytes() == masks[-1]
    outside = np.ones(len(problem), dtype=bool)
    outside[blocks.start: blocks.start + blocks.count * blocks.period] = False
    assert (saved[outside] == plan.saved[outside]).all()
