"""A local sandbox cluster: N emulated nodes on this Linux machine.

Each node is a network namespace with its own address on a bridge (the head,
this machine, holds ``.1``; nodes ``.11``, ``.12``, ...), its own sshd (key-only,
a client key and host keys generated for the sandbox) and its own Docker daemon
with its own image store.  ``clusterctl`` then treats the nodes exactly like a
real cluster reached over SSH: push, preflight and launch need no special case.

Recipe and traps: FIELD-NOTES.md §1 "Emulated nodes".  In short: daemons start
with ``nsenter --net=...`` (``ip netns exec`` remounts /sys and dockerd dies);
a root-namespace dockerd may set the FORWARD policy to DROP, so one ACCEPT rule
for the bridge is inserted; shaping uses ``tbf`` (netem is unavailable).

Every kernel object is named from the sandbox name, so several sandboxes with
distinct names and subnets coexist and ``down NAME`` touches only its own:

- bridge ``cc-<name>``; host-side veth of node i ``cc<name>-<i>h`` (the peer is
  created directly inside the netns as ``eth0``); netns ``cc-<name>-node<i>``;
- state (sockets, pidfiles, keys, configs) under ``/run/clusterctl/sandbox/<name>/``,
  image stores under ``/var/lib/clusterctl/sandbox/<name>/<node>/``;
- the containers of node i in cgroup ``/clusterctl/<name>/node<i>``.

``down`` derives everything from the name, not only from the state file, so it
also cleans up after a crash or a lost /run: daemons by pidfile, then whatever
is left in each netns, in the node's cgroup or names the node's directory.

Each node's dockerd gets its own daemon ID (dockerd 20.10 otherwise takes it
from the machine-wide /etc/docker/key.json) so nodes look like separate machines.

``--bandwidth`` shapes what flows towards a node (its host-side veth) and what
this machine sends (the bridge): the model of a head with an uplink of that
rate pushing to nodes with links of that rate.

Public API: ``up``, ``down``, ``status``, ``load``, ``names``; failure-test helpers
``stop_sshd``, ``start_sshd``, ``set_link``, ``node_docker``, ``port_open``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.cluster import dockerd
from clusterctl.core.errors import EnvironmentProblem, NodeError, UserError
from clusterctl.core.paths import state_dir

DEFAULT_NAME = "sbx"
DEFAULT_SUBNET = "10.213.0.0/24"
DEFAULT_INVENTORY = "inventories/sandbox.yaml"
NODE_OFFSET = 10  # node i gets network address + 10 + i
SSH_USER = "root"
INTERFACE = "eth0"
INVENTORY_MARKER = "# clusterctl-sandbox:"  # first line of an inventory we wrote; down removes only those
# Node daemons own no network set-up (the sandbox does it), and are disposable: a short
# shutdown timeout keeps `down` from waiting 15 s per daemon for containers to stop.
NODE_DOCKERD_ARGS = ["--bridge=none", "--iptables=false", "--ip-masq=false", "--shutdown-timeout=2"]

# A sandbox name goes into interface names, which the kernel limits to 15
# characters: "cc<name>-<i>h" with a 3-digit node number leaves 8 for the name.
# No dashes, so "cc-<name>-node<i>" parses back unambiguously.
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
_RATE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$", re.I)
MAX_NODES = 999

# binary -> Debian package that provides it
_TOOLS = {
    "dockerd": "docker.io",
    "sshd": "openssh-server",
    "ssh-keygen": "openssh-client",
    "ip": "iproute2",
    "tc": "iproute2",
    "iptables": "iptables",
    "nsenter": "util-linux",
}


# --------------------------------------------------------------------------- layout


def data_base() -> Path:
    """Where node image stores live (disk, not tmpfs). CLUSTERCTL_SANDBOX_DATA overrides."""
    return Path(os.environ.get("CLUSTERCTL_SANDBOX_DATA", "/var/lib/clusterctl/sandbox"))


def state_base() -> Path:
    return state_dir() / "sandbox"


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
    def nodes(self) -> list[SandboxNode]:
        return [node_for(self.name, self.network, i) for i in range(1, self.node_count + 1)]

    def node(self, name: str) -> SandboxNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise UserError(f'sandbox "{self.name}" has no node "{name}"; its nodes are '
                        f'{", ".join(n.name for n in self.nodes)}.')


def node_for(sandbox: str, network: ipaddress.IPv4Network, index: int) -> SandboxNode:
    return SandboxNode(sandbox, index, str(network.network_address + NODE_OFFSET + index))


def _state_file(name: str) -> Path:
    return state_base() / name / "sandbox.json"


def load(name: str = DEFAULT_NAME) -> Sandbox:
    """The recorded sandbox ``name``; UserError when there is none."""
    check_name(name)
    try:
        data = json.loads(_state_file(name).read_text())
        return Sandbox(**data)
    except FileNotFoundError:
        raise UserError(f'no sandbox named "{name}" exists; start one with '
                        f"`clusterctl sandbox up --nodes N --name {name}`.") from None
    except (ValueError, TypeError) as e:
        raise EnvironmentProblem(f"the state file {_state_file(name)} is unreadable ({e}); "
                                 f"remove the sandbox with `clusterctl sandbox down --name {name}`.") from None


def _save(sb: Sandbox) -> None:
    sb.dir.mkdir(parents=True, exist_ok=True)
    tmp = _state_file(sb.name).with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(sb), indent=2) + "\n")
    tmp.replace(_state_file(sb.name))


# --------------------------------------------------------------------------- validation


def check_name(name: str) -> None:
    if not _NAME_RE.match(name or ""):
        raise UserError(
            f'invalid sandbox name "{name}": use 1 to 8 characters, a lowercase letter first, then '
            "lowercase letters or digits (it becomes part of interface names, which Linux limits "
            'to 15 characters), e.g. "sbx" or "h4b".'
        )


def parse_subnet(subnet: str, nodes: int) -> ipaddress.IPv4Network:
    """The sandbox network; UserError unless it is a private IPv4 network with room for ``nodes``."""
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as e:
        raise UserError(
            f'invalid --subnet "{subnet}": {e}. Give a private IPv4 network in CIDR form with the '
            "host bits zero, e.g. 10.213.0.0/24."
        ) from None
    if not net.is_private or net.is_loopback or net.is_link_local or net.is_multicast:
        raise UserError(f'invalid --subnet "{subnet}": it is not a private range; use one inside '
                        "10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16, e.g. 10.213.0.0/24.")
    room = net.num_addresses - 2 - NODE_OFFSET  # nodes are .11 .. broadcast-1
    if room < nodes:
        raise UserError(
            f"--subnet {subnet} has room for {max(room, 0)} node(s) (the head is .1, nodes start at "
            f".{NODE_OFFSET + 1}) but --nodes is {nodes}; use a larger network such as "
            f"{net.network_address}/24."
        )
    return net


def check_nodes(n: int) -> None:
    if not isinstance(n, int) or n < 1 or n > MAX_NODES:
        raise UserError(f"invalid --nodes {n}: give a whole number from 1 to {MAX_NODES}.")


def check_slots(slots: int) -> None:
    if not isinstance(slots, int) or slots < 1:
        raise UserError(f"invalid --slots {slots}: give a whole number of processes per node, 1 or more.")


def check_bandwidth(rate: str | None) -> None:
    if rate is not None and not _RATE_RE.match(rate):
        raise UserError(
            f'invalid --bandwidth "{rate}": give a tc rate such as 200mbit, 1gbit or 500kbit '
            "(units bit, kbit, mbit, gbit, or bps, kbps, mbps for bytes per second)."
        )


def require_environment(what: str) -> None:
    """Root and every tool the sandbox runs; one message listing all that is missing."""
    dockerd.require_root(what)
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        packages = sorted({_TOOLS[t] for t in missing})
        dockerd.require_binaries(*missing, packages=" ".join(packages))


def _networks_in_use(own_bridge: str) -> list[tuple[ipaddress.IPv4Network, str]]:
    """IPv4 networks of addresses and routes on this machine, except on ``own_bridge``."""
    used = []
    for line in _run(["ip", "-o", "-4", "addr", "show"]).splitlines():
        parts = line.split()
        dev, cidr = parts[1], parts[3]
        if dev != own_bridge:
            used.append((ipaddress.IPv4Interface(cidr).network, f"address {cidr} on interface {dev}"))
    for line in _run(["ip", "-o", "-4", "route", "show"]).splitlines():
        parts = line.split()
        if parts[0] == "default" or "dev" not in parts:
            continue
        dev = parts[parts.index("dev") + 1]
        try:
            dst = ipaddress.IPv4Network(parts[0], strict=False)
        except ValueError:  # a route type word (unreachable, blackhole ...), not a network
            continue
        if dev != own_bridge:
            used.append((dst, f"route {parts[0]} via {dev}"))
    return used


def free_subnet(used: list[tuple[ipaddress.IPv4Network, str]],
                pool: str = "10.213.0.0/16") -> ipaddress.IPv4Network | None:
    """The first /24 of ``pool`` that overlaps nothing in ``used``."""
    for candidate in ipaddress.IPv4Network(pool).subnets(new_prefix=24):
        if not any(candidate.overlaps(net) for net, _ in used):
            return candidate
    return None


def _check_subnet_free(sb: Sandbox) -> None:
    """Refuse a subnet that overlaps an address or route on another interface (another
    sandbox's bridge, docker0, the machine's own LAN) and suggest one that is free."""
    used = _networks_in_use(sb.bridge)
    for net, what in used:
        if net.overlaps(sb.network):
            m = re.search(r"(?:on interface|via) cc-([a-z0-9]+)$", what)
            owner = f' (sandbox "{m.group(1)}")' if m else ""
            free = free_subnet(used)
            hint = f", e.g. `--subnet {free}`" if free else ""
            raise UserError(f"--subnet {sb.subnet} overlaps the {what}{owner}; pick a free "
                            f"private network{hint}.")


# --------------------------------------------------------------------------- commands


def _run(argv: list[str], *, check: bool = True, node: str | None = None) -> str:
    """Run a host tool (argv only); a failure becomes a message naming the command and node."""
    p = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        msg = f"`{shlex.join(argv)}` exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}"
        raise NodeError(node, msg) if node else EnvironmentProblem(msg)
    return p.stdout


def _netns_list() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]


def _link_exists(dev: str, netns: str | None = None) -> bool:
    argv = ["ip", *(["-n", netns] if netns else []), "link", "show", "dev", dev]
    return subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL).returncode == 0


def _links() -> list[str]:
    return [line.split(":")[1].strip().split("@")[0]
            for line in _run(["ip", "-o", "link", "show"]).splitlines()]


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Serialise up/down of one sandbox (two shells, or a test and a benchmark)."""
    lock_dir = state_base()
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# --------------------------------------------------------------------------- network


def _forward_rule(bridge: str) -> list[str]:
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def _iptables(op: str, rule: list[str], *, check: bool = True) -> bool:
    """``iptables -w OP rule``: -w waits for the xtables lock (other sandboxes, dockerd)."""
    if not check:
        return subprocess.run(["iptables", "-w", op, *rule], capture_output=True,
                              stdin=subprocess.DEVNULL).returncode == 0
    _run(["iptables", "-w", op, *rule])
    return True


def _ensure_bridge(sb: Sandbox) -> None:
    if not _link_exists(sb.bridge):
        _run(["ip", "link", "add", sb.bridge, "type", "bridge"])
    head = f"{sb.head_ip}/{sb.network.prefixlen}"
    _run(["ip", "addr", "replace", head, "dev", sb.bridge])
    _run(["ip", "link", "set", sb.bridge, "up"])
    rule = _forward_rule(sb.bridge)
    if not _iptables("-C", rule, check=False):
        _iptables("-I", rule)


def _ensure_node_network(sb: Sandbox, node: SandboxNode) -> None:
    """netns, veth pair (peer created inside as eth0), address, links up; keeps what exists."""
    if node.netns not in _netns_list():
        _run(["ip", "netns", "add", node.netns], node=node.name)
    if not (_link_exists(node.veth) and _link_exists(INTERFACE, node.netns)):
        # missing or half-made (a crash; a netns deleted under a live pair): make it afresh
        if _link_exists(node.veth):
            _run(["ip", "link", "del", node.veth], node=node.name)
        if _link_exists(INTERFACE, node.netns):
            _run(["ip", "-n", node.netns, "link", "del", INTERFACE], node=node.name)
        _run(["ip", "link", "add", node.veth, "type", "veth",
              "peer", "name", INTERFACE, "netns", node.netns], node=node.name)
    _run(["ip", "link", "set", node.veth, "master", sb.bridge, "up"], node=node.name)
    _run(["ip", "-n", node.netns, "addr", "replace", f"{node.ip}/{sb.network.prefixlen}",
          "dev", INTERFACE], node=node.name)
    _run(["ip", "-n", node.netns, "link", "set", INTERFACE, "up"], node=node.name)
    _run(["ip", "-n", node.netns, "link", "set", "lo", "up"], node=node.name)


def _shape(dev: str, rate: str | None, node: str | None = None) -> None:
    """tbf on ``dev`` (the rate the far end receives at), or no shaping when rate is None."""
    if rate:
        _run(["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
              "burst", "64kb", "latency", "50ms"], node=node)
    else:
        _run(["tc", "qdisc", "del", "dev", dev, "root"], check=False)


def set_link(name: str, node: str, up: bool) -> None:
    """Take a node's link down (cable pulled at the switch) or back up: for failure tests."""
    n = load(name).node(node)
    _run(["ip", "link", "set", n.veth, "up" if up else "down"], node=n.name)


# --------------------------------------------------------------------------- ssh


def _keygen(path: Path, comment: str) -> None:
    if path.exists() and path.with_suffix(".pub").exists():
        return
    path.unlink(missing_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    path.chmod(0o600)


def _ensure_keys(sb: Sandbox) -> None:
    sb.dir.mkdir(parents=True, exist_ok=True)
    for d in (state_base(), sb.dir):  # sshd StrictModes: no group/world write on the key's path
        d.chmod(0o755)
    _keygen(sb.key_path, f"clusterctl-sandbox-{sb.name}")
    sb.authorized_keys.write_text(sb.key_path.with_suffix(".pub").read_text())
    sb.authorized_keys.chmod(0o644)


def _sshd_config(sb: Sandbox, node: SandboxNode) -> str:
    return "\n".join([
        f"# sshd of sandbox node {sb.name}/{node.name}, written by clusterctl sandbox up.",
        "# Key-only: the sandbox's own client key; its own host key (in the sandbox known_hosts).",
        f"ListenAddress {node.ip}",
        "Port 22",
        f"HostKey {node.host_key}",
        f"PidFile {node.sshd_pidfile}",
        f"AuthorizedKeysFile {sb.authorized_keys}",
        "UsePAM no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password",
        "# push and launch open several sessions per node at once",
        "MaxSessions 64",
        "MaxStartups 64:30:128",
        "# `docker` run over SSH talks to this node's own daemon",
        f"SetEnv DOCKER_HOST={node.docker_host}",
        "Subsystem sftp internal-sftp",
        "",
    ])


def port_open(ip: str, port: int = 22, timeout: float = 1.0) -> bool:
    """True when something accepts TCP on ip:port (from the head, across the bridge)."""
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:
        return False


def sshd_running(node: SandboxNode) -> bool:
    return dockerd.read_pid(node.sshd_pidfile) is not None


def _start_sshd(sb: Sandbox, node: SandboxNode, timeout: float = 20.0) -> None:
    """Start the node's sshd in its netns; one already serving this config there is kept."""
    node.dir.mkdir(parents=True, exist_ok=True)
    _keygen(node.host_key, f"{sb.name}-{node.name}")
    config = _sshd_config(sb, node)
    same = node.sshd_config.exists() and node.sshd_config.read_text() == config
    node.sshd_config.write_text(config)
    pid = dockerd.read_pid(node.sshd_pidfile)
    if same and in_netns(pid, node.netns) and port_open(node.ip):
        return
    _stop_pid(node.sshd_pidfile)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    _run(["nsenter", f"--net=/run/netns/{node.netns}", sshd, "-f", str(node.sshd_config),
          "-E", str(node.dir / "sshd.log")], node=node.name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(node.ip):
            return
        time.sleep(0.1)
    raise NodeError(node.name, f"sshd did not accept connections on {node.ip}:22 within "
                               f"{timeout:.0f}s; see {node.dir / 'sshd.log'}")


def start_sshd(name: str, node: str) -> None:
    """(Re)start a node's sshd: the counterpart of stop_sshd in failure tests."""
    sb = load(name)
    _start_sshd(sb, sb.node(node))


def stop_sshd(name: str, node: str) -> bool:
    """Stop a node's sshd listener (open sessions stay, as with a real sshd)."""
    return _stop_pid(load(name).node(node).sshd_pidfile)


def _write_known_hosts(sb: Sandbox) -> None:
    lines = []
    for node in sb.nodes:
        keytype, key = node.host_key.with_suffix(".pub").read_text().split()[:2]
        lines.append(f"{node.ip} {keytype} {key}\n")
    sb.known_hosts_path.write_text("".join(lines))


# --------------------------------------------------------------------------- processes


def _stop_pid(pidfile: Path, timeout: float = 10.0) -> bool:
    pid = dockerd.read_pid(pidfile)
    if pid is not None:
        _terminate([pid], grace=timeout)
    pidfile.unlink(missing_ok=True)
    return pid is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is as good as gone
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _terminate(pids: list[int], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace`` seconds (0: SIGKILL at once)."""
    pids = [p for p in pids if p != os.getpid()]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if wait <= 0:
            continue
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        pids = [p for p in pids if _alive(p)]
        if not pids:
            return


def _netns_pids(netns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in out.split()]


def processes_using(path: Path) -> list[int]:
    """Processes whose command line names ``path``: dockerd, containerd, shims, sshd of a node."""
    needle = str(path).encode() + b"/"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


# --------------------------------------------------------------------------- up


def _dockerd_args(node: SandboxNode) -> list[str]:
    """A daemon.json of the node's own: never the machine's /etc/docker/daemon.json, and
    its own ID key.  dockerd 20.10 derives its ID from /etc/docker/key.json, shared by every
    daemon on the machine; separate machines have separate IDs, so each node gets its own
    key (``deprecated-key-path`` exists only as a config-file setting)."""
    config = node.dir / "daemon.json"
    node.dir.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({"deprecated-key-path": str(node.dir / "key.json")}, indent=2) + "\n")
    return [*NODE_DOCKERD_ARGS, "--config-file", str(config), "--cgroup-parent", node.cgroup]


def in_netns(pid: int | None, netns: str) -> bool:
    """True when process ``pid`` lives in network namespace ``netns``.

    A daemon outliving a deleted-and-recreated netns still answers on its unix
    socket, but its containers would land in the orphaned namespace."""
    if pid is None:
        return False
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{netns}").st_ino
    except OSError:
        return False


def _start_node(sb: Sandbox, node: SandboxNode) -> None:
    """sshd and dockerd of one node (each kept when already running in the node's netns)."""
    _start_sshd(sb, node)
    daemon_pid = dockerd.read_pid(node.daemon.pidfile)
    if daemon_pid is not None and not in_netns(daemon_pid, node.netns):
        dockerd.stop(node.daemon)
    try:
        dockerd.start(node.daemon, netns=node.netns, extra_args=_dockerd_args(node))
    except EnvironmentProblem as e:
        raise NodeError(node.name, e.message) from None
    except OSError as e:  # its state or data directory cannot be made
        raise NodeError(node.name, f"cannot start dockerd: {e}") from None


def up(n: int, *, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET,
       bandwidth: str | None = None, slots: int = 2,
       inventory_path: str | Path = DEFAULT_INVENTORY) -> Sandbox:
    """Create (or complete) sandbox ``name`` with ``n`` nodes and write its inventory.

    Idempotent: parts already running are kept; a larger ``n`` adds nodes and a
    smaller one removes the extra ones.  ``bandwidth`` describes the wanted
    state (None: unshaped).  A sandbox that did not exist before and fails to
    come up is removed again, so nothing is left half-made.
    """
    check_name(name)
    check_nodes(n)
    check_slots(slots)
    check_bandwidth(bandwidth)
    parse_subnet(subnet, n)
    require_environment("clusterctl sandbox up")
    inventory = Path(inventory_path).expanduser().absolute()
    _check_inventory_writable(inventory)
    with _locked(name):
        old = _existing(name)
        if old is not None and old.subnet != subnet:
            raise UserError(
                f'sandbox "{name}" already exists with subnet {old.subnet}, not {subnet}; remove it '
                f"first (`clusterctl sandbox down --name {name}`) or choose another --name."
            )
        _check_inventory_ours(inventory, name)
        sb = Sandbox(name=name, subnet=subnet, node_count=n, slots=slots, bandwidth=bandwidth,
                     inventory_path=str(inventory))
        if old is None:
            _teardown(name)  # debris of a crash or a lost /run: start from a clean slate
        _check_subnet_free(sb)
        try:
            _bring_up(sb, old)
        except BaseException:
            if old is None:
                _teardown(name)
            raise
        return sb


def _existing(name: str) -> Sandbox | None:
    """The recorded sandbox, or None when none exists (or only crash debris does)."""
    try:
        return load(name)
    except UserError:
        return None


def _bring_up(sb: Sandbox, old: Sandbox | None) -> None:
    _save(sb)  # first, so that a crash leaves a state that `down` reads
    if old is not None:
        _remove_nodes(old.nodes[sb.node_count:])
    _ensure_keys(sb)
    _ensure_bridge(sb)
    _shape(sb.bridge, sb.bandwidth)
    for node in sb.nodes:
        _ensure_node_network(sb, node)
        _shape(node.veth, sb.bandwidth, node=node.name)
    with ThreadPoolExecutor(max_workers=min(8, sb.node_count)) as pool:
        futures = [pool.submit(_start_node, sb, node) for node in sb.nodes]
        for f in futures:
            f.result()
    _write_known_hosts(sb)
    write_inventory(sb)
    if old is not None and old.inventory_path and old.inventory_path != sb.inventory_path:
        _remove_inventory(Path(old.inventory_path), sb.name)


# --------------------------------------------------------------------------- inventory


def _inventory_owner(path: Path) -> str | None:
    """The sandbox named in the marker line of an inventory we wrote, else None."""
    try:
        with open(path) as f:
            first = f.readline()
    except OSError:
        return None
    owner = first[len(INVENTORY_MARKER):].strip() if first.startswith(INVENTORY_MARKER) else ""
    return owner if _NAME_RE.match(owner) else None


def _check_inventory_writable(path: Path) -> None:
    """Find out before anything starts that the inventory can be written where asked."""
    if path.is_dir():
        raise UserError(f"--inventory {path} is a directory; give a file path such as "
                        f"{path / 'sandbox.yaml'}.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot write the inventory to {path}: {e.strerror}; pass another "
                        "--inventory PATH.") from None
    if not os.access(path.parent, os.W_OK):
        raise UserError(f"cannot write the inventory to {path}: {path.parent} is not writable; "
                        "pass another --inventory PATH.")


def _check_inventory_ours(path: Path, name: str) -> None:
    """Never overwrite a user's inventory or another live sandbox's."""
    if not path.exists():
        return
    owner = _inventory_owner(path)
    if owner is None:
        raise UserError(f"{path} exists and was not written by `clusterctl sandbox up`; pass "
                        "another --inventory PATH (it is not overwritten).")
    if owner != name and _state_file(owner).exists():
        raise UserError(f'{path} is the inventory of sandbox "{owner}", which is still up; pass '
                        "another --inventory PATH or remove that sandbox first.")


def inventory_text(sb: Sandbox) -> str:
    """The sandbox inventory in clusterctl.inventory's YAML format, with comments for a reader."""
    import yaml

    def dump(obj) -> str:
        return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)

    node_entries = [
        {"name": n.name, "host": n.ip, "port": 22, "user": SSH_USER,
         "identity_file": str(sb.key_path), "slots": sb.slots, "interface": INTERFACE}
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
        "\n",
        "# Shared by all nodes: root with the sandbox's generated ed25519 key; eth0 is\n",
        "# the interface that holds each node's address (GLOO/NCCL_SOCKET_IFNAME).\n",
        dump({"defaults": {"user": SSH_USER, "identity_file": str(sb.key_path),
                           "slots": sb.slots, "interface": INTERFACE}}),
        "\n",
        "# Rank order: node1 is the master.\n",
        dump({"nodes": node_entries}),
    ])


def write_inventory(sb: Sandbox) -> Path:
    path = Path(sb.inventory_path or DEFAULT_INVENTORY)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(inventory_text(sb))
    tmp.replace(path)
    return path


def _remove_inventory(path: Path, name: str) -> bool:
    if _inventory_owner(path) == name:
        path.unlink(missing_ok=True)
        return True
    return False


# --------------------------------------------------------------------------- down


def _remove_node(node: SandboxNode) -> None:
    """Stop a node's daemons, kill what is left in its netns, delete netns and veth."""
    dockerd.stop(node.daemon)
    _stop_pid(node.sshd_pidfile)
    if node.netns in _netns_list():
        _terminate(_netns_pids(node.netns))
        _run(["ip", "netns", "del", node.netns], check=False)
    if _link_exists(node.veth):
        _run(["ip", "link", "del", node.veth], check=False)
    _terminate(processes_using(node.dir))
    _remove_cgroups(node.cgroup)
    _remove_tree(node.dir)
    _remove_tree(node.daemon.data_root)


CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_dirs(relative: str) -> list[Path]:
    """``relative`` in every cgroup hierarchy (v1: one per controller; v2: the root)."""
    rel = relative.strip("/")
    bases = [CGROUP_ROOT, *(d for d in CGROUP_ROOT.iterdir() if d.is_dir())] if CGROUP_ROOT.is_dir() else []
    return [b / rel for b in bases if (b / rel / "cgroup.procs").exists()]


def _remove_cgroups(relative: str) -> None:
    """Kill every process left in the cgroup tree (containers whose daemon died) and remove it."""
    for top in _cgroup_dirs(relative):
        groups = sorted((p.parent for p in top.rglob("cgroup.procs")), key=lambda p: len(p.parts),
                        reverse=True)
        pids = set()
        for g in groups:
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(x) for x in (g / "cgroup.procs").read_text().split()}
        _terminate(sorted(pids), grace=0)  # their daemon is gone: nobody stops them gently
        for g in groups:  # deepest first: a cgroup is removed with rmdir once empty
            with contextlib.suppress(OSError):
                g.rmdir()


def _remove_nodes(nodes: list[SandboxNode]) -> None:
    """Remove nodes in parallel: each waits seconds for its daemon to stop."""
    if nodes:
        with ThreadPoolExecutor(max_workers=min(8, len(nodes))) as pool:
            list(pool.map(_remove_node, nodes))


def _unmount_under(path: Path) -> None:
    """Lazily unmount what a killed dockerd left mounted below ``path`` (deepest first)."""
    prefix = str(path) + "/"
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            target = line.split()[4].replace("\\040", " ")
            if target.startswith(prefix) or target == str(path):
                mounts.append(target)
    for target in sorted(set(mounts), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        _unmount_under(path)
        shutil.rmtree(path, ignore_errors=True)


def _debris_nodes(name: str) -> list[SandboxNode]:
    """Nodes of ``name`` found on the machine (netns, veths, state dirs), state file or not."""
    indexes: set[int] = set()
    ns_re = re.compile(rf"^cc-{name}-node([0-9]+)$")
    veth_re = re.compile(rf"^cc{name}-([0-9]+)h$")
    dir_re = re.compile(r"^node([0-9]+)$")
    indexes |= {int(m.group(1)) for ns in _netns_list() if (m := ns_re.match(ns))}
    indexes |= {int(m.group(1)) for dev in _links() if (m := veth_re.match(dev))}
    for base in (state_base() / name, data_base() / name):
        with contextlib.suppress(OSError):  # absent, or removed meanwhile by a concurrent down
            indexes |= {int(m.group(1)) for d in base.iterdir() if (m := dir_re.match(d.name))}
    net = ipaddress.IPv4Network("0.0.0.0/0")  # the address does not matter for removal
    return [node_for(name, net, i) for i in sorted(indexes)]


def down(name: str = DEFAULT_NAME) -> bool:
    """Remove every trace of sandbox ``name``; True when there was something to remove."""
    check_name(name)
    require_environment("clusterctl sandbox down")
    with _locked(name):
        return _teardown(name)


def _teardown(name: str) -> bool:
    sb = _existing(name)
    nodes = {n.index: n for n in _debris_nodes(name)}
    if sb is not None:
        nodes.update({n.index: n for n in sb.nodes})
    bridge = f"cc-{name}"
    found = bool(nodes) or sb is not None or _link_exists(bridge)
    _remove_nodes(list(nodes.values()))
    if _link_exists(bridge):
        _run(["ip", "link", "del", bridge], check=False)
    rule = _forward_rule(bridge)
    while _iptables("-C", rule, check=False):
        found = True
        _iptables("-D", rule)
    _terminate(processes_using(state_base() / name))
    _remove_cgroups(f"/clusterctl/{name}")
    for parent in _cgroup_dirs("/clusterctl"):  # empty unless another sandbox is up
        with contextlib.suppress(OSError):
            parent.rmdir()
    if sb is not None and sb.inventory_path:
        _remove_inventory(Path(sb.inventory_path), name)
    for path in (state_base() / name, data_base() / name):
        found = found or path.exists()
        _remove_tree(path)
    (state_base() / f".{name}.lock").unlink(missing_ok=True)
    return found


# --------------------------------------------------------------------------- status


@dataclass
class NodeStatus:
    name: str
    netns: str
    address: str
    netns_exists: bool
    sshd_up: bool
    dockerd_up: bool
    images: int | None  # None when the daemon does not answer


@dataclass
class SandboxStatus:
    name: str
    subnet: str | None  # None: only debris of a crashed sandbox is left
    bridge_exists: bool
    inventory_path: str | None
    nodes: list[NodeStatus] = field(default_factory=list)


def names() -> list[str]:
    """Sandboxes on this machine: recorded ones and debris (a netns or bridge named cc-...)."""
    found = set()
    with contextlib.suppress(OSError):
        found |= {d.name for d in state_base().iterdir() if (d / "sandbox.json").exists()}
    found |= {m.group(1) for ns in _netns_list() if (m := re.match(r"^cc-([a-z][a-z0-9]*)-node[0-9]+$", ns))}
    found |= {m.group(1) for dev in _links() if (m := re.match(r"^cc-([a-z][a-z0-9]*)$", dev))}
    return sorted(found)


def _image_count(node: SandboxNode) -> int | None:
    if not dockerd.socket_answers(node.daemon.socket):
        return None
    import docker

    try:
        client = docker.DockerClient(base_url=node.docker_host, timeout=10)
        try:
            return len(client.images.list(all=False))
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - status reports, it does not fail
        return None


def status(name: str | None = None) -> list[SandboxStatus]:
    """What exists of one sandbox (or of all): per node netns, address, sshd, dockerd, images."""
    if name is not None:
        check_name(name)
    netns = set(_netns_list())
    result = []
    for sb_name in [name] if name else names():
        sb = _existing(sb_name)
        nodes = sb.nodes if sb else _debris_nodes(sb_name)
        st = SandboxStatus(sb_name, sb.subnet if sb else None, _link_exists(f"cc-{sb_name}"),
                           sb.inventory_path if sb else None)
        for n in nodes:
            up_ns = n.netns in netns
            st.nodes.append(NodeStatus(
                n.name, n.netns, n.ip if sb else "?", up_ns,
                up_ns and sshd_running(n) and (port_open(n.ip) if sb else False),
                dockerd.socket_answers(n.daemon.socket), _image_count(n)))
        if sb or st.nodes or st.bridge_exists:
            result.append(st)
    return result


def node_docker(name: str, node: str, *args: str, check: bool = False) -> subprocess.CompletedProcess:
    """Run the docker CLI on this machine against a sandbox node's own daemon (for assertions)."""
    n = load(name).node(node)
    return subprocess.run(["docker", "-H", n.docker_host, *args], capture_output=True, text=True,
                          check=check, stdin=subprocess.DEVNULL)
