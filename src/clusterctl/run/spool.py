"""Containers' output on this machine's disk while it is merged by time.

One job: ``Spool`` keeps, per node, the ``(timestamp key, text)`` lines that
``docker logs --timestamps`` gave, in a private temporary directory, and merges the nodes
by time as a stream (``heapq.merge``; each node's lines keep their own order).  ``stop`` and
``clusterctl logs`` from the nodes go through it, so their memory does not grow with the
output: a run that wrote gigabytes is read, saved to ``runs/`` and shown a line at a time.
The directory is removed when the spool closes (a ``with`` block).
"""

from __future__ import annotations

import heapq
import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TextIO


class Spool:
    """Per-node line files (see the module docstring).  ``writer(node)`` gives the callback
    one node's fetch calls with each ``(key, text)``; writes after ``close`` (a fetch that
    outlived its deadline) are dropped."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="clusterctl-logs-"))
        self._files: dict[str, TextIO] = {}
        self._paths: dict[str, Path] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def writer(self, node: str) -> Callable[[str, str], None]:
        with self._lock:
            path = self.dir / f"{len(self._paths)}.jsonl"   # not the node's name: any name is safe
            self._paths[node] = path
            f = self._files[node] = open(path, "w", encoding="utf-8")  # noqa: SIM115

        def write(key: str, text: str) -> None:
            with self._lock:
                if not self._closed and not f.closed:
                    f.write(json.dumps([key, text], ensure_ascii=False) + "\n")
        return write

    def _finish_writing(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()

    def lines(self, node: str) -> Iterator[tuple[str, str]]:
        """(key, text) of one node, in the order they came."""
        self._finish_writing()
        path = self._paths.get(node)
        if path is None or not path.exists():
            return
        with open(path, encoding="utf-8") as f:
            for raw in f:
                key, text = json.loads(raw)
                yield key, text

    def texts(self, node: str) -> Iterator[str]:
        return (text for _, text in self.lines(node))

    def merged(self, nodes: Iterable[str]) -> Iterator[tuple[str, str]]:
        """(node, text) of ``nodes``, merged by timestamp (ties: by node name)."""
        def keyed(node: str) -> Iterator[tuple[str, str, str]]:
            for key, text in self.lines(node):
                yield key, node, text
        streams = [keyed(node) for node in nodes]
        for _, node, text in heapq.merge(*streams, key=lambda x: (x[0], x[1])):
            yield node, text

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for f in self._files.values():
                f.close()
        shutil.rmtree(self.dir, ignore_errors=True)
