"""``acplan check``: one seeded step eager, under torch.compile and planned, compared tensor by tensor."""
import copy

import pytest
import torch

from planner import cli
from planner.check import FLOOR, SLACK, WIDE, Step, allowance_note, check_model, compare_steps, train_step
from tests.models import MODELS


def tiny_cnn():
    return MODELS["cnn"]()


def tiny_gpt():
    return MODELS["gpt"]()  # dropout 0.1: the planned step must draw eager's masks


def test_check_passes_planned_models_and_prints_the_table(capsys):
    code = cli.main(["check", "tests.test_check:tiny_gpt", "--budgets", "1", "0", "--time-limit", "1", "--dtype", "float64"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "| torch.compile |" in printed and printed.count("| yes |") == 2
    assert "from torch.compile's step |" in printed
    assert "every planned step trains like eager" in printed


def test_check_under_autocast_passes_planned_steps_and_fails_one_run_outside_it(capsys):
    code = cli.main(["check", "tests.test_check:tiny_gpt", "--budgets", "1", "0", "--time-limit", "1",
                     "--autocast", "bfloat16"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.count("| yes |") == 2

    def full_precision(model, budget):  # ignores the autocast the step runs in
        def run(*inputs):
            with torch.autocast("cpu", enabled=False):
                return model(*inputs)
        return run

    (row,) = check_model(tiny_gpt(), [1.0], full_precision, torch_compile=False, autocast=torch.bfloat16)
    assert row["passed"] is False


def _weight_moved(model, budget):
    """A "plan" that trains another model: one weight moved."""
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    return model


def test_a_planned_step_that_differs_fails_the_check():
    rows = check_model(tiny_cnn(), [1.0], _weight_moved, dtype=torch.float64, torch_compile=False)
    (row,) = rows
    assert row["passed"] is False and row["relative"] > 1e-5


def test_a_planned_step_drawing_other_dropout_masks_fails_the_check():
    def reseeded(model, budget):  # draws its dropout masks from another seed
        def run(*inputs):
            torch.manual_seed(99)
            return model(*inputs)
        return run

    (row,) = check_model(tiny_gpt(), [0.0], reseeded, torch_compile=False)
    assert row["passed"] is False


class _RunningSum(torch.nn.Module):
    """Adds each batch's mean activation into a tensor the caller passes in (a running statistic)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.fc(x))
        total.add_(y.detach().mean(0))
        return y * total.sum()


def test_every_run_of_the_check_gets_the_inputs_as_given():
    """A model that updates an input in place: each run starts from the inputs as given, so the
    same step (here eager's own, run again) compares equal, and the caller's inputs are untouched."""
    torch.manual_seed(0)
    made = (_RunningSum(), (torch.randn(5, 8), torch.zeros(8)))
    rows = check_model(made, [1.0, 0.0], lambda model, budget: model, torch_compile=False)
    assert [row["relative"] for row in rows] == [0.0, 0.0] and all(row["passed"] for row in rows)
    assert torch.equal(made[1][1], torch.zeros(8))


def test_the_allowance_follows_torch_compiles_own_difference():
    rows = check_model(tiny_cnn(), [0.0], lambda model, budget: torch.compile(model), tolerance=0.0)
    reference, planned = rows
    assert reference["run"] == "torch.compile" and reference["passed"] is None
    assert planned["allowed"] == pytest.approx(SLACK * reference["relative"])
    assert planned["passed"] is (planned["relative"] <= planned["allowed"])
    # the "plan" is torch.compile itself: beside eager's yardstick, its difference from
    # torch.compile's step is rounding at most, and a step that trains another model is far from it
    assert planned["from_torch_compile"] <= 1e-6

    (_, moved) = check_model(tiny_cnn(), [0.0], lambda model, budget: torch.compile(_weight_moved(model, budget)),
                             dtype=torch.float64)
    assert moved["from_torch_compile"] > 1e-5 and moved["passed"] is False
    assert all("from_torch_compile" not in row for row in rows if row["run"] == "torch.compile")


def test_a_wide_allowance_is_said_with_what_it_lets_pass():
    rows = [{"run": "torch.compile", "relative": 0.3, "where": "gradient l1.bias", "passed": None},
            {"run": "planner, budget 0.0", "relative": 0.3, "where": "gradient l1.bias", "passed": True,
             "allowed": SLACK * 0.3}]
    note = allowance_note(rows)
    assert note is not None and "3.0e-01 (gradient l1.bias)" in note and "wrong the way torch.compile's is" in note
    narrow = [dict(rows[0], relative=WIDE / SLACK / 2), dict(rows[1], allowed=WIDE / 2)]
    assert allowance_note(narrow) is None
    assert allowance_note(rows[1:]) is None  # no torch.compile run: the tolerance alone


def test_compare_steps_names_the_worst_tensor_and_a_missing_gradient():
    model, inputs = MODELS["mlp"]()
    want = train_step(model, model, inputs)
    got = copy.deepcopy(want)
    name = next(iter(got.grads))
    got.grads[name] = got.grads[name] * (1 + 1e-3)
    found = compare_steps(got, want)
    assert found.where == f"gradient {name}" and found.relative == pytest.approx(1e-3, rel=1e-2)
    missing = Step(want.output, {**want.grads, name: None}, want.buffers)
    assert compare_steps(missing, want).relative == float("inf")


def test_a_gradient_zero_but_for_rounding_is_measured_against_the_steps_largest():
    model, inputs = MODELS["mlp"]()
    want = train_step(model, model, inputs)
    names = sorted(want.grads, key=lambda n: want.grads[n].abs().max().item())
    largest = want.grads[names[-1]].abs().max().item()
    # eager's gradient of one parameter is rounding (as an attention key's bias), the step's is other rounding
    rounding = {**want.grads, names[0]: torch.full_like(want.grads[names[0]], 1e-12 * largest)}
    got = Step(want.output, {**rounding, names[0]: -rounding[names[0]]}, want.buffers)
    found = compare_steps(got, Step(want.output, rounding, want.buffers))
    assert found.relative == pytest.approx(2e-12 / FLOOR, rel=1e-6)
    # a gradient as small, wrong by as much as the floor, still counts in full
    wrong = {**rounding, names[0]: rounding[names[0]] + FLOOR * largest}
    assert compare_steps(Step(want.output, wrong, want.buffers), Step(want.output, rounding, want.buffers)).relative \
        == pytest.approx(1.0, rel=1e-6)


def test_a_buffer_zero_but_for_rounding_is_measured_against_the_steps_largest():
    model, inputs = MODELS["cnn"]()  # BatchNorm: running means and variances
    want = train_step(model, model, inputs)
    floating = sorted((n for n, b in want.buffers.items() if b.is_floating_point()),
                      key=lambda n: want.buffers[n].abs().max().item())
    largest = want.buffers[floating[-1]].abs().max().item()
    rounding = {**want.buffers, floating[0]: torch.full_like(want.buffers[floating[0]], 1e-12 * largest)}
    got = Step(want.output, want.grads, {**rounding, floating[0]: -rounding[floating[0]]})
    found = compare_steps(got, Step(want.output, want.grads, rounding))
    assert found.relative == pytest.approx(2e-12 / FLOOR, rel=1e-6)
