"""The layer-store source: layer tars rebuilt from the engine's own overlay2 store.

Real parts only: images built by the local engine, its data root read as this
process (root) can, ``docker save`` as the reference, and a 3-node sandbox
(fixture ``sandbox3``) whose daemons load what the head sends and are asked
for the image ID.  "No docker save" is proven by the engine client the push
uses: its ``get_image`` (the save endpoint) is replaced by one that counts and
refuses, so a push that needed a save would fail.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import tarfile
import uuid

import pytest

from clusterctl.cluster import distribute
from clusterctl.cluster.distribute import layerstore
from clusterctl.cluster.inventory import load_inventory
from tests.fixtures.images import random_layers_image

pytestmark = [pytest.mark.docker]

TAG = "clusterctl-test/layerstore"
MB = 1024 * 1024


def _saved_layers(client, image_id: str) -> dict[str, bytes]:
    """diff ID -> layer tar, as ``docker save`` writes them."""
    data = b"".join(client.api.get_image(image_id))
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if member.name.endswith("layer.tar") or member.name.startswith("blobs/"):
                blob = tar.extractfile(member).read()
                out["sha256:" + hashlib.sha256(blob).hexdigest()] = blob
    return out


def _remove(client, *images) -> None:
    for image in images:
        try:
            client.images.remove(image.id, force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


@pytest.fixture
def tricky(docker_client, base_image):
    """FROM the Debian base, plus a layer with whiteouts (files and a directory removed),
    an opaque directory, hard links, symlinks, an empty file and a non-UTF-8 name."""
    tag = f"{TAG}:tricky-{uuid.uuid4().hex[:8]}"
    script = ("rm -rf /usr/share/doc/* /etc/motd && mkdir -p /t/d && echo hi > /t/a "
              "&& ln /t/a /t/hard && ln -s a /t/sym && : > /t/empty "
              "&& printf x > \"/t/$(printf 'caf\\351')\" && head -c 300000 /dev/urandom > /t/d/r")
    dockerfile = f"FROM {base_image}\nRUN {script}\n"
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    ctx.seek(0)
    docker_client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True,
                               network_mode="host")  # RUN needs no docker0 bridge (it may be gone)
    image = distribute.source_image(docker_client, tag)
    yield image
    _remove(docker_client, image)


def test_layers_rebuilt_from_the_store_equal_docker_save_byte_for_byte(docker_client, tricky):
    store = layerstore.open_store(docker_client)
    saved = _saved_layers(docker_client, tricky.id)
    assert set(saved) == set(tricky.diff_ids)
    for chain, diff in zip(tricky.chain_ids, tricky.diff_ids, strict=True):
        layer = store.layer(chain, diff)
        rebuilt = b"".join(store.stream(layer))
        assert layer.size == len(saved[diff]), diff
        assert rebuilt == saved[diff], diff
    assert "sha256:" + hashlib.sha256(store.config(tricky.id)).hexdigest() == tricky.id


class _Engine:
    """The real engine client, with its save endpoint counted and, unless allowed, refused;
    ``root`` replaces the data root ``docker info`` reports (None: the engine's own)."""

    def __init__(self, client, *, allow_save: bool, root: str | None = None) -> None:
        self._client, self.saves, self.allow_save, self.root = client, 0, allow_save, root
        self.api = _Api(self, client.api)

    def info(self):
        info = self._client.info()
        if self.root is not None:
            info["DockerRootDir"] = self.root
        return info

    def __getattr__(self, name):
        return getattr(self._client, name)


class _Api:
    def __init__(self, engine: _Engine, api) -> None:
        self._engine, self._api = engine, api

    def get_image(self, image, *args, **kwargs):
        self._engine.saves += 1
        if not self._engine.allow_save:
            raise AssertionError("docker save called by a push that should not need it")
        return self._api.get_image(image, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._api, name)


def _node_id(sandbox3, node: str, ref: str) -> str | None:
    r = sandbox3.node_docker(node, "image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


@pytest.fixture
def one_changed(docker_client, sandbox3):
    """A parent on every node, and a child that adds one 5 MB layer to it."""
    parent = random_layers_image(docker_client, f"{TAG}:parent", [8 * MB, 6 * MB])[0]
    child = random_layers_image(docker_client, f"{TAG}:child", [5 * MB], base=parent.ref)[0]
    results = distribute.push_image(parent.ref, load_inventory(sandbox3.inventory_path),
                                    strategy="star")
    assert all(r.ok for r in results), [r.error for r in results]
    yield parent, child
    for node in sandbox3.nodes:
        sandbox3.node_docker(node, "rmi", "-f", child.id, parent.id, check=False)
    _remove(docker_client, child, parent)


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["star", "relay", "auto"])
def test_one_changed_layer_is_pushed_without_docker_save(docker_client, sandbox3, one_changed,
                                                         strategy):
    """auto: 3 nodes need 5 MB each, far under RELAY_FROM_BYTES, so the star feeds them all
    (relay's per-node setup would cost more than the copies it saves)."""
    parent, child = one_changed
    engine = _Engine(docker_client, allow_save=False)
    results = distribute.push_image(child.ref, load_inventory(sandbox3.inventory_path),
                                    client=engine, strategy=strategy, compress=False)
    for r in results:
        assert r.ok, f"{r.node}: {r.error}"
        assert (r.status, r.layers_sent) == ("layers", 1), r
        assert r.read_from.startswith(distribute.LAYER_STORE), r.read_from
        assert 5 * MB <= r.bytes_sent <= 5 * MB + 64 * 1024, r.bytes_sent
    if strategy != "relay":
        assert {r.source for r in results} == {"head"}, [(r.node, r.source) for r in results]
    assert engine.saves == 0
    for node in sandbox3.nodes:
        assert _node_id(sandbox3, node, child.ref) == child.id
    assert sandbox3.relay_leftovers() == []


def _copy_store(src: layerstore.LayerStore, dst, image: distribute.SourceImage) -> None:
    """The parts of the engine's store that serve ``image``, copied under ``dst``."""
    hexid = image.id.removeprefix("sha256:")
    imagedb = dst / "image/overlay2/imagedb/content/sha256"
    imagedb.mkdir(parents=True)
    shutil.copy(src.imagedb / hexid, imagedb / hexid)
    for chain in image.chain_ids:
        meta = src.layerdb / chain.removeprefix("sha256:")
        shutil.copytree(meta, dst / "image/overlay2/layerdb/sha256" / meta.name)
        cache = (meta / "cache-id").read_text().strip()
        shutil.copytree(src.root / "overlay2" / cache / "diff", dst / "overlay2" / cache / "diff",
                        symlinks=True)


@pytest.mark.sandbox
@pytest.mark.slow
def test_store_unusable_or_not_verifying_falls_back_to_docker_save(docker_client, sandbox3,
                                                                   one_changed, tmp_path):
    parent, child = one_changed
    node = next(iter(sandbox3.nodes))
    inventory = load_inventory(sandbox3.inventory_path)

    # a data root this process cannot use (nothing there): docker save, and it says why
    engine = _Engine(docker_client, allow_save=True, root=str(tmp_path / "none"))
    [r] = distribute.push_image(child.ref, inventory, client=engine, nodes=[node])
    assert r.ok, r.error
    assert r.read_from.startswith(distribute.DOCKER_SAVE) and "not readable" in r.read_from
    assert engine.saves == 1 and _node_id(sandbox3, node, child.ref) == child.id
    sandbox3.node_docker(node, "rmi", "-f", child.id)

    # a store whose copy of the new layer was changed on disk: the stream breaks before the
    # layer is complete (the node loads nothing from it), then docker save serves the node
    copy = tmp_path / "root"
    _copy_store(layerstore.open_store(docker_client), copy, child)
    changed = child.chain_ids[-1].removeprefix("sha256:")
    cache = (copy / "image/overlay2/layerdb/sha256" / changed / "cache-id").read_text().strip()
    [f] = [p for p in (copy / "overlay2" / cache / "diff").iterdir() if p.is_file()]
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    store = layerstore.LayerStore(copy)
    with pytest.raises(layerstore.LayerMismatch):
        for _ in store.stream(store.layer(child.chain_ids[-1], child.diff_ids[-1])):
            pass
    engine = _Engine(docker_client, allow_save=True, root=str(copy))
    [r] = distribute.push_image(child.ref, inventory, client=engine, nodes=[node])
    assert r.ok, r.error
    assert r.read_from.startswith(distribute.DOCKER_SAVE) and "did not verify" in r.read_from
    assert engine.saves == 1 and _node_id(sandbox3, node, child.ref) == child.id


def test_a_tar_split_it_cannot_read_makes_the_store_unusable(docker_client, tmp_path):
    image = random_layers_image(docker_client, f"{TAG}:bad", [1000])[0]
    try:
        copy = tmp_path / "root"
        _copy_store(layerstore.open_store(docker_client), copy, image)
        meta = copy / "image/overlay2/layerdb/sha256" / image.chain_ids[0].removeprefix("sha256:")
        with gzip.open(meta / "tar-split.json.gz", "wb") as f:
            f.write(b'{"type":7}\n')
        with pytest.raises(layerstore.StoreUnusable, match="tar-split line 1"):
            layerstore.LayerStore(copy).layer(image.chain_ids[0], image.diff_ids[0])
    finally:
        _remove(docker_client, image)
