"""Push the image to one node: skip it by ID, or stream the layers it lacks; verify, tag.

One job: everything a push does on one node's engine, over that node's SSH
connection.  Contract:

* :func:`push_to_node` - the whole push to one node, with its own save;
* :func:`plan_node` then :func:`deliver` - the same in two steps, so the
  fan-out can plan every node first and stream to several through one
  :class:`~clusterctl.cluster.distribute.savestream.SharedSave`;
* :class:`PushResult` - how the image got to the node;
* :class:`PushProgress` - the events a caller (the CLI's display) receives,
  from worker threads; :class:`NoProgress` ignores them;
* :func:`node_has_image`, :func:`node_chain_ids` - what the node's engine holds.

A node failing is a result (``status == "failed"`` with the node's own
words), never an exception: the other nodes carry on.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Protocol

import paramiko

from clusterctl.cluster.distribute.layerfilter import FilterStats, filter_save_stream
from clusterctl.cluster.distribute.layout import layout_from_metadata, store_layout
from clusterctl.cluster.distribute.savestream import SharedSave
from clusterctl.cluster.distribute.source import SourceImage, chain_ids
from clusterctl.cluster.distribute.tarstream import StreamError
from clusterctl.core.errors import NodeError

_SEND_ERRORS = (OSError, EOFError, paramiko.SSHException)


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
    source: str = "head"  # where the node's bytes came from: "head" or the feeding node's name
    head_bytes: int = 0   # bytes the head sent for this node (0 when fed by another node)
    compression: str = ""  # relay: "zstd (why)" / "none (why)"

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


class NoProgress:
    """A PushProgress that ignores every event (library callers that show nothing)."""

    def started(self, node: str, plan: str) -> None:
        pass

    def sent(self, node: str, nbytes: int) -> None:
        pass

    def finished(self, result: PushResult) -> None:
        pass


@dataclass
class NodePlan:
    """What one node needs, and then how its push went."""

    result: PushResult
    send: set[str] | None  # diff IDs to send; None: nothing to send (skipped, or failed)
    start: float
    stats: FilterStats = field(default_factory=FilterStats)

    def fail(self, e: NodeError) -> None:
        self.result.status, self.result.error = "failed", e.reason

    def finish(self, progress: PushProgress) -> PushResult:
        """Fill in the result from what was streamed, and report it."""
        result = self.result
        result.bytes_sent = self.stats.bytes_out
        result.head_bytes = self.stats.bytes_out
        result.layers_sent = self.stats.layers_sent
        result.seconds = time.monotonic() - self.start
        progress.finished(result)
        return result


# --------------------------------------------------------------------------- the node's engine

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


def tag_on_node(conn, image: SourceImage) -> None:
    """Give the node's copy the source's tag (nothing to do when pushed by ID)."""
    if not _is_id(image.ref, image.id):
        conn.run(["docker", "tag", image.id, image.ref], timeout=120, check=True)


def _loaded_id(stdout: str) -> str | None:
    m = re.search(r"Loaded image ID: (sha256:[0-9a-f]{64})", stdout)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- plan, deliver

def plan_node(conn, image: SourceImage, progress: PushProgress) -> NodePlan:
    """Decide what a node needs: nothing (same ID: tag it, done) or which layers."""
    total = len(image.diff_ids)
    plan = NodePlan(PushResult(conn.name, "failed", layers_total=total), None, time.monotonic())
    try:
        if node_has_image(conn, image.id):
            plan.result.status = "skipped"
            progress.started(conn.name, "skip: same image ID")
            tag_on_node(conn, image)
            plan.finish(progress)
            return plan
        present = node_chain_ids(conn)
        missing = [i for i, c in enumerate(image.chain_ids) if c not in present]
        plan.result.status = "full" if len(missing) == total else "layers"
        plan.send = {image.diff_ids[i] for i in missing}
        progress.started(conn.name, f"{len(missing)} of {total} layers")
    except NodeError as e:
        plan.fail(e)
        plan.finish(progress)
    return plan


def deliver(conn, image: SourceImage, plan: NodePlan, source: SharedSave,
            layout: dict[str, str] | None, progress: PushProgress) -> PushResult:
    """Stream the missing layers into ``docker load`` on the node, verify the ID, tag it."""
    try:
        _stream_to_node(conn, image, plan, source, layout, progress)
        if not node_has_image(conn, image.id):
            raise NodeError(conn.name, f"image {image.id} is not on the node after docker load")
        tag_on_node(conn, image)
    except NodeError as e:
        plan.fail(e)
    finally:
        source.detach(conn.name)
    if plan.result.ok and layout is None and "manifest.json" in plan.stats.small:
        store_layout(image, layout_from_metadata(plan.stats.small, image))
    return plan.finish(progress)


def _stream_to_node(conn, image: SourceImage, plan: NodePlan, source: SharedSave,
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
    progress = progress or NoProgress()
    plan = plan_node(conn, image, progress)
    if plan.send is None:  # skipped, or failed while planning
        return plan.result
    source = SharedSave(client, image.id, [conn.name])
    try:
        return deliver(conn, image, plan, source, layout, progress)
    finally:
        source.close()
