"""The CLI's build display (cli/display.py): what `clusterctl build` shows while the library builds."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from clusterctl.cli.display import BuildDisplay


def test_display_plain_prints_every_line():
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=False, width=200)
    with BuildDisplay("building x", con=con, live=False) as show:
        for line in ["Step 1/2 : FROM base", " ---> abc", "hello [bold]", "Step 2/2 : RUN true"]:
            show(line)
        show.note("I: Retrieving libc6")
    text = buf.getvalue()
    assert "hello [bold]" in text  # not swallowed as markup
    assert text.index("Step 1/2") < text.index("hello") < text.index("Step 2/2")
    assert "building x: done in" in text
    assert "I: Retrieving libc6" in text  # plain output keeps notes too


def test_display_live_keeps_steps_and_reports_failure():
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=120)
    with pytest.raises(RuntimeError):
        with BuildDisplay("building y", con=con, live=True) as show:
            show("Step 1/3 : FROM base")
            show("noise that only shows on the live line")
            show("Step 2/3 : RUN make")
            show.note("I: Retrieving libc6 (a progress note)")
            raise RuntimeError("boom")
    text = buf.getvalue()
    assert "Step 1/3 : FROM base" in text and "Step 2/3 : RUN make" in text
    assert "building y: failed in" in text
