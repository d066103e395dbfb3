"""Inventory validation shared by both readers: raw node mappings in, Nodes and problems out.

One job: turn what a file wrote into validated model objects (``model``), reporting every
problem in a newcomer's words through ``core.yamlfile.Problems`` (``FILE:LINE: field:
problem; valid: ...``, all at once, as ``InventoryError``).  pydantic's errors are
translated here (``_describe``), and the rules across nodes live here (unique names,
unique host and port, at most one master), so YAML inventories and hostfiles say the same
thing about the same mistake.

Contract: ``InventoryError``; ``Reader`` (the base of the YAML and hostfile readers:
``problems``, ``validate``, ``resolve_path``, ``check_identity``, ``check_nodes``);
``HINTS`` (what is valid, per field) and ``suggest`` (a field another tool's word means).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from clusterctl.cluster.inventory.model import DEFAULT_FIELDS, SSH_FIELDS
from clusterctl.cluster.registry.reference import REGISTRY_HELP
from clusterctl.core.errors import did_you_mean, one_of
from clusterctl.core.yamlfile import FileProblems, Problems, bracketed, show


class InventoryError(FileProblems):
    """All problems of one inventory file, one per line (exit status 2)."""

    what = "inventory"


HINTS = {
    "name": 'a letter or digit, then letters, digits, ".", "_", ":" or "-", unique in the inventory',
    "host": "an address or ~/.ssh/config alias, no spaces, no user@ (e.g. 10.0.0.11)",
    "port": "a whole number from 1 to 65535 (the node's SSH port)",
    "user": "a login name (no spaces), or leave it out to use ~/.ssh/config / the current user",
    "identity_file": "the path of a readable private key (relative to the inventory's directory, ~ expands)",
    "slots": "a whole number of at least 1 (processes / accelerators on this node)",
    "devices": "a list of absolute device paths such as /dev/infiniband",
    "interface": "a network interface name of at most 15 characters, e.g. eth0",
    "labels": 'a mapping of names to text, e.g. {rack: a} (write "" for an empty value)',
    "env": 'a mapping of variable names to text, e.g. {NCCL_IB_HCA: mlx5_0} (write "" for an empty value)',
    "code_dir": "a path on the node (absolute or ~/...), on local disk, for the shipped project copies",
    "master": "true or false (at most one node is master)",
    "spare": "true or false (a hot spare launch uses only to replace a failed node; not the master)",
    "master_port": "a whole number from 1 to 65535 (the port rank 0 listens on; default 29500)",
    "registry": f"a registry address, {REGISTRY_HELP}",
    "known_hosts": "a path to a known_hosts file (relative to the inventory's directory, ~ expands)",
    "accept_new_host_keys": "true or false",
    "connect_timeout": "a number of seconds greater than 0",
    "fanout": "a whole number of at least 1 (nodes contacted at once)",
    "tree": "true, false or auto (launch reaches the nodes through each other, one connection from here)",
    "tree_width": "a whole number of at least 1 (nodes each node of the tree logs in to)",
    "node_identity_file": "a path on the nodes (absolute or ~/...) to the key they log in to each other with",
    "ssh": f"a mapping with {one_of(SSH_FIELDS)}",
    "defaults": f"a mapping with {one_of(DEFAULT_FIELDS)}",
    "nodes": "a list of nodes, each a mapping with at least host:",
}

_REASONS = {
    "int_type": "is not a whole number",
    "int_parsing": "is not a whole number",
    "int_from_float": "is not a whole number",
    "float_type": "is not a number",
    "float_parsing": "is not a number",
    "bool_type": "is not true or false",
    "bool_parsing": "is not true or false",
    "string_type": "is not text",
    "path_type": "is not a path",
    "dict_type": "is not a mapping",
    "list_type": "is not a list",
    "model_type": "is not a mapping",
    "model_attributes_type": "is not a mapping",
    "greater_than_equal": "is out of range",
    "greater_than": "is out of range",
    "less_than_equal": "is out of range",
}


# words newcomers use for our fields (from ssh, MPI, torchrun, Ansible inventories)
_SYNONYMS = {
    "address": "host", "addr": "host", "ip": "host", "hostname": "host", "ansible_host": "host",
    "username": "user", "login": "user", "ansible_user": "user",
    "ssh_port": "port", "ansible_port": "port",
    "key": "identity_file", "ssh_key": "identity_file", "keyfile": "identity_file",
    "private_key": "identity_file", "identityfile": "identity_file",
    "gpus": "slots", "nproc_per_node": "slots", "nproc": "slots", "procs": "slots", "accelerators": "slots",
    "nic": "interface", "iface": "interface", "ifname": "interface", "socket_ifname": "interface",
    "environment": "env", "tags": "labels",
    "rank0": "master", "head": "master",
    "hosts": "nodes", "workers": "nodes", "machines": "nodes",
    "port_master": "master_port", "rdzv_port": "master_port",
}


def suggest(word: str, known: tuple[str, ...]) -> str:
    """' (did you mean "x"?)' from the word other tools use for our field, or from spelling."""
    meant = _SYNONYMS.get(word.lower())
    return f' (did you mean "{meant}"?)' if meant in known else did_you_mean(word, known)


class Reader:
    """Shared by both formats: turns raw node mappings into validated Nodes and collects problems."""

    def __init__(self, path: Path, text: str, *, spell: Callable[[tuple], str] = bracketed) -> None:
        self.path = path
        self.text = text
        self.base = path.absolute().parent  # the directory the user sees, even through a symlink
        self.problems = Problems(path, spell=spell, error=InventoryError)

    def add(self, loc: tuple, problem: str, valid: str) -> None:
        self.problems.add(loc, problem, valid)

    # -- validation ----------------------------------------------------------------------------
    def validate(self, model: type[BaseModel], data: dict, loc: tuple, known: tuple[str, ...]):
        """(model or None, the top-level keys that had errors); each pydantic error becomes a problem."""
        try:
            return model.model_validate(data), set()
        except ValidationError as exc:
            bad = set()
            missing = {e["loc"] for e in exc.errors() if e["type"] == "missing"}
            for e in exc.errors():
                if e["loc"] == ("name",) and ("host",) in missing:
                    continue  # the name defaults to the host: one problem, the missing host
                where = tuple(p for p in e["loc"] if p != "[key]")
                self.add(loc + where, *_describe(e, where, known))
                bad.add(where[0] if where else None)
            return None, bad

    def resolve_path(self, value: Any) -> Any:
        """Relative paths resolve against the inventory's directory; ``~`` expands."""
        if isinstance(value, str) and value:
            p = Path(value).expanduser()
            return p if p.is_absolute() else self.base / p
        return value

    def check_identity(self, path: Path | None, loc: tuple) -> None:
        if path is None:
            return
        reason = _identity_problem(path)
        if reason:
            self.add(loc, f"{path} {reason}", HINTS["identity_file"])

    def check_nodes(self, raw: list[tuple[int, dict]]) -> None:
        """Cross-node rules on the written values (so they are found even when a node has other
        problems): unique names, unique host/port, at most one master."""
        seen_names: dict[str, int] = {}
        seen_addr: dict[tuple[str, int], int] = {}
        first_master: int | None = None
        for i, d in raw:
            name, host, port = d.get("name", d.get("host")), d.get("host"), d.get("port", 22)
            addr = (host, port) if isinstance(host, str) and type(port) is int else None
            addr_dup = addr in seen_addr
            if isinstance(name, str) and name in seen_names and not (addr_dup and "name" not in d):
                self.add(("nodes", i, "name"), f'"{name}" is already the name of {self.ref(seen_names[name])}',
                         "a name unique in this inventory")
            if isinstance(name, str):
                seen_names.setdefault(name, i)
            if addr_dup:
                self.add(("nodes", i, "host"), f"{host} port {port} is already {self.ref(seen_addr[addr])}",
                         "each node at a distinct host and port")
            if addr is not None:
                seen_addr.setdefault(addr, i)
            if d.get("master") is True:
                if first_master is not None:
                    self.add(("nodes", i, "master"), f"a second master ({self.ref(first_master)} is master too)",
                             "at most one node with master: true (default: the first node)")
                else:
                    first_master = i

    def ref(self, i: int) -> str:
        return f"nodes[{i}] on line {self.problems.line(('nodes', i))}"


def _describe(e: dict, where: tuple, known: tuple[str, ...]) -> tuple[str, str]:
    """(problem, valid) in our words for one pydantic error."""
    top = str(where[0]) if where else ""
    if e["type"] == "extra_forbidden":
        return f'unknown field "{top}"{suggest(top, known)}', f"one of {one_of(known)}"
    if e["type"] == "missing":
        return "is missing", HINTS.get(top, "")
    reason = e["msg"] if e["type"] == "clusterctl" else _REASONS.get(e["type"], e["msg"].lower())
    if "[key]" in e["loc"]:
        subject = f"key {show(e['input'])}"
    elif top == "env" and e["input"] is not None:  # env values may be secrets (tokens): never echo them
        subject = "the value"
    else:
        subject = show(e["input"])
    return f"{subject} {reason}", HINTS.get(top, "")


def _identity_problem(path: Path) -> str:
    """Why ``path`` cannot serve as an SSH private key, or '' when it can."""
    if not path.exists():
        return "does not exist"
    if not path.is_file():
        return "is not a file"
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError as e:
        return f"is not readable ({e.strerror})"
    if path.suffix == ".pub" or head.startswith((b"ssh-", b"ecdsa-", b"sk-")):
        return "is a public key (give the private key, without .pub)"
    return ""
