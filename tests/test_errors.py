"""Bad input gets an error that names the problem and the fix."""
import pytest

from solvers import available_solvers
import torch
import torch.nn as nn

import planner
from estimators import get_estimator
from planner.errors import CaptureError, ConfigError, InfeasibleBudget, UnknownNameError
from tests.models import MODELS


def test_unknown_estimator_lists_the_available_ones():
    with pytest.raises(UnknownNameError, match="unknown estimator 'guess'; available estimators: auto, constant, flops"):
        get_estimator("guess")


@pytest.mark.parametrize("budget", [1.5, -0.1, -3, True, [0.5], "lots"])
def test_budget_out_of_range(budget):
    with pytest.raises(ConfigError, match="memory_budget"):
        planner.PlannerConfig(memory_budget=budget)


@pytest.mark.parametrize("budget,fraction", [(0, "0.0"), (1, "1.0"), ("1", "1.0"), (" 0 ", "0.0")])
def test_a_whole_number_at_a_fractions_end_is_told_to_write_the_fraction(budget, fraction, tmp_path):
    # an int is a size in bytes, and TOML and YAML read `memory_budget = 1` as one
    with pytest.raises(ConfigError, match=rf"read as a size of {fraction[0]} byte.*no training step fits; for the "
                                          rf"fraction \(the (fast end|most memory-frugal plan)\) write {fraction}"):
        planner.PlannerConfig(memory_budget=budget)
    path = tmp_path / "plan.toml"
    path.write_text(f"memory_budget = {str(budget).strip()}\n")
    with pytest.raises(ConfigError, match=f"write {fraction}"):
        planner.PlannerConfig.from_file(path)
    assert planner.Budget.parse(2).nbytes == 2 and planner.Budget.parse("0B").nbytes == 0  # sizes still read as sizes


@pytest.mark.parametrize("text,expected", [("1.5GiB", int(1.5 * 2**30)), ("800 MB", 800 * 10**6), ("4096", 4096), ("0.25", None)])
def test_budget_sizes_parse(text, expected):
    budget = planner.Budget.parse(text)
    assert budget.nbytes == expected
    assert expected is not None or budget.fraction == 0.25


def test_plan_with_unknown_solver_names_the_choices():
    model, inputs = MODELS["mlp"]()
    with pytest.raises(ConfigError, match="solver='simplex' is not allowed; choose one of: " + ", ".join(available_solvers())):
        planner.plan(model, inputs, solver="simplex")


def test_budget_below_the_smallest_feasible_names_it():
    model, inputs = MODELS["cnn"]()  # BatchNorm outputs must be saved: the minimum is above zero
    with pytest.raises(InfeasibleBudget, match="below the smallest feasible budget") as err:
        planner.plan(model, inputs, memory_budget=16, config=planner.PlannerConfig(codegen="eager"))
    assert err.value.min_feasible_bytes > 16
    assert f"at least {err.value.min_feasible_bytes} bytes" in str(err.value)


class GraphBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        torch._dynamo.graph_break()
        return y.sum()


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return y.relu().sum()
        return y.sum()


def test_graph_break_is_a_capture_error():
    """The error names the line of the model's code where the capture stopped, and the entry
    point that plans around breaks."""
    with pytest.raises(CaptureError, match="graph break") as err:
        planner.capture(GraphBreak(), (torch.randn(2, 4),))
    assert "test_errors.py:" in str(err.value) and "`torch._dynamo.graph_break()`" in str(err.value)
    assert "planner.compile(model" in str(err.value)


def test_data_dependent_control_flow_is_a_capture_error():
    with pytest.raises(CaptureError, match="data-dependent control flow.*torch.where or torch.cond") as err:
        planner.capture(DataDependent(), (torch.randn(2, 4),))
    assert "test_errors.py:" in str(err.value) and "in forward (`if y.sum() > 0:`)" in str(err.value)
    assert "planner.compile(model" in str(err.value)


def test_model_without_gradients_is_a_capture_error():
    model = nn.Linear(4, 4).requires_grad_(False)
    with pytest.raises(CaptureError, match="nothing in this model or its inputs requires a gradient"):
        planner.capture(model, torch.randn(2, 4))


def test_example_inputs_of_the_wrong_type():
    with pytest.raises(CaptureError, match="example_inputs must be a tensor or a tuple"):
        planner.capture(nn.Linear(4, 4), {"x": torch.randn(2, 4)})


class BadShapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return (self.lin(x) + torch.ones(3)).sum()  # 4 features against 3


def test_an_op_that_fails_on_fake_tensors_is_a_capture_error_naming_the_ops_error():
    """dynamo runs the model on fake tensors before any backend; the error then names what the
    op raised, which dynamo's own first line does not."""
    with pytest.raises(CaptureError, match=r"could not run the model on fake tensors \(RuntimeError\('Attempting to "
                                           r"broadcast a dimension of length 3.*backend=\"eager\""):
        planner.capture(BadShapes(), (torch.randn(2, 4),))


@pytest.mark.parametrize("planned_inside", [False, True])
def test_a_plan_run_under_another_autocast_names_it(planned_inside):
    """A plan is made for the graph its capture saw; autocast changes that graph (its casts, the
    bytes saved), so running the planned module under another autocast says so, and the fix."""
    model, x = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)), torch.randn(4, 8)
    config = planner.PlannerConfig(codegen="eager", solver="greedy")
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    with autocast if planned_inside else torch.autocast("cpu", enabled=False):
        p = planner.plan(model, (x,), config)
        p.module(x).sum().backward()  # the context it was planned in runs
    with pytest.raises(Exception, match="call plan\\(\\) inside the same autocast") as err:
        with torch.autocast("cpu", enabled=False) if planned_inside else autocast:
            p.module(x).sum().backward()
    inside = "inside torch.autocast('cpu', dtype=torch.bfloat16)"
    assert (f"made for the model {inside} and it now runs outside" if planned_inside else
            f"made for the model outside torch.autocast and it now runs {inside}") in str(err.value)
