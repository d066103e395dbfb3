"""Walk a tar stream block by block, never holding a member in memory or on disk.

One job: turn an iterator of byte chunks (the local engine's ``docker save``
stream) into tar members whose raw header blocks are kept verbatim, so a
caller can pass a member through byte for byte or drop it whole.  Knows
nothing about images or layers.

Contract:

* :class:`ChunkReader` - exact-size reads over the chunks (``read``,
  ``read_exact``, ``pieces``, ``skip``);
* :func:`members` - yields one :class:`Member` per tar member (the caller
  consumes its ``padded`` data bytes from the reader), then the raw
  end-of-archive bytes;
* :class:`StreamError` - the stream is truncated or not a tar we can walk.

Extended headers (pax ``x``, GNU ``L`` / ``K``) are folded into the member
they describe; GNU base-256 sizes (members of 8 GiB and more) are read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

BLOCK = 512
COPY_CHUNK = 1 << 20


class StreamError(Exception):
    """The save stream is not a tar archive we can rewrite (truncated or malformed)."""


class ChunkReader:
    """Exact-size reads over an iterator of byte chunks (the engine's save stream)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it = iter(chunks)
        self._buf = b""
        self._pos = 0

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; b'' only at the end of the stream."""
        while self._pos >= len(self._buf):
            try:
                self._buf = next(self._it)
            except StopIteration:
                return b""
            self._pos = 0
        piece = self._buf[self._pos:self._pos + n]
        self._pos += len(piece)
        return piece

    def read_exact(self, n: int) -> bytes:
        parts = []
        while n:
            piece = self.read(n)
            if not piece:
                raise StreamError("the image stream ended in the middle of a tar member")
            parts.append(piece)
            n -= len(piece)
        return b"".join(parts)

    def pieces(self, n: int) -> Iterator[bytes]:
        """Exactly ``n`` bytes as a sequence of pieces (no copy of the whole)."""
        while n:
            piece = self.read(min(n, COPY_CHUNK))
            if not piece:
                raise StreamError("the image stream ended in the middle of a tar member")
            n -= len(piece)
            yield piece

    def skip(self, n: int) -> None:
        """Read past exactly ``n`` bytes (a dropped member's data)."""
        for _ in self.pieces(n):
            pass


def padded_size(size: int) -> int:
    """``size`` rounded up to whole tar blocks."""
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _octal(field_: bytes) -> int:
    if field_ and field_[0] & 0x80:  # GNU base-256 for sizes >= 8 GiB
        return int.from_bytes(bytes([field_[0] & 0x7F]) + field_[1:], "big")
    text = field_.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax_records(data: bytes) -> dict[str, str]:
    records, pos = {}, 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


@dataclass
class Member:
    """One tar member: the raw header blocks (extended headers included) and its metadata."""

    name: str
    size: int
    type: bytes
    header: bytes  # every block before the data, verbatim

    @property
    def padded(self) -> int:
        return padded_size(self.size)

    @property
    def is_file(self) -> bool:
        """A regular file (layer tars, json); links and directories carry no data."""
        return self.type in (b"0", b"\0", b"7")


def members(reader: ChunkReader) -> Iterator[Member | bytes]:
    """Walk a tar stream: yields a Member (caller must consume its ``padded`` data bytes),
    then finally the raw end-of-archive bytes.  Extended headers (pax ``x``, GNU ``L``)
    are folded into the member they describe so a member is kept or dropped whole."""
    ext: list[bytes] = []
    pax: dict[str, str] = {}
    long_name: str | None = None
    while True:
        block = reader.read_exact(BLOCK)
        if block == b"\0" * BLOCK:
            rest = [block]
            while piece := reader.read(COPY_CHUNK):
                rest.append(piece)
            yield b"".join(rest)
            return
        kind = block[156:157]
        size = _octal(block[124:136])
        if kind in (b"x", b"L", b"K"):
            data = reader.read_exact(padded_size(size))
            ext.append(block + data)
            if kind == b"x":
                pax.update(_pax_records(data[:size]))
            elif kind == b"L":
                long_name = data[:size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        name = block[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if block[257:263] == b"ustar\x00":
            prefix = block[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            name = f"{prefix}/{name}" if prefix else name
        name = pax.get("path") or long_name or name
        size = int(pax["size"]) if "size" in pax else size
        yield Member(name=name.removeprefix("./"), size=size, type=kind,
                     header=b"".join(ext) + block)
        ext, pax, long_name = [], {}, None
