"""Whether to compress a push on the wire: measured, not guessed.

One job: decide zstd or not for a relay push from two measurements taken
just before it.  Contract:

* :func:`should_compress` - pure: the link's rate, zstd's ratio and rate on
  this machine -> a decision and the reason in words;
* :func:`decide` - both measurements, then :func:`should_compress`;
* :func:`measure_link` - bytes per second into a node over its SSH
  connection (a probe of PROBE_BYTES into ``cat > /dev/null``);
* :func:`measure_zstd` - zstd's ratio and rate on a sample of the image's
  own save stream (the first SAMPLE_BYTES; the engine stops exporting when
  the stream is closed).

Compression pays when the link, not the CPU, limits the push: the time goes
from S/B to max(S/Z, r x S/B) for zstd rate Z and ratio r.  Decision: compress
when r <= MAX_RATIO and Z >= MARGIN x B (the nodes decompress at several
times the rate zstd compresses, so the head's compressor is the CPU side).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from docker import DockerClient

    from clusterctl.cluster.transport import NodeConnection

PROBE_BYTES = 4 * 1024 * 1024
SAMPLE_BYTES = 16 * 1024 * 1024
MAX_RATIO = 0.8
MARGIN = 2.0


def should_compress(link_rate: float, ratio: float, zstd_rate: float) -> tuple[bool, str]:
    """(compress?, why) from the link's and zstd's measured rates (bytes/s) and zstd's ratio."""
    if ratio > MAX_RATIO:
        return False, f"the image compresses only to {ratio:.0%}"
    if zstd_rate < MARGIN * link_rate:
        return False, (f"zstd here ({zstd_rate / 1e6:.0f} MB/s) is not {MARGIN:g}x faster "
                       f"than the link ({link_rate / 1e6:.0f} MB/s)")
    return True, (f"the link ({link_rate / 1e6:.1f} MB/s) is the bottleneck: zstd makes "
                  f"{ratio:.0%} of the bytes at {zstd_rate / 1e6:.0f} MB/s")


def measure_link(conn: NodeConnection, nbytes: int = PROBE_BYTES) -> float:
    """Bytes per second into ``conn``'s node (random bytes, so nothing compresses them)."""
    data = os.urandom(nbytes)
    start = time.monotonic()
    conn.run(["sh", "-c", "cat > /dev/null"], stdin=data, timeout=120, check=True)
    return nbytes / max(time.monotonic() - start, 1e-6)


def decide(conn: NodeConnection, client: DockerClient, image_id: str, *,
           open_stream=None) -> tuple[bool, str]:
    """Measure the link into ``conn``'s node and zstd on the image, then decide.
    ``open_stream``: where the sample comes from (default: the image's ``docker save``)."""
    ratio, zstd_rate = measure_zstd(client, image_id, open_stream=open_stream)
    if zstd_rate == 0.0:
        return False, "zstd is not installed on this machine"
    return should_compress(measure_link(conn), ratio, zstd_rate)


def measure_zstd(client: DockerClient, image_id: str, nbytes: int = SAMPLE_BYTES, *,
                 open_stream=None) -> tuple[float, float]:
    """(ratio, bytes/s) of ``zstd -1 -T0`` on the first ``nbytes`` of the image's stream
    (``open_stream()``: the bytes the push will send; default: its ``docker save``)."""
    binary = shutil.which("zstd")
    if binary is None:
        return 1.0, 0.0
    stream = open_stream() if open_stream else client.api.get_image(image_id)
    sample = bytearray()
    try:
        for chunk in stream:
            sample.extend(chunk)
            if len(sample) >= nbytes:
                break
    finally:
        stream.close()
    if not sample:
        return 1.0, 0.0
    start = time.monotonic()
    out = subprocess.run([binary, "-1", "-T0", "-q", "-c"], input=bytes(sample),
                         capture_output=True, check=True).stdout
    seconds = max(time.monotonic() - start, 1e-6)
    return len(out) / len(sample), len(sample) / seconds
