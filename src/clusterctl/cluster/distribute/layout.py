"""Which member of a ``docker save`` stream holds which layer, known before its data arrives.

One job: map save-stream member paths to diff IDs, and remember that map per
image ID.  Contract:

* :class:`LayerIndex` - asked member by member as the stream goes by
  (``diff_id``), learning from the small members that precede layers
  (``note_small``);
* :func:`layout_for` - the layout to filter with: cached, scanned once with
  a first pass (OCI engines), or None (the legacy format derives it on the
  fly);
* :func:`layout_from_metadata`, :func:`store_layout`, :func:`cached_layout`,
  :func:`scan_layout`, :func:`engine_writes_oci`, :func:`legacy_layer_position`.

The catch is that ``docker save`` writes ``manifest.json`` AFTER the layers
(the engine tars its export directory in lexical order: ``<v1id>/...`` and
``<config>.json`` sort before ``manifest.json``), so when a layer tar arrives
the manifest that says which diff ID it holds is not known yet.  Choice made:

* Legacy format (engines before 25, e.g. this machine's 20.10): derive the
  layer from the ``<v1id>/json`` member, which sorts before its
  ``<v1id>/layer.tar``.  The directory name is the engine's v1 ID,
  ``sha256(<that json without "id"> + layer_id=<chain ID> + parent)`` with
  Go's sorted-key encoding (moby ``image/v1.CreateID``); recomputing it for
  each chain position and comparing with the directory name identifies the
  layer with certainty (a hash match, never a guess).  Cost: a few
  microseconds per layer, no extra pass.
* OCI layout (``index.json``, ``blobs/sha256/<digest>``): a blob whose digest
  is one of the image's diff IDs is that (uncompressed) layer by definition.
  Compressed blobs (containerd image store) cannot be recognised on the fly,
  so for engines that write OCI (API >= 1.44) a first pass reads the save
  stream keeping only the small members (index, manifests, configs) and the
  resulting layout is cached per image ID in ``cache_dir()/push-layouts``.
* A layer member that cannot be identified is sent (``docker load`` ignores a
  layer it already has): never wrong, only slower.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.cluster.distribute.source import SourceImage
from clusterctl.cluster.distribute.tarstream import ChunkReader, Member, members
from clusterctl.core.paths import cache_dir

if TYPE_CHECKING:
    from docker import DockerClient

SMALL_MEMBER = 1 << 20  # metadata members (json, manifests, configs) are far below this
OCI_SAVE_API = (1, 44)  # docker 25: `docker save` writes an OCI layout


# --------------------------------------------------------------------------- legacy format

def _raw_object(text: str) -> dict[str, str]:
    """Top-level keys of a JSON object mapped to their raw (verbatim) value text."""
    dec = json.JSONDecoder()
    out: dict[str, str] = {}
    pos = text.index("{") + 1
    while True:
        while text[pos] in " \t\r\n,":
            pos += 1
        if text[pos] == "}":
            return out
        key, pos = dec.raw_decode(text, pos)
        while text[pos] in " \t\r\n:":
            pos += 1
        _, end = dec.raw_decode(text, pos)
        out[key] = text[pos:end]
        pos = end


def legacy_layer_position(v1_json: str, chains: Sequence[str]) -> int | None:
    """Which chain position a legacy ``<v1id>/json`` member describes, or None.

    Recomputes moby's ``v1.CreateID(v1Image, chainID, parent)`` for each position and
    compares it with the member's own ``id``: a sha256 match, so never a wrong answer.
    The engine sets ``os`` after computing the ID except on the top layer (whose
    v1Image is the image's own and already carries it)."""
    try:
        items = _raw_object(v1_json)
        v1_id = json.loads(items.pop("id"))
        parent = items.pop("parent", None)
    except (ValueError, KeyError, IndexError):
        return None
    if parent is not None:
        items["parent"] = json.dumps("sha256:" + json.loads(parent))
    for top in (False, True):
        candidate = dict(items)
        if not top:
            candidate.pop("os", None)
        positions = [len(chains) - 1] if top else range(len(chains) - 1)
        for i in positions:
            candidate["layer_id"] = json.dumps(chains[i])
            text = "{" + ",".join(f"{json.dumps(k)}:{candidate[k]}" for k in sorted(candidate)) + "}"
            if hashlib.sha256(text.encode()).hexdigest() == v1_id:
                return i
    return None


# --------------------------------------------------------------------------- manifests

def layout_from_metadata(small: dict[str, bytes], image: SourceImage) -> dict[str, str]:
    """Member path -> diff ID from a save's metadata (``manifest.json``, else OCI ``index.json``)."""
    if "manifest.json" in small:
        for entry in json.loads(small["manifest.json"]):
            config = small.get(entry.get("Config", ""))
            if config is not None and "sha256:" + hashlib.sha256(config).hexdigest() != image.id:
                continue
            layers = entry.get("Layers") or []
            if len(layers) == len(image.diff_ids):
                return dict(zip(layers, image.diff_ids, strict=True))
    if "index.json" in small:
        return _oci_layout(json.loads(small["index.json"]), small, image)
    return {}


def _blob_path(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    return f"blobs/{algo}/{hexpart}"


def _oci_layout(index: dict, small: dict[str, bytes], image: SourceImage) -> dict[str, str]:
    for desc in index.get("manifests") or []:
        blob = small.get(_blob_path(desc.get("digest", "")))
        if blob is None:
            continue
        doc = json.loads(blob)
        if "manifests" in doc:  # a nested index
            found = _oci_layout(doc, small, image)
        else:
            config = small.get(_blob_path(doc.get("config", {}).get("digest", "")))
            diffs = tuple(json.loads(config).get("rootfs", {}).get("diff_ids", [])) if config else ()
            layers = [_blob_path(d["digest"]) for d in doc.get("layers") or []]
            found = (dict(zip(layers, diffs, strict=True))
                     if diffs == image.diff_ids and len(layers) == len(diffs) else {})
        if found:
            return found
    return {}


# --------------------------------------------------------------------------- while streaming

class LayerIndex:
    """Tells, as members stream by, which diff ID a member holds (None: not a layer)."""

    def __init__(self, image: SourceImage, layout: dict[str, str] | None = None) -> None:
        self.image = image
        self.chains = image.chain_ids
        self.paths: dict[str, str] = dict(layout or {})

    def note_small(self, member: Member, data: bytes) -> None:
        """Learn from a small member that precedes layers (a legacy ``<v1id>/json``)."""
        if member.name.endswith("/json") and member.name.count("/") == 1:
            pos = legacy_layer_position(data.decode("utf-8", "replace"), self.chains)
            if pos is not None:
                path = member.name[: -len("json")] + "layer.tar"
                self.paths.setdefault(path, self.image.diff_ids[pos])

    def diff_id(self, member: Member) -> str | None:
        if member.name in self.paths:
            return self.paths[member.name]
        m = re.fullmatch(r"blobs/sha256/([0-9a-f]{64})", member.name)
        if m and f"sha256:{m.group(1)}" in self.image.diff_ids:
            return f"sha256:{m.group(1)}"
        return None

    @staticmethod
    def looks_like_layer(member: Member) -> bool:
        """A member that may be a layer tar: legacy ``*/layer.tar`` or a big OCI blob."""
        return member.name.endswith("/layer.tar") or (
            member.name.startswith("blobs/") and member.size > SMALL_MEMBER)


# --------------------------------------------------------------------------- cache by image ID

def _layout_cache(image_id: str) -> Path:
    return cache_dir() / "push-layouts" / (image_id.replace(":", "-") + ".json")


def cached_layout(image: SourceImage) -> dict[str, str] | None:
    try:
        data = json.loads(_layout_cache(image.id).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and sorted(set(data.values())) == sorted(set(image.diff_ids)) else None


def store_layout(image: SourceImage, layout: dict[str, str]) -> None:
    """Keep a learned layout (best effort: a cache write failure only costs a future first pass)."""
    if not layout:
        return
    path = _layout_cache(image.id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(layout))
        tmp.replace(path)
    except OSError:
        pass


def scan_layout(chunks: Iterable[bytes], image: SourceImage) -> dict[str, str]:
    """First pass: read a save stream keeping only small members; return path -> diff ID."""
    reader = ChunkReader(chunks)
    small: dict[str, bytes] = {}
    for item in members(reader):
        if isinstance(item, bytes):  # end of archive
            break
        if item.is_file and item.size <= SMALL_MEMBER:
            small[item.name] = reader.read_exact(item.padded)[:item.size]
        else:
            reader.skip(item.padded)
    return layout_from_metadata(small, image)


def engine_writes_oci(client: DockerClient) -> bool:
    """True for engines whose ``docker save`` writes an OCI layout (API 1.44, docker 25+)."""
    try:
        version = client.version().get("ApiVersion", "1.0")
        return tuple(int(p) for p in version.split(".")[:2]) >= OCI_SAVE_API
    except Exception:  # noqa: BLE001 - unknown engine: the first pass is the safe choice
        return True


def layout_for(client: DockerClient, image: SourceImage) -> dict[str, str] | None:
    """The member layout to filter with: cached, scanned once (OCI engines), or None (derive)."""
    known = cached_layout(image)
    if known is not None or not engine_writes_oci(client):
        return known
    stream = client.api.get_image(image.id)
    try:
        layout = scan_layout(stream, image)
    finally:
        stream.close()
    store_layout(image, layout)
    return layout or None
