"""SSH of a sandbox: keys, each node's sshd in its netns, and the known_hosts that trusts them.

Key-only: one client key (ed25519) generated for the sandbox, accepted by every
node; each node has its own host key, and the sandbox's known_hosts holds them
all, so strict host-key checking works out of the box.  A node's sshd listens
only on the node's address and points ``docker`` run over SSH at the node's own
daemon (``SetEnv DOCKER_HOST``) and gives the node's user a home of the node's own
(``SetEnv HOME``, empty: a fresh node's, not this machine's dotfiles, which bash would
source before every command sshd starts).

Contract: :func:`ensure_keys`, :func:`ensure_sshd` (start, or keep one serving the
same config), :func:`write_known_hosts`, :func:`sshd_running`, :func:`port_open`, and
for failure tests :func:`start_sshd` / :func:`stop_sshd` by sandbox and node name.
Imports the model and processes of the sandbox package.
"""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

from clusterctl.cluster import dockerd
from clusterctl.cluster.sandbox.model import SSH_USER, Sandbox, SandboxNode, load, state_base
from clusterctl.cluster.sandbox.processes import in_netns, run, stop_pid
from clusterctl.core.errors import NodeError
from clusterctl.core.invoker import hand_over


def _keygen(path: Path, comment: str) -> None:
    if path.exists() and path.with_suffix(".pub").exists():
        return
    path.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    path.chmod(0o600)


def ensure_keys(sb: Sandbox) -> None:
    """The sandbox's client key (kept when present; under sudo the invoking user's, see
    :mod:`clusterctl.core.invoker`) and the authorized_keys every node uses."""
    sb.dir.mkdir(parents=True, exist_ok=True)
    for d in (state_base(), sb.dir):  # sshd StrictModes: no group/world write on the key's path
        d.chmod(0o755)
    _keygen(sb.key_path, f"clusterctl-sandbox-{sb.name}")
    # `sudo clusterctl sandbox up`: the key is the invoking user's, so that `clusterctl
    # launch` and the rest work without sudo (root reads it all the same)
    hand_over(sb.key_path, sb.key_path.with_suffix(".pub"))
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
        "# `docker` run over SSH talks to this node's own daemon; $HOME is the node's own",
        "# (empty, as on a fresh node): bash runs ~/.bashrc before every command sshd",
        "# starts, and this machine's own could cost more than the command",
        *(["# `podman` over SSH is this node's own (its storage.conf and containers.conf)"]
          if sb.runtime == "podman" and not sb.rootless else []),
        _set_env(node, SSH_USER, podman=sb.runtime == "podman" and not sb.rootless),
        "Subsystem sftp internal-sftp",
        # up --user NAME: NAME logs in too, with a home and runtime dir of the node's own,
        # and `podman` is NAME's rootless one, this node's (a Match block's SetEnv replaces
        # the one above for that user)
        *([f"Match User {sb.user}", "  " + _set_env(node, sb.user, podman=sb.runtime == "podman")]
          if sb.rootless else []),
        "",
    ])


def _set_env(node: SandboxNode, user: str, podman: bool) -> str:
    return "SetEnv " + " ".join(f"{k}={v}" for k, v in {
        **node.user_env(user), **(node.podman_env if podman else {})}.items())


def port_open(ip: str, port: int = 22, timeout: float = 1.0) -> bool:
    """True when something accepts TCP on ip:port (from the head, across the bridge)."""
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:
        return False


def sshd_running(node: SandboxNode) -> bool:
    return dockerd.read_pid(node.sshd_pidfile) is not None


def ensure_sshd(sb: Sandbox, node: SandboxNode, timeout: float = 20.0) -> None:
    """Start the node's sshd in its netns; one already serving this config there is kept."""
    node.dir.mkdir(parents=True, exist_ok=True)
    node.home.mkdir(mode=0o700, exist_ok=True)
    _keygen(node.host_key, f"{sb.name}-{node.name}")
    config = _sshd_config(sb, node)
    same = node.sshd_config.exists() and node.sshd_config.read_text() == config
    node.sshd_config.write_text(config)
    pid = dockerd.read_pid(node.sshd_pidfile)
    if same and in_netns(pid, node.netns) and port_open(node.ip):
        return
    stop_pid(node.sshd_pidfile)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    run(["nsenter", f"--net=/run/netns/{node.netns}", sshd, "-f", str(node.sshd_config),
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
    ensure_sshd(sb, sb.node(node))


def stop_sshd(name: str, node: str) -> bool:
    """Stop a node's sshd listener (open sessions stay, as with a real sshd)."""
    return stop_pid(load(name).node(node).sshd_pidfile)


def write_known_hosts(sb: Sandbox) -> None:
    """The sandbox's known_hosts: every node's own host key under its address."""
    lines = []
    for node in sb.nodes:
        keytype, key = node.host_key.with_suffix(".pub").read_text().split()[:2]
        lines.append(f"{node.ip} {keytype} {key}\n")
    sb.known_hosts_path.write_text("".join(lines))
