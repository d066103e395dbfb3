"""What a clean install needs: every import declared, a lock that matches, the installed copy.

* Every third-party module that ``src/clusterctl`` imports (at the top of a module or
  inside a function) is provided by a distribution named in ``[project].dependencies``;
  a missing one fails naming the module and the files that import it.
* ``requirements/dev.lock`` (``make lock``) pins, with hashes, every requirement of
  ``[project].dependencies``, the ``dev`` extra and ``[build-system].requires`` at a
  version inside its range, and pins nothing pyproject.toml no longer asks for.
* Under ``make test`` (CLUSTERCTL_TEST_INSTALLED=1) the suite runs in a virtual
  environment without the machine's site-packages, on the copy of clusterctl installed
  into it, not on ``src/``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, a dev dependency there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "clusterctl"
LOCK = ROOT / "requirements" / "dev.lock"
#: Directories of scripts clusterctl ships to run INSIDE a job's container (e.g. the collective
#: check's probe, fed to ``python3 -``): clusterctl never imports them.
IN_CONTAINER = "incontainer"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements(specs: list[str]) -> list[Requirement]:
    return [Requirement(s) for s in specs]


def _declared() -> list[Requirement]:
    return _requirements(PYPROJECT["project"]["dependencies"])


def imported_modules(src: Path = SRC) -> dict[str, set[str]]:
    """Top-level module name -> the files (relative to src/) that import it, absolute imports only."""
    found: dict[str, set[str]] = {}
    for path in sorted(src.rglob("*.py")):
        if IN_CONTAINER in path.parts:
            continue  # runs inside a job's image (its imports are the image's), never imported here
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.partition(".")[0], set()).add(
                    str(path.relative_to(src.parent)))
    return found


def third_party(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: files for m, files in modules.items()
            if m not in sys.stdlib_module_names and m not in ("__future__", "clusterctl")}


def undeclared_imports(modules: dict[str, set[str]], declared: list[Requirement],
                       providers: dict[str, list[str]]) -> list[str]:
    """One line per third-party module no declared distribution provides."""
    names = {canonicalize_name(r.name) for r in declared}
    problems = []
    for module, files in sorted(third_party(modules).items()):
        dists = sorted({canonicalize_name(d) for d in providers.get(module, [])})
        if not dists:
            problems.append(f"{module} (imported by {', '.join(sorted(files))}) is not installed: "
                            "no distribution provides it; declare it in [project].dependencies")
        elif not names.intersection(dists):
            problems.append(f"{module} (imported by {', '.join(sorted(files))}) comes from "
                            f"{' or '.join(dists)}, which [project].dependencies does not declare")
    return problems


def test_the_scan_sees_imports_at_the_top_and_inside_functions(tmp_path):
    pkg = tmp_path / "clusterctl"
    pkg.mkdir()
    (pkg / "a.py").write_text("import os\nimport yaml\nfrom . import b\n"
                              "def f():\n    from requests.exceptions import ReadTimeout\n")
    (pkg / "b.py").write_text("from __future__ import annotations\nfrom clusterctl import a\n"
                              "import numpy.linalg\n")
    modules = third_party(imported_modules(pkg))
    assert modules == {"yaml": {"clusterctl/a.py"}, "requests": {"clusterctl/a.py"},
                       "numpy": {"clusterctl/b.py"}}
    problems = undeclared_imports(modules, _requirements(["PyYAML>=6"]),
                                  {"yaml": ["PyYAML"], "requests": ["requests"]})
    assert problems == [
        "numpy (imported by clusterctl/b.py) is not installed: no distribution provides it; "
        "declare it in [project].dependencies",
        "requests (imported by clusterctl/a.py) comes from requests, which "
        "[project].dependencies does not declare",
    ]


def test_every_third_party_import_is_declared_in_pyproject():
    problems = undeclared_imports(imported_modules(), _declared(),
                                  importlib.metadata.packages_distributions())
    assert not problems, "undeclared dependencies of clusterctl:\n" + "\n".join(problems)


# --- the lock ---------------------------------------------------------------------------

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def read_lock(text: str) -> tuple[dict[str, list[Version]], dict[str, bool], set[str]]:
    """(name -> pinned versions, name -> every pin has a hash, names the lock says
    pyproject.toml asked for) from a `uv pip compile --generate-hashes` file."""
    pins: dict[str, list[Version]] = {}
    hashed: dict[str, bool] = {}
    from_pyproject: set[str] = set()
    current = None
    for line in text.splitlines():
        m = _PIN.match(line)
        if m:
            current = canonicalize_name(m.group(1))
            pins.setdefault(current, []).append(Version(m.group(2)))
            hashed.setdefault(current, True)
            hashed[current] = hashed[current] and line.rstrip().endswith("\\")
        elif current and line.strip().startswith("--hash=sha256:"):
            continue
        elif current and re.search(r"#\s+(via\s+)?clusterctl \(pyproject\.toml\)", line):
            from_pyproject.add(current)
    return pins, hashed, from_pyproject


def lock_problems(lock_text: str, wanted: list[Requirement], direct: list[Requirement]) -> list[str]:
    """Why the lock does not match pyproject.toml: a requirement without a pin, a pin
    outside its range or without hashes, or a pin only an old pyproject.toml asked for."""
    pins, hashed, from_pyproject = read_lock(lock_text)
    problems = []
    for req in wanted:
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"{req} is not in the lock")
            continue
        outside = [str(v) for v in pins[name] if not req.specifier.contains(v, prereleases=True)]
        if outside:
            problems.append(f"the lock pins {name}=={', '.join(outside)}, outside {req}")
        if not hashed[name]:
            problems.append(f"the lock pins {name} without hashes")
    asked = {canonicalize_name(r.name) for r in direct}
    for name in sorted(from_pyproject - asked):
        problems.append(f"the lock still pins {name} for pyproject.toml, which no longer asks for it")
    return problems


def _wanted() -> tuple[list[Requirement], list[Requirement]]:
    direct = _declared() + _requirements(PYPROJECT["project"]["optional-dependencies"]["dev"])
    return direct + _requirements(PYPROJECT["build-system"]["requires"]), direct


def test_lock_problems_are_named():
    lock = ("click==8.1.0 \\\n    --hash=sha256:aa\n    # via clusterctl (pyproject.toml)\n"
            "rich==13.0.0\n    # via\n    #   clusterctl (pyproject.toml)\n    #   typer\n")
    wanted = _requirements(["rich>=14", "jinja2>=3.1"])
    assert lock_problems(lock, wanted, wanted) == [
        "the lock pins rich==13.0.0, outside rich>=14",
        "the lock pins rich without hashes",
        "jinja2>=3.1 is not in the lock",
        "the lock still pins click for pyproject.toml, which no longer asks for it",
    ]


def test_lock_matches_pyproject():
    wanted, direct = _wanted()
    problems = lock_problems(LOCK.read_text(), wanted, direct)
    assert not problems, ("requirements/dev.lock is out of date with pyproject.toml "
                          "(refresh it with `make lock`):\n" + "\n".join(problems))


# --- the installed copy -------------------------------------------------------------------


@pytest.mark.skipif(os.environ.get("CLUSTERCTL_TEST_INSTALLED") != "1",
                    reason="only under `make test`, which sets CLUSTERCTL_TEST_INSTALLED=1")
def test_suite_runs_on_the_installed_clusterctl_in_a_clean_venv():
    import clusterctl

    assert sys.prefix != sys.base_prefix, f"{sys.executable} is not in a virtual environment"
    cfg = (Path(sys.prefix) / "pyvenv.cfg").read_text()
    assert re.search(r"include-system-site-packages\s*=\s*false", cfg), (
        f"{sys.prefix} sees the machine's site-packages")
    installed = Path(clusterctl.__file__).resolve()
    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert installed.is_relative_to(purelib), f"clusterctl imported from {installed}, not {purelib}"
    assert not installed.is_relative_to(ROOT / "src"), f"clusterctl imported from the checkout: {installed}"
    bindir = Path(sys.executable).parent
    for tool in ("clusterctl", "hadolint"):
        found = shutil.which(tool)
        assert found and Path(found).parent.resolve() == bindir.resolve(), f"{tool} on PATH is {found}, not in {bindir}"
