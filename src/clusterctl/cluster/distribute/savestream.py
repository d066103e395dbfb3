"""One ``docker save`` of the source image (or the layer store's archive), read once and fed
to every node streaming it.

One job: the local end of the wire.  Contract: :class:`SharedSave` -
``chunks(name)`` is the save stream as node ``name`` reads it (StreamError
when the save failed), ``detach(name)`` when that node reads no more,
``close()`` at the end.  Used for a single node too (``push_to_node``), so
both paths read the engine the same way.

A save costs the engine a full export of the image (9-14 s for the 1.3 GB
cpu image here, even when a node then needs one small layer), so nodes
pushed together share one instead of each starting its own.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from clusterctl.cluster.distribute.tarstream import StreamError

if TYPE_CHECKING:
    from docker import DockerClient

QUEUE_DEPTH = 8  # chunks (2 MB each) buffered per node of a shared save stream
START_TIMEOUT = 300.0  # s a node of a batch may take to begin reading the shared save
_END = object()


class SharedSave:
    """One ``docker save`` stream, read once, handed to every node of a batch.

    Each node reads the chunks through its own bounded queue (memory stays at
    QUEUE_DEPTH chunks per node); the slowest node sets the pace of its batch.
    A node that stops (failed) is detached and no longer waited for.
    """

    def __init__(self, client: DockerClient, image_id: str, names: Iterable[str], *,
                 open_stream: Callable[[], Iterator[bytes]] | None = None) -> None:
        self._queues = {n: queue.Queue(QUEUE_DEPTH) for n in names}
        self._detached: set[str] = set()
        self._started: set[str] = set()
        # the engine's save by default; the layer store's archive (imagesource) when given
        self._open = open_stream or (lambda: client.api.get_image(image_id))
        self._thread = threading.Thread(target=self._produce, args=(),
                                        name="docker-save", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        end: object = _END
        try:
            stream = self._open()
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
                raise item if isinstance(item, StreamError) else StreamError(f"docker save failed: {item}")
            yield item

    def detach(self, name: str) -> None:
        """Node ``name`` reads no more (done or failed): stop feeding it."""
        self._detached.add(name)

    def close(self) -> None:
        self._detached.update(self._queues)
        self._thread.join(timeout=30)
