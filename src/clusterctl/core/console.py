"""Terminal output: rich tables and progress on a terminal, plain lines otherwise."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table


def _width(stream) -> int | None:
    """Terminal width on a terminal; a wide fixed width when piped, so tables do not wrap in logs."""
    if os.environ.get("COLUMNS") or (hasattr(stream, "isatty") and stream.isatty()):
        return None
    return 200


out = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


def interactive(stream=None) -> bool:
    """True when output goes to a terminal (progress bars, colours); CLUSTERCTL_PLAIN=1 forces plain."""
    if os.environ.get("CLUSTERCTL_PLAIN"):
        return False
    stream = stream or sys.stdout
    return hasattr(stream, "isatty") and stream.isatty()


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    t = Table(title=title, show_lines=False, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        # Cells are read as rich markup: callers pass user values through rich.markup.escape.
        t.add_row(*["" if v is None else str(v) for v in r])
    return t


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[object]],
                console: Console | None = None) -> None:
    (console or out).print(table(title, columns, rows))
