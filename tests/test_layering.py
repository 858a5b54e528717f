"""The packages' imports are layered: no module of solvers/ imports, at any depth, one that
imports it back, and the interface (solvers.base) sits below every algorithm."""
import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent


def _imports(package: str) -> nx.DiGraph:
    """Module -> module edges for every ``from package.x import`` in ``package``, function-level
    imports included."""
    graph = nx.DiGraph()
    for path in sorted((ROOT / package).glob("*.py")):
        module = f"{package}.{path.stem}"
        graph.add_node(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package + "."):
                graph.add_edge(module, node.module)
    return graph


def test_solvers_import_no_cycle():
    assert list(nx.simple_cycles(_imports("solvers"))) == []


def test_the_solver_interface_imports_no_algorithm():
    below = nx.descendants(_imports("solvers"), "solvers.base")
    algorithms = {"solvers.ilp", "solvers.cpsat", "solvers.frugal", "solvers.greedy", "solvers.mincut",
                  "solvers.knapsack_dp", "solvers.rounding", "solvers.backends"}
    assert below.isdisjoint(algorithms), below & algorithms


def test_estimators_and_solvers_do_not_import_each_other():
    for package, other in (("solvers", "estimators"), ("estimators", "solvers")):
        for path in (ROOT / package).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert not node.module.startswith(other), f"{path.name} imports {node.module}"
