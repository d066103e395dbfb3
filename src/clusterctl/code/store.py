"""The head's own copy of every project tree it shipped: what a rerun sends again.

``launch --workdir`` ships a :class:`~clusterctl.code.snapshot.Snapshot`; before anything
travels, :func:`save` copies each file into a content-addressed store on this machine
(``cache_dir()/code/objects/<sha256>``) and writes the tree's manifest
(``cache_dir()/code/trees/<digest hex>``).  Two things follow:

- what reaches the nodes is read from the store, never from the working directory again, so
  an editor saving a file while a launch runs cannot make a node hold other bytes than the
  digest says: each file is hashed again while it is copied, and a file that changed since
  the snapshot was taken is refused naming it (exit 2);
- ``launch --rerun RUN_ID`` finds the exact tree of that run here (:func:`load`), edits made
  since then notwithstanding, even when a node has dropped its copy.

Only files the store lacks are copied (a one-line edit adds one object); the manifest is a
few hundred bytes per file.  Nothing is ever changed in place: objects and manifests are
written to a temporary name and renamed, so two clusterctl processes saving at once are safe.

Contract: :func:`save`, :func:`load`, :func:`has`, :class:`StoredTree`, :func:`store_dir`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clusterctl.code.ignore import MAX_FILES
from clusterctl.code.snapshot import Entry, Snapshot, parse_manifest
from clusterctl.core.errors import UserError
from clusterctl.core.files import open_below, write_atomic
from clusterctl.core.paths import cache_dir

_CHUNK = 1 << 20
#: The largest manifest the store writes or reads back: MAX_FILES entries of 400 bytes (a
#: line is ~90 bytes and its path; a real tree's are far shorter).  A manifest read back
#: larger than this is not one :func:`save` wrote.
MANIFEST_LIMIT = MAX_FILES * 400


def store_dir() -> Path:
    """The store's root (``CLUSTERCTL_CACHE`` moves it with the rest of the cache)."""
    return cache_dir() / "code"


def _hex(digest: str) -> str:
    return digest.split(":", 1)[-1]


@dataclass(frozen=True)
class StoredTree:
    """A tree as the store holds it: its entries and where each file's bytes are."""

    digest: str
    entries: tuple[Entry, ...]

    @property
    def short(self) -> str:
        return _hex(self.digest)[:12]

    @property
    def root(self) -> Path:
        """Where the files are read from: the store (for messages)."""
        return store_dir()

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == "file")

    @property
    def file_count(self) -> int:
        return sum(1 for e in self.entries if e.kind == "file")

    def source(self, entry: Entry) -> Path:
        """The stored bytes of a file entry."""
        return _object_path(entry.sha256)


def _object_path(sha: str) -> Path:
    return store_dir() / "objects" / sha[:2] / sha


def _manifest_path(digest: str) -> Path:
    return store_dir() / "trees" / _hex(digest)


def _copy_object(src: Path, entry: Entry, root: Path) -> None:
    """Copy ``src`` into the store as ``entry.sha256``, hashing as it goes (it must still hold
    the bytes the snapshot hashed)."""
    dest = _object_path(entry.sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp.", dir=dest.parent)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != entry.sha256:
            raise UserError(f"{root / entry.path}: the file changed while clusterctl was shipping "
                            "it (its content no longer matches the snapshot); nothing was started. "
                            "Launch again once it is saved.")
        os.chmod(tmp, 0o444)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(snapshot: Snapshot) -> StoredTree:
    """Copy the snapshot's files the store lacks, write its manifest; the stored tree."""
    for entry in snapshot.entries:
        if entry.kind == "file" and not _object_path(entry.sha256).is_file():
            _copy_object(snapshot.source(entry), entry, snapshot.root)
    path = _manifest_path(snapshot.digest)
    if not path.is_file():
        manifest = snapshot.manifest()
        if len(manifest) > MANIFEST_LIMIT:      # load() would refuse it: never written
            raise UserError(f"workdir {snapshot.root}: its manifest (one line per file) would be "
                            f"{len(manifest)} bytes, more than the code store keeps "
                            f"({MANIFEST_LIMIT}); nothing was started. Leave out what the nodes do "
                            "not need (.clusterctlignore), or ship fewer files.")
        write_atomic(path, manifest)
    return StoredTree(snapshot.digest, tuple(snapshot.entries))


def _read_manifest(path: Path) -> bytes:
    """The bytes of the manifest ``path``, read only when it is what :func:`save` writes there:
    a regular file (a FIFO is never waited on), not a symlink (nor under one, below the store:
    :func:`~clusterctl.core.files.open_below`), the caller's own (the cache is the user's), of
    at most :data:`MANIFEST_LIMIT` bytes, read in bounded chunks.  FileNotFoundError when
    missing; UserError naming the file and what to do otherwise."""
    redo = "remove it and ship the tree again (`clusterctl launch --workdir`)."
    with open_below(store_dir(), path) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid():
            raise UserError(f"{path} belongs to uid {st.st_uid}, not to you: the code store is your "
                            f"own cache and clusterctl reads no other user's manifest; {redo}")
        if st.st_size > MANIFEST_LIMIT:
            raise UserError(f"{path} is {st.st_size} bytes, more than the {MANIFEST_LIMIT} bytes of "
                            f"the largest manifest clusterctl writes; nothing was read from it; {redo}")
        chunks, total = [], 0
        while chunk := f.read(min(_CHUNK, MANIFEST_LIMIT + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > MANIFEST_LIMIT:
                raise UserError(f"{path} grew past {MANIFEST_LIMIT} bytes while it was read; {redo}")
    return b"".join(chunks)


def has(digest: str) -> bool:
    """True when the store holds the manifest of ``digest`` (and so, by construction, its files)."""
    return _manifest_path(digest).is_file()


def load(digest: str) -> StoredTree:
    """The stored tree of ``digest``; UserError when this machine never shipped it (or its
    store was removed), naming the store, or when its manifest is not one :func:`save` wrote
    (:func:`_read_manifest`)."""
    path = _manifest_path(digest)
    try:
        data = _read_manifest(path)
    except FileNotFoundError:
        raise UserError(f"code {digest} is not in this machine's code store ({store_dir()}): it was "
                        "shipped from another machine, or the store was removed.") from None
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise UserError(f"{path} does not hold the manifest of {digest} (it was changed); "
                        "remove it and ship the tree again.")
    try:
        entries = parse_manifest(data)
    except ValueError as e:
        raise UserError(f"{path}: not a valid manifest ({e}).") from None
    missing = [e.path for e in entries if e.kind == "file" and not _object_path(e.sha256).is_file()]
    if missing:
        raise UserError(f"code {digest}: {len(missing)} file(s) missing from the store {store_dir()} "
                        f"(first: {missing[0]}); it cannot be sent again.")
    return StoredTree(digest, entries)
