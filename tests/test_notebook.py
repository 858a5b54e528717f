"""The comparison notebook runs end to end (one-layer model) and shows its table and plot."""
import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from solvers import available_solvers

ESTIMATORS = ["flops", "profile"]  # every estimator is tested on its own; these two keep the run short
NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "compare_solvers.ipynb"


def test_compare_solvers_notebook_executes(tmp_path, monkeypatch):
    monkeypatch.setenv("ACPLAN_NB_LAYERS", "1")
    monkeypatch.setenv("ACPLAN_NB_ESTIMATORS", ",".join(ESTIMATORS))
    monkeypatch.setenv("ACPLAN_NB_TIME_LIMIT", "5")  # ilp runs to its limit at budget 0.0 even at 1 layer
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(NOTEBOOK.parents[1]), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    tables = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert len(tables) == 1
    for solver in available_solvers():
        assert f"| {solver} |" in tables[0]
    rows = [line for line in tables[0].splitlines()[2:]]
    assert len(rows) == 6 * len(available_solvers()) * len(ESTIMATORS)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == len(ESTIMATORS) + 1  # a predicted plot per estimator, the measured one
    expected = [f"pareto_{e}.png" for e in ESTIMATORS] + ["pareto_measured.png"]
    assert sorted(p.name for p in tmp_path.glob("pareto_*.png")) == sorted(expected)
