"""The node's half of shipping code: the real ``sh`` programs of clusterctl.code.sync, run here.

The programs are what every node runs (GNU sh, coreutils, tar, gzip); here they run in a
temporary ``code_dir`` on this machine, fed exactly the bytes sync sends.  A local stand-in
replaces only the SSH channel (``LocalConnection``: argv + stdin -> exit code and output);
the SSH path itself is tested on the sandbox (tests/run/test_workdir.py).
"""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterctl.cluster.transport.commands import CommandResult
from clusterctl.code import snapshot, store, sync
from clusterctl.core.errors import NodeError


@dataclass
class LocalConnection:
    """Runs a node command on this machine (stand-in for the SSH channel only)."""

    name: str = "local"
    runs: int = 0

    def run(self, argv, *, stdin=None, timeout=None, check=False):
        self.runs += 1
        p = subprocess.run(list(argv), input=stdin or b"", capture_output=True, timeout=timeout or 60)
        r = CommandResult(self.name, list(argv), p.returncode, p.stdout.decode(), p.stderr.decode())
        return r.check() if check else r


@dataclass(frozen=True)
class Node:
    name: str
    code_dir: str
    host: str = "local"
    port: int = 22
    user: str | None = None


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def ship(root: Path, node: Node, conn: LocalConnection, known: str | None = None) -> sync.NodeSync:
    tree = store.save(snapshot.take(root))
    return sync._one(conn, node, tree, sync._Payloads(tree), known)


def files_of(tree: Path) -> dict[str, str]:
    return {str(p.relative_to(tree)): p.read_text() for p in sorted(tree.rglob("*")) if p.is_file()}


def test_cold_then_edit_sends_only_the_change_and_never_writes_through_a_shared_link(tmp_path, cache):
    proj, node_dir = tmp_path / "proj", tmp_path / "node"
    write(proj, {f"pkg/m{i}.py": f"X = {i}\n" * 200 for i in range(50)} | {"train.py": "print(1)\n"})
    node, conn = Node("n1", str(node_dir)), LocalConnection()

    first = ship(proj, node, conn)
    assert first.how == "full" and first.round_trips == 2          # probe, then the whole tree
    assert files_of(Path(first.path)) == files_of(proj)

    (proj / "train.py").write_text("print(2)\n")
    second = ship(proj, node, conn, known=Path(first.path).name)
    assert second.how == "delta" and second.round_trips == 1        # the usual edit: one command
    assert second.sent < 1024 < first.sent, (first.sent, second.sent)
    assert files_of(Path(second.path)) == files_of(proj)
    # the unchanged files are hard links shared with the first tree; the changed one is not,
    # and the first tree still holds the old text (nothing was written in place)
    assert os.stat(Path(second.path) / "pkg/m1.py").st_ino == os.stat(Path(first.path) / "pkg/m1.py").st_ino
    assert (Path(first.path) / "train.py").read_text() == "print(1)\n"
    assert (Path(second.path) / "train.py").read_text() == "print(2)\n"

    again = ship(proj, node, conn, known=Path(second.path).name)
    assert (again.how, again.sent, again.round_trips) == ("present", 0, 1)


def test_removed_files_kind_changes_and_modes(tmp_path, cache):
    proj, node, conn = tmp_path / "proj", Node("n1", str(tmp_path / "node")), LocalConnection()
    write(proj, {"a/b.py": "b\n", "gone.py": "g\n", "run.sh": "echo\n"})
    first = ship(proj, node, conn)
    (proj / "gone.py").unlink()
    (proj / "a/b.py").unlink()
    (proj / "a").rmdir()
    write(proj, {"a": "now a file\n"})               # a directory became a file
    (proj / "run.sh").chmod(0o755)                    # only the mode changed
    second = ship(proj, node, conn, known=Path(first.path).name)
    assert second.how == "delta"
    tree = Path(second.path)
    assert files_of(tree) == {"a": "now a file\n", "run.sh": "echo\n"}
    assert os.stat(tree / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(Path(first.path) / "run.sh").st_mode & 0o777 == 0o644   # the base kept its mode


def test_a_base_the_node_no_longer_has_falls_back_to_the_probe(tmp_path, cache):
    proj, node, conn = tmp_path / "proj", Node("n1", str(tmp_path / "node")), LocalConnection()
    write(proj, {"x.py": "1\n", "y.py": "y\n"})
    first = ship(proj, node, conn)
    write(proj, {"x.py": "2\n"})
    never_sent = store.save(snapshot.take(proj))      # the head wrongly believes the node has it
    write(proj, {"x.py": "3\n"})
    done = ship(proj, node, conn, known=never_sent.digest.split(":")[1])
    # APPLY answers nobase (exit 3), the probe lists what the node has, a delta against it
    assert (done.how, done.base, done.round_trips) == ("delta", Path(first.path).name, 3)
    assert files_of(Path(done.path)) == {"x.py": "3\n", "y.py": "y\n"}


def test_two_processes_building_the_same_tree_at_once_both_end_with_it(tmp_path, cache):
    proj, node = tmp_path / "proj", Node("n1", str(tmp_path / "node"))
    write(proj, {f"f{i}.txt": str(i) * 1000 for i in range(200)})
    tree = store.save(snapshot.take(proj))
    results, errors = [], []

    def one():
        try:
            results.append(sync._one(LocalConnection(), node, tree, sync._Payloads(tree), None))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len({r.path for r in results}) == 1
    assert files_of(Path(results[0].path)) == files_of(proj)
    trees = Path(node.code_dir) / "trees"
    assert [p.name for p in trees.iterdir()] == [tree.digest.split(":")[1]]   # no temporary left


def test_payload_of_a_one_line_edit_in_2000_files_is_small(tmp_path, cache):
    proj = tmp_path / "proj"
    write(proj, {f"pkg{i % 50}/mod{i}.py": f"VALUE_{i} = {i}\n" * (i % 40 + 20) for i in range(2000)})
    base = store.save(snapshot.take(proj))
    (proj / "pkg7/mod7.py").write_text("VALUE_7 = 'edited'\n" * 27)
    new = store.save(snapshot.take(proj))
    data, ndrop = sync.payload(new, base.entries)
    assert ndrop == len(b"pkg7/mod7.py\0")
    assert len(data) < 64 * 1024, len(data)
    drop, add = sync.delta(base.entries, new.entries)
    assert drop == ["pkg7/mod7.py"] and [e.path for e in add] == ["pkg7/mod7.py"]


# --------------------------------------------------------------------------- whose trees
# (issue 41, item 5) a tree is found by its digest's name: a code_dir another user can
# write into could hold a planted tree under the name of the next launch's; and a tree a
# run's container mounts stays, however long the run.

def test_a_trees_directory_that_is_a_link_is_refused_naming_it_and_the_fix(tmp_path, cache):
    proj, node = tmp_path / "proj", Node("n1", str(tmp_path / "node"))
    write(proj, {"a.py": "x = 1\n"})
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "trees").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(NodeError) as e:
        ship(proj, node, LocalConnection())
    assert e.value.node == "local"      # the connection's node
    assert f"{tmp_path}/node/trees is not a directory of this user's" in str(e.value)
    assert "set the inventory's code_dir to a directory of your own" in str(e.value)
    assert list((tmp_path / "elsewhere").iterdir()) == []      # nothing written through it


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root")
def test_a_trees_directory_of_another_user_is_refused_and_a_group_writable_own_one_is_closed(tmp_path, cache):
    proj, node = tmp_path / "proj", Node("n1", str(tmp_path / "node"))
    write(proj, {"a.py": "x = 1\n"})
    trees = tmp_path / "node" / "trees"
    trees.mkdir(parents=True)
    os.chown(trees, 65534, 65534)          # nobody's
    with pytest.raises(NodeError, match="is not a directory of this user's"):
        ship(proj, node, LocalConnection())
    assert list(trees.iterdir()) == []
    os.chown(trees, 0, 0)
    trees.chmod(0o777)
    ship(proj, node, LocalConnection())
    assert trees.stat().st_mode & 0o777 == 0o755 and len(list(trees.iterdir())) == 1


@pytest.mark.docker
def test_an_old_tree_a_container_mounts_is_kept_when_older_ones_go(tmp_path, cache, docker_client, base_image,
                                                                     monkeypatch):
    """Past the newest KEEP trees, those unused for a day go, except one that a container
    (running or not yet removed) mounts: a run launched days ago keeps its code. The real
    APPLY program with the real `docker ps --filter volume=` of this machine's engine."""
    import time
    import uuid

    from clusterctl.cluster import engine

    monkeypatch.setenv("DOCKER_HOST", engine.engine_url())
    trees = tmp_path / "node" / "trees"
    old = [trees / (f"{i:02d}" + uuid.uuid4().hex * 2)[:64] for i in range(sync.KEEP + 2)]
    for i, t in enumerate(old):          # 18 trees 2 days old, old[-1] the oldest
        (t / "pkg").mkdir(parents=True)
        (t / "pkg" / "v.py").write_text(f"V = {i}\n")
        when = time.time() - 2 * 86400 - i * 60
        os.utime(t, (when, when))
    holder = docker_client.containers.create(base_image, ["true"], network_mode="none",
                                             volumes={str(old[-1]): {"bind": "/workspace", "mode": "ro"}})
    try:
        proj = tmp_path / "proj"
        write(proj, {"a.py": "x = 1\n"})
        ship(proj, Node("n1", str(tmp_path / "node")), LocalConnection())
    finally:
        holder.remove(force=True)
    left = {p.name for p in trees.iterdir()}
    assert old[-1].name in left                                  # mounted: kept
    assert old[-2].name not in left and old[-3].name not in left  # past the newest KEEP, a day old: gone
    assert {t.name for t in old[:-3]} <= left and len(left) == sync.KEEP + 1
