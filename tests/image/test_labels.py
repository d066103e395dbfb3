"""Image labels (build/labels.py): OCI annotations plus io.clusterctl.* facts, defined once."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone

from clusterctl.image import context, labels
from clusterctl.image.labels import LABEL_PREFIX
from clusterctl.image.targets import resolve


def test_image_labels_carry_oci_and_clusterctl_facts():
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    got = labels.image_labels("cpu", version="2.13.0", torch="2.13.0", dockerfile_sha256="ab" * 32,
                              created=when, extra={"io.clusterctl.stack": "gloo"})
    assert got["org.opencontainers.image.title"] == "clusterctl cpu"
    assert got["org.opencontainers.image.version"] == "2.13.0"
    assert got["org.opencontainers.image.created"] == "2026-01-02T03:04:05Z"
    assert got["org.opencontainers.image.source"].startswith("file:///")
    assert got["io.clusterctl.target"] == "cpu"
    assert got["io.clusterctl.torch"] == "2.13.0"
    assert got["io.clusterctl.dockerfile-sha256"] == "ab" * 32
    assert got["io.clusterctl.stack"] == "gloo"
    assert "io.clusterctl.torch" not in labels.image_labels("base", version="bookworm")


def test_file_sha256_matches_hashlib(tmp_path):
    f = tmp_path / "Dockerfile"
    f.write_bytes(b"FROM scratch\n" * 100000)
    assert labels.file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    assert labels.sha256_text("FROM scratch\n" * 100000) == labels.file_sha256(f)


def test_target_labels_carry_the_dockerfile_sha256(in_tmp):
    r = context.render_context("ipex", torch="1.12.1")
    got = labels.target_labels(resolve("ipex", "1.12.1"), r.dockerfile)

    assert got[f"{LABEL_PREFIX}dockerfile-sha256"] == \
        hashlib.sha256((r.context_dir / "Dockerfile").read_bytes()).hexdigest()
    assert got[f"{LABEL_PREFIX}target"] == "ipex"
    assert got[f"{LABEL_PREFIX}torch"] == "1.12.1"
    assert got["org.opencontainers.image.source"].endswith("/templates/ipex/Dockerfile.j2")
    for key in ("title", "version", "created", "source"):
        assert got[f"org.opencontainers.image.{key}"]
