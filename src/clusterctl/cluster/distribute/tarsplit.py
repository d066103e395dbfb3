"""Read the tar-split metadata moby keeps for every layer (pure: no disk, no engine).

One job: turn the lines of a layer's ``tar-split.json.gz`` (already
decompressed) into the sequence that rebuilds the layer's tar byte for byte.
Contract:

* :func:`parse` - yields :class:`Segment` (raw tar bytes: headers, padding,
  the end-of-archive blocks) and :class:`FileEntry` (a file whose ``size``
  bytes of content come from the layer's directory) in stream order;
* :func:`tar_size` - the size of the rebuilt tar, known before reading any content;
* :class:`TarSplitError` - a line that is not tar-split JSON.

The format is vbatts/tar-split's ``storage`` package, one JSON object a line:
``type`` 1 is a file entry (``name`` or base64 ``name_raw``, ``size``,
``payload`` = its crc64), ``type`` 2 a raw segment (``payload`` = the bytes,
base64).  moby's ``layer.TarStream`` (what ``docker save`` writes as a layer
tar) is exactly: segments verbatim, each non-empty file's content in order.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

FILE_TYPE = 1
SEGMENT_TYPE = 2


class TarSplitError(Exception):
    """The tar-split data is not what moby writes (names the line)."""


@dataclass(frozen=True)
class Segment:
    data: bytes


@dataclass(frozen=True)
class FileEntry:
    name: bytes  # the path inside the layer, as the tar header has it (relative)
    size: int


def parse(lines: Iterable[bytes | str]) -> Iterator[Segment | FileEntry]:
    """Segments and file entries of one layer's tar-split, in the order they rebuild it."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            kind = entry["type"]
            if kind == SEGMENT_TYPE:
                yield Segment(base64.b64decode(entry.get("payload") or "", validate=True))
            elif kind == FILE_TYPE:
                raw = entry.get("name_raw")
                name = base64.b64decode(raw, validate=True) if raw else entry.get("name", "").encode()
                size = int(entry.get("size") or 0)
                if size < 0:
                    raise ValueError(f"negative size {size}")
                yield FileEntry(name, size)
            else:
                raise ValueError(f"unknown entry type {kind!r}")
        except (ValueError, KeyError, TypeError, binascii.Error) as e:
            raise TarSplitError(f"tar-split line {number}: {e}") from None


def tar_size(entries: Iterable[Segment | FileEntry]) -> int:
    """Bytes of the rebuilt tar: every segment plus every file's content."""
    return sum(len(e.data) if isinstance(e, Segment) else e.size for e in entries)
