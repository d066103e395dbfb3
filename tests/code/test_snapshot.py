"""code/snapshot: entries, digest and manifest of a workdir, the size limit, parse_manifest,
the deterministic tar, and sizes as typed."""

from __future__ import annotations

import hashlib
import io
import os
import random
import tarfile
from pathlib import Path

import pytest

from clusterctl.code import snapshot as snap
from clusterctl.code.ignore import WorkdirError
from clusterctl.code.snapshot import (
    MANIFEST_HEADER,
    Entry,
    Snapshot,
    parse_manifest,
    parse_size,
    show_size,
    take,
    write_tar,
)

FILES = {
    "train.py": b"print('hi')\n",
    "run.sh": b"#!/bin/sh\nexec python train.py\n",
    "pkg/__init__.py": b"",
    "pkg/model.py": b"import torch\n" * 50,
    "pkg/data/loader.py": b"def load(): ...\n",
    "a-c.txt": b"dash\n",          # '-' sorts before '/' bytewise: a-c.txt before a/...
    "a/b.txt": b"slash\n",
    "caf\u00e9.md": "ünïcode\n".encode(),
    "pkg/" + "long_name_" * 12 + ".py": b"past 100\n",  # a GNU long-name header
}
EXECUTABLE = {"run.sh"}
LINKS = {"latest.py": "train.py", "pkg/data/model.py": "../model.py"}


def build(root: Path, *, order: list[str] | None = None, umask: int = 0o022,
          mtime: int | None = None) -> Path:
    """FILES and LINKS under ``root``, created in ``order`` under ``umask``, then given ``mtime``."""
    old = os.umask(umask)
    try:
        for rel in order or list(FILES):
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(FILES[rel])
            if rel in EXECUTABLE:
                p.chmod(0o777 & ~umask)
        for rel, target in LINKS.items():
            (root / rel).symlink_to(target)
    finally:
        os.umask(old)
    if mtime is not None:
        for p in root.rglob("*"):
            os.utime(p, (mtime, mtime), follow_symlinks=False)
    return root


def tar_bytes(s: Snapshot, entries=None, prefix: str = "") -> bytes:
    buf = io.BytesIO()
    write_tar(buf, s, entries, prefix=prefix)
    return buf.getvalue()


# --------------------------------------------------------------------------- entries

def test_entries_kinds_modes_sizes_and_digests(tmp_path):
    s = take(build(tmp_path))
    by = {e.path: e for e in s.entries}
    assert [e.path for e in s.entries] == sorted(by, key=lambda p: p.encode())
    assert [e.path for e in s.entries][:3] == ["a-c.txt", "a/b.txt", "caf\u00e9.md"]
    for rel, data in FILES.items():
        e = by[rel]
        assert (e.kind, e.size, e.sha256, e.target) == ("file", len(data), hashlib.sha256(data).hexdigest(), "")
        assert e.mode == (0o755 if rel in EXECUTABLE else 0o644)
    link = by["pkg/data/model.py"]
    assert (link.kind, link.mode, link.target) == ("link", 0o777, "../model.py")
    assert link.size == len(b"../model.py") and link.sha256 == hashlib.sha256(b"../model.py").hexdigest()
    assert s.digest == "sha256:" + hashlib.sha256(s.manifest()).hexdigest()
    assert s.short == s.digest[7:19] and len(s.short) == 12
    assert s.file_count == len(FILES) and len(s.entries) == len(FILES) + len(LINKS)
    assert s.total_bytes == sum(map(len, FILES.values())) + len("train.py") + len("../model.py")
    assert s.source(by["pkg/model.py"]) == tmp_path.resolve() / "pkg" / "model.py"
    assert [e.path for e in s.largest(2)] == ["pkg/model.py", "run.sh"]


def test_the_manifest_format(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x y.py").write_bytes(b"x")
    (tmp_path / "a.sh").write_bytes(b"")
    (tmp_path / "a.sh").chmod(0o744)
    (tmp_path / "l").symlink_to("b/x y.py")
    s = take(tmp_path)
    empty = hashlib.sha256(b"").hexdigest()
    x = hashlib.sha256(b"x").hexdigest()
    link = hashlib.sha256(b"b/x y.py").hexdigest()
    assert s.manifest() == (
        b"clusterctl-manifest 1\n"
        + f"file\t0755\t0\t{empty}\ta.sh\n".encode()
        + f"file\t0644\t1\t{x}\tb/x y.py\n".encode()
        + f"link\t0777\t8\t{link}\tl\tb/x y.py\n".encode())


def test_an_empty_workdir(tmp_path):
    s = take(tmp_path)
    assert s.entries == () and s.manifest() == MANIFEST_HEADER and s.total_bytes == 0
    assert parse_manifest(s.manifest()) == ()


# --------------------------------------------------------------------------- determinism

def test_same_tree_same_digest_and_tar_whatever_the_order_times_and_umask(tmp_path):
    order = list(FILES)
    shuffled = order[:]
    random.Random(7).shuffle(shuffled)
    assert shuffled != order
    one = take(build(tmp_path / "one", order=order, umask=0o022, mtime=1_000_000))
    two = take(build(tmp_path / "two", order=shuffled, umask=0o077, mtime=2_000_000_000))
    assert one.entries == two.entries and one.digest == two.digest
    assert tar_bytes(one) == tar_bytes(two)
    assert tar_bytes(one, prefix="code/") == tar_bytes(two, prefix="code/")
    assert take(tmp_path / "one").digest == one.digest  # and again


def test_an_x_bit_or_one_byte_changes_the_digest(tmp_path):
    root = build(tmp_path)
    before = take(root)
    (root / "train.py").chmod(0o744)  # only the owner's x bit
    flipped = take(root)
    assert flipped.digest != before.digest
    (root / "train.py").chmod(0o700)  # other bits than x are not recorded
    assert take(root).digest == flipped.digest
    (root / "train.py").chmod(0o644)
    assert take(root).digest == before.digest
    (root / "pkg" / "model.py").write_bytes(FILES["pkg/model.py"][:-1] + b"X")  # same size
    edited = take(root)
    assert edited.digest != before.digest
    assert {e.path for e in edited.entries} - {e.path for e in before.entries} == set()
    changed = [e.path for e in edited.entries if e not in before.entries]
    assert changed == ["pkg/model.py"]


def test_a_link_target_is_part_of_the_digest(tmp_path):
    root = build(tmp_path)
    before = take(root)
    (root / "latest.py").unlink()
    (root / "latest.py").symlink_to("run.sh")
    assert take(root).digest != before.digest


# --------------------------------------------------------------------------- size limit

def test_over_the_limit_names_the_largest_files_and_the_line_that_drops_them(tmp_path):
    build(tmp_path)
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "sub" / "train.bin").write_bytes(b"\0" * (3 << 20))
    (tmp_path / "data" / "val.bin").write_bytes(b"\0" * (1 << 20))
    (tmp_path / "weights.pt").write_bytes(b"\0" * (2 << 20))
    with pytest.raises(WorkdirError) as info:
        take(tmp_path, limit_bytes=1 << 20)
    message = str(info.value)
    assert info.value.exit_code == 2
    assert "6.0 MiB to ship, more than the limit of 1.0 MiB" in message
    assert "raise it with --max-workdir-size SIZE" in message
    lines = message.splitlines()
    start = lines.index(next(line for line in lines if line.endswith("The largest files:"))) + 1
    assert [line.split()[0] for line in lines[start:start + 5]] == [
        "data/sub/train.bin", "weights.pt", "data/val.bin", "pkg/model.py", "run.sh"]
    assert lines[start].split()[1:] == ["3.0", "MiB"]
    assert lines[-1] == (f'To leave out data/, add the line "/data/" to '
                         f"{tmp_path.resolve() / '.clusterctlignore'}.")
    # the line does what it says; then the next largest is a top-level file
    (tmp_path / ".clusterctlignore").write_text("/data/\n")
    with pytest.raises(WorkdirError, match='To leave out weights.pt, add the line "/weights.pt"'):
        take(tmp_path, limit_bytes=1 << 20)
    (tmp_path / ".clusterctlignore").write_text("/data/\n/weights.pt\n")
    assert take(tmp_path, limit_bytes=1 << 20).total_bytes < 1 << 20


def test_the_limit_is_checked_before_any_file_is_read(tmp_path, monkeypatch):
    (tmp_path / "big").write_bytes(b"\0" * 2048)

    def no(*a, **kw):
        raise AssertionError("a file was read before the size check")

    monkeypatch.setattr(snap, "_hash_file", no)
    with pytest.raises(WorkdirError, match="2.0 KiB to ship, more than the limit of 1.0 KiB"):
        take(tmp_path, limit_bytes=1024)


def test_max_files_reaches_the_walk(tmp_path):
    for i in range(12):
        (tmp_path / f"f{i}").write_text("")
    with pytest.raises(WorkdirError, match="more than 10 entries"):
        take(tmp_path, max_files=10)
    assert take(tmp_path, max_files=12).file_count == 12


# --------------------------------------------------------------------------- manifest

def test_parse_manifest_round_trips(tmp_path):
    s = take(build(tmp_path))
    assert parse_manifest(s.manifest()) == s.entries
    assert Snapshot.of(s.root, reversed(parse_manifest(s.manifest()))) == s


SHA = "0" * 64
LINK_SHA = hashlib.sha256(b"t").hexdigest()


@pytest.mark.parametrize(("body", "why"), [
    (b"", "not a manifest"),
    (b"clusterctl-manifest 2\n", "not a manifest"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\ta".encode(), "does not end with a line break"),
    (MANIFEST_HEADER + f"dir\t0755\t0\t{SHA}\ta\n".encode(), "neither 'file' nor 'link'"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\n".encode(), "5 tab-separated fields"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\ta\tb\n".encode(), "5 tab-separated fields"),
    (MANIFEST_HEADER + f"link\t0777\t1\t{LINK_SHA}\tl\n".encode(), "6 tab-separated fields"),
    (MANIFEST_HEADER + f"file\t0600\t1\t{SHA}\ta\n".encode(), "mode '0600'"),
    (MANIFEST_HEADER + f"file\t0777\t1\t{SHA}\ta\n".encode(), "mode '0777'"),
    (MANIFEST_HEADER + f"link\t0644\t1\t{LINK_SHA}\tl\tt\n".encode(), "mode '0644'"),
    (MANIFEST_HEADER + f"file\t0644\t01\t{SHA}\ta\n".encode(), "size '01'"),
    (MANIFEST_HEADER + f"file\t0644\t-1\t{SHA}\ta\n".encode(), "size '-1'"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA.upper()}1\ta\n".encode(), "64 lowercase hex"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{'A' * 64}\ta\n".encode(), "64 lowercase hex"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\t\n".encode(), "path is empty"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\t/etc/passwd\n".encode(), "absolute"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\ta/../../b\n".encode(), "'..'"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\ta//b\n".encode(), "empty"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\t./a\n".encode(), "'.'"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\t.git/config\n".encode(), ".git"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\ta\r\n".encode(), "line break"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\tb\nfile\t0644\t1\t{SHA}\ta\n".encode(), "out of order"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\ta\nfile\t0644\t1\t{SHA}\ta\n".encode(), "repeated"),
    (MANIFEST_HEADER + f"file\t0644\t1\t{SHA}\ta\nfile\t0644\t1\t{SHA}\ta/b\n".encode(), "lies below"),
    (MANIFEST_HEADER + f"link\t0777\t1\t{LINK_SHA}\tl\nfile\t0644\t1\t{SHA}\tl/b\n".encode(), "6 tab"),
    (MANIFEST_HEADER + f"link\t0777\t1\t{LINK_SHA}\tl\tt\nfile\t0644\t1\t{SHA}\tl/b\n".encode(), "lies below"),
    (MANIFEST_HEADER + b"link\t0777\t4\t" + hashlib.sha256(b"/etc").hexdigest().encode() + b"\tl\t/etc\n", "absolute"),
    (MANIFEST_HEADER + b"link\t0777\t5\t" + hashlib.sha256(b"../..").hexdigest().encode() + b"\td/l\t../..\n", "leaves the tree"),
    (MANIFEST_HEADER + f"link\t0777\t2\t{LINK_SHA}\tl\tt\n".encode(), "size and sha256"),
    (MANIFEST_HEADER + f"link\t0777\t1\t{SHA}\tl\tt\n".encode(), "size and sha256"),
    (MANIFEST_HEADER + b"file\t0644\t1\t" + SHA.encode() + b"\t\xff\n", "not UTF-8"),
])
def test_parse_manifest_refuses_malformed_input(body, why):
    with pytest.raises(ValueError, match="manifest") as info:
        parse_manifest(body)
    assert why in str(info.value)


def test_parse_manifest_names_the_line():
    good = f"file\t0644\t1\t{SHA}\ta\n".encode()
    with pytest.raises(ValueError, match=r"^manifest line 3: "):
        parse_manifest(MANIFEST_HEADER + good + f"file\t0644\tx\t{SHA}\tb\n".encode())
    with pytest.raises(ValueError, match="bytes, not str"):
        parse_manifest(MANIFEST_HEADER.decode())


# --------------------------------------------------------------------------- tar

def test_the_tar(tmp_path):
    s = take(build(tmp_path))
    data = tar_bytes(s, prefix="code/")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        for m in members:
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
            if m.isdir():
                assert m.mode == 0o755
            # every parent directory comes before what is in it
            parent = m.name.rpartition("/")[0]
            assert not parent or parent in names[:names.index(m.name)], m.name
        by = {m.name: m for m in members}
        assert by["code"].isdir() and by["code/pkg/data"].isdir()
        assert by["code/run.sh"].mode == 0o755 and by["code/train.py"].mode == 0o644
        assert tar.extractfile("code/pkg/model.py").read() == FILES["pkg/model.py"]
        assert by["code/latest.py"].issym() and by["code/latest.py"].linkname == "train.py"
        assert by["code/latest.py"].mode == 0o777
        files = [n.removeprefix("code/") for n in names if not by[n].isdir()]
        assert files == [e.path for e in s.entries]
    assert data == tar_bytes(s, prefix="code/")  # again: the same bytes


def test_a_tar_of_some_entries(tmp_path):
    s = take(build(tmp_path))
    some = [e for e in s.entries if e.path in ("pkg/model.py", "train.py")]
    with tarfile.open(fileobj=io.BytesIO(tar_bytes(s, reversed(some)))) as tar:
        assert tar.getnames() == ["pkg", "pkg/model.py", "train.py"]
    with tarfile.open(fileobj=io.BytesIO(tar_bytes(s, []))) as tar:
        assert tar.getnames() == []
    stranger = Entry("pkg/model.py", "file", 0o644, 1, "0" * 64)
    with pytest.raises(ValueError, match="not an entry of snapshot"):
        tar_bytes(s, [stranger])


@pytest.mark.parametrize("prefix", ["code", "/code/", "../code/", "a//", "./"])
def test_a_bad_tar_prefix(tmp_path, prefix):
    s = take(build(tmp_path))
    with pytest.raises(ValueError, match="tar prefix"):
        tar_bytes(s, prefix=prefix)


def test_a_file_that_changed_since_the_snapshot_is_not_shipped_silently(tmp_path):
    s = take(build(tmp_path))
    (tmp_path / "train.py").write_bytes(b"print('HI')\n")  # same size, other bytes
    with pytest.raises(WorkdirError, match=r"train.py changed since snapshot"):
        tar_bytes(s)
    (tmp_path / "train.py").write_bytes(b"print('hi')\n# more\n")
    with pytest.raises(WorkdirError, match=r"train.py changed since"):
        tar_bytes(s)
    (tmp_path / "train.py").write_bytes(b"p")
    with pytest.raises(WorkdirError, match=r"train.py became shorter since"):
        tar_bytes(s)
    (tmp_path / "train.py").unlink()
    os.mkfifo(tmp_path / "train.py")  # not opened for long: O_NONBLOCK, then refused
    with pytest.raises(WorkdirError, match=r"train.py cannot be read"):
        tar_bytes(s)


# --------------------------------------------------------------------------- sizes

@pytest.mark.parametrize(("text", "size"), [
    ("100MiB", 100 << 20), ("64M", 64 << 20), ("2G", 2 << 30), ("512k", 512 << 10),
    ("1048576", 1048576), ("1.5GiB", 3 << 29), (" 10 MB ", 10 << 20), ("1t", 1 << 40),
    ("7b", 7), (4096, 4096),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "10X", "-5M", "1.5", "0", "0M", "ten", "1e6", True, "5 M B"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="valid: a number of bytes") as info:
        parse_size(text)
    assert repr(text) in str(info.value)


def test_show_size():
    assert [show_size(n) for n in (0, 1023, 1536, 100 << 20, 3 << 29, 5 << 40)] == [
        "0 B", "1023 B", "1.5 KiB", "100.0 MiB", "1.5 GiB", "5.0 TiB"]
