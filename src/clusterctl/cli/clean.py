"""`clusterctl clean`: what clusterctl left on the nodes (code trees, images, kept-login
directories), shown per node, and removed with ``--yes``.

Parsing and printing only: :func:`clusterctl.cluster.clean.clean` lists, decides and removes.
Exit status: 0 when every node was listed (and, with ``--yes``, cleaned as chosen); 1 when a
node could not be listed or an item chosen on it could not be removed (each named); 2 for
bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from clusterctl.cli.check import parse_size
from clusterctl.cli.nodes import NodesOption
from clusterctl.cluster import clean as cleaning
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport.cluster import Cluster
from clusterctl.code.snapshot import show_size
from clusterctl.core import exitcodes
from clusterctl.core.durations import DURATION_HELP, parse_duration
from clusterctl.core.errors import UserError


def _older_than(text: str) -> float:
    if text.strip() == "0":
        return 0.0
    try:
        return parse_duration(text)
    except ValueError as e:
        raise UserError(f"--older-than {text!r}: {e}; valid: {DURATION_HELP}, or 0 for any age") from None


def _name(item: cleaning.Item) -> str:
    if item.kind == "image":
        short = item.name.removeprefix("sha256:")[:12]
        return f"{short} ({item.detail})" if item.detail else short
    if item.kind == "tree":
        return item.name[:12]
    return f"/tmp/{item.name}"


def clean(
    nodes: NodesOption,
    older_than: Annotated[str, typer.Option(
        "--older-than", metavar="DURATION",
        help="Code trees and images unused for at least this long may go (a tree's last launch, "
             "an image's arrival on the node), e.g. 90m, 24h, 168h; 0: any unused one.")] = "24h",
    keep_size: Annotated[str | None, typer.Option(
        "--keep-size", metavar="SIZE",
        help="Also remove unused images, oldest first, until clusterctl's images on a node "
             "take at most SIZE (e.g. 20G).", show_default=False)] = None,
    yes: Annotated[bool, typer.Option(
        "--yes", help="Remove what is listed to go (without it, nothing is changed).")] = False,
    json_: Annotated[bool, typer.Option(
        "--json", help="One JSON object per node: node, error, items (kind, name, bytes, "
                       "remove, reason, and with --yes removed/left).")] = False,
) -> None:
    """Show what clusterctl left on the nodes and what of it may go: code trees no live
    container mounts, images no container uses, and kept-login directories no login is live
    in; --yes removes them. Trees and images used within --older-than stay."""
    policy = cleaning.Policy(older_than=_older_than(older_than),
                             keep_size=parse_size(keep_size, "--keep-size") if keep_size else None)
    inventory = load_inventory(Path(nodes))
    with Cluster(inventory) as cluster:
        reports = cleaning.clean(cluster, policy, apply=yes)
    if json_:
        typer.echo(json.dumps([_as_json(r, yes) for r in reports], indent=2))
    else:
        _print(reports, yes)
    raise typer.Exit(exitcodes.OK if all(r.ok for r in reports) else exitcodes.FAILURE)


def _as_json(r: cleaning.NodeReport, applied: bool) -> dict:
    items = []
    for v in r.verdicts:
        entry = {"kind": v.item.kind, "name": v.item.name, "bytes": v.item.bytes,
                 "remove": v.remove, "reason": v.reason}
        if applied and v.remove:
            entry["removed"] = v.item.name in r.removed
            entry["left"] = r.left.get(v.item.name)
        items.append(entry)
    return {"node": r.node, "error": r.error, "items": items}


def _print(reports: list[cleaning.NodeReport], applied: bool) -> None:
    freed = 0
    for r in reports:
        if r.error is not None and not r.verdicts:
            typer.echo(f"{r.node}: failed: {r.error}")
            continue
        chosen = r.chosen
        size = sum(v.item.bytes for v in chosen)
        head = "nothing to remove" if not chosen else \
            f"{len(chosen)} to remove, {show_size(size)}"
        typer.echo(f"{r.node}: {head}")
        for v in r.verdicts:
            mark = "remove" if v.remove else "keep  "
            done = ""
            if applied and v.remove:
                done = "  -> removed" if v.item.name in r.removed else \
                    f"  -> left: {r.left.get(v.item.name, '?')}"
            typer.echo(f"  {mark} {v.item.kind:<5} {_name(v.item)}  {show_size(v.item.bytes)}  "
                       f"{v.reason}{done}")
        if r.error is not None:
            typer.echo(f"  failed: {r.error}")
        freed += sum(r.removed.values()) if applied else size
    failed = [r.node for r in reports if not r.ok]
    verb = "freed" if applied else "would be freed (--yes removes)"
    typer.echo(f"{show_size(freed)} {verb} on {len(reports)} node(s)"
               + (f"; failed: {', '.join(failed)}" if failed else ""))


def register(app: typer.Typer) -> None:
    app.command("clean")(clean)
