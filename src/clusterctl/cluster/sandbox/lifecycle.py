"""Life cycle of a sandbox: validate, bring up, take down and report, one sandbox at a time.

``up`` is idempotent: parts already running are kept, a larger node count adds
nodes and a smaller one removes the extra ones; a sandbox that did not exist
before and fails to come up is removed again.  ``down`` derives everything from
the name, not only from the state file, so it also cleans up after a crash or a
lost /run: daemons by pidfile, then whatever is left in each netns, in the node's
cgroup or names the node's directory, then mounts and loop devices (a small data
root, see ``storage``).  Up and down of one name are serialised by
a lock file.

Contract: :func:`up`, :func:`down`, :func:`status` (:class:`SandboxStatus`,
:class:`NodeStatus`), :func:`names`, and the input checks :func:`check_nodes`,
:func:`check_slots`, :func:`check_bandwidth`, :func:`parse_subnet`,
:func:`require_environment`.  Imports every other module of the sandbox package;
none of them imports this one.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import pwd
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.cluster import dockerd
from clusterctl.cluster.sandbox import network, processes, registry, slurm, sshd, storage
from clusterctl.cluster.sandbox.inventory_file import (
    check_inventory_ours,
    check_inventory_writable,
    remove_inventory,
    write_inventory,
)
from clusterctl.cluster.sandbox.model import (
    DEFAULT_INVENTORY,
    DEFAULT_NAME,
    DEFAULT_SUBNET,
    MAX_NODES,
    NODE_OFFSET,
    SSH_USER,
    Sandbox,
    SandboxNode,
    check_name,
    data_base,
    load,
    node_for,
    save,
    state_base,
)
from clusterctl.core.errors import EnvironmentProblem, UserError
from clusterctl.core.invoker import hand_over
from clusterctl.core.tools import require_binaries

_RATE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)\Z", re.I)

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


# --------------------------------------------------------------------------- validation


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


#: the runtimes a sandbox's nodes can have (and the Debian package each needs)
SANDBOX_RUNTIMES = {"docker": "docker.io", "podman": "podman"}


def check_runtime(runtime: str) -> None:
    """``--runtime``: docker or podman, and podman's tools on this machine."""
    if runtime not in SANDBOX_RUNTIMES:
        raise UserError(f"--runtime {runtime!r}: valid: {' or '.join(SANDBOX_RUNTIMES)}")
    if runtime == "podman":
        require_binaries("podman", "runc", "catatonit", packages="podman runc catatonit")


def check_user(user: str, runtime: str, with_slurm: bool) -> None:
    """``--user``: root, or an account of this machine whose rootless Podman the nodes run
    (its subordinate ids, newuidmap and fuse-overlayfs present)."""
    if user == SSH_USER:
        return
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise UserError(f"--user {user!r}: no such account on this machine; give root or an "
                        "existing user (useradd -m NAME), who then logs in to every node") from None
    if pw.pw_uid == 0:
        raise UserError(f"--user {user!r} has uid 0: leave --user out for root")
    if runtime != "podman":
        raise UserError(f"--user {user}: a login user other than root needs --runtime podman (the "
                        "nodes then run that user's rootless Podman); a node's dockerd is root's")
    if with_slurm:
        raise UserError(f"--user {user}: --slurm runs its tasks as root; leave one of them out")
    require_binaries("newuidmap", "newgidmap", "fuse-overlayfs", packages="uidmap fuse-overlayfs")
    if _locked_account(user):
        raise UserError(f"--user {user}: the account is locked (its /etc/shadow password starts "
                        f"with '!'), and sshd lets no locked account log in, with a key or not; "
                        f"unlock it without giving it a password: usermod -p '*' {user}")
    for ids in ("/etc/subuid", "/etc/subgid"):
        if not _has_subordinate_ids(Path(ids), pw):
            raise UserError(f"--user {user}: {ids} gives {user} no range of ids, which rootless "
                            f"Podman needs; add one: usermod --add-subuids 100000-165535 "
                            f"--add-subgids 100000-165535 {user}")


def _has_subordinate_ids(path: Path, pw: pwd.struct_passwd) -> bool:
    """``path`` (/etc/subuid or /etc/subgid) has a line for the account, by name or uid."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return False
    return any(line.split(":")[0] in (pw.pw_name, str(pw.pw_uid)) for line in lines if line.count(":") == 2)


def _locked_account(user: str, shadow: Path = Path("/etc/shadow")) -> bool:
    """The account's password field starts with '!' (``useradd`` without ``-p`` leaves it
    so), which sshd refuses without PAM; False when the file cannot be read."""
    try:
        lines = shadow.read_text().splitlines()
    except OSError:
        return False
    return any(f[0] == user and f[1].startswith("!") for f in (line.split(":") for line in lines)
               if len(f) > 1)


def ensure_mqueue() -> None:
    """Rootless Podman's ``--ipc=host`` bind-mounts /dev/mqueue, which every systemd machine
    has mounted; a container like this one may not (``statfs /dev/mqueue``): mount it."""
    mq = Path("/dev/mqueue")
    if mq.is_dir() and os.path.ismount(mq):
        return
    mq.mkdir(exist_ok=True)
    processes.run(["mount", "-t", "mqueue", "mqueue", str(mq)])


#: the mode udev's default rule gives /dev/fuse on every systemd distribution
#: (50-udev-default.rules: ``KERNEL=="fuse", MODE="0666"``)
FUSE_MODE = 0o666


def ensure_fuse(dev: Path = Path("/dev/fuse")) -> str | None:
    """Rootless Podman's fuse-overlayfs opens /dev/fuse as the user. A machine whose /dev
    was not made by udev (a container, a VM image) may have it 0600: give it the mode udev
    gives it.  Returns what was changed (for the caller to say), None when nothing was.
    EnvironmentProblem when there is no /dev/fuse (the kernel's fuse module)."""
    try:
        st = dev.stat()
    except FileNotFoundError:
        raise EnvironmentProblem(f"{dev} is missing: rootless Podman's fuse-overlayfs needs the kernel's "
                                 "fuse module (modprobe fuse; in a container, pass --device /dev/fuse)") from None
    if (st.st_mode & FUSE_MODE) == FUSE_MODE:
        return None
    os.chmod(dev, FUSE_MODE)
    return f"{dev} was mode {st.st_mode & 0o777:04o}; made {FUSE_MODE:04o}, as udev makes it"


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
        require_binaries(*missing, packages=" ".join(packages))


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Serialise up/down of one sandbox (two shells, or a test and a benchmark).

    The lock file goes with the sandbox: it is removed, still locked, when no sandbox
    ``name`` is left (after ``down``, or an ``up`` refused before it started anything).
    A process that waited on the removed file sees that the path is no longer the file
    it holds and locks the path again, so removing it never lets two in at once.
    """
    lock_dir = state_base()
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / f".{name}.lock"
    while True:
        f = open(path, "a")  # noqa: SIM115 - held across the yield, closed below
        fcntl.flock(f, fcntl.LOCK_EX)
        held = os.fstat(f.fileno())
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        f.close()  # removed (or replaced) while this process waited: lock the path anew
    try:
        yield
    finally:
        try:
            if not (state_base() / name).exists():
                path.unlink(missing_ok=True)
        finally:
            f.close()


# --------------------------------------------------------------------------- up


def up(n: int, *, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET,
       bandwidth: str | None = None, slots: int = 2,
       inventory_path: str | Path = DEFAULT_INVENTORY, with_slurm: bool = False,
       with_registry: bool = False, registry_auth: bool = False,
       registry_port: int = registry.DEFAULT_PORT, runtime: str = "docker",
       user: str = SSH_USER) -> Sandbox:
    """Create (or complete) sandbox ``name`` with ``n`` nodes and write its inventory.

    Idempotent: parts already running are kept; a larger ``n`` adds nodes and a
    smaller one removes the extra ones.  ``bandwidth`` describes the wanted
    state (None: unshaped).  ``with_slurm`` adds a Slurm cluster (munged, slurmctld,
    a slurmd per node; see :mod:`.slurm`), also to a sandbox that runs without one;
    a sandbox that has Slurm keeps it.  The returned sandbox's ``slurm_conf`` is the
    path for ``SLURM_CONF``.  ``with_registry`` runs an image registry on
    ``<head_ip>:<registry_port>`` over TLS from the sandbox's own CA, trusted by every
    node's engine and this machine's (see :mod:`.registry`); ``registry_auth`` (implies
    ``with_registry``) makes it ask for a login.  Without ``with_registry``, a sandbox
    that has a registry keeps it as it is.  The returned sandbox's ``registry``,
    ``registry_ca`` and ``registry_password_file`` say how to reach it.  A sandbox
    that did not exist before and fails to come up is removed again, so nothing is
    left half-made.  ``runtime`` ``podman``: each node has a Podman of its own too (its
    storage and state, :func:`.processes.write_podman_confs`) and the inventory says
    ``runtime: podman`` (each node keeps its dockerd: a node may be switched to
    ``runtime: docker`` in an inventory, for mixed runs).  ``user`` other than root (with
    ``runtime`` podman): that account of this machine logs in to every node, whose Podman is
    its own, rootless (:func:`check_user`).
    """
    check_name(name)
    check_nodes(n)
    check_slots(slots)
    check_bandwidth(bandwidth)
    check_runtime(runtime)
    check_user(user, runtime, with_slurm)
    parse_subnet(subnet, n)
    with_registry = with_registry or registry_auth
    if with_registry:
        registry.check_port(registry_port)
    require_environment("clusterctl sandbox up")
    if with_slurm:
        slurm.require_slurm()
    if with_registry:
        registry.require_registry()
    inventory = Path(inventory_path).expanduser().absolute()
    check_inventory_writable(inventory)
    with _locked(name):
        old = _existing(name)
        if old is not None and old.subnet != subnet:
            raise UserError(
                f'sandbox "{name}" already exists with subnet {old.subnet}, not {subnet}; remove it '
                f"first (`clusterctl sandbox down --name {name}`) or choose another --name."
            )
        if old is not None and old.user != user:
            raise UserError(
                f'sandbox "{name}" already exists with login user {old.user}, not {user}; remove it '
                f"first (`clusterctl sandbox down --name {name}`) or choose another --name."
            )
        check_inventory_ours(inventory, name)
        keep_slurm = old is not None and old.slurm
        if keep_slurm and not with_slurm:
            slurm.require_slurm()
        reg_port: int | None = None
        reg_auth = False
        if with_registry:
            reg_port, reg_auth = registry_port, registry_auth
        elif old is not None and old.registry_port:  # a registry is kept as it is
            reg_port, reg_auth = old.registry_port, old.registry_auth
            registry.require_registry()
        sb = Sandbox(name=name, subnet=subnet, node_count=n, slots=slots, bandwidth=bandwidth,
                     inventory_path=str(inventory), slurm=with_slurm or keep_slurm,
                     registry_port=reg_port, registry_auth=reg_auth, runtime=runtime, user=user)
        if old is None:
            _teardown(name)  # debris of a crash or a lost /run: start from a clean slate
        network.check_subnet_free(sb)
        if sb.registry_port:
            registry.check_port_free(sb)  # before anything starts: the port and what holds it
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
    save(sb)  # first, so that a crash leaves a state that `down` reads
    if old is not None:
        _remove_nodes(old.nodes[sb.node_count:])
    sshd.ensure_keys(sb)
    if sb.rootless:
        ensure_mqueue()
        ensure_fuse()   # the mode udev gives it (docs/how-to/podman.md)
    network.ensure_bridge(sb)
    network.shape(sb.bridge, sb.bandwidth)
    for node in sb.nodes:
        network.ensure_node_network(sb, node)
        network.shape(node.veth, sb.bandwidth, node=node.name)
    with ThreadPoolExecutor(max_workers=min(8, sb.node_count)) as pool:
        futures = [pool.submit(_start_node, sb, node) for node in sb.nodes]
        for f in futures:
            f.result()
    sshd.write_known_hosts(sb)
    if sb.slurm:
        slurm.start(sb)
    if sb.registry_port:
        registry.start(sb)
    write_inventory(sb)
    if old is not None and old.inventory_path and old.inventory_path != sb.inventory_path:
        remove_inventory(Path(old.inventory_path), sb.name)


def _start_node(sb: Sandbox, node: SandboxNode) -> None:
    """sshd and dockerd of one node (each kept when already running in the node's netns);
    under sudo the daemon's socket is the invoking user's (``sandbox status`` counts its
    images without sudo), its group kept."""
    if sb.runtime == "podman":
        processes.write_podman_confs(node, sb.user)
    sshd.ensure_sshd(sb, node)
    processes.start_dockerd(node)
    hand_over(node.daemon.socket, group=False)


# --------------------------------------------------------------------------- down


def _remove_node(node: SandboxNode) -> None:
    """Stop a node's daemons (its Podman's containers first), kill what is left in its
    netns, delete netns and veth."""
    processes.remove_podman_containers(node)
    dockerd.stop(node.daemon)
    processes.stop_pid(node.sshd_pidfile)
    network.remove_node_network(node)
    processes.terminate(processes.processes_using(node.dir))
    processes.remove_cgroups(node.cgroup)
    _remove_tree(node.dir)
    _remove_tree(node.daemon.data_root)  # unmounts a small data root (limit_data_root) first
    _remove_tree(node.podman_root)       # its overlay mounts first
    storage.detach_loops(storage.image_file(node))
    storage.image_file(node).unlink(missing_ok=True)


def _remove_nodes(nodes: list[SandboxNode]) -> None:
    """Remove nodes in parallel: each waits seconds for its daemon to stop."""
    if nodes:
        with ThreadPoolExecutor(max_workers=min(8, len(nodes))) as pool:
            list(pool.map(_remove_node, nodes))


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        storage.unmount_all(path)  # what a killed dockerd left mounted, a loop mount
        shutil.rmtree(path, ignore_errors=True)


def _debris_nodes(name: str) -> list[SandboxNode]:
    """Nodes of ``name`` found on the machine (netns, veths, state dirs), state file or not."""
    indexes: set[int] = set()
    ns_re = re.compile(rf"^cc-{name}-node([0-9]+)\Z")
    veth_re = re.compile(rf"^cc{name}-([0-9]+)h\Z")
    dir_re = re.compile(r"^node([0-9]+)\Z")
    indexes |= {int(m.group(1)) for ns in network.netns_list() if (m := ns_re.match(ns))}
    indexes |= {int(m.group(1)) for dev in network.links() if (m := veth_re.match(dev))}
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
    found = bool(nodes) or sb is not None or network.link_exists(bridge)
    found = slurm.stop(name) or found  # first: its jobs are cancelled while slurmctld answers
    found = registry.stop(name) or found  # the process and its CA under /etc/docker/certs.d
    _remove_nodes(list(nodes.values()))
    if network.remove_bridge(bridge):  # a forward rule was left
        found = True
    processes.terminate(processes.processes_using(state_base() / name))
    processes.remove_cgroups(f"/clusterctl/{name}")
    for parent in processes.cgroup_dirs("/clusterctl"):  # empty unless another sandbox is up
        with contextlib.suppress(OSError):
            parent.rmdir()
    if sb is not None and sb.inventory_path:
        remove_inventory(Path(sb.inventory_path), name)
    for path in (state_base() / name, data_base() / name):
        found = found or path.exists()
        _remove_tree(path)
    storage.detach_loops(data_base() / name)  # a loop device still held when it was unmounted
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
    slurm_state: str | None = None  # Slurm's state of the node (idle, alloc, down*...); None: no Slurm


@dataclass
class SandboxStatus:
    name: str
    subnet: str | None  # None: only debris of a crashed sandbox is left
    bridge_exists: bool
    inventory_path: str | None
    nodes: list[NodeStatus] = field(default_factory=list)
    slurm_conf: str | None = None  # the sandbox has Slurm: its slurm.conf
    slurm_running: bool = False    # munged and slurmctld run
    registry: str | None = None    # the sandbox has a registry: its HOST:PORT
    registry_running: bool = False  # its process runs and accepts connections
    registry_auth: bool = False    # it asks for a login (user clusterctl)
    registry_ca: str | None = None  # the CA certificate it is trusted by
    registry_password_file: str | None = None  # with auth: the password's file (0600)


def names() -> list[str]:
    """Sandboxes on this machine: recorded ones and debris (a netns or bridge named cc-...)."""
    found = set()
    with contextlib.suppress(OSError):
        found |= {d.name for d in state_base().iterdir() if (d / "sandbox.json").exists()}
    found |= {m.group(1) for ns in network.netns_list()
              if (m := re.match(r"^cc-([a-z][a-z0-9]*)-node[0-9]+\Z", ns))}
    found |= {m.group(1) for dev in network.links() if (m := re.match(r"^cc-([a-z][a-z0-9]*)\Z", dev))}
    return sorted(found)


def _image_count(node: SandboxNode) -> int | None:
    if not dockerd.socket_answers(node.daemon.socket):
        return None
    import docker  # heavy (requests, urllib3): only when a node's daemon answers

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
    netns = set(network.netns_list())
    result = []
    for sb_name in [name] if name else names():
        sb = _existing(sb_name)
        nodes = sb.nodes if sb else _debris_nodes(sb_name)
        st = SandboxStatus(sb_name, sb.subnet if sb else None, network.link_exists(f"cc-{sb_name}"),
                           sb.inventory_path if sb else None)
        states: dict[str, str] = {}
        if sb is not None and sb.slurm:
            st.slurm_conf, st.slurm_running = sb.slurm_conf, slurm.running(sb_name)
            states = slurm.node_states(sb_name) if st.slurm_running else {}
        if sb is not None and sb.registry_port:
            st.registry, st.registry_running = sb.registry, registry.running(sb)
            st.registry_auth, st.registry_ca = sb.registry_auth, str(sb.registry_ca)
            pw = sb.registry_password_file
            st.registry_password_file = str(pw) if pw else None
        for n in nodes:
            up_ns = n.netns in netns
            st.nodes.append(NodeStatus(
                n.name, n.netns, n.ip if sb else "?", up_ns,
                up_ns and sshd.sshd_running(n) and (sshd.port_open(n.ip) if sb else False),
                dockerd.socket_answers(n.daemon.socket), _image_count(n),
                (states.get(n.name, "not registered") if st.slurm_running else "down")
                if st.slurm_conf else None))
        if sb or st.nodes or st.bridge_exists:
            result.append(st)
    return result
