"""Plan files: reused without solving when they match, refused clearly when they do not."""
import json

import pytest
import torch

import planner
import planner.solve
from planner.errors import PlanFileError
from planner.plan_file import VERSION
from tests.models import MODELS
from tests.training import assert_same_step

EAGER = planner.PlannerConfig(codegen="eager")


def test_plan_file_is_written_then_reused_without_solving(tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    model, inputs = MODELS["gpt"]()
    first = planner.plan(model, inputs, memory_budget=0.5, solver="cpsat", config=EAGER, plan_file=path)
    assert json.loads(path.read_text())["fingerprint"] == first.graph_plan.fingerprint

    def no_solving(*args, **kwargs):
        raise AssertionError("a matching plan file must not be solved again")

    monkeypatch.setattr(planner.solve, "get_solver", no_solving)
    torch._dynamo.reset()

    def run_planned(twin, inputs):
        again = planner.plan(twin, inputs, memory_budget=0.5, solver="cpsat", config=EAGER, plan_file=path)
        assert again.decision == first.decision
        return again.module

    assert_same_step(MODELS["gpt"], run_planned)


def test_plan_file_for_another_graph_is_refused(tmp_path):
    path = tmp_path / "plan.json"
    planner.plan(*MODELS["mlp"](), memory_budget=0.5, config=EAGER, plan_file=path)
    with pytest.raises(PlanFileError, match="solved for another graph"):
        planner.plan(*MODELS["views_inplace"](), memory_budget=0.5, config=EAGER, plan_file=path)


def test_plan_file_with_other_settings_is_refused(tmp_path):
    path = tmp_path / "plan.json"
    model, inputs = MODELS["mlp"]()
    planner.plan(model, inputs, memory_budget=0.5, solver="cpsat", config=EAGER, plan_file=path)
    with pytest.raises(PlanFileError, match="was solved with .*'memory_budget': 0.5"):
        planner.plan(model, inputs, memory_budget=0.2, solver="cpsat", config=EAGER, plan_file=path)


@pytest.mark.parametrize("damage,message", [
    (lambda text: text[: len(text) // 2], "not valid JSON .* truncated"),
    (lambda text: "[1, 2]", "not an acplanner plan file"),
    (lambda text: text.replace(f'"version": {VERSION}', '"version": 99'), "version 99"),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "decision"}), "lacks decision"),
    (lambda text: text.replace('"saved": [', '"saved": ["no_such_node", '), "does not fit this graph.*no_such_node"),
])
def test_damaged_plan_file_is_refused_whole(tmp_path, damage, message):
    path = tmp_path / "plan.json"
    model, inputs = MODELS["mlp"]()
    planner.plan(model, inputs, memory_budget=0.5, config=EAGER, plan_file=path)
    path.write_text(damage(path.read_text()))
    with pytest.raises(PlanFileError, match=message):
        planner.plan(model, inputs, memory_budget=0.5, config=EAGER, plan_file=path)
