"""`clusterctl nodes --nodes FILE`: show the cluster an inventory describes, after validating it.

Also the one way every command takes an inventory: ``NodesOption`` (or
``nodes_option()``) gives ``--nodes/-n FILE`` with the ``CLUSTERCTL_NODES``
environment variable as fallback, so ``--nodes`` means the same everywhere::

    from clusterctl.cli.nodes import NodesOption

    @app.command()
    def check(nodes: NodesOption) -> None:
        inventory = load_inventory(nodes)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from clusterctl.cluster.inventory import Inventory, Node, load_inventory
from clusterctl.core.console import out, print_table

NODES_HELP = ("The inventory: a YAML file (see inventories/example.yaml), an MPI hostfile or a "
              "DeepSpeed hostfile. Default: $CLUSTERCTL_NODES.")


def nodes_option(help: str = NODES_HELP):
    """The typer.Option for ``--nodes/-n FILE`` (existence is checked by load_inventory,
    which says what would be valid, instead of click's generic message)."""
    return typer.Option("--nodes", "-n", metavar="FILE", envvar="CLUSTERCTL_NODES",
                        help=help, show_default=False)


NodesOption = Annotated[Path, nodes_option()]


FROM_SSH_CONFIG = "-"  # decided by ~/.ssh/config (or ssh's defaults) at connect time


def _port(node: Node) -> object:
    return node.port if "port" in node.model_fields_set else FROM_SSH_CONFIG


def _text(values) -> str:
    if isinstance(values, dict):
        return ",".join(f"{k}={v}" for k, v in values.items())
    return ",".join(str(v) for v in values)


def node_rows(inventory: Inventory) -> list[list[str]]:
    """One table row per node, in rank order (escaped: the table reads rich markup, values are text)."""
    return [[escape(str(v)) for v in row] for row in _rows(inventory)]


def _rows(inventory: Inventory) -> list[list[object]]:
    return [[f"{rank} (master)" if n.master else rank, n.name, n.host, _port(n), n.user or FROM_SSH_CONFIG,
             n.slots, _text(n.devices), n.interface or "(auto)", _text(n.labels)]
            for rank, n in enumerate(inventory.nodes)]


COLUMNS = ("rank", "name", "host", "port", "user", "slots", "devices", "interface", "labels")


def inventory_json(inventory: Inventory) -> dict:
    """The validated inventory for scripts; env values are left out (they may be secrets), names kept."""
    ssh = inventory.ssh
    return {
        "path": str(inventory.path), "format": inventory.format, "master": inventory.master.name,
        "master_port": inventory.master_port,
        "ssh": {"known_hosts": str(ssh.known_hosts) if ssh.known_hosts else None,
                "accept_new_host_keys": ssh.accept_new_host_keys,
                "connect_timeout": ssh.connect_timeout, "fanout": ssh.fanout},
        "nodes": [{"rank": rank, "name": n.name, "host": n.host,
                   "port": n.port if "port" in n.model_fields_set else None, "user": n.user,
                   "identity_file": str(n.identity_file) if n.identity_file else None, "slots": n.slots,
                   "devices": n.devices, "interface": n.interface, "labels": n.labels,
                   "env_names": sorted(n.env), "master": n.master}
                  for rank, n in enumerate(inventory.nodes)],
    }


_JsonOption = Annotated[bool, typer.Option(
    "--json", help="Print the validated inventory as JSON (null: decided by ~/.ssh/config; "
                   "env values left out: they may be secrets).")]


def nodes(nodes: NodesOption, as_json: _JsonOption = False) -> None:
    """Validate an inventory and list its nodes in rank order, the master and the master port."""
    inventory = load_inventory(nodes)
    if as_json:
        typer.echo(json.dumps(inventory_json(inventory), indent=2))
        return
    print_table(escape(f"{inventory.path} ({inventory.format})"), COLUMNS, node_rows(inventory))
    total = sum(n.slots for n in inventory.nodes)
    out.print(f"master: {inventory.master.name} ({inventory.master.host}), "
              f"master port {inventory.master_port}; {len(inventory)} nodes, {total} slots",
              markup=False)
    ssh = inventory.ssh
    out.print(f"ssh: host keys checked against {ssh.known_hosts or '~/.ssh/known_hosts'}"
              f"{' (new hosts recorded on first contact)' if ssh.accept_new_host_keys else ''}, "
              f"connect timeout {ssh.connect_timeout:g}s, {ssh.fanout} nodes at once", markup=False)
    if any(FROM_SSH_CONFIG in (_port(n), n.user or FROM_SSH_CONFIG) for n in inventory.nodes):
        out.print(f"{FROM_SSH_CONFIG}: taken from ~/.ssh/config (or ssh's defaults) when connecting",
                  markup=False)


def register(app: typer.Typer) -> None:
    app.command("nodes")(nodes)
