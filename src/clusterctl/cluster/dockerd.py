"""Start and stop a private Docker daemon: the local engine and each sandbox node's.

Every daemon gets its own socket, data-root, exec-root and pidfile so it never
collides with another engine on the machine (FIELD-NOTES §1).  ``netns`` runs it
inside a network namespace with ``nsenter --net=...``: ``ip netns exec`` remounts
/sys and dockerd then dies with "Devices cgroup isn't mounted".
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from clusterctl.core.errors import EnvironmentProblem
from clusterctl.core.tools import require_binaries


@dataclass(frozen=True)
class DaemonPaths:
    root: Path  # everything of this daemon lives under root (state) and data_root

    data_root: Path

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def exec_root(self) -> Path:
        return self.root / "exec"

    @property
    def pidfile(self) -> Path:
        return self.root / "docker.pid"

    @property
    def logfile(self) -> Path:
        return self.root / "dockerd.log"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem(f"{what} needs root (it creates network namespaces and daemons); run it with sudo.")


def socket_answers(path: Path, timeout: float = 2.0) -> bool:
    """True when a Docker API answers /_ping on the unix socket at ``path``."""
    if not path.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b"OK" in s.recv(4096)
    except OSError:
        return False


def read_pid(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


def start(paths: DaemonPaths, *, netns: str | None = None, extra_args: list[str] = (),
          timeout: float = 60.0) -> None:
    """Start dockerd (idempotent: a daemon already answering on the socket is kept)."""
    if socket_answers(paths.socket):
        return
    require_binaries("dockerd", packages="docker.io")
    stop(paths)  # a stale pidfile or socket from a crashed run
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.data_root.mkdir(parents=True, exist_ok=True)
    argv = [
        "dockerd",
        "--host", paths.url,
        "--data-root", str(paths.data_root),
        "--exec-root", str(paths.exec_root),
        "--pidfile", str(paths.pidfile),
        *extra_args,
    ]
    if netns:
        argv = ["nsenter", f"--net=/run/netns/{netns}", *argv]
    log = open(paths.logfile, "ab")  # noqa: SIM115 - handed to the daemon
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if socket_answers(paths.socket):
            return
        if proc.poll() is not None:  # it died (a bad flag, a busy data-root): say so at once
            break
        time.sleep(0.2)
    tail = paths.logfile.read_text(errors="replace").splitlines()[-15:]
    what = (f"exited with status {proc.returncode}" if proc.poll() is not None
            else f"did not answer on {paths.socket} within {timeout:.0f}s")
    raise EnvironmentProblem(f"dockerd {what}; last lines of {paths.logfile}:\n" + "\n".join(tail))


def stop(paths: DaemonPaths, timeout: float = 20.0) -> bool:
    """Stop the daemon by its pidfile; returns True when one was running."""
    pid = read_pid(paths.pidfile)
    if pid is None:
        for p in (paths.socket, paths.pidfile):
            p.unlink(missing_ok=True)
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and read_pid(paths.pidfile) is not None:
        time.sleep(0.2)
    if read_pid(paths.pidfile) is not None:
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    for p in (paths.socket, paths.pidfile):
        p.unlink(missing_ok=True)
    return True
