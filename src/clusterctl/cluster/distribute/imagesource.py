"""Where a push reads the image from: the engine's layer store, else ``docker save``.

One job: choose the source and hand out its streams.  Contract:

* :func:`pick_source` - an :class:`ImageSource` for the layers some node
  lacks: the layer store when it can serve them (overlay2, readable here,
  every file present), else ``docker save``; ``describe`` says which and why;
* :meth:`ImageSource.shared` - a
  :class:`~clusterctl.cluster.distribute.savestream.SharedSave` over the
  source's stream for a batch of nodes; :attr:`ImageSource.layout` - the
  member layout the layer filter cuts it by;
* :meth:`ImageSource.fallback` - the ``docker save`` source, after a layer
  from the store did not verify (:attr:`ImageSource.mismatch`).

``docker save`` exports the whole image (9-14 s for the 1.3 GB cpu image
here) even when a node lacks one small layer; the layer store opens only the
layers to send, so a one-layer change reads one layer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from clusterctl.cluster.distribute.layerstore import LayerMismatch, StoreUnusable, open_store
from clusterctl.cluster.distribute.layout import layout_for
from clusterctl.cluster.distribute.savestream import SharedSave
from clusterctl.cluster.distribute.source import SourceImage
from clusterctl.cluster.distribute.storesave import archive, plan_archive

if TYPE_CHECKING:
    from docker import DockerClient

log = logging.getLogger(__name__)

LAYER_STORE = "layer store"
DOCKER_SAVE = "docker save"


class ImageSource:
    """One push's source of image bytes (``kind``: LAYER_STORE or DOCKER_SAVE)."""

    def __init__(self, client: DockerClient, image: SourceImage, kind: str, why: str, *,
                 layout: dict[str, str] | None = None, make_stream=None,
                 layer_bytes: dict[str, int] | None = None) -> None:
        self.client, self.image, self.kind, self.why = client, image, kind, why
        self.layout = layout
        #: diff ID -> bytes of its layer tar, for the layers this source serves (None: unknown
        #: before the stream, as with docker save)
        self.layer_bytes = layer_bytes
        self._make_stream = make_stream
        self.mismatch: str | None = None  # a store layer that did not verify

    @property
    def describe(self) -> str:
        return f"{self.kind} ({self.why})"

    def shared(self, names) -> SharedSave:
        if self._make_stream is None:
            return SharedSave(self.client, self.image.id, names)
        return SharedSave(self.client, self.image.id, names, open_stream=self._checked_stream)

    def open_stream(self):
        """The source's stream, once (for a sample: close it when done)."""
        if self._make_stream is None:
            return self.client.api.get_image(self.image.id)
        return self._checked_stream()

    def _checked_stream(self):
        try:
            yield from self._make_stream()
        except LayerMismatch as e:
            self.mismatch = str(e)
            log.warning("push source: %s; falling back to docker save", e)
            raise

    def bytes_for(self, send: set[str] | None) -> int | None:
        """Bytes of the layers in ``send`` (None when this source does not know them)."""
        if self.layer_bytes is None or send is None or not send <= self.layer_bytes.keys():
            return None
        return sum(self.layer_bytes[d] for d in send)

    def fallback(self) -> ImageSource:
        return save_source(self.client, self.image,
                           f"the layer store did not verify: {self.mismatch}")


def save_source(client: DockerClient, image: SourceImage, why: str) -> ImageSource:
    source = ImageSource(client, image, DOCKER_SAVE, why, layout=layout_for(client, image))
    log.debug("push source: %s", source.describe)
    return source


def pick_source(client: DockerClient, image: SourceImage, send: set[str]) -> ImageSource:
    """The layer store when it can serve every layer in ``send``, else ``docker save``."""
    try:
        store = open_store(client)
        config = store.config(image.id)
        plan = plan_archive(image, send)
        chains = image.chain_ids
        layers = {pos: store.layer(chains[pos], image.diff_ids[pos]) for _, pos in plan.layers}
    except StoreUnusable as e:
        return save_source(client, image, str(e))
    source = ImageSource(client, image, LAYER_STORE,
                         f"{len(plan.layers)} of {len(image.diff_ids)} layers read from {store.root}",
                         layout=plan.layout,
                         make_stream=lambda: archive(store, image, plan, config, layers),
                         layer_bytes={image.diff_ids[pos]: layer.size for pos, layer in layers.items()})
    log.debug("push source: %s", source.describe)
    return source
