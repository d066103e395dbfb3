"""The image to push, as the local engine describes it: its ID, diff IDs and chain IDs.

One job: the facts about the source image that every other part of a push
decides by.  Contract:

* :func:`source_image` - inspect a tag or ID on the local engine; a
  UserError (exit 2) naming it when it is no image reference, or the engine
  refuses it or does not have it;
* :class:`SourceImage` - ref, ID, diff IDs (layer order), size, chain IDs;
* :func:`chain_ids` - the chain IDs docker's layer store keys layers by,
  for any diff ID list (the source's, or a node's images').
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterctl.core.errors import UserError, did_you_mean
from clusterctl.core.imageref import check_image
from clusterctl.core.text import shown

if TYPE_CHECKING:
    from docker import DockerClient


@dataclass(frozen=True)
class SourceImage:
    """The image to push, as the local engine describes it."""

    ref: str
    id: str
    diff_ids: tuple[str, ...]
    size: int

    @property
    def chain_ids(self) -> list[str]:
        return chain_ids(self.diff_ids)


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """Chain IDs (what docker's layer store keys layers by) of a diff ID list, in order."""
    chains: list[str] = []
    for diff in diff_ids:
        if not chains:
            chains.append(diff)
        else:
            chains.append("sha256:" + hashlib.sha256(f"{chains[-1]} {diff}".encode()).hexdigest())
    return chains


def source_image(client: DockerClient, ref: str) -> SourceImage:
    """Inspect ``ref`` on the local engine; UserError (exit 2) naming it when it is not an
    image reference (:func:`clusterctl.core.imageref.check_image`: checked before the engine
    is asked, so no value reaches its API path) or the engine does not have it."""
    check_image(ref, "image")
    # docker costs ~100 ms to import: loaded here, where the caller's client has already
    # loaded it, so importing clusterctl (every CLI start) does not pay for it
    from docker.errors import APIError, ImageNotFound, NullResource

    try:
        attrs = client.api.inspect_image(ref)
    except (ImageNotFound, NullResource):
        names = sorted({t for img in client.images.list() for t in img.tags})
        raise UserError(
            f'image "{shown(ref, quoted=False)}" is not in the local Docker engine{did_you_mean(ref, names)}. '
            "Give a tag or ID listed by `docker images` (build it first with `clusterctl build`)."
        ) from None
    except APIError as e:   # the engine refused the name: its text quoted safely, never raw
        raise UserError(
            f"image {shown(ref)}: the local Docker engine refused it "
            f"({e.status_code}: {shown(e.explanation or str(e), 200)}); valid: a tag or ID "
            "listed by `docker images`."
        ) from None
    layers = tuple(attrs.get("RootFS", {}).get("Layers") or ())
    return SourceImage(ref=ref, id=attrs["Id"], diff_ids=layers, size=int(attrs.get("Size") or 0))
