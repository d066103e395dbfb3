"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages are generated here.

``on_files`` adds reference/cli.md, job-file.md, inventory.md, environment.md and
exit-status.md to the build as generated files (never on disk, never committed),
rendered by :func:`clusterctl.cli.reference.reference_pages` from the typer app, the
pydantic models and the tables in the source tree next to this file (src/ is put
first on the import path, so the pages describe this checkout, not an installed copy).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]
JOB_EXAMPLE = REPO / "jobs" / "ddp-smoke.yaml"
INVENTORY_EXAMPLE = REPO / "inventories" / "example.yaml"


def _pages() -> dict[str, str]:
    src = str(REPO / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    from clusterctl.cli.reference import reference_pages

    return reference_pages(
        (f"{JOB_EXAMPLE.parent.name}/{JOB_EXAMPLE.name}", JOB_EXAMPLE.read_text(encoding="utf-8")),
        (f"{INVENTORY_EXAMPLE.parent.name}/{INVENTORY_EXAMPLE.name}",
         INVENTORY_EXAMPLE.read_text(encoding="utf-8")))


def on_files(files, config):
    for path, text in _pages().items():
        stub = files.get_file_from_path(path)
        if stub is not None:   # a file on disk at that path: the generated page replaces it
            files.remove(stub)
        files.append(File.generated(config, path, content=text))
    return files


def on_serve(server, config, builder):
    """`mkdocs serve` rebuilds when an example file changes too."""
    for path in (JOB_EXAMPLE, INVENTORY_EXAMPLE):
        server.watch(str(path))
    return server
