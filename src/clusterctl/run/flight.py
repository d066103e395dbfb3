"""PyTorch's flight recorder dumps: from the run's directory on each node into ``runs/<id>/flight/``.

On a target with a ``flight_recorder`` (nccl), the plan mounts a directory of the run on
each node (:func:`clusterctl.run.plan.flight_dir`, derived again from the run id and the node's
name, never read from run.json) where the
ranks write their dumps when a collective times out.  :func:`collect` copies what is there
into ``runs/<run-id>/flight/<node>/`` and removes the run's directory from the node, so
nothing of the run stays there; ``launch`` calls it after a followed run, ``stop`` after
stopping a detached one.
"""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.cluster import containers
from clusterctl.run.plan import NODE_RUN_ROOT, flight_dir
from clusterctl.run.records import RunRecord, check_run_id

if TYPE_CHECKING:
    from clusterctl.cluster.transport import Cluster, NodeConnection

#: The directory under runs/<id>/ that holds each node's dumps.
FLIGHT_DIR = "flight"
#: Where the parts of a run's directory that must be safe start: the node's shared /var/tmp
#: (anyone may create clusterctl/ there first).
NODE_RUN_TOP = NODE_RUN_ROOT.split("/clusterctl/", 1)[0]


def node_dirs(record: RunRecord, names: set[str], *, skip: Sequence[str] = ()) -> dict[str, str]:
    """node -> the directory of its dumps, for the nodes of ``record`` that had one and are in
    the inventory (``names``).  The path comes from the run id and the node's name
    (:func:`clusterctl.run.plan.flight_dir`), never from the record: a record may have been
    written by someone else, and its ``flight_dir`` only says there is one; ``collect``
    removes what is there."""
    check_run_id(record.run_id)
    return {n.node: flight_dir(record.run_id, n.node) for n in record.nodes
            if n.flight_dir and n.node not in skip and n.node in names}


def collect(cluster: Cluster, record: RunRecord, *, skip: Sequence[str] = ()) -> dict[str, list[str] | str]:
    """Every node's dumps into ``runs/<id>/flight/<node>/``, then the run's directory on the node
    is removed.  node -> the files kept ([] when none), or why they could not be collected.
    A node whose run directory another user could have planted or could swap (a link, not
    a directory, their own, or writable by them: :func:`containers.path_problem` from
    /var/tmp down) is neither read nor removed, and says why."""
    wanted = node_dirs(record, {n.name for n in cluster.inventory.nodes}, skip=skip)
    if not wanted:
        return {}

    safe: set[str] = set()

    def one(conn: NodeConnection) -> list[str] | str:
        node_dir = wanted[conn.name]
        problem = containers.path_problem(conn, NODE_RUN_TOP, node_dir)
        if problem:     # planted or swappable by another user: neither read nor removed
            return f"not collected, and left on the node: {problem}"
        safe.add(conn.name)
        data = containers.copy_out(conn, node_dir)
        kept = untar(base64.b64decode(data), record.attempt_dir() / FLIGHT_DIR / conn.name) if data else []
        containers.remove_dir(conn, node_dir.rsplit("/", 1)[0])   # <root>/<run-id>/<node>
        return kept

    def run_dir_gone(conn: NodeConnection) -> None:  # after every node's own part: nodes may share a file system
        conn.run(["rmdir", "--ignore-fail-on-non-empty", wanted[conn.name].rsplit("/", 2)[0]], timeout=30)

    got = cluster.map(one, nodes=list(wanted))
    cluster.map(run_dir_gone, nodes=[n for n in wanted if n in safe])
    return {n: r if isinstance(r, list | str) else f"not collected: {getattr(r, 'reason', r)}"
            for n, r in got.items()}


def untar(data: bytes, dest: Path) -> list[str]:
    """The regular files of a tar (no links, no absolute or ``..`` names) under ``dest``."""
    kept = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            name = Path(m.name)
            if not m.isfile() or name.is_absolute() or ".." in name.parts:
                continue
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            target.write_bytes(src.read() if src else b"")
            kept.append(str(name))
    return sorted(kept)
