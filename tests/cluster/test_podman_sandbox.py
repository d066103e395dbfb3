"""Podman nodes on the sandbox (``sandbox up --runtime podman``): real rootful Podman 4.3 in
each node's netns, each with its own storage, reached over the node's own sshd.  The core
path as on Docker nodes: ``check`` names the runtime, ``launch`` pushes the cpu image (Podman
gets the whole image: ``podman load``) and runs ddp-smoke followed to its end; a detached
run read by ``status`` and ``logs`` and ended by ``stop``; and one run on a Docker node and a
Podman node at once (each node keeps its own dockerd, so an inventory may switch one back).

Costly (Podman loads the 1.2 GB image on each node), so ONE module, one sandbox of 2 nodes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusterctl.cluster.sandbox import processes
from clusterctl.run.slurm.submit import SCRIPT_NAME
from tests.fixtures.sandbox import held_sandbox, own_sandbox, wait_running

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

NAME, SUBNET = own_sandbox("p", "o", 9)
OK = "ddp-smoke OK: 2 ranks on 2 nodes hold identical weights"


@pytest.fixture(scope="module")
def sandbox_podman():
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (network namespaces, daemons)")
    if not shutil.which("podman"):
        pytest.fail("podman is missing (apt-get install podman runc catatonit; scripts/setup-host)")
    with held_sandbox(NAME, SUBNET, 2, slots=1, runtime="podman", with_slurm=True) as sb:
        yield sb


def clusterctl(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusterctl", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "CLUSTERCTL_PLAIN": "1", **env})


def _podman_ps(sb, node: str) -> list[str]:
    r = processes.node_podman(sb.node(node), "ps", "-a", "--format", "{{.Names}}")
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_a_run_on_podman_nodes_from_push_to_stop(sandbox_podman, cpu_image, runs_dir):
    sb = sandbox_podman
    inv = sb.inventory_path
    checked = clusterctl("check", "--nodes", inv)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("│ podman 4.") == 2, checked.stdout

    t0 = time.monotonic()
    ran = clusterctl("launch", "ddp-smoke", "--nodes", inv, "--image", cpu_image, "--nproc-per-node", "1")
    print(f"push + attached ddp-smoke on 2 Podman nodes: {time.monotonic() - t0:.1f}s")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    said = ran.stdout + ran.stderr   # the output on stdout, the run's end on stderr
    assert OK in said and "succeeded (exit 0)" in said, said
    first = re.search(r"run (ddp-smoke-\S+) succeeded", said).group(1)
    for node in ("node1", "node2"):   # each node's own Podman has the image; the run's end removed
        images = processes.node_podman(sb.node(node), "image", "ls", "--format", "{{.Repository}}:{{.Tag}}")
        assert f"localhost/{cpu_image}" in images.stdout.split(), images.stdout
        assert f"{first}-{node}" not in _podman_ps(sb, node)
    done = json.loads(clusterctl("status", first, "--json").stdout)
    assert {(n["node"], n["exit_code"]) for n in done["nodes"]} == {("node1", 0), ("node2", 0)}, done

    before = {p.name for p in runs_dir.iterdir()}
    started = clusterctl("launch", "ddp-smoke", "--nodes", inv, "--image", cpu_image,
                         "--nproc-per-node", "1", "--detach", "--set", "DDP_SMOKE_STEPS=600",
                         "--set", "DDP_SMOKE_STEP_SECONDS=0.5", "--set", "DDP_SMOKE_PROGRESS=1")
    assert started.returncode == 0, started.stdout + started.stderr
    new = [p.name for p in runs_dir.iterdir() if p.is_dir() and p.name not in before]
    assert len(new) == 1, (new, started.stdout + started.stderr)   # the detached run's record
    run_id = new[0]
    try:
        wait_running(lambda: clusterctl("status", run_id, "--json"), ("node1", "node2"))
        for node in ("node1", "node2"):   # the container is on the node's Podman
            assert f"{run_id}-{node}" in " ".join(_podman_ps(sb, node))
        deadline = time.monotonic() + 90   # the run's first lines (its progress) read from the nodes
        while True:                        # (each node's first line comes in its own time)
            logs = clusterctl("logs", run_id)
            said = logs.stdout + logs.stderr
            if ("node1[0]|" in said and "node2[1]|" in said) or time.monotonic() > deadline:
                break
            time.sleep(3)
        assert logs.returncode == 0 and "node1[0]|" in said and "node2[1]|" in said, said
    finally:
        stopped = clusterctl("stop", run_id)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    for node in ("node1", "node2"):
        assert not [c for c in _podman_ps(sb, node) if c.startswith(run_id)]
    after = json.loads(clusterctl("status", run_id, "--json").stdout or "{}")
    assert after.get("nodes") is not None, after
    assert all(n["state"] != "running" for n in after["nodes"]), after


def test_one_run_on_a_docker_node_and_a_podman_node(sandbox_podman, cpu_image, runs_dir, tmp_path):
    sb = sandbox_podman
    inv = yaml.safe_load(Path(sb.inventory_path).read_text())
    inv["nodes"][0]["runtime"] = "docker"   # node1 on its dockerd, node2 on its Podman
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(yaml.safe_dump(inv))
    checked = clusterctl("check", "--nodes", str(mixed))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("│ podman 4.") == 1, checked.stdout   # node1: docker's version
    ran = clusterctl("launch", "ddp-smoke", "--nodes", str(mixed), "--image", cpu_image,
                     "--nproc-per-node", "1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    said = ran.stdout + ran.stderr
    assert OK in said, said
    # the image went to node1's dockerd only (node2's never got it): each node its own runtime
    def docker_images(node: str) -> list[str]:
        return processes.node_docker(sb.name, node, "image", "ls", "--format",
                                     "{{.Repository}}:{{.Tag}}").stdout.split()
    assert cpu_image in docker_images("node1") and cpu_image not in docker_images("node2")


def test_a_slurm_job_on_podman_nodes_runs_and_reports_each_outcome(sandbox_podman, cpu_image, runs_dir):
    """``launch --scheduler slurm`` on the sandbox's real Slurm, Podman from the inventory's
    ``runtime: podman`` (then ``--container podman`` given): each task's ``podman run`` is its
    node's own Podman (the TaskProlog gives it the node's configuration), and each task's
    record, in Podman's own time format, is read: a success is exit 0, a rank that exits 3 is
    torchrun's exit 1, as on Docker nodes over SSH. (Before: the training succeeded and the
    head called both nodes lost, exit 255; and without ``--container podman`` the tasks ran
    docker.)"""
    sb = sandbox_podman
    env = {"SLURM_CONF": sb.slurm_conf}
    argv = ("launch", "ddp-smoke", "--nodes", sb.inventory_path, "--image", cpu_image,
            "--scheduler", "slurm", "--nproc-per-node", "1")
    ran = clusterctl(*argv, **env)
    said = ran.stdout + ran.stderr
    assert ran.returncode == 0 and OK in said and "succeeded (exit 0)" in said, said
    (script,) = Path(runs_dir).glob(f"*/{SCRIPT_NAME}")          # the one run's sbatch script
    assert "podman run" in script.read_text() and "docker run" not in script.read_text()
    failed = clusterctl(*argv, "--container", "podman", "--set", "DDP_SMOKE_FAIL_RANK=1",
                        "--set", "DDP_SMOKE_FAIL_CODE=3", **env)
    said = failed.stdout + failed.stderr
    assert failed.returncode == 1 and "FAILED (exit 1)" in said, said
    assert "FIRST FAILURE: node2[1] exited 1 at" in said, said     # its record read, not "lost"
