"""The save-stream rewriting of clusterctl.cluster.distribute, on real ``docker save`` streams.

Images are built here FROM scratch (no registry, no base image needed) on the
local docker_client, so the layer tars have known contents.  The rewritten streams are
checked member by member and loaded into a private dockerd standing in for a
node.  This machine's engine (20.10) writes the legacy format; the OCI layout
is produced from the same images by skopeo (a real tool, ``apt-get install
skopeo``; the OCI tests skip without it), both uncompressed (layers identified
on the fly, as docker 25+ graphdriver engines write them) and gzip-compressed
(containerd-store style: layers identified through the first-pass layout scan).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path

import pytest

from clusterctl.cluster import distribute, dockerd, engine
from clusterctl.cluster.dockerd import DaemonPaths
from clusterctl.core.errors import UserError

pytestmark = pytest.mark.docker

TAG = "clusterctl-test/distribute"


def _context(files: dict[str, bytes], dockerfile: str) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in {**files, "Dockerfile": dockerfile.encode()}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def _build(client, tag: str, files: dict[str, bytes], dockerfile: str) -> distribute.SourceImage:
    client.images.build(fileobj=_context(files, dockerfile), custom_context=True, tag=tag, rm=True)
    return distribute.source_image(client, tag)


@pytest.fixture(scope="module")
def images(docker_client):
    """parent: 2 layers (a, b); child: parent + one 300 KB layer (c). Removed after."""
    rnd = os.urandom
    files = {"a": rnd(200_000), "b": rnd(100_000), "c": rnd(300_000)}
    parent = _build(docker_client, f"{TAG}:parent", files, "FROM scratch\nCOPY a /a\nCOPY b /b\n")
    child = _build(docker_client, f"{TAG}:child", files, f"FROM {TAG}:parent\nCOPY c /c\n")
    yield parent, child
    for tag in (f"{TAG}:child", f"{TAG}:parent"):
        try:
            docker_client.images.remove(tag, force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


def _save(docker_client, image) -> bytes:
    return b"".join(docker_client.api.get_image(image.id))


def _chunks(data: bytes, size: int = 4096):
    """Odd-sized chunks so tar blocks straddle chunk boundaries."""
    for i in range(0, len(data), size + 7):
        yield data[i:i + size + 7]


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else b"") for m in tar}


def _filter(data: bytes, image, send, **kw) -> tuple[bytes, distribute.FilterStats]:
    stats = distribute.FilterStats()
    out = b"".join(distribute.filter_save_stream(_chunks(data), image, set(send), stats=stats, **kw))
    return out, stats


# --------------------------------------------------------------------------- legacy format

def test_sending_every_layer_reproduces_the_save_stream_byte_for_byte(docker_client, images):
    _, child = images
    data = _save(docker_client, child)
    out, stats = _filter(data, child, child.diff_ids)
    assert hashlib.sha256(out).hexdigest() == hashlib.sha256(data).hexdigest()
    assert stats.bytes_out == len(data)
    assert stats.layers_sent == 3 and stats.layers_skipped == 0 and stats.unidentified == []


def test_legacy_layers_are_identified_before_their_data_matching_the_manifest(docker_client, images):
    _, child = images
    data = _save(docker_client, child)
    members = _members(data)
    manifest = json.loads(members["manifest.json"])[0]
    chains = child.chain_ids
    for position, path in enumerate(manifest["Layers"]):
        v1_json = members[path.replace("layer.tar", "json")].decode()
        assert distribute.legacy_layer_position(v1_json, chains) == position
    # a json that is not of this image is never claimed
    assert distribute.legacy_layer_position(v1_json, list(reversed(chains))) is None


def test_only_the_missing_layer_is_kept_and_the_manifest_still_lists_all(docker_client, images):
    _, child = images
    data = _save(docker_client, child)
    out, stats = _filter(data, child, [child.diff_ids[-1]])
    kept = _members(out)
    manifest = json.loads(kept["manifest.json"])[0]
    present = [p for p in manifest["Layers"] if p in kept]
    assert present == [manifest["Layers"][-1]]
    assert manifest["Config"] in kept
    assert hashlib.sha256(kept[present[0]]).hexdigest() == child.diff_ids[-1].split(":")[1]
    assert stats.layers_sent == 1 and stats.layers_skipped == 2
    assert stats.bytes_out == len(out)
    # the c layer is ~300 KB; the rest is metadata
    assert 300_000 < len(out) < 300_000 + 32_000


@pytest.fixture
def node_engine():
    """A private dockerd standing in for a node's engine (root needed); stopped after."""
    if os.geteuid() != 0:
        pytest.skip("a private dockerd needs root")
    root = Path(tempfile.mkdtemp(prefix="h5-node-", dir="/run/clusterctl"))
    data = Path(tempfile.mkdtemp(prefix="clusterctl-test-node-"))
    paths = DaemonPaths(root=root, data_root=data)
    try:
        dockerd.start(paths, extra_args=["--bridge=none", "--iptables=false", "--ip-masq=false"])
        yield paths
    finally:
        dockerd.stop(paths)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def _load(paths: DaemonPaths, data: bytes) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "-H", paths.url, "load"], input=data, capture_output=True)


def test_filtered_stream_loads_to_the_same_image_id_on_an_engine_with_the_base(
        docker_client, images, node_engine):
    parent, child = images
    assert _load(node_engine, _save(docker_client, parent)).returncode == 0
    out, _ = _filter(_save(docker_client, child), child, [child.diff_ids[-1]])
    r = _load(node_engine, out)
    assert r.returncode == 0, r.stderr
    assert f"Loaded image ID: {child.id}" in r.stdout.decode()


def test_filtered_stream_does_not_load_where_the_base_is_missing(docker_client, images, node_engine):
    _, child = images
    out, _ = _filter(_save(docker_client, child), child, [child.diff_ids[-1]])
    r = _load(node_engine, out)
    assert r.returncode != 0


# --------------------------------------------------------------------------- OCI layout

def _skopeo_oci(docker_client, image, tmp_path: Path, compress: bool) -> bytes:
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed (apt-get install skopeo): no OCI layout tool here")
    target = tmp_path / "oci.tar"
    argv = ["skopeo", "copy"]
    # the engine the tests use, however clusterctl found it (DOCKER_HOST is often unset)
    argv += ["--src-daemon-host", engine.engine_url()]
    if not compress:  # skopeo gzips OCI layers unless told otherwise
        argv += ["--dest-oci-accept-uncompressed-layers"]
    argv += [f"docker-daemon:{image.ref}", f"oci-archive:{target}"]
    subprocess.run(argv, check=True, capture_output=True)
    return target.read_bytes()


def test_oci_uncompressed_layers_are_identified_on_the_fly(docker_client, images, tmp_path):
    _, child = images
    data = _skopeo_oci(docker_client, child, tmp_path, compress=False)
    assert "index.json" in _members(data)
    out, stats = _filter(data, child, [child.diff_ids[-1]])
    kept = _members(out)
    layer_blobs = {f"blobs/sha256/{d.split(':')[1]}" for d in child.diff_ids}
    assert sorted(layer_blobs & kept.keys()) == [f"blobs/sha256/{child.diff_ids[-1].split(':')[1]}"]
    assert stats.layers_sent == 1 and stats.layers_skipped == 2 and stats.unidentified == []
    assert {"index.json", "oci-layout"} <= kept.keys()


def test_oci_compressed_layers_need_the_layout_scan_then_filter_exactly(docker_client, images, tmp_path):
    _, child = images
    data = _skopeo_oci(docker_client, child, tmp_path, compress=True)
    layout = distribute.scan_layout(_chunks(data), child)
    assert sorted(layout.values()) == sorted(child.diff_ids)
    assert all(p.startswith("blobs/sha256/") for p in layout)
    # blobs are gzip: without the layout they are not recognisable (big ones would be sent)
    assert not set(layout) & {f"blobs/sha256/{d.split(':')[1]}" for d in child.diff_ids}
    out, stats = _filter(data, child, [child.diff_ids[-1]], layout=layout)
    kept = _members(out)
    top = [p for p, d in layout.items() if d == child.diff_ids[-1]]
    assert sorted(set(layout) & kept.keys()) == top
    assert stats.layers_sent == 1 and stats.layers_skipped == 2


# --------------------------------------------------------------------------- tar edge cases

def test_pax_long_names_and_extended_headers_pass_through_verbatim():
    buf = io.BytesIO()
    long_name = "d" * 120 + "/layer.tar"
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((long_name, b"x" * 1000), ("manifest.json", b"[]")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    seen = []
    reader = distribute.ChunkReader(_chunks(data, 100))
    for item in distribute.members(reader):
        if isinstance(item, bytes):
            break
        seen.append(item.name)
        list(reader.pieces(item.padded))
    assert seen == [long_name, "manifest.json"]
    fake = distribute.SourceImage("x", "sha256:" + "0" * 64, ("sha256:" + "1" * 64,), 0)
    out, stats = _filter(data, fake, [])
    assert out == data  # unidentified: sent whole, header blocks included
    assert stats.unidentified == [long_name]


def test_truncated_stream_is_an_error_not_a_short_image(docker_client, images):
    _, child = images
    data = _save(docker_client, child)
    with pytest.raises(distribute.StreamError):
        _filter(data[: len(data) // 2], child, child.diff_ids)


def test_unknown_local_image_is_a_user_error_naming_it(docker_client):
    with pytest.raises(UserError) as e:
        distribute.source_image(docker_client, "clusterctl-test/no-such-image:1")
    assert "clusterctl-test/no-such-image:1" in e.value.message and e.value.exit_code == 2


# --------------------------------------------------------------------------- shared save

def test_shared_save_feeds_every_reader_the_same_stream_and_survives_a_dropout(
        docker_client, images):
    _, child = images
    whole = _save(docker_client, child)
    shared = distribute.SharedSave(docker_client, child.id, ["a", "b", "gone"])
    try:
        shared.detach("gone")  # a node that failed before reading must not stall the others
        out = {}
        def read(name):
            out[name] = b"".join(shared.chunks(name))
            shared.detach(name)

        threads = [threading.Thread(target=read, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert out == {"a": whole, "b": whole}
    finally:
        shared.close()


def test_shared_save_of_a_missing_image_is_a_stream_error(docker_client):
    shared = distribute.SharedSave(docker_client, "sha256:" + "0" * 64, ["a"])
    try:
        with pytest.raises(distribute.StreamError, match="docker save failed"):
            b"".join(shared.chunks("a"))
    finally:
        shared.close()
