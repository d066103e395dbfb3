"""What a node's tools say about its use: container CPU and memory, accelerators.  Pure.

The parsers of the output ``clusterctl top`` reads on each node (one SSH command a node,
``cluster.nodetop`` runs it):

* :func:`parse_docker_stats` - ``docker stats --no-stream --format '{{json .}}'``: one JSON
  object a line, ``CPUPerc`` (``"74.07%"``, 100% is one core), ``MemUsage`` (``"648KiB /
  23.54GiB"``; ``"0B / 0B"`` for a container that is not running);
* :func:`parse_nvidia_smi` - ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used,
  memory.total --format=csv,noheader,nounits`` (:data:`NVIDIA_SMI_QUERY`): one line per GPU,
  MiB, ``[N/A]`` / ``[Not Supported]`` where the driver has no value;
* :func:`parse_cnmon` - Cambricon's ``cnmon info -u`` and ``cnmon info -m`` (:data:`CNMON_QUERY`):
  per ``Card : N`` (or ``Card N``), ``MLU Average : N %`` and a ``Physical Memory Usage``
  block of ``Total``/``Used`` in MiB (or ``Physical Memory Total``/``Used`` lines, the
  layout ``cluster.accelprobe`` reads for health).

Every parser skips what it does not understand (a tool's warning, a cut line) and never
raises: a node's odd output must not end ``top``.  ``parse_size`` reads docker's sizes.

Contract: :class:`GpuUse`, :class:`ContainerUse`, the three parsers, :func:`parse_size`,
:data:`NVIDIA_SMI_QUERY`, :data:`CNMON_QUERY`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from clusterctl.core.text import digits

#: the argv whose output :func:`parse_nvidia_smi` reads
NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total",
                    "--format=csv,noheader,nounits")
#: the argvs whose outputs, one after the other, :func:`parse_cnmon` reads
CNMON_QUERY = (("cnmon", "info", "-u"), ("cnmon", "info", "-m"))

MIB = 1 << 20
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*\Z")


@dataclass(frozen=True)
class GpuUse:
    """One accelerator as ``nvidia-smi`` or ``cnmon`` reports it (None: not reported)."""

    index: int
    util_percent: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None


@dataclass(frozen=True)
class ContainerUse:
    """One container's use at one sample (``docker stats``): None where not reported."""

    id: str
    name: str
    cpu_percent: float | None
    memory_bytes: int | None
    memory_limit_bytes: int | None


def parse_size(text: str) -> int | None:
    """``"648KiB"`` -> 663552, ``"1.04kB"`` -> 1040, ``"0B"`` -> 0; None for anything else."""
    m = _SIZE.match(text or "")
    if not m:
        return None
    unit = _UNITS.get((m.group(2) or "B").lower())
    if unit is None:
        return None
    return int(float(m.group(1)) * unit)


def _percent(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    value = text.strip().rstrip("%").strip()
    try:
        f = float(value)
    except ValueError:
        return None
    return f if math.isfinite(f) and f >= 0 else None


def parse_docker_stats(text: str) -> list[ContainerUse]:
    """Every container of ``docker stats --no-stream --format '{{json .}}'`` output."""
    found: list[ContainerUse] = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line.startswith("{") or len(line) > 8192:
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        ident = data.get("ID") or data.get("Container") or ""
        used = limit = None
        usage = data.get("MemUsage")
        if isinstance(usage, str) and "/" in usage:
            left, right = usage.split("/", 1)
            used, limit = parse_size(left), parse_size(right)
        found.append(ContainerUse(id=str(ident), name=str(data.get("Name") or ""),
                                  cpu_percent=_percent(data.get("CPUPerc")),
                                  memory_bytes=used, memory_limit_bytes=limit or None))
    return found


def _number(text: str) -> float | None:
    try:
        f = float(text.strip())
    except ValueError:
        return None  # [N/A], [Not Supported]
    return f if math.isfinite(f) and f >= 0 else None


def parse_nvidia_smi(text: str) -> list[GpuUse]:
    """Every GPU of :data:`NVIDIA_SMI_QUERY` output (index, util %, MiB used, MiB total)."""
    gpus: list[GpuUse] = []
    for line in (text or "").splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or not digits(fields[0]):
            continue
        util, used, total = (_number(f) for f in fields[1:])
        gpus.append(GpuUse(index=int(fields[0]), util_percent=util,
                           memory_used_bytes=None if used is None else int(used * MIB),
                           memory_total_bytes=None if total is None else int(total * MIB)))
    return gpus


_CARD = re.compile(r"^\s*Card\s*:?\s*(\d+)\s*\Z")
_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z ]*?)\s*:\s*(.*?)\s*\Z")


def parse_cnmon(text: str) -> list[GpuUse]:
    """Every MLU of ``cnmon info -u`` and ``cnmon info -m`` output, by card."""
    util: dict[int, float | None] = {}
    used: dict[int, int | None] = {}
    total: dict[int, int | None] = {}
    card: int | None = None
    physical = False
    for line in (text or "").splitlines():
        m = _CARD.match(line)
        if m:
            card, physical = int(m.group(1)), False
            continue
        m = _FIELD.match(line)
        if card is None or not m:
            continue
        key, value = m.group(1).lower(), m.group(2)
        if key == "mlu average":
            util[card] = _percent(value)
        elif key.endswith("memory usage"):
            physical = key == "physical memory usage"
        elif (physical and key in ("total", "used")) or key in ("physical memory total",
                                                                "physical memory used"):
            size = parse_size(value.replace(" ", ""))
            (total if key.endswith("total") else used)[card] = size
    cards = [GpuUse(index=c, util_percent=util.get(c), memory_used_bytes=used.get(c),
                    memory_total_bytes=total.get(c))
             for c in sorted(set(util) | set(used) | set(total))]
    return [g for g in cards if (g.util_percent, g.memory_used_bytes, g.memory_total_bytes)
            != (None, None, None)]


__all__ = ["CNMON_QUERY", "NVIDIA_SMI_QUERY", "ContainerUse", "GpuUse", "parse_cnmon",
           "parse_docker_stats", "parse_nvidia_smi", "parse_size"]
