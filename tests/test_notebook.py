"""The comparison notebook runs end to end (one-layer model) and shows its table and plot."""
import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from estimators import available_estimators
from solvers import available_solvers

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "compare_solvers.ipynb"


def test_compare_solvers_notebook_executes(tmp_path, monkeypatch):
    monkeypatch.setenv("ACPLAN_NB_LAYERS", "1")
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
    assert len(rows) == 6 * len(available_solvers()) * len(available_estimators())
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == len(available_estimators())
    assert sorted(p.name for p in tmp_path.glob("pareto_*.png")) == [f"pareto_{e}.png" for e in available_estimators()]
