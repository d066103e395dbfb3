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
* :func:`node_state` - one command: the node has the image (tagged now), or its chain IDs,
  and whether it has zstd;
  :func:`node_has_image`, :func:`node_chain_ids` - the same facts one at a time;
* :func:`confirm_on_node` - after the load: the image is there, tagged;
* :func:`load_failure` - a failed ``docker load`` in the user's terms: the node's
  daemon stopped during it, or its disk is full (and where), else docker's words.

A node failing is a result (``status == "failed"`` with the node's own
words), never an exception: the other nodes carry on.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import paramiko

from clusterctl.cluster.distribute.imagesource import LAYER_STORE, pick_source
from clusterctl.cluster.distribute.layerfilter import FilterStats, filter_save_stream
from clusterctl.cluster.distribute.layout import layout_from_metadata, store_layout
from clusterctl.cluster.distribute.savestream import SharedSave
from clusterctl.cluster.distribute.source import SourceImage, chain_ids
from clusterctl.cluster.distribute.tarstream import StreamError
from clusterctl.cluster.runtime import runtime_of
from clusterctl.core.errors import NodeError
from clusterctl.core.scripts import script_text

if TYPE_CHECKING:
    from docker import DockerClient

    from clusterctl.cluster.transport import NodeConnection

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
    read_from: str = ""    # where the head read the image: "layer store (...)" / "docker save (why)"
    refed_after: str = ""  # relay: the node whose failure cut this one off (it was fed again)

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
    zstd: bool = False  # the node has zstd (a compressed relay needs it on every node)

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

def node_has_image(conn: NodeConnection, image_id: str) -> bool:
    """True when the node's engine holds an image with exactly this ID."""
    r = conn.run(runtime_of(conn).image_inspect([image_id], format="{{.Id}}"), timeout=120)
    if r.ok:
        return r.stdout.strip() == image_id
    if runtime_of(conn).is_missing_image(r.stderr):
        return False
    r.check()  # docker missing, daemon down: a NodeError with the node's own words
    return False


def node_chain_ids(conn: NodeConnection) -> set[str]:
    """Every layer chain ID the node's engine has (via its images' RootFS layers)."""
    runtime = runtime_of(conn)
    ids = sorted(set(conn.run(runtime.image_ids(), timeout=120, check=True).stdout.split()))
    if not ids:
        return set()
    # an image removed meanwhile makes inspect exit 1 but still print the others
    r = conn.run(runtime.image_inspect(ids, format="{{json .RootFS.Layers}}"), timeout=120)
    chains: set[str] = set()
    for line in r.stdout.splitlines():
        try:
            chains.update(chain_ids(json.loads(line) or []))
        except ValueError:
            continue
    return chains


# One round trip to plan a node (each docker CLI start costs 0.1-0.3 s on a busy node):
# $1 the image ID, $2 the tag to give it ('' when pushed by ID).  Prints "have" (and tags it)
# when the engine has the image; else "lack" then every image's RootFS layers, one JSON list
# a line.  Any other docker failure: its words on stderr, its exit status.
PLAN_SCRIPT = script_text("clusterctl.cluster", "node-plan.sh")


def node_state(conn: NodeConnection, image: SourceImage) -> tuple[set[str] | None, bool]:
    """(None when the node has the image (then it is tagged too), else its layer chain IDs;
    whether the node has ``zstd``, which a compressed relay needs on every node)."""
    tag = "" if _is_id(image.ref, image.id) else image.ref
    r = conn.run(["sh", "-c", runtime_of(conn).script(PLAN_SCRIPT), "clusterctl-push-plan", image.id, tag],
                 timeout=120, check=True)
    first, _, rest = r.stdout.partition("\n")
    if first.strip() == "have":
        return None, False
    if first.split()[:1] != ["lack"]:
        raise NodeError(conn.name, f"unexpected answer while planning the push: {r.stdout[:200]!r}")
    chains: set[str] = set()
    for line in rest.splitlines():
        try:
            chains.update(chain_ids(json.loads(line) or []))
        except ValueError:
            continue
    return chains, "zstd" in first.split()[1:]


def confirm_on_node(conn: NodeConnection, image: SourceImage) -> None:
    """After a load that printed the source's ID: the image is there (tagging it proves it,
    one command; by ID, an inspect does); NodeError otherwise."""
    if _is_id(image.ref, image.id):
        if not node_has_image(conn, image.id):
            raise NodeError(conn.name, f"image {image.id} is not on the node after docker load")
        return
    r = conn.run(runtime_of(conn).tag(image.id, image.ref), timeout=120)
    if r.ok:
        return
    if runtime_of(conn).is_missing_image(r.stderr):
        raise NodeError(conn.name, f"image {image.id} is not on the node after docker load")
    r.check()


def tag_for(image: SourceImage) -> str:
    """The tag a loaded copy must get: the image's ref, or '' when it was pushed by ID."""
    return "" if _is_id(image.ref, image.id) else image.ref


def _is_id(ref: str, image_id: str) -> bool:
    """True when ``ref`` names the image by (a prefix of) its ID rather than by a tag."""
    short = ref.removeprefix("sha256:")
    return len(short) >= 4 and image_id.removeprefix("sha256:").startswith(short)


def tag_on_node(conn: NodeConnection, image: SourceImage) -> None:
    """Give the node's copy the source's tag (nothing to do when pushed by ID)."""
    if not _is_id(image.ref, image.id):
        conn.run(runtime_of(conn).tag(image.id, image.ref), timeout=120, check=True)


#: what the docker CLI says when its daemon goes away under it (killed, stopped, restarted)
#: (not "unexpected EOF": a truncated input stream says that too, with the daemon fine)
_DAEMON_GONE = re.compile(r"(error during connect|cannot connect to the docker daemon|"
                          r"is the docker daemon running|connection reset by peer|"
                          r"use of closed network connection)", re.I)
_NO_SPACE = re.compile(r"no space left on device", re.I)


def _daemon_answers(conn: NodeConnection) -> bool:
    try:
        return conn.run(runtime_of(conn).version(), timeout=30).ok
    except NodeError:
        return False


def _data_root(conn: NodeConnection) -> str | None:
    try:
        r = conn.run(runtime_of(conn).info("{{.DockerRootDir}}"), timeout=30)
    except NodeError:
        return None
    return r.stdout.strip() if r.ok and r.stdout.strip() else None


def load_failure(conn: NodeConnection, exit_code: int, stderr: str) -> NodeError:
    """Why ``docker load`` failed on the node, as a NodeError a user can act on.

    Disk full: docker's ENOSPC, with the daemon's data root to free space in.
    Daemon stopped: the CLI lost its daemon mid-load (or none answers now).
    Asks the node (``docker version``/``docker info``) only once a load failed."""
    words = " ".join(stderr.split())
    if len(words) > 300:
        words = "..." + words[-300:]
    said = f" (docker load exited {exit_code}: {words or 'no message'})"
    if _NO_SPACE.search(stderr):
        root = _data_root(conn)
        where = f" in the docker data root {root}" if root else ""
        return NodeError(conn.name, f"no space left on device{where} during docker load; free "
                         f"space there and push again{said}")
    if _DAEMON_GONE.search(stderr) or not _daemon_answers(conn):
        now = "it answers again now" if _daemon_answers(conn) else "it is not running now"
        return NodeError(conn.name, f"docker daemon stopped during docker load ({now}); start "
                         f"it and push again{said}")
    return NodeError(conn.name, f"docker load exited {exit_code}: {words or 'no message'}")


def _loaded_id(stdout: str) -> str | None:
    m = re.search(r"Loaded image(?: ID)?: (sha256:[0-9a-f]{64})", stdout)  # Podman: no "ID"
    return m.group(1) if m else None


# --------------------------------------------------------------------------- plan, deliver

def plan_node(conn: NodeConnection, image: SourceImage, progress: PushProgress) -> NodePlan:
    """Decide what a node needs: nothing (same ID: tag it, done) or which layers."""
    total = len(image.diff_ids)
    plan = NodePlan(PushResult(conn.name, "failed", layers_total=total), None, time.monotonic())
    try:
        present, plan.zstd = node_state(conn, image)
        if present is None:
            plan.result.status = "skipped"
            progress.started(conn.name, "skip: same image ID")
            plan.finish(progress)
            return plan
        missing = [i for i, c in enumerate(image.chain_ids) if c not in present]
        plan.result.status = "full" if len(missing) == total else "layers"
        plan.send = {image.diff_ids[i] for i in missing}
        progress.started(conn.name, f"{len(missing)} of {total} layers")
    except NodeError as e:
        plan.fail(e)
        plan.finish(progress)
    return plan


def deliver(conn: NodeConnection, image: SourceImage, plan: NodePlan, source: SharedSave,
            layout: dict[str, str] | None, progress: PushProgress) -> PushResult:
    """Stream the missing layers into ``docker load`` on the node, verify the ID, tag it."""
    try:
        _stream_to_node(conn, image, plan, source, layout, progress)
        confirm_on_node(conn, image)
    except NodeError as e:
        plan.fail(e)
    finally:
        source.detach(conn.name)
    if plan.result.ok and layout is None and "manifest.json" in plan.stats.small:
        store_layout(image, layout_from_metadata(plan.stats.small, image))
    return plan.finish(progress)


def _stream_to_node(conn: NodeConnection, image: SourceImage, plan: NodePlan, source: SharedSave,
                    layout: dict[str, str] | None, progress: PushProgress) -> None:
    """Pipe the filtered save stream into ``docker load`` on the node; NodeError on failure."""
    argv = runtime_of(conn).load()
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
        raise load_failure(conn, result.exit_code, result.stderr)
    if broken is not None:
        raise NodeError(conn.name, f"sending the image failed: {broken}")
    loaded = _loaded_id(result.stdout)
    if loaded != image.id:
        raise NodeError(conn.name, f"docker load produced image {loaded or '(no ID printed)'}, "
                        f"not {image.id}")


def push_to_node(conn: NodeConnection, client: DockerClient, image: SourceImage, *,
                 layout: dict[str, str] | None = None, progress: PushProgress | None = None
                 ) -> PushResult:
    """Bring ``image`` to one node: skip, send the missing layers, or send it whole; verify."""
    progress = progress or NoProgress()
    plan = plan_node(conn, image, progress)
    if plan.send is None:  # skipped, or failed while planning
        return plan.result
    source = pick_source(client, image, plan.send)
    plan.result.read_from = source.describe
    if source.kind == LAYER_STORE or layout is None:
        layout = source.layout
    shared = source.shared([conn.name])
    try:
        return deliver(conn, image, plan, shared, layout, progress)
    finally:
        shared.close()
