"""The inventory: which nodes a cluster has, and how clusterctl reaches them.

One file, three accepted formats (auto-detected, see ``detect_format``):

* a YAML inventory (documented by ``inventories/example.yaml``),
* an MPI hostfile (``host``, ``user@host``, ``host:N`` or ``host slots=N [max_slots=M]``
  per line, ``#`` comments),
* a DeepSpeed hostfile (``host slots=N`` per line).

Hostfile nodes write no port, user or key: the transport takes them from
``~/.ssh/config`` at connect time (``"port" in node.model_fields_set`` tells a
written port from the default 22).  Ranks: the master (``master: true``, else
the first node) is rank 0, then file order.

Everything is validated before anything touches a node.  pydantic checks the
types, but every problem is reported in our own words as
``FILE:LINE: field: problem; valid: ...`` (one line per problem, ALL problems
at once) through ``InventoryError`` (a ``UserError``, exit status 2): a newcomer
editing the file should be able to fix it in one pass.

Values under ``env:`` and ``labels:`` are text.  A YAML number or boolean there
is taken exactly as written (``OMP_NUM_THREADS: 4`` gives ``"4"``,
``FLAG: yes`` gives ``"yes"``, ``MASK: 0755`` gives ``"0755"``), the same rule as
``--set`` on the command line; a null, a list or a mapping is an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from clusterctl.core.errors import UserError, did_you_mean, one_of

DEFAULT_MASTER_PORT = 29500

Port = Annotated[int, Field(strict=True, ge=1, le=65535)]
Slots = Annotated[int, Field(strict=True, ge=1)]
StrictBool = Annotated[bool, Field(strict=True)]

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IFACE_RE = re.compile(r"[A-Za-z0-9._@-]{1,15}")  # Linux: at most 15 characters (IFNAMSIZ - 1)


def _invalid(reason: str) -> PydanticCustomError:
    """A pydantic error whose text is a predicate on the value ("is empty"), for our messages."""
    return PydanticCustomError("clusterctl", reason)


def _argument_safe(value: str) -> str:
    """Refuse blanks, whitespace and a leading '-': ssh or docker could read such a value as an option."""
    if not value:
        raise _invalid("is empty")
    if value.startswith("-"):
        raise _invalid("starts with '-'")
    if any(c.isspace() for c in value):
        raise _invalid("contains whitespace")
    return value


def _matching(pattern: re.Pattern, reason: str):
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise _invalid(reason)
        return value
    return check


def _host(value: str) -> str:
    _argument_safe(value)
    if "@" in value:
        raise _invalid("holds a user (write the user as user: and the address as host:)")
    return value


def _device(value: str) -> str:
    if not value.startswith("/") or any(c.isspace() for c in value):
        raise _invalid("is not an absolute device path")
    return value


NodeName = Annotated[str, AfterValidator(_matching(_NAME_RE, "is not a usable node name"))]
Host = Annotated[str, AfterValidator(_host)]
User = Annotated[str, AfterValidator(_argument_safe)]
Device = Annotated[str, AfterValidator(_device)]
Interface = Annotated[str, AfterValidator(_matching(_IFACE_RE, "is not a network interface name"))]
EnvName = Annotated[str, AfterValidator(_matching(_ENV_NAME_RE, "is not an environment variable name"))]
UserPath = Annotated[Path, AfterValidator(lambda p: p.expanduser())]


class _NodeSettings(BaseModel):
    """What a node and the ``defaults:`` section both may set (same types, same checks)."""

    model_config = ConfigDict(extra="forbid")

    port: Port = 22  # "port" in model_fields_set tells whether it was written (else ssh config may apply)
    user: User | None = None  # None: ssh config / current user
    identity_file: UserPath | None = None  # expanded (~); the loader checks it is readable
    slots: Slots = 1  # processes (accelerators) on this node
    devices: list[Device] = []  # e.g. /dev/infiniband
    interface: Interface | None = None  # NIC for GLOO/NCCL_SOCKET_IFNAME; None: preflight finds it
    labels: dict[str, str] = {}
    env: dict[EnvName, str] = {}  # extra container env for this node


class Node(_NodeSettings):
    """One machine of the cluster (frozen: the inventory is read once per command)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: NodeName  # defaults to host when omitted
    host: Host  # address or ~/.ssh/config alias
    master: StrictBool = False

    def __hash__(self) -> int:  # lists/dicts inside: hash by the identifying fields
        return hash((self.name, self.host, self.port))

    def __repr_args__(self):
        """name and host first (they are declared after the shared settings)."""
        args = dict(super().__repr_args__())
        return [(k, args[k]) for k in NODE_FIELDS]

    @model_validator(mode="before")
    @classmethod
    def _name_defaults_to_host(cls, data: Any) -> Any:
        if isinstance(data, dict) and "name" not in data and data.get("host") is not None:
            data = {**data, "name": str(data["host"])}  # a bad host is reported once, as the host
        return data


class _Defaults(_NodeSettings):
    """The ``defaults:`` section."""


class SSHSettings(BaseModel):
    """How clusterctl reaches the nodes (the ``ssh:`` section)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    known_hosts: UserPath | None = None  # None: ~/.ssh/known_hosts
    accept_new_host_keys: StrictBool = False  # explicit opt-in; a CHANGED key is always an error
    connect_timeout: Annotated[float, Field(strict=True, gt=0)] = 10.0
    fanout: Annotated[int, Field(strict=True, ge=1)] = 32


DEFAULT_FIELDS = tuple(_NodeSettings.model_fields)
NODE_FIELDS = ("name", "host", *DEFAULT_FIELDS, "master")
SSH_FIELDS = tuple(SSHSettings.model_fields)
TOP_FIELDS = ("master_port", "ssh", "defaults", "nodes")
_MERGED = ("labels", "env")  # a node's own entries are added to the defaults' ones


@dataclass
class Inventory:
    """The validated cluster: nodes in rank order (the master first, then file order)."""

    path: Path
    nodes: list[Node]
    master_port: int = DEFAULT_MASTER_PORT
    ssh: SSHSettings = field(default_factory=SSHSettings)
    format: str = "yaml"  # "yaml" or "hostfile" (MPI / DeepSpeed)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.nodes = rank_order(self.nodes, where=str(self.path))

    @property
    def master(self) -> Node:
        return self.nodes[0]

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def rank(self, node_name: str) -> int:
        """Node rank (0 for the master) of the node called ``node_name``."""
        return self.names.index(self.node(node_name).name)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise UserError(f"{self.path}: no node named {name!r}{did_you_mean(name, self.names)}; "
                        f"valid: {one_of(self.names)}")

    def select(self, names: Iterable[str] | None) -> list[Node]:
        """The nodes called ``names`` in rank order (all nodes for None); unknown names are a UserError."""
        if names is None:
            return list(self.nodes)
        wanted = {self.node(n).name for n in names}
        return [n for n in self.nodes if n.name in wanted]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)


def rank_order(nodes: list[Node], *, where: str = "inventory") -> list[Node]:
    """Master first (the first node when none is marked), then file order; at most one master."""
    if not nodes:
        raise UserError(f"{where}: no nodes; valid: at least one node")
    names = [n.name for n in nodes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"{where}: node names used twice: {one_of(twice)}; valid: a unique name per node")
    masters = [n for n in nodes if n.master]
    if len(masters) > 1:
        raise UserError(f"{where}: {len(masters)} masters ({one_of([m.name for m in masters])}); "
                        "valid: at most one node with master: true")
    master = masters[0] if masters else nodes[0].model_copy(update={"master": True})
    rest = [n for n in nodes if n is not (masters[0] if masters else nodes[0])]
    return [master, *rest]


# --------------------------------------------------------------------------------------------
# Loading and validation
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Problem:
    """One thing wrong in an inventory file, located by line and field."""

    line: int
    field: str
    problem: str
    valid: str

    def render(self, file: str) -> str:
        return f"{file}:{self.line}: {self.field}: {self.problem}; valid: {self.valid}"


class InventoryError(UserError):
    """All problems of one inventory file, one per line (exit status 2)."""

    def __init__(self, file: str, problems: list[Problem]) -> None:
        self.file = file
        self.problems = sorted(problems, key=lambda p: p.line)
        n = len(self.problems)
        head = f"{file}: {n} problem{'s' if n != 1 else ''} in the inventory (nothing was started):"
        super().__init__("\n".join([head, *(p.render(file) for p in self.problems)]))


def load_inventory(path: str | os.PathLike) -> Inventory:
    """Read and validate an inventory (YAML, MPI or DeepSpeed hostfile); InventoryError on bad input."""
    path = Path(path)
    text = _read(path)
    if detect_format(path, text) == "hostfile":
        return _HostfileLoader(path, text).load()
    return _YamlLoader(path, text).load()


def _read(path: Path) -> str:
    file = str(path)
    if not path.exists():
        raise UserError(f"{file}: inventory file does not exist; valid: a YAML inventory "
                        "(see inventories/example.yaml), an MPI or a DeepSpeed hostfile")
    if not path.is_file():
        raise UserError(f"{file}: is not a file; valid: a YAML inventory, an MPI or a DeepSpeed hostfile")
    try:
        return path.read_text(encoding="utf-8-sig")  # a BOM from a Windows editor is not a host
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{file}: cannot read the inventory ({e}); valid: a readable UTF-8 text file") from None


_YAML_MARKERS = re.compile(r"---|\{|-(\s|$)|\s+[^\s#:]+\s*:(\s|$)")  # document, flow map, list, indented key
_TOP_KEY = re.compile(r"([A-Za-z_]+)\s*:(\s|$)")


def detect_format(path: Path, text: str) -> str:
    """"yaml" for .yaml/.yml files or text that is recognisably YAML; "hostfile" otherwise.

    Hostfile lines (``host``, ``host:4``, ``host slots=4``) are never indented
    keys, list items or flow mappings, and a top-level ``key:`` counts as YAML
    only when the key is (close to) an inventory section: so ``node9:`` in a
    hostfile is a host with a missing count, while ``node:`` (a typo of
    ``nodes:``) in a malformed inventory is still reported as YAML with its line.
    """
    if path.suffix.lower() in (".yaml", ".yml"):
        return "yaml"
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key = _TOP_KEY.match(line)
        if _YAML_MARKERS.match(line) or (key and (key[1] in TOP_FIELDS or did_you_mean(key[1], TOP_FIELDS))):
            return "yaml"
    return "hostfile"


_HINTS = {
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
    "master": "true or false (at most one node is master)",
    "master_port": "a whole number from 1 to 65535 (the port rank 0 listens on; default 29500)",
    "known_hosts": "a path to a known_hosts file (relative to the inventory's directory, ~ expands)",
    "accept_new_host_keys": "true or false",
    "connect_timeout": "a number of seconds greater than 0",
    "fanout": "a whole number of at least 1 (nodes contacted at once)",
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


def _suggest(word: str, known: tuple[str, ...]) -> str:
    """' (did you mean "x"?)' from the word other tools use for our field, or from spelling."""
    meant = _SYNONYMS.get(word.lower())
    return f' (did you mean "{meant}"?)' if meant in known else did_you_mean(word, known)


def _show(value: Any) -> str:
    """A value as the user wrote it, in YAML terms."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return str(value)


class _Loader:
    """Shared by both formats: turns raw node mappings into validated Nodes and collects Problems."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.file = str(path)
        self.text = text
        self.base = path.absolute().parent  # the directory the user sees, even through a symlink
        self.lines: dict[tuple, int] = {(): 1}
        self.problems: list[Problem] = []

    # -- locating ------------------------------------------------------------------------------
    def line(self, loc: tuple) -> int:
        """Line of the longest known prefix of ``loc`` (a missing key points at its mapping)."""
        for i in range(len(loc), -1, -1):
            if loc[:i] in self.lines:
                return self.lines[loc[:i]]
        return 1

    def field_name(self, loc: tuple) -> str:
        out = ""
        for part in loc:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
        return out or "(file)"

    def add(self, loc: tuple, problem: str, valid: str) -> None:
        self.problems.append(Problem(self.line(loc), self.field_name(loc), problem, valid))

    def fail_if_problems(self) -> None:
        if self.problems:
            raise InventoryError(self.file, self.problems)

    # -- validation ----------------------------------------------------------------------------
    def validate(self, model: type[BaseModel], data: dict, loc: tuple, known: tuple[str, ...]):
        """(model or None, the top-level keys that had errors); each pydantic error becomes a Problem."""
        try:
            return model.model_validate(data), set()
        except ValidationError as exc:
            bad = set()
            missing = {e["loc"] for e in exc.errors() if e["type"] == "missing"}
            for e in exc.errors():
                if e["loc"] == ("name",) and ("host",) in missing:
                    continue  # the name defaults to the host: one problem, the missing host
                where = tuple(p for p in e["loc"] if p != "[key]")
                self.add(loc + where, *self._describe(e, where, known))
                bad.add(where[0] if where else None)
            return None, bad

    @staticmethod
    def _describe(e: dict, where: tuple, known: tuple[str, ...]) -> tuple[str, str]:
        """(problem, valid) in our words for one pydantic error."""
        top = str(where[0]) if where else ""
        if e["type"] == "extra_forbidden":
            return f'unknown field "{top}"{_suggest(top, known)}', f"one of {one_of(known)}"
        if e["type"] == "missing":
            return "is missing", _HINTS.get(top, "")
        reason = e["msg"] if e["type"] == "clusterctl" else _REASONS.get(e["type"], e["msg"].lower())
        if "[key]" in e["loc"]:
            subject = f"key {_show(e['input'])}"
        elif top == "env" and e["input"] is not None:  # env values may be secrets (tokens): never echo them
            subject = "the value"
        else:
            subject = _show(e["input"])
        return f"{subject} {reason}", _HINTS.get(top, "")

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
            self.add(loc, f"{path} {reason}", _HINTS["identity_file"])

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
        return f"nodes[{i}] on line {self.line(('nodes', i))}"


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


class _HostfileLoader(_Loader):
    """MPI (``[user@]host``, ``host:N``, ``host slots=N [max_slots=M]``) and DeepSpeed (``host slots=N``)."""

    format = "hostfile"
    KEYS = ("slots", "max_slots")
    VALID = "one host per line: host, user@host, host:N or host slots=N (N a whole number of at least 1)"

    def field_name(self, loc: tuple) -> str:
        return str(loc[2]) if len(loc) > 2 else "host"

    def ref(self, i: int) -> str:
        return f"line {self.line(('nodes', i))}"

    def load(self) -> Inventory:
        raw: list[dict] = []
        for lineno, text in enumerate(self.text.splitlines(), 1):
            entry = self._parse_line(lineno, text)
            if entry is not None:
                self.lines[("nodes", len(raw))] = lineno
                raw.append(entry)
        if not raw and not self.problems:
            self.add((), "no hosts", self.VALID)
        nodes = [self.validate(Node, data, ("nodes", i), ("host", "slots"))[0] for i, data in enumerate(raw)]
        self.check_nodes(list(enumerate(raw)))
        self.fail_if_problems()
        return Inventory(self.path, nodes, format=self.format)

    def _parse_line(self, lineno: int, text: str) -> dict | None:
        tokens = text.split("#", 1)[0].split()
        if not tokens:
            return None
        host, entry = tokens[0], {}
        if host.count(":") == 1:  # MPICH style host:N
            host, _, n = host.partition(":")
            entry["slots"] = self._slots(lineno, n, text)
        if "@" in host:  # Open MPI's user@host
            entry["user"], _, host = host.rpartition("@")
        if not host:
            self.problems.append(Problem(lineno, "host", f'no host name in "{text.strip()}"', self.VALID))
            return None
        entry["host"] = host
        for tok in tokens[1:]:
            key, eq, value = tok.partition("=")
            if not eq or key not in self.KEYS:
                what = f'unknown setting "{tok}"{did_you_mean(key, self.KEYS)}' if eq else f'unexpected "{tok}"'
                if tok.isdigit():
                    what += f' (did you mean "slots={tok}"?)'
                self.problems.append(Problem(lineno, "host", what, self.VALID))
            elif key == "slots":
                entry["slots"] = self._slots(lineno, value, text)
            else:
                self._slots(lineno, value, text, field="max_slots")  # checked, not used
        return entry if all(v is not None for v in entry.values()) else None

    def _slots(self, lineno: int, value: str, text: str, field: str = "slots") -> int | None:
        if value.isdigit() and int(value) >= 1:
            return int(value)
        self.problems.append(Problem(lineno, field, f'"{value}" is not a whole number of at least 1 '
                                     f'(in "{text.strip()}")', self.VALID))
        return None


_YAML_TOKENS = {  # PyYAML's parser tokens in a newcomer's words
    "<block end>": "the end of the indented block",
    "'<block sequence start>'": "a '-' list item indented differently from the ones above",
    "'<block mapping start>'": "a key indented differently from the ones above",
}


def _yaml_problem(e: yaml.YAMLError) -> Problem:
    """A YAML syntax error at the line PyYAML stopped, naming where the open construct began."""
    mark = getattr(e, "problem_mark", None)
    context_mark = getattr(e, "context_mark", None)
    what = getattr(e, "problem", None) or str(e)
    for token, plain in _YAML_TOKENS.items():
        what = what.replace(token, plain)
    context = getattr(e, "context", None)
    if context and context_mark is not None:
        what += f" ({context} that began on line {context_mark.line + 1})"
    valid = ("indent with spaces (YAML does not allow tabs)" if "\\t" in what or "\t" in what else
             "YAML as in inventories/example.yaml (check indentation, colons, quotes and "
             "brackets on this line and the lines above)")
    line = (mark or context_mark).line + 1 if (mark or context_mark) else 1
    return Problem(line, "(YAML syntax)", what, valid)


class _YamlLoader(_Loader):
    """The YAML inventory: ``master_port``, ``ssh``, ``defaults``, ``nodes``."""

    def load(self) -> Inventory:
        data = self._parse()
        if not isinstance(data, dict):
            got = "is empty" if data is None else f"is {_show(data)}, not a mapping"
            hint = "a mapping with nodes: (see inventories/example.yaml)"
            if isinstance(data, str):  # host lines read as YAML text: a hostfile named *.yaml
                hint += "; a hostfile is read as one only when its name does not end in .yaml/.yml"
            self.add((), f"the file {got}", hint)
            self.fail_if_problems()
        for key in data:
            if key not in TOP_FIELDS:
                self.add((key,), f'unknown field "{key}"{_suggest(str(key), TOP_FIELDS)}',
                         f"one of {one_of(TOP_FIELDS)}")
        master_port = self._master_port(data.get("master_port", DEFAULT_MASTER_PORT))
        ssh = self._ssh(data.get("ssh"))
        defaults = self._defaults(data.get("defaults"))
        nodes = self._nodes(data, defaults)
        self.fail_if_problems()
        return Inventory(self.path, nodes, master_port=master_port, ssh=ssh or SSHSettings())

    # -- parsing with line numbers -------------------------------------------------------------
    def _parse(self) -> Any:
        loader = yaml.SafeLoader(self.text)
        try:
            root = loader.get_single_node()
            return None if root is None else self._build(loader, root, ())
        except yaml.YAMLError as e:
            self.problems.append(_yaml_problem(e))
            raise InventoryError(self.file, self.problems) from None
        finally:
            loader.dispose()

    def _build(self, loader: yaml.SafeLoader, node: yaml.Node, loc: tuple) -> Any:
        """Python data from the composed YAML, recording each key's line and duplicate keys."""
        self.lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, yaml.SequenceNode):
            return [self._build(loader, item, loc + (i,)) for i, item in enumerate(node.value)]
        if not isinstance(node, yaml.MappingNode):
            if self._is_text_value(loc) and isinstance(node, yaml.ScalarNode) \
                    and node.tag != "tag:yaml.org,2002:null":
                return node.value  # env/labels: numbers and booleans exactly as written
            return loader.construct_object(node, deep=True)
        out: dict = {}
        explicit = {}
        for k, _ in node.value:
            if k.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(k, deep=True)
            if not isinstance(key, (str, int)):
                continue
            if key in explicit:
                self.problems.append(Problem(k.start_mark.line + 1, self.field_name(loc + (key,)),
                                             f"is written twice (first on line {explicit[key]}; "
                                             "the last one would silently win)", "each key once per mapping"))
            explicit.setdefault(key, k.start_mark.line + 1)
        loader.flatten_mapping(node)  # YAML merge keys (<<: *anchor)
        for k, v in node.value:
            key = loader.construct_object(k, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                self.add(loc, f"a key is {_show(key)}", "plain text keys")
                continue
            self.lines[loc + (key,)] = k.start_mark.line + 1
            out[key] = self._build(loader, v, loc + (key,))
        return out

    @staticmethod
    def _is_text_value(loc: tuple) -> bool:
        if len(loc) < 2 or loc[-2] not in _MERGED:
            return False
        owner = loc[:-2]
        return owner == ("defaults",) or (len(owner) == 2 and owner[0] == "nodes")

    # -- sections --------------------------------------------------------------------------------
    def _master_port(self, value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
            return value
        reason = "is out of range" if isinstance(value, int) and not isinstance(value, bool) \
            else "is not a whole number"
        self.add(("master_port",), f"{_show(value)} {reason}", _HINTS["master_port"])
        return DEFAULT_MASTER_PORT

    def _ssh(self, value: Any) -> SSHSettings | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            self.add(("ssh",), f"{_show(value)} is not a mapping", _HINTS["ssh"])
            return None
        if "known_hosts" in value:
            value = {**value, "known_hosts": self.resolve_path(value["known_hosts"])}
        ssh = self.validate(SSHSettings, value, ("ssh",), SSH_FIELDS)[0]
        if ssh is not None and ssh.known_hosts is not None and ssh.known_hosts.is_dir():
            self.add(("ssh", "known_hosts"), f"{ssh.known_hosts} is a directory", _HINTS["known_hosts"])
        return ssh

    def _defaults(self, value: Any) -> dict:
        """The defaults' keys that are valid (an invalid one is reported once, here, not per node)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.add(("defaults",), f"{_show(value)} is not a mapping", _HINTS["defaults"])
            return {}
        for key in ("name", "host", "master"):
            if key in value:
                self.add(("defaults", key), f'"{key}" cannot be a default (it belongs to each node)',
                         f"set it on the node; defaults may hold {one_of(DEFAULT_FIELDS)}")
        value = self._resolved({k: v for k, v in value.items() if k not in ("name", "host", "master")})
        _, bad = self.validate(_Defaults, value, ("defaults",), DEFAULT_FIELDS)
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
                "is empty" if raw in (None, []) else f"is {_show(raw)}, not a list")
            self.add(("nodes",), f"the node list {got}", _HINTS["nodes"] + ", e.g. nodes: [{host: 10.0.0.11}]")
            return []
        nodes: list[Node] = []
        merged: list[tuple[int, dict]] = []
        for i, item in enumerate(raw):
            loc = ("nodes", i)
            if isinstance(item, str):  # shorthand: "- 10.0.0.11"
                item = {"host": item}
            if not isinstance(item, dict):
                self.add(loc, f"{_show(item)} is not a node", _HINTS["nodes"])
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
