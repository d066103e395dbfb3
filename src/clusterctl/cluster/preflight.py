"""Per-node preflight: can clusterctl use this node, and how?

Every check is a plain argv command run over the node's SSH connection
(:mod:`clusterctl.transport`), so it sees exactly what push and launch will
see: the same user, the same environment (``DOCKER_HOST`` included), the same
network namespace. Each check is also a small public function (launch calls
:func:`find_interface` and :func:`port_free` directly).

:func:`check_node` runs those same argv commands, but two SSH channels per node
instead of one per command (a channel costs this machine ~2 ms of CPU; issue 12's
scale goal): :data:`_NODE_SCRIPT` (uname, the facts, devices, interface, the master's
listening ports) and :data:`_DOCKER_SCRIPT` (docker version, docker info, df at its
root, the image's ID, the init binary), both constant ``sh -c`` texts whose values
(devices, image ref) arrive as positional parameters, never in the text.  Each prints
every command's output, stderr and exit status in sections marked with a random
token (:func:`parse_sections`); the single checks then read the recorded results
(:class:`_Replay`) exactly as they would read their own commands', so every message
is the same.  The node script also runs the accelerator probe
(:mod:`clusterctl.cluster.accelprobe`: what nvidia-smi, the NVIDIA Container Toolkit, DCGM
and cnmon say, judged here), which prints nothing on a node without those tools.  Nothing
is written on the node.

:func:`check_node` never stops at the first problem: a node whose Docker daemon
is down still reports its architecture, interface and devices, so one run of
``clusterctl check`` shows everything to fix. :func:`run_preflight` does all
nodes in parallel (bounded by the cluster's fan-out) and turns a node that
cannot be reached at all into a result with the reason, never an exception.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import shlex
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clusterctl.cluster import accelprobe, consistency, engine
from clusterctl.cluster.runtime import (
    DEFAULT_RUNTIME,
    RUNTIMES,
    ContainerRuntime,
    node_runtime,
    runtime_for,
    runtime_of,
)
from clusterctl.cluster.transport import (
    Cluster,
    CommandResult,
    NodeConnection,
    describe_error,
    tree,
)
from clusterctl.core import accelerators
from clusterctl.core.errors import NodeError, UserError
from clusterctl.core.text import digits

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Node

#: uname -m -> Docker's architecture names (image platforms, `docker version` Arch).
DOCKER_ARCH = {
    "x86_64": "amd64", "amd64": "amd64",
    "aarch64": "arm64", "arm64": "arm64",
    "armv7l": "arm", "armv6l": "arm",
    "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64", "i686": "386", "i386": "386",
}

#: Prints each argument that does not exist on the node, one per line. The script is
#: a constant; device paths arrive as positional parameters and are never parsed by sh.
_MISSING_SCRIPT = 'for d in "$@"; do [ -e "$d" ] || printf "%s\\n" "$d"; done'

#: ``docker info``'s root dir, then on a line of its own the init binary ``docker run
#: --init`` starts as the container's PID 1 (InitBinary, "docker-init" by default).
DOCKER_INFO_FORMAT = "{{println .DockerRootDir}}{{.InitBinary}}"


def _info_fields(stdout: str) -> tuple[str, str]:
    """(DockerRootDir, InitBinary) from ``docker info --format DOCKER_INFO_FORMAT``'s output
    ("" for a field it did not print)."""
    lines = stdout.strip().splitlines()
    return (lines[0].strip() if lines else "", lines[1].strip() if len(lines) > 1 else "")

_TCP_LISTEN = "0A"  # socket state LISTEN in /proc/net/tcp{,6}

#: One round trip for the facts that must match across nodes: kernel, clock, and the
#: accelerator driver where there is one (nvidia-smi; Cambricon's cnmon: each device's
#: ``driver`` in the accelerator table, core/data/accelerators.yaml).  A constant.
_FACTS_SCRIPT = 'uname -r; date +%s.%N; ' + accelerators.load().driver_probe()

#: Run inside an image (python3 -c): torch's version and its collective backends', read
#: from files (torch/version.py, installed distributions' metadata, libnccl's file name)
#: without importing torch, which takes seconds to minutes on a loaded node.
_VERSIONS_SCRIPT = r"""
import glob, importlib.metadata as md, importlib.util, json, os, re
v = {}
spec = importlib.util.find_spec("torch")
if spec is not None and spec.origin:
    with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", f.read(), re.M)
    v["torch"] = m.group(1) if m else "?"
for dist in ("oneccl_bind_pt", "torch_accl", "torch_mlu", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
    try:
        v[dist] = md.version(dist)
    except Exception:
        pass
libs = sorted(p for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                          "/usr/local/lib", "/usr/local/nccl/lib")
              for p in glob.glob(d + "/libnccl.so.2.*"))
if libs:
    v["libnccl"] = libs[-1].rsplit("libnccl.so.", 1)[1]
print("CLUSTERCTL-VERSIONS " + json.dumps(v))
"""

#: Exit 0 when the node has the init binary named in $1 (``docker info`` InitBinary):
#: an absolute path that is executable, else a command on the PATH or in /usr/libexec/docker
#: (where dockerd also looks).  Read with the SSH user's PATH, the daemon's may differ.
_INIT_SCRIPT = ('case $1 in "") exit 1;; /*) test -x "$1";; '
                '*) command -v "$1" >/dev/null 2>&1 || test -x "/usr/libexec/docker/$1";; esac')

#: ``sec NAME ARGV...``: run ARGV, print its output between markers holding the token
#: ($t, random per call) and its exit status; its stderr goes to stderr after a marker
#: too.  Leaves the output in $o and the status in $r for the next decision.
_SECTION = ("sec() { s=$1; shift; printf '\\n%s begin %s\\n' \"$t\" \"$s\" >&2; o=$(\"$@\"); r=$?; "
            "printf '\\n%s begin %s\\n%s\\n%s end %s %s\\n' \"$t\" \"$s\" \"$o\" \"$t\" \"$s\" \"$r\"; }\n")

#: One channel for the node's own checks: $1 token, $2 "link" (verify the inventory's
#: interface) or "addr" (find the one holding the SSH address), $3 "1" to read the
#: listening ports (the master), then the device paths.  A constant: every value is a
#: positional parameter, the sub-scripts are constants quoted with shlex.
_NODE_SCRIPT = (
    't=$1 mode=$2 ports=$3; shift 3\n' + _SECTION +
    f'sec facts sh -c {shlex.quote(_FACTS_SCRIPT)}\n'
    f'sec accel sh -c {shlex.quote(accelprobe.SCRIPT)} sh "$t"\n'
    'sec arch uname -m\n'
    f'[ $# -eq 0 ] || sec devices sh -c {shlex.quote(_MISSING_SCRIPT)} sh "$@"\n'
    'if [ "$mode" = link ]; then sec link ip -o link show\n'
    'else sec conn printenv SSH_CONNECTION; sec addr ip -o addr show; fi\n'
    'if [ "$ports" = 1 ]; then sec tcp cat /proc/net/tcp /proc/net/tcp6; [ -n "$o" ] || sec ss ss -Hltn; fi\n'
    'exit 0\n')

def _engine_script(runtime: ContainerRuntime) -> str:
    """One channel for the node's container runtime: $1 token, $2 the image ref to look up
    ("" for none).  Version, then (when the runtime answered) info, df at its root and the
    init binary; the image.  Each command the runtime's own (``docker``, ``podman``), the
    values positional parameters.  Pure."""
    q = shlex.join
    return (
        't=$1 ref=$2\n' + _SECTION +
        f"sec version {q(runtime.version())}\n"
        'if [ "$r" = 0 ] && [ -n "$o" ]; then\n'
        f'  sec info {q(runtime.info(DOCKER_INFO_FORMAT))}\n'
        '  if [ "$r" = 0 ]; then\n'
        "    nl='\n'\n"
        '    root=${o%%"$nl"*}\n'
        '    case $o in *"$nl"*) init=${o#*"$nl"};; *) init=;; esac\n'
        '    case $root in /*) sec df df -Pk -- "$root";; esac\n'
        f'    sec init sh -c {shlex.quote(_INIT_SCRIPT)} sh "$init"\n'
        '  fi\n'
        'fi\n'
        f"[ -z \"$ref\" ] || sec image {q(runtime.image_inspect([], format='{{.Id}}'))} \"$ref\"\n"
        'exit 0\n')


#: The engine channel of a Docker node (:func:`_engine_script`)
_DOCKER_SCRIPT = _engine_script(runtime_for("docker"))


@dataclass
class NodeCheck:
    """What preflight found on one node; ``problems`` empty means ready."""

    node: str
    host: str
    ssh: bool = False
    docker_version: str | None = None   # the runtime's version ("podman 4.3.1" on a Podman node)
    arch: str | None = None
    expected_arch: str | None = None  # Docker's name (amd64, arm64), e.g. the image's
    docker_root: str | None = None
    free_bytes: int | None = None
    required_bytes: int | None = None
    devices: list[str] = field(default_factory=list)          # checked
    missing_devices: list[str] = field(default_factory=list)
    devices_checked: bool = False
    address: str | None = None      # the node's own address on the SSH connection
    interface: str | None = None    # the NIC holding it (or the inventory's, verified)
    master_port: int | None = None  # checked on the master only
    master_port_free: bool | None = None
    # on the master: the TCP ports something listens on (launch chooses a free master port
    # from them), and when the master port is busy, who holds it ("python3 (pid 812)")
    listening_ports: list[int] | None = None
    master_port_holder: str | None = None
    # how the master port is judged: None busy is a problem (check); "choose" busy is no
    # problem, the caller picks another from listening_ports (launch, port not pinned);
    # "pinned" busy is a problem naming the process that holds it
    master_port_mode: str | None = None
    kernel: str | None = None           # uname -r
    clock_offset: float | None = None   # seconds the node's clock is ahead of this machine's
    clock_uncertainty: float | None = None  # half the round trip that measured it
    driver: str | None = None           # "nvidia 550.54.15", "cambricon ...", None: no accelerator tool
    image_id: str | None = None         # the node's ID of the image checked (None: absent / not asked)
    image_versions: dict | None = None  # torch and backend versions in it (asked when IDs differ)
    init_binary: str | None = None      # docker info InitBinary (what `docker run --init` starts)
    init: bool | None = None            # the node has it (None: not known, the daemon did not answer)
    # what the node's GPU/MLU tools say (cluster/accelprobe.py): kind, count and facts (driver,
    # CUDA, CDI names, busy GPUs); None on a node without them
    accelerator: dict | None = None
    toolkit_version: str | None = None  # the image's CUDA, compared with the node's driver
    wants_device: str | None = None     # the device kind the job computes on (cuda, mlu)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # worth knowing; the node is still ready

    @property
    def ok(self) -> bool:
        return not self.problems


# --------------------------------------------------------------------------- single checks

def _run(conn: NodeConnection, argv: Sequence[str], what: str, timeout: float | None):
    """Run a check command; NodeError with a readable reason when it is missing or fails."""
    r = conn.run(list(argv), timeout=timeout)
    if r.exit_code == 127:
        raise NodeError(conn.name, f"{what}: `{argv[0]}` is not installed on the node")
    if r.exit_code != 0:
        detail = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise NodeError(conn.name, f"{what}: `{argv[0]}` exited {r.exit_code}"
                        + (f": {detail[-1]}" if detail else ""))
    return r


#: Prints the container runtimes the node has a command for, one a line
_RUNTIMES_SCRIPT = 'for r in "$@"; do command -v "$r" > /dev/null 2>&1 && echo "$r"; done; exit 0'


def docker_server_version(conn: NodeConnection, timeout: float | None = 30) -> str:
    """The version of the container runtime the node's inventory names (docker, the
    default: its daemon's, which the node's own `docker` CLI talks to); a Podman node's as
    ``podman VERSION``, so that check's table says which runtime each node has.  When it
    does not answer, the message names the runtimes the node does have (a node that names
    none and runs Podman, one that names podman and has only docker)."""
    runtime = runtime_of(conn)
    r = conn.run(runtime.version(), timeout=timeout)
    version = r.stdout.strip()
    if r.exit_code == 0 and version:
        return version if runtime.name == DEFAULT_RUNTIME else f"{runtime.name} {version}"
    named = getattr(conn.node, "runtime", None)
    said = f"runtime: {named}" if named else f"no runtime: ({DEFAULT_RUNTIME}, the default)"
    others = [o for o in _runtimes_found(conn, timeout) if o != runtime.name]
    hint = (f"; the node has {' and '.join(others)}: set `runtime: {others[0]}` for it in the "
            "inventory" if others else "")
    if r.exit_code == 127:
        raise NodeError(conn.name, f"{runtime.binary} is not installed (no `{runtime.binary}` "
                        f"command for the SSH user; the inventory says {said}){hint}")
    reason = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.exit_code}"
    if "permission denied" in reason.lower() and runtime.name == "docker":
        reason += " (add the SSH user to the docker group)"
    what = "Docker daemon" if runtime.name == "docker" else runtime.name
    raise NodeError(conn.name, f"{what} not answering: {reason}{hint}")


def _runtimes_found(conn: NodeConnection, timeout: float | None) -> list[str]:
    """The container runtimes clusterctl knows that the node has a command for."""
    try:
        r = conn.run(["sh", "-c", _RUNTIMES_SCRIPT, "sh", *sorted(RUNTIMES)], timeout=timeout)
    except NodeError:
        return []
    return [w for w in r.stdout.split() if w in RUNTIMES] if r.exit_code == 0 else []


def architecture(conn: NodeConnection, timeout: float | None = 30) -> str:
    """``uname -m`` of the node (x86_64, aarch64, ...)."""
    return _run(conn, ["uname", "-m"], "architecture", timeout).stdout.strip()


def docker_root_dir(conn: NodeConnection, timeout: float | None = 30) -> str:
    """Where the node's Docker daemon keeps images (``docker info`` DockerRootDir)."""
    r = _run(conn, runtime_of(conn).info(DOCKER_INFO_FORMAT), "docker root", timeout)
    root = _info_fields(r.stdout)[0]
    if not root.startswith("/"):
        raise NodeError(conn.name, f"docker root: unexpected DockerRootDir {root!r}")
    return root


def free_disk_bytes(conn: NodeConnection, path: str, timeout: float | None = 30) -> int:
    """Bytes available to unprivileged writers at ``path`` (POSIX ``df -Pk``, any Linux)."""
    r = _run(conn, ["df", "-Pk", "--", path], f"free disk at {path}", timeout)
    lines = r.stdout.strip().splitlines()
    try:
        return int(lines[-1].split()[3]) * 1024
    except (IndexError, ValueError):
        raise NodeError(conn.name, f"free disk at {path}: cannot read df output "
                        f"{r.stdout.strip()!r}") from None


def init_binary(conn: NodeConnection, timeout: float | None = 30) -> tuple[str, bool]:
    """(``docker info`` InitBinary, whether the node has it): what ``docker run --init``
    starts as the container's PID 1, to pass signals on to the command (tini)."""
    r = conn.run(runtime_of(conn).info(DOCKER_INFO_FORMAT), timeout=timeout)
    name = _info_fields(r.stdout)[1] if r.exit_code == 0 else ""
    found = conn.run(["sh", "-c", _INIT_SCRIPT, "sh", name], timeout=timeout)
    return name, bool(name) and found.exit_code == 0


def missing_devices(conn: NodeConnection, devices: Iterable[str],
                    timeout: float | None = 30) -> list[str]:
    """The paths among ``devices`` that do not exist on the node (one round trip)."""
    devices = list(devices)
    if not devices:
        return []
    r = _run(conn, ["sh", "-c", _MISSING_SCRIPT, "sh", *devices], "devices", timeout)
    return [line for line in r.stdout.splitlines() if line]


def ssh_server_address(conn: NodeConnection, timeout: float | None = 30) -> str:
    """The node's own address on this SSH connection.

    Read from ``SSH_CONNECTION`` on the node (right also through a jump host or
    NAT), else the address the client connected to.
    """
    r = conn.run(["printenv", "SSH_CONNECTION"], timeout=timeout)
    parts = r.stdout.split()
    address = parts[2] if r.exit_code == 0 and len(parts) == 4 else conn.peer_address
    if not address:
        raise NodeError(conn.name, "interface: cannot tell the node's address on the SSH "
                        "connection (no SSH_CONNECTION)")
    return address.split("%", 1)[0]


@dataclass(frozen=True)
class Address:
    interface: str
    address: ipaddress.IPv4Interface | ipaddress.IPv6Interface


def parse_ip_addr(text: str) -> list[Address]:
    """Parse ``ip -o addr show``: '4: eth0    inet 10.0.0.2/24 brd ... scope global eth0'."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("inet", "inet6"):
            continue
        name = fields[1].split("@", 1)[0]
        try:
            found.append(Address(name, ipaddress.ip_interface(fields[3].split("%", 1)[0])))
        except ValueError:
            continue
    return found


def node_addresses(conn: NodeConnection, timeout: float | None = 30) -> list[Address]:
    return parse_ip_addr(_run(conn, ["ip", "-o", "addr", "show"], "interface", timeout).stdout)


def interface_for(address: str, addresses: Sequence[Address]) -> str | None:
    """The interface that holds ``address``; else the one whose subnet contains it
    (an address routed locally, e.g. 127.0.0.2 on lo); None when none does."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    for a in addresses:
        if a.address.ip == ip:
            return a.interface
    containing = [a for a in addresses if a.address.version == ip.version and ip in a.address.network]
    if containing:
        return max(containing, key=lambda a: a.address.network.prefixlen).interface
    return None


def interface_names(conn: NodeConnection, timeout: float | None = 30) -> list[str]:
    """All network interface names on the node (``ip -o link show``)."""
    r = _run(conn, ["ip", "-o", "link", "show"], "interface", timeout)
    names = []
    for line in r.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            names.append(fields[1].rstrip(":").split("@", 1)[0])
    return names


def find_interface(conn: NodeConnection, override: str | None = None,
                   timeout: float | None = 30) -> str:
    """The NIC for GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on this node.

    ``override`` (the inventory's ``interface``, default: the node's own) is
    verified to exist; otherwise the interface holding the node's address on
    the SSH connection is found. NodeError when neither works.
    """
    return locate_interface(conn, override, timeout)[1]


def locate_interface(conn: NodeConnection, override: str | None = None,
                     timeout: float | None = 30) -> tuple[str | None, str]:
    """(the node's address on the SSH connection or None when overridden, interface)."""
    if override is None:
        override = getattr(conn.node, "interface", None)
    if override:
        names = interface_names(conn, timeout)
        if override not in names:
            raise NodeError(conn.name, f"interface {override!r} (from the inventory) does not "
                            f"exist on the node; it has {_listing(names)}")
        return None, override
    address = ssh_server_address(conn, timeout)
    name = interface_for(address, node_addresses(conn, timeout))
    if name is None:
        raise NodeError(conn.name, f"interface: no interface holds {address}, the node's address "
                        "on the SSH connection (set `interface:` for this node in the inventory)")
    return address, name


def _listing(names: Sequence[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit]) or "none"
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def parse_proc_net_tcp(text: str) -> set[int]:
    """Listening TCP ports from /proc/net/tcp and /proc/net/tcp6 text."""
    ports = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3] == _TCP_LISTEN and ":" in fields[1]:
            try:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
            except ValueError:
                continue
    return ports


def parse_ss(text: str) -> set[int]:
    """Listening TCP ports from ``ss -Hltn`` (State Recv-Q Send-Q Local:Port Peer:Port)."""
    ports = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and ":" in fields[3]:
            port = fields[3].rsplit(":", 1)[1]
            if digits(port):
                ports.add(int(port))
    return ports


def listening_ports(conn: NodeConnection, timeout: float | None = 30) -> set[int]:
    """TCP ports something listens on in the node's network namespace (what --net=host uses)."""
    r = conn.run(["cat", "/proc/net/tcp", "/proc/net/tcp6"], timeout=timeout)
    if r.stdout.strip():  # tcp6 is absent when IPv6 is off: cat exits 1 but tcp was read
        return parse_proc_net_tcp(r.stdout)
    return parse_ss(_run(conn, ["ss", "-Hltn"], "listening ports", timeout).stdout)


def port_free(conn: NodeConnection, port: int, timeout: float | None = 30) -> bool:
    """True when no TCP socket listens on ``port`` on the node (any address)."""
    return port not in listening_ports(conn, timeout)


_SS_USER = re.compile(r'\("([^"]+)",pid=(\d+)')


def parse_ss_holders(text: str, port: int) -> list[str]:
    """``python3 (pid 812)`` for each process listening on ``port`` in ``ss -Hltnp`` text
    (``users:(("python3",pid=812,fd=3))``); none when ss may not name them (another user's)."""
    found: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[3].rsplit(":", 1)[-1] == str(port):
            for name, pid in _SS_USER.findall(line):
                words = f"{name} (pid {pid})"
                if words not in found:
                    found.append(words)
    return found


def port_holder(conn: NodeConnection, port: int, timeout: float | None = 30) -> str | None:
    """Who listens on ``port`` on the node, in words (``python3 (pid 812)``), from ``ss
    -Hltnp``; None when that cannot tell (no ss, or the process is another user's).  One
    more round trip: asked only when a pinned master port is busy."""
    try:
        r = conn.run(["ss", "-Hltnp"], timeout=timeout)
    except NodeError:
        return None
    holders = parse_ss_holders(r.stdout, port) if r.exit_code == 0 else []
    return ", ".join(holders) or None


# --------------------------------------------------------------------------- one node, all checks

def check_node(conn: NodeConnection, *, devices: Iterable[str] = (),
               required_bytes: int | None = None, master_port: int | None = None,
               expected_arch: str | None = None, image_ref: str | None = None,
               timeout: float | None = 30, master_port_mode: str | None = None,
               token: str | None = None, toolkit_version: str | None = None,
               wants_device: str | None = None) -> NodeCheck:
    """Run every check on one connected node, collecting problems instead of stopping.

    ``devices`` are checked in addition to the node's own ``devices``;
    ``master_port`` is checked free when given (pass it for the master only;
    ``master_port_mode``: see :attr:`NodeCheck.master_port_mode`);
    ``expected_arch`` (amd64, arm64, or a uname name) must match the node's;
    ``image_ref``: record the node's ID of that image (compared across nodes later).
    Kernel, clock offset and accelerator driver are always recorded (:func:`node_facts`).
    Two channels of the node's one connection, at once: :data:`_NODE_SCRIPT` and
    :data:`_DOCKER_SCRIPT` (a channel costs this machine ~2 ms of CPU, a round trip
    ~0.3 s on a loaded machine); the checks then read their commands' recorded results
    (:class:`_Replay`), so problems come in a fixed order with the single checks' words.
    ``token`` marks the scripts' sections (random when not given): :func:`run_preflight`
    gives every node the same one, so its patterns are compiled once, not per node.
    ``toolkit_version`` (the image's CUDA) and ``wants_device`` (the kind the job computes
    on): what the accelerator probe judges (:func:`accelerator_findings`).
    """
    result = _new_check(conn.node, devices, required_bytes, master_port, expected_arch,
                        master_port_mode, toolkit_version, wants_device)
    replay = _Replay.record(conn, devices=result.devices, ports=master_port is not None,
                            image_ref=image_ref, timeout=timeout, token=token or uuid.uuid4().hex)
    return _judge(replay, result, image_ref, timeout)


def _new_check(node: Node, devices: Iterable[str], required_bytes: int | None, master_port: int | None,
               expected_arch: str | None, master_port_mode: str | None = None,
               toolkit_version: str | None = None, wants_device: str | None = None) -> NodeCheck:
    result = NodeCheck(node=node.name, host=node.host, ssh=True, required_bytes=required_bytes,
                       master_port=master_port, expected_arch=expected_arch,
                       toolkit_version=toolkit_version, wants_device=wants_device,
                       master_port_mode=master_port_mode if master_port is not None else None)
    result.devices = list(dict.fromkeys([*getattr(node, "devices", []), *devices]))
    return result


def _judge(replay: _Replay, result: NodeCheck, image_ref: str | None, timeout: float | None) -> NodeCheck:
    """Every check, on what the node's two scripts recorded, problems in a fixed order."""
    master_port = result.master_port
    parts = [_check_arch, _check_docker, _check_devices, _check_interface, _check_facts, _check_accel]
    if master_port is not None:
        parts.append(_check_master_port)
    if image_ref is not None:
        parts.append(lambda c, r, t: _check_image_id(c, r, image_ref, t))
    for part in parts:
        result.problems.extend(part(replay, result, timeout))
    return result


def parse_sections(token: str, stdout: str, stderr: str) -> dict[str, tuple[int, str, str]]:
    """The sections a script printed with ``sec`` -> {name: (exit status, stdout, stderr)}."""
    begin, section = _section_patterns(token)
    errs = begin.split(stderr)
    err_of = dict(zip(errs[1::2], errs[2::2], strict=True))
    return {m.group(1): (int(m.group(3)), m.group(2), err_of.get(m.group(1), ""))
            for m in section.finditer(stdout)}


@functools.lru_cache(maxsize=8)
def _section_patterns(token: str) -> tuple[re.Pattern, re.Pattern]:
    """The token's two patterns, compiled once per token (a compile is ~0.2 ms: per node and
    script it was most of what the tree's preflight still spent per node here)."""
    t = re.escape(token)
    return (re.compile(rf"\n{t} begin (\w+)\n"),
            re.compile(rf"\n{t} begin (\w+)\n(.*?)\n{t} end \1 (-?\d+)\n", re.S))


class _Replay:
    """A node connection whose ``run`` answers from what the two preflight scripts
    recorded for the same argv; any other argv runs on the node as usual.  When a
    script itself failed (its channel timed out), its commands raise that NodeError."""

    def __init__(self, conn: NodeConnection) -> None:
        self._conn = conn
        self._results: dict[tuple[str, ...], CommandResult] = {}
        self._errors: list[NodeError] = []
        self.window: tuple[float, float] | None = None   # the node script's (start, end) times
        self.token: str | None = None                      # the node script's section token

    def __getattr__(self, name):
        return getattr(self._conn, name)

    @staticmethod
    def scripts(node: Node, *, devices: Sequence[str], ports: bool, image_ref: str | None
                ) -> list[tuple[str, list[str], dict[str, list[str]]]]:
        """The node's two scripts: (script, its arguments after the token, the argv each of
        its sections stands for)."""
        mode = "link" if getattr(node, "interface", None) else "addr"
        node_argv = {"facts": ["sh", "-c", _FACTS_SCRIPT], "arch": ["uname", "-m"],
                     "devices": ["sh", "-c", _MISSING_SCRIPT, "sh", *devices],
                     "link": ["ip", "-o", "link", "show"], "conn": ["printenv", "SSH_CONNECTION"],
                     "addr": ["ip", "-o", "addr", "show"],
                     "tcp": ["cat", "/proc/net/tcp", "/proc/net/tcp6"], "ss": ["ss", "-Hltn"]}
        runtime = node_runtime(node)
        docker_argv = {"version": runtime.version(), "info": runtime.info(DOCKER_INFO_FORMAT),
                       "image": runtime.image_inspect([image_ref or ""], format="{{.Id}}")}
        return [(_NODE_SCRIPT, [mode, "1" if ports else "0", *devices], node_argv),
                (_engine_script(runtime), [image_ref or ""], docker_argv)]

    def absorb(self, script: str, token: str, argv_of: dict, r: CommandResult | NodeError,
               slow: float | None, window: tuple[float, float]) -> None:
        """Keep what one script found (or why it failed) for the checks to read."""
        if isinstance(r, NodeError):   # a timeout, named by what the script checks
            what = "preflight's node checks" if script is _NODE_SCRIPT else "preflight's docker checks"
            why = (f"timed out after {slow:g}s" if "timed out" in r.reason and slow is not None
                   else r.reason)   # not the script's text, which says nothing to a user
            self._errors.append(NodeError(self._conn.name, f"{what} ({', '.join(argv_of)}): {why}"))
            return
        if script is _NODE_SCRIPT:
            self.window = window
        sections = parse_sections(token, r.stdout, r.stderr)
        if script is _NODE_SCRIPT:   # the accelerator probe marks its parts with the same token
            self.token = token
            argv_of = {**argv_of, "accel": accel_argv(token)}
        info = sections.get("info")
        if info is not None:   # df and the init check take their argument from info's output
            root, init = _info_fields(info[1])
            argv_of = {**argv_of, "df": ["df", "-Pk", "--", root],
                       "init": ["sh", "-c", _INIT_SCRIPT, "sh", init]}
        for name, (code, out, err) in sections.items():
            if name in argv_of:
                argv = argv_of[name]
                self._results[tuple(argv)] = CommandResult(self._conn.name, list(argv), code, out, err)

    @classmethod
    def record(cls, conn: NodeConnection, *, devices: Sequence[str], ports: bool,
               image_ref: str | None, timeout: float | None, token: str) -> _Replay:
        self = cls(conn)
        slow = None if timeout is None else 2 * timeout   # several commands in a row

        def run(script: str, args: list[str], argv_of: dict) -> None:
            before = time.time()
            try:
                r: CommandResult | NodeError = conn.run(["sh", "-c", script, "sh", token, *args], timeout=slow)
            except NodeError as e:
                r = e
            self.absorb(script, token, argv_of, r, slow, (before, time.time()))

        (node_script, node_args, node_argv), docker = cls.scripts(
            conn.node, devices=devices, ports=ports, image_ref=image_ref)
        other = threading.Thread(target=run, name=f"preflight-{conn.name}", daemon=True, args=docker)
        other.start()
        run(node_script, node_args, node_argv)
        other.join()
        return self

    def run(self, argv: Sequence[str], *, timeout: float | None = None, check: bool = False,
            **kw) -> CommandResult:
        found = self._results.get(tuple(argv))
        if found is None and self._errors:
            raise self._errors[0]
        if found is None:
            return self._conn.run(argv, timeout=timeout, check=check, **kw)
        return found.check() if check else found


def _attempt(problems: list[str], fn):
    """fn(), or None with NodeError's reason added to problems."""
    try:
        return fn()
    except NodeError as e:
        problems.append(e.reason)
        return None


def _check_arch(conn: NodeConnection, result: NodeCheck, timeout) -> list[str]:
    problems: list[str] = []
    result.arch = _attempt(problems, lambda: architecture(conn, timeout))
    want = result.expected_arch
    if result.arch and want and docker_arch(result.arch) != docker_arch(want):
        problems.append(f"architecture {result.arch} ({docker_arch(result.arch)}) cannot run "
                        f"{docker_arch(want)} images")
    return problems


def docker_arch(name: str) -> str:
    """Docker's name for an architecture given as ``uname -m`` or Docker prints it."""
    return DOCKER_ARCH.get(name.lower(), name.lower())


def _check_docker(conn: NodeConnection, result: NodeCheck, timeout) -> list[str]:
    """Daemon version, then where it keeps images, then the free space there."""
    problems: list[str] = []
    result.docker_version = _attempt(problems, lambda: docker_server_version(conn, timeout))
    if result.docker_version is not None:
        result.docker_root = _attempt(problems, lambda: docker_root_dir(conn, timeout))
    if result.docker_root is not None:
        result.free_bytes = _attempt(problems, lambda: free_disk_bytes(conn, result.docker_root,
                                                                       timeout))
        result.init_binary, result.init = init_binary(conn, timeout)
        if not result.init:
            result.warnings.append(f"no init binary ({result.init_binary or 'docker info names none'}"
                                   " not found on the node): containers start without `docker run "
                                   "--init`, so a rank that ignores SIGTERM (python as PID 1) makes "
                                   "every stop wait out its whole grace")
    need = result.required_bytes
    if result.free_bytes is not None and need and result.free_bytes < need:
        problems.append(f"only {human_bytes(result.free_bytes)} free at {result.docker_root}, "
                        f"need {human_bytes(need)}")
    return problems


def _check_devices(conn: NodeConnection, result: NodeCheck, timeout) -> list[str]:
    problems: list[str] = []
    missing = _attempt(problems, lambda: missing_devices(conn, result.devices, timeout))
    result.devices_checked = missing is not None
    if missing:
        result.missing_devices = missing
        problems.append(f"missing device{'s' if len(missing) > 1 else ''}: " + ", ".join(missing))
    return problems


def _check_interface(conn: NodeConnection, result: NodeCheck, timeout) -> list[str]:
    problems: list[str] = []
    located = _attempt(problems, lambda: locate_interface(conn, timeout=timeout))
    if located is not None:
        result.address, result.interface = located
    return problems


def parse_facts(text: str) -> tuple[str | None, float | None, str | None]:
    """_FACTS_SCRIPT's output -> (kernel, the node's clock as a UNIX time, driver)."""
    lines = text.splitlines() + ["", "", ""]
    kernel = lines[0].strip() or None
    try:
        clock = float(lines[1].strip())
    except ValueError:
        clock = None
    driver = lines[2].strip() or None
    return kernel, clock, driver


def node_facts(conn: NodeConnection, timeout: float | None = 30) -> dict:
    """Kernel, clock offset (node minus this machine, and its uncertainty: half the round
    trip) and accelerator driver of the node, in one round trip."""
    before = time.time()
    r = _run(conn, ["sh", "-c", _FACTS_SCRIPT], "node facts", timeout)
    after = time.time()
    before, after = getattr(conn, "window", None) or (before, after)  # a _Replay's: its script's
    kernel, clock, driver = parse_facts(r.stdout)
    offset = None if clock is None else clock - (before + after) / 2
    return {"kernel": kernel, "clock_offset": offset,
            "clock_uncertainty": (after - before) / 2, "driver": driver}


def accel_argv(token: str) -> list[str]:
    """The accelerator probe's argv (its parts marked with ``token``)."""
    return ["sh", "-c", accelprobe.SCRIPT, "sh", token]


def accelerator_findings(conn: NodeConnection, *, toolkit_version: str | None = None,
                         wants: str | None = None, timeout: float | None = 30,
                         token: str | None = None) -> accelprobe.Findings:
    """What the node's GPU/MLU tools say, judged here (:mod:`clusterctl.cluster.accelprobe`):
    one command on the node; none of its findings for a node without those tools."""
    token = token or getattr(conn, "token", None) or uuid.uuid4().hex
    r = _run(conn, accel_argv(token), "accelerators", timeout)
    return accelprobe.judge(accelprobe.parse_parts(token, r.stdout), runtime=runtime_of(conn).name,
                            toolkit_version=toolkit_version, wants=wants)


def _check_accel(conn: NodeConnection, result: NodeCheck, timeout) -> list[str]:
    problems: list[str] = []
    found = _attempt(problems, lambda: accelerator_findings(
        conn, toolkit_version=result.toolkit_version, wants=result.wants_device, timeout=timeout))
    if found is None:
        return problems
    if found.kind is not None:
        result.accelerator = {"kind": found.kind, "count": found.count, **found.facts}
    result.warnings.extend(found.warnings)
    return problems + found.problems


def _check_facts(conn: NodeConnection, result: NodeCheck, timeout) -> list[str]:
    problems: list[str] = []
    facts = _attempt(problems, lambda: node_facts(conn, timeout))
    for key, value in (facts or {}).items():
        setattr(result, key, value)
    return problems


def node_image_id(conn: NodeConnection, ref: str, timeout: float | None = 30) -> str | None:
    """The node's ID of image ``ref``, None when the node does not have it."""
    r = conn.run(runtime_of(conn).image_inspect([ref], format="{{.Id}}"), timeout=timeout)
    return r.stdout.strip() or None if r.exit_code == 0 else None


def _check_image_id(conn: NodeConnection, result: NodeCheck, ref: str, timeout) -> list[str]:
    result.image_id = node_image_id(conn, ref, timeout)
    return []


def image_versions(conn: NodeConnection, ref: str, timeout: float | None = 120) -> dict:
    """torch and backend versions inside image ``ref`` on the node (``docker run --rm``)."""
    r = _run(conn, runtime_of(conn).run(ref, ["python3", "-c", _VERSIONS_SCRIPT], remove=True, network="none"),
             f"versions in {ref}", timeout)
    for line in r.stdout.splitlines():
        if line.startswith("CLUSTERCTL-VERSIONS "):
            return json.loads(line.split(" ", 1)[1])
    raise NodeError(conn.name, f"versions in {ref}: no answer from python3 in the image")


def backend_versions(versions: dict) -> str:
    """The collective backends' versions as one comparable text ('gloo (in torch)' alone)."""
    rest = {k: v for k, v in versions.items() if k != "torch"}
    return ", ".join(f"{k} {v}" for k, v in sorted(rest.items())) or "gloo (in torch)"


def apply_consistency(checks: Sequence[NodeCheck], cluster: Cluster | None = None,
                      image_ref: str | None = None, max_skew: float = consistency.MAX_SKEW,
                      compare_image: bool = True) -> None:
    """Compare what must match across the nodes and add each odd node's problem or warning
    to its NodeCheck (:mod:`clusterctl.cluster.consistency`).  When the image IDs differ and
    a ``cluster`` is given, the torch and backend versions inside each node's copy are
    read too, to say what differs.  ``compare_image=False``: the IDs were only recorded
    (a push follows, which makes them all the local one)."""
    reached = [c for c in checks if c.ssh]
    ids = {c.image_id for c in reached if c.image_id} if compare_image else set()
    if cluster is not None and image_ref and len(ids) > 1:
        having = [c.node for c in reached if c.image_id]
        found = cluster.map(lambda conn: image_versions(conn, image_ref), nodes=having)
        for c in reached:
            v = found.get(c.node)
            if isinstance(v, dict):
                c.image_versions = v
            elif v is not None:
                c.warnings.append(v.reason)
    facts = {}
    for c in reached:
        facts[c.node] = {"docker_version": c.docker_version, "kernel": c.kernel,
                         "driver": c.driver, "image_id": c.image_id if compare_image else None}
        if c.image_versions:
            facts[c.node]["torch"] = c.image_versions.get("torch")
            facts[c.node]["backend_version"] = backend_versions(c.image_versions)
    by_node = {c.node: c for c in checks}
    found = consistency.compare(facts, [c.node for c in reached])
    for c in reached:
        skew = consistency.clock_finding(c.node, c.clock_offset, c.clock_uncertainty, max_skew)
        if skew:
            found.append(skew)
    for f in found:
        target = by_node[f.node].problems if f.severity == consistency.PROBLEM \
            else by_node[f.node].warnings
        target.append(f.message)


def _check_master_port(conn: NodeConnection, result: NodeCheck, timeout) -> list[str]:
    problems: list[str] = []
    port = result.master_port
    listening = _attempt(problems, lambda: listening_ports(conn, timeout))
    if listening is None:
        return problems
    result.listening_ports = sorted(listening)
    result.master_port_free = port not in listening
    if result.master_port_free or result.master_port_mode == "choose":
        return problems     # "choose": the caller takes a free port from listening_ports
    if result.master_port_mode == "pinned":
        result.master_port_holder = port_holder(conn, port, timeout)
        problems.append(f"master port {port} is already in use on the master"
                        + (f" by {result.master_port_holder}" if result.master_port_holder else "")
                        + " (another job? leave the port unpinned and launch picks a free one, "
                          "or pin another)")
    else:
        problems.append(f"master port {port} is already in use on the master "
                        "(another job? set master_port in the inventory)")
    return problems


def run_preflight(cluster: Cluster, *, devices: Iterable[str] | None = None,
                  devices_for=None, required_bytes: int | None = None,
                  check_master_port: bool = True, expected_arch: str | None = None,
                  image_ref: str | None = None, nodes=None,
                  timeout: float | None = 30, compare_image: bool = True,
                  master_port_mode: str | None = None, toolkit_version: str | None = None,
                  wants_device: str | None = None) -> list[NodeCheck]:
    """Check every node (or ``nodes``) in parallel; one NodeCheck per node in rank order.

    ``devices`` are required on every node; ``devices_for(node)`` (optional)
    adds per-node ones (e.g. a target's per-slot devices). A node that cannot
    be reached gets ``ssh=False`` and the reason as its problem.  Then the nodes are
    compared (:func:`apply_consistency`): image ID (with ``image_ref``), Docker, kernel,
    driver, clock; an odd node gets a problem or a warning naming what differs.
    ``compare_image=False``: each node's ID of ``image_ref`` is recorded (``image_id``),
    not compared (launch pushes next, and skips the nodes whose ID is the local one).
    ``master_port_mode`` (:attr:`NodeCheck.master_port_mode`): "choose" (a busy master port
    is no problem: the master's ``listening_ports`` are recorded for the caller to choose
    from), "pinned" (a busy one is a problem naming who holds it), None (a problem).
    ``toolkit_version`` / ``wants_device``: see :func:`check_node`.
    """
    if master_port_mode not in (None, "choose", "pinned"):
        raise ValueError(f"master_port_mode {master_port_mode!r}: None, 'choose' or 'pinned'")
    inventory = cluster.inventory
    master = inventory.nodes[0].name
    port = getattr(inventory, "master_port", None) if check_master_port else None

    token = uuid.uuid4().hex   # one for every node: its patterns are compiled once

    def one(conn: NodeConnection) -> NodeCheck:
        extra = [*(devices or []), *(devices_for(conn.node) if devices_for else [])]
        return check_node(conn, devices=extra, required_bytes=required_bytes,
                          master_port=port if conn.name == master else None,
                          expected_arch=expected_arch, image_ref=image_ref, timeout=timeout,
                          master_port_mode=master_port_mode, token=token,
                          toolkit_version=toolkit_version, wants_device=wants_device)

    if tree.enabled(cluster):
        results = _preflight_through_tree(
            cluster, nodes, lambda node: [*(devices or []), *(devices_for(node) if devices_for else [])],
            required_bytes=required_bytes, master=master, port=port, expected_arch=expected_arch,
            image_ref=image_ref, timeout=timeout, master_port_mode=master_port_mode,
            toolkit_version=toolkit_version, wants_device=wants_device)
    else:
        results = cluster.map(one, nodes)
    checks = []
    for name, r in results.items():
        if isinstance(r, NodeError):
            node = next(n for n in inventory.nodes if n.name == name)
            r = NodeCheck(node=name, host=node.host, ssh=False, problems=[r.reason])
        checks.append(r)
    apply_consistency(checks, cluster, image_ref, compare_image=compare_image)
    return checks


class _Later:
    """A node's connection, opened only if a check asks for a command the tree did not run."""

    def __init__(self, cluster: Cluster, node: Node) -> None:
        self._cluster, self.node, self.name = cluster, node, node.name

    def __getattr__(self, attr):
        return getattr(self._cluster.connection(self.name), attr)


def _preflight_through_tree(cluster: Cluster, nodes, devices_of, *, required_bytes, master, port,
                            expected_arch, image_ref, timeout,
                            master_port_mode: str | None = None, toolkit_version: str | None = None,
                            wants_device: str | None = None) -> dict[str, NodeCheck | NodeError]:
    """run_preflight's checks with both scripts of every node run through the tree
    (:mod:`clusterctl.cluster.transport.tree`: one connection from here).  The clock's
    window is the whole tree call's, so its uncertainty is wider than a node's own channel."""
    wanted = None if nodes is None else {getattr(n, "name", n) for n in nodes}
    targets = [n for n in cluster.nodes if wanted is None or n.name in wanted]
    slow = None if timeout is None else 2 * timeout
    prepared, commands = {}, {}
    token = uuid.uuid4().hex   # one for every node: its patterns are compiled once
    for node in targets:
        result = _new_check(node, devices_of(node), required_bytes,
                            port if node.name == master else None, expected_arch, master_port_mode,
                            toolkit_version, wants_device)
        scripts = _Replay.scripts(node, devices=result.devices, ports=result.master_port is not None,
                                  image_ref=image_ref)
        prepared[node.name] = (result, token, scripts)
        commands[node.name] = [tree.Command(("sh", "-c", script, "sh", token, *args))
                               for script, args, _ in scripts]
    before = time.time()
    missed: dict[str, str] = {}
    ran = tree.run_commands(cluster, commands, timeout=slow or 120.0,
                            on_tree=lambda info: missed.update(info["hops"]))
    window = (before, time.time())
    out: dict[str, NodeCheck | NodeError] = {}
    for name, found in ran.items():
        if isinstance(found, NodeError):
            out[name] = found
            continue
        result, token, scripts = prepared[name]
        replay = _Replay(_Later(cluster, next(n for n in targets if n.name == name)))
        for (script, _, argv_of), r in zip(scripts, found, strict=True):
            replay.absorb(script, token, argv_of, r, slow, window)
        if name in missed:
            result.warnings.append(f"reached on its own connection, not through the tree: {missed[name]} "
                                   "(ssh.tree: false in the inventory goes straight to every node)")
        try:
            out[name] = _judge(replay, result, image_ref, timeout)
        except NodeError as e:
            out[name] = e if e.node == name else NodeError(name, e.message)
        except Exception as e:  # as Cluster.map: a per-node reason, never a traceback
            out[name] = NodeError(name, describe_error(e))
    return out


@dataclass(frozen=True)
class ImageNeeds:
    """What a local image asks of a node: its architecture, room for its layers and the CUDA
    it was built against (None: not a CUDA image, or it does not say)."""

    ref: str
    arch: str
    size: int
    cuda: str | None = None


#: where an image says its CUDA: NVIDIA's base images' label, then their environment
CUDA_LABELS = ("com.nvidia.cuda.version",)
CUDA_ENV = "CUDA_VERSION"


def image_cuda_version(attrs: dict) -> str | None:
    """The CUDA version an image's ``docker image inspect`` attributes say (NVIDIA's label,
    else its ``CUDA_VERSION`` environment variable); None when neither does (pure)."""
    config = attrs.get("Config") or {}
    labels = config.get("Labels") or {}
    for key in CUDA_LABELS:
        if labels.get(key):
            return str(labels[key]).strip()
    for item in config.get("Env") or []:
        name, _, value = str(item).partition("=")
        if name == CUDA_ENV and value.strip():
            return value.strip()
    return None


def image_needs(ref: str) -> ImageNeeds:
    """Architecture and unpacked size of ``ref`` in the local engine; UserError when absent."""
    from docker.errors import (
        ImageNotFound,  # the docker SDK is heavy: only when an image is checked
    )

    try:
        attrs = engine.client().images.get(ref).attrs
    except ImageNotFound:
        raise UserError(f"image {ref!r} is not in the local Docker engine; valid: a built image "
                        "(see `docker images`, or build one with `clusterctl build`)") from None
    return ImageNeeds(ref, docker_arch(attrs.get("Architecture") or "amd64"),
                      int(attrs.get("Size") or 0), image_cuda_version(attrs))


def interfaces(checks: Iterable[NodeCheck]) -> dict[str, str]:
    """{node: interface} for launch (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)."""
    return {c.node: c.interface for c in checks if c.interface}


def init_nodes(checks: Iterable[NodeCheck]) -> list[str]:
    """The nodes that have Docker's init binary, for launch (``docker run --init``)."""
    return [c.node for c in checks if c.init]


def judge_processes(checks: Iterable[NodeCheck], processes: Mapping[str, int], *,
                    source: str = "the job starts", warn_only: bool = False) -> None:
    """Each node's ranks (``processes``: node -> count) against the GPUs or MLUs its probe
    counted, for the device kind each check was asked about (``wants_device``): a problem
    or a warning added to the node's check (:func:`clusterctl.cluster.accelprobe.processes_findings`);
    ``warn_only``: the count is not the job's (``check`` reads the inventory's slots), so
    more processes than devices is a warning too."""
    for c in checks:
        if c.node not in processes:
            continue
        found = accelprobe.processes_findings(c.accelerator, processes[c.node], wants=c.wants_device,
                                              source=source)
        (c.warnings if warn_only else c.problems).extend(found.problems)
        c.warnings.extend(found.warnings)


# --------------------------------------------------------------------------- presentation

COLUMNS = ("node", "host", "ssh", "runtime", "arch", "free disk", "devices", "interface", "problems")


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _devices_cell(c: NodeCheck) -> str:
    if not c.devices:
        return "-"
    if not c.devices_checked:
        return "?"
    present = len(c.devices) - len(c.missing_devices)
    return f"{present}/{len(c.devices)} present"


def _problems_cell(problems: list[str], compact: bool) -> str:
    if not problems:
        return "ok"
    if compact:
        return f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
    return "; ".join(problems)


def table_rows(checks: Iterable[NodeCheck], *, compact: bool = False) -> list[list[str]]:
    """One row per node, plain text (escape it before a rich table reads markup).

    ``compact`` puts the number of problems in the last column instead of their
    text (for a table followed by one line per problem).
    """
    rows = []
    for c in checks:
        rows.append([
            c.node,
            c.host,
            "ok" if c.ssh else "FAILED",
            c.docker_version or ("-" if not c.ssh else "FAILED"),
            c.arch or "-",
            human_bytes(c.free_bytes) if c.free_bytes is not None else "-",
            _devices_cell(c) if c.ssh else "-",
            (c.interface or "FAILED") if c.ssh else "-",
            _problems_cell(c.problems, compact),
        ])
    return rows
