"""Real models from transformers and timm (the zoo extra), tiny, planned at default settings:
each trains exactly like eager at the frugal end and at budget 1.0."""
import pytest

import planner
from tests.training import assert_same_step

pytest.importorskip("transformers")
pytest.importorskip("timm")

from bench.zoo_models import MODELS, build  # noqa: E402  (needs the zoo extra)


@pytest.mark.parametrize("budget", [0.0, 1.0])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_model_trains_like_eager(name, budget):
    graphs = []

    def run(model, inputs):
        compiled = planner.compile(model, memory_budget=budget, codegen="eager", time_limit=5)
        graphs.append(compiled.planner_backend)
        return compiled

    assert_same_step(lambda: build(name, "tiny"), run)
    (backend,) = graphs
    assert backend.graphs and all(g.estimator == "auto (flops)" for g in backend.graphs)
    if budget == 0.0:  # each graph at its most frugal peak
        from solvers.frugal import min_peak_plan

        for g in backend.graphs:
            assert g.decision.peak_bytes <= g.decision.budget_bytes == min_peak_plan(g.problem, 5).plan.peak_bytes
