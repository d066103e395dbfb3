"""The ``clusterctl`` command: a thin typer layer over the library.

One module per group of sub-commands (build.py: targets/render/build; engine.py;
nodes.py; check.py; sandbox.py; push.py; run.py: launch/logs/attach/status/stop/runs;
execute.py: exec; interactive.py: shell, port-forward; fault.py; export.py; top.py;
clean.py; ui.py). :data:`COMMANDS` names the module of each command, and a command's
module is imported only when that command runs (or ``--help`` lists them all): every
``clusterctl`` process pays for the one command it runs, not for all of them
(``clusterctl exec`` starts in about half the time it took when the whole CLI was
imported up front).
Errors derived from ClusterctlError are printed as one message, never a
traceback, with their exit status (2 for bad input).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import typer
from rich.markup import escape
from typer.core import TyperGroup

from clusterctl import __version__
from clusterctl.core.console import err
from clusterctl.core.errors import ClusterctlError

#: Each command (in ``--help`` order) and the module of :mod:`clusterctl.cli` whose
#: ``register(app)`` declares it. ``tests/cli/test_lazy_commands.py`` fails when a
#: module registers a command this table does not name, or the other way round.
COMMANDS: dict[str, str] = {
    "targets": "build", "render": "build", "build": "build",
    "nodes": "nodes", "check": "check", "push": "push",
    "launch": "run", "logs": "run", "attach": "run", "status": "run", "stop": "run", "runs": "run",
    "exec": "execute", "shell": "interactive", "port-forward": "interactive",
    "fault": "fault", "export": "export", "top": "top", "clean": "clean", "ui": "ui",
    "engine": "engine", "sandbox": "sandbox",
}

# The same settings as the top-level app, for the typer app each module registers on.
_SETTINGS = dict(pretty_exceptions_enable=False, rich_markup_mode=None)


def registered(module: str) -> dict[str, object]:
    """The click commands that ``clusterctl.cli.<module>``'s ``register`` declares, by name."""
    sub = typer.Typer(**_SETTINGS)
    sub.callback()(lambda: None)   # a callback makes typer build a group even for one command
    importlib.import_module(f"clusterctl.cli.{module}").register(sub)
    return dict(typer.main.get_command(sub).commands)


class _Commands(Mapping):
    """:data:`COMMANDS` as click's name-to-command mapping: a module is imported on the
    first look-up of one of its commands. Listing the names imports nothing."""

    def __init__(self) -> None:
        self._loaded: dict[str, dict[str, object]] = {}

    def __iter__(self):
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)

    def __getitem__(self, name: str):
        module = COMMANDS[name]
        if module not in self._loaded:
            self._loaded[module] = registered(module)
        return self._loaded[module][name]


class _Group(TyperGroup):
    """The top-level group: the commands of :data:`COMMANDS`, each module loaded on first use
    (click's and typer's own look-ups, "did you mean" included, read ``self.commands``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Commands()

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(COMMANDS)   # the names only (typer's own reads every command)

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
    **_SETTINGS,
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


def main() -> None:
    app()
