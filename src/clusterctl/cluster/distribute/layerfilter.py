"""Cut a ``docker save`` stream down to the layers a node lacks, as it streams.

One job: rewrite the save stream member by member.  Contract:

* :func:`filter_save_stream` - yields the stream minus every layer whose diff
  ID is not in ``send``; everything else passes through byte for byte;
* :class:`FilterStats` - what the rewritten stream carried (bytes, layers
  sent and skipped, layer-like members sent unidentified) and the metadata
  it saw, from which the layout cache learns.

``docker load`` looks layers up by chain ID and opens a layer tar only when
the node lacks that chain, so a tar holding ``manifest.json``, the config and
only the missing layer tars (the other paths listed in the manifest but
absent) loads and yields the same image ID (FIELD-NOTES §1).  Which member is
which layer comes from :class:`~clusterctl.cluster.distribute.layout.LayerIndex`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from clusterctl.cluster.distribute.layout import SMALL_MEMBER, LayerIndex
from clusterctl.cluster.distribute.source import SourceImage
from clusterctl.cluster.distribute.tarstream import ChunkReader, members


@dataclass
class FilterStats:
    """What one rewritten stream carried (filled in while it is consumed)."""

    bytes_out: int = 0
    layers_sent: int = 0
    layers_skipped: int = 0
    unidentified: list[str] = field(default_factory=list)  # layer-like members sent blindly
    small: dict[str, bytes] = field(default_factory=dict)  # metadata seen, for the layout cache


def filter_save_stream(chunks: Iterable[bytes], image: SourceImage, send: set[str],
                       *, layout: dict[str, str] | None = None,
                       stats: FilterStats | None = None) -> Iterator[bytes]:
    """Rewrite a ``docker save`` stream so it carries only the layers whose diff ID is in ``send``.

    Every other member (manifest, config, v1 json, directories, index, symlinks)
    passes through byte for byte; dropped layers leave their manifest entries
    pointing at absent paths, which ``docker load`` accepts for layers the node
    has.  A layer it cannot identify is sent (see the layout module)."""
    stats = stats if stats is not None else FilterStats()
    index = LayerIndex(image, layout)
    reader = ChunkReader(chunks)
    for item in members(reader):
        if isinstance(item, bytes):  # end of archive
            stats.bytes_out += len(item)
            yield item
            break
        diff = index.diff_id(item) if item.is_file else None
        if diff is not None and diff not in send:
            stats.layers_skipped += 1
            reader.skip(item.padded)
            continue
        if diff is not None:
            stats.layers_sent += 1
        elif item.is_file and LayerIndex.looks_like_layer(item):
            stats.unidentified.append(item.name)
            stats.layers_sent += 1
        stats.bytes_out += len(item.header)
        yield item.header
        if item.is_file and item.size <= SMALL_MEMBER:
            data = reader.read_exact(item.padded)
            stats.small[item.name] = data[:item.size]
            index.note_small(item, data[:item.size])
            stats.bytes_out += len(data)
            yield data
        else:
            for piece in reader.pieces(item.padded):
                stats.bytes_out += len(piece)
                yield piece
