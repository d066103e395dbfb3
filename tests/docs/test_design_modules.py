"""docs/concepts/design.md names every module of the package, each where it lives.

The modules are read from the package the tests import (as tests/test_layering.py does),
so a module added, moved or renamed without its row in the design fails here, named.

The rule, for a module at ``src/clusterctl/X/...`` (X a subpackage: core, image, ...):

* the design has a section for X: a heading ``## X/: ...`` (the section runs to the next
  ``## `` heading);
* a module directly in X (``core/exitcodes.py``) has a table row in that section whose
  first cell names it in backticks (`` `exitcodes` ``);
* a module in a package P inside X (``cluster/inventory/model.py``) is named in backticks
  in the row whose first cell is `` `P/` ``, by its path below P (`` `model` ``;
  ``run/collective/incontainer/probe.py``: `` `incontainer/probe.py` `` or
  `` `incontainer/probe` ``);
* a package's ``__init__`` is the package itself: X's section, P's row;
* a module directly in src/clusterctl (``__main__``) is named in backticks above the
  first ``## `` heading.

And the other way: the first name in every row's first cell is a module or package
that exists, so a row left behind by a removed or renamed module fails too.
"""

from __future__ import annotations

import re
from pathlib import Path

import clusterctl
from tests.fixtures import REPO

ROOT = Path(clusterctl.__file__).parent
DESIGN = REPO / "docs" / "concepts" / "design.md"

_HEADING = re.compile(r"^## ", re.M)
_SUBPACKAGE_HEADING = re.compile(r"^## (?P<name>[a-z_]+)/:")
_TICKED = re.compile(r"`([^`]+)`")


def modules(root: Path = ROOT) -> list[tuple[tuple[str, ...], bool]]:
    """Every module of the package: (its path parts below ``root`` without ``.py``, whether
    it is a package), ``(("cluster", "inventory"), True)``, ``(("cluster", "inventory",
    "model"), False)``; a package's ``__init__`` is the package."""
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[0] == "_data":        # the wheel's copy of examples/ and templates/: not modules
            continue
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        if parts:                      # the top package's __init__ is the page itself
            found.append((parts, package))
    return found


def parse(text: str) -> tuple[str, dict[str, list[list[str]]], dict[str, list[str]]]:
    """(the text above the first ``## ``, subpackage -> its table rows as cells,
    subpackage -> its section's text) of a design page."""
    chunks = _HEADING.split(text)
    intro, sections, rows = chunks[0], {}, {}
    for chunk in chunks[1:]:
        m = _SUBPACKAGE_HEADING.match("## " + chunk)
        if m is None:
            continue
        sections[m["name"]] = chunk
        rows[m["name"]] = [[cell.strip() for cell in line.strip().strip("|").split("|")]
                           for line in chunk.splitlines()
                           if line.startswith("|") and not re.match(r"^\|[-| :]+\|$", line.strip())]
    return intro, rows, sections


def _ticked(text: str) -> set[str]:
    return set(_TICKED.findall(text))


def where_missing(parts: tuple[str, ...], text: str, *, package: bool = False) -> str | None:
    """None when the design names the module (``package``: the package) by the rule above;
    else where it should."""
    intro, rows, sections = parse(text)
    dotted = ".".join(parts)
    if len(parts) == 1 and not package:
        if parts[0] in _ticked(intro):
            return None
        return f"{dotted}: not named (`{parts[0]}`) above the first '## ' heading"
    sub = parts[0]
    if sub not in sections:
        return f"{dotted}: no section '## {sub}/: ...'"
    if len(parts) == 1:
        return None
    table = [row for row in rows[sub] if row[0] != "module"]
    if len(parts) == 2 and not package:
        if any(parts[1] in _ticked(row[0]) for row in table):
            return None
        return f"{dotted}: no row '| `{parts[1]}` | ... |' in the {sub}/ section"
    pkg, below = parts[1], parts[2:]
    row = next((r for r in table if f"{pkg}/" in _ticked(r[0])), None)
    if row is None:
        return f"{dotted}: no row '| `{pkg}/` | ... |' in the {sub}/ section"
    if not below:
        return None
    path = "/".join(below)
    if package:
        path += "/"
    if {path, path + ".py"} & _ticked(" | ".join(row[1:])):
        return None
    return f"{dotted}: not named (`{path}`) in the `{pkg}/` row of the {sub}/ section"


def stale_rows(text: str, root: Path = ROOT) -> list[str]:
    """Rows whose first cell's first name is no module or package under ``root``."""
    _, rows, _ = parse(text)
    stale = []
    for sub, table in rows.items():
        for row in table:
            names = _TICKED.findall(row[0])
            if row[0] == "module" or not names:
                continue
            name = names[0]
            target = root / sub / name.rstrip("/")
            exists = target.is_dir() if name.endswith("/") else target.with_suffix(".py").is_file()
            if not exists:
                stale.append(f"{sub}/ section: row `{name}` names no {'package' if name.endswith('/') else 'module'}"
                             f" {sub}/{name.rstrip('/')}{'' if name.endswith('/') else '.py'}")
    return stale


def test_the_design_names_every_module():
    text = DESIGN.read_text(encoding="utf-8")
    missing = [m for m in (where_missing(p, text, package=pkg) for p, pkg in modules()) if m]
    assert not missing, ("docs/concepts/design.md lacks these modules (add a row, one job each, "
                         "from the module's docstring):\n  " + "\n  ".join(missing))


def test_every_row_of_the_design_is_a_module():
    stale = stale_rows(DESIGN.read_text(encoding="utf-8"))
    assert not stale, "docs/concepts/design.md has rows for modules that do not exist:\n  " + "\n  ".join(stale)


def test_the_walk_sees_the_whole_package():
    """The modules below are read from the package, not listed here: the walk finds them."""
    names = {".".join(p) for p, _ in modules()}
    assert {"__main__", "core", "core.exitcodes", "cluster.inventory", "cluster.inventory.model",
            "run.collective.incontainer.probe", "cli.reference"} <= names


SAMPLE = """\
# design

`__main__` runs the CLI.

## core/: shared

| module | one job |
|---|---|
| `errors` | errors |
| `targets` + `data/*.yaml` | facts |

## cluster/: nodes

| module | one job |
|---|---|
| `inventory/` | `model` (Node), `yaml` (files) |
| `collective/` | `incontainer/probe.py` (runs inside) |

## Tests

| `paths` | not a subpackage's section |
"""


def test_the_rule_finds_each_kind_of_missing_module():
    assert where_missing(("__main__",), SAMPLE) is None
    assert where_missing(("core",), SAMPLE, package=True) is None
    assert where_missing(("core", "errors"), SAMPLE) is None
    assert where_missing(("core", "targets"), SAMPLE) is None
    assert where_missing(("cluster", "inventory"), SAMPLE, package=True) is None
    assert where_missing(("cluster", "inventory", "model"), SAMPLE) is None
    assert where_missing(("cluster", "collective", "incontainer", "probe"), SAMPLE) is None
    # a name in backticks elsewhere is not a row: `paths` under "## Tests", `model` in a cell
    assert "no row '| `paths` |" in where_missing(("core", "paths"), SAMPLE)
    assert "no row '| `model` |" in where_missing(("cluster", "model"), SAMPLE)
    assert "not named (`checks`) in the `inventory/` row" in where_missing(
        ("cluster", "inventory", "checks"), SAMPLE)
    assert "no row '| `transport/` |" in where_missing(("cluster", "transport", "tree"), SAMPLE)
    assert "no section '## run/: ...'" in where_missing(("run", "plan"), SAMPLE)
    assert "no section '## code/: ...'" in where_missing(("code",), SAMPLE, package=True)
    assert "no row '| `registry/` |" in where_missing(("cluster", "registry"), SAMPLE, package=True)
    assert "above the first '## ' heading" in where_missing(("__main__",), SAMPLE.replace("`__main__`", "main"))


def test_a_row_for_a_module_that_is_gone_is_found(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "errors.py").write_text("")
    (tmp_path / "cluster" / "inventory").mkdir(parents=True)
    (tmp_path / "cluster" / "inventory" / "__init__.py").write_text("")
    assert stale_rows(SAMPLE, tmp_path) == [
        "core/ section: row `targets` names no module core/targets.py",
        "cluster/ section: row `collective/` names no package cluster/collective",
    ]
