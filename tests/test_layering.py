"""The package's layers, checked from its source: no import cycles, and each layer imports
only the layers below it.

    core  <-  image, cluster  <-  code  <-  run  <-  cli

image (the image side) and cluster (the nodes side) are independent of each other:
an image is built without knowing the nodes, and nodes are reached without knowing
how their images were made; run/ is where the two meet.  code (what of a user's
workdir ships, as a content-addressed snapshot) sits between cluster and run: it may
use core and cluster, never image (a workdir is shipped whatever image runs it), and
only run and cli use it.

Every ``import`` counts, also one inside a function (a cycle hidden in a function
is still a cycle: it only fails later) - except under ``if TYPE_CHECKING:``.
The source read is the one the tests import (the installed package).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import clusterctl

ROOT = Path(clusterctl.__file__).parent

# layer -> the layers it may not import
FORBIDDEN = {
    "core": {"image", "cluster", "code", "run", "cli"},
    "image": {"cluster", "code", "run", "cli"},
    "cluster": {"image", "code", "run", "cli"},
    "code": {"image", "run", "cli"},
    "run": {"cli"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    todo = [tree]
    while todo:
        node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                todo.extend(child.orelse)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            todo.append(child)


def _target(name: str) -> str | None:
    """The clusterctl module ``name`` is (or lies in), None outside the package."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """The clusterctl modules ``module`` imports (a package's own __init__ only when named)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the submodule; `from mod import name` the module
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for name in names:
            target = _target(name)
            if target and target != module:
                found.add(target)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in {*FORBIDDEN, "cli"} else None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_the_package_has_modules_in_every_layer():
    assert {layer(m) for m in MODULES} >= {"core", "image", "cluster", "code", "run", "cli"}


def test_no_import_cycles():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("lower", sorted(FORBIDDEN))
def test_a_layer_imports_only_the_layers_below_it(lower):
    wrong = sorted(f"{m} imports {n}" for m, targets in GRAPH.items() if layer(m) == lower
                   for n in targets if layer(n) in FORBIDDEN[lower])
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_cycles_and_relative_imports():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert "clusterctl.core.errors" in GRAPH["clusterctl.run.records"]
    assert "clusterctl.cluster.containers" in GRAPH["clusterctl.run.supervise"]
    assert "clusterctl.code.ignore" in GRAPH["clusterctl.code.snapshot"]
