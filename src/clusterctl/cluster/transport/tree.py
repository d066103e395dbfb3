"""Tree fan-out: run commands on every node through ONE connection from this machine.

One job: :func:`run_commands` - each node's commands (argv + stdin, as
:meth:`NodeConnection.run` takes them) run on that node, and their results come
back, with this machine opening a single SSH connection (to the first node, the
root) instead of one per node.  The nodes reach each other in a tree of
``ssh.tree_width`` children per node, as ClusterShell's gateways and Open MPI's
tree spawn do, so the work on this machine hardly grows with the number of nodes
(issue 12): it is one handshake, one channel and, per node, a line of request and
a line of result.

When: the inventory sets ``ssh: {tree: true}``, or leaves ``tree`` at ``auto`` and the
call has :data:`AUTO_MIN_NODES` nodes or more and its caller will not open every node's
own connection next anyway (:func:`enabled`).  Otherwise every call goes straight to
each node's own connection (:meth:`Cluster.map`).

How a node logs in to its children (``ssh`` on the node, strict host keys):

* ``ssh.node_identity_file`` set: with that key, a file on the nodes (clusterctl
  neither writes nor reads it: the nodes already trust each other, as every
  ``mpirun`` cluster's do).  This machine then signs nothing per node.
* not set: agent forwarding requested on the root's one channel and answered by
  a one-use agent in this process (:class:`~clusterctl.cluster.transport.agent.HopAgent`,
  the push relay's), which signs with the inventory's key at most once per planned
  hop, only for a login to a planned node (the session is bound to that node's host
  key, as known here: OpenSSH 8.9 or later on the nodes) and nothing after the call.
  The key never leaves this machine.  Each
  signature costs this machine an agent channel (~2.5 ms of CPU, measured).

A command that makes several tree calls (``cluster.tree_reuse``: launch, whose preflight,
start, follow and fail-fast stop each are one) logs in to each node once: each parent
node's ``ssh`` to a child is an OpenSSH control master (``ControlPersist``, in a directory
of the command's own, mode 0700), so the command's next calls open sessions on those
logins instead of new ones; each call points the masters at its own forwarded agent (a
link in that directory), for a node that needs a new login then.  The command's last call
(``last=True``) or the cluster's close ends the masters and removes the directories; a
command killed before that leaves them only until :data:`MUX_PERSIST` idle seconds have
passed (the masters) and :data:`MUX_SWEEP_MIN` minutes (their directories, removed by the
next tree call on that node).

Each hop's host key is the one this machine's known_hosts holds for that node
(passed in the request, checked with ``StrictHostKeyChecking=yes``); a node
whose key is not there, or that is reached through a ProxyJump/ProxyCommand,
or (agent mode) whose identity file differs from the root's, is not put in the
tree: it gets its own connection, as without a tree.

Nothing is left on a node: each node's command makes a private directory
(``mkdir``, mode 0700, named by this machine with random tokens) for its
commands' output files and removes it when it ends; a heartbeat on its stderr
ends every process of the node's part when its parent (or this machine) is gone.
Secrets (a command's stdin) travel in the request through the nodes' memory
(shell variables and pipes), never in a file or an argv.

Failures: a node whose results do not come back (its hop failed, its parent
died, the tree timed out) is run on its own connection afterwards, so a broken
tree costs time, never a result; only that connection's failure is reported,
naming the node.  Contract: :func:`run_commands`, :func:`run_through_tree`,
:func:`plan_tree`, :class:`Command`, :func:`enabled`, :func:`close_reuse`.
"""

from __future__ import annotations

import base64
import functools
import getpass
import re
import secrets
import shlex
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import paramiko

from clusterctl.cluster.transport.agent import HopAgent, hop_destinations, load_key
from clusterctl.cluster.transport.commands import CommandResult
from clusterctl.cluster.transport.connection import NodeConnection, _explicit_port
from clusterctl.cluster.transport.hopssh import HOP_KEX
from clusterctl.cluster.transport.hostkeys import host_key_name, known_hosts_index
from clusterctl.core.deadline import bounded
from clusterctl.core.errors import NodeError
from clusterctl.core.lines import LineSplitter
from clusterctl.core.scripts import script_text

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Node
    from clusterctl.cluster.transport.cluster import Cluster

DEFAULT_WIDTH = 32
AUTO = "auto"
#: ``tree: auto`` takes the tree from this many nodes on: below it, a connection per node
#: costs this machine less than 0.15 s of CPU in all and its wall is lower than a hop's
#: login (docs/benchmarks/launch.md).
AUTO_MIN_NODES = 16
HOP_CONNECT_TIMEOUT = 10   # seconds a node's ssh to a child may take to log in
HEARTBEAT = 2              # seconds between a node's "alive" lines on its stderr
#: seconds a parent node's OpenSSH control master to a child waits, idle, for the command's
#: next call (:attr:`Cluster.tree_reuse`); the command's end closes it before that
MUX_PERSIST = 120
#: minutes after which a parent's directory of masters that are all gone (its command was
#: killed before it could close them, or the node was cut off) is removed by a later tree call
MUX_SWEEP_MIN = 10
#: base64 characters per line of output (a multiple of 4, so each line decodes alone; a
#: line stays under PIPE_BUF, so a pipe never mixes two writers' lines)
CHUNK = 3000


@dataclass(frozen=True)
class Command:
    """One command for one node: argv, and bytes for its stdin (None: no stdin)."""

    argv: tuple[str, ...]
    stdin: bytes | None = None


def enabled(cluster: Cluster) -> bool:
    """Whether this call goes through the tree: ``ssh.tree: true`` and 2+ nodes, or
    ``auto`` (the default) with :data:`AUTO_MIN_NODES` or more and a caller that will not
    open every node's own connection next anyway (``cluster.each_node_anyway``: code to
    ship, a collective check's run), where the tree would only add its logins to those."""
    setting = getattr(getattr(cluster.inventory, "ssh", None), "tree", AUTO)
    count = len(cluster.nodes)
    if setting == AUTO:
        return count >= AUTO_MIN_NODES and not getattr(cluster, "each_node_anyway", False)
    return setting is True and count > 1


def plan_tree(names: Sequence[str], width: int) -> dict[str, str]:
    """{node: its path from the root, "/"-joined}; breadth first, ``width`` children each.

    The first name is the root.  Pure: ``plan_tree(["a","b","c"], 1)`` ->
    ``{"a": "a", "b": "a/b", "c": "a/b/c"}``."""
    if width < 1:
        raise ValueError("a tree needs a width of at least 1")
    paths: dict[str, str] = {}
    for i, name in enumerate(names):
        paths[name] = name if i == 0 else f"{paths[names[(i - 1) // width]]}/{name}"
    return paths


# The program each node of the tree runs.  $1 its private directory (made here), $2 its
# name, $3 the identity file on the nodes ("" = the forwarded agent), $4 this program's
# text quoted for a remote shell (what a hop runs).  $HEARTBEAT, $HOP_CONNECT_TIMEOUT,
# $HOP_KEX (:mod:`~clusterctl.cluster.transport.hopssh`) and $TRACE are replaced by the
# head before it sends the text.
# stdin: one line per node of its subtree:
#   NAME PATH DIR PORT USER HOST B64(known_hosts lines) B64(argv, each NUL-terminated) B64(stdin)|- ...
# stdout, as it comes (each line written whole, by one process, so the lines of several
# commands and children never mix), per command K of each node NAME of the subtree:
#   "clusterctl-tree-o NAME K LEN CHUNK" its stdout, in order, while it runs, and after it
#   "clusterctl-tree-e NAME K LEN CHUNK" its stderr, then "clusterctl-tree-r NAME K RC .";
# CHUNK is base64 of the next piece (at most $CHUNK characters, a multiple of 4, so each
# decodes alone) and LEN its length; per failed hop, "clusterctl-tree-hop NAME RC B64(its
# ssh's last words) .".  A command may also write "clusterctl-tree-l NAME K TEXT ." lines
# to fd 3 itself: one line of its output each, as it comes (base64 and fold wait for a
# block: a followed run's lines would wait with them).  Each hop relays its children's
# lines as they arrive (grep --line-buffered: mawk, Debian's awk, reads a pipe a block at
# a time).  LEN and the final "." tell a line cut short by a dying hop (its
# last, written in part) from a whole one.  A node's
# output is never held whole: it goes up as it is written, a chunk at a time.
NODE_SCRIPT = script_text("clusterctl.cluster", "tree-node.sh")


#: Ends the control masters in the directory "$1" (each parent node's, for the command's
#: next tree calls) and removes it: the node program's last call does, and the head on the
#: own connection of a node the tree no longer carried at the end.
CLOSE_MUX = script_text("clusterctl.cluster", "tree-close-mux.sh")


@dataclass
class _Hop:
    """How a parent node reaches one node: its address and the host key known here."""

    user: str
    host: str
    port: int
    known_host: str


def _hops(cluster: Cluster):
    """node -> its _Hop (or None), worked out once per node for the whole command (launch
    asks twice: preflight, start), with known_hosts indexed by name once: looking each node
    up in the file's entries was O(nodes x entries)."""
    memo = cluster.tree_memo
    if "index" not in memo:
        memo["index"] = known_hosts_index(cluster.known_host_keys())
        memo["lookup"] = cluster.ssh_lookup()
        memo["hops"] = {}

    def hop_of(node: Node) -> _Hop | None:
        if node.name not in memo["hops"]:
            memo["hops"][node.name] = _hop_of(node, memo["lookup"], memo["index"])
        return memo["hops"][node.name]
    return hop_of


def _hop_of(node: Node, lookup, index) -> _Hop | None:
    """The node as another node dials it (ssh config HostName/User/Port applied), with the
    host keys this machine's known_hosts holds for it (known_hosts lines); None when the tree cannot take it
    (no known key, or a ProxyJump/ProxyCommand: another node may not reach it directly)."""
    cfg = lookup(node.host) if lookup is not None else {}
    if cfg.get("proxyjump") or cfg.get("proxycommand"):
        return None
    host = cfg.get("hostname") or node.host
    port = _explicit_port(node) or int(cfg.get("port", 22))
    user = node.user or cfg.get("user") or _local_user()
    name = host_key_name(host, port)
    keys = index(name)
    if not keys:
        return None
    return _Hop(user, host, port, "\n".join(f"{name} {kind} {blob}" for kind, blob in keys))


@functools.lru_cache(maxsize=1)
def _local_user() -> str:
    return getpass.getuser()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii") if data else "-"


def _request_line(name: str, path: str, directory: str, hop: _Hop | None,
                  commands: Sequence[Command], mux: str = "-") -> str:
    fields = [name, path, directory, str(hop.port) if hop else "0", hop.user if hop else "-",
              hop.host if hop else "-", _b64(hop.known_host.encode()) if hop else "-", mux]
    for c in commands:
        # every argument NUL-terminated, so an empty last one is kept
        fields += [_b64(b"".join(a.encode() + b"\0" for a in c.argv)), _b64(c.stdin or b"")]
    return " ".join(fields)


_CHUNK = re.compile(r"clusterctl-tree-([oe]) (\S+) (\d+) (\d+) ([A-Za-z0-9+/=]*)")
_LINE = re.compile(r"clusterctl-tree-l (\S+) (\d+) (.*)", re.S)
_RC = re.compile(r"clusterctl-tree-r (\S+) (\d+) (-?\d+) \.")
_HOP = re.compile(r"clusterctl-tree-hop (\S+) (\d+) (\S*) \.")

#: (node, K, "out" or "err", bytes): a piece of the output of a node's K-th command (1-based)
Sink = Callable[[str, int, str, bytes], None]


class Receiver:
    """Reads the tree's stdout a line at a time as it comes (:data:`NODE_SCRIPT`'s protocol):
    each node's output to ``sink``, in order, as it arrives; its commands' exit statuses;
    the hops that failed.  A node with a line cut short (its parent died while writing it)
    is never complete.  Pure (no I/O)."""

    def __init__(self, commands: Mapping[str, Sequence[Command]], sink: Sink, *,
                 on_code: Callable[[str, int, int], None] | None = None,
                 on_hop: Callable[[str, str], None] | None = None) -> None:
        """``on_code(node, K, status)`` and ``on_hop(node, why)``, when given, hear of each
        command's end and each failed hop the moment its line arrives (a followed run acts
        on them while the tree still runs)."""
        self._count = {n: len(c) for n, c in commands.items()}
        self._sink = sink
        self._on_code = on_code
        self._on_hop = on_hop
        self.codes: dict[str, dict[int, int]] = {}
        self.hops: dict[str, str] = {}
        self.cut: set[str] = set()

    def _asked(self, name: str, k: int) -> bool:
        return 1 <= k <= self._count.get(name, 0)

    def line(self, text: str) -> None:
        m = _CHUNK.fullmatch(text)
        if m:
            kind, name, k, size, chunk = m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), m.group(5)
            if not self._asked(name, k) or name in self.cut:
                return
            try:
                if size != len(chunk):
                    raise ValueError("cut short")
                data = base64.b64decode(chunk, validate=True)
            except ValueError:
                self.cut.add(name)
                return
            self._sink(name, k, "out" if kind == "o" else "err", data)
            return
        m = _LINE.fullmatch(text)
        if m:
            name, k, rest = m.group(1), int(m.group(2)), m.group(3)
            if not self._asked(name, k) or name in self.cut:
                return
            if not rest.endswith(" .") and rest != ".":
                self.cut.add(name)    # its end never came: a hop died while writing it
                return
            self._sink(name, k, "out", (rest[:-2] if rest != "." else "").encode() + b"\n")
            return
        m = _RC.fullmatch(text)
        if m:
            name, k, rc = m.group(1), int(m.group(2)), int(m.group(3))
            if self._asked(name, k):
                self.codes.setdefault(name, {})[k] = rc
                if self._on_code is not None and name not in self.cut:
                    self._on_code(name, k, rc)
            return
        m = _HOP.fullmatch(text)
        if m:
            words = _unb64(m.group(3)).strip().replace("\n", "; ")
            self.hops[m.group(1)] = (f"ssh from its parent node exited {m.group(2)}"
                                     + (f": {words}" if words else ""))
            if self._on_hop is not None:
                self._on_hop(m.group(1), self.hops[m.group(1)])

    def complete(self) -> dict[str, list[int]]:
        """{node: its commands' exit statuses, in order}: the nodes whose every command ended
        and whose output came whole."""
        return {n: [c[k] for k in sorted(c)] for n, c in self.codes.items()
                if n not in self.cut and sorted(c) == list(range(1, self._count[n] + 1))}


def parse_results(stdout: str, commands: Mapping[str, Sequence[Command]]
                  ) -> tuple[dict[str, list[CommandResult]], dict[str, str]]:
    """The tree's whole stdout -> ({node: its commands' results, complete nodes only},
    {node: why its hop failed}).  Pure."""
    got: dict[tuple[str, int, str], bytearray] = {}
    receiver = Receiver(commands, _collect(got))
    for line in stdout.splitlines():
        receiver.line(line)
    return _results(receiver.complete(), got, commands), receiver.hops


def _collect(got: dict[tuple[str, int, str], bytearray]) -> Sink:
    def sink(name: str, k: int, stream: str, data: bytes) -> None:
        got.setdefault((name, k, stream), bytearray()).extend(data)
    return sink


def _results(codes: Mapping[str, list[int]], got: Mapping[tuple[str, int, str], bytearray],
             commands: Mapping[str, Sequence[Command]]) -> dict[str, list[CommandResult]]:
    def text(name: str, k: int, stream: str) -> str:
        return bytes(got.get((name, k, stream), b"")).decode("utf-8", "replace")
    return {name: [CommandResult(name, list(commands[name][k - 1].argv), rc, text(name, k, "out"),
                                 text(name, k, "err")) for k, rc in enumerate(rcs, 1)]
            for name, rcs in codes.items()}


def _unb64(text: str) -> str:
    if text in ("", "-"):
        return ""
    try:
        return base64.b64decode(text).decode("utf-8", "replace")
    except ValueError:
        return ""


def run_commands(cluster: Cluster, commands: Mapping[str, Sequence[Command]], *,
                 timeout: float = 120.0, on_tree=None,
                 last: bool = False) -> dict[str, list[CommandResult] | NodeError]:
    """Run each node's commands (all of a node's at once) and return their results,
    {node: [CommandResult, ...] in the given order, or NodeError} in the given node order.

    Through the tree when :func:`enabled`, else (and for every node the tree did not
    bring back) on each node's own connection.  ``on_tree(info)``, when given, is called
    with what the tree did (``{"tree": [...], "direct": [...], "hops": {...}}``).  The
    results are held in memory: for commands whose output is small (a run's output goes
    through :func:`run_through_tree` with a sink of its own).  ``last``: the command's last
    tree call (:func:`run_through_tree`)."""
    order = list(commands)
    results: dict[str, list[CommandResult] | NodeError] = {}
    info: dict = {"tree": [], "direct": [], "hops": {}}
    if enabled(cluster) and len(order) > 1:
        got: dict[tuple[str, int, str], bytearray] = {}
        try:
            ran = run_through_tree(cluster, commands, _collect(got), timeout=timeout, last=last)
            results.update(_results(ran.codes, got, commands))
            info["tree"], info["hops"] = ran.planned, ran.hops
        except NodeError as e:   # the root itself (unreachable): the others go direct
            results[e.node] = e
    rest = [n for n in order if n not in results]
    info["direct"] = rest
    if rest:
        results.update(_direct(cluster, {n: commands[n] for n in rest}, timeout))
    if on_tree is not None:
        on_tree(info)
    return {n: results[n] for n in order}


def _direct(cluster: Cluster, commands: Mapping[str, Sequence[Command]], timeout: float):
    def one(conn: NodeConnection):
        cmds = commands[conn.name]
        if len(cmds) == 1:
            return [conn.run(list(cmds[0].argv), stdin=cmds[0].stdin, timeout=timeout)]
        with ThreadPoolExecutor(len(cmds)) as pool:
            futures = [pool.submit(conn.run, list(c.argv), stdin=c.stdin, timeout=timeout) for c in cmds]
            return [f.result() for f in futures]
    return cluster.map(one, nodes=list(commands))


@dataclass
class TreeRun:
    """What :func:`run_through_tree` brought back."""

    codes: dict[str, list[int]]   # the nodes that came back whole: their commands' exit statuses
    hops: dict[str, str]          # node -> why the tree did not bring it back
    planned: list[str]            # the nodes put in the tree


def run_through_tree(cluster: Cluster, commands: Mapping[str, Sequence[Command]], sink: Sink, *,
                     timeout: float | None = 120.0,
                     on_code: Callable[[str, int, int], None] | None = None,
                     on_cut: Callable[[list[str], str], None] | None = None,
                     window_size: int | None = None, last: bool = False) -> TreeRun:
    """The tree's part alone (the caller checked :func:`enabled`): every node of ``commands``
    the tree can take runs its commands, their output going to ``sink`` as it comes.  A
    node missing from ``codes`` (not planned, its hop failed, its output cut short) is the
    caller's to run on its own connection, and what ``sink`` got of it is to be dropped.
    Raises NodeError when the first node, the root, cannot be reached at all.

    While it runs (a followed run's tree lasts as long as the run): ``on_code(node, K,
    status)`` hears of each command's end as its line arrives, and ``on_cut(nodes, why)`` of
    each failed hop, with every node below it (their output can no longer come this way).
    ``timeout`` None: no deadline (the connection's own keepalives still end a dead one).
    ``window_size``: the channel's receive window (what waits here, unread, while ``sink``
    blocks); a tree that lives as long as a run takes a small one.  ``last``: the
    command's last tree call, which ends the nodes' logins kept for the next
    (``cluster.tree_reuse``) as it ends; otherwise the cluster's close does."""
    ran = _through_tree(cluster, commands, sink, timeout, on_code, on_cut, window_size, last)
    # a hop that failed is not tried again in this command (launch makes two tree calls: a
    # node the others cannot reach would make the second wait for its timeout again)
    cluster.tree_memo.setdefault("failed", set()).update(ran.hops)
    return ran


def _through_tree(cluster: Cluster, commands: Mapping[str, Sequence[Command]], sink: Sink,
                  timeout: float | None, on_code=None, on_cut=None, window_size=None,
                  last: bool = False) -> TreeRun:
    ssh = cluster.inventory.ssh
    key_on_nodes = getattr(ssh, "node_identity_file", None)
    width = int(getattr(ssh, "tree_width", DEFAULT_WIDTH) or DEFAULT_WIDTH)
    nodes = {n.name: n for n in cluster.nodes}
    names = list(commands)
    root = nodes[names[0]]
    failed_before = cluster.tree_memo.get("failed", set())
    if (not key_on_nodes and root.identity_file is None) or root.name in failed_before:
        return TreeRun({}, {}, [])   # nothing to sign node-to-node logins with, or no tree
    hop_of = _hops(cluster)
    members, hops = [root.name], {}
    for name in names[1:]:
        node = nodes[name]
        if name in failed_before:
            continue
        if not key_on_nodes and node.identity_file != root.identity_file:
            continue
        hop = hop_of(node)
        if hop is not None:
            members.append(name)
            hops[name] = hop
    if len(members) < 2 and not (last and cluster.tree_memo.get("mux")):   # a root alone: its close
        return TreeRun({}, {}, [])
    left_out = [n for n in names if n not in members]
    if left_out and on_cut is not None:
        on_cut(left_out, "the tree cannot take it (no known host key here, a proxy, another "
                         "identity file, or its hop failed before)")
    paths = plan_tree(members, width)
    token = secrets.token_hex(6)
    dirs = {n: f"/tmp/clusterctl-tree.{token}.{secrets.token_hex(5)}" for n in members}
    mux = _reuse_dirs(cluster, members, last)
    request = "".join(_request_line(n, paths[n], dirs[n], hops.get(n), commands[n], mux.get(n, "-"))
                      + "\n" for n in members).encode()
    conn = cluster.connection(root.name)
    agent = None
    if not key_on_nodes:
        try:
            agent = HopAgent(load_key(root.identity_file), budget=len(members) - 1,
                             destinations=hop_destinations((hop.known_host, hop.user) for hop in hops.values()))
        except (OSError, TypeError, paramiko.SSHException) as e:   # every node goes direct
            return TreeRun({}, {root.name: f"the tree needs the inventory's identity_file to "
                                           f"sign node-to-node logins: {e}"}, [])
    script = (NODE_SCRIPT.replace("$HEARTBEAT", str(HEARTBEAT))
              .replace("$HOP_CONNECT_TIMEOUT", str(HOP_CONNECT_TIMEOUT)).replace("$HOP_KEX", HOP_KEX)
              .replace("$CHUNK", str(CHUNK)).replace("$TRACE", "0")
              .replace("$MUX_PERSIST", str(MUX_PERSIST)).replace("$MUX_SWEEP_MIN", str(MUX_SWEEP_MIN))
              .replace("$CLOSE_MUX", CLOSE_MUX))
    quoted = shlex.quote(script)
    argv = ["sh", "-c", script, "clusterctl-tree", dirs[root.name], root.name,
            str(key_on_nodes or ""), quoted, mux.get(root.name, "-"), "close" if last and mux else "-"]
    depth = max(p.count("/") for p in paths.values())

    def on_hop(name: str, why: str) -> None:
        if on_cut is not None:
            below = paths[name] + "/"
            on_cut([n for n in members if n == name or paths[n].startswith(below)], why)
    receiver = Receiver({n: commands[n] for n in members}, sink, on_code=on_code, on_hop=on_hop)
    said: deque[str] = deque(maxlen=20)    # the root's own last words on stderr
    out = LineSplitter(receiver.line)
    err = LineSplitter(lambda t: said.append(t) if t != "clusterctl-alive" else None)
    code: int | None = None
    failure: NodeError | None = None
    try:
        chan = conn.exec_channel(argv, forward_agent=agent.handler if agent else None,
                                 **({"window_size": window_size} if window_size else {}))
        _feed(chan, request)   # the node reads it all first (into memory), then works
        code = conn.pump_channel(chan, ["clusterctl tree"], out.feed, err.feed,
                                 timeout=None if timeout is None
                                 else timeout + depth * (HOP_CONNECT_TIMEOUT + 5))
        out.flush()
        err.flush()
    except NodeError as e:
        failure = e
    finally:
        if agent is not None:
            agent.close()
    done = receiver.complete()
    hop_failures = dict(receiver.hops)
    if failure is not None:
        if failure.node == root.name and "timed out" not in failure.reason and not done:
            raise failure
        hop_failures.setdefault(root.name, failure.reason)
    if agent is not None and agent.refused:
        why = f"; this machine's agent refused to sign {agent.refused[0]}"
        hop_failures = {n: w + why for n, w in hop_failures.items()}
    if root.name not in done:
        why = "\n".join(said).strip()[-400:]
        hop_failures.setdefault(root.name, f"the tree's command exited {code}"
                                + (f": {why}" if why else ""))
    for name in members:
        if name not in done and name in receiver.cut:
            hop_failures.setdefault(name, "its output was cut short (a node above it stopped answering)")
    return TreeRun(done, hop_failures, members)


def _reuse_dirs(cluster: Cluster, members: Sequence[str], last: bool) -> dict[str, str]:
    """{node: its directory of OpenSSH control masters} when the command keeps its nodes'
    logins for its next tree calls (``cluster.tree_reuse``), else {}.  The same directory
    for a node in every call of the command (named here with random tokens: the nodes may
    share /tmp); the first call makes the cluster's close end them (:func:`close_reuse`),
    unless it is the ``last``, which ends them itself."""
    memo = cluster.tree_memo
    if not getattr(cluster, "tree_reuse", False) or (memo.get("mux_closed") and not last):
        return {}   # after the close began, a call keeps nothing (the close's own is last)
    if "mux" not in memo:
        memo["mux"] = {}
        memo["mux_token"] = secrets.token_hex(6)
        cluster.before_close.append(lambda: close_reuse(cluster))
    dirs = {n: memo["mux"].setdefault(n, f"/tmp/clusterctl-mux.{memo['mux_token']}.{secrets.token_hex(5)}")
            for n in members}
    memo["mux_open"] = not last
    return dirs


def close_reuse(cluster: Cluster, timeout: float = 15.0, cut_timeout: float = 5.0) -> None:
    """End the control masters the command's tree calls left on its parent nodes for the
    next call: one more tree call (over the masters: no login), marked last, given up
    after ``timeout`` s; a node the tree no longer carried, on its own open connection,
    given up after ``cut_timeout`` s (a lost node's would otherwise hold up the command's
    end).  Best effort: a node it cannot reach has its masters end after
    :data:`MUX_PERSIST` idle seconds, and its directory goes at a later tree call's sweep."""
    memo = cluster.tree_memo
    memo["mux_closed"] = True   # a call after this one keeps nothing
    if not memo.get("mux_open"):
        return
    memo["mux_open"] = False
    dirs = memo.get("mux", {})
    failed = memo.get("failed", set())
    names = [n for n in dirs if n not in failed]
    try:
        if names:
            bounded(lambda: _through_tree(cluster, {n: [Command(("true",))] for n in names},
                                          lambda *a: None, timeout, last=True), timeout, "tree-close")
    except Exception:   # noqa: BLE001 - the masters end by themselves after MUX_PERSIST s
        pass
    # a node the tree stopped carrying (its hop failed, a followed run's node went on on its
    # own connection) may hold masters from before: on that connection, when it is open
    cut = [n for n in dirs if n in failed and cluster.is_connected(n)]
    if cut:
        cluster.map(lambda conn: bounded(
            lambda: conn.run(["sh", "-c", CLOSE_MUX, "clusterctl-tree", dirs[conn.name]], timeout=cut_timeout),
            cut_timeout, "tree-close"), nodes=cut)


def _feed(chan, data: bytes) -> None:
    try:
        chan.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass


__all__ = ["AUTO", "AUTO_MIN_NODES", "CHUNK", "DEFAULT_WIDTH", "Command", "Receiver", "Sink", "TreeRun",
           "close_reuse", "enabled", "parse_results", "plan_tree", "run_commands", "run_through_tree"]

