"""The package's domain parameters carry their types, checked from its source.

A parameter named ``conn`` (a NodeConnection), ``client`` (the docker SDK's DockerClient),
``cluster`` (a Cluster), ``inventory`` (an Inventory), ``job`` (a Job), ``node`` (an
inventory Node, or a node's name) or ``record`` (a RunRecord) says what it is in its
annotation, so a reader (and an editor) need not follow the callers to find out.  Only
that there is an annotation is checked, not which: ``node: str`` (a name) is as right as
``node: Node``.  A lambda's parameters cannot be annotated and are left out.

Every module has ``from __future__ import annotations``: an annotation is never evaluated
at run time, so a type needed only there is imported under ``if TYPE_CHECKING:``.
The source read is the one the tests import (the installed package).
"""

from __future__ import annotations

import ast
from pathlib import Path

import clusterctl

ROOT = Path(clusterctl.__file__).parent

DOMAIN = {"conn", "client", "cluster", "inventory", "job", "node", "record"}

# (module path under clusterctl/, function, parameter) still without a type: the run
# backends (issue 40) are being reworked apart from this check.  The list only shrinks:
# an entry that has its type now fails test_pending_entries_are_still_untyped.
PENDING: set[tuple[str, str, str]] = set()


def untyped(source: str, filename: str = "<source>") -> list[tuple[int, str, str]]:
    """(line, function, parameter) of each parameter named in DOMAIN without an annotation."""
    found = []
    for f in ast.walk(ast.parse(source, filename)):
        if not isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        a = f.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]:
            if arg.arg in DOMAIN and arg.annotation is None:
                found.append((arg.lineno, f.name, arg.arg))
    return sorted(found)


def _package_untyped() -> list[tuple[str, int, str, str]]:
    return [(path.relative_to(ROOT).as_posix(), line, function, param)
            for path in sorted(ROOT.rglob("*.py"))
            for line, function, param in untyped(path.read_text(), str(path))]


def test_every_domain_parameter_has_a_type():
    wrong = [f"src/clusterctl/{path}:{line}: {function}({param})"
             for path, line, function, param in _package_untyped()
             if (path, function, param) not in PENDING]
    assert not wrong, ("parameters without a type (annotate them: the types are in the "
                       "module docstring of tests/test_typed_params.py):\n" + "\n".join(wrong))


def test_pending_entries_are_still_untyped():
    still = {(path, function, param) for path, _, function, param in _package_untyped()}
    typed = sorted(PENDING - still)
    assert not typed, ("typed now (or gone): remove from PENDING in tests/test_typed_params.py: "
                       + ", ".join(f"{p}: {f}({a})" for p, f, a in typed))


def test_the_checker_sees_every_kind_of_parameter():
    source = (
        "def f(conn, /, cluster=None, *node, job: str, inventory, **record): pass\n"
        "class C:\n"
        "    async def m(self, client, node: str):\n"
        "        def one(conn): return lambda job: job\n"
        "def g(other, node: Node, record: RunRecord): pass\n"
    )
    assert untyped(source) == [
        (1, "f", "cluster"), (1, "f", "conn"), (1, "f", "inventory"), (1, "f", "node"),
        (1, "f", "record"), (3, "m", "client"), (4, "one", "conn"),
    ]
