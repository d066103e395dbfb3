"""The committed reference pages (docs/reference/*.md) are what the code renders today.

They are committed so that the links to them work where the repository is read without
building the site; ``make reference`` (docs/hooks.py) rewrites them from src/.  A command,
option, job key, inventory key, variable or exit status changed without rewriting them
fails here, with the diff and the command.  (What the renderer puts on the pages is
checked against the code in tests/docs/test_reference.py.)
"""

from __future__ import annotations

import importlib.util

import pytest

from clusterctl.cli import reference
from tests.fixtures import REPO


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_pages_are_what_the_code_renders(hooks):
    stale = hooks.stale()
    assert not stale, (
        f"docs/reference/ is not what the code renders today: run `{hooks.REGENERATE}` "
        "(python docs/hooks.py) and commit the pages.\n" + "\n".join(stale.values()))


def test_the_pages_are_the_renderers_pages(hooks):
    assert sorted(hooks.pages()) == sorted(reference.PAGES)
    assert hooks.REGENERATE == "make reference"
    assert "\nreference:" in (REPO / "Makefile").read_text()


def test_a_stale_or_missing_page_is_named_and_rewritten(hooks, tmp_path):
    docs = tmp_path / "docs"
    assert set(hooks.stale(docs)) == set(reference.PAGES)       # nothing there yet
    assert sorted(hooks.write(docs)) == sorted(f"docs/{p}" for p in reference.PAGES)
    assert hooks.stale(docs) == {}
    assert hooks.write(docs) == []                               # nothing differs: nothing written
    page = docs / "reference" / "exit-status.md"
    page.write_text(page.read_text().replace("# Exit statuses", "# Exit codes"))
    stale = hooks.stale(docs)
    assert list(stale) == ["reference/exit-status.md"]
    assert "-# Exit codes\n+# Exit statuses\n" in stale["reference/exit-status.md"]
