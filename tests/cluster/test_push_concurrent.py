"""Two clusterctl processes putting one image on the same nodes at once, on the real sandbox.

Two `clusterctl push` of the same image, started together: the second waits for the first
(it says so), then finds every node holding the image and sends nothing; every node ends
with the image ID of this machine's image.  A push and a launch of that image at once: the
launch waits for the push (its own push finds the image there) and its ranks run on the
complete image.  Both through the real CLI, each in a process of its own.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.fixtures.images import random_layers_image

pytestmark = [pytest.mark.sandbox, pytest.mark.docker]


def clusterctl(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "clusterctl", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    outs = [p.communicate(timeout=300)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs, strict=True)]


@pytest.fixture
def fresh_image(docker_client, base_image, throwaway_tag):
    """An image no node has: the base image plus three layers of random bytes (9 MB)."""
    image, _ = random_layers_image(docker_client, throwaway_tag, [3_000_000] * 3, base=base_image)
    return image


def node_ids(sb, ref: str) -> dict[str, str]:
    return {n: sb.node_docker(n, "image", "inspect", "--format", "{{.Id}}", ref, check=False).stdout.strip()
            for n in sb.nodes}


def test_two_pushes_of_one_image_at_once_the_second_waits_and_sends_nothing(clean_nodes, fresh_image, tmp_path,
                                                                          monkeypatch):
    sb = clean_nodes
    monkeypatch.setenv("CLUSTERCTL_PLAIN", "1")
    inv = str(sb.inventory_path)
    (a, out_a), (b, out_b) = finish([clusterctl("push", fresh_image.ref, "--nodes", inv) for _ in range(2)])
    assert (a, b) == (0, 0), out_a + out_b
    # the image crossed the links once: one push sent it, the other (which waited for it, or
    # started after it ended) found it on every node
    idle = [o for o in (out_a, out_b) if "sent by this machine: 0 B" in o]
    assert len(idle) == 1, out_a + out_b
    assert idle[0].count("skipped") >= len(sb.nodes), idle[0]
    waits = (out_a + out_b).count("waiting for another push of this image from this machine")
    assert waits in (0, len(sb.nodes)), out_a + out_b
    print(f"the second push waited: {bool(waits)}")
    assert node_ids(sb, fresh_image.ref) == {n: fresh_image.id for n in sb.nodes}


def test_a_push_and_a_launch_of_one_image_at_once_run_the_complete_image(clean_nodes, fresh_image, tmp_path,
                                                                       runs_dir):
    sb = clean_nodes
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"image": fresh_image.ref, "command": [
        "sh", "-c", "echo rank $NODE_RANK sees $(ls / | grep -c '^f[0-9]-')"]}))
    inv = str(sb.inventory_path)
    (p, out_p), (r, out_r) = finish([clusterctl("push", fresh_image.ref, "--nodes", inv),
                                     clusterctl("launch", str(job), "--nodes", inv)])
    assert (p, r) == (0, 0), out_p + out_r
    for rank in range(len(sb.nodes)):          # every rank saw the image's three layers
        assert f"rank {rank} sees 3" in out_r, out_r
    assert node_ids(sb, fresh_image.ref) == {n: fresh_image.id for n in sb.nodes}
    # the image crossed the links once: the launch's own push waited for the other one, or
    # found the image there; or the push found what the launch sent
    assert "sent by this machine: 0 B" in out_p or out_r.count("skip: same image ID") == len(sb.nodes) \
        or "waiting for another push of this image from this machine" in out_r, out_p + out_r
