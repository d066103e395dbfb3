"""One merged, prefixed stream of every node's output, live or after the run.

Each line is shown as ``node2[1]| text`` (node name, node rank) - the pdsh /
srun -l habit - coloured per node on a terminal.  While a run is followed, each
node's raw lines also go to ``runs/<id>/<node>.log`` (the per-rank file people
keep after a run) and the prefixed lines, in arrival order, to
``runs/<id>/merged.log``.

Producers (one thread per node, streaming ``docker logs -f`` over SSH) only put
lines on a queue; a single consumer writes them, so lines never interleave
mid-line and files need no locks.  The queue is bounded (:data:`QUEUE_LINES`): when
the consumer falls behind (a chatty job, a terminal slower than the nodes), a
producer waits in ``put``, stops reading its SSH channel, the channel's window
fills and ``docker logs`` on the node waits in turn; the lines wait in the
container's log file on the node.  So clusterctl's memory stays bounded however
much the job prints, and no line is dropped: backpressure, never loss.  The
consumer writes in slices (:data:`DRAIN_SECONDS`), so a flood of lines never
keeps the supervisor from noticing a failure or Ctrl-C.

Contract: :class:`LogSink` and :class:`Merger` (the stream), :func:`start_followers`
(live, one thread per node), :func:`live_containers` / :func:`show_from_nodes` /
:func:`follow_from_nodes` / :func:`show_from_files` (``clusterctl logs``),
:func:`keep_stopped_output` / :func:`save_node_log` (runs/<id>/ after ``stop``).
Reading a container's output on its node is :mod:`clusterctl.cluster.containers`.
"""

from __future__ import annotations

import itertools
import os
import queue
import re
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rich.text import Text

from clusterctl.cluster.containers import (
    container_env,
    fetch_logs,
    find_containers,
    follow_logs,
    follow_logs_after,
)
from clusterctl.core import console
from clusterctl.core.deadline import bounded
from clusterctl.core.files import lines_below, open_append
from clusterctl.core.lines import MAX_LINE
from clusterctl.core.paths import runs_dir
from clusterctl.run.plan import MASK, maskable
from clusterctl.run.records import MERGED_LOG, RunRecord
from clusterctl.run.spool import Spool

if TYPE_CHECKING:
    from clusterctl.cluster.transport import Cluster, NodeConnection

_PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan",
            "bright_magenta", "bright_green", "bright_yellow", "bright_blue", "red")
_PREFIXED = re.compile(r"^(?P<node>[^\s\[\]|]+)\[(?P<rank>\d+)\]\| ?(?P<text>.*)\Z")

KEEP_LAST = 20  # lines per node kept in memory for the first-failure summary
# Lines between the node streams and the writer.  With 16 nodes x 625 lines/s this is
# about 0.4 s of output, a few MB; a full queue makes the streams wait (backpressure).
QUEUE_LINES = 4096
DRAIN_SECONDS = 0.2  # the supervisor's drain() writes for at most this long, then looks around
# Characters of a stored line read at a time: a line LogSink wrote (at most MAX_LINE and its
# prefix) whole; anything longer comes in pieces, never held whole
READ_LINE = MAX_LINE + 1024


def prefix(node: str, rank: int) -> str:
    return f"{node}[{rank}]| "


def parse_prefixed(line: str) -> tuple[str, int, str] | None:
    """``node2[1]| text`` -> ("node2", 1, "text"); None for a line without a prefix, or whose
    rank is no rank clusterctl writes (at most 9 ASCII digits: a line read back may hold
    thousands, which ``int`` refuses, or digits of another script, which it takes)."""
    m = _PREFIXED.match(line)
    if not m:
        return None
    rank = m.group("rank")
    if len(rank) > 9 or not rank.isascii():
        return None
    return m.group("node"), int(rank), m.group("text")


def style_for(rank: int) -> str:
    return _PALETTE[rank % len(_PALETTE)]


@dataclass(frozen=True)
class Source:
    """One node's container whose output is part of the merged stream."""

    node: str
    rank: int
    container: str
    # the secret values its container holds (``clusterctl logs``: read from it), to mask
    redact: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class Line:
    node: str
    text: str
    at: float = field(default_factory=time.time)


def mask_patterns(values: Iterable[str]) -> list[str]:
    """The secret values to search output lines for, longest first: only the maskable ones
    (:func:`clusterctl.run.plan.maskable`: a short or common value would rewrite every ``0``
    or ``false``)."""
    return sorted({v for v in values if v and maskable(v)}, key=len, reverse=True)


def mask_line(text: str, patterns: list[str]) -> str:
    """One output line as it is shown or saved (followed, saved by ``stop``, ``logs``):
    each of ``patterns`` (:func:`mask_patterns`) replaced by ``****``."""
    for secret in patterns:
        text = text.replace(secret, MASK)
    return text


class LogSink:
    """Writes merged lines: to a console (prefixed; coloured on a terminal) and to run files.

    ``redact``: secret values of the run; a line that contains one is shown and
    stored with ``****`` in its place.

    ``run_dir`` None: console only (``clusterctl logs``).  ``stream`` None: files only.
    """

    def __init__(self, ranks: dict[str, int], *, run_dir: Path | None = None,
                 stream: TextIO | None = None, color: bool | None = None,
                 redact: Iterable[str] = ()) -> None:
        self.ranks = dict(ranks)
        # secret values a program might print: masked before any line is shown or written
        self.redact = mask_patterns(redact)
        self.stream = stream
        self.color = console.interactive(stream) if color is None and stream is not None else bool(color)
        self.last: dict[str, deque[str]] = {n: deque(maxlen=KEEP_LAST) for n in ranks}
        # called with (node, rank, text) for every line written (the supervisor reads them)
        self.observers: list[Callable[[str, int, str], None]] = []
        self._files: dict[str, TextIO] = {}
        self._merged: TextIO | None = None
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            self._merged = open_append(run_dir / MERGED_LOG)   # never through a planted symlink
            for node in ranks:
                self._files[node] = open_append(run_dir / f"{node}.log")

    def also_redact(self, values: Iterable[str]) -> None:
        """Mask ``values`` too from now on (the secrets read from the containers)."""
        self.redact = mask_patterns([*self.redact, *values])

    def write(self, node: str, text: str) -> None:
        rank = self.ranks.get(node, -1)
        text = mask_line(text.rstrip("\r\n"), self.redact)
        self.last.setdefault(node, deque(maxlen=KEEP_LAST)).append(text)
        for observe in self.observers:
            observe(node, rank, text)
        pre = prefix(node, rank)
        if node in self._files:
            self._files[node].write(text + "\n")
        if self._merged is not None:
            self._merged.write(pre + text + "\n")
        if self.stream is not None:
            self._emit(pre, text, rank)

    def _emit(self, pre: str, text: str, rank: int) -> None:
        if self.color:
            console.out.print(Text.assemble((pre, style_for(rank)), text), soft_wrap=True)
        else:  # flushed by flush(), once per batch of lines: a write per line costs a syscall
            self.stream.write(pre + text + "\n")

    def flush(self) -> None:
        for f in (*self._files.values(), self._merged):
            if f is not None:
                f.flush()
        if self.stream is not None and not self.color:
            self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and not self.color:
            self.stream.flush()
        for f in (*self._files.values(), self._merged):
            if f is not None:
                f.close()
        self._files.clear()
        self._merged = None


_WAKE = Line("", "")   # queued by Merger.wake: no output, only a reason to stop waiting


class Merger:
    """Thread-safe funnel: producer threads ``put`` lines, one consumer ``drain``s them to a sink.

    The queue holds at most ``max_lines`` lines (0: unbounded, the design before issue 12,
    kept for benchmarks/scale.py's comparison); ``put`` waits while it is full, which is
    the backpressure that bounds memory (see the module docstring).  Only producer
    threads may ``put``: the consumer would wait for itself.
    """

    def __init__(self, sink: LogSink, *, max_lines: int | None = None) -> None:
        self.sink = sink
        self.queue: queue.Queue[Line] = queue.Queue(QUEUE_LINES if max_lines is None else max_lines)

    def put(self, node: str, text: str) -> None:
        self.queue.put(Line(node, text))

    def wake(self) -> None:
        """Make a ``drain`` that waits for a line return now (news other than output arrived).

        Never waits: when the queue is full the consumer is draining anyway and looks
        at its news after its budget."""
        try:
            self.queue.put_nowait(_WAKE)
        except queue.Full:
            pass

    def callback(self, node: str) -> Callable[[str], None]:
        """An ``on_line`` for one node's stream: splits chunks into lines."""
        def on_line(text: str) -> None:
            for part in text.splitlines() or [""]:
                self.put(node, part)
        return on_line

    def drain(self, timeout: float = 0.0, *, budget: float | None = None) -> int:
        """Write queued lines (waiting up to ``timeout`` for the first); returns how many.

        Without ``budget``, until the queue is empty.  With it, for at most about
        ``budget`` seconds: producers may refill the queue as fast as it empties, and a
        caller with other duties (the supervisor: failures, Ctrl-C) must get its turn."""
        n = 0
        try:
            item = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
        except queue.Empty:
            return 0
        end = None if budget is None else time.monotonic() + budget
        while True:
            if item is not _WAKE:
                self.sink.write(item.node, item.text)
                n += 1
            if end is not None and n % 256 == 0 and time.monotonic() >= end:
                break
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
        self.sink.flush()
        return n


def start_followers(cluster: Cluster, sources: Iterable[Source], merger: Merger, *,
                    tail: int | None = None,
                    after: dict[str, tuple[str, int]] | None = None) -> dict[str, threading.Thread]:
    """One daemon thread per node streaming ``docker logs --follow`` into ``merger``.

    Daemon threads: a node whose link is down blocks its stream forever, and the
    caller must still be able to end (supervise decides when a node is lost).
    ``after``: node -> (timestamp key, lines with that key already written): that node's
    stream goes on after them (a followed run's node that fell back from the tree,
    :func:`~clusterctl.cluster.containers.follow_logs_after`).
    """
    threads = {}
    for src in sources:
        t = threading.Thread(target=_follow_one, args=(cluster, src, merger, tail, (after or {}).get(src.node)),
                             name=f"logs-{src.node}", daemon=True)
        t.start()
        threads[src.node] = t
    return threads


def _follow_one(cluster: Cluster, src: Source, merger: Merger, tail: int | None,
                after: tuple[str, int] | None) -> None:
    try:
        conn = cluster.connection(src.node)
        if after is not None:
            follow_logs_after(conn, src.container, merger.callback(src.node), after=after[0],
                              skip=after[1], keep_whole=merger.sink.redact)
        else:
            follow_logs(conn, src.container, merger.callback(src.node), tail=tail,
                        keep_whole=merger.sink.redact)
    except Exception as e:  # noqa: BLE001 - reported as a line; supervise judges the node
        merger.put(src.node, f"[clusterctl] log stream ended: {e}")


def lines_from_files(record: RunRecord, *, node: str | None = None,
                     tail: int | None = None) -> Iterator[tuple[str, str]]:
    """(node, text) of a recorded run, merged in the order they arrived.

    ``tail`` keeps the last N lines of each node (as ``docker logs --tail`` does
    per container), still in merged order.  The files are read as a stream (twice with
    ``tail``: once to count each node's lines), never held whole: a week-long run's
    merged.log can be far larger than memory.
    """
    def read() -> Iterator[tuple[str, str]]:
        merged = _file_lines(record.attempt_dir() / MERGED_LOG)
        if merged is not None:
            for raw in merged:
                parsed = parse_prefixed(raw.rstrip("\n"))
                if parsed and (node is None or parsed[0] == node):
                    yield parsed[0], parsed[2]
            return
        # a run stopped with `clusterctl stop` before anything was merged: per-node files
        for n in record.nodes:
            if node is None or n.node == node:
                for raw in _file_lines(record.log_path(n.node)) or ():
                    yield n.node, raw.rstrip("\n")

    yield from tail_per_node(read, tail)


def _file_lines(path: Path) -> Iterator[str] | None:
    """The lines of a run's file (:func:`~clusterctl.core.files.lines_below` from the runs
    directory: no symlink followed at any component below it, never a FIFO, a line at a time),
    or None when there is no such file.  UserError naming a file that is not to be read."""
    lines = lines_below(runs_dir(), path, max_line=READ_LINE)
    try:
        first = next(lines)
    except FileNotFoundError:
        return None
    except StopIteration:
        return iter(())
    return itertools.chain((first,), lines)


def tail_per_node(read: Callable[[], Iterable[tuple[str, str]]],
                  tail: int | None) -> Iterator[tuple[str, str]]:
    """The (node, text) items ``read()`` gives, only each node's last ``tail`` (None: all),
    in their order.  ``read`` is called twice with ``tail`` (a first pass counts each node's
    lines), so a log larger than memory is never held."""
    if tail is None:
        yield from read()
        return
    total: dict[str, int] = {}
    for name, _ in read():
        total[name] = total.get(name, 0) + 1
    seen: dict[str, int] = {}
    for name, text in read():
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > total.get(name, 0) - tail:
            yield name, text


def secret_names(record: RunRecord) -> set[str]:
    """The variables the run masked in its record (secret by name, listed, or tainted)."""
    return {k for n in record.nodes for k, v in n.env.items() if v == MASK}


def stop_redact(record: RunRecord, envs: dict[str, dict[str, str]]) -> list[str]:
    """The values to mask in output that no follower masked: the run's secret variables
    (:func:`secret_names`) as the containers' environment on each node (``envs``) holds
    them, only the maskable ones, as :class:`LogSink` masks."""
    names = secret_names(record)
    return sorted({v for env in envs.values() for k, v in env.items() if k in names and v and maskable(v)})


def save_node_log(record: RunRecord, node: str, lines: Iterable[str]) -> Path:
    """Write a node's complete output to ``runs/<id>/<node>.log`` (``stop`` keeps it this way)."""
    path = record.log_path(node)
    _write_lines(path, (t + "\n" for t in lines))
    return path


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    """``lines`` as ``path``, a line at a time (it may be large), through a temporary file made
    exclusively and renamed over it: a symlink planted at ``path`` is replaced, not followed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(line)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def keep_stopped_output(record: RunRecord, spool: Spool, nodes: Iterable[str], *,
                        replace: bool = False, redact: Iterable[str] = ()) -> None:
    """Keep what stopped containers wrote (in ``spool``, for ``nodes``) in runs/<id>/.

    Only for nodes whose log launch did not already write while following: each
    gets ``<node>.log``, and their lines, merged by time, are appended to
    merged.log (nodes stopped by a later ``stop``, one was unreachable, join it).
    ``replace``: the files launch wrote are incomplete (it was killed): every node's log and
    merged.log are rewritten whole from what the containers wrote.  A line at a time: the
    output may be larger than memory.  ``redact``: the secret values (:func:`stop_redact`),
    masked as a followed run's lines are.
    """
    values = mask_patterns(redact)
    saved = [node for node in nodes if replace or not record.log_path(node).exists()]
    for node in saved:
        save_node_log(record, node, (mask_line(t, values) for t in spool.texts(node)))
    if not saved:
        return
    ranks = {n.node: n.rank for n in record.nodes}
    merged = (prefix(node, ranks[node]) + mask_line(t, values) + "\n" for node, t in spool.merged(saved))
    if replace:
        _write_lines(record.attempt_dir() / MERGED_LOG, merged)
        return
    with open_append(record.attempt_dir() / MERGED_LOG) as f:
        for line in merged:
            f.write(line)


# --- `clusterctl logs`: from the nodes while the containers exist, from runs/ after ---------

def live_containers(cluster: Cluster, record: RunRecord, *, node: str | None = None,
                    timeout: float = 15.0) -> tuple[list[Source], dict[str, str]]:
    """The run's containers that still exist on the nodes (found by label), and unreachable
    nodes.  Each source carries the values its container holds for the run's secrets
    (:func:`secret_names`; read from the container over the node's own connection, as its
    output is), so ``clusterctl logs`` masks what no follower masked (a detached run)."""
    wanted = [n for n in record.nodes if node is None or n.node == node]
    names = {n.name for n in cluster.inventory.nodes}
    targets = [n.node for n in wanted if n.node in names]
    hidden = secret_names(record)
    envs: dict[str, dict[str, str]] = {}

    def ask(conn: NodeConnection):
        found = bounded(lambda: find_containers(conn, record.run_id, timeout=timeout), timeout)
        if hidden and found:
            envs[conn.name] = bounded(lambda: container_env(conn, [c.name for c in found],
                                                            timeout=timeout, only=hidden), timeout)
        return found

    answers = cluster.map(ask, nodes=targets) if targets else {}
    sources, unreachable = [], {}
    for n in wanted:
        found = answers.get(n.node)
        if isinstance(found, list) and found:     # this attempt's container, when it is there
            mine = [c for c in found if c.name == n.container] or found
            redact = tuple(stop_redact(record, {n.node: envs.get(n.node, {})}))
            sources.append(Source(n.node, n.rank, mine[0].name, redact=redact))
        elif found is not None and not isinstance(found, list):
            unreachable[n.node] = getattr(found, "reason", str(found))
    return sources, unreachable


def redact_sources(sink: LogSink, sources: Iterable[Source]) -> None:
    """``sink`` masks the secret values the sources' containers hold too."""
    sink.also_redact(v for src in sources for v in src.redact)


def show_from_nodes(cluster: Cluster, sources: list[Source], sink: LogSink, *,
                    tail: int | None = None) -> None:
    """Everything the containers wrote so far, merged by the nodes' timestamps (through a
    spool on disk: a line at a time, whatever the output's size)."""
    redact_sources(sink, sources)
    with Spool() as spool:
        def fetch(conn: NodeConnection):
            src = next(s for s in sources if s.node == conn.name)
            fetch_logs(conn, src.container, tail=tail, on_line=spool.writer(conn.name))
            return True

        got = cluster.map(fetch, nodes=[s.node for s in sources])
        for node, text in spool.merged([n for n, v in got.items() if v is True]):
            sink.write(node, text)
    for node, v in got.items():
        if v is not True:
            sink.write(node, f"[clusterctl] cannot read this node's log: {v.reason}")
    sink.flush()


def follow_from_nodes(cluster: Cluster, sources: list[Source], sink: LogSink, *,
                      tail: int | None = None, between: Callable[[], None] | None = None) -> None:
    """Stream the containers' output until every one has ended (Ctrl-C, or ``between`` -
    called between batches of lines - closing the cluster's connections, ends it sooner)."""
    redact_sources(sink, sources)
    merger = Merger(sink)
    threads = start_followers(cluster, sources, merger, tail=tail)
    while any(t.is_alive() for t in threads.values()):
        merger.drain(timeout=0.2)
        if between is not None:
            between()
    merger.drain()


def show_from_files(record: RunRecord, sink: LogSink, *, node: str | None = None,
                    tail: int | None = None) -> int:
    """A finished run's lines from runs/<id>/; returns how many were shown."""
    n = 0
    for node_name, text in lines_from_files(record, node=node, tail=tail):
        sink.write(node_name, text)
        n += 1
    sink.flush()
    return n
