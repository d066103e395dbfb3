"""Push the image to every node of a cluster: plan all, then stream in batches sharing one save.

One job: the many-node push.  Contract: :func:`push_image` - the local image
onto every node of a Cluster or an Inventory; results in inventory order, a
failed node being a result, never an exception.

Every node is planned first (in parallel, the cluster's bounded fan-out);
nodes that need layers are then streamed to in batches of ``fanout`` (or
relayed), each batch reading ONE stream (SharedSave) from the source
:func:`~clusterctl.cluster.distribute.imagesource.pick_source` chose: the
engine's layer store, which reads only the layers some node lacks, else
``docker save`` (a full export whatever a node then needs; the layout first
pass for OCI engines runs only then).  A store layer that does not verify
against its diff ID fails its stream before the layer is complete, and the
nodes it failed are pushed again from ``docker save``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from clusterctl.cluster import engine
from clusterctl.cluster.distribute import trace
from clusterctl.cluster.distribute.imagesource import ImageSource, pick_source
from clusterctl.cluster.distribute.layerfilter import FilterStats
from clusterctl.cluster.distribute.node import (
    NodePlan,
    NoProgress,
    PushProgress,
    PushResult,
    deliver,
    plan_node,
)
from clusterctl.cluster.distribute.relay import relay_push
from clusterctl.cluster.distribute.relayplan import choose_strategy
from clusterctl.cluster.distribute.source import SourceImage, source_image
from clusterctl.cluster.transport import Cluster
from clusterctl.core.errors import NodeError
from clusterctl.core.files import one_at_a_time
from clusterctl.core.paths import cache_dir

if TYPE_CHECKING:
    from docker import DockerClient


def push_image(image_ref: str, target, *, progress: PushProgress | None = None,
               client: DockerClient | None = None, nodes: Iterable | None = None, fanout: int | None = None,
               accept_new_host_keys: bool | None = None, strategy: str = "auto",
               compress: bool | None = False) -> list[PushResult]:
    """Put the local image ``image_ref`` on every node of ``target`` (a Cluster or an Inventory).

    Nodes run in parallel (the cluster's bounded fan-out); nodes streaming at
    the same time share one ``docker save`` (SharedSave); one node failing
    never stops the others. Results come back in inventory order; a failed
    node has ``status == "failed"`` and ``error``. UserError (exit 2) when the
    image is not in the local engine.
    """
    trace.begin(f"{image_ref} strategy={strategy} compress={compress}")
    client = client or engine.client()
    image = source_image(client, image_ref)
    progress = progress or NoProgress()
    if isinstance(target, Cluster):
        with _one_push_of(image, target, nodes, progress):
            return _push_all(target, client, image, progress, nodes, strategy, compress)
    with Cluster(target, fanout=fanout, accept_new_host_keys=accept_new_host_keys) as cluster, \
            _one_push_of(image, cluster, nodes, progress):
        return _push_all(cluster, client, image, progress, nodes, strategy, compress)


def _one_push_of(image: SourceImage, cluster: Cluster, nodes: Iterable | None, progress: PushProgress):
    """One push of an image from this machine at a time (two people, or a push and a launch,
    putting the same image on the same nodes): the second waits for the first, says so on
    every node's progress line, and then finds the nodes that got it (the plan is made
    after the wait) and sends nothing to them.  Two pushes at once would both succeed
    (``docker load`` of the same layers is safe), but each would send the whole image."""
    names = [n.name for n in cluster.nodes] if nodes is None else [str(n) for n in nodes]

    lock = cache_dir() / "push" / f"{image.id.removeprefix('sha256:')}.lock"

    def waiting(_why: str) -> None:
        for name in names:
            progress.started(name, f"waiting for another push of this image from this machine "
                                   f"to end ({lock})")

    return one_at_a_time(lock, waiting, "push")


def _push_all(cluster: Cluster, client: DockerClient, image: SourceImage, progress: PushProgress,
              nodes: Iterable | None, strategy: str = "star",
              compress: bool | None = False) -> list[PushResult]:
    plans = cluster.map(lambda conn: _traced(conn.name, "plan", plan_node, conn, image, progress),
                        nodes)
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
    if not streaming:
        return [results[name] for name in plans]
    # read only the layers some node lacks (the layer store), else one docker save per batch
    source = pick_source(client, image, set().union(*(plans[n].send or set() for n in streaming)))
    statuses = {name: plans[name].result.status for name in streaming}
    results.update(_stream(cluster, client, image, plans, streaming, source, progress,
                           strategy, compress))
    if source.mismatch is not None:  # a layer from the store did not verify: save, once
        again = [n for n in streaming if not results[n].ok]
        source = source.fallback()
        for name in again:
            plan = plans[name]
            plan.result.status, plan.result.error = statuses[name], None
            plan.result.source, plan.stats = "head", FilterStats()
            progress.started(name, f"again from {source.describe}")
        results.update(_stream(cluster, client, image, plans, again, source, progress,
                               strategy, compress))
    return [results[name] for name in plans]


def _traced(node: str, phase: str, fn, *args):
    trace.mark(node, f"{phase}-start")
    try:
        return fn(*args)
    finally:
        trace.mark(node, f"{phase}-end")


def _stream(cluster: Cluster, client: DockerClient, image: SourceImage, plans: dict[str, NodePlan],
            streaming: list[str], source: ImageSource, progress: PushProgress,
            strategy: str, compress: bool | None) -> dict[str, PushResult]:
    """Send every node in ``streaming`` what it lacks from ``source``, star or relay."""
    results: dict[str, PushResult] = {}
    for name in streaming:
        plans[name].result.read_from = source.describe
    layout = source.layout
    keys = {n.name: getattr(n, "identity_file", None) for n in cluster.nodes}
    sizes = [source.bytes_for(plans[name].send) for name in streaming]
    star_bytes = None if None in sizes else sum(sizes)
    if choose_strategy(strategy, streaming, star_bytes) == "relay" and \
            _relay_possible(streaming, keys, progress):
        return relay_push(cluster, client, image, plans, streaming, layout, progress,
                          compress=compress, shared=source.shared,
                          open_stream=source.open_stream)
    batch_size = cluster.settings.fanout
    for first in range(0, len(streaming), batch_size):
        batch = [n for n in streaming[first:first + batch_size]
                 if _still_connected(cluster, plans[n], progress)]
        if not batch:
            continue
        shared = source.shared(batch)
        try:
            done = cluster.map(lambda conn, shared=shared: deliver(
                conn, image, plans[conn.name], shared, layout, progress), batch)
        finally:
            shared.close()
        for name, value in done.items():
            if isinstance(value, NodeError):  # the connection broke outside deliver
                plan = plans[name]
                plan.fail(value)
                value = plan.finish(progress)
            results[name] = value
    for name in streaming:
        if name not in results and plans[name].result.status == "failed":
            results[name] = plans[name].result  # lost before its batch started
    return results


def _relay_possible(streaming: list[str], keys: dict, progress: PushProgress) -> bool:
    """Relay hops log in with the fed node's inventory key (see ``agent``): without an
    ``identity_file`` for every node that needs the image, the push is a star (and says so)."""
    missing = [n for n in streaming if not keys.get(n)]
    for name in missing:
        progress.started(name, "star: relay needs an identity_file for this node in the inventory")
    return not missing


def _still_connected(cluster: Cluster, plan: NodePlan, progress: PushProgress) -> bool:
    """Reopen a node's connection before its batch starts: a node lost between planning
    and sending must not hold up the batch's shared save. A lost one is finished as failed."""
    try:
        cluster.connection(plan.result.node)
        return True
    except NodeError as e:
        plan.fail(e)
        plan.finish(progress)
        return False
