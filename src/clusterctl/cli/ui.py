"""`clusterctl ui`: the dashboard of a runs directory, served until Ctrl-C.

Parsing and printing only: :class:`clusterctl.run.dashboard.Dashboard` serves.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

from clusterctl.core.console import out
from clusterctl.core.paths import runs_dir
from clusterctl.run.dashboard import Dashboard, needs_token, new_token

DEFAULT_PORT = 8377


def ui(
    host: Annotated[str, typer.Option(
        "--host", help="The address to listen on. Any but a loopback one (e.g. 0.0.0.0) needs "
                       "a token: one is made and printed once.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                      help="The port (0: a free one).")] = DEFAULT_PORT,
    runs: Annotated[Path | None, typer.Option(
        "--runs-dir", metavar="DIR",
        help="The runs directory to show (default: ./runs, or CLUSTERCTL_RUNS).")] = None,
    token: Annotated[bool, typer.Option(
        "--token", help="Require a token on a loopback address too (on a machine other people "
                        "log in to, they can reach its 127.0.0.1).")] = False,
) -> None:
    """Serve a dashboard of the runs in a browser: the runs table, a run's nodes and attempts,
    its merged output as it grows, and its loss and throughput curves from the metrics lines
    the training prints. Reads runs/, and follows the output of your own plain `--detach`
    runs from their nodes as `logs -f` does (in memory); starts and stops nothing. Ctrl-C
    stops it."""
    root = (runs or runs_dir()).resolve()
    secret = new_token() if token or needs_token(host) else None
    dashboard = Dashboard(root, host=host, port=port, token=secret)
    url = dashboard.login_url
    if host in ("0.0.0.0", "::"):
        url = url.replace(f"//{'[::]' if host == '::' else host}:", f"//{socket.gethostname()}:", 1)
    out.print(f"clusterctl ui: the runs in {root}", markup=False, highlight=False)
    out.print(f"open {url}", markup=False, highlight=False)
    if secret:
        out.print("(the token is printed once; every request needs it: the page keeps it in a "
                  "cookie, other clients send `Authorization: Bearer TOKEN`)",
                  markup=False, highlight=False)
    out.print("Ctrl-C stops it", markup=False, highlight=False)
    try:
        dashboard.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        dashboard.close()


def register(app: typer.Typer) -> None:
    app.command("ui")(ui)
