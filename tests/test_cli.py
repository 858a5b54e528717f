"""acplan: plan and compare from the command line; bad arguments exit non-zero with a message."""
import json

import pytest

from planner import cli
from planner.comparison import sweep, to_markdown
from tests.models import MODELS


def tiny_gpt():
    return MODELS["gpt"]()


def test_plan_prints_the_summary_and_writes_the_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "tests.test_cli:tiny_gpt", "--budget", "0.5", "--solver", "dp", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "dp (heuristic" in printed and f"wrote {out}" in printed
    assert json.loads(out.read_text())["settings"]["solver"] == "dp"


def test_compare_writes_table_and_plot(tmp_path, capsys):
    code = cli.main(["compare", "tests.test_cli:tiny_gpt", "--budgets", "1", "0", "--solvers", "greedy", "cpsat",
                     "--out-dir", str(tmp_path)])
    assert code == 0
    table = (tmp_path / "compare.md").read_text()
    assert table.count("| greedy |") == 2 and table.count("| cpsat |") == 2
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv,code,message", [
    (["plan", "no_such_module:f"], 1, "cannot import module 'no_such_module'"),
    (["plan", "tests.test_cli"], 1, "is not MODULE:FACTORY"),
    (["plan", "tests.test_cli:missing"], 1, "has no function 'missing'"),
    (["plan", "tests.test_cli:tiny_gpt", "--solver", "magic"], 1, "solver='magic' is not allowed"),
    (["plan", "tests.test_cli:tiny_gpt", "--budget", "7"], 1, "memory_budget=7.0 is out of range"),
    (["compare", "tests.test_cli:tiny_gpt", "--solvers", "magic"], 2, "invalid choice: 'magic'"),
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    (["plan", "tests.test_cli:tiny_gpt", "--time-limit", "soon"], 2, "'soon' is not a number of seconds or auto"),
])
def test_bad_arguments_exit_non_zero_with_a_message(argv, code, message, capsys):
    try:
        result = cli.main(argv)
    except SystemExit as exit_:
        result = exit_.code
    assert result == code
    assert message in capsys.readouterr().err


def test_help_documents_every_option(capsys):
    for command in ("plan", "compare", "check"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        text = capsys.readouterr().out
        for action in cli.build_parser()._subparsers._group_actions[0].choices[command]._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{command} {action.option_strings} has no help"
                assert action.option_strings[-1] in text


def test_sweep_records_every_combination():
    model, inputs = MODELS["mlp"]()
    records = sweep(model, inputs, [1.0, 0.0], ["greedy", "cpsat"], ["constant", "flops"], progress=False)
    assert {(r["solver"], r["estimator"], r["budget"]) for r in records} == {
        (s, e, b) for s in ("greedy", "cpsat") for e in ("constant", "flops") for b in (1.0, 0.0)}
    assert all(r["saved_bytes"] <= r["budget_bytes"] for r in records)
    assert len(to_markdown(records).splitlines()) == 2 + len(records)
