"""What a decision means: recompute closure, memory, and the two ends of the budget range."""
import numpy as np
import pytest
from hypothesis import given, settings

from planner.bounds import min_memory_plan, runtime_optimal_plan
from planner.problem import InfeasibleDecision, Problem, evaluate
from tests.synthetic import brute_force_min_memory, problems


def chain(nbytes, runtime, needed, random=None, recomputable=None, saveable=None):
    """A chain n0 -> n1 -> ... ; each node reads the one before."""
    n = len(nbytes)
    return Problem(
        names=tuple(f"n{i}" for i in range(n)),
        nbytes=np.array(nbytes, dtype=np.int64),
        runtime=np.array(runtime, dtype=float),
        saveable=np.array(saveable if saveable is not None else [b > 0 for b in nbytes]),
        recomputable=np.array(recomputable if recomputable is not None else [True] * n),
        random=np.array(random if random is not None else [False] * n),
        needed=np.array(needed),
        input_ptr=np.array([0] + list(range(n)), dtype=np.int64),
        input_idx=np.arange(n - 1, dtype=np.int64),
        rng_state_bytes=3,
    )


def test_recomputing_a_node_recomputes_its_unsaved_inputs():
    p = chain([10, 20, 30], [1.0, 2.0, 4.0], [False, False, True])
    result = evaluate(p, p.mask([]))
    assert result.recomputed.tolist() == [True, True, True]
    assert result.recompute_seconds == 7.0 and result.memory_bytes == 0
    result = evaluate(p, p.mask([1]))
    assert result.recomputed.tolist() == [False, False, True]
    assert result.recompute_seconds == 4.0 and result.memory_bytes == 20


def test_saved_nodes_the_backward_never_reads_are_pruned():
    p = chain([10, 20, 30], [1.0, 2.0, 4.0], [False, False, True])
    result = evaluate(p, p.mask([0, 2]))
    assert result.saved.tolist() == [False, False, True] and result.memory_bytes == 30


def test_recomputed_random_node_keeps_an_rng_state():
    p = chain([10, 20], [1.0, 1.0], [False, True], random=[True, False])
    assert evaluate(p, p.mask([])).memory_bytes == 2 * 0 + 3
    assert evaluate(p, p.mask([0])).memory_bytes == 10


def test_unrecomputable_needed_node_must_be_saved():
    p = chain([10, 20], [1.0, 1.0], [False, True], recomputable=[False, True])
    with pytest.raises(InfeasibleDecision, match="cannot be recomputed"):
        evaluate(p, p.mask([]))
    assert evaluate(p, p.mask([0])).memory_bytes == 10


def test_views_cannot_be_saved():
    p = chain([10, 0], [1.0, 0.0], [False, True])
    with pytest.raises(InfeasibleDecision, match="cannot be saved"):
        evaluate(p, p.mask([1]))


def test_problem_rejects_inputs_out_of_topological_order():
    with pytest.raises(ValueError, match="topological"):
        Problem(("a", "b"), np.ones(2, int), np.ones(2), np.ones(2, bool), np.ones(2, bool),
                np.zeros(2, bool), np.ones(2, bool), np.array([0, 1, 1]), np.array([1]))


def test_bounds_on_a_chain():
    p = chain([10, 5, 30], [1.0, 2.0, 4.0], [False, False, True], random=[True, False, False])
    assert min_memory_plan(p).memory_bytes == 3  # recompute all, keep one RNG state
    fast = runtime_optimal_plan(p)
    assert fast.memory_bytes == 30 and fast.recompute_seconds == 0.0


@settings(max_examples=60, deadline=None)
@given(problems)
def test_min_memory_plan_is_the_true_minimum(problem):
    assert min_memory_plan(problem).memory_bytes == brute_force_min_memory(problem)


@settings(max_examples=60, deadline=None)
@given(problems)
def test_runtime_optimal_plan_recomputes_only_free_nodes(problem):
    fast = runtime_optimal_plan(problem)
    assert fast.recompute_seconds == 0.0
    assert fast.memory_bytes >= min_memory_plan(problem).memory_bytes
