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


def _defined_twice(path: Path) -> list[str]:
    """Names a module binds twice at its top level with ``def`` or ``class``: the later silently
    replaces the earlier for every caller."""
    seen, twice = set(), []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in seen:
                twice.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
            seen.add(node.name)
    return twice


def test_no_module_defines_a_top_level_name_twice():
    """A second ``class _Speech`` in the zoo had replaced Whisper's wrapper, and its tests failed
    far from the cause. ``typing.overload`` stubs would be the one legitimate repeat; none exist."""
    packages = ("planner", "solvers", "estimators", "bench", "tests")
    paths = [path for package in packages for path in sorted((ROOT / package).glob("*.py"))]
    assert paths
    assert [name for path in paths for name in _defined_twice(path)] == []
