"""`clusterctl check --nodes FILE`: is every node ready to push to and launch on?

Thin over :mod:`clusterctl.preflight`: load the inventory, connect to every
node in parallel, print one table row per node and then each problem as a
line naming its node. Exit 0 when every node is ready, 1 when any is not, 2
for bad input (the inventory, an option).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from clusterctl.build.targets import get_target
from clusterctl.cli.nodes import NodesOption
from clusterctl.cluster import preflight
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.core.console import interactive, out, table
from clusterctl.core.errors import UserError

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


def parse_size(text: str, option: str = "--need-disk") -> int:
    """'20G', '1.5TiB', '500M', '1048576' -> bytes (binary units); UserError otherwise."""
    m = _SIZE_RE.fullmatch(text.strip())
    if not m:
        raise UserError(f"{option} {text!r} is not a size; valid: a number of bytes with an "
                        "optional unit K, M, G or T (binary, e.g. 20G or 1.5TiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def check(
    nodes: NodesOption,
    target: Annotated[str | None, typer.Option(
        "--target", "-t", help="Also require the devices this target's containers need "
        "(e.g. cambricon: /dev/cambricon_ctl and one /dev/cambricon_devN per slot).")] = None,
    accept_new_host_keys: Annotated[bool, typer.Option(
        "--accept-new-host-keys", help="Trust and record the host key of a node not yet in "
        "known_hosts (like ssh's accept-new). A CHANGED key is still refused.")] = False,
    fanout: Annotated[int | None, typer.Option(
        "--fanout", min=1, help="Nodes contacted at once (default: the inventory's ssh.fanout, 32).",
        show_default=False)] = None,
    need_disk: Annotated[str | None, typer.Option(
        "--need-disk", metavar="SIZE", help="Free space every node needs where Docker keeps "
        "images, e.g. 20G.")] = None,
    image: Annotated[str | None, typer.Option(
        "--image", metavar="REF", help="A local image the nodes must take: its architecture "
        "must be the node's and its size must fit in the free disk (unless --need-disk).")] = None,
    json_: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object per node (all fields) instead of the table.")] = False,
    connect_timeout: Annotated[float | None, typer.Option(
        "--connect-timeout", min=0.1, metavar="SECONDS",
        help="SSH connect timeout per node (default: the inventory's, 10).")] = None,
) -> None:
    """Check every node in parallel: SSH, Docker daemon, architecture, free disk, devices,
    the network interface launch will use, and the master port."""
    required = parse_size(need_disk) if need_disk is not None else None
    inventory = load_inventory(nodes)
    needs = preflight.image_needs(image) if image else None
    if needs is not None and required is None:
        required = needs.size
    devices_for = _target_devices(target) if target is not None else None
    with Cluster(inventory, fanout=fanout, connect_timeout=connect_timeout,
                 accept_new_host_keys=True if accept_new_host_keys else None) as cluster:
        checks = preflight.run_preflight(cluster, devices_for=devices_for, required_bytes=required,
                                         expected_arch=needs.arch if needs else None)
    if json_:
        typer.echo(json.dumps([{**asdict(c), "ok": c.ok} for c in checks], indent=2))
    else:
        _report(inventory, checks)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


def _target_devices(name: str):
    """node -> the devices the target's containers get on it (per slot where the stack says)."""
    run_spec = get_target(name).run
    return lambda node: run_spec.devices_for(node.slots)


def _report(inventory, checks: list[preflight.NodeCheck]) -> None:
    rows = preflight.table_rows(checks, compact=True)
    t = table(f"{inventory.path}: {len(checks)} nodes", preflight.COLUMNS,
              [[escape(cell) for cell in row] for row in rows])
    if interactive():
        out.print(t)
    else:  # logs and pipes get whole values, not cells folded to a default 80 columns
        Console(file=out.file, width=_natural_width(preflight.COLUMNS, rows),
                highlight=False).print(t)
    for c in checks:
        for problem in c.problems:
            out.print(f"{c.node}: {problem}", markup=False)
    bad = [c.node for c in checks if not c.ok]
    if bad:
        out.print(f"{len(bad)} of {len(checks)} nodes not ready: {', '.join(bad)}", markup=False)
    else:
        master = checks[0]
        port = f"; master port {master.master_port} free" if master.master_port else ""
        out.print(f"all {len(checks)} nodes ready{port}", markup=False)


def _natural_width(columns, rows) -> int:
    """Width at which no cell of the table folds."""
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    return sum(widths) + 3 * len(widths) + 1


def register(app: typer.Typer) -> None:
    app.command("check")(check)
