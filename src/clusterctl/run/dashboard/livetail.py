"""A plain ``launch --detach`` run's output, followed from its nodes while a page asks for it.

A followed run (or a supervised detached one) has its merged output written to
``runs/<id>/merged.log`` as it goes; the dashboard reads that file.  A plain detached run is
followed by nobody, so its output stays in its containers' logs on the nodes until
``clusterctl logs`` or ``stop``.  For such a run - the caller's own, still live by its
record - the dashboard follows the containers itself, exactly as ``clusterctl logs -f``
does (:func:`~clusterctl.run.logs.live_containers`, one ``docker logs --follow`` per node
over SSH, the run's secrets masked), into memory only:

* nothing is written under ``runs/``: ``stop`` still keeps each node's whole output there
  (it keeps what no follower wrote, :func:`~clusterctl.run.logs.keep_stopped_output`);
* each node's stream starts from its last :data:`TAIL_LINES` lines, and the merged stream
  (and each node's) keeps its newest :data:`KEEP_BYTES` bytes: memory stays bounded
  however long the run prints;
* a run nobody asked about for :data:`IDLE_S` seconds is let go (its SSH connections
  closed); the next request follows it again.  At most :data:`MOST_RUNS` runs at once.

Offsets: a live tail's byte offsets count from :data:`BASE`, far past any file offset the page
could hold, and each tail started gets its own span (:data:`SPAN` apart), so a page that moves
between sources (the run is stopped and its files appear; the run is followed again after it
was let go; the dashboard restarted) is told to start again (``reset``), as it is when a file
shrank.

Contract: :class:`LiveTails` (``wanted(record)``, ``read(record, node, after=, limit=,
tail=)`` -> :class:`~clusterctl.run.dashboard.files.Lines`, ``close()``) and :class:`Ring`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.core.errors import ClusterctlError
from clusterctl.run import logs, records
from clusterctl.run.dashboard.files import Lines

#: Each node's stream starts from this many of its last lines (``docker logs --tail``).
TAIL_LINES = 2000
#: Bytes kept of the merged stream, and of each node's (the oldest lines go first).
KEEP_BYTES = 4 * 1024 * 1024
#: A run nobody asked about for this long is no longer followed.
IDLE_S = 120.0
#: Runs followed at once (the least recently asked about goes first).
MOST_RUNS = 8
#: Where live tails' offsets start, and how far apart each tail's start (see the docstring).
BASE = 1 << 50
SPAN = 1 << 40


def wanted(record: records.RunRecord) -> bool:
    """Whether the dashboard follows ``record``'s output from its nodes: a plain detached run
    over SSH (no supervisor writes its files), live by its record, and the caller's own (its
    nodes are reached with the caller's identity; another user's run shows its files only)."""
    return (record.detached and not record.supervised and record.scheduler == "ssh"
            and record.state in records.LIVE_STATES and records.owned_by(record))


class Ring:
    """Lines appended at one end, the oldest dropped past ``keep`` bytes; read by byte offset
    like a file that forgets its beginning (offsets from :data:`BASE`)."""

    def __init__(self, keep: int = KEEP_BYTES, base: int = BASE) -> None:
        self.keep = keep
        self.lines: deque[tuple[int, bytes]] = deque()   # (offset of the line, its bytes)
        self.start = self.end = base
        self._lock = threading.Lock()

    def append(self, text: str) -> None:
        data = (text + "\n").encode("utf-8", errors="replace")
        with self._lock:
            self.lines.append((self.end, data))
            self.end += len(data)
            while self.lines and self.end - self.lines[0][0] > self.keep and len(self.lines) > 1:
                self.lines.popleft()
            self.start = self.lines[0][0]

    def read(self, after: int | None, *, limit: int, tail: int) -> Lines:
        """Whole lines from offset ``after`` (at most about ``limit`` bytes, at least one
        line), or without it the last ``tail`` bytes' lines.  An offset this ring never gave
        (before what it keeps, or past its end) starts again from what it keeps (``reset``)."""
        with self._lock:
            reset = after is not None and not self.start <= after <= self.end
            if after is None:
                begin = max(self.start, self.end - tail)
            else:
                begin = self.start if reset else after
            out, size, first = [], 0, None
            for offset, data in self.lines:     # a deque of at most KEEP_BYTES of lines
                if offset < begin:
                    continue
                if out and size + len(data) > limit:
                    break
                first = offset if first is None else first
                out.append(data)
                size += len(data)
            start = self.end if first is None else first
            return Lines(start=start, next=start + size, size=self.end, reset=reset,
                         lines=[d[:-1].decode("utf-8", errors="replace").rstrip("\r") for d in out])


class _Tail:
    """One run followed: its merged ring and each node's, fed by one consumer thread."""

    def __init__(self, record: records.RunRecord, keep: int, *, base: int, idle: float,
                 clock: Callable[[], float]) -> None:
        self.record = record
        self.idle, self.clock = idle, clock
        self.merged = Ring(keep, base)
        self.nodes = {n.node: Ring(keep, base) for n in record.nodes}
        self.asked = clock()
        self.done = threading.Event()
        self._stop = threading.Event()
        self._cluster = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._follow, name=f"ui-tail-{record.run_id}",
                                       daemon=True)

    def _line(self, node: str, rank: int, text: str) -> None:
        self.merged.append(logs.prefix(node, rank) + text)
        if node in self.nodes:
            self.nodes[node].append(text)

    def _follow(self) -> None:
        record = self.record
        sink = logs.LogSink({n.node: n.rank for n in record.nodes})
        sink.observers.append(self._line)
        try:
            with self._lock:
                if self._stop.is_set():
                    return
                self._cluster = Cluster(load_inventory(records.inventory_path(record)))
            sources, unreachable = logs.live_containers(self._cluster, record)
            for node, why in unreachable.items():
                sink.write(node, f"[clusterctl] not answering ({why}): its output is not shown")
            if not sources and not unreachable:
                sink.write(record.nodes[0].node if record.nodes else "-",
                           "[clusterctl] no container of this run is left on its nodes; "
                           f"`clusterctl status {record.run_id}` records how it ended")
            # until every stream ends: the containers ended, or close() cut the connections
            # (the dashboard closed, or no page asked about the run for `idle` seconds)
            logs.follow_from_nodes(self._cluster, sources, sink, tail=TAIL_LINES,
                                   between=self._close_if_idle)
        except (ClusterctlError, OSError) as e:
            sink.write(record.nodes[0].node if record.nodes else "-",
                       f"[clusterctl] cannot follow this run's nodes: {e}")
        finally:
            with self._lock:
                cluster, self._cluster = self._cluster, None
            if cluster is not None:
                cluster.close()
            self.done.set()

    def _close_if_idle(self) -> None:
        if not self._stop.is_set() and self.clock() - self.asked > self.idle:
            self.close()

    def close(self) -> None:
        """Cut the run's connections; the consumer drains what its streams still put, then ends."""
        with self._lock:
            self._stop.set()
            cluster = self._cluster
        if cluster is not None:
            cluster.close()


class LiveTails:
    """The runs the dashboard follows from their nodes (see the module docstring)."""

    def __init__(self, *, keep: int = KEEP_BYTES, idle: float = IDLE_S, most: int = MOST_RUNS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.keep, self.idle, self.most, self.clock = keep, idle, most, clock
        self._tails: dict[str, _Tail] = {}
        self._started = 0
        self._lock = threading.Lock()

    wanted = staticmethod(wanted)

    def _tail(self, record: records.RunRecord) -> _Tail:
        now = self.clock()
        gone = []
        with self._lock:
            tail = self._tails.pop(record.run_id, None)
            if tail is not None and tail.done.is_set() and now - tail.asked > self.idle:
                tail = None                  # ended long ago: follow again (the run may be back)
            for run_id, other in list(self._tails.items()):
                if now - other.asked > self.idle:
                    gone.append(self._tails.pop(run_id))
            if tail is None:
                tail = _Tail(record, self.keep, base=BASE + self._started % 1024 * SPAN,
                             idle=self.idle, clock=self.clock)
                self._started += 1
                tail.thread.start()
            tail.asked = now
            self._tails[record.run_id] = tail          # newest last: the oldest go first
            while len(self._tails) > self.most:
                gone.append(self._tails.pop(next(iter(self._tails))))
        for old in gone:
            old.close()
        return tail

    def read(self, record: records.RunRecord, node: str | None, *, after: int | None,
             limit: int, tail: int) -> Lines:
        """The run's merged lines (``node`` None) or one node's, as the files would give them."""
        followed = self._tail(record)
        ring = followed.merged if node is None else followed.nodes.get(node)
        if ring is None:
            return Lines(start=BASE, next=BASE, size=BASE, lines=[])
        return ring.read(after, limit=limit, tail=tail)

    def close(self) -> None:
        with self._lock:
            tails, self._tails = list(self._tails.values()), {}
        for t in tails:
            t.close()
