"""Push faults on a real 3-node sandbox: a node's dockerd killed mid-push, a node's disk full.

Real parts only (fixture ``sandbox3``): the node's own dockerd is SIGKILLed while
it stages the incoming stream, or runs on a small loop-mounted ext4 (the sandbox's
``limit_data_root``) that the push fills.  Both strategies: on 3 nodes ``auto``
is relay, where the faulty node (node2) sits in the middle of the chain and must
still feed node3; the star sends to each node separately.  Each test checks that
the node is named with what happened (exit 1 from the CLI), that the other nodes
got the image (by ID), that the faulty node's store holds no half image, that the
next push to it succeeds once the fault is fixed and the pushed files read back
byte for byte, and that no relay directory of this sandbox is left on a node.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster import distribute
from clusterctl.cluster.distribute import relay
from tests.fixtures.images import random_layers_image

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

TAG = "clusterctl-test/faults"
MB = 1024 * 1024
LAYERS = [24 * MB, 16 * MB, 8 * MB]
runner = CliRunner()


def _build(client, tag: str) -> tuple[distribute.SourceImage, dict[str, str]]:
    return random_layers_image(client, tag, LAYERS)


@pytest.fixture
def image(docker_client, sandbox3):
    img, digests = _build(docker_client, f"{TAG}:{os.urandom(4).hex()}")
    for node in sandbox3.nodes:
        sandbox3.node_docker(node, "rmi", "-f", img.id, check=False)
    yield img, digests
    for node in sandbox3.nodes:
        sandbox3.node_docker(node, "rmi", "-f", img.id, check=False)
    try:
        docker_client.images.remove(img.id, force=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


@pytest.fixture
def patient_relay(monkeypatch):
    """The machine's 2 cores are shared with other sessions: under a load of 40 SSH keepalive
    round trips took over relay's 10 s and a healthy node was declared lost. These tests are
    about dockerd and the disk, not about loss detection, so give the round trips time."""
    monkeypatch.setattr(relay, "LOST_AFTER", 60.0)


def _push(sandbox3, ref: str, strategy: str):
    result = runner.invoke(app, ["push", ref, "--strategy", strategy,
                                 "--nodes", str(sandbox3.inventory_path)])
    return result, " ".join(result.output.split())


def _node_id(sandbox3, node: str, ref: str) -> str | None:
    r = sandbox3.node_docker(node, "image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def _files_on_node(sandbox3, node: str, ref: str, names) -> dict[str, str]:
    """sha256 of each file as the node's own store gives it back (docker create + cp)."""
    docker = ["docker", "-H", sandbox3.docker_host(node)]
    cid = subprocess.run([*docker, "create", ref, "/none"], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        got = {}
        for name in names:
            out = subprocess.run([*docker, "cp", f"{cid}:/{name}", "-"], capture_output=True,
                                 check=True).stdout
            with tarfile.open(fileobj=io.BytesIO(out)) as tar:
                got[name] = hashlib.sha256(tar.extractfile(name).read()).hexdigest()
        return got
    finally:
        subprocess.run([*docker, "rm", "-f", cid], capture_output=True)


def _no_leftovers(sandbox3, wait: float = 60.0) -> list[str]:
    deadline = time.monotonic() + wait
    while sandbox3.relay_leftovers() and time.monotonic() < deadline:
        time.sleep(1)
    return sandbox3.relay_leftovers()


def _store_ids(sandbox3, node: str) -> set[str]:
    return set(sandbox3.node_docker(node, "image", "ls", "-a", "-q", "--no-trunc").stdout.split())


def _staged(root: Path) -> int:
    """Bytes dockerd has staged from the incoming stream (``docker load`` untars it under
    <data root>/tmp before registering layers)."""
    total = 0
    for dirpath, _, files in os.walk(root / "tmp"):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


class _KillWhenStaged(threading.Thread):
    """Kills the node's dockerd once it has staged ``after`` bytes of the push."""

    def __init__(self, sandbox3, node: str, after: int) -> None:
        super().__init__(daemon=True, name=f"kill-{node}")
        self.sandbox3, self.node, self.after = sandbox3, node, after
        self.fired = threading.Event()
        self.stop = threading.Event()
        self.staged = 0

    def run(self) -> None:
        root = self.sandbox3.data_root(self.node)
        while not self.stop.is_set():
            self.staged = _staged(root)
            if self.staged >= self.after:
                if self.sandbox3.kill_dockerd(self.node):
                    self.fired.set()
                return
            time.sleep(0.05)


@pytest.fixture
def slow_links(sandbox3):
    for node in sandbox3.nodes:
        sandbox3.shape(node, "80mbit")  # 10 MB/s: the 48 MB image streams for seconds
    yield
    for node in sandbox3.nodes:
        sandbox3.shape(node, None)


@pytest.mark.parametrize("strategy", ["star", "relay"])
def test_node_whose_dockerd_is_killed_mid_push_is_named_and_the_others_get_the_image(
        sandbox3, image, slow_links, patient_relay, strategy):
    img, digests = image
    nodes = list(sandbox3.nodes)
    bad = nodes[1]  # relay: the middle of the chain, which feeds node3
    killer = _KillWhenStaged(sandbox3, bad, after=8 * MB)
    killer.start()
    try:
        result, text = _push(sandbox3, img.ref, strategy)
    finally:
        killer.stop.set()
        killer.join()
        sandbox3.restart_dockerd(bad)
    assert killer.fired.is_set(), f"{bad} never staged 8 MB ({killer.staged}): nothing was tested"
    assert result.exit_code == 1, text
    assert "Traceback" not in text
    assert f"push failed on 1 of 3 node(s): {bad}: docker daemon stopped during docker load" in text
    assert "start it and push again" in text
    for node in (nodes[0], nodes[2]):
        assert _node_id(sandbox3, node, img.ref) == img.id, node
    # the restarted daemon holds nothing of the image: no half image the next push trusts
    assert img.id not in _store_ids(sandbox3, bad)
    assert _no_leftovers(sandbox3) == []

    again, text = _push(sandbox3, img.ref, strategy)
    assert again.exit_code == 0, text
    assert _node_id(sandbox3, bad, img.ref) == img.id
    assert _files_on_node(sandbox3, bad, img.ref, digests) == digests
    assert _no_leftovers(sandbox3) == []


def _fill(root: Path, leave: int) -> Path:
    """A file taking all but ``leave`` bytes of the file system at ``root``."""
    st = os.statvfs(root)
    filler = root / "clusterctl-test-fill"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - leave)
    return filler


def _free(root: Path) -> int:
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize


@pytest.mark.parametrize("strategy", ["star", "relay"])
def test_node_whose_disk_fills_during_push_is_named_keeps_a_sound_store_and_takes_the_next_push(
        sandbox3, image, patient_relay, strategy):
    img, digests = image
    nodes = list(sandbox3.nodes)
    bad = nodes[1]
    with sandbox3.small_data_root(bad, "128M") as root:
        # room to stage the 48 MB stream but not to unpack its layers as well: the disk
        # fills while dockerd registers layers, the case that could leave half an image
        filler = _fill(root, 70 * MB)
        before = _free(root)
        result, text = _push(sandbox3, img.ref, strategy)
        assert result.exit_code == 1, text
        assert "Traceback" not in text
        assert (f"push failed on 1 of 3 node(s): {bad}: no space left on device in the docker "
                f"data root {root} during docker load; free space there and push again") in text
        for node in (nodes[0], nodes[2]):
            assert _node_id(sandbox3, node, img.ref) == img.id, node
        # nothing half-made kept: not the image, not a layer of it, not its staged stream
        assert img.id not in _store_ids(sandbox3, bad)
        assert sorted(os.listdir(root / "tmp")) == []
        assert before - _free(root) < 2 * MB, (before, _free(root))
        assert _no_leftovers(sandbox3) == []

        filler.unlink()  # space freed: the next push goes through
        again, text = _push(sandbox3, img.ref, strategy)
        assert again.exit_code == 0, text
        assert _node_id(sandbox3, bad, img.ref) == img.id
        assert _files_on_node(sandbox3, bad, img.ref, digests) == digests
        assert _no_leftovers(sandbox3) == []
    # the node's own store is back, and takes the image too
    assert _node_id(sandbox3, bad, img.id) is None
    result, text = _push(sandbox3, img.ref, strategy)
    assert result.exit_code == 0, text
    assert _node_id(sandbox3, bad, img.ref) == img.id
