"""Put a local image on every node: skip nodes that have it, send only the layers a node lacks.

There is no registry (FIELD-NOTES §1), so an image travels as a ``docker save``
stream from the local engine, through one SSH exec channel per node, into the
node's own ``docker load``.  Three things make that fast and safe:

* **Skip by ID.**  A node whose engine already has an image with the source's
  ID gets 0 image bytes; it is only tagged.
* **Only missing layers.**  ``docker load`` looks layers up by *chain ID* and
  opens a layer tar only when the node lacks that chain; a tar holding
  ``manifest.json``, the config and only the missing layer tars (the other
  paths listed in the manifest but absent) loads and yields the same image ID
  (FIELD-NOTES §1).  The node's chain IDs come from
  ``docker image inspect --format '{{json .RootFS.Layers}}'`` over its images.
* **Verified.**  After loading, the node's image ID must equal the source's,
  else that node's push fails.

Streaming, never a temporary file.  The save stream is rewritten block by
block (512-byte tar headers parsed here, every kept byte passed through
verbatim), so neither side ever holds the image on disk or in memory
(the nodes' and the engine's own dockerd may stage it; that is theirs).  The
catch is that ``docker save`` writes ``manifest.json`` AFTER the layers (the
engine tars its export directory in lexical order: ``<v1id>/...`` and
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

Measured here (2 cores, the 1.3 GB cpu image, docker 20.10): a ``docker
save`` pass alone takes 9-14 s on an idle machine (20-40 s when busy), about
as long as sending the image over one unshaped SSH stream (paramiko moved 146
MB/s, OpenSSH 200 MB/s), so a first pass on every push would nearly double
the cost of the one-changed-layer case; the v1-ID derivation and the tar
rewriting cost milliseconds per GB.  Hence the first pass only where the
format gives no other way, and then only once per image ID.  For the same
reason nodes pushed together share ONE save (:class:`SharedSave`) instead of
the engine exporting the image once per node.

``benchmarks/push.py``, unshaped, load ~3 (seconds for cold / warm / one 5 MB
layer changed; MB per node 1344 / 0 / 5.3): 1 node 36 / 0.4 / 13; 2 nodes
52 / 0.9 / 15; 4 nodes 123 / 1.4 / 21 (with the machine busy, load ~16:
85 / 1.3 / 37, 93 / 1.0 / 17, 167 / 3.6 / 32).  FIELD-NOTES saw 49 s for a
plain ``docker save | ssh | docker load`` to 2 nodes.  The changed-layer case
is bounded by the local engine exporting the whole image, not by the wire,
which carries 5.3 MB instead of 1344 MB per node; every node's sshd, dockerd
and ``docker load`` share the same 2 cores, hence the growth with node count.
"""

from __future__ import annotations

import hashlib
import json
import queue
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import paramiko
from docker.errors import DockerException

from clusterctl.core.errors import NodeError, UserError, did_you_mean
from clusterctl.core.paths import cache_dir

BLOCK = 512
SMALL_MEMBER = 1 << 20  # metadata members (json, manifests, configs) are far below this
COPY_CHUNK = 1 << 20
OCI_SAVE_API = (1, 44)  # docker 25: `docker save` writes an OCI layout


# --------------------------------------------------------------------------- source image

@dataclass(frozen=True)
class SourceImage:
    """The image to push, as the local engine describes it."""

    ref: str
    id: str
    diff_ids: tuple[str, ...]
    size: int

    @property
    def chain_ids(self) -> list[str]:
        return chain_ids(self.diff_ids)


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """Chain IDs (what docker's layer store keys layers by) of a diff ID list, in order."""
    chains: list[str] = []
    for diff in diff_ids:
        if not chains:
            chains.append(diff)
        else:
            chains.append("sha256:" + hashlib.sha256(f"{chains[-1]} {diff}".encode()).hexdigest())
    return chains


def source_image(client, ref: str) -> SourceImage:
    """Inspect ``ref`` on the local engine; UserError (exit 2) naming it when it is not there."""
    from docker.errors import ImageNotFound, NullResource

    try:
        attrs = client.api.inspect_image(ref)
    except (ImageNotFound, NullResource):
        names = sorted({t for img in client.images.list() for t in img.tags})
        raise UserError(
            f'image "{ref}" is not in the local Docker engine{did_you_mean(ref, names)}. '
            "Give a tag or ID listed by `docker images` (build it first with `clusterctl build`)."
        ) from None
    layers = tuple(attrs.get("RootFS", {}).get("Layers") or ())
    return SourceImage(ref=ref, id=attrs["Id"], diff_ids=layers, size=int(attrs.get("Size") or 0))


# --------------------------------------------------------------------------- tar stream

class StreamError(Exception):
    """The save stream is not a tar archive we can rewrite (truncated or malformed)."""


class _ChunkReader:
    """Exact-size reads over an iterator of byte chunks (the engine's save stream)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it = iter(chunks)
        self._buf = b""
        self._pos = 0

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; b'' only at the end of the stream."""
        while self._pos >= len(self._buf):
            try:
                self._buf = next(self._it)
            except StopIteration:
                return b""
            self._pos = 0
        piece = self._buf[self._pos:self._pos + n]
        self._pos += len(piece)
        return piece

    def read_exact(self, n: int) -> bytes:
        parts = []
        while n:
            piece = self.read(n)
            if not piece:
                raise StreamError("the image stream ended in the middle of a tar member")
            parts.append(piece)
            n -= len(piece)
        return b"".join(parts)

    def pieces(self, n: int) -> Iterator[bytes]:
        """Exactly ``n`` bytes as a sequence of pieces (no copy of the whole)."""
        while n:
            piece = self.read(min(n, COPY_CHUNK))
            if not piece:
                raise StreamError("the image stream ended in the middle of a tar member")
            n -= len(piece)
            yield piece


def _padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _octal(field_: bytes) -> int:
    if field_ and field_[0] & 0x80:  # GNU base-256 for sizes >= 8 GiB
        return int.from_bytes(bytes([field_[0] & 0x7F]) + field_[1:], "big")
    text = field_.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax_records(data: bytes) -> dict[str, str]:
    records, pos = {}, 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


@dataclass
class Member:
    """One tar member: the raw header blocks (extended headers included) and its metadata."""

    name: str
    size: int
    type: bytes
    header: bytes  # every block before the data, verbatim

    @property
    def padded(self) -> int:
        return _padded(self.size)

    @property
    def is_file(self) -> bool:
        """A regular file (layer tars, json); links and directories carry no data."""
        return self.type in (b"0", b"\0", b"7")


def members(reader: _ChunkReader) -> Iterator[Member | bytes]:
    """Walk a tar stream: yields a Member (caller must consume its ``padded`` data bytes),
    then finally the raw end-of-archive bytes.  Extended headers (pax ``x``, GNU ``L``)
    are folded into the member they describe so a member is kept or dropped whole."""
    ext: list[bytes] = []
    pax: dict[str, str] = {}
    long_name: str | None = None
    while True:
        block = reader.read_exact(BLOCK)
        if block == b"\0" * BLOCK:
            rest = [block]
            while piece := reader.read(COPY_CHUNK):
                rest.append(piece)
            yield b"".join(rest)
            return
        kind = block[156:157]
        size = _octal(block[124:136])
        if kind in (b"x", b"L", b"K"):
            data = reader.read_exact(_padded(size))
            ext.append(block + data)
            if kind == b"x":
                pax.update(_pax_records(data[:size]))
            elif kind == b"L":
                long_name = data[:size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        name = block[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if block[257:263] == b"ustar\x00":
            prefix = block[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            name = f"{prefix}/{name}" if prefix else name
        name = pax.get("path") or long_name or name
        size = int(pax["size"]) if "size" in pax else size
        yield Member(name=name.removeprefix("./"), size=size, type=kind,
                     header=b"".join(ext) + block)
        ext, pax, long_name = [], {}, None


# --------------------------------------------------------------------------- layer layout

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


@dataclass
class FilterStats:
    """What one rewritten stream carried (filled in while it is consumed)."""

    bytes_out: int = 0
    layers_sent: int = 0
    layers_skipped: int = 0
    unidentified: list[str] = field(default_factory=list)  # layer-like members sent blindly
    small: dict[str, bytes] = field(default_factory=dict)  # metadata seen, for the layout cache


def filter_save_stream(chunks: Iterable[bytes], image: SourceImage, send: set[str],
                       *, layout: dict[str, str] | None = None,
                       stats: FilterStats | None = None) -> Iterator[bytes]:
    """Rewrite a ``docker save`` stream so it carries only the layers whose diff ID is in ``send``.

    Every other member (manifest, config, v1 json, directories, index, symlinks)
    passes through byte for byte; dropped layers leave their manifest entries
    pointing at absent paths, which ``docker load`` accepts for layers the node
    has.  A layer it cannot identify is sent (see the module docstring)."""
    stats = stats if stats is not None else FilterStats()
    index = LayerIndex(image, layout)
    reader = _ChunkReader(chunks)
    for item in members(reader):
        if isinstance(item, bytes):  # end of archive
            stats.bytes_out += len(item)
            yield item
            break
        diff = index.diff_id(item) if item.is_file else None
        if diff is not None and diff not in send:
            stats.layers_skipped += 1
            for _ in reader.pieces(item.padded):
                pass
            continue
        if diff is not None:
            stats.layers_sent += 1
        elif item.is_file and LayerIndex.looks_like_layer(item):
            stats.unidentified.append(item.name)
            stats.layers_sent += 1
        stats.bytes_out += len(item.header)
        yield item.header
        if item.is_file and item.size <= SMALL_MEMBER:
            data = reader.read_exact(item.padded)
            stats.small[item.name] = data[:item.size]
            index.note_small(item, data[:item.size])
            stats.bytes_out += len(data)
            yield data
        else:
            for piece in reader.pieces(item.padded):
                stats.bytes_out += len(piece)
                yield piece


# --------------------------------------------------------------------------- layout cache

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
    stats = FilterStats()
    for _ in filter_save_stream(chunks, image, set(), stats=stats):
        pass
    return layout_from_metadata(stats.small, image)


def engine_writes_oci(client) -> bool:
    """True for engines whose ``docker save`` writes an OCI layout (API 1.44, docker 25+)."""
    try:
        version = client.version().get("ApiVersion", "1.0")
        return tuple(int(p) for p in version.split(".")[:2]) >= OCI_SAVE_API
    except Exception:  # noqa: BLE001 - unknown engine: the first pass is the safe choice
        return True


def layout_for(client, image: SourceImage) -> dict[str, str] | None:
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


# --------------------------------------------------------------------------- one node

@dataclass
class PushResult:
    """How the image got to one node."""

    node: str
    status: str  # "skipped" | "layers" | "full" | "failed"
    bytes_sent: int = 0
    seconds: float = 0.0
    layers_sent: int = 0
    layers_total: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def describe(self) -> str:
        if self.status == "layers":
            return f"layers {self.layers_sent} of {self.layers_total}"
        if self.status == "failed":
            return f"FAILED {self.error}"
        return self.status


class PushProgress(Protocol):
    """Receives events from the worker threads (implementations must be thread-safe)."""

    def started(self, node: str, plan: str) -> None: ...
    def sent(self, node: str, nbytes: int) -> None: ...
    def finished(self, result: PushResult) -> None: ...


class _NoProgress:
    def started(self, node: str, plan: str) -> None:
        pass

    def sent(self, node: str, nbytes: int) -> None:
        pass

    def finished(self, result: PushResult) -> None:
        pass


def node_has_image(conn, image_id: str) -> bool:
    """True when the node's engine holds an image with exactly this ID."""
    r = conn.run(["docker", "image", "inspect", "--format", "{{.Id}}", image_id], timeout=120)
    if r.ok:
        return r.stdout.strip() == image_id
    if "no such image" in r.stderr.lower():
        return False
    r.check()  # docker missing, daemon down: a NodeError with the node's own words
    return False


def node_chain_ids(conn) -> set[str]:
    """Every layer chain ID the node's engine has (via its images' RootFS layers)."""
    ids = sorted(set(conn.run(["docker", "image", "ls", "-a", "-q", "--no-trunc"],
                              timeout=120, check=True).stdout.split()))
    if not ids:
        return set()
    # an image removed meanwhile makes inspect exit 1 but still print the others
    r = conn.run(["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", *ids],
                 timeout=120)
    chains: set[str] = set()
    for line in r.stdout.splitlines():
        try:
            chains.update(chain_ids(json.loads(line) or []))
        except ValueError:
            continue
    return chains


def _is_id(ref: str, image_id: str) -> bool:
    """True when ``ref`` names the image by (a prefix of) its ID rather than by a tag."""
    short = ref.removeprefix("sha256:")
    return len(short) >= 4 and image_id.removeprefix("sha256:").startswith(short)


def _tag(conn, image: SourceImage) -> None:
    if not _is_id(image.ref, image.id):
        conn.run(["docker", "tag", image.id, image.ref], timeout=120, check=True)


def _loaded_id(stdout: str) -> str | None:
    m = re.search(r"Loaded image ID: (sha256:[0-9a-f]{64})", stdout)
    return m.group(1) if m else None


_SEND_ERRORS = (OSError, EOFError, paramiko.SSHException)
QUEUE_DEPTH = 8  # chunks (2 MB each) buffered per node of a shared save stream
START_TIMEOUT = 300.0  # s a node of a batch may take to begin reading the shared save
_END = object()


class SharedSave:
    """One ``docker save`` stream, read once, handed to every node of a batch.

    A save costs the engine a full export of the image (9-14 s for the 1.3 GB cpu
    image here, even when a node then needs one small layer), so nodes pushed
    together share one instead of each starting its own.  Each node reads the
    chunks through its own bounded queue (memory stays at QUEUE_DEPTH chunks per
    node); the slowest node sets the pace of its batch.  A node that stops
    (failed) is detached and no longer waited for.
    """

    def __init__(self, client, image_id: str, names: Iterable[str]) -> None:
        self._queues = {n: queue.Queue(QUEUE_DEPTH) for n in names}
        self._detached: set[str] = set()
        self._started: set[str] = set()
        self._thread = threading.Thread(target=self._produce, args=(client, image_id),
                                        name="docker-save", daemon=True)
        self._thread.start()

    def _produce(self, client, image_id: str) -> None:
        end: object = _END
        try:
            stream = client.api.get_image(image_id)
            try:
                for chunk in stream:
                    if not self._put(chunk):
                        return  # every node stopped
            finally:
                stream.close()
        except Exception as e:  # noqa: BLE001 - handed to every node as its stream error
            end = e
        self._put(end)

    def _put(self, item) -> bool:
        live = False
        for name, q in self._queues.items():
            waited = 0.0
            while name not in self._detached:
                try:
                    q.put(item, timeout=0.5)
                    live = True
                    break
                except queue.Full:
                    waited += 0.5
                    if name not in self._started and waited >= START_TIMEOUT:
                        self.detach(name)  # its node never began reading (lost before start)
        return live

    def chunks(self, name: str) -> Iterator[bytes]:
        """The save stream as node ``name`` sees it (StreamError when the save failed)."""
        q = self._queues[name]
        self._started.add(name)
        while (item := q.get()) is not _END:
            if isinstance(item, Exception):
                raise StreamError(f"docker save failed: {item}")
            yield item

    def detach(self, name: str) -> None:
        """Node ``name`` reads no more (done or failed): stop feeding it."""
        self._detached.add(name)

    def close(self) -> None:
        self._detached.update(self._queues)
        self._thread.join(timeout=30)


@dataclass
class _Plan:
    result: PushResult
    send: set[str] | None  # diff IDs to send; None: nothing to send (skipped)
    start: float
    stats: FilterStats = field(default_factory=FilterStats)


def _finish(plan: _Plan, progress: PushProgress) -> PushResult:
    result = plan.result
    result.bytes_sent = plan.stats.bytes_out
    result.layers_sent = plan.stats.layers_sent
    result.seconds = time.monotonic() - plan.start
    progress.finished(result)
    return result


def _failed(plan: _Plan, e: Exception) -> None:
    reason = e.reason if isinstance(e, NodeError) else f"local Docker engine: {e}"
    plan.result.status, plan.result.error = "failed", reason


def plan_node(conn, image: SourceImage, progress: PushProgress) -> _Plan:
    """Decide what a node needs: nothing (same ID: tag it, done) or which layers."""
    total = len(image.diff_ids)
    plan = _Plan(PushResult(conn.name, "failed", layers_total=total), None, time.monotonic())
    try:
        if node_has_image(conn, image.id):
            plan.result.status = "skipped"
            progress.started(conn.name, "skip: same image ID")
            _tag(conn, image)
            _finish(plan, progress)
            return plan
        present = node_chain_ids(conn)
        missing = [i for i, c in enumerate(image.chain_ids) if c not in present]
        plan.result.status = "full" if len(missing) == total else "layers"
        plan.send = {image.diff_ids[i] for i in missing}
        progress.started(conn.name, f"{len(missing)} of {total} layers")
    except (NodeError, DockerException) as e:
        _failed(plan, e)
        _finish(plan, progress)
    return plan


def deliver(conn, image: SourceImage, plan: _Plan, source: SharedSave,
            layout: dict[str, str] | None, progress: PushProgress) -> PushResult:
    """Stream the missing layers into ``docker load`` on the node, verify the ID, tag it."""
    try:
        _stream_to_node(conn, image, plan, source, layout, progress)
        if not node_has_image(conn, image.id):
            raise NodeError(conn.name, f"image {image.id} is not on the node after docker load")
        _tag(conn, image)
    except (NodeError, DockerException) as e:
        _failed(plan, e)
    finally:
        source.detach(conn.name)
    if plan.result.ok and layout is None and "manifest.json" in plan.stats.small:
        store_layout(image, layout_from_metadata(plan.stats.small, image))
    return _finish(plan, progress)


def _stream_to_node(conn, image: SourceImage, plan: _Plan, source: SharedSave,
                    layout: dict[str, str] | None, progress: PushProgress) -> None:
    """Pipe the filtered save stream into ``docker load`` on the node; NodeError on failure."""
    argv = ["docker", "load"]
    chan = conn.exec_channel(argv)
    broken: BaseException | None = None
    try:
        for piece in filter_save_stream(source.chunks(conn.name), image, plan.send or set(),
                                        layout=layout, stats=plan.stats):
            chan.sendall(piece)
            progress.sent(conn.name, len(piece))
    except _SEND_ERRORS as e:
        broken = e  # the node's side went away; its exit status says why
    except StreamError as e:
        chan.close()
        raise NodeError(conn.name, f"the local image stream broke: {e}") from None
    result = conn.wait_channel(chan, argv)
    if not result.ok:
        result.check()
    if broken is not None:
        raise NodeError(conn.name, f"sending the image failed: {broken}")
    loaded = _loaded_id(result.stdout)
    if loaded != image.id:
        raise NodeError(conn.name, f"docker load produced image {loaded or '(no ID printed)'}, "
                        f"not {image.id}")


def push_to_node(conn, client, image: SourceImage, *, layout: dict[str, str] | None = None,
                 progress: PushProgress | None = None) -> PushResult:
    """Bring ``image`` to one node: skip, send the missing layers, or send it whole; verify."""
    progress = progress or _NoProgress()
    plan = plan_node(conn, image, progress)
    if plan.send is None:  # skipped, or failed while planning
        return plan.result
    source = SharedSave(client, image.id, [conn.name])
    try:
        return deliver(conn, image, plan, source, layout, progress)
    finally:
        source.close()


# --------------------------------------------------------------------------- all nodes

def push_image(image_ref: str, target, *, progress: PushProgress | None = None,
               client=None, nodes: Iterable | None = None, fanout: int | None = None,
               accept_new_host_keys: bool | None = None) -> list[PushResult]:
    """Put the local image ``image_ref`` on every node of ``target`` (a Cluster or an Inventory).

    Nodes run in parallel (the cluster's bounded fan-out); nodes streaming at
    the same time share one ``docker save`` (SharedSave); one node failing
    never stops the others. Results come back in inventory order; a failed
    node has ``status == "failed"`` and ``error``. UserError (exit 2) when the
    image is not in the local engine.
    """
    from clusterctl.cluster import engine
    from clusterctl.cluster.transport import Cluster

    client = client or engine.client()
    image = source_image(client, image_ref)
    progress = progress or _NoProgress()
    if isinstance(target, Cluster):
        return _push_all(target, client, image, progress, nodes)
    with Cluster(target, fanout=fanout, accept_new_host_keys=accept_new_host_keys) as cluster:
        return _push_all(cluster, client, image, progress, nodes)


def _push_all(cluster, client, image, progress, nodes) -> list[PushResult]:
    plans = cluster.map(lambda conn: plan_node(conn, image, progress), nodes)
    results: dict[str, PushResult] = {}
    streaming: list[str] = []
    for name, plan in plans.items():
        if isinstance(plan, NodeError):  # never reached plan_node (e.g. unreachable)
            results[name] = PushResult(name, "failed", layers_total=len(image.diff_ids),
                                       error=plan.reason)
            progress.finished(results[name])
        else:
            results[name] = plan.result
            if plan.send is not None:
                streaming.append(name)
    layout = layout_for(client, image) if streaming else None  # a first pass only if needed
    batch_size = cluster.settings.fanout
    for first in range(0, len(streaming), batch_size):
        batch = [n for n in streaming[first:first + batch_size]
                 if _still_connected(cluster, plans[n], progress)]
        if not batch:
            continue
        source = SharedSave(client, image.id, batch)
        try:
            done = cluster.map(lambda conn, source=source: deliver(
                conn, image, plans[conn.name], source, layout, progress), batch)
        finally:
            source.close()
        for name, value in done.items():
            if isinstance(value, NodeError):  # the connection broke outside deliver
                plan = plans[name]
                _failed(plan, value)
                value = _finish(plan, progress)
            results[name] = value
    return [results[name] for name in plans]


def _still_connected(cluster, plan: _Plan, progress: PushProgress) -> bool:
    """Reopen a node's connection before its batch starts: a node lost between planning
    and sending must not hold up the batch's shared save. A lost one is finished as failed."""
    try:
        cluster.connection(plan.result.node)
        return True
    except NodeError as e:
        _failed(plan, e)
        _finish(plan, progress)
        return False
