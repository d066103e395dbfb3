"""Follow a run through the tree: every node's output and end over ONE connection from here.

A followed run used to open, per node, a connection with a log stream, a ``docker wait``, a
liveness probe and a stop channel: this machine's work grew with the node count (issue 24).
When the tree is on (:func:`clusterctl.cluster.transport.tree.enabled`: ``ssh.tree: true``,
or ``auto`` from 16 nodes), the follow is one tree call that lasts as long as the run
(:func:`~clusterctl.cluster.transport.tree.run_through_tree`), with two commands per node:

1. ``docker logs --follow --timestamps`` (both streams, in the order docker wrote them) and,
   once the container has ended, its final state (``docker inspect``) and, for a launch, its
   removal: the end of the run reads and removes every container without another call;
2. ``docker wait``: the exit status the moment the container ends, however far behind the
   log stream is (a chatty job's backlog never delays the fail-fast).

Every piece of output goes up the tree as it is written and into the same
:class:`~clusterctl.run.logs.Merger` as before; each node's lines keep their timestamp here
until written, so a node whose way through the tree breaks (its hop's ssh ended: the node,
its link or a node above it stopped answering; its part of the tree's output was cut short;
the tree's one connection died) goes on, on its own connection, from the line after the last
one that came (:func:`~clusterctl.cluster.containers.follow_logs_after`), with the
supervisor's own waiter and liveness probe for it, exactly as a run without the tree: a
broken tree costs connections, never a line or a verdict.  Liveness through the tree: the
node's parent's ssh keepalives (5 s, 3 missed) end its hop, which this machine hears at once;
the node is then probed from here, and named lost only when this machine cannot reach it
either.

Contract: :class:`TreeFollow` (used by :class:`~clusterctl.run.supervise.Supervisor`), the
pure :func:`follow_commands` and :func:`parse_final`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from clusterctl.cluster.containers import ContainerState, split_timestamp, state_from_inspect
from clusterctl.cluster.runtime import ContainerRuntime, node_runtime, runtime_for
from clusterctl.cluster.transport import STREAM_WINDOW_SIZE, Cluster, tree
from clusterctl.core.errors import NodeError
from clusterctl.core.lines import LineSplitter
from clusterctl.core.text import digits

REMOVED = "@@clusterctl-removed"
#: The final state docker inspect prints: only what ContainerState reads (the whole inspect
#: JSON holds the container's environment, the run's secrets among it).
_STATE_FORMAT = ('{"Name":{{json .Name}},"State":{{json .State}},'
                 '"Config":{"Labels":{{json .Config.Labels}}}}')
#: $1 the container, $2 "rm" to remove it once its output came whole, $3 the inspect format,
#: $4 "clusterctl-tree-l NODE 1 ": its output, timestamped, one protocol line per line as
#: it comes, on the tree's fd 3 (:mod:`~clusterctl.cluster.transport.tree`), a line longer
#: than 3000 bytes in pieces (each written whole: a pipe keeps writes under 4 KiB apart);
#: then on stderr its final state (one JSON line), then REMOVED.  Removed only once the
#: state says it is no longer running: the stream also ends when the tree above this node is
#: cut (fd 3 breaks, ``sed`` and ``logs`` end on the broken pipe) while the container runs
#: on, followed from then on over the node's own connection; a ``rm --force`` there killed
#: it (exit 137), seen once in CI when a test cut a hop mid-run.
_FOLLOW_SCRIPT = ('"$RT" logs --follow --timestamps "$1" 2>&1 | LC_ALL=C sed -u "s/.\\{3000\\}/&\\n/g" |'
                  ' LC_ALL=C sed -u "s/^/$4/; s/\\$/ ./" >&3; '
                  's=$("$RT" inspect --type container --format "$3" "$1" 2>/dev/null); '
                  'printf "%s\\n" "$s" >&2; '
                  'case "$s" in *\'"Running":true\'*|"") exit 0;; esac; '
                  '[ "$2" != rm ] || { "$RT" rm --force "$1" > /dev/null 2>&1 && echo ' + REMOVED + ' >&2; }')
_ERR_KEEP = 64 * 1024   # what is kept of a command's stderr: its final state is one line


#: $1 the container, $2 the heartbeat line, $3 its period: ``docker wait`` (its exit status on
#: stdout), and while it waits a sign of life every period on the tree's fd 3 (the sleep
#: holds neither pipe: the node's part ends the moment docker wait does)
_WAIT_SCRIPT = ('( while printf "%s\\n" "$2" >&3; do sleep "$3" < /dev/null > /dev/null 2>&1 3>&-; done ) '
                '< /dev/null > /dev/null 2>&1 & h=$!; "$RT" wait "$1"; rc=$?; kill "$h" 2>/dev/null; exit "$rc"')


def follow_commands(node: str, container: str, *, remove: bool, heartbeat: float = 2.0,
                    runtime: ContainerRuntime | None = None) -> list[tree.Command]:
    """The two commands each node runs for the follow (see the module docstring), the
    second with a sign of life every ``heartbeat`` seconds; ``runtime``: the node's
    (default: docker).  Pure."""
    runtime = runtime or runtime_for()
    return [tree.Command(("sh", "-c", runtime.script(_FOLLOW_SCRIPT), "sh", container, "rm" if remove else "keep",
                          _STATE_FORMAT, f"clusterctl-tree-l {node} 1 ")),
            tree.Command(("sh", "-c", runtime.script(_WAIT_SCRIPT), "sh", container, f"clusterctl-tree-l {node} 2 .",
                          f"{heartbeat:g}"))]


def parse_final(node: str, err: str) -> tuple[ContainerState | None, bool]:
    """The follow command's stderr -> (the container's final state or None, whether it was
    removed).  Pure."""
    state, removed = None, False
    for line in err.splitlines():
        line = line.strip()
        if line == REMOVED:
            removed = True
        elif line.startswith("{") and state is None:
            try:
                state = state_from_inspect(node, json.loads(line))
            except (ValueError, TypeError, AttributeError):
                state = None
    return state, removed


class _Node:
    """What the tree brought back of one node so far."""

    def __init__(self) -> None:
        self.last = ""        # the timestamp key of the last whole line written
        self.at_last = 0      # how many lines with exactly that key were written
        self.err = bytearray()
        self.wait_out = bytearray()
        self.out: LineSplitter | None = None


class TreeFollow:
    """One followed run's tree call.  Callbacks (from the tree's thread, or from the caller
    of :meth:`fall_back`): ``on_exit(node, code)`` (``docker wait`` answered), ``on_state(node, state)`` (its final
    state, after its output came whole), ``on_fallback(node, after, skip, why, seen)`` (the
    tree can no longer bring this node: follow it on its own connection from the line after
    the key ``after``, ``skip`` lines with that key having come already; ``seen``: its last
    sign of life, epoch seconds).  A node is handed to
    ``on_fallback`` at most once, and nothing of it comes from the tree after that."""

    def __init__(self, cluster: Cluster, containers: Mapping[str, str], put: Callable[[str, str], None], *,
                 remove: bool, keep_whole: Sequence[str] = (), heartbeat: float = 2.0,
                 on_exit: Callable[[str, int], None], on_state: Callable[[str, ContainerState], None],
                 on_fallback: Callable[[str, str, int, str], None]) -> None:
        self.cluster = cluster
        self.containers = dict(containers)
        self.put = put
        self.keep_whole = tuple(keep_whole)
        self.on_exit, self.on_state, self.on_fallback = on_exit, on_state, on_fallback
        runtimes = {n.name: node_runtime(n) for n in getattr(cluster, "nodes", ())}
        self.commands = {n: follow_commands(n, c, remove=remove, heartbeat=heartbeat,
                                            runtime=runtimes.get(n))
                         for n, c in self.containers.items()}
        self.nodes = {n: _Node() for n in self.containers}
        now = time.time()
        self.seen = dict.fromkeys(self.containers, now)   # node -> its last sign of life here
        self.flowing = now                                 # when anything last came through
        self._lock = threading.Lock()   # the tree's thread and a fallback decided elsewhere
        self.states: dict[str, ContainerState] = {}   # final states, read through the tree
        self.removed: set[str] = set()
        self.direct: set[str] = set()                 # handed to on_fallback
        self.exited: set[str] = set()
        self.closed = False
        self.thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        self.thread = threading.Thread(target=self._run, name="follow-tree", daemon=True)
        self.thread.start()
        return self.thread

    def close(self) -> None:
        """The follow is over: whatever still comes through the tree is dropped."""
        self.closed = True

    # --- the tree's thread ---------------------------------------------------------------

    def _run(self) -> None:
        why = "the tree ended before its output came whole"
        try:
            # a small window: while the merged output waits (a slow terminal), the nodes
            # hold the backlog, not this process (as each node's own log stream does)
            tree.run_through_tree(self.cluster, self.commands, self._sink, timeout=None,
                                  on_code=self._code, on_cut=self._cut, window_size=STREAM_WINDOW_SIZE)
        except NodeError as e:
            why = f"the tree's connection failed: {e.reason}"
        except Exception as e:  # noqa: BLE001 - every node goes on on its own connection
            why = f"the tree failed: {e}"
        with self._lock:
            for node in self.containers:
                if node not in self.states:
                    self._fall_back(node, why)

    def silent(self, longer_than: float) -> dict[str, float]:
        """{node: seconds since its last sign of life} of the nodes the tree still carries
        that have been silent longer than ``longer_than`` while others' lines still came
        (a stalled stream - the merged output's backpressure, a dying root - is no node's
        silence: the root's own probe judges that)."""
        now = time.time()
        if now - self.flowing > max(1.0, longer_than / 2):
            return {}
        return {n: now - t for n, t in list(self.seen.items())
                if now - t > longer_than and n not in self.direct and n not in self.states
                and n not in self.exited}

    def carrying(self) -> set[str]:
        """The nodes whose output or end may still come through the tree."""
        return set(self.containers) - set(self.states) - self.direct

    def fall_back(self, node: str, why: str) -> None:
        """Take ``node`` off the tree (from any thread): it goes on on its own connection."""
        with self._lock:
            self._fall_back(node, why)

    def _sink(self, node: str, k: int, stream: str, data: bytes) -> None:
        with self._lock:
            self._take(node, k, stream, data)

    def _take(self, node: str, k: int, stream: str, data: bytes) -> None:
        if self.closed:
            return
        # a sign of life, also of a node taken off the tree (its prober counts it: a link
        # flap the tree outlived is no lost node)
        self.seen[node] = self.flowing = time.time()
        if node in self.direct:
            return
        st = self.nodes[node]
        if k == 2:
            if stream == "out" and len(st.wait_out) < 4096:
                st.wait_out.extend(data)
        elif stream == "err":
            st.err.extend(data[:max(0, _ERR_KEEP - len(st.err))])
        else:
            if st.out is None:
                st.out = LineSplitter(lambda text, n=node: self._line(n, text),
                                      on_continued=lambda text, n=node: self.put(n, text),
                                      keep_whole=self.keep_whole)
            st.out.feed(data)

    def _line(self, node: str, text: str) -> None:
        key, body = split_timestamp(text)
        st = self.nodes[node]
        if key:
            st.at_last = st.at_last + 1 if key == st.last else 1
            st.last = key
        self.put(node, body)

    def _code(self, node: str, k: int, rc: int) -> None:
        with self._lock:
            self._ended(node, k, rc)

    def _ended(self, node: str, k: int, rc: int) -> None:
        if self.closed or node in self.direct:
            return
        st = self.nodes[node]
        if k == 2:
            words = st.wait_out.decode("ascii", "replace").split()
            if rc == 0 and words and digits(words[-1].lstrip("-")):
                self.exited.add(node)
                self.on_exit(node, int(words[-1]))
            return   # no answer (the container ended and was removed first): command 1 tells
        if st.out is not None:
            st.out.flush()
        state, removed = parse_final(node, st.err.decode("utf-8", "replace"))
        if state is not None and not state.running:
            self.states[node] = state
            if removed:
                self.removed.add(node)
            self.on_state(node, state)
        else:   # its log stream ended while it runs, or docker could not say: from here on
            self._fall_back(node, "its log stream through the tree ended, the container "
                                  + ("still running" if state is not None else "not found"))

    def _cut(self, nodes: list[str], why: str) -> None:
        with self._lock:
            for node in nodes:
                if node not in self.states:
                    self._fall_back(node, why)

    def _fall_back(self, node: str, why: str) -> None:
        if node in self.direct or self.closed:
            return
        self.direct.add(node)
        st = self.nodes[node]
        self.on_fallback(node, st.last, st.at_last, why, self.seen[node])


__all__ = ["REMOVED", "TreeFollow", "follow_commands", "parse_final"]
