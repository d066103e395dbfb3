"""The local Docker engine that clusterctl builds on and pushes from.

Resolution order: ``DOCKER_HOST``; the standard socket /var/run/docker.sock;
the engine that ``clusterctl engine up`` starts (its own socket under
/run/clusterctl/engine, so it never collides with another engine).
"""

from __future__ import annotations

import os
from pathlib import Path

from clusterctl.cluster import dockerd
from clusterctl.core.errors import EnvironmentProblem
from clusterctl.core.invoker import hand_over
from clusterctl.core.paths import state_dir

STANDARD_SOCKET = Path("/var/run/docker.sock")


def local_engine_paths() -> dockerd.DaemonPaths:
    root = state_dir() / "engine"
    data = Path(os.environ.get("CLUSTERCTL_ENGINE_DATA", "/var/lib/clusterctl/engine"))
    return dockerd.DaemonPaths(root=root, data_root=data)


def engine_url() -> str | None:
    """The Docker engine URL clusterctl will use, or None when none answers."""
    env = os.environ.get("DOCKER_HOST")
    if env:
        return env
    if dockerd.socket_answers(STANDARD_SOCKET):
        return f"unix://{STANDARD_SOCKET}"
    ours = local_engine_paths()
    if dockerd.socket_answers(ours.socket):
        return ours.url
    return None


def _socket_not_yours() -> Path | None:
    """An engine socket that exists but this user may not open (someone else's engine)."""
    for path in (STANDARD_SOCKET, local_engine_paths().socket):
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            return path
    return None


def start_local_engine() -> str:
    """Start clusterctl's own engine (root; one already running is kept); returns its URL.
    Under sudo its socket becomes the invoking user's (group kept), so that user builds
    and launches without sudo: access to a Docker engine is root's power on this machine,
    which a user with sudo has already."""
    dockerd.require_root("clusterctl engine up")
    paths = local_engine_paths()
    # --iptables=false: a root-namespace dockerd that manages iptables sets the FORWARD
    # policy to DROP, which silently cuts sandbox nodes off from each other.
    dockerd.start(paths, extra_args=["--iptables=false", "--ip-masq=false"])
    hand_over(paths.socket, group=False)
    return paths.url


def stop_local_engine() -> bool:
    return dockerd.stop(local_engine_paths())


def client(timeout: int = 600):
    """A docker SDK client for the local engine, or a clear EnvironmentProblem."""
    import docker  # heavy (requests, urllib3): only for commands that talk to the engine
    from docker.errors import DockerException

    url = engine_url()
    denied = None if url else _socket_not_yours()
    if denied is not None:
        raise EnvironmentProblem(
            f"the Docker engine's socket {denied} is not yours to use (Permission denied). "
            "Run `sudo clusterctl engine up` once: clusterctl's own engine's socket becomes "
            "yours; or join the socket's group (`sudo usermod -aG docker $USER`, then log in again).")
    if url is None:
        raise EnvironmentProblem(
            "no Docker engine is reachable: DOCKER_HOST is unset, /var/run/docker.sock does "
            "not answer and clusterctl's own engine is not running. Start one with "
            "`sudo clusterctl engine up` (or set DOCKER_HOST=unix:///path/to/docker.sock)."
        )
    try:
        c = docker.DockerClient(base_url=url, timeout=timeout)
        c.ping()
    except DockerException as e:
        raise EnvironmentProblem(
            f"the Docker engine at {url} does not answer ({e.__class__.__name__}: {e}). "
            "Check DOCKER_HOST, or start clusterctl's own engine with `sudo clusterctl engine up`."
        ) from None
    return c
