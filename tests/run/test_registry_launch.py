"""Images through a real registry: `push` and `launch` with the inventory's `registry:`.

A 2-node sandbox with its own registry (`sandbox up --registry --registry-auth`: CNCF
Distribution over TLS from the sandbox's CA, htpasswd), this machine logged in with the
real `docker login` into a private DOCKER_CONFIG.  The head pushes once, every node pulls
by digest with the head's credentials (sent on stdin, gone after the pull), and the run
record keeps the digest every node ran.  The image is the debootstrapped base image
(253 MB): a shell job needs no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster import sandbox
from clusterctl.run import records
from tests.fixtures.sandbox import SandboxCluster, cluster_fields, held_sandbox

pytestmark = [pytest.mark.sandbox, pytest.mark.docker]
runner = CliRunner()

NAME, SUBNET = "rgl", "10.213.74.0/24"


@pytest.fixture(scope="module")
def reg_sandbox():
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (network namespaces, daemons)")
    with held_sandbox(NAME, SUBNET, 2, slots=1, with_registry=True, registry_auth=True) as sb:
        yield SandboxCluster(**cluster_fields(sb))


def login(config: Path, sb) -> None:
    """The real `docker login` into ``config`` (the password read from the sandbox's file)."""
    password = sb.registry_password_file.read_bytes()
    subprocess.run(["docker", "--config", str(config), "login", sb.registry, "-u", "clusterctl",
                    "--password-stdin"], input=password, check=True, capture_output=True, timeout=60)


def node_image_id(cluster: SandboxCluster, node: str, ref: str) -> str | None:
    r = cluster.node_docker(node, "image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def tmp_dirs() -> set[str]:
    """The pulls' credential directories (pull-image.sh's mktemp; the nodes share this /tmp)."""
    return {p.name for p in Path("/tmp").glob("clusterctl-pull.*")}


def test_push_and_launch_go_through_the_registry_by_digest(reg_sandbox, base_image, docker_client,
                                                             runs_dir, tmp_path, monkeypatch):
    cl = reg_sandbox
    sb = cl._sandbox
    inv = yaml.safe_load(cl.inventory_path.read_text())
    assert inv["registry"] == sb.registry               # `sandbox up --registry` wrote it
    config = tmp_path / "docker-config"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))

    # not logged in: the registry refuses the head's push, clearly, exit 2, and the tag the
    # push added is gone again (one of an earlier session's push to this address first)
    for tag in docker_client.images.get(base_image).tags:
        if tag.startswith(sb.registry + "/"):
            docker_client.images.remove(tag, noprune=True)
    res = runner.invoke(app, ["push", base_image, "--nodes", str(cl.inventory_path)])
    assert res.exit_code == 2, res.output
    assert f"the registry {sb.registry} refused" in res.output and f"docker login {sb.registry}" in res.output
    assert not [t for t in docker_client.images.get(base_image).tags if t.startswith(sb.registry)]

    login(config, sb)
    before = tmp_dirs()
    res = runner.invoke(app, ["push", base_image, "--nodes", str(cl.inventory_path)])
    assert res.exit_code == 0, res.output
    digest = next(line.split()[1] for line in res.output.splitlines() if line.startswith("digest: "))
    local_id = docker_client.images.get(base_image).id
    pinned = f"{sb.registry}/{base_image.split('/')[-1].split(':')[0]}@{digest}"
    assert f"reference: {pinned}" in res.output, res.output
    for node in cl.nodes:    # every node pulled exactly that digest: the head's image ID
        assert node_image_id(cl, node, pinned) == local_id, node
    # the credentials went nowhere: no temp config left, the node user's config untouched
    assert tmp_dirs() <= before
    for node in sb.nodes:                              # each node user's own docker config
        own = node.home / ".docker" / "config.json"
        assert node.home.is_dir() and (not own.exists() or sb.registry not in own.read_text())

    # launch: the image is pinned by digest in every container and in the record
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"image": base_image,
                                   "command": ["sh", "-c", "echo ran on $NODE_RANK"]}))
    cl.node_docker(list(cl.nodes)[1], "image", "rm", "-f", pinned, check=False)  # node2 must pull again
    res = runner.invoke(app, ["launch", str(job), "--nodes", str(cl.inventory_path)])
    assert res.exit_code == 0, res.output
    assert "ran on 0" in res.output and "ran on 1" in res.output
    rec = records.list_runs()[0]
    assert rec.image == pinned and rec.image_digest == digest and rec.registry == sb.registry
    data = json.loads((rec.dir / "run.json").read_text())
    assert data["image_digest"] == digest
    assert node_image_id(cl, list(cl.nodes)[1], pinned) == local_id
    assert tmp_dirs() <= before


def test_a_registry_nobody_answers_is_named_and_nothing_starts(reg_sandbox, base_image, runs_dir, tmp_path):
    cl = reg_sandbox
    data = yaml.safe_load(cl.inventory_path.read_text())
    data["registry"] = f"{cl.head_ip}:5999"                  # nothing listens there
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(data))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"image": base_image, "command": ["true"]}))
    res = runner.invoke(app, ["launch", str(job), "--nodes", str(inv)])
    assert res.exit_code == 2, res.output
    assert f"cannot reach the registry {cl.head_ip}:5999" in res.output and "Traceback" not in res.output
    assert records.list_runs() == []
    assert sandbox.node_docker(cl.name, list(cl.nodes)[0], "ps", "-aq").stdout.strip() == ""
