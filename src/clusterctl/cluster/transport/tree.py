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
naming the node.  Contract: :func:`run_commands`, :func:`plan_tree`,
:class:`Command`, :func:`enabled`.
"""

from __future__ import annotations

import base64
import functools
import getpass
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import paramiko

from clusterctl.cluster.transport.agent import HopAgent, host_key_blobs, load_key
from clusterctl.cluster.transport.commands import CommandResult
from clusterctl.cluster.transport.connection import _explicit_port
from clusterctl.cluster.transport.hopssh import HOP_KEX
from clusterctl.cluster.transport.hostkeys import host_key_name, known_hosts_index
from clusterctl.core.errors import NodeError

DEFAULT_WIDTH = 32
AUTO = "auto"
#: ``tree: auto`` takes the tree from this many nodes on: below it, a connection per node
#: costs this machine less than 0.15 s of CPU in all and its wall is lower than a hop's
#: login (docs/benchmarks/launch.md).
AUTO_MIN_NODES = 16
HOP_CONNECT_TIMEOUT = 10   # seconds a node's ssh to a child may take to log in
HEARTBEAT = 2              # seconds between a node's "alive" lines on its stderr


@dataclass(frozen=True)
class Command:
    """One command for one node: argv, and bytes for its stdin (None: no stdin)."""

    argv: tuple[str, ...]
    stdin: bytes | None = None


def enabled(cluster) -> bool:
    """Whether this call goes through the tree: ``ssh.tree: true`` and 2+ nodes, or
    ``auto`` (the default) with :data:`AUTO_MIN_NODES` or more and a caller that will not
    open every node's own connection next anyway (``cluster.each_node_anyway``: a
    followed run, code to ship), where the tree would only add its logins to those."""
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
# stdout: per command of each node of the subtree, "clusterctl-tree NAME K RC B64OUT B64ERR";
# per failed hop, "clusterctl-tree-hop NAME RC B64(its ssh's last words)".
NODE_SCRIPT = r"""
d=$1 self=$2 key=$3 prog=$4
case "$d" in /tmp/clusterctl-tree.*) ;; *) echo "not a tree directory: $d" >&2; exit 2 ;; esac
set -f
umask 077
mkdir "$d" || { echo "could not make the tree's temporary directory $d" >&2; exit 1; }
trap 'rm -rf "$d"' EXIT
trap 'exit 143' TERM
trap 'exit 129' HUP
# the session's end can reach this shell as SIGPIPE, which would skip the EXIT trap
trap 'exit 141' PIPE
req=$(cat)
{ trap '' PIPE
  while sleep $HEARTBEAT < /dev/null > /dev/null 2>&1; do echo clusterctl-alive >&2 || break; done
  kill -TERM 0; } < /dev/null > /dev/null &
hb=$!
# a word for the remote shell: single-quoted, its quotes escaped (the hop's command line)
q() { [ -n "$1" ] || { printf "''"; return; }; printf '%s' "$1" | sed "s/'/'\\\\''/g; 1s/^/'/; \$s/\$/'/"; }
qkey=$(q "$key") qprog=$(q "$prog")
b64() { x=$(base64 | tr -d '\n'); printf '%s' "${x:--}"; }
mine=$(printf '%s\n' "$req" | awk -v s="$self" '$1 == s')
[ -n "$mine" ] || { echo "no request for $self" >&2; exit 2; }
set -- $mine
path=$2
shift 7
k=0 pids=
while [ "$#" -ge 2 ]; do
  k=$((k+1))
  # the argv arrives NUL-terminated (any bytes but NUL, as docker run takes them): xargs -0
  # hands it over unchanged; the command writes its own exit status (xargs would map it)
  ( a=$1 i=$2
    if [ "$i" = - ]; then in=/dev/null; else in="$d/in.$k"; mkfifo "$in" || exit 1
      printf '%s' "$i" | base64 -d > "$in" & fi
    printf '%s' "$a" | base64 -d | IN="$in" RC="$d/rc.$k" xargs -0 -x sh -c \
      '"$@" < "$IN"; echo $? > "$RC"' sh > "$d/out.$k" 2> "$d/err.$k"
    [ -s "$d/rc.$k" ] || echo 127 > "$d/rc.$k"
    [ "$i" = - ] || kill $! 2>/dev/null ) < /dev/null &
  pids="$pids $!"
  shift 2
done
n=0
for child in $(printf '%s\n' "$req" | awk -v p="$path" '{ if (index($2, p "/") == 1 && index(substr($2, length(p) + 2), "/") == 0) print $1 }'); do
  n=$((n+1))
  set -- $(printf '%s\n' "$req" | awk -v s="$child" '$1 == s')
  cpath=$2 cdir=$3 port=$4 user=$5 host=$6
  printf '%s' "$7" | base64 -d > "$d/kh.$n"
  printf '%s\n' "$child" > "$d/name.$n"
  if printf '%s\n' "$req" | awk -v p="$cpath" '{ if (index($2, p "/") == 1) f = 1 } END { exit !f }'; then
    fwd=yes; else fwd=no; fi
  if [ -n "$key" ]; then
    auth="-o IdentitiesOnly=yes -o IdentityAgent=none -o ForwardAgent=no"; fwd=no
  else auth="-o ForwardAgent=$fwd"; fi
  [ "$TRACE" = 1 ] && echo "clusterctl-mark hop $child start" >&2
  { printf '%s\n' "$req" | awk -v p="$cpath" '$2 == p || index($2, p "/") == 1' |
      ssh -F /dev/null -T -o BatchMode=yes -o StrictHostKeyChecking=yes \
        -o UserKnownHostsFile="$d/kh.$n" -o GlobalKnownHostsFile=/dev/null \
        -o ConnectTimeout=$HOP_CONNECT_TIMEOUT -o ServerAliveInterval=5 -o ServerAliveCountMax=3 \
        -o KexAlgorithms=$HOP_KEX -o ClearAllForwardings=yes -o LogLevel=ERROR $auth ${key:+-i "$key"} \
        -p "$port" -l "$user" -- "$host" \
        "sh -c $prog clusterctl-tree $cdir $child $qkey $qprog" \
        > "$d/hop.$n" 2> "$d/hoperr.$n"
    echo $? > "$d/hoprc.$n"; } < /dev/null &
  pids="$pids $!"
done
wait $pids
j=0
while [ "$j" -lt "$k" ]; do j=$((j+1))
  printf 'clusterctl-tree %s %s %s %s %s\n' "$self" "$j" "$(cat "$d/rc.$j")" \
    "$(b64 < "$d/out.$j")" "$(b64 < "$d/err.$j")"
done
j=0
while [ "$j" -lt "$n" ]; do j=$((j+1))
  cat "$d/hop.$j"
  rc=$(cat "$d/hoprc.$j")
  [ "$rc" = 0 ] || printf 'clusterctl-tree-hop %s %s %s\n' "$(cat "$d/name.$j")" "$rc" \
    "$(grep -v '^clusterctl-alive$' "$d/hoperr.$j" | tail -n 5 | b64)"
done
kill "$hb" 2>/dev/null
exit 0
"""


@dataclass
class _Hop:
    """How a parent node reaches one node: its address and the host key known here."""

    user: str
    host: str
    port: int
    known_host: str


def _hops(cluster):
    """node -> its _Hop (or None), worked out once per node for the whole command (launch
    asks twice: preflight, start), with known_hosts indexed by name once: looking each node
    up in the file's entries was O(nodes x entries)."""
    memo = cluster.tree_memo
    if "index" not in memo:
        memo["index"] = known_hosts_index(cluster.known_host_keys())
        memo["lookup"] = cluster.ssh_lookup()
        memo["hops"] = {}

    def hop_of(node) -> _Hop | None:
        if node.name not in memo["hops"]:
            memo["hops"][node.name] = _hop_of(node, memo["lookup"], memo["index"])
        return memo["hops"][node.name]
    return hop_of


def _hop_of(node, lookup, index) -> _Hop | None:
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
                  commands: Sequence[Command]) -> str:
    fields = [name, path, directory, str(hop.port) if hop else "0", hop.user if hop else "-",
              hop.host if hop else "-", _b64(hop.known_host.encode()) if hop else "-"]
    for c in commands:
        # every argument NUL-terminated, so an empty last one is kept
        fields += [_b64(b"".join(a.encode() + b"\0" for a in c.argv)), _b64(c.stdin or b"")]
    return " ".join(fields)


_RESULT = re.compile(r"clusterctl-tree (\S+) (\d+) (-?\d+) (\S+) (\S+)")
_HOP = re.compile(r"clusterctl-tree-hop (\S+) (\d+) (\S*)")


def parse_results(stdout: str, commands: Mapping[str, Sequence[Command]]
                  ) -> tuple[dict[str, list[CommandResult]], dict[str, str]]:
    """The tree's stdout -> ({node: its commands' results, complete nodes only},
    {node: why its hop failed}).  Pure."""
    got: dict[str, dict[int, CommandResult]] = {}
    hops: dict[str, str] = {}
    for line in stdout.splitlines():
        m = _RESULT.fullmatch(line)
        if m and m.group(1) in commands:
            name, k = m.group(1), int(m.group(2))
            if 1 <= k <= len(commands[name]):
                out, err = (_unb64(m.group(i)) for i in (4, 5))
                got.setdefault(name, {})[k] = CommandResult(
                    name, list(commands[name][k - 1].argv), int(m.group(3)), out, err)
            continue
        m = _HOP.fullmatch(line)
        if m:
            words = _unb64(m.group(3)).strip().replace("\n", "; ")
            hops[m.group(1)] = (f"ssh from its parent node exited {m.group(2)}"
                                + (f": {words}" if words else ""))
    complete = {n: [r[k] for k in sorted(r)] for n, r in got.items()
                if sorted(r) == list(range(1, len(commands[n]) + 1))}
    return complete, hops


def _unb64(text: str) -> str:
    if text in ("", "-"):
        return ""
    try:
        return base64.b64decode(text).decode("utf-8", "replace")
    except ValueError:
        return ""


def run_commands(cluster, commands: Mapping[str, Sequence[Command]], *,
                 timeout: float = 120.0, on_tree=None) -> dict[str, list[CommandResult] | NodeError]:
    """Run each node's commands (all of a node's at once) and return their results,
    {node: [CommandResult, ...] in the given order, or NodeError} in the given node order.

    Through the tree when :func:`enabled`, else (and for every node the tree did not
    bring back) on each node's own connection.  ``on_tree(info)``, when given, is called
    with what the tree did (``{"tree": [...], "direct": [...], "hops": {...}}``)."""
    order = list(commands)
    results: dict[str, list[CommandResult] | NodeError] = {}
    info: dict = {"tree": [], "direct": [], "hops": {}}
    if enabled(cluster) and len(order) > 1:
        try:
            done, hops, planned = _through_tree(cluster, commands, timeout)
        except NodeError as e:   # the root itself (unreachable): the others go direct
            done, hops, planned = {e.node: e}, {}, []
        results.update(done)
        info["tree"], info["hops"] = planned, hops
        # a hop that failed is not tried again in this command (launch makes two tree calls:
        # a node the others cannot reach would make the second wait for its timeout again)
        cluster.tree_memo.setdefault("failed", set()).update(hops)
    rest = [n for n in order if n not in results]
    info["direct"] = rest
    if rest:
        results.update(_direct(cluster, {n: commands[n] for n in rest}, timeout))
    if on_tree is not None:
        on_tree(info)
    return {n: results[n] for n in order}


def _direct(cluster, commands: Mapping[str, Sequence[Command]], timeout: float):
    def one(conn):
        cmds = commands[conn.name]
        if len(cmds) == 1:
            return [conn.run(list(cmds[0].argv), stdin=cmds[0].stdin, timeout=timeout)]
        with ThreadPoolExecutor(len(cmds)) as pool:
            futures = [pool.submit(conn.run, list(c.argv), stdin=c.stdin, timeout=timeout) for c in cmds]
            return [f.result() for f in futures]
    return cluster.map(one, nodes=list(commands))


def _through_tree(cluster, commands: Mapping[str, Sequence[Command]], timeout: float):
    """(results of the nodes that came back, {node: hop failure}, the nodes planned)."""
    ssh = cluster.inventory.ssh
    key_on_nodes = getattr(ssh, "node_identity_file", None)
    width = int(getattr(ssh, "tree_width", DEFAULT_WIDTH) or DEFAULT_WIDTH)
    nodes = {n.name: n for n in cluster.nodes}
    names = list(commands)
    root = nodes[names[0]]
    failed_before = cluster.tree_memo.get("failed", set())
    if (not key_on_nodes and root.identity_file is None) or root.name in failed_before:
        return {}, {}, []   # nothing to sign node-to-node logins with, or no tree: every node direct
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
    if len(members) < 2:
        return {}, {}, []
    paths = plan_tree(members, width)
    token = secrets.token_hex(6)
    dirs = {n: f"/tmp/clusterctl-tree.{token}.{secrets.token_hex(5)}" for n in members}
    request = "".join(_request_line(n, paths[n], dirs[n], hops.get(n), commands[n]) + "\n"
                      for n in members).encode()
    conn = cluster.connection(root.name)
    agent = None
    if not key_on_nodes:
        try:
            agent = HopAgent(load_key(root.identity_file), budget=len(members) - 1,
                             destinations=host_key_blobs(line for hop in hops.values()
                                                          for line in hop.known_host.splitlines()))
        except (OSError, TypeError, paramiko.SSHException) as e:   # every node goes direct
            return {}, {root.name: f"the tree needs the inventory's identity_file to sign "
                                   f"node-to-node logins: {e}"}, []
    script = (NODE_SCRIPT.replace("$HEARTBEAT", str(HEARTBEAT))
              .replace("$HOP_CONNECT_TIMEOUT", str(HOP_CONNECT_TIMEOUT)).replace("$HOP_KEX", HOP_KEX)
              .replace("$TRACE", "0"))
    quoted = shlex.quote(script)
    argv = ["sh", "-c", script, "clusterctl-tree", dirs[root.name], root.name,
            str(key_on_nodes or ""), quoted]
    depth = max(p.count("/") for p in paths.values())
    failure: NodeError | None = None
    try:
        chan = conn.exec_channel(argv, forward_agent=agent.handler if agent else None)
        _feed(chan, request)   # the node reads it all first (into memory), then works
        result = conn.wait_channel(chan, ["clusterctl tree"],
                                   timeout=timeout + depth * (HOP_CONNECT_TIMEOUT + 5))
    except NodeError as e:
        result, failure = None, e
    finally:
        if agent is not None:
            agent.close()
    if result is None:
        assert failure is not None
        if failure.node == root.name and "timed out" not in failure.reason:
            raise failure
        return {}, {root.name: failure.reason}, members
    done, hop_failures = parse_results(result.stdout, {n: commands[n] for n in members})
    if agent is not None and agent.refused:
        why = f"; this machine's agent refused to sign {agent.refused[0]}"
        hop_failures = {n: w + why for n, w in hop_failures.items()}
    if root.name not in done:
        why = result.stderr.replace("clusterctl-alive\n", "").strip()[-400:]
        hop_failures.setdefault(root.name, f"the tree's command exited {result.exit_code}"
                                + (f": {why}" if why else ""))
    return done, hop_failures, members


def _feed(chan, data: bytes) -> None:
    try:
        chan.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass


__all__ = ["AUTO", "AUTO_MIN_NODES", "DEFAULT_WIDTH", "Command", "enabled", "parse_results", "plan_tree", "run_commands"]

