"""Put a project tree on every node: only what the node lacks travels, in one round trip.

Each node keeps its copies under its ``code_dir`` (inventory key; default
``~/.cache/clusterctl/code``) as ``trees/<digest hex>/``: one complete, read-only-mounted
directory per tree digest.  A new tree is made on the node from the closest tree it already
has, with hard links (``cp -al``, like ``rsync --link-dest``): unchanged files cost no bytes and
no disk, and the files that changed arrive in a gzip'd tar.  A tree is built in a temporary
directory and renamed into place (``mv -T``), so a tree directory is always complete, and two
launches building the same tree at once both end with it.

One SSH command per node in the usual cases (:data:`APPLY`):

- the tree is there: nothing is sent (the node answers ``present``);
- the head knows which tree the node got last (``nodes.json`` in the head's code store) and
  still has that tree's manifest: the difference is sent at once, as a list of paths to drop
  and a tar of what is new (a one-line edit: a few hundred bytes gzip'd);
- otherwise the node is asked which trees it has (:data:`PROBE`), newest first, and the
  difference against the first one the head knows is sent (the whole tree when none).

The node programs are constant ``sh`` texts (GNU coreutils and tar, gzip): the values arrive
as positional parameters, never as shell text.  Nothing but the trees is left on the node; a
temporary directory is removed when the command ends, and one left by a killed command
is removed by a later one after an hour.  Trees unused (not launched) for a day are dropped
once a node holds more than :data:`KEEP` of them; the head keeps its own copy
(:mod:`clusterctl.code.store`), so a rerun of such a tree sends it again.

Contract: :func:`sync`, :class:`NodeSync`, :func:`delta`.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.cluster.runtime import node_runtime
from clusterctl.code import store
from clusterctl.code.snapshot import Entry, write_tar
from clusterctl.core.errors import NodeError
from clusterctl.core.files import write_atomic
from clusterctl.core.scripts import script_text

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Node
    from clusterctl.cluster.transport import Cluster, NodeConnection

#: Trees a node keeps without dropping any (older ones go once unused for a day).
KEEP = 16
#: Seconds a sync command may take beyond its transfer time.
BASE_TIMEOUT = 60.0
#: Bytes per second a transfer is allowed at least before it is given up.
MIN_RATE = 1 << 20

_HEX = re.compile(r"^[0-9a-f]{64}\Z")

#: The start of both: CODE_DIR's trees/ made, and refused (exit 4, the reason on stderr)
#: unless it is a directory of the connecting user's that no one else may write.
_CODE_DIR = script_text("clusterctl.code", "sync-dir.sh")

#: ``sh -c APPLY sh CODE_DIR DIGEST BASE NREMOVE``: stdin holds NREMOVE bytes of NUL-separated
#: paths to drop from the copy of BASE, then a gzip'd tar of the new files.  Prints
#: ``present PATH`` / ``added PATH``; exit 3 ``nobase`` when BASE is not on the node.  Sent
#: with the node's runtime as ``$RT`` (a tree a container mounts is never dropped).
APPLY = _CODE_DIR + script_text("clusterctl.code", "sync-apply.sh").replace("$FIRST_UNKEPT", str(KEEP + 1))

#: ``sh -c PROBE sh CODE_DIR DIGEST``: ``present PATH``, or ``absent`` and the trees the node
#: has, newest first (at most :data:`KEEP`).
PROBE = _CODE_DIR + script_text("clusterctl.code", "sync-probe.sh").replace("$KEEP", str(KEEP))


@dataclass(frozen=True)
class NodeSync:
    """How one node got the tree: ``present`` (nothing sent), ``delta`` (against a tree it
    had) or ``full``; ``path``: the tree's absolute path on the node; ``sent``: bytes of the
    payload sent (0 for present); ``round_trips``: SSH commands used."""

    node: str
    path: str
    how: str
    sent: int
    round_trips: int
    base: str | None = None


def _hex(digest: str) -> str:
    return digest.split(":", 1)[-1]


def delta(base: Sequence[Entry], new: Sequence[Entry]) -> tuple[list[str], list[Entry]]:
    """(paths to drop from a copy of ``base``, entries to add) that turn ``base`` into ``new``.
    A changed file is dropped and added again: the copy's files are hard links shared with
    the base tree, and must never be written in place."""
    old = {e.path: e for e in base}
    fresh = {e.path: e for e in new}
    drop = [p for p, e in old.items() if fresh.get(p) != e]
    add = [e for e in new if old.get(e.path) != e]
    return drop, add


def payload(tree: store.StoredTree, base: Sequence[Entry] | None) -> tuple[bytes, int]:
    """(stdin for :data:`APPLY`, length of its drop list) turning ``base`` (None: nothing)
    into ``tree``."""
    drop, add = delta(base or (), tree.entries)
    listing = b"".join(p.encode() + b"\0" for p in drop)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as gz:
        write_tar(gz, tree, add)
    return listing + buf.getvalue(), len(listing)


# --------------------------------------------------------------------------- what the head knows

def _known_path() -> Path:
    return store.store_dir() / "nodes.json"


def node_key(node: Node) -> str:
    """A node's copy of the code, as the head remembers it: login, address, port and code_dir."""
    return f"{node.user or ''}@{node.host}:{node.port}:{node.code_dir}"


_known_lock = threading.Lock()


def _read_known() -> dict[str, str]:
    try:
        data = json.loads(_known_path().read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(data, dict) else {}


def _remember(found: dict[str, str]) -> None:
    """Record which tree each node holds now (a lost update only costs a later probe)."""
    if not found:
        return
    with _known_lock:
        known = {**_read_known(), **found}
        write_atomic(_known_path(), json.dumps(known, indent=0, sort_keys=True))


# --------------------------------------------------------------------------- sync

class _Payloads:
    """Payloads by base, made once and shared by every node that has the same base."""

    def __init__(self, tree: store.StoredTree) -> None:
        self.tree = tree
        self._made: dict[str, tuple[bytes, int]] = {}
        self._lock = threading.Lock()

    def get(self, base: str | None) -> tuple[bytes, int]:
        key = base or ""
        with self._lock:
            if key not in self._made:
                entries = store.load("sha256:" + base).entries if base else None
                self._made[key] = payload(self.tree, entries)
            return self._made[key]


def _timeout(size: int) -> float:
    return BASE_TIMEOUT + size / MIN_RATE


def _answer(result, word: str) -> str | None:
    """The tree path from a ``present PATH`` / ``added PATH`` line, else None."""
    for line in result.stdout.splitlines():
        if line.startswith(word + " /"):
            return line[len(word) + 1:]
    return None


def _apply(conn: NodeConnection, node: Node, tree, payloads: _Payloads, base: str | None):
    code_dir, runtime = node.code_dir, node_runtime(node)
    data, ndrop = payloads.get(base)
    argv = ["sh", "-c", runtime.script(APPLY), "sh", code_dir, _hex(tree.digest), base or "", str(ndrop)]
    r = conn.run(argv, stdin=data, timeout=_timeout(len(data)))
    if r.exit_code == 3 and "nobase" in r.stdout:
        return None, len(data)
    r.check()
    path = _answer(r, "present")
    if path is not None:
        return ("present", path), len(data)
    path = _answer(r, "added")
    if path is None:
        raise NodeError(conn.name, f"could not put code {tree.short} under {code_dir}: the node "
                                   f"answered {r.stdout.strip()[:200]!r}")
    return ("delta" if base else "full", path), len(data)


def _one(conn: NodeConnection, node: Node, tree: store.StoredTree, payloads: _Payloads,
         known: str | None) -> NodeSync:
    code_dir, want = node.code_dir, _hex(tree.digest)
    sent, trips = 0, 0
    if known and known != want and _HEX.match(known) and store.has("sha256:" + known):
        done, n = _apply(conn, node, tree, payloads, known)   # the usual edit: one command
        sent, trips = sent + n, trips + 1
        if done is not None:
            return NodeSync(conn.name, done[1], done[0], sent if done[0] != "present" else 0, trips, known)
    r = conn.run(["sh", "-c", PROBE, "sh", code_dir, want], timeout=BASE_TIMEOUT).check()
    trips += 1
    path = _answer(r, "present")
    if path is not None:
        return NodeSync(conn.name, path, "present", sent, trips)
    has = [x for x in r.stdout.split() if _HEX.match(x)]
    base = next((x for x in has if store.has("sha256:" + x)), None)
    done, n = _apply(conn, node, tree, payloads, base)
    sent, trips = sent + n, trips + 1
    if done is None:   # the base went away between the two commands: send it all
        done, n = _apply(conn, node, tree, payloads, None)
        sent, trips = sent + n, trips + 1
    return NodeSync(conn.name, done[1], done[0], sent, trips, base if done[0] == "delta" else None)


def sync(cluster: Cluster, tree: store.StoredTree, *, nodes: Iterable[str] | None = None,
         on_node: Callable[[NodeSync], None] | None = None) -> dict[str, NodeSync | NodeError]:
    """Put ``tree`` (from the head's store) on every node (or ``nodes``) in parallel; each
    node's :class:`NodeSync` or the NodeError that names what went wrong there."""
    known = _read_known()
    payloads = _Payloads(tree)
    by_name = {n.name: n for n in cluster.nodes}

    def one(conn: NodeConnection) -> NodeSync:
        node = by_name[conn.name]
        done = _one(conn, node, tree, payloads, known.get(node_key(node)))
        if on_node is not None:
            on_node(done)
        return done

    results = cluster.map(one, nodes=nodes)
    _remember({node_key(by_name[n]): _hex(tree.digest) for n, r in results.items()
               if isinstance(r, NodeSync)})
    return results
