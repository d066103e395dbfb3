"""Processes of a sandbox: host tools, a node's Docker daemon in its netns, and killing what is left.

Daemons start with ``nsenter --net=...`` (``ip netns exec`` remounts /sys and
dockerd dies).  Each node's dockerd gets its own daemon ID (dockerd 20.10
otherwise takes it from the machine-wide /etc/docker/key.json) so nodes look like
separate machines, and puts its containers in the node's cgroup, where ``down``
finds them even after the daemon died.

Contract: :func:`run` (a host tool, failures as messages), :func:`start_dockerd`,
for failure tests :func:`kill_dockerd` / :func:`restart_dockerd` by sandbox and node name,
:func:`node_docker`, a node's Podman (:func:`write_podman_confs`, :func:`node_podman`,
:func:`podman_owner`, :func:`remove_podman_containers`; rootful, or the login user's rootless
one with ``up --user``), :func:`in_netns`, :func:`stop_pid`, :func:`terminate`,
:func:`netns_pids`, :func:`processes_using`, :func:`cgroup_dirs`, :func:`remove_cgroups`.
Imports only the model of the sandbox package.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import resource
import shlex
import signal
import subprocess
import time
from pathlib import Path

from clusterctl.cluster import dockerd
from clusterctl.cluster.sandbox.model import SSH_USER, SandboxNode, load
from clusterctl.core.errors import EnvironmentProblem, NodeError
from clusterctl.core.text import digits

# Node daemons own no network set-up (the sandbox does it), and are disposable: a short
# shutdown timeout keeps `down` from waiting 15 s per daemon for containers to stop.
NODE_DOCKERD_ARGS = ["--bridge=none", "--iptables=false", "--ip-masq=false", "--shutdown-timeout=2"]
CGROUP_ROOT = Path("/sys/fs/cgroup")


def run(argv: list[str], *, check: bool = True, node: str | None = None) -> str:
    """Run a host tool (argv only); a failure becomes a message naming the command and node."""
    p = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        msg = f"`{shlex.join(argv)}` exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}"
        raise NodeError(node, msg) if node else EnvironmentProblem(msg)
    return p.stdout


# --------------------------------------------------------------------------- a node's dockerd


def _dockerd_args(node: SandboxNode) -> list[str]:
    """A daemon.json of the node's own: never the machine's /etc/docker/daemon.json, and
    its own ID key.  dockerd 20.10 derives its ID from /etc/docker/key.json, shared by every
    daemon on the machine; separate machines have separate IDs, so each node gets its own
    key (``deprecated-key-path`` exists only as a config-file setting)."""
    config = node.dir / "daemon.json"
    node.dir.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({"deprecated-key-path": str(node.dir / "key.json")}, indent=2) + "\n")
    return [*NODE_DOCKERD_ARGS, "--config-file", str(config), "--cgroup-parent", node.cgroup]


def start_dockerd(node: SandboxNode) -> None:
    """The node's dockerd in its netns; one already running there is kept, one outside replaced."""
    daemon_pid = dockerd.read_pid(node.daemon.pidfile)
    if daemon_pid is not None and not in_netns(daemon_pid, node.netns):
        dockerd.stop(node.daemon)
    try:
        dockerd.start(node.daemon, netns=node.netns, extra_args=_dockerd_args(node))
    except EnvironmentProblem as e:
        raise NodeError(node.name, e.message) from None
    except OSError as e:  # its state or data directory cannot be made
        raise NodeError(node.name, f"cannot start dockerd: {e}") from None


# --------------------------------------------------------------------------- a node's Podman

#: RLIMIT_NPROC the node's containers get: rootful Podman sets one on every container (docker
#: sets none), and runc refuses a value above what this machine lets it set (measured here:
#: 30000 accepted, 65536 refused, with a hard limit of 96364)
PODMAN_NPROC = 16384


def podman_confs(node: SandboxNode, rootless: bool = False) -> tuple[str, str]:
    """(containers.conf, storage.conf) of a node's own Podman (pure): its graph root, run root
    and tmp dir its own (nodes share no container or image); runc, not crun (this machine's
    cgroups are v1 and v2 at once, which crun refuses); cgroupfs (no systemd); its ulimits
    no higher than this machine's (rootful Podman raises nofile and nproc otherwise, which a
    container here may not); logs in files (``logs --follow`` after the run ended).
    ``rootless``: the login user's Podman (``up --user``): its tmp dir and run root in the
    node's user directory, and overlay through fuse-overlayfs (a user may not mount
    overlay here; without it Podman falls back to vfs, a full copy of the image for every
    container: 31 s against 4.4 s per start of the cpu image, measured)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    nproc = PODMAN_NPROC if nproc == resource.RLIM_INFINITY else min(nproc, PODMAN_NPROC)
    state = node.user_dir if rootless else node.dir
    kind = "rootless Podman of the login user" if rootless else "Podman"
    conf = "\n".join([
        f"# {kind} of sandbox node {node.sandbox}/{node.name}, written by clusterctl sandbox up.",
        "[engine]",
        'runtime = "runc"',
        'cgroup_manager = "cgroupfs"',
        f'tmp_dir = "{state / "podman-tmp"}"',
        'events_logger = "file"',
        f'events_logfile_path = "{state / "podman-events.log"}"',
        "[containers]",
        'log_driver = "k8s-file"',
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]',
        ""])
    storage = "\n".join([
        f"# {kind} storage of sandbox node {node.sandbox}/{node.name}.",
        "[storage]",
        'driver = "overlay"',
        f'graphroot = "{node.podman_root}"',
        f'runroot = "{state / "podman-run"}"',
        # rootless Podman reads its graph root from here (graphroot is root's alone)
        *([f'rootless_storage_path = "{node.podman_root}"', "[storage.options.overlay]",
           f'mount_program = "{FUSE_OVERLAYFS}"'] if rootless else []),
        ""])
    return conf, storage


#: what rootless Podman mounts its image layers with (Debian package fuse-overlayfs)
FUSE_OVERLAYFS = "/usr/bin/fuse-overlayfs"


def write_podman_confs(node: SandboxNode, user: str = SSH_USER) -> None:
    """The node's Podman configuration (rewritten each ``up``; nothing runs: Podman is
    daemonless, each ``podman`` its sshd starts reads them).  ``user`` other than root: a
    rootless Podman, whose home, runtime dir, state and graph root ``user`` owns (made
    here, fresh, in root's directories: nothing another user planted is followed)."""
    node.dir.mkdir(parents=True, exist_ok=True)
    rootless = user != SSH_USER
    conf, storage = podman_confs(node, rootless=rootless)
    node.podman_conf.write_text(conf)
    node.podman_storage_conf.write_text(storage)
    if rootless:
        pw = pwd.getpwnam(user)
        node.podman_root.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        for d in (node.user_dir, node.user_dir / "home", node.user_dir / "run", node.podman_root):
            d.mkdir(mode=0o700, exist_ok=True)
            os.lchown(d, pw.pw_uid, pw.pw_gid)


def podman_owner(node: SandboxNode) -> int:
    """The uid whose Podman the node's is: the owner of its graph root (root when none)."""
    try:
        return os.lstat(node.podman_root).st_uid
    except OSError:
        return 0


def node_podman(node: SandboxNode, *args: str, check: bool = False,
                timeout: float | None = 120) -> subprocess.CompletedProcess:
    """Run ``podman`` on this machine as a sandbox node's own (its configuration, and its
    owner: the login user's for a rootless node), in its netns (for ``down`` and for
    assertions)."""
    env = {**os.environ, **node.podman_env}
    argv = ["nsenter", f"--net=/run/netns/{node.netns}", "podman", *args]
    uid = podman_owner(node)
    if uid != 0:
        try:
            pw = pwd.getpwuid(uid)
            name, gid = pw.pw_name, pw.pw_gid
        except KeyError:  # the account is gone: its uid still owns the storage
            name, gid = str(uid), uid
        env.update(node.user_env(name), USER=name, LOGNAME=name)
        argv[2:2] = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    return subprocess.run(argv, capture_output=True, text=True, check=check, env=env,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def remove_podman_containers(node: SandboxNode) -> None:
    """Remove every container of the node's Podman at once (``down``): its processes live
    in no cgroup of the node's, so the node's Podman itself ends them."""
    if node.podman_conf.exists() and node.podman_storage_conf.exists():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            node_podman(node, "rm", "--all", "--force", "--time", "0", timeout=60)


def kill_dockerd(name: str, node: str) -> bool:
    """SIGKILL a node's dockerd, as a crash would (its containerd lives on, and the next
    dockerd takes it over); True when one was running."""
    n = load(name).node(node)
    pid = dockerd.read_pid(n.daemon.pidfile)
    if pid is None:
        return False
    terminate([pid], grace=0)
    with contextlib.suppress(ChildProcessError):  # started by this process: no zombie left
        os.waitpid(pid, os.WNOHANG)
    return True


def restart_dockerd(name: str, node: str) -> None:
    """(Re)start a node's dockerd: the counterpart of kill_dockerd (one running is kept)."""
    start_dockerd(load(name).node(node))


def node_docker(name: str, node: str, *args: str, check: bool = False) -> subprocess.CompletedProcess:
    """Run the docker CLI on this machine against a sandbox node's own daemon (for assertions)."""
    n = load(name).node(node)
    return subprocess.run(["docker", "-H", n.docker_host, *args], capture_output=True, text=True,
                          check=check, stdin=subprocess.DEVNULL)


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


# --------------------------------------------------------------------------- stopping


def stop_pid(pidfile: Path, timeout: float = 10.0) -> bool:
    """Stop the process a pidfile names and remove the file; True when one was running."""
    pid = dockerd.read_pid(pidfile)
    if pid is not None:
        terminate([pid], grace=timeout)
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


def terminate(pids: list[int], grace: float = 10.0) -> None:
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


def netns_pids(netns: str) -> list[int]:
    out = run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in out.split()]


def processes_using(path: Path) -> list[int]:
    """Processes whose command line names ``path``: dockerd, containerd, shims, sshd of a node."""
    needle = str(path).encode() + b"/"
    found = []
    for proc in Path("/proc").iterdir():
        if not digits(proc.name):
            continue
        with contextlib.suppress(OSError):
            if needle in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


# --------------------------------------------------------------------------- cgroups


def cgroup_dirs(relative: str) -> list[Path]:
    """``relative`` in every cgroup hierarchy (v1: one per controller; v2: the root)."""
    rel = relative.strip("/")
    bases = [CGROUP_ROOT, *(d for d in CGROUP_ROOT.iterdir() if d.is_dir())] if CGROUP_ROOT.is_dir() else []
    return [b / rel for b in bases if (b / rel / "cgroup.procs").exists()]


def remove_cgroups(relative: str) -> None:
    """Kill every process left in the cgroup tree (containers whose daemon died) and remove it."""
    for top in cgroup_dirs(relative):
        groups = sorted((p.parent for p in top.rglob("cgroup.procs")), key=lambda p: len(p.parts),
                        reverse=True)
        pids = set()
        for g in groups:
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(x) for x in (g / "cgroup.procs").read_text().split()}
        terminate(sorted(pids), grace=0)  # their daemon is gone: nobody stops them gently
        for g in groups:  # deepest first: a cgroup is removed with rmdir once empty
            with contextlib.suppress(OSError):
                g.rmdir()
