"""A model compiled block by block: one graph run once per block before its backward."""
import copy
import warnings

import pytest
import torch

import planner
from planner.models import GPTConfig, gpt_example
from planner.problem import evaluate
from tests.training import step

FOUR = GPTConfig(n_layer=4, d_model=32, n_head=2, seq_len=16, vocab=64, batch=2, dropout=0.0)
EXACT = dict(codegen="eager", solver="cpsat", time_limit=10)


def _with_other_runs(timeline, blocks) -> int:
    """A block graph's peak in a step that runs it once per block: the other runs' saved values
    alive through the last run's forward and backward, or their gradients (each block's own
    parameters) through the first run's backward, which runs last."""
    others = (len(blocks) - 1) * timeline.held_after_forward
    grads = (len(blocks) - 1) * sum(p.numel() * p.element_size() for p in blocks[0].parameters())
    return max(timeline.forward_peak + others, timeline.backward_peak + max(others, grads))


def test_blocks_compiled_with_compile_blocks_train_like_eager_and_share_one_graph_planned_for_every_run():
    model, batch = gpt_example(FOUR)
    twin = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*before its backward")  # planned for every run: no warning
        backend = planner.compile_blocks(twin.blocks, memory_budget=0.0, **EXACT)
        expected, got = step(model, batch, model), step(twin, batch, twin)
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=0)
    grads = {name.replace("._orig_mod", ""): grad for name, grad in got[1].items()}
    assert grads.keys() == expected[1].keys()
    for name, grad in expected[1].items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=0, msg=name)
    inner = [b._orig_mod for b in twin.blocks]  # compiled as torch.compile(block) is
    assert [type(b).__name__ for b in inner] == ["Block"] * 4 and isinstance(inner[0], type(model.blocks[0]))
    assert len(backend.graphs) == 1 and backend.runs == {next(iter(backend.runs)): 4}
    problem = backend.graphs[0].problem
    assert problem.schedule.repeats == 4
    # the step's predicted peak holds the other three runs' saved values through the last run's
    # forward, and their gradients (each block's own parameters) through the first run's backward
    assert backend.predicted_step_peak == _with_other_runs(backend.timelines[0], twin.blocks)


def test_the_frugal_end_of_a_repeated_block_has_the_least_step_peak():
    from solvers.frugal import min_peak_plan

    model, batch = gpt_example(FOUR)
    planned = {}
    for repeats in (1, 4):
        blocks = copy.deepcopy(model).blocks
        backend = planner.PlannerBackend(planner.PlannerConfig(memory_budget=0.0, **EXACT), repeats=repeats)
        planner.frames.own_forward(blocks)
        x = torch.randn(FOUR.batch, FOUR.seq_len, FOUR.d_model, requires_grad=True)
        out = x
        for block in blocks:
            block.compile(backend=backend)
            out = block(out)
        out.sum().backward()
        planned[repeats] = backend.graphs[0]
    repeated = planned[4].problem
    least = min_peak_plan(repeated, 10)
    assert least.optimal
    one_run_plan = evaluate(repeated, repeated.mask(repeated.index(planned[1].decision.saved)))
    four_run_plan = evaluate(repeated, repeated.mask(repeated.index(planned[4].decision.saved)))
    # counted over the four runs, the plan made for them has the least peak; the plan made for
    # one run (its outputs handed on, so it models the rest of the step) holds no less
    assert four_run_plan.peak_bytes == least.plan.peak_bytes <= one_run_plan.peak_bytes


def test_a_graph_run_more_often_than_planned_warns_and_is_planned_again_for_its_runs():
    model, batch = gpt_example(FOUR)
    twin = copy.deepcopy(model)
    backend = planner.backend(memory_budget=0.0, **EXACT)
    planner.frames.own_forward(twin.blocks)
    for block in twin.blocks:
        block.compile(backend=backend)
    with pytest.warns(UserWarning, match=r"ran its forward 4 times before its backward, and was planned for 1: "
                                         r"it is planned again for 4 runs"):
        step(twin, batch, twin)
    assert list(backend.runs.values()) == [4] and backend.graphs[0].problem.schedule.repeats == 1
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*before its backward")  # counted again, no new warning
        for _ in range(2):  # the next step runs the graph planned for 4 runs, and trains like eager
            for p in [*model.parameters(), *twin.parameters()]:
                p.grad = None
            expected, got = step(model, batch, model), step(twin, batch, twin)
            torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=0)
            for name, grad in expected[1].items():
                torch.testing.assert_close(got[1][name], grad, atol=1e-5, rtol=0, msg=name)
    assert list(backend.runs.values()) == [4]
    (graph,) = backend.graphs
    assert graph.problem.schedule.repeats == 4
    assert backend.predicted_step_peak == _with_other_runs(backend.timelines[0], twin.blocks)


def test_without_replan_a_graph_run_more_often_than_planned_says_its_other_runs_are_outside_the_budget():
    model, batch = gpt_example(FOUR)
    backend = planner.backend(memory_budget=1.0, replan=False, codegen="eager", solver="greedy", time_limit=5)
    planner.frames.own_forward(model.blocks)
    for block in model.blocks:
        block.compile(backend=backend)
    with pytest.warns(UserWarning, match=r"planned for 1: the saved values of its other runs are outside"):
        model(*batch).backward()
    model(*batch).backward()
    assert list(backend.runs.values()) == [4] and backend.graphs[0].problem.schedule.repeats == 1


def test_compile_blocks_refuses_what_is_not_a_list_of_blocks():
    with pytest.raises(planner.ConfigError, match="non-empty nn.ModuleList, nn.Sequential or nn.ModuleDict"):
        planner.compile_blocks([torch.nn.Linear(2, 2)])
    with pytest.raises(planner.ConfigError, match="got ModuleList"):
        planner.compile_blocks(torch.nn.ModuleList())
    with pytest.raises(planner.ConfigError, match="repeats=0 is invalid"):
        planner.PlannerBackend(planner.PlannerConfig(), repeats=0)


def test_thirty_two_blocks_compiled_one_by_one_are_solved_once():
    cfg = GPTConfig(n_layer=32, d_model=16, n_head=2, seq_len=8, vocab=32, batch=2, dropout=0.0)
    model, batch = gpt_example(cfg)
    backend = planner.compile_blocks(model.blocks, memory_budget=0.5, codegen="eager", solver="greedy", time_limit=5)
    for _ in range(2):
        model(*batch).backward()
    assert len(backend.graphs) == 1 and backend.repeats == 32
    assert list(backend.runs.values()) == [32]


def test_a_repeated_block_holds_the_least_through_a_larger_graph_after_it():
    # a layer resumed after a graph break (or an encoder's layers under a decoder's) runs several
    # times, then other graphs run before its backward; planned for its own least peak, the block
    # kept one more activation per run, alive under the head's backward, which sets the step's peak
    model, _ = gpt_example(FOUR)
    blocks, head = copy.deepcopy(model).blocks, torch.nn.Linear(FOUR.d_model, 4096)
    backend = planner.PlannerBackend(planner.PlannerConfig(memory_budget=0.0, **EXACT))
    planner.frames.own_forward([*blocks, head])
    for module in [*blocks, head]:
        module.compile(backend=backend)
    x = torch.randn(FOUR.batch, FOUR.seq_len, FOUR.d_model, requires_grad=True)
    labels = torch.zeros(FOUR.batch * FOUR.seq_len, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*before its backward")  # planned again for its 4 runs
        for _ in range(3):  # compiled, seen and planned again, run as planned
            out = x
            for block in blocks:
                out = block(out)
            torch.nn.functional.cross_entropy(head(out).flatten(0, 1), labels).backward()
    (block_part, block_line), (head_part, head_line) = backend._live.items()
    assert backend._repeats_of(block_part) == 4 and backend._repeats_of(head_part) == 1
    assert head_line.peak > 4 * block_line.peak  # the head's backward sets the step's peak
    assert block_line.held_after_forward == out.numel() * out.element_size()  # its output alone
    assert backend.predicted_step_peak == 4 * block_line.held_after_forward + head_line.peak
