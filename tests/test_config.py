"""PlannerConfig: every field validated, files read from TOML or YAML."""
import pytest

from solvers import available_solvers

import planner
from planner import PlannerConfig
from planner.errors import ConfigError


def test_defaults_are_valid():
    config = PlannerConfig()
    assert config.budget.fraction == 1.0 and config.solver == "cpsat"


def test_toml_file(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text('[planner]\nmemory_budget = "2GiB"\nsolver = "dp"\ntime_limit = 5\n[planner.solver_options]\nresolution = 128\n')
    config = PlannerConfig.from_file(path)
    assert config.budget.nbytes == 2 * 2**30 and config.solver == "dp"
    assert config.solver_options == {"resolution": 128} and config.time_limit == 5


def test_yaml_file(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("memory_budget: 0.3\nestimator: constant\ncodegen: eager\n")
    config = PlannerConfig.from_file(path)
    assert config.budget.fraction == 0.3 and config.estimator == "constant" and config.codegen == "eager"


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("bad.toml", "memory_budget = [", "is not valid TOML"),
        ("bad.yaml", "memory_budget: [0.5", "is not valid YAML"),
        ("unknown.toml", "memory_budjet = 0.5",
         "unknown field.*memory_budjet \\(did you mean memory_budget\\?\\).*allowed fields: memory_budget"),
        ("solver.toml", 'solver = "magic"', "solver='magic' is not allowed; choose one of: " + ", ".join(available_solvers())),
        ("estimator.toml", 'estimator = "magic"', "estimator='magic' is not allowed; choose one of: auto, constant, flops"),
        ("codegen.toml", 'codegen = "tvm"', "codegen='tvm' is not allowed; choose one of: eager, inductor"),
        ("fast_end.toml", 'fast_end = "torch"', "fast_end='torch' is not allowed; choose one of: pytorch, model"),
        ("limit.toml", "time_limit = -1", "time_limit=-1 is invalid"),
        ("limit_text.toml", 'time_limit = "soon"', "time_limit='soon' is invalid; give a positive number of seconds or \"auto\""),
        ("budget.toml", "memory_budget = 3.5", "memory_budget=3.5 is out of range"),
        ("options.toml", 'solver_options = "fast"', "solver_options must be a table"),
        ("list.yaml", "- 1\n- 2", "expected a table of planner settings"),
        ("plan.json", "{}", "must end in .toml, .yaml or .yml"),
    ],
)
def test_bad_files_name_the_problem(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        PlannerConfig.from_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        PlannerConfig.from_file(tmp_path / "absent.toml")


def test_plan_takes_a_config_as_its_third_argument():
    from planner.models import GPTConfig, gpt_example

    model, batch = gpt_example(GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=8, vocab=32, batch=2))
    result = planner.plan(model, batch, PlannerConfig(memory_budget=0.0, solver="greedy"))
    assert result.config.solver == "greedy" and result.config.budget.fraction == 0.0


def test_auto_time_limit_scales_with_the_problem_within_its_range():
    from planner.config import AUTO_TIME_LIMIT

    per_node, least, most = AUTO_TIME_LIMIT
    auto = PlannerConfig()
    assert auto.time_limit == "auto"
    assert auto.solver_seconds(10) == least and auto.solver_seconds(10**7) == most
    middle = int((least + most) / 2 / per_node)
    assert auto.solver_seconds(middle) == pytest.approx(per_node * middle)
    assert auto.solver_seconds(2 * middle) > auto.solver_seconds(middle)
    assert PlannerConfig(time_limit=7).solver_seconds(10**7) == 7.0


def test_auto_time_limit_is_bounded_by_a_multiple_of_pytorchs_partition_time():
    from planner.config import AUTO_FAST_END_MULTIPLE, AUTO_PARTITION_MULTIPLE, AUTO_TIME_LIMIT

    per_node, least, most = AUTO_TIME_LIMIT
    auto = PlannerConfig(memory_budget=0.5)
    nodes = int(most / per_node)  # the per-node rule alone gives the most
    quick = (least + most) / 2 / AUTO_PARTITION_MULTIPLE
    assert auto.solver_seconds(nodes, quick) == pytest.approx(AUTO_PARTITION_MULTIPLE * quick)
    assert auto.solver_seconds(nodes, quick) < auto.solver_seconds(nodes)
    assert auto.solver_seconds(nodes, 1e-6) == least  # still at least the least
    small = int(2 * least / per_node)  # a slow partition never raises the per-node limit
    assert auto.solver_seconds(small, 1e3) == auto.solver_seconds(small) == pytest.approx(per_node * small)
    assert PlannerConfig(time_limit=7).solver_seconds(nodes, quick) == 7.0
    # at budget 1.0 (the default) the split runs unless the solver's plan holds clearly less
    assert PlannerConfig().solver_seconds(nodes, quick) == pytest.approx(max(least, AUTO_FAST_END_MULTIPLE * quick))
    assert PlannerConfig().solver_seconds(nodes, quick) < auto.solver_seconds(nodes, quick)


def test_every_entry_point_takes_any_setting_by_keyword_and_names_a_misspelt_one():
    import torch

    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    p = planner.plan(model, (x,), memory_budget=0.5, time_limit=3, codegen="eager", solver="greedy")
    assert (p.config.time_limit, p.config.codegen, p.config.solver) == (3, "eager", "greedy")
    for entry in (lambda: planner.plan(model, (x,), tim_limit=3), lambda: planner.compile(model, tim_limit=3),
                  lambda: planner.backend(tim_limit=3), lambda: PlannerConfig().replace(tim_limit=3)):
        with pytest.raises(ConfigError, match=r"unknown field\(s\) tim_limit \(did you mean time_limit\?\); allowed fields: "
                                              r"memory_budget, solver"):
            entry()
