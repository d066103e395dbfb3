"""Put a local image on every node: skip nodes that have it, send only the layers a node lacks.

There is no registry (FIELD-NOTES §1), so an image travels as a ``docker save``
stream from the local engine (or the same archive cut to the missing layers,
rebuilt from the engine's overlay2 layer store: see ``imagesource``), through one SSH exec channel per node, into the
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
* **Relayed.**  With ``strategy="relay"`` this machine streams once per group
  of nodes that lack the same layers, and each node forwards to the next
  while it receives (see ``relay``), so the head's uplink carries about S,
  not N x S.

Streaming, never a temporary file.  The save stream is rewritten block by
block (512-byte tar headers parsed here, every kept byte passed through
verbatim), so neither side ever holds the image on disk or in memory
(the nodes' and the engine's own dockerd may stage it; that is theirs).

The modules, from the top; each imports only modules below it (no cycles)::

    fanout       push_image: plan every node, then star (batches sharing one save) or relay
    relay        relay_push: chains of nodes forwarding while they receive, in rounds
    wire         compress on the wire or not, from a measurement of link and zstd
    relayplan    plan_relay (pure): which node feeds which; choose_strategy; after a failure,
                 cut_off and plan_refeed: which nodes are fed again, by whom
    node         one node: plan_node, deliver, push_to_node, PushResult, PushProgress
    imagesource  pick_source: read the layer store (only the layers to send), else docker save
    storesave    the load archive made from the layer store (plan_archive is pure)
    layerstore   open_store, LayerStore: moby's overlay2 layerdb, layers rebuilt and verified
    tarsplit     parse (pure): the tar-split entries that rebuild a layer tar byte for byte
    savestream   SharedSave: one stream (save or archive) read once, fed to several nodes
    layerfilter  filter_save_stream: cut the save stream to the missing layers
    layout       which member holds which layer (legacy v1 IDs, OCI); cache by image ID
    tarstream    walk a tar stream block by block (ChunkReader, members, Member)
    source       SourceImage, chain_ids, source_image: the image's facts
    trace        opt-in timeline of a push (CLUSTERCTL_PUSH_TRACE): node, phase, seconds

Progress goes to the caller through the :class:`PushProgress` protocol only
(the CLI's live display lives in ``clusterctl.cli.push``); the library prints
nothing.  Importing the package does not import the docker SDK: the client
that callers pass (or :func:`clusterctl.cluster.engine.client`) brings it.

Measured here (2 cores, the 1.3 GB cpu image, docker 20.10): a ``docker
save`` pass alone takes 9-14 s on an idle machine (20-40 s when busy), about
as long as sending the image over one unshaped SSH stream (paramiko moved 146
MB/s, OpenSSH 200 MB/s), so a first pass on every push would nearly double
the cost of the one-changed-layer case; the v1-ID derivation and the tar
rewriting cost milliseconds per GB.  Hence the first pass only where the
format gives no other way, and then only once per image ID (see ``layout``).
For the same reason nodes pushed together share ONE save (:class:`SharedSave`)
instead of the engine exporting the image once per node.

``benchmarks/push.py``, unshaped, load ~3 (seconds for cold / warm / one 5 MB
layer changed; MB per node 1344 / 0 / 5.3): 1 node 36 / 0.4 / 13; 2 nodes
52 / 0.9 / 15; 4 nodes 123 / 1.4 / 21 (with the machine busy, load ~16:
85 / 1.3 / 37, 93 / 1.0 / 17, 167 / 3.6 / 32).  FIELD-NOTES saw 49 s for a
plain ``docker save | ssh | docker load`` to 2 nodes.  The changed-layer case
is bounded by the local engine exporting the whole image, not by the wire,
which carries 5.3 MB instead of 1344 MB per node; every node's sshd, dockerd
and ``docker load`` share the same 2 cores, hence the growth with node count.
Those figures predate the layer-store source: with it a one-layer change reads
that layer only (about 1-3 s star, 1 or 4 nodes, at load ~8; docs/benchmarks/push.md).
"""

from clusterctl.cluster.distribute.fanout import push_image
from clusterctl.cluster.distribute.imagesource import (
    DOCKER_SAVE,
    LAYER_STORE,
    ImageSource,
    pick_source,
)
from clusterctl.cluster.distribute.layerfilter import FilterStats, filter_save_stream
from clusterctl.cluster.distribute.layout import (
    LayerIndex,
    cached_layout,
    engine_writes_oci,
    layout_for,
    layout_from_metadata,
    legacy_layer_position,
    scan_layout,
    store_layout,
)
from clusterctl.cluster.distribute.node import (
    NodePlan,
    NoProgress,
    PushProgress,
    PushResult,
    deliver,
    node_chain_ids,
    node_has_image,
    plan_node,
    push_to_node,
)
from clusterctl.cluster.distribute.relay import relay_push
from clusterctl.cluster.distribute.relayplan import (
    RELAY_FROM_BYTES,
    RELAY_FROM_NODES,
    STRATEGIES,
    RelayPlan,
    choose_strategy,
    cut_off,
    failed_upstream,
    plan_refeed,
    plan_relay,
)
from clusterctl.cluster.distribute.savestream import SharedSave
from clusterctl.cluster.distribute.source import SourceImage, chain_ids, source_image
from clusterctl.cluster.distribute.tarstream import ChunkReader, Member, StreamError, members

__all__ = [
    "DOCKER_SAVE", "ImageSource", "LAYER_STORE", "pick_source",
    "ChunkReader", "FilterStats", "LayerIndex", "Member", "NoProgress", "NodePlan",
    "PushProgress", "PushResult", "RELAY_FROM_BYTES", "RELAY_FROM_NODES", "RelayPlan", "STRATEGIES", "SharedSave", "SourceImage", "StreamError",
    "cached_layout", "chain_ids", "choose_strategy", "cut_off", "failed_upstream", "plan_refeed", "plan_relay", "relay_push", "deliver", "engine_writes_oci", "filter_save_stream",
    "layout_for", "layout_from_metadata", "legacy_layer_position", "members",
    "node_chain_ids", "node_has_image", "plan_node", "push_image", "push_to_node",
    "scan_layout", "source_image", "store_layout",
]
