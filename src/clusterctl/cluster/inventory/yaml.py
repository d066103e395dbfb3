"""The YAML inventory (documented by ``inventories/example.yaml``).

One job: read ``master_port``, ``ssh``, ``registry``, ``defaults`` and ``nodes`` from a YAML inventory
into an ``Inventory``, on top of the shared YAML reader (``core.yamlfile``: lines, repeated
keys, merge keys, syntax errors) and the shared inventory checks (``checks``).  A node
takes every setting of ``defaults:`` it does not write itself; ``labels`` and ``env`` are
merged key by key.  Relative paths (``identity_file``, ``known_hosts``) resolve against
the inventory's directory.

Values under ``env:`` and ``labels:`` are text.  A YAML number or boolean there is taken
exactly as written (``OMP_NUM_THREADS: 4`` gives ``"4"``, ``FLAG: yes`` gives ``"yes"``,
``MASK: 0755`` gives ``"0755"``), the same rule as ``--set`` on the command line; a null,
a list or a mapping is an error.

Contract: ``read_yaml(path, text) -> Inventory`` (``InventoryError`` on bad input).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clusterctl.cluster.inventory.checks import HINTS, Reader, suggest
from clusterctl.cluster.inventory.model import (
    DEFAULT_FIELDS,
    DEFAULT_MASTER_PORT,
    NODE_FIELDS,
    SSH_FIELDS,
    TOP_FIELDS,
    Defaults,
    Inventory,
    Node,
    SSHSettings,
)
from clusterctl.cluster.registry.reference import Registry, parse_registry
from clusterctl.core.errors import one_of
from clusterctl.core.text import escaped
from clusterctl.core.yamlfile import parse, show

_MERGED = ("labels", "env")  # a node's own entries are added to the defaults' ones


def read_yaml(path: Path, text: str) -> Inventory:
    """The inventory a YAML file describes, in rank order."""
    return _YamlReader(path, text).load()


def _is_text_value(loc: tuple) -> bool:
    """A value under a node's or the defaults' ``env:`` / ``labels:`` (kept as written)."""
    if len(loc) < 2 or loc[-2] not in _MERGED:
        return False
    owner = loc[:-2]
    return owner == ("defaults",) or (len(owner) == 2 and owner[0] == "nodes")


class _YamlReader(Reader):
    """The YAML inventory: ``master_port``, ``ssh``, ``defaults``, ``nodes``."""

    def load(self) -> Inventory:
        data = parse(self.text, self.problems, verbatim=_is_text_value, like="inventories/example.yaml")
        if not isinstance(data, dict):
            got = "is empty" if data is None else f"is {show(data)}, not a mapping"
            hint = "a mapping with nodes: (see inventories/example.yaml)"
            if isinstance(data, str):  # host lines read as YAML text: a hostfile named *.yaml
                hint += "; a hostfile is read as one only when its name does not end in .yaml/.yml"
            self.add((), f"the file {got}", hint)
            self.problems.raise_if_any()
        for key in data:
            if key not in TOP_FIELDS:
                self.add((key,), f'unknown field "{key}"{suggest(str(key), TOP_FIELDS)}',
                         f"one of {one_of(TOP_FIELDS)}")
        master_port = self._master_port(data.get("master_port", DEFAULT_MASTER_PORT))
        ssh = self._ssh(data.get("ssh"))
        registry = self._registry(data.get("registry"))
        defaults = self._defaults(data.get("defaults"))
        nodes = self._nodes(data, defaults)
        self.problems.raise_if_any()
        return Inventory(self.path, nodes, master_port=master_port, ssh=ssh or SSHSettings(),
                         registry=registry)

    # -- sections --------------------------------------------------------------------------------
    def _master_port(self, value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
            return value
        reason = "is out of range" if isinstance(value, int) and not isinstance(value, bool) \
            else "is not a whole number"
        self.add(("master_port",), f"{show(value)} {reason}", HINTS["master_port"])
        return DEFAULT_MASTER_PORT

    def _registry(self, value: Any) -> Registry | None:
        if value is None:
            return None
        if not isinstance(value, str):
            self.add(("registry",), f"{show(value)} is not text", HINTS["registry"])
            return None
        try:
            return parse_registry(value)
        except ValueError as e:
            self.add(("registry",), escaped(str(e)), HINTS["registry"])
            return None

    def _ssh(self, value: Any) -> SSHSettings | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            self.add(("ssh",), f"{show(value)} is not a mapping", HINTS["ssh"])
            return None
        if "known_hosts" in value:
            value = {**value, "known_hosts": self.resolve_path(value["known_hosts"])}
        ssh = self.validate(SSHSettings, value, ("ssh",), SSH_FIELDS)[0]
        if ssh is not None and ssh.known_hosts is not None and ssh.known_hosts.is_dir():
            self.add(("ssh", "known_hosts"), f"{ssh.known_hosts} is a directory", HINTS["known_hosts"])
        return ssh

    def _defaults(self, value: Any) -> dict:
        """The defaults' keys that are valid (an invalid one is reported once, here, not per node)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.add(("defaults",), f"{show(value)} is not a mapping", HINTS["defaults"])
            return {}
        for key in ("name", "host", "master", "spare"):
            if key in value:
                self.add(("defaults", key), f'"{key}" cannot be a default (it belongs to each node)',
                         f"set it on the node; defaults may hold {one_of(DEFAULT_FIELDS)}")
        value = self._resolved({k: v for k, v in value.items() if k not in ("name", "host", "master", "spare")})
        _, bad = self.validate(Defaults, value, ("defaults",), DEFAULT_FIELDS)
        good = {k: v for k, v in value.items() if k in DEFAULT_FIELDS and k not in bad}
        if "identity_file" in good:
            before = len(self.problems)
            self.check_identity(good["identity_file"], ("defaults", "identity_file"))
            if len(self.problems) > before:
                del good["identity_file"]
        return good

    def _resolved(self, mapping: dict) -> dict:
        if "identity_file" in mapping:
            return {**mapping, "identity_file": self.resolve_path(mapping["identity_file"])}
        return mapping

    def _nodes(self, data: dict, defaults: dict) -> list[Node]:
        raw = data.get("nodes")
        if not isinstance(raw, list) or not raw:
            got = "is missing" if "nodes" not in data else (
                "is empty" if raw in (None, []) else f"is {show(raw)}, not a list")
            self.add(("nodes",), f"the node list {got}", HINTS["nodes"] + ", e.g. nodes: [{host: 10.0.0.11}]")
            return []
        nodes: list[Node] = []
        merged: list[tuple[int, dict]] = []
        for i, item in enumerate(raw):
            loc = ("nodes", i)
            if isinstance(item, str):  # shorthand: "- 10.0.0.11"
                item = {"host": item}
            if not isinstance(item, dict):
                self.add(loc, f"{show(item)} is not a node", HINTS["nodes"])
                continue
            merged.append((i, self._merge(defaults, self._resolved(item))))
            node, _ = self.validate(Node, merged[-1][1], loc, NODE_FIELDS)
            if node is not None:
                if "identity_file" in item:
                    self.check_identity(node.identity_file, loc + ("identity_file",))
                nodes.append(node)
        self.check_nodes(merged)
        return nodes

    @staticmethod
    def _merge(defaults: dict, own: dict) -> dict:
        """A node's own keys win; labels and env are merged key by key."""
        merged = {**defaults, **own}
        for key in _MERGED:
            if isinstance(defaults.get(key), dict) and isinstance(own.get(key), dict):
                merged[key] = {**defaults[key], **own[key]}
        return merged
