"""Every plan trains exactly like eager PyTorch: same loss, gradients and BatchNorm statistics."""
import pytest
import torch

import planner
from solvers import available_solvers
from tests.models import MODELS
from tests.training import assert_same_step

BUDGETS = [0.0, 0.5, 1.0]
# ilp (HiGHS) cannot be started from a known plan, so at tight budgets it may spend its whole
# time limit before falling back to the frugal plan; a short limit keeps these tests quick.
EAGER = planner.PlannerConfig(codegen="eager", estimator="flops", time_limit=5)


@pytest.mark.parametrize("solver", available_solvers())
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_plan_trains_like_eager(model, budget, solver):
    def run_planned(twin, inputs):
        return planner.plan(twin, inputs, memory_budget=budget, solver=solver, config=EAGER).module

    assert_same_step(MODELS[model], run_planned)


@pytest.mark.parametrize("solver", available_solvers())
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_backend_trains_like_eager(model, budget, solver):
    be = planner.backend(EAGER, memory_budget=budget, solver=solver)

    def run_planned(twin, inputs):
        return torch.compile(twin, backend=be)

    assert_same_step(MODELS[model], run_planned)
    assert len(be.graphs) == 1 and be.graphs[0].decision.solver == solver


@pytest.mark.parametrize("model", ["gpt", "cnn"])
def test_inductor_codegen_trains_like_eager(model):
    # Inductor draws random numbers with its own generator unless told to use eager's.
    with torch._inductor.config.patch(fallback_random=True):
        be = planner.backend(planner.PlannerConfig(codegen="inductor"), memory_budget=0.0, solver="cpsat")
        assert_same_step(MODELS[model], lambda twin, inputs: torch.compile(twin, backend=be))
    assert be.graphs and be.graphs[0].decision.recompute_seconds > 0


class _FrozenPositions(torch.nn.Module):
    """Frozen sinusoidal positions (as Marian's and Pegasus's) and a layer the loss never reaches:
    neither parameter has a gradient, in eager or planned."""

    def __init__(self) -> None:
        super().__init__()
        self.positions = torch.nn.Parameter(torch.randn(8, 16), requires_grad=False)
        self.layer = torch.nn.Linear(16, 16)
        self.unused = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer(x + self.positions).tanh()
        return (self.layer(h) * h).sum()


@pytest.mark.parametrize("budget", [0.0, 1.0])
def test_frozen_and_unreached_parameters_train_like_eager(budget):
    def make():
        torch.manual_seed(0)
        return _FrozenPositions(), (torch.randn(4, 8, 16),)

    assert_same_step(make, lambda twin, inputs: planner.compile(twin, memory_budget=budget, codegen="eager", time_limit=5))
