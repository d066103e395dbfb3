"""The ``clusterctl`` command: a thin typer layer over the library.

One module per group of sub-commands (build.py: targets/render/build; engine.py;
nodes.py: nodes/check; sandbox.py; push.py; run.py: launch/logs/status/stop/runs;
execute.py: exec; interactive.py: shell, port-forward; fault.py: fault injection;
export.py: Kubernetes manifests).
Errors derived from ClusterctlError are printed as one message, never a
traceback, with their exit status (2 for bad input).
"""

from __future__ import annotations

import typer
from rich.markup import escape
from typer.core import TyperGroup

from clusterctl import __version__
from clusterctl.cli import (
    build,
    check,
    clean,
    engine,
    execute,
    export,
    fault,
    interactive,
    nodes,
    push,
    run,
    sandbox,
    top,
    ui,
)
from clusterctl.core.console import err
from clusterctl.core.errors import ClusterctlError


class _Group(TyperGroup):
    # typer.Context, not click.Context: typer >= 0.29 carries its own copy of click
    # and no longer installs click, so clusterctl does not import it.
    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except ClusterctlError as e:
            err.print(f"[bold red]error:[/] {escape(e.message)}", markup=True, highlight=False)
            ctx.exit(e.exit_code)


app = typer.Typer(
    cls=_Group,
    help="Build accelerator-stack PyTorch images and run them on your own nodes over SSH.",
    no_args_is_help=True,
    add_completion=True,   # --install-completion / --show-completion [SHELL] (typer's own)
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"clusterctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    pass


for _group in (build, engine, nodes, check, sandbox, push, run, execute, interactive, fault, export, top, clean, ui):
    _group.register(app)


def main() -> None:
    app()
