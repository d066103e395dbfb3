"""A ``docker load`` archive made from the engine's layer store, holding only the layers to send.

One job: lay out and write the archive.  Contract:

* :func:`plan_archive` (pure) - the member paths: the config, one
  ``<diffID>/layer.tar`` per layer to send, ``manifest.json`` naming every
  layer; and the layout (member path -> diff ID) the layer filter cuts by;
* :func:`archive` - that archive as a stream of chunks, the layer tars
  rebuilt by :class:`~clusterctl.cluster.distribute.layerstore.LayerStore`.

It has the shape of a legacy ``docker save`` whose unchanged layers were cut
out (what the layer filter makes of a save, FIELD-NOTES §1): ``docker load``
reads ``manifest.json``, opens a layer tar only for a chain the node lacks,
and prints the image ID it made from the config, which the push checks.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

from clusterctl.cluster.distribute.layerstore import LayerStore, StoredLayer
from clusterctl.cluster.distribute.source import SourceImage
from clusterctl.cluster.distribute.tarstream import BLOCK, padded_size


@dataclass(frozen=True)
class ArchivePlan:
    config_path: str
    layers: tuple[tuple[str, int], ...]  # (member path, chain position) of each layer sent
    manifest: bytes
    layout: dict[str, str]              # member path -> diff ID, for every layer sent


def _layer_path(diff_id: str) -> str:
    return diff_id.removeprefix("sha256:") + "/layer.tar"


def plan_archive(image: SourceImage, send: set[str]) -> ArchivePlan:
    """Which members the archive holds for the layers in ``send`` (image order, each once)."""
    config_path = image.id.removeprefix("sha256:") + ".json"
    paths = [_layer_path(d) for d in image.diff_ids]
    layers: list[tuple[str, int]] = []
    for pos, (diff, path) in enumerate(zip(image.diff_ids, paths, strict=True)):
        if diff in send and path not in dict(layers):
            layers.append((path, pos))
    manifest = json.dumps([{"Config": config_path, "RepoTags": None, "Layers": paths}]).encode()
    return ArchivePlan(config_path, tuple(layers), manifest,
                       {path: image.diff_ids[pos] for path, pos in layers})


def _header(name: str, size: int, *, directory: bool = False) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = 0 if directory else size
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory else 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT) if len(name) < 100 else \
        info.tobuf(format=tarfile.PAX_FORMAT)


def _member(name: str, data: bytes) -> bytes:
    return _header(name, len(data)) + data + b"\0" * (padded_size(len(data)) - len(data))


def archive(store: LayerStore, image: SourceImage, plan: ArchivePlan, config: bytes,
            layers: dict[int, StoredLayer]) -> Iterator[bytes]:
    """The archive, layer tars streamed from the store (LayerMismatch when one does not verify)."""
    yield _member(plan.config_path, config)
    for path, pos in plan.layers:
        layer = layers[pos]
        yield _header(path.rsplit("/", 1)[0] + "/", 0, directory=True)
        yield _header(path, layer.size)
        yield from store.stream(layer)
        pad = padded_size(layer.size) - layer.size
        if pad:
            yield b"\0" * pad
    yield _member("manifest.json", plan.manifest)
    yield b"\0" * (2 * BLOCK)
