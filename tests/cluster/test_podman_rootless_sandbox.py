"""Rootless Podman nodes (``sandbox up --runtime podman --user NAME``, issue 42): an ordinary
account of this machine logs in to every node over the node's own sshd, and each node's
Podman is that account's own, rootless (its storage owned by it, fuse-overlayfs, runc), as
on a site where users run their own Podman. The core path as on rootful nodes: ``check``,
``launch`` pushing the cpu image into the user's storage (``podman load`` as the user) and
running ddp-smoke on 2 nodes to identical weights; a detached run whose processes belong to
the user on this machine, read by ``status`` and ended by ``stop``.

Costly (the user's Podman loads the 1.2 GB image on each node), so ONE test, one sandbox
of 2 nodes, one user (``ccpodman``) made here and removed after.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.cluster.sandbox import processes
from tests.fixtures.sandbox import held_sandbox, own_sandbox, wait_running

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

NAME, SUBNET = own_sandbox("u", "k", 10)
USER = "ccpodman"
OK = "ddp-smoke OK: 2 ranks on 2 nodes hold identical weights"


@pytest.fixture(scope="module")
def rootless_user():
    """``ccpodman``: an unlocked account (sshd refuses locked ones) with subordinate ids;
    made here and removed at the end (an account of that name found already is used)."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (network namespaces, daemons)")
    for tool in ("podman", "newuidmap", "fuse-overlayfs", "useradd"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing (apt-get install podman uidmap fuse-overlayfs; scripts/setup-host)")
    made = subprocess.run(["id", "-u", USER], capture_output=True).returncode != 0
    if made:
        res = subprocess.run(["useradd", "-M", "-U", "-d", "/nonexistent", "-s", "/bin/sh", "-p", "*", USER],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    try:
        for ids, flag in (("/etc/subuid", "--add-subuids"), ("/etc/subgid", "--add-subgids")):
            if not any(line.startswith(f"{USER}:") for line in Path(ids).read_text().splitlines()):
                subprocess.run(["usermod", flag, "300000-365535", USER], check=True)
        yield pwd.getpwnam(USER)
    finally:
        if made:
            subprocess.run(["userdel", USER], capture_output=True)


@pytest.fixture(scope="module")
def sandbox_rootless(rootless_user):
    with held_sandbox(NAME, SUBNET, 2, slots=1, runtime="podman", user=USER) as sb:
        yield sb


def clusterctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusterctl", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "CLUSTERCTL_PLAIN": "1"})


def _uid_of(pid: int) -> int | None:
    try:
        line = next(s for s in Path(f"/proc/{pid}/status").read_text().splitlines() if s.startswith("Uid:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_run_on_rootless_podman_nodes_from_push_to_stop(sandbox_rootless, rootless_user, cpu_image, runs_dir):
    sb, uid = sandbox_rootless, rootless_user.pw_uid
    inv = sb.inventory_path
    checked = clusterctl("check", "--nodes", inv)
    assert checked.returncode == 0 and checked.stdout.count("│ podman 4.") == 2, checked.stdout + checked.stderr
    info = processes.node_podman(sb.node("node1"), "info", "--format", "{{.Host.Security.Rootless}} {{.Store.GraphRoot}}")
    assert info.stdout.split() == ["true", str(sb.node("node1").podman_root)], info.stdout + info.stderr

    t0 = time.monotonic()
    ran = clusterctl("launch", "ddp-smoke", "--nodes", inv, "--image", cpu_image, "--nproc-per-node", "1")
    print(f"push + attached ddp-smoke on 2 rootless Podman nodes: {time.monotonic() - t0:.1f}s")
    said = ran.stdout + ran.stderr
    assert ran.returncode == 0 and OK in said and "succeeded (exit 0)" in said, said
    for node in sb.nodes:   # the image is in the user's own storage on each node, which it owns
        images = processes.node_podman(node, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}")
        assert f"localhost/{cpu_image}" in images.stdout.split(), images.stdout + images.stderr
        assert os.stat(node.podman_root).st_uid == uid

    before = {p.name for p in runs_dir.iterdir()}
    started = clusterctl("launch", "ddp-smoke", "--nodes", inv, "--image", cpu_image, "--nproc-per-node", "1",
                         "--detach", "--set", "DDP_SMOKE_STEPS=600", "--set", "DDP_SMOKE_STEP_SECONDS=0.5")
    assert started.returncode == 0, started.stdout + started.stderr
    (run_id,) = [p.name for p in runs_dir.iterdir() if p.is_dir() and p.name not in before]
    try:
        wait_running(lambda: clusterctl("status", run_id, "--json"), ("node1", "node2"))
        for node in sb.nodes:   # the training's processes belong to the user here (the container's
            trainers = [p for p in processes.netns_pids(node.netns)    # root is the user's uid)
                        if b"ddp_smoke.py" in _cmdline(p)]
            assert trainers and {_uid_of(p) for p in trainers} == {uid}, (node.name, trainers)
    finally:
        stopped = clusterctl("stop", run_id)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    for node in sb.nodes:
        left = processes.node_podman(node, "ps", "-a", "--format", "{{.Names}}")
        assert left.returncode == 0 and not [c for c in left.stdout.split() if c.startswith(run_id)], left.stdout
