"""The inventory's model: the nodes of a cluster, how clusterctl reaches them, their rank order.

One job: the validated shape of an inventory, whatever file it came from.  pydantic
models check each value's type and form (``Node``, ``SSHSettings`` and the settings a
node shares with ``defaults:``); ``Inventory`` holds the nodes in rank order (the master,
``master: true`` or else the first node, is rank 0, then file order).  The readers
(``yaml``, ``hostfiles``) build these; nothing here reads a file.

Contract: ``Node``, ``SSHSettings``, ``Inventory`` (``master``, ``names``, ``rank``,
``node``, ``select``), ``rank_order``, ``DEFAULT_MASTER_PORT`` and the field tuples
``DEFAULT_FIELDS``, ``NODE_FIELDS``, ``SSH_FIELDS``, ``TOP_FIELDS``.

A hostfile node writes no port, user or key: the transport takes them from
``~/.ssh/config`` at connect time (``"port" in node.model_fields_set`` tells a
written port from the default 22).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, model_validator
from pydantic_core import PydanticCustomError

from clusterctl.cluster.registry.reference import Registry
from clusterctl.cluster.runtime import RUNTIMES
from clusterctl.core.errors import UserError, did_you_mean, one_of
from clusterctl.core.secretnames import ENV_NAME
from clusterctl.core.text import control_problem

DEFAULT_MASTER_PORT = 29500

Port = Annotated[int, Field(strict=True, ge=1, le=65535)]
#: The most processes (accelerators) one node may have: a count past it is a typo, and a
#: target's per-slot devices are listed one by one (inventory slots, export --slots).
MAX_SLOTS = 1024
Slots = Annotated[int, Field(strict=True, ge=1, le=MAX_SLOTS)]
StrictBool = Annotated[bool, Field(strict=True)]

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")     # at most 253, as a DNS name
#: A host: a DNS name, an IPv4 or IPv6 address (a zone after %), or an ssh_config alias of
#: the same characters; nothing a shell or ssh would read as more than one word.
_HOST_RE = re.compile(r"[A-Za-z0-9._:%\[\]-]{1,253}")
#: A login name: what POSIX and directory services use ('DOMAIN\user', 'user@realm', a
#: machine account's final '$'); nothing a shell would expand.
_USER_RE = re.compile(r"[A-Za-z0-9._@\\-]{1,255}\$?")
#: What a node name may be (fullmatch), wherever one is read: an inventory, a run record.
NODE_NAME_RE = _NAME_RE
_IFACE_RE = re.compile(r"[A-Za-z0-9._@-]{1,15}")  # Linux: at most 15 characters (IFNAMSIZ - 1)


def _invalid(reason: str) -> PydanticCustomError:
    """A pydantic error whose text is a predicate on the value ("is empty"), for our messages."""
    return PydanticCustomError("clusterctl", reason)


_SPACE = re.compile(r"\s")


def _one_line(value: str) -> str:
    """Refuse NUL and every other control character (names, addresses, paths, label keys)."""
    problem = control_problem(value)
    if problem:
        raise _invalid(problem)
    return value


def _free_text(value: str) -> str:
    """Refuse NUL and control characters but tab and line feed (env and label values)."""
    problem = control_problem(value, multiline=True)
    if problem:
        raise _invalid(problem)
    return value


def _argument_safe(value: str) -> str:
    """Refuse blanks, control characters, whitespace and a leading '-': ssh or docker could
    read such a value as an option."""
    if not value:
        raise _invalid("is empty")
    _one_line(value)
    if value.startswith("-"):
        raise _invalid("starts with '-'")
    if _SPACE.search(value):
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
    return _matching(_HOST_RE, "is not a host name or address (at most 253 letters, digits, '.', "
                               "'-', ':', '%', '[', ']')")(value)


def _user(value: str) -> str:
    _argument_safe(value)
    return _matching(_USER_RE, "is not a login name (letters, digits, '.', '_', '-', '@', '\\', "
                               "a final '$')")(value)


def _node_path(value: str) -> str:
    """A path on the nodes (never read here): absolute or ~/..., no blanks or control characters."""
    _argument_safe(value)
    if not value.startswith(("/", "~/")):
        raise _invalid("is not an absolute path or ~/... on the nodes")
    return value


def _mountable_node_path(value: str) -> str:
    """A path on the nodes that is mounted into containers (``-v PATH:/workspace:ro``): a
    ``:`` would split the mount there, and the container runtime would refuse it at start."""
    _node_path(value)
    if ":" in value:
        raise _invalid("holds ':', which a container mount (-v PATH:/workspace:ro) cannot take; "
                       "valid: an absolute path or ~/... without ':'")
    return value


def _device(value: str) -> str:
    _one_line(value)
    if not value.startswith("/") or _SPACE.search(value) or "," in value:
        raise _invalid("is not an absolute device path (HOST[:CONTAINER[:PERMISSIONS]], no ',' "
                       "or blanks)")
    return value


def _user_path(path: Path) -> Path:
    _one_line(str(path))  # a NUL would otherwise fail later, in the OS call, as a traceback
    return path.expanduser()


def _runtime(value: object) -> str:
    """A container runtime clusterctl knows (``docker``, ``podman``): the names of
    :data:`clusterctl.cluster.runtime.RUNTIMES`."""
    if isinstance(value, str) and value in RUNTIMES:
        return value
    what = ("is not a known container runtime" + did_you_mean(value, list(RUNTIMES))
            if isinstance(value, str) else "is not a container runtime's name")
    raise _invalid(f"{what}; valid: {one_of(sorted(RUNTIMES))}")


NodeName = Annotated[str, AfterValidator(_matching(_NAME_RE, "is not a usable node name"))]
Host = Annotated[str, AfterValidator(_host)]
User = Annotated[str, AfterValidator(_user)]
Device = Annotated[str, AfterValidator(_device)]
Interface = Annotated[str, AfterValidator(_matching(_IFACE_RE, "is not a network interface name"))]
EnvName = Annotated[str, AfterValidator(_matching(ENV_NAME, "is not an environment variable name"))]
UserPath = Annotated[Path, AfterValidator(_user_path)]
NodePath = Annotated[str, AfterValidator(_node_path)]
MountableNodePath = Annotated[str, AfterValidator(_mountable_node_path)]
OneLine = Annotated[str, AfterValidator(_one_line)]
FreeText = Annotated[str, AfterValidator(_free_text)]


#: Where a node keeps the shipped copies of a project (``launch --workdir``), per login user.
DEFAULT_CODE_DIR = "~/.cache/clusterctl/code"

RuntimeName = Annotated[str, PlainValidator(_runtime)]

class _NodeSettings(BaseModel):
    """What a node and the ``defaults:`` section both may set (same types, same checks).

    Each field's description is its entry in docs/reference/inventory.md (generated from
    these models): a new key needs one (tests/docs/test_reference.py).
    """

    model_config = ConfigDict(extra="forbid")

    # "port" in model_fields_set tells whether it was written (else ssh config may apply)
    port: Port = Field(22, description=(
        "The node's SSH port, 1 to 65535. Left out, `~/.ssh/config`'s `Port` for the host "
        "applies, else 22."))
    user: User | None = Field(None, description=(
        "The login name (no spaces, not starting with `-`). Left out: `~/.ssh/config`'s "
        "`User` for the host, else the current user."))
    identity_file: UserPath | None = Field(None, description=(
        "The private key to log in with; it must exist and be readable when the inventory is "
        "loaded. A relative path is taken from the inventory's directory; `~` expands. Left "
        "out: ssh-agent, `~/.ssh/config` and the usual `~/.ssh/id_*` keys."))
    slots: Slots = Field(1, description=(
        "Processes (accelerators) on this node, a whole number of at least 1: what a job's "
        "`nproc_per_node: slots` starts here, and what a target's per-slot devices count."))
    # factories: no deepcopy per node
    devices: list[Device] = Field(default_factory=list, description=(
        "Host devices passed to the node's container as `--device=` (absolute paths, e.g. "
        "`/dev/infiniband`), after the target's; preflight checks they exist on the node."))
    interface: Interface | None = Field(None, description=(
        "The network interface (at most 15 characters, e.g. `eth0`) set as "
        "`GLOO_SOCKET_IFNAME` and `NCCL_SOCKET_IFNAME` in the container. Left out: the "
        "interface preflight finds holding the node's address."))
    labels: dict[OneLine, OneLine] = Field(default_factory=dict, description=(
        "Free-form text tags, `name: value`, shown by `clusterctl nodes`. A node's own labels "
        "are added to those of `defaults` (a node's value wins on the same name)."))
    env: dict[EnvName, FreeText] = Field(default_factory=dict, description=(
        "Extra container environment for this node, `NAME: value`. Values are text taken "
        "exactly as written (`OMP_NUM_THREADS: 4` gives `\"4\"`); write `\"\"` for an empty "
        "value. A node's own env is added to that of `defaults` (a node's value wins); it "
        "wins over the target's and the job's env, `--set` wins over it."))
    code_dir: MountableNodePath = Field(DEFAULT_CODE_DIR, description=(
        "Where the node keeps the copies of your project that `launch --workdir` ships (one "
        "read-only tree per content digest, mounted into the containers): an absolute path or "
        "`~/...` on the node, on its local disk. Unchanged files are shared between the "
        "copies by hard links."))
    runtime: RuntimeName | None = Field(None, description=(
        "The node's container runtime: `docker` or `podman` (rootful or rootless: the login "
        "user's own Podman). Every container and image command on the node is this "
        "runtime's; nodes of one run may differ. Left out: `docker`. `clusterctl check` "
        "shows each node's runtime and version, and a node whose runtime does not answer "
        "is a problem naming the runtimes that node has."))


class Node(_NodeSettings):
    """One machine of the cluster (frozen: the inventory is read once per command)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: NodeName = Field(description=(
        "The node's name, unique in the inventory: a letter or digit, then letters, digits, "
        "`.`, `_`, `:` or `-`. Commands and messages name the node by it."),
        json_schema_extra={"doc_default": "the host"})  # defaults to host when omitted
    host: Host = Field(description=(
        "The address or `~/.ssh/config` alias SSH connects to (no `user@`: write the user as "
        "`user`). A node may also be written as its host alone: `- 10.0.0.11`."))
    master: StrictBool = Field(False, description=(
        "`true`: this node is the master, rank 0 (at most one node). Without one, the first "
        "node is the master; the others follow in file order."))
    spare: StrictBool = Field(False, description=(
        "`true`: a hot spare. `launch` does not use it until a node of the run must be "
        "replaced (lost, failing its checks, or blamed for `exclude_after` failures); then it "
        "takes that node's rank. `push` and `check` include it, so it is ready. A spare "
        "cannot be the master."))

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


class Defaults(_NodeSettings):
    """The ``defaults:`` section."""


def _tree_mode(value: object) -> bool | str:
    """``ssh.tree``: true, false or "auto" (one message, not one per kind it could be)."""
    if value is True or value is False or value == "auto":
        return value
    raise _invalid("is not true, false or auto")


TreeMode = Annotated[bool | Literal["auto"], PlainValidator(_tree_mode)]


class SSHSettings(BaseModel):
    """How clusterctl reaches the nodes (the ``ssh:`` section)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    known_hosts: UserPath | None = Field(None, description=(
        "The known_hosts file host keys are checked strictly against. A relative path is "
        "taken from the inventory's directory; `~` expands."),
        json_schema_extra={"doc_default": "`~/.ssh/known_hosts`"})
    # explicit opt-in; a CHANGED key is always an error
    accept_new_host_keys: StrictBool = Field(False, description=(
        "`true`: trust and record the key of a host not yet in `known_hosts` (first contact), "
        "as `--accept-new-host-keys` does. A key that changed is always an error naming the "
        "node."))
    connect_timeout: Annotated[float, Field(strict=True, gt=0, le=3600, allow_inf_nan=False)] = Field(10.0, description=(
        "Seconds to wait for a node's SSH to answer (more than 0, at most 3600)."))
    fanout: Annotated[int, Field(strict=True, ge=1, le=4096)] = Field(32, description=(
        "At most this many nodes are contacted at once (1 to 4096)."))
    # launch's preflight and start reach the nodes through each other, over ONE connection
    # from here (clusterctl.cluster.transport.tree); tree_width children per node
    tree: TreeMode = Field("auto", description=(
        "`true`: `launch` and `check` send every node's preflight and start through one "
        "connection, to the first node, each node logging in to up to `tree_width` others. "
        "`auto` (the default): the same from 16 nodes on, where nothing after it needs a "
        "connection per node (`launch --detach` without a `workdir`, `check`); otherwise "
        "direct. `false`: a connection per node always. Following logs, `stop`, `status` "
        "and `push` use a connection per node."))
    tree_width: Annotated[int, Field(strict=True, ge=1)] = Field(32, description=(
        "With `tree`: how many other nodes each node logs in to."))
    node_identity_file: NodePath | None = Field(None, description=(
        "With `tree`: a path ON THE NODES (absolute or `~/...`, never read "
        "here) of the key they log in to each other with. Left out: this machine signs each "
        "node-to-node login through agent forwarding; no key is put on a node."))


class InventoryFile(BaseModel):
    """The keys of a YAML inventory, for its reference page (docs/reference/inventory.md).

    The YAML reader checks the top level itself (``yaml._YamlReader``) and each section
    with the models above; this model only names and describes the keys
    (``TOP_FIELDS`` equals its fields: tests/docs/test_reference.py).
    """

    model_config = ConfigDict(extra="forbid")

    master_port: Port = Field(DEFAULT_MASTER_PORT, description=(
        "The TCP port the master (rank 0) listens on for torch.distributed: `MASTER_PORT` in "
        "every container. Left at 29500: launch takes the first port from 29500 up that is "
        "free on the master and held by no other run of this machine; any other value pins "
        "it (a busy pinned port is refused, naming who holds it)."))
    ssh: SSHSettings = Field(default_factory=SSHSettings, description=(
        "How clusterctl reaches the nodes over SSH."))
    registry: str | None = Field(None, description=(
        "A registry the nodes pull from, `HOST[:PORT][/NAMESPACE]`: `push` and `launch` push "
        "the image there once and every node pulls it by digest (with this machine's `docker "
        "login` credentials for it, removed after the pull). Left out: images travel over SSH."))
    defaults: Defaults = Field(default_factory=Defaults, description=(
        "Settings every node takes unless it sets its own; a node's `labels` and `env` are "
        "added to these key by key. `name`, `host` and `master` belong to each node."))
    nodes: list[Node] = Field(min_length=1, description=(
        "The nodes, at least one, in rank order: the master (`master: true`, else the first "
        "node) is rank 0, then file order. Names and addresses must be unique."))


DEFAULT_FIELDS = tuple(_NodeSettings.model_fields)
NODE_FIELDS = ("name", "host", *DEFAULT_FIELDS, "master", "spare")
SSH_FIELDS = tuple(SSHSettings.model_fields)
TOP_FIELDS = ("master_port", "ssh", "registry", "defaults", "nodes")


@dataclass
class Inventory:
    """The validated cluster: nodes in rank order (the master first, then file order)."""

    path: Path
    nodes: list[Node]
    master_port: int = DEFAULT_MASTER_PORT
    ssh: SSHSettings = field(default_factory=SSHSettings)
    format: str = "yaml"  # "yaml" or "hostfile" (MPI / DeepSpeed)
    registry: Registry | None = None  # the registry the nodes pull from (None: push over SSH)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.nodes = rank_order(self.nodes, where=str(self.path))
        self._ranks: tuple[int, int, dict[str, int]] = (0, -1, {})

    @property
    def master(self) -> Node:
        return self.nodes[0]

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def active(self) -> list[Node]:
        """The nodes a run starts on: every node but the spares, in rank order."""
        return [n for n in self.nodes if not n.spare]

    @property
    def spares(self) -> list[Node]:
        """The hot spares (``spare: true``), in file order."""
        return [n for n in self.nodes if n.spare]

    def _rank_of(self) -> dict[str, int]:
        """name -> rank, rebuilt only when ``nodes`` was replaced or grew (lookups are O(1),
        so per-node loops over a 100,000-node inventory stay linear)."""
        key = (id(self.nodes), len(self.nodes))
        if self._ranks[:2] != key:
            self._ranks = (*key, {n.name: i for i, n in enumerate(self.nodes)})
        return self._ranks[2]

    def rank(self, node_name: str) -> int:
        """Node rank (0 for the master) of the node called ``node_name``."""
        self.node(node_name)  # UserError for an unknown name
        return self._rank_of()[node_name]

    def node(self, name: str) -> Node:
        i = self._rank_of().get(name)
        if i is not None:
            return self.nodes[i]
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
    seen: set[str] = set()
    twice = sorted({n.name for n in nodes if n.name in seen or seen.add(n.name)})  # one pass, not n x n
    if twice:
        raise UserError(f"{where}: node names used twice: {one_of(twice)}; valid: a unique name per node")
    masters = [n for n in nodes if n.master]
    if len(masters) > 1:
        raise UserError(f"{where}: {len(masters)} masters ({one_of([m.name for m in masters])}); "
                        "valid: at most one node with master: true")
    spare_masters = [n.name for n in masters if n.spare]
    if spare_masters:
        raise UserError(f"{where}: node {spare_masters[0]} is both master and spare; valid: a "
                        "master that is not a spare (the master is rank 0 from the start)")
    workers = [n for n in nodes if not n.spare]
    if not workers:
        raise UserError(f"{where}: every node is a spare; valid: at least one node without "
                        "spare: true")
    first = masters[0] if masters else workers[0]
    master = first if masters else first.model_copy(update={"master": True})
    rest = [n for n in workers if n is not first]
    return [master, *rest, *(n for n in nodes if n.spare)]    # spares last: ranks of the run first
