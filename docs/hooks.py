"""MkDocs hooks (mkdocs.yml `hooks:`) and the writer of the reference pages.

The reference pages, docs/reference/cli.md, job-file.md, inventory.md, environment.md and
exit-status.md, are rendered by :func:`clusterctl.cli.reference.reference_pages` from the
typer app, the pydantic models and the tables in the source tree next to this file (src/
is put first on the import path, so the pages describe this checkout, not an installed
copy).  They are committed, so that their links work where the repository is read without
building the site; ``make reference`` (``python docs/hooks.py``) rewrites them after a
change to the code they come from.

``on_files`` builds nothing: it checks that the pages on disk are what the code renders
today and, when one is not, warns (a strict build fails) naming the page and the command
that rewrites it.  tests/docs/test_reference_pages.py checks the same.
"""

from __future__ import annotations

import difflib
import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
JOB_EXAMPLE = REPO / "jobs" / "ddp-smoke.yaml"
INVENTORY_EXAMPLE = REPO / "inventories" / "example.yaml"
REGENERATE = "make reference"

log = logging.getLogger("mkdocs.hooks.reference")


def pages() -> dict[str, str]:
    """Path (relative to docs/) -> the page's text, as the code in src/ renders it now."""
    src = str(REPO / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    from clusterctl.cli.reference import reference_pages

    return reference_pages(
        (f"{JOB_EXAMPLE.parent.name}/{JOB_EXAMPLE.name}", JOB_EXAMPLE.read_text(encoding="utf-8")),
        (f"{INVENTORY_EXAMPLE.parent.name}/{INVENTORY_EXAMPLE.name}",
         INVENTORY_EXAMPLE.read_text(encoding="utf-8")))


def stale(docs: Path = DOCS) -> dict[str, str]:
    """Each page under ``docs`` that differs from what the code renders (or is missing),
    with a unified diff (committed -> rendered), at most 40 lines of it."""
    found = {}
    for path, text in pages().items():
        page = docs / path
        if not page.is_file():
            found[path] = f"docs/{path} is missing"
            continue
        on_disk = page.read_text(encoding="utf-8")
        if on_disk != text:
            diff = list(difflib.unified_diff(on_disk.splitlines(True), text.splitlines(True),
                                             f"docs/{path} (committed)", "rendered from the code"))
            found[path] = "".join(diff[:40]) + ("...\n" if len(diff) > 40 else "")
    return found


def write(docs: Path = DOCS) -> list[str]:
    """Write every page that differs; the paths written."""
    written = []
    for path, text in pages().items():
        page = docs / path
        if not page.is_file() or page.read_text(encoding="utf-8") != text:
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(text, encoding="utf-8")
            written.append(f"docs/{path}")
    return written


def on_files(files, config):
    for path, diff in stale().items():
        log.warning(f"docs/{path} is not what the code renders today: run `{REGENERATE}` "
                    f"and commit it\n{diff}")
    return files


def on_serve(server, config, builder):
    """`mkdocs serve` rebuilds (and checks the pages again) when an example file changes too."""
    for path in (JOB_EXAMPLE, INVENTORY_EXAMPLE):
        server.watch(str(path))
    return server


if __name__ == "__main__":
    done = write()
    print("\n".join(f"wrote {p}" for p in done) or "the reference pages were up to date")
