"""A workdir as a deterministic, content-addressed snapshot: its entries, manifest and tar.

One job: turn what :mod:`clusterctl.code.ignore` says ships into a :class:`Snapshot` whose
digest depends on nothing but the shipped paths, their contents, their executable bits
and their link targets: not on the order the file system lists them in, their times,
owners, umask or the machine.  The same tree gives the same digest and the same tar
bytes anywhere, so a node that holds a digest already needs nothing sent, and one that
holds an older snapshot needs only the entries whose lines changed.

Contract:

``take(root, *, limit_bytes=DEFAULT_LIMIT_BYTES, max_files=MAX_FILES) -> Snapshot``
    Walks (ignore rules, refusals), checks the total size against ``limit_bytes`` before
    reading any content, then hashes every file.  ``WorkdirError`` (exit status 2) when
    the tree cannot ship or is too large: the message names the 5 largest files and the
    ``.clusterctlignore`` line that drops the largest.
``Snapshot``
    ``entries`` sorted by path (bytewise UTF-8), ``digest`` = ``"sha256:"`` + the sha256 of
    ``manifest()``; ``short``, ``total_bytes``, ``file_count``, ``source(entry)``,
    ``largest(n)``.
``parse_manifest(data) -> tuple[Entry, ...]``
    The inverse of ``Snapshot.manifest()``; ``ValueError`` naming the line on anything
    malformed (a node may receive a manifest it did not make: it checks before it acts).
``write_tar(fileobj, snapshot, entries=None, *, prefix="")``
    A deterministic tar of some or all entries (see its docstring).
``parse_size(text) -> int``, ``show_size(n) -> str``
    Sizes as people type them (``100MiB``, ``64M``, ``2G``, ``512k``, bytes) and as
    messages print them.

Manifest format (version 1), UTF-8, every line ending in ``\\n``::

    clusterctl-manifest 1
    file<TAB>0644<TAB>SIZE<TAB>SHA256<TAB>PATH
    file<TAB>0755<TAB>SIZE<TAB>SHA256<TAB>PATH
    link<TAB>0777<TAB>SIZE<TAB>SHA256<TAB>PATH<TAB>TARGET

one entry a line after the header, sorted by PATH's UTF-8 bytes, no duplicates.  SIZE is
decimal bytes (a link's: of its target text), SHA256 64 lowercase hex digits (a link's:
of its target text), the mode 4 octal digits.  PATH is relative ('/'-separated, no
``.``/``..``/empty parts, no ``.git``) and never lies below another entry; TARGET is
relative and, as written, stays inside the tree.  Neither can hold a tab or line break:
:mod:`~clusterctl.code.ignore` refuses such names, so no escaping is needed.

Modes are normalised (``0644``, or ``0755`` when any execute bit is set; links
``0777``) because the rest of a mode is the umask of whoever checked the tree out, and
the same tree must give the same digest on two machines.

Why no hash cache: hashing is fast enough without one.  Measured on the 2-core
development machine (sha256 at about 1.6 GB/s), a tree of 2,000 files of 2-20 KB in 50
directories (22.7 MB) takes 60-65 ms warm (walk 24-29 ms, the rest opening, reading and
hashing: about 18 us a file) and 270-350 ms cold (page cache dropped, so mostly reading
the disk; the walk alone 40-65 ms): under the 0.5 s goal.  A cache keyed by (size,
mtime_ns, ino, ctime_ns) would save the 35 ms warm (about 1.8 s at the 100,000-file
limit) at the price of a file per workdir to load, write atomically and keep
consistent, and of shipping stale content when a file changes twice within the time
stamps' granularity (git's "racy clean" problem), so there is none.  Revisit if
workdirs of tens of thousands of files or gigabytes (a raised limit) become common.

Limits: ``DEFAULT_LIMIT_BYTES`` (100 MiB) is Ray's ``working_dir`` cap: code is
kilobytes, and a workdir past it almost always holds data, checkpoints or a virtual
environment that should reach the nodes another way (a mount, the image).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from clusterctl.code.ignore import (
    MAX_FILES,
    NEVER,
    LeftOut,
    WorkdirError,
    check_root,
    ignore_line,
    problems_error,
    shown,
    walk,
)
from clusterctl.core.text import control_problem

#: The largest workdir shipped unless raised (``--max-workdir-size``, job key
#: ``max_workdir_size``): 100 MiB, Ray's cap for ``working_dir``.
DEFAULT_LIMIT_BYTES = 100 << 20
#: The first line of every manifest; a new format gets a new number (and new digests).
MANIFEST_HEADER = b"clusterctl-manifest 1\n"
#: Bytes read at a time while hashing or writing a tar.
CHUNK = 1 << 20

FILE_MODE = 0o644
EXEC_MODE = 0o755
LINK_MODE = 0o777
DIR_MODE = 0o755

_SIZE_HELP = ("a number of bytes, or a number with a unit K, M, G or T (binary: 1K = 1024 "
              "bytes; KiB, MB and MiB mean the same), e.g. 100MiB, 64M, 2G or 512k")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")


@dataclass(frozen=True)
class Entry:
    """One shipped file or symbolic link, as one manifest line says it."""

    path: str      # POSIX path relative to the root, no "./", '/'-separated
    kind: str      # "file" or "link"
    mode: int      # files: 0o644, or 0o755 when any x bit is set; links: 0o777
    size: int      # bytes of the file; for links len(target.encode())
    sha256: str    # hex digest of the file content; for links of the target text
    target: str = ""   # links only: the link text as written (relative, inside the tree)

    def line(self) -> bytes:
        """This entry's manifest line (see the module docstring)."""
        fields = [self.kind, f"{self.mode:04o}", str(self.size), self.sha256, self.path]
        if self.kind == "link":
            fields.append(self.target)
        return ("\t".join(fields) + "\n").encode("utf-8")


@dataclass(frozen=True)
class Snapshot:
    """What of a workdir ships: its entries, sorted by path, and the digest of their manifest."""

    root: Path
    entries: tuple[Entry, ...]   # sorted by path (bytewise UTF-8 order)
    digest: str                  # "sha256:<64 hex>" of manifest()
    left_out: tuple[LeftOut, ...] = ()   # credential-like paths the walk did not ship

    @classmethod
    def of(cls, root: Path, entries: Iterable[Entry], left_out: Iterable[LeftOut] = ()) -> Snapshot:
        """The snapshot of ``entries`` (sorted here), with its digest."""
        ordered = tuple(sorted(entries, key=_order))
        return cls(root, ordered, "sha256:" + hashlib.sha256(_manifest(ordered)).hexdigest(),
                   tuple(sorted(left_out, key=lambda x: os.fsencode(x.path))))

    def manifest(self) -> bytes:
        """The manifest: a header line, then one line per entry (format in the module docstring)."""
        return _manifest(self.entries)

    @property
    def short(self) -> str:
        """The first 12 hex digits of the digest (for names and messages)."""
        return self.digest.removeprefix("sha256:")[:12]

    @property
    def total_bytes(self) -> int:
        """Bytes of all entries (a link counts its target text)."""
        return sum(e.size for e in self.entries)

    @property
    def file_count(self) -> int:
        """Regular files (links not counted; ``len(entries)`` counts both)."""
        return sum(1 for e in self.entries if e.kind == "file")

    def source(self, entry: Entry) -> Path:
        """The local path of ``entry`` (for a link, the link itself: read it with lstat/readlink)."""
        return self.root / entry.path

    def largest(self, n: int = 5) -> list[Entry]:
        """The ``n`` largest files, largest first (ties by path)."""
        return sorted((e for e in self.entries if e.kind == "file"),
                      key=lambda e: (-e.size, _order(e)))[:n]


def _order(entry: Entry) -> bytes:
    return entry.path.encode("utf-8")


def _manifest(entries: Iterable[Entry]) -> bytes:
    return MANIFEST_HEADER + b"".join(e.line() for e in entries)


# --------------------------------------------------------------------------- sizes

def parse_size(text: object) -> int:
    """Bytes in ``text`` (``100MiB``, ``64M``, ``2G``, ``512k``, ``1048576``; an int is bytes);
    ValueError saying what is valid."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a size; valid: {_SIZE_HELP}")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.fullmatch(str(text).strip())
        if not m or (not m.group(2) and "." in m.group(1)):
            raise ValueError(f"{text!r} is not a size; valid: {_SIZE_HELP}")
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"{text!r} is not more than 0 bytes; valid: {_SIZE_HELP}")
    return value


def show_size(n: int) -> str:
    """``1536`` -> ``1.5 KiB``; ``100 << 20`` -> ``100.0 MiB`` (for messages)."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def _too_large(root: Path, total: int, limit: int, sizes: list[tuple[int, str]]) -> WorkdirError:
    largest = sorted(sizes, key=lambda s: (-s[0], s[1].encode("utf-8")))[:5]
    width = max(len(shown(p)) for _, p in largest)
    lines = [f"workdir {shown(str(root))}: {show_size(total)} to ship, more than the limit of "
             f"{show_size(limit)}; raise it with --max-workdir-size SIZE (job key "
             "max_workdir_size), or leave out what the nodes do not need to run the code "
             "(data and checkpoints belong in a mount). The largest files:"]
    lines += [f"  {shown(p):<{width}}  {show_size(s):>10}" for s, p in largest]
    top, sep, _ = largest[0][1].partition("/")
    line = ignore_line(top, directory=True) if sep else ignore_line(largest[0][1])
    what = f"{shown(top)}/" if sep else shown(largest[0][1])
    lines.append(f'To leave out {what}, add the line "{line}" to {shown(str(root / ".clusterctlignore"))}.')
    return WorkdirError("\n".join(lines))


# --------------------------------------------------------------------------- take

def _open_regular(path: str) -> tuple[int, os.stat_result]:
    """An fd of the regular file at ``path`` and its fstat; OSError otherwise.

    O_NOFOLLOW and O_NONBLOCK: a path replaced by a link or a FIFO since the walk is
    neither followed nor waited on (opening a FIFO for reading blocks until a writer comes).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "is no longer a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _hash_file(path: str) -> tuple[int, int, str]:
    """(mode, size, sha256 hex) of the regular file at ``path``; OSError when it cannot be read."""
    fd, st = _open_regular(path)
    try:
        h = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, CHUNK):
            h.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    mode = EXEC_MODE if st.st_mode & 0o111 else FILE_MODE
    return mode, size, h.hexdigest()


def _link_entry(path: str, target: str) -> Entry:
    data = target.encode("utf-8")
    return Entry(path, "link", LINK_MODE, len(data), hashlib.sha256(data).hexdigest(), target)


def take(root: Path | str, *, limit_bytes: int = DEFAULT_LIMIT_BYTES,
         max_files: int = MAX_FILES) -> Snapshot:
    """The snapshot of what of ``root`` ships (see the module docstring); WorkdirError otherwise."""
    real_root = check_root(root)
    left_out: list[LeftOut] = []
    found = walk(real_root, max_files=max_files, left_out=left_out)
    total = sum(f.stat.st_size if f.kind == "file" else len(f.target.encode("utf-8"))
                for f in found)
    if total > limit_bytes:  # before reading any content: a wrong workdir may hold terabytes
        raise _too_large(real_root, total, limit_bytes,
                         [(f.stat.st_size, f.path) for f in found if f.kind == "file"])
    entries = []
    problems = []
    for f in found:
        if f.kind == "link":
            entries.append(_link_entry(f.path, f.target))
            continue
        try:
            mode, size, digest = _hash_file(os.path.join(real_root, f.path))
        except OSError as e:
            problems.append((f.path, f"{shown(f.path)}: cannot be read ({e.strerror or e}); "
                                     "valid: a regular file you can read, or leave it out with the "
                                     f'line "{ignore_line(f.path)}" in .clusterctlignore'))
            continue
        entries.append(Entry(f.path, "file", mode, size, digest))
    if problems:
        raise problems_error(real_root, [p for _, p in sorted(problems, key=lambda p: os.fsencode(p[0]))])
    snapshot = Snapshot.of(real_root, entries, left_out)
    if snapshot.total_bytes > limit_bytes:  # files grew while they were read
        raise _too_large(real_root, snapshot.total_bytes, limit_bytes,
                         [(e.size, e.path) for e in snapshot.entries if e.kind == "file"])
    return snapshot


# --------------------------------------------------------------------------- manifest

def _path_problem(path: str, what: str = "path") -> str | None:
    if not path:
        return f"the {what} is empty"
    if why := control_problem(path):
        return f"the {what} {why}"
    if path.startswith("/"):
        return f"the {what} is absolute"
    parts = path.split("/")
    if what == "path" and any(p in ("", ".", "..", NEVER) for p in parts):
        return f"the path has an empty, '.', '..' or {NEVER} part"
    return None


def parse_manifest(data: bytes) -> tuple[Entry, ...]:
    """The entries of a manifest (the inverse of ``Snapshot.manifest()``); ValueError naming
    the line on anything malformed."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ValueError(f"a manifest is bytes, not {type(data).__name__}")
    data = bytes(data)
    if not data.startswith(MANIFEST_HEADER):
        raise ValueError(f"not a manifest: the first line is not {MANIFEST_HEADER.decode().strip()!r}")
    body = data[len(MANIFEST_HEADER):]
    if body and not body.endswith(b"\n"):
        raise ValueError("manifest: the last line does not end with a line break (cut short?)")
    entries: list[Entry] = []
    seen: set[str] = set()
    previous = b""
    for number, raw in enumerate(body.split(b"\n")[:-1] if body else [], 2):
        def bad(why: str, number: int = number) -> ValueError:
            return ValueError(f"manifest line {number}: {why}")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise bad("is not UTF-8") from None
        fields = line.split("\t")
        kind = fields[0]
        if kind not in ("file", "link"):
            raise bad(f"the kind {kind!r} is neither 'file' nor 'link'")
        want = 5 if kind == "file" else 6
        if len(fields) != want:
            raise bad(f"a {kind} line has {want} tab-separated fields, this one {len(fields)}")
        _, mode_text, size_text, digest, path = fields[:5]
        target = fields[5] if kind == "link" else ""
        modes = ("0644", "0755") if kind == "file" else ("0777",)
        if mode_text not in modes:
            raise bad(f"the mode {mode_text!r} of a {kind} is not {' or '.join(modes)}")
        if not _DECIMAL.fullmatch(size_text):
            raise bad(f"the size {size_text!r} is not a decimal number of bytes")
        if not _HEX64.fullmatch(digest):
            raise bad("the sha256 is not 64 lowercase hex digits")
        if why := _path_problem(path):
            raise bad(why)
        key = path.encode("utf-8")
        if key <= previous:
            raise bad(f"{path!r} is {'repeated' if key == previous else 'out of order'}; "
                      "entries are sorted by path, each once")
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                raise bad(f"{path!r} lies below the entry {'/'.join(parts[:i])!r}")
        if kind == "link":
            if why := _path_problem(target, "target"):
                raise bad(why)
            lexical = os.path.normpath(os.path.join(os.path.dirname(path), target))
            if lexical == ".." or lexical.startswith("../"):
                raise bad(f"the link target {target!r} leaves the tree")
            encoded = target.encode("utf-8")
            if int(size_text) != len(encoded) or digest != hashlib.sha256(encoded).hexdigest():
                raise bad("a link's size and sha256 are not those of its target text")
        previous = key
        seen.add(path)
        entries.append(Entry(path, kind, int(mode_text, 8), int(size_text), digest, target))
    return tuple(entries)


# --------------------------------------------------------------------------- tar

class _Verifying:
    """A file read through sha256, so write_tar can tell a file that changed since take()."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.hash = hashlib.sha256()

    def read(self, n: int) -> bytes:
        chunk = os.read(self.fd, n)
        self.hash.update(chunk)
        return chunk


def _tarinfo(name: str, kind: bytes, mode: int, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = linkname
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_tar(fileobj: BinaryIO, snapshot: Snapshot, entries: Iterable[Entry] | None = None,
              *, prefix: str = "") -> None:
    """Write a tar of ``entries`` (default: all of the snapshot's) to ``fileobj``.

    Deterministic: GNU format, mtime 0, uid/gid 0, no user or group names, the modes of
    :class:`Entry`, entries sorted by path, each named ``prefix + path``, every parent
    directory (0755) before the first entry below it, links as symbolic links.  The same
    tree gives the same bytes.  A file whose content is no longer what the snapshot says
    (changed since ``take``) raises ``WorkdirError`` part-way: discard what was written.
    ``prefix`` is "" or a relative directory ending in "/"; ValueError for an entry that
    is not the snapshot's.
    """
    if prefix and (not prefix.endswith("/") or _path_problem(prefix[:-1])):
        raise ValueError(f"tar prefix {prefix!r}: valid: '' or a relative directory ending "
                         "in '/' (e.g. 'code/'), without '.', '..' or empty parts")
    known = {e.path: e for e in snapshot.entries}
    chosen = snapshot.entries if entries is None else tuple(sorted(set(entries), key=_order))
    for e in chosen:
        if known.get(e.path) != e:
            raise ValueError(f"{e.path!r} is not an entry of snapshot {snapshot.short}")
    made: set[str] = set()
    with tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.GNU_FORMAT,
                      encoding="utf-8") as tar:
        for e in chosen:
            name = prefix + e.path
            parts = name.split("/")
            for i in range(1, len(parts)):
                parent = "/".join(parts[:i])
                if parent not in made:
                    made.add(parent)
                    tar.addfile(_tarinfo(parent, tarfile.DIRTYPE, DIR_MODE))
            if e.kind == "link":
                tar.addfile(_tarinfo(name, tarfile.SYMTYPE, LINK_MODE, linkname=e.target))
                continue
            _add_file(tar, snapshot, e, name)


def _add_file(tar: tarfile.TarFile, snapshot: Snapshot, e: Entry, name: str) -> None:
    def changed(why: str) -> WorkdirError:
        return WorkdirError(f"workdir {shown(str(snapshot.root))}: {shown(e.path)} {why} since "
                            f"snapshot {snapshot.short} was taken; run again (a file that "
                            "changes while it ships, a log, belongs in .clusterctlignore)")
    try:
        fd, _ = _open_regular(str(snapshot.source(e)))
    except OSError as err:
        raise changed(f"cannot be read ({err.strerror or err})") from None
    try:
        reader = _Verifying(fd)
        try:
            tar.addfile(_tarinfo(name, tarfile.REGTYPE, e.mode, e.size), reader)
        except OSError as err:
            if "unexpected end of data" not in str(err):
                raise
            raise changed("became shorter") from None
        if os.read(fd, 1) or reader.hash.hexdigest() != e.sha256:
            raise changed("changed")
    finally:
        os.close(fd)
