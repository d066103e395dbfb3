"""`clusterctl push` end to end: the real cpu image onto a real 3-node sandbox over SSH.

Every node is a network namespace with its own sshd and dockerd (fixture
``sandbox3``); image IDs are checked on each node's own daemon. Byte counts are
what push_image counted into the SSH channels: exact for the skip case, and for
the one-new-layer case bounded by the layer's size plus the tar metadata.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from benchmarks.push import derived_image
from clusterctl.cli import app
from clusterctl.cluster import distribute
from clusterctl.cluster.inventory import load_inventory

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

LAYER = 5 * 1024 * 1024
#: tar metadata around the new layer: config, manifest, v1 json + VERSION per layer, headers
METADATA_OVERHEAD = 64 * 1024
PINNED = "clusterctl-test/push:cpu"
runner = CliRunner()


@pytest.fixture(scope="module")
def cpu(docker_client, cpu_image) -> distribute.SourceImage:
    """The cpu image under this module's own tag, held by a stopped container: another
    session on the machine may rebuild the shared tag meanwhile and remove the image it
    replaced (render._remove_replaced), which would change the image under these tests."""
    docker_client.api.tag(cpu_image, PINNED)
    holder = docker_client.containers.create(PINNED, command=["true"])
    try:
        yield distribute.source_image(docker_client, PINNED)
    finally:
        holder.remove(force=True)
        try:
            docker_client.api.remove_image(PINNED)
        except Exception:  # noqa: BLE001 - already gone
            pass


_derived = derived_image  # FROM base + one layer of N random bytes; shared with the benchmark


def _node_id(sandbox3, node: str, ref: str) -> str | None:
    r = sandbox3.node_docker(node, "image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def _node_chains(sandbox3, node: str) -> set[str]:
    ids = sandbox3.node_docker(node, "image", "ls", "-a", "-q", "--no-trunc").stdout.split()
    chains: set[str] = set()
    for image_id in set(ids):
        layers = sandbox3.node_docker(node, "image", "inspect", "--format",
                                      "{{json .RootFS.Layers}}", image_id).stdout
        chains.update(distribute.chain_ids(json.loads(layers) or []))
    return chains


def _remove_everywhere(docker_client, sandbox3, image: distribute.SourceImage) -> None:
    for node in sandbox3.nodes:
        sandbox3.node_docker(node, "rmi", "-f", image.id, check=False)
    try:
        docker_client.images.remove(image.id, force=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


@pytest.fixture(scope="module")
def first_push(sandbox3, cpu):
    """Push the cpu image to nodes that do not have it (earlier tests may have put it there)."""
    missing = {}
    for node in sandbox3.nodes:
        sandbox3.node_docker(node, "rmi", "-f", cpu.id, check=False)
        assert _node_id(sandbox3, node, cpu.id) is None, f"cannot remove {cpu.ref} from {node}"
        chains = _node_chains(sandbox3, node)
        missing[node] = sum(c not in chains for c in cpu.chain_ids)
    results = distribute.push_image(cpu.ref, load_inventory(sandbox3.inventory_path))
    return results, missing


def test_push_puts_the_same_image_id_on_every_node(sandbox3, cpu, first_push):
    results, missing = first_push
    assert [r.node for r in results] == list(sandbox3.nodes)
    for r in results:
        assert r.ok, f"{r.node}: {r.error}"
        assert r.layers_total == len(cpu.diff_ids)
        assert r.layers_sent == missing[r.node]
        assert r.status == ("full" if missing[r.node] == len(cpu.diff_ids) else "layers")
        if r.status == "full":  # every layer tar crossed the wire
            assert r.bytes_sent >= cpu.size
    for node in sandbox3.nodes:
        assert _node_id(sandbox3, node, cpu.ref) == cpu.id
        assert _node_id(sandbox3, node, cpu.id) == cpu.id


def test_second_push_sends_no_image_bytes(sandbox3, cpu, first_push):
    results = distribute.push_image(cpu.ref, load_inventory(sandbox3.inventory_path))
    assert [(r.node, r.status, r.bytes_sent, r.layers_sent) for r in results] == [
        (node, "skipped", 0, 0) for node in sandbox3.nodes]
    for node in sandbox3.nodes:
        assert _node_id(sandbox3, node, cpu.ref) == cpu.id


@pytest.fixture
def one_layer_more(docker_client, sandbox3, cpu, first_push):
    image = _derived(docker_client, cpu.ref, "clusterctl-test/push:one-layer", LAYER)
    yield image
    _remove_everywhere(docker_client, sandbox3, image)


def test_image_with_one_new_layer_sends_about_that_layer(sandbox3, cpu, one_layer_more):
    image = one_layer_more
    assert image.diff_ids[:-1] == cpu.diff_ids
    results = distribute.push_image(image.ref, load_inventory(sandbox3.inventory_path))
    for r in results:
        assert r.ok, f"{r.node}: {r.error}"
        assert (r.status, r.layers_sent, r.layers_total) == ("layers", 1, len(cpu.diff_ids) + 1)
        assert LAYER <= r.bytes_sent <= LAYER + METADATA_OVERHEAD, r.bytes_sent
        assert r.bytes_sent < cpu.size / 100
    for node in sandbox3.nodes:
        assert _node_id(sandbox3, node, image.ref) == image.id


@pytest.fixture
def small_image(docker_client, sandbox3, cpu, first_push):
    image = _derived(docker_client, cpu.ref, "clusterctl-test/push:unreachable", 1024 * 1024)
    yield image
    _remove_everywhere(docker_client, sandbox3, image)


def test_node_with_sshd_stopped_is_named_and_the_others_still_get_the_image(
        sandbox3, small_image):
    names = list(sandbox3.nodes)
    down = names[1]
    up = [n for n in names if n != down]
    sandbox3.stop_sshd(down)
    try:
        result = runner.invoke(app, ["push", small_image.ref,
                                     "--nodes", str(sandbox3.inventory_path)])
    finally:
        sandbox3.start_sshd(down)
    text = " ".join(result.output.split())
    assert result.exit_code == 1, text
    assert "Traceback" not in text
    assert f"push failed on 1 of 3 node(s): {down}: " in text
    assert "connection refused" in text
    for node in up:
        assert _node_id(sandbox3, node, small_image.ref) == small_image.id
    assert _node_id(sandbox3, down, small_image.id) is None


def test_unknown_local_image_is_exit_2_naming_it(sandbox3):
    result = runner.invoke(app, ["push", "clusterctl-test/no-such:image",
                                 "--nodes", str(sandbox3.inventory_path)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert '"clusterctl-test/no-such:image" is not in the local Docker engine' in text
    assert "Traceback" not in text
