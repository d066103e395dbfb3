"""`clusterctl clean`'s decision (pure, one table of cases), its reading of the node's
listing and removal, and the removal script run for real on this machine's files: a tree
that is a planted link, a name that is not a tree's, a tree used since the listing and a
kept-login directory with a live socket all stay."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from clusterctl.cluster import clean
from clusterctl.cluster.clean import Container, Item, Listing, Policy, decide
from clusterctl.cluster.inventory.model import Node

NOW = 1_000_000_000.0
DAY = 86400.0
A, B, C = "a" * 64, "b" * 64, "c" * 64
IMG1, IMG2, IMG3 = (f"sha256:{x * 64}" for x in "123")


def tree(name, days, size=1000):
    return Item("tree", name, size, NOW - days * DAY, stamp=str(int(NOW - days * DAY)))


def image(name, days, size):
    return Item("image", name, size, NOW - days * DAY)


def login(name, minutes, sockets):
    return Item("login", name, 4096, NOW - minutes * 60, detail=str(sockets))


def running(image_id="sha256:" + "9" * 64, *mounts, status="running", run="r1"):
    return Container("c" + status, status, image_id, run, tuple(mounts))


# (what the node holds, its containers, the policy) -> the names that go
CASES = {
    "a tree a live container mounts stays, however old": (
        [tree(A, 30), tree(B, 30)], [running(IMG1, f"/home/u/.cache/clusterctl/code/trees/{A}")],
        Policy(), {B}),
    "a tree mounted through another path (a linked code_dir) is still seen": (
        [tree(A, 30)], [running(IMG1, f"/scratch/code/trees/{A}/")], Policy(), set()),
    "an ended container's tree may go": (
        [tree(A, 30)], [running(IMG1, f"/c/trees/{A}", status="exited")], Policy(), {A}),
    "a created (not yet started) container's tree stays": (
        [tree(A, 30)], [running(IMG1, f"/c/trees/{A}", status="created")], Policy(), set()),
    "a tree used within --older-than stays": (
        [tree(A, 0.5), tree(B, 2)], [], Policy(older_than=DAY), {B}),
    "--older-than 0: every unused tree": (
        [tree(A, 0), tree(B, 2)], [], Policy(older_than=0), {A, B}),
    "a path that merely contains the digest is not that tree": (
        [tree(A, 30)], [running(IMG1, f"/data/{A}")], Policy(), {A}),
    "an image any container uses stays (the engine would refuse it)": (
        [image(IMG1, 30, 10), image(IMG2, 30, 10)], [running(IMG1, status="exited")], Policy(), {IMG2}),
    "a young image stays": (
        [image(IMG1, 0.1, 10), image(IMG2, 3, 10)], [], Policy(older_than=DAY), {IMG2}),
    "--keep-size removes the oldest young unused images until the rest fit": (
        [image(IMG1, 0.1, 50), image(IMG2, 0.2, 50), image(IMG3, 0.3, 50)], [],
        Policy(older_than=DAY, keep_size=100), {IMG3}),
    "--keep-size counts the used images but never removes them": (
        [image(IMG1, 0.1, 80), image(IMG2, 0.2, 50), image(IMG3, 0.3, 50)], [running(IMG1)],
        Policy(older_than=DAY, keep_size=100), {IMG2, IMG3}),
    "--keep-size already met: nothing more goes": (
        [image(IMG1, 0.1, 50), image(IMG2, 5, 500)], [], Policy(older_than=DAY, keep_size=100), {IMG2}),
    "a kept-login directory with a live login stays": (
        [login("clusterctl-mux.x1", 60, 1), login("clusterctl-mux.x2", 60, 0)], [], Policy(),
        {"clusterctl-mux.x2"}),
    "a new kept-login directory stays (a call may be making its login)": (
        [login("clusterctl-mux.x1", 2, 0)], [], Policy(older_than=0), set()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_decide(name):
    items, containers, policy, going = CASES[name]
    verdicts = decide(Listing("n1", NOW, "/c/trees", tuple(items), tuple(containers)), policy)
    assert [v.item for v in verdicts] == items
    assert {v.item.name for v in verdicts if v.remove} == going
    assert all(v.reason for v in verdicts)


def _inspect_line(cid, status, image_id, mounts, run="r7"):
    return "container " + json.dumps({"Id": cid, "Image": image_id, "State": {"Status": status},
                                      "Config": {"Labels": {"io.clusterctl.run": run}},
                                      "Mounts": [{"Source": m} for m in mounts]})


def test_a_listing_is_read_and_an_image_with_two_names_counts_once():
    img = {"Id": IMG1, "Size": 123, "Created": "2020-01-01T00:00:00.123456789Z",
           "Metadata": {"LastTagTime": "2021-01-01T00:00:00+01:00"}, "RepoTags": ["x:1", "y:2"]}
    text = "\n".join([
        "now 1700000000", "trees /c/trees", f"tree {A} 8 1600000000",
        "login clusterctl-mux.ab.cd 4 1650000000 2",
        _inspect_line("cid", "running", IMG1, [f"/c/trees/{A}"]),
        "image " + json.dumps(img), "image " + json.dumps(img), ""])
    got = clean.parse_listing("n1", text)
    assert got.now == 1700000000 and got.trees_dir == "/c/trees"
    assert got.items == (Item("tree", A, 8192, 1600000000.0, stamp="1600000000"),
                         Item("login", "clusterctl-mux.ab.cd", 4096, 1650000000.0, detail="2"),
                         Item("image", IMG1, 123, 1609455600.0, detail="x:1 y:2"))
    assert got.containers == (Container("cid", "running", IMG1, "r7", (f"/c/trees/{A}",)),)


@pytest.mark.parametrize("text,why", [
    ("tree abc 1 2\nnow 1", "not a tree digest"),
    ("now 1\nlogin ../etc 1 2 0", "not a kept-login directory"),
    ("now 1\nimage {\"Id\": \"../x\"}", "not an image ID"),
    ("now 1\nengine-error listing the containers", "the container runtime did not answer"),
    ("now 1\nrm -rf /", "not a line clean-list.sh writes"),
    ("tree " + A + " 1 2", "no 'now' line"),
])
def test_a_listing_that_is_not_the_scripts_is_refused_naming_the_line(text, why):
    with pytest.raises(ValueError, match=why):
        clean.parse_listing("n1", text)


def test_the_removal_command_refuses_a_name_that_is_not_an_items():
    node = Node(name="n1", host="h", code_dir="/c")
    argv = clean.remove_command(node, [tree(A, 3), image(IMG1, 3, 1), login("clusterctl-mux.q", 30, 0)])
    assert argv[3:] == ("clusterctl-clean", "/c", "tree", A, str(int(NOW - 3 * DAY)),
                        "image", IMG1, "-", "login", "clusterctl-mux.q", "-")
    assert "docker image rm --force" in argv[2]
    for bad in (Item("tree", "../" + A, 1, 0), Item("login", "clusterctl-mux.x/../../etc", 1, 0),
                Item("image", "ubuntu", 1, 0), Item("file", "x", 1, 0)):
        with pytest.raises(ValueError, match="is not an item clean removes"):
            clean.remove_command(node, [bad])


def test_removal_lines_are_read_and_an_unmentioned_item_is_left():
    chosen = [tree(A, 3, 5000), tree(B, 3), image(IMG1, 3, 77), tree(C, 3)]
    removed, left = clean.parse_removal(
        f"removed tree {A} 8\ngone tree {B}\nremoved image {IMG1} 0\nnoise\n", chosen)
    assert removed == {A: 8192, B: 0, IMG1: 77}
    assert left == {C: "the node did not say it removed it"}


def test_the_removal_script_on_real_files_removes_only_what_it_was_given_and_may(tmp_path):
    """The node's half run here, as a node runs it (sh -c): the trees' directory under a
    code_dir; what it must keep is planted around what it removes."""
    trees = tmp_path / "code" / "trees"
    for name in (A, B, C):
        (trees / name / "sub").mkdir(parents=True)
        (trees / name / "sub" / "f").write_text("x" * 5000)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    d = "d" * 64
    (trees / d).symlink_to(outside)               # a planted link named like a tree
    os.utime(trees / B, (NOW, NOW))               # B was used after the listing saw it
    stamps = {n: str(int((trees / n).stat().st_mtime)) for n in (A, C)}
    login_dir = Path(f"/tmp/clusterctl-mux.cleantest{os.getpid()}")
    login_dir.mkdir()
    live = Path(f"/tmp/clusterctl-mux.cleantestlive{os.getpid()}")
    live.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(live / "s"))
        node = Node(name="n1", host="h", code_dir=str(tmp_path / "code"))
        items = [Item("tree", A, 1, 0, stamp=stamps[A]), Item("tree", B, 1, 0, stamp="1"),
                 Item("tree", C, 1, 0, stamp=stamps[C]), Item("tree", d, 1, 0, stamp="0"),
                 Item("tree", "e" * 64, 1, 0, stamp="0"),
                 Item("login", login_dir.name, 1, 0), Item("login", live.name, 1, 0)]
        argv = clean.remove_command(node, items)
        got = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert got.returncode == 0, got.stderr
        removed, left = clean.parse_removal(got.stdout, items)
        assert set(removed) == {A, C, "e" * 64, login_dir.name}, got.stdout
        assert removed["e" * 64] == 0                      # not there: gone, nothing freed
        assert removed[A] >= 8192
        assert left == {B: "used since it was listed", d: "not a directory",
                        live.name: "a login is live in it"}, got.stdout
        assert not (trees / A).exists() and not (trees / C).exists() and (trees / B / "sub" / "f").exists()
        assert (outside / "keep").read_text() == "precious" and (trees / d).is_symlink()
        assert not login_dir.exists() and live.exists()
    finally:
        sock.close()
        for p in (login_dir, live):
            subprocess.run(["rm", "-rf", str(p)], check=False)


def _cli(*args):
    from typer.testing import CliRunner

    from clusterctl.cli import app
    return CliRunner().invoke(app, ["clean", *args])


@pytest.mark.parametrize("args,message", [
    (["--older-than", "soon"], "--older-than 'soon': 'soon' is not a duration; valid: a duration"),
    (["--keep-size", "lots"], "--keep-size 'lots' is not a size"),
])
def test_bad_flags_exit_2_naming_the_flag(tmp_path, args, message):
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("nodes:\n  - {name: n1, host: 127.0.0.1}\n")
    res = _cli("--nodes", str(inventory), *args)
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()), res.output


def test_a_node_that_cannot_be_reached_is_named_and_exits_1(tmp_path):
    """A real refused connection (a port nothing listens on), not a stand-in."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # closed again before the command connects
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(f"nodes:\n  - {{name: lost1, host: 127.0.0.1, port: {port}}}\n")
    res = _cli("--nodes", str(inventory), "--json")
    assert res.exit_code == 1, res.output
    (report,) = json.loads(res.output)
    assert report["node"] == "lost1" and report["error"] and report["items"] == []
    res = _cli("--nodes", str(inventory))
    assert res.exit_code == 1 and res.output.startswith("lost1: failed: "), res.output
    assert res.output.rstrip().endswith("failed: lost1"), res.output


@pytest.mark.skipif(os.geteuid() != 0 or not __import__("shutil").which("podman"),
                    reason="needs root and podman (rootful storage; `make setup` installs podman)")
def test_the_listing_and_removal_on_a_real_podman(tmp_path):
    """Issue 42: `clean` on a Podman node. Podman prints `inspect --format '{{json .}}'` as one
    indented array (not a line per object), refuses `{{json .Id}}`, and gives bare hex IDs: the
    real listing script with the real podman reads its image and container as on docker."""
    import uuid

    tag = f"localhost/clusterctl-clean-test:{uuid.uuid4().hex[:8]}"
    tar = tmp_path / "root.tar"
    (tmp_path / "f").write_text("x\n")
    subprocess.run(["tar", "-cf", str(tar), "-C", str(tmp_path), "f"], check=True)
    image_id = "sha256:" + subprocess.run(
        ["podman", "import", "--change", "LABEL io.clusterctl.target=cpu", str(tar), tag],
        capture_output=True, text=True, check=True).stdout.strip().removeprefix("sha256:")
    mounted = tmp_path / "code" / "trees" / A
    mounted.mkdir(parents=True)
    box = f"clusterctl-clean-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["podman", "create", "--name", box, "--label", "io.clusterctl.run=r9",
                    "-v", f"{mounted}:/workspace:ro", tag, "/f"], capture_output=True, check=True)
    try:
        node = Node(name="n1", host="h", code_dir=str(tmp_path / "code"), runtime="podman")
        out = subprocess.run(list(clean.list_command(node)), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        listing = clean.parse_listing("n1", out.stdout)
        (img,) = [i for i in listing.items if i.kind == "image" and i.name == image_id]
        assert img.bytes > 0 and tag in img.detail and img.used > 0
        (c,) = [c for c in listing.containers if c.run == "r9"]
        assert c.image == image_id and c.status == "created" and str(mounted) in c.mounts
        subprocess.run(["podman", "rm", "--force", box], capture_output=True, check=True)
        done = subprocess.run(list(clean.remove_command(node, [img])), capture_output=True, text=True,
                              timeout=60)
        assert clean.parse_removal(done.stdout, [img])[0] == {image_id: img.bytes}, done.stdout + done.stderr
        assert subprocess.run(["podman", "image", "exists", image_id]).returncode == 1
    finally:
        subprocess.run(["podman", "rm", "--force", box], capture_output=True)
        subprocess.run(["podman", "rmi", "--force", tag], capture_output=True)
