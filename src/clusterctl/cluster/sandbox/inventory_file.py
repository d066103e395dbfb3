"""The inventory file a sandbox writes: its text, and never overwriting one that is not ours.

The first line of an inventory written by ``sandbox up`` is a marker naming the
sandbox (:data:`INVENTORY_MARKER`); ``up`` refuses to overwrite a file without it
or the inventory of another live sandbox, and ``down`` removes only files that
carry its own name.  The text is in clusterctl.cluster.inventory's YAML format.

Contract: :func:`check_inventory_writable`, :func:`check_inventory_ours`,
:func:`inventory_text`, :func:`write_inventory`, :func:`remove_inventory`.
Imports only the model of the sandbox package.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from clusterctl.cluster.sandbox.model import (
    DEFAULT_INVENTORY,
    INTERFACE,
    NAME_RE,
    Sandbox,
    data_base,
    state_file,
)
from clusterctl.core.errors import UserError
from clusterctl.core.files import write_atomic
from clusterctl.core.invoker import hand_over

INVENTORY_MARKER = "# clusterctl-sandbox:"  # first line of an inventory we wrote; down removes only those


def _inventory_owner(path: Path) -> str | None:
    """The sandbox named in the marker line of an inventory we wrote, else None."""
    try:
        with open(path) as f:
            first = f.readline()
    except OSError:
        return None
    owner = first[len(INVENTORY_MARKER):].strip() if first.startswith(INVENTORY_MARKER) else ""
    return owner if NAME_RE.match(owner) else None


def check_inventory_writable(path: Path) -> None:
    """Find out before anything starts that the inventory can be written where asked."""
    if path.is_dir():
        raise UserError(f"--inventory {path} is a directory; give a file path such as "
                        f"{path / 'sandbox.yaml'}.")
    try:
        _make_parents(path)
    except OSError as e:
        raise UserError(f"cannot write the inventory to {path}: {e.strerror}; pass another "
                        "--inventory PATH.") from None
    if not os.access(path.parent, os.W_OK):
        raise UserError(f"cannot write the inventory to {path}: {path.parent} is not writable; "
                        "pass another --inventory PATH.")


def check_inventory_ours(path: Path, name: str) -> None:
    """Never overwrite a user's inventory or another live sandbox's."""
    if not path.exists():
        return
    owner = _inventory_owner(path)
    if owner is None:
        raise UserError(f"{path} exists and was not written by `clusterctl sandbox up`; pass "
                        "another --inventory PATH (it is not overwritten).")
    if owner != name and state_file(owner).exists():
        raise UserError(f'{path} is the inventory of sandbox "{owner}", which is still up; pass '
                        "another --inventory PATH or remove that sandbox first.")


def inventory_text(sb: Sandbox) -> str:
    """The sandbox inventory in clusterctl.inventory's YAML format, with comments for a reader."""

    def dump(obj) -> str:
        return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)

    node_entries = [
        {"name": n.name, "host": n.ip, "port": 22, "user": sb.user,
         "identity_file": str(sb.key_path), "slots": sb.slots, "interface": INTERFACE,
         "code_dir": str(n.user_dir / "code" if sb.rootless else data_base() / sb.name / n.name / "code")}
        for n in sb.nodes
    ]
    return "".join([
        f"{INVENTORY_MARKER} {sb.name}\n",
        f"# Inventory of the local sandbox cluster \"{sb.name}\" ({sb.node_count} emulated nodes on\n",
        f"# {sb.subnet}; this machine is {sb.head_ip} on bridge {sb.bridge}). Written by\n",
        "# `clusterctl sandbox up`; `clusterctl sandbox down` removes it with the sandbox.\n",
        "# Each node is a network namespace with its own sshd and Docker daemon.\n",
        "\n",
        "# Strict host-key checking works out of the box: the sandbox's known_hosts\n",
        "# holds every node's own host key.\n",
        dump({"ssh": {"known_hosts": str(sb.known_hosts_path), "accept_new_host_keys": False}}),
        "# From 16 nodes on, `launch --detach` and `check` go through the nodes (one SSH\n",
        "# connection from here, the nodes log in to each other; docs/how-to/many-nodes.md).\n",
        "# To do so at any size, and with the nodes' own key, add under ssh:\n",
        "#   tree: true\n",
        f"#   node_identity_file: {sb.key_path}   # the nodes share this machine's files\n",
        "\n",
        *_registry_lines(sb),
        f"# Shared by all nodes: {sb.user} with the sandbox's generated ed25519 key; eth0 is\n",
        "# the interface that holds each node's address (GLOO/NCCL_SOCKET_IFNAME).\n",
        *(["# The nodes' containers run on Podman (rootful, each node's own storage); each\n",
           "# node has its own dockerd too: `runtime: docker` on a node runs it on Docker.\n"]
          if sb.runtime != "docker" and not sb.rootless else []),
        *([f"# The nodes' containers run on {sb.user}'s own rootless Podman (each node's own\n",
           "# storage, owned by that user).\n"] if sb.rootless else []),
        dump({"defaults": {"user": sb.user, "identity_file": str(sb.key_path),
                           "slots": sb.slots, "interface": INTERFACE,
                           **({"runtime": sb.runtime} if sb.runtime != "docker" else {})}}),
        "\n",
        "# Rank order: node1 is the master. The nodes share this machine's files, so each\n",
        "# keeps the project copies of `launch --workdir` in a code_dir of its own.\n",
        dump({"nodes": node_entries}),
    ])


def _registry_lines(sb: Sandbox) -> list[str]:
    """The ``registry: HOST:PORT`` key of a sandbox with a registry (``up --registry``)."""
    if not sb.registry:
        return []
    login = (f"# It asks for a login: docker login {sb.registry} -u clusterctl --password-stdin"
             f" < {sb.registry_password_file}\n" if sb.registry_password_file else "")
    return [
        "# The sandbox's image registry (`sandbox up --registry`), on this machine's bridge\n",
        "# address over TLS; every node's Docker engine and this machine's trust its CA\n",
        f"# ({sb.registry_ca}) through /etc/docker/certs.d/{sb.registry}/.\n",
        login,
        yaml.safe_dump({"registry": sb.registry}, sort_keys=False),
        "\n",
    ]


def write_inventory(sb: Sandbox) -> Path:
    """The inventory, written whole (never through a file planted at its temporary name);
    under sudo it is the invoking user's, as are the directories made for it."""
    path = Path(sb.inventory_path or DEFAULT_INVENTORY)
    _make_parents(path)
    write_atomic(path, inventory_text(sb), mode=0o644)
    hand_over(path)
    return path


def _make_parents(path: Path) -> None:
    """Create the directories above ``path`` that are missing; under sudo they are the
    invoking user's (``--inventory ~/lab/sandbox.yaml``)."""
    missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    hand_over(*missing)


def remove_inventory(path: Path, name: str) -> bool:
    """Remove the inventory at ``path`` when sandbox ``name`` wrote it; True when removed."""
    if _inventory_owner(path) == name:
        path.unlink(missing_ok=True)
        return True
    return False
