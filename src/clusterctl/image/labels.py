"""The labels an image carries: OCI annotations plus ``io.clusterctl.*`` facts, defined once.

Every image clusterctl makes says what it is and how it was made: a rendered
target (``target_labels``, used by the build pipeline) and the debootstrapped
base (``baseimage.base_labels``) both go through ``image_labels``.  Pure apart
from the clock: ``created`` defaults to now.

Contract:
    LABEL_PREFIX = "io.clusterctl."
    image_labels(target, *, version, torch, dockerfile_sha256, source, created, extra) -> labels
    target_labels(resolved, dockerfile, *, created) -> labels of a rendered target's image
    sha256_text(text) -> hex digest (of a rendered Dockerfile)
    file_sha256(path) -> hex digest (of a Dockerfile on disk)
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl import __version__
from clusterctl.core import paths

if TYPE_CHECKING:  # only a type here: base image code imports this module without pydantic
    from clusterctl.image.targets import Resolved

LABEL_PREFIX = "io.clusterctl."


def sha256_text(text: str) -> str:
    """Hex sha256 of ``text`` as UTF-8 (what the Dockerfile written from it hashes to)."""
    return hashlib.sha256(text.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file (the rendered Dockerfile, for io.clusterctl.dockerfile-sha256)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def image_labels(target: str, *, version: str, torch: str | None = None,
                 dockerfile_sha256: str | None = None, source: str | None = None,
                 created: datetime | None = None,
                 extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """OCI annotations plus io.clusterctl.* labels, so an image says what it is and how it was made.

    ``version`` is the image's own version (a target uses its torch version, the
    base image its Debian suite).  ``source`` defaults to the templates
    directory the image was rendered from.  ``io.clusterctl.version`` records
    which clusterctl built it; ``dockerfile-sha256`` lets ``clusterctl build``
    tell whether an existing image matches the Dockerfile it would render.
    """
    stamp = (created or datetime.now(timezone.utc)).astimezone(timezone.utc)
    labels = {
        "org.opencontainers.image.title": f"clusterctl {target}",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.created": stamp.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "org.opencontainers.image.source": source or paths.templates_dir().as_uri(),
        f"{LABEL_PREFIX}target": target,
        f"{LABEL_PREFIX}version": __version__,
    }
    if torch:
        labels[f"{LABEL_PREFIX}torch"] = torch
    if dockerfile_sha256:
        labels[f"{LABEL_PREFIX}dockerfile-sha256"] = dockerfile_sha256
    labels.update(extra or {})
    return labels


def target_labels(resolved: Resolved, dockerfile: str, *, created: datetime | None = None) -> dict[str, str]:
    """The labels of a rendered target's image: its torch version, template and Dockerfile hash."""
    torch = resolved.torch or resolved.pins.get("torch")
    return image_labels(resolved.target.name, version=torch or resolved.target.name, torch=torch,
                        dockerfile_sha256=sha256_text(dockerfile), created=created,
                        source=(paths.templates_dir() / resolved.target.template).as_uri())
