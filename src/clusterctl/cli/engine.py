"""`clusterctl engine up|down|status`: clusterctl's own local Docker engine."""

from __future__ import annotations

import typer

from clusterctl.cluster import engine
from clusterctl.core.console import out

group = typer.Typer(help="Run a private local Docker engine to build on (when the machine has none).",
                    no_args_is_help=True)


@group.command("up")
def up() -> None:
    """Start clusterctl's own Docker engine (root; idempotent) and print its DOCKER_HOST."""
    url = engine.start_local_engine()
    out.print(f"engine running: export DOCKER_HOST={url}")


@group.command("down")
def down() -> None:
    """Stop clusterctl's own Docker engine (its images stay on disk)."""
    was = engine.stop_local_engine()
    out.print("engine stopped" if was else "engine was not running")


@group.command("status")
def status() -> None:
    """Print which Docker engine clusterctl would use."""
    url = engine.engine_url()
    if url is None:
        out.print("no Docker engine reachable (start one with `sudo clusterctl engine up`)")
        raise typer.Exit(1)
    out.print(f"using Docker engine at {url}")


def register(app: typer.Typer) -> None:
    app.add_typer(group, name="engine")
