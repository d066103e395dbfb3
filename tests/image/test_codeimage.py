"""clusterctl.image.codeimage: a project tree as one deterministic layer over an image.

The tree tars here are made the way clusterctl.code.snapshot.write_tar makes them (GNU
format, mtime 0, uid 0, parents before children, links as symbolic links); each test's
tree holds a unique file, so its digest and tag are its own.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import uuid
from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.image import codeimage, deps, imagebuild


def _tree_tar(path: Path, *, unique: str = "", setuid: bool = False) -> str:
    """A small project tree as a deterministic tar; returns its digest (sha256 of the tar here:
    any digest works, the image only records it)."""
    def info(name, kind, mode, size=0, link=""):
        i = tarfile.TarInfo(name)
        i.type, i.mode, i.size, i.linkname, i.mtime = kind, mode, size, link, 0
        return i

    files = {"run.sh": (0o4755 if setuid else 0o755, b"#!/bin/sh\necho ran\n"),
             "src/data.txt": (0o644, f"data {unique}\n".encode()),
             "train.py": (0o644, b"print('training')\n")}
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(*_file(info, "run.sh", *files["run.sh"]))
        tar.addfile(info("src", tarfile.DIRTYPE, 0o755))
        tar.addfile(*_file(info, "src/data.txt", *files["src/data.txt"]))
        tar.addfile(info("src/train_link.py", tarfile.SYMTYPE, 0o777, link="../train.py"))
        tar.addfile(*_file(info, "train.py", *files["train.py"]))
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _file(info, name, mode, data):
    return info(name, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data)


def _context_members(tree: Path, workdir: str = "/workspace") -> tuple[bytes, list[tarfile.TarInfo]]:
    out = io.BytesIO()
    codeimage.write_context(tree, out, workdir=workdir, dockerfile="FROM scratch\n")
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        return out.getvalue(), tar.getmembers()


# ---------------------------------------------------------------- no engine


def test_context_repacks_the_tree_under_the_workdir_with_no_time_or_owner(tmp_path):
    digest = _tree_tar(tmp_path / "tree.tar", setuid=True)
    data, members = _context_members(tmp_path / "tree.tar", "/opt/proj")
    assert [m.name for m in members] == [
        "Dockerfile", "root", "root/opt", "root/opt/proj", "root/opt/proj/run.sh", "root/opt/proj/src",
        "root/opt/proj/src/data.txt", "root/opt/proj/src/train_link.py", "root/opt/proj/train.py"]
    assert all((m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "") for m in members)
    modes = {m.name.rsplit("/", 1)[-1]: m.mode for m in members}
    assert modes["run.sh"] == 0o755          # the set-uid bit of the tree is dropped
    assert modes["data.txt"] == 0o644 and modes["proj"] == 0o755
    link = next(m for m in members if m.name.endswith("train_link.py"))
    assert link.issym() and link.linkname == "../train.py"
    assert data == _context_members(tmp_path / "tree.tar", "/opt/proj")[0]   # same bytes each time
    assert digest.startswith("sha256:")


def test_a_member_outside_the_tree_is_refused(tmp_path):
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        tar.addfile(tarfile.TarInfo("../escape"), io.BytesIO(b""))
    with pytest.raises(ClusterctlError, match="not a relative path inside the tree"):
        _context_members(bad)


@pytest.mark.parametrize("workdir", ["workspace", "/", "/a/../b", "/a b", "/x/$HOME", "/a/.hidden/../x"])
def test_a_workdir_that_is_not_a_plain_absolute_path_is_refused(workdir):
    with pytest.raises(UserError, match="valid: an absolute path"):
        codeimage.check_workdir(workdir)


def test_tag_and_digest_checks():
    digest = "sha256:" + "ab" * 32
    assert codeimage.code_tag("clusterctl/cpu:2.13.0", digest) == "clusterctl-code/clusterctl-cpu:abababababab"
    with pytest.raises(UserError, match="'sha256:' and 64 lower-case hex"):
        codeimage.code_tag("clusterctl/cpu:2.13.0", "abab")


# ---------------------------------------------------------------- engine


@pytest.fixture
def tree(tmp_path, docker_client, base_image):
    """A unique tree: (tar, digest, tag); the tag is removed after the test."""
    tar = tmp_path / "tree.tar"
    digest = _tree_tar(tar, unique=uuid.uuid4().hex)
    tag = codeimage.code_tag(base_image, digest)
    yield tar, digest, tag
    deps.remove_quietly(docker_client, tag)


@pytest.mark.docker
def test_a_container_of_the_image_sees_the_tree_at_the_workdir(docker_client, base_image, tree):
    tar, digest, tag = tree
    assert codeimage.code_image(base_image, tar, digest, client=docker_client, log=lambda line: None) == tag
    out = imagebuild.run_smoke(docker_client, tag, ["python3", "-c", (
        "import os, stat\n"
        "print(os.getcwd(), os.environ['CLUSTERCTL_CODE_DIGEST'])\n"
        "for p in ['run.sh', 'src', 'src/data.txt', 'src/train_link.py', 'train.py']:\n"
        "    s = os.lstat(p)\n"
        "    print(p, oct(stat.S_IMODE(s.st_mode)), s.st_uid, os.path.islink(p))\n"
        "print(open('src/train_link.py').read().strip())")])
    assert out.splitlines() == [
        f"/workspace {digest}",
        "run.sh 0o755 0 False", "src 0o755 0 False", "src/data.txt 0o644 0 False",
        "src/train_link.py 0o777 0 True", "train.py 0o644 0 False",
        "print('training')"]
    assert imagebuild.run_smoke(docker_client, tag, ["./run.sh"]).strip() == "ran"
    image = docker_client.images.get(tag)
    assert image.labels[codeimage.L_DIGEST] == digest
    assert image.labels[codeimage.L_WORKDIR] == "/workspace"
    base_layers = docker_client.images.get(base_image).attrs["RootFS"]["Layers"]
    assert image.attrs["RootFS"]["Layers"][:-1] == base_layers     # one layer: the tree


@pytest.mark.docker
def test_the_same_tree_gives_the_same_layer_and_an_existing_tag_is_reused(
        docker_client, base_image, tree, monkeypatch):
    """The image ID differs between two builds (the builder stamps the config with the time),
    the layer does not: a node that has it needs nothing sent."""
    tar, digest, tag = tree
    codeimage.code_image(base_image, tar, digest, client=docker_client, log=lambda line: None)
    first = docker_client.images.get(tag).attrs["RootFS"]["Layers"]
    docker_client.images.remove(tag)
    codeimage.code_image(base_image, tar, digest, client=docker_client, log=lambda line: None)
    assert docker_client.images.get(tag).attrs["RootFS"]["Layers"] == first

    def no_build(*a, **k):
        raise AssertionError("an image was built")

    monkeypatch.setattr(codeimage, "_build", no_build)
    log: list[str] = []
    assert codeimage.code_image(base_image, tar, digest, client=docker_client, log=log.append) == tag
    assert any("reused" in line for line in log)
    monkeypatch.undo()
    # another workdir is another image under the same tag (built again, the old one dropped)
    old = docker_client.images.get(tag).id
    codeimage.code_image(base_image, tar, digest, workdir="/opt/proj", client=docker_client,
                         log=lambda line: None)
    assert docker_client.images.get(tag).attrs["Config"]["WorkingDir"] == "/opt/proj"
    with pytest.raises(ImageNotFound):
        docker_client.images.get(old)
