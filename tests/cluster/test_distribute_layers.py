"""The distribute package's shape: modules import only those below them; no docker at import.

Pure checks (no engine, no nodes): the order is the one the package docstring
draws, read from each module's own import statements.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import clusterctl.cluster.distribute as distribute

#: top first; a module may import only modules after it in this list
ORDER = ["fanout", "relay", "wire", "relayplan", "node", "imagesource", "storesave",
         "layerstore", "tarsplit", "savestream", "layerfilter", "layout", "tarstream", "source", "trace"]
PACKAGE = "clusterctl.cluster.distribute"


def _imports(module: str) -> set[str]:
    tree = ast.parse((Path(distribute.__file__).parent / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
            found.add(node.module.removeprefix(PACKAGE + "."))
    return found


def test_every_module_is_in_the_drawn_order():
    on_disk = {p.stem for p in Path(distribute.__file__).parent.glob("*.py")} - {"__init__"}
    assert on_disk == set(ORDER)


def test_modules_import_only_modules_below_them():
    for i, module in enumerate(ORDER):
        upward = _imports(module) - set(ORDER[i + 1:])
        assert not upward, f"{module} imports {sorted(upward)}, which are not below it"


def test_importing_the_package_does_not_import_docker():
    code = f"import sys, {PACKAGE}; print('docker' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"
