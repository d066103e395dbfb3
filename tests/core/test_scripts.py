"""The shell scripts clusterctl sends to nodes: files in the package (``*/scripts/``), each one
loaded by a module, each one clean under shellcheck, each one what sh parses once the lines
that are there for the lint only are gone (:mod:`clusterctl.core.scripts`).

The package read is the one the tests import: under ``make test``, the installed wheel, so
a script the wheel left out fails here too.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

import clusterctl
from clusterctl.core.scripts import script_body, script_text

ROOT = Path(clusterctl.__file__).parent
FILES = sorted(ROOT.glob("*/scripts/*"))


def _loads() -> dict[Path, list[str]]:
    """Every ``script_text("clusterctl.X", "NAME")`` call in the package's source: the file it
    reads -> the modules that read it."""
    found: dict[Path, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "script_text"):
                package, name = (a.value for a in node.args)   # literals: a reader finds the user
                file = ROOT.parent.joinpath(*package.split(".")) / "scripts" / name
                found.setdefault(file, []).append(str(path.relative_to(ROOT.parent)))
    return found


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_package_has_its_scripts():
    assert {p.parent.parent.name for p in FILES} >= {"cluster", "code"}, FILES


def test_every_script_file_is_loaded_by_a_module_and_every_load_has_its_file():
    loads = _loads()
    orphans = [_id(p) for p in FILES if p not in loads]
    assert not orphans, f"script files no module loads with script_text: {orphans}"
    missing = {str(p): users for p, users in loads.items() if not p.is_file()}
    assert not missing, f"script_text calls whose file is not in the package: {missing}"


def test_script_body_leaves_out_the_shebang_and_the_directive_lines_only():
    text = ("#!/bin/sh\n\nset -eu\n# a comment the node gets\n"
            "# shellcheck disable=SC2086 # ids: words on purpose\n"
            "docker rm $ids\n  # shellcheck disable=SC2015,SC2217\n  a && b || c\n"
            "echo '# shellcheck disable=SC2086'\n")
    assert script_body(text) == ("\nset -eu\n# a comment the node gets\ndocker rm $ids\n"
                                 "  a && b || c\necho '# shellcheck disable=SC2086'\n")
    assert script_body("echo no shebang\n") == "echo no shebang\n"


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_a_script_is_sh_that_sh_parses_once_loaded(path):
    text = path.read_text()
    assert text.startswith("#!/bin/sh\n"), "every script runs as `sh -c TEXT`: its shebang says sh"
    body = script_text(f"clusterctl.{path.parent.parent.name}", path.name)
    assert "shellcheck" not in body and not body.startswith("#!")
    r = subprocess.run(["sh", "-n", "-c", body], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_relay_sweeps_share_their_loop_body():
    """Two files, one loop body: the sweep of a push's token and the sweep of named
    directories stop and remove a part the same way."""
    def body(name: str) -> str:   # from the loop's first check of the part on
        text = script_text("clusterctl.cluster", name)
        return text[text.index('[ -d "$d" ] || continue'):]
    assert body("relay-sweep.sh") == body("relay-sweep-dirs.sh")
    assert "rm -rf" in body("relay-sweep.sh") and body("relay-sweep.sh").endswith("done\n")


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck is not on PATH (scripts/setup-host installs it: apt "
                           "package shellcheck)")
@pytest.mark.parametrize("path", FILES, ids=_id)
def test_shellcheck_passes(path):
    r = subprocess.run(["shellcheck", "--format=gcc", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
