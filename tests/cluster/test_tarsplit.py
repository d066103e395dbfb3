"""tar-split parsing (pure): the entries moby keeps to rebuild a layer tar."""

from __future__ import annotations

import base64
import json

import pytest

from clusterctl.cluster.distribute.tarsplit import (
    FileEntry,
    Segment,
    TarSplitError,
    parse,
    tar_size,
)


def _line(**kw) -> bytes:
    return json.dumps(kw).encode() + b"\n"


def test_segments_and_files_in_order_with_raw_names():
    lines = [
        _line(type=2, payload=base64.b64encode(b"H" * 512).decode(), position=0),
        _line(type=1, name="etc/a", size=5, payload="AAAAAAAAAAA=", position=1),
        _line(type=1, name_raw=base64.b64encode(b"caf\xe9").decode(), size=0, position=2),
        b"\n",
        _line(type=2, payload=base64.b64encode(b"\0" * 1024).decode(), position=3),
    ]
    entries = list(parse(lines))
    assert entries == [Segment(b"H" * 512), FileEntry(b"etc/a", 5), FileEntry(b"caf\xe9", 0),
                       Segment(b"\0" * 1024)]
    assert tar_size(entries) == 512 + 5 + 1024


@pytest.mark.parametrize("line, words", [
    (b'{"type":3}', "line 1: unknown entry type 3"),
    (b'not json', "line 1"),
    (b'{"type":1,"name":"x","size":-1}', "negative size"),
    (b'{"type":2,"payload":"***"}', "line 1"),
])
def test_what_moby_does_not_write_is_named_by_line(line, words):
    with pytest.raises(TarSplitError, match=words):
        list(parse([line]))
