"""How the CLI shows a long-running image build: the library's ``on_output`` / ``log`` callbacks.

The build library (image/pipeline.py, image/imagebuild.py) prints nothing; it
hands each output line to a callback.  ``BuildDisplay`` is the callback the CLI
passes: a live line with the current step and elapsed time on a terminal (each
step also kept above it), and every line as plain text otherwise (pipes, CI
logs, CLUSTERCTL_PLAIN=1).

Contract:
    BuildDisplay(title, *, con, live)   context manager; call it with each build output line,
                                        .note(line) for progress messages (debootstrap, pip download)
"""

from __future__ import annotations

import re
import time

from clusterctl.core import console

_STEP = re.compile(r"^Step \d+/\d+ : ")


class BuildDisplay:
    """An ``on_output`` for the CLI: a live line with the current step and elapsed time on a
    terminal (each step also kept above it), and every line as plain text otherwise.

        with BuildDisplay(f"building {tag}") as show:
            imagebuild.build(client, ctx, tag=tag, on_output=show)
    """

    def __init__(self, title: str, *, con=None, live: bool | None = None) -> None:
        self.title = title
        self.con = con or console.out
        self.live = console.interactive() if live is None else live
        self.progress = None
        self.task = None
        self.started = time.monotonic()

    def __enter__(self) -> BuildDisplay:
        if self.live:
            # rich.progress pulls in rich.live and friends: loaded only for a live terminal display
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                     TimeElapsedColumn(), TextColumn("[dim]{task.fields[last]}"),
                                     console=self.con, transient=True)
            self.progress.start()
            self.task = self.progress.add_task(self.title, last="")
        else:
            self.con.print(self.title, markup=False, highlight=False)
        return self

    def __call__(self, line: str) -> None:
        if not self.live:
            self.con.print(line, markup=False, highlight=False)
            return
        if _STEP.match(line):
            self.progress.console.print(line, markup=False, highlight=False)
            self.progress.update(self.task, description=f"{self.title}: {line[:60]}")
        elif line.strip():
            self.progress.update(self.task, last=line.strip()[:60])

    def note(self, line: str) -> None:
        """A progress message (debootstrap, pip download): on a terminal it only updates the
        live line, since hundreds of "I: Retrieving ..." lines bury the build; plain otherwise.
        Pass it as ``log=`` to the build pipeline."""
        if not self.live:
            self.con.print(line, markup=False, highlight=False)
        elif line.strip():
            self.progress.update(self.task, last=line.strip()[:60])

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()
        elapsed = time.monotonic() - self.started
        verdict = "failed" if exc[0] else "done"
        self.con.print(f"{self.title}: {verdict} in {elapsed:.0f}s", markup=False, highlight=False)
