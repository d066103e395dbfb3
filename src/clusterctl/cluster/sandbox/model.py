"""What a sandbox is: its name rule, the names, addresses and paths derived from it, and its record.

Every kernel object and file of a sandbox is derived from its name, so nothing but
the state file is stored:

- bridge ``cc-<name>``; host-side veth of node i ``cc<name>-<i>h``; netns ``cc-<name>-node<i>``;
- state (sockets, pidfiles, keys, configs) under ``state_base()/<name>/``, the
  Slurm cluster's (``up --slurm``) under ``state_base()/<name>/slurm/``, the
  registry's (``up --registry``: CA, certificates, config, password) under
  ``state_base()/<name>/registry/``,
  image stores under ``data_base()/<name>/<node>/``, the registry's under
  ``data_base()/<name>/registry/``;
- the containers of node i in cgroup ``/clusterctl/<name>/node<i>``.

Contract: :class:`Sandbox`, :class:`SandboxNode`, :func:`node_for`, :func:`check_name`,
:func:`state_base`, :func:`data_base`, :func:`state_file`, :func:`load`, :func:`save`,
:func:`recorded`, :func:`registry_pidfile`.
No other module of the sandbox package is imported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from clusterctl.cluster import dockerd
from clusterctl.core.errors import EnvironmentProblem, UserError
from clusterctl.core.paths import state_dir

DEFAULT_NAME = "sbx"
DEFAULT_SUBNET = "10.213.0.0/24"
DEFAULT_INVENTORY = "inventories/sandbox.yaml"
NODE_OFFSET = 10  # node i gets network address + 10 + i
SSH_USER = "root"
INTERFACE = "eth0"
MAX_NODES = 999

# A sandbox name goes into interface names, which the kernel limits to 15
# characters: "cc<name>-<i>h" with a 3-digit node number leaves 8 for the name.
# No dashes, so "cc-<name>-node<i>" parses back unambiguously.
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}\Z")


def data_base() -> Path:
    """Where node image stores live (disk, not tmpfs). CLUSTERCTL_SANDBOX_DATA overrides."""
    return Path(os.environ.get("CLUSTERCTL_SANDBOX_DATA", "/var/lib/clusterctl/sandbox"))


def state_base() -> Path:
    return state_dir() / "sandbox"


def check_name(name: str) -> None:
    if not NAME_RE.match(name or ""):
        raise UserError(
            f'invalid sandbox name "{name}": use 1 to 8 characters, a lowercase letter first, then '
            "lowercase letters or digits (it becomes part of interface names, which Linux limits "
            'to 15 characters), e.g. "sbx" or "h4b".'
        )


@dataclass(frozen=True)
class SandboxNode:
    """One emulated node: its names, address and files (all derived, nothing stored)."""

    sandbox: str
    index: int
    ip: str

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def netns(self) -> str:
        return f"cc-{self.sandbox}-node{self.index}"

    @property
    def veth(self) -> str:
        return f"cc{self.sandbox}-{self.index}h"

    @property
    def dir(self) -> Path:
        return state_base() / self.sandbox / self.name

    @property
    def daemon(self) -> dockerd.DaemonPaths:
        return dockerd.DaemonPaths(root=self.dir, data_root=data_base() / self.sandbox / self.name)

    @property
    def docker_host(self) -> str:
        return self.daemon.url

    @property
    def cgroup(self) -> str:
        """Parent cgroup of the node's containers: down finds them even after dockerd died."""
        return f"/clusterctl/{self.sandbox}/{self.name}"

    @property
    def sshd_config(self) -> Path:
        return self.dir / "sshd_config"

    # Podman (``up --runtime podman``): daemonless, so each node's own storage and state
    # are its configuration files, which its sshd names (CONTAINERS_CONF, ..._STORAGE_CONF)

    @property
    def podman_conf(self) -> Path:
        """containers.conf of the node's Podman (its runtime, tmp dir, limits, logs)."""
        return self.dir / "containers.conf"

    @property
    def podman_storage_conf(self) -> Path:
        """storage.conf of the node's Podman: its own graph root and run root."""
        return self.dir / "storage.conf"

    @property
    def podman_root(self) -> Path:
        """The node's Podman images and containers (disk, beside its dockerd's data root)."""
        return data_base() / self.sandbox / f"{self.name}-podman"

    @property
    def podman_env(self) -> dict[str, str]:
        """The environment that makes ``podman`` this node's (its sshd sets it)."""
        return {"CONTAINERS_CONF": str(self.podman_conf),
                "CONTAINERS_STORAGE_CONF": str(self.podman_storage_conf)}

    @property
    def user_dir(self) -> Path:
        """What a login user other than root owns on the node (``up --user``): its $HOME,
        its XDG_RUNTIME_DIR and its rootless Podman's tmp dir and run root."""
        return self.dir / "user"

    def user_env(self, user: str) -> dict[str, str]:
        """The environment the node's sshd gives ``user``: this node's dockerd, a home of the
        node's own and, for a user other than root, its own runtime dir (rootless Podman
        keeps its pause process and locks there: one per node, not one per machine)."""
        if user == SSH_USER:
            return {"DOCKER_HOST": self.docker_host, "HOME": str(self.home)}
        return {"DOCKER_HOST": self.docker_host, "HOME": str(self.user_dir / "home"),
                "XDG_RUNTIME_DIR": str(self.user_dir / "run")}

    @property
    def home(self) -> Path:
        """The node user's $HOME over SSH: its own, empty, as on a fresh node (not this
        machine's, whose ~/.bashrc bash would run before every command: sshd-sourced)."""
        return self.dir / "home"

    @property
    def sshd_pidfile(self) -> Path:
        return self.dir / "sshd.pid"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"


@dataclass(frozen=True)
class Sandbox:
    """A sandbox as recorded in its state file; what ``up`` returns."""

    name: str
    subnet: str
    node_count: int
    slots: int = 2
    bandwidth: str | None = None
    inventory_path: str | None = None
    slurm: bool = False  # a Slurm cluster (munged, slurmctld, one slurmd per node) runs on it
    registry_port: int | None = None  # a registry (up --registry) listens on head_ip:registry_port
    registry_auth: bool = False       # ... and asks for a login (htpasswd, user "clusterctl")
    runtime: str = "docker"  # the nodes' runtime in the inventory (podman: each has its own too)
    user: str = SSH_USER     # the nodes' login user; another than root: its rootless Podman

    @property
    def rootless(self) -> bool:
        """The nodes' Podman is the login user's own, rootless (``up --user NAME``)."""
        return self.user != SSH_USER

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def head_ip(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def bridge(self) -> str:
        return f"cc-{self.name}"

    @property
    def dir(self) -> Path:
        return state_base() / self.name

    @property
    def data_dir(self) -> Path:
        return data_base() / self.name

    @property
    def key_path(self) -> Path:
        """The client key (ed25519) every node's sshd accepts."""
        return self.dir / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def authorized_keys(self) -> Path:
        return self.dir / "authorized_keys"

    @property
    def slurm_dir(self) -> Path:
        """Everything of the sandbox's Slurm: conf, munge key and socket, spool, logs."""
        return self.dir / "slurm"

    @property
    def slurm_conf(self) -> str | None:
        """The slurm.conf every Slurm client needs (``SLURM_CONF=...``); None without Slurm."""
        return str(self.slurm_dir / "slurm.conf") if self.slurm else None

    @property
    def registry(self) -> str | None:
        """The registry's address ``HOST:PORT`` (this machine's bridge address); None without one."""
        return f"{self.head_ip}:{self.registry_port}" if self.registry_port else None

    @property
    def registry_dir(self) -> Path:
        """The registry's CA, certificates, config, password, pidfile and log."""
        return self.dir / "registry"

    @property
    def registry_storage(self) -> Path:
        """Where the registry keeps the images pushed to it."""
        return self.data_dir / "registry"

    @property
    def registry_pidfile(self) -> Path:
        return registry_pidfile(self.name)

    @property
    def registry_ca(self) -> Path | None:
        """The CA certificate the registry's server certificate is signed by (every Docker
        engine of this machine and the nodes trusts it); None without a registry."""
        return self.registry_dir / "ca.crt" if self.registry_port else None

    @property
    def registry_password_file(self) -> Path | None:
        """The file (mode 0600) holding the password of user ``clusterctl``; None without
        a registry or without auth."""
        return self.registry_dir / "password" if self.registry_port and self.registry_auth else None

    def registry_pid(self) -> int | None:
        """The pid of the sandbox's registry process (by its pidfile and its command line)."""
        pid = dockerd.read_pid(self.registry_pidfile) if self.registry_port else None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if pid else b""
        except OSError:
            return None
        # a pid reused by another process does not name the registry's config
        return pid if str(self.registry_dir / "config.yml").encode() in cmdline else None

    def registry_up(self, timeout: float = 2.0) -> bool:
        """True when the registry process runs, itself listens on ``registry`` (not another
        process on that port) and accepts a TCP connection there."""
        pid = self.registry_pid()
        if pid is None or not _listens(pid, self.head_ip, self.registry_port):
            return False
        try:
            with socket.create_connection((self.head_ip, self.registry_port), timeout=timeout):
                return True
        except OSError:
            return False

    @property
    def nodes(self) -> list[SandboxNode]:
        return [node_for(self.name, self.network, i) for i in range(1, self.node_count + 1)]

    def node(self, name: str) -> SandboxNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise UserError(f'sandbox "{self.name}" has no node "{name}"; its nodes are '
                        f'{", ".join(n.name for n in self.nodes)}.')


def _listens(pid: int, ip: str, port: int) -> bool:
    """True when process ``pid`` holds a TCP socket listening on ``ip:port`` (IPv4)."""
    want = f"{int(ipaddress.IPv4Address(ip)).to_bytes(4, 'big')[::-1].hex().upper()}:{port:04X}"
    inodes = set()
    try:
        for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
            f = line.split()
            if len(f) > 9 and f[1] == want and f[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
        if not inodes:
            return False
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return True
    except OSError:
        return False
    return False


def registry_pidfile(name: str) -> Path:
    return state_base() / name / "registry" / "registry.pid"


def node_for(sandbox: str, network: ipaddress.IPv4Network, index: int) -> SandboxNode:
    return SandboxNode(sandbox, index, str(network.network_address + NODE_OFFSET + index))


# --------------------------------------------------------------------------- state file


def state_file(name: str) -> Path:
    return state_base() / name / "sandbox.json"


def load(name: str = DEFAULT_NAME) -> Sandbox:
    """The recorded sandbox ``name``; UserError when there is none."""
    check_name(name)
    try:
        data = json.loads(state_file(name).read_text())
        return Sandbox(**data)
    except FileNotFoundError:
        raise UserError(f'no sandbox named "{name}" exists; start one with '
                        f"`clusterctl sandbox up --nodes N --name {name}`.") from None
    except (ValueError, TypeError) as e:
        raise EnvironmentProblem(f"the state file {state_file(name)} is unreadable ({e}); "
                                 f"remove the sandbox with `clusterctl sandbox down --name {name}`.") from None


def save(sb: Sandbox) -> None:
    sb.dir.mkdir(parents=True, exist_ok=True)
    tmp = state_file(sb.name).with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(sb), indent=2) + "\n")
    tmp.replace(state_file(sb.name))


def recorded() -> list[Sandbox]:
    """Every sandbox with a readable state file, by name: files only, nothing is asked of
    the machine (what ``launch --scheduler slurm`` reads to find a sandbox's Slurm)."""
    found = []
    try:
        files = sorted(state_base().glob("*/sandbox.json"))
    except OSError:
        return []
    for path in files:
        try:
            found.append(Sandbox(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue     # unreadable, or being written: not a sandbox to use
    return found
