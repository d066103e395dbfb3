"""Read layers straight from the local engine's overlay2 layer store, verified as they stream.

One job: the disk side of the layer-store source.  Contract:

* :func:`open_store` - the engine's data root as a :class:`LayerStore`, or
  :class:`StoreUnusable` saying why not (the data root is not readable here,
  the driver is not overlay2, a file is missing): the caller then uses
  ``docker save``;
* :meth:`LayerStore.config` - the image's config blob, checked against the image ID;
* :meth:`LayerStore.layer` - one layer's :class:`StoredLayer` (diff ID, tar
  size, tar-split entries), from ``image/overlay2/layerdb/sha256/<chainID>``;
* :meth:`LayerStore.stream` - that layer's tar rebuilt the way moby does
  (tar-split segments and the files under ``overlay2/<cache-id>/diff``),
  hashed while it streams; :class:`LayerMismatch` (a StreamError) when the
  sha256 is not the diff ID, raised BEFORE the last piece (the tar's end
  blocks) is handed out, so a node never receives a complete wrong layer.

Only the layers asked for are opened: the unchanged ones cost nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.cluster.distribute.tarsplit import (
    FileEntry,
    Segment,
    TarSplitError,
    parse,
    tar_size,
)
from clusterctl.cluster.distribute.tarstream import StreamError

if TYPE_CHECKING:
    from docker import DockerClient

DRIVER = "overlay2"
PIECE = 1 << 20  # bytes per chunk handed to the stream (small files are gathered)


class StoreUnusable(Exception):
    """The layer store cannot serve this push (the message says why); use ``docker save``."""


class LayerMismatch(StreamError):
    """A layer rebuilt from the store does not hash to its diff ID."""


@dataclass(frozen=True)
class StoredLayer:
    chain_id: str
    diff_id: str
    diff_dir: Path
    entries: tuple[Segment | FileEntry, ...]

    @property
    def size(self) -> int:
        """Bytes of the layer's tar (what ``docker save`` writes as its layer.tar)."""
        return tar_size(self.entries)


def _hex(digest: str) -> str:
    algo, _, value = digest.partition(":")
    if algo != "sha256" or len(value) != 64 or not all(c in "0123456789abcdef" for c in value):
        raise StoreUnusable(f"not a sha256 digest: {digest!r}")
    return value


def open_store(client: DockerClient) -> LayerStore:
    """The local engine's layer store, when this process can read it and it is overlay2."""
    try:
        info = client.info()
    except Exception as e:  # noqa: BLE001 - any engine error: the save path decides for itself
        raise StoreUnusable(f"docker info failed: {e}") from None
    driver, root = info.get("Driver"), info.get("DockerRootDir")
    if driver != DRIVER:
        raise StoreUnusable(f"storage driver is {driver!r}, not {DRIVER}")
    if not root:
        raise StoreUnusable("the engine did not say its data root")
    store = LayerStore(Path(root))
    for sub in (store.layerdb, store.imagedb, store.root / DRIVER):
        if not os.access(sub, os.R_OK | os.X_OK):
            raise StoreUnusable(f"{sub} is not readable by this process")
    return store


class LayerStore:
    """moby's image and layer metadata and overlay2 diffs under one data root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.layerdb = root / "image" / DRIVER / "layerdb" / "sha256"
        self.imagedb = root / "image" / DRIVER / "imagedb" / "content" / "sha256"

    def config(self, image_id: str) -> bytes:
        path = self.imagedb / _hex(image_id)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise StoreUnusable(f"image config {path}: {e.strerror}") from None
        if "sha256:" + hashlib.sha256(data).hexdigest() != image_id:
            raise StoreUnusable(f"image config {path} does not hash to {image_id} "
                                "(not this engine's store?)")
        return data

    def layer(self, chain_id: str, diff_id: str) -> StoredLayer:
        meta = self.layerdb / _hex(chain_id)
        try:
            stored_diff = (meta / "diff").read_text().strip()
            cache_id = (meta / "cache-id").read_text().strip()
            with gzip.open(meta / "tar-split.json.gz", "rb") as f:
                entries = tuple(parse(f))
        except (OSError, EOFError) as e:
            raise StoreUnusable(f"layer {chain_id}: {e}") from None
        except TarSplitError as e:
            raise StoreUnusable(f"layer {chain_id}: {e}") from None
        if stored_diff != diff_id:
            raise StoreUnusable(f"layer {chain_id} holds diff {stored_diff}, not {diff_id}")
        if not cache_id or "/" in cache_id or cache_id in (".", ".."):
            raise StoreUnusable(f"layer {chain_id}: bad cache-id {cache_id!r}")
        diff_dir = self.root / DRIVER / cache_id / "diff"
        for e in entries:
            if isinstance(e, FileEntry) and e.size:
                parts = e.name.split(b"/")
                if e.name.startswith(b"/") or b".." in parts:
                    raise StoreUnusable(f"layer {chain_id}: unsafe path {e.name!r} in tar-split")
                try:
                    st = os.lstat(diff_dir / os.fsdecode(e.name))
                except OSError as err:
                    raise StoreUnusable(f"layer {chain_id}: {err.filename}: {err.strerror}") from None
                if st.st_size != e.size:
                    raise StoreUnusable(f"layer {chain_id}: {e.name!r} is {st.st_size} bytes, "
                                        f"tar-split says {e.size}")
        return StoredLayer(chain_id, diff_id, diff_dir, entries)

    def stream(self, layer: StoredLayer) -> Iterator[bytes]:
        """The layer's tar, byte for byte as moby rebuilds it, verified against its diff ID."""
        digest = hashlib.sha256()
        buf = bytearray()
        for e in layer.entries:
            pieces = (e.data,) if isinstance(e, Segment) else _file_pieces(layer, e)
            for piece in pieces:
                buf += piece
                if len(buf) >= PIECE:
                    digest.update(buf)
                    yield bytes(buf)
                    buf.clear()
        digest.update(buf)
        if "sha256:" + digest.hexdigest() != layer.diff_id:
            raise LayerMismatch(f"layer {layer.diff_id} rebuilt from the engine's layer store "
                                f"hashes to sha256:{digest.hexdigest()} (changed on disk?)")
        yield bytes(buf)  # the tar's end blocks: only once the whole layer is verified


def _file_pieces(layer: StoredLayer, e: FileEntry) -> Iterator[bytes]:
    """A file's ``e.size`` bytes from the layer's diff directory, PIECE at a time."""
    if not e.size:
        return
    path = layer.diff_dir / os.fsdecode(e.name)
    left = e.size
    try:
        with open(path, "rb", buffering=0,
                  opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as f:
            while left:
                data = f.read(min(left, PIECE))
                if not data:
                    raise LayerMismatch(f"layer {layer.diff_id}: {path} is shorter than its "
                                        "tar entry")
                left -= len(data)
                yield data
    except OSError as err:
        raise LayerMismatch(f"layer {layer.diff_id}: {path}: {err.strerror}") from None
