"""A training's progress as numbers: the metrics line, its rates, the Prometheus text.

A training tells clusterctl how far it got by printing one line on stdout, as often as
every step (it costs one ``print``)::

    clusterctl-metrics {"rank": 0, "step": 12, "loss": 0.4312, "samples": 768, "time": 1764369000.12}

after the marker (:data:`MARKER`), one JSON object: ``rank`` (global rank), ``step``
(the step just finished), ``samples`` (cumulative samples this rank processed),
``time`` (unix seconds) are required; ``loss`` is optional; other keys are kept in
:attr:`Sample.extra`.  Every rank may print it (better: a rank that stops stepping
while the others go on is then seen as idle).  The line reaches the run's merged
output like any other (``node[rank]| clusterctl-metrics {...}``), so ``clusterctl
top``, the dashboard and anything reading ``runs/<id>/merged.log`` get it without a
side channel.

Contract (pure apart from :func:`read_log_metrics` reading one file):
    MARKER, MAX_LINE                 the marker; longer lines are not parsed
    parse_line(text) -> Sample|None  one output line (without the node prefix); never raises
    rates(samples, window_s) -> Rates  steps/s, samples/s over the last window_s seconds
    metrics_from_lines(lines, keep=) -> {node: [Sample]}  from (node, text) lines, the
                                     last ``keep`` samples per node (bounded memory)
    read_log_metrics(path, max_bytes=) -> {node: [Sample]}  the same from the tail of a
                                     run's merged.log (``node[rank]| text`` lines)
    NodeMetrics                      what is known of one node (its container's CPU and
                                     memory, its GPUs (``core.nodestats.GpuUse``), its
                                     rates), filled by ``run.top``
    prometheus_text(run_id, per_node) -> str  the Prometheus text exposition format
                                     (version 0.0.4), what ``top --prometheus`` writes
                                     and a ``/metrics`` endpoint serves
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.core.nodestats import GpuUse
from clusterctl.run.logs import parse_prefixed

MARKER = "clusterctl-metrics"
#: a metrics line longer than this is not parsed (a training printing a huge dict)
MAX_LINE = 4096
#: seconds of samples :func:`rates` looks at by default
WINDOW_S = 30.0
#: samples kept per node when reading lines (at one line a step, minutes of steps)
KEEP = 256
#: bytes of merged.log :func:`read_log_metrics` reads from its end by default
MAX_BYTES = 4 * 1024 * 1024

_REQUIRED = ("rank", "step", "samples", "time")


@dataclass(frozen=True)
class Sample:
    """One metrics line: where a rank was at ``time``."""

    rank: int
    step: int
    time: float
    samples: int
    loss: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rates:
    """Progress over a window: rates are None with fewer than two samples in it."""

    steps_per_s: float | None
    samples_per_s: float | None
    last_step: int | None
    last_loss: float | None
    last_time: float | None = None


NO_RATES = Rates(None, None, None, None, None)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def parse_line(text: str) -> Sample | None:
    """A :class:`Sample` from one output line, None for any other line (never raises).

    The marker may follow other text on the line (a logger's prefix); the JSON object
    runs to the end of the line.  ``rank``, ``step``, ``samples`` must be integers >= 0,
    ``time`` a finite number, ``loss`` (optional) a finite number or null.
    """
    if not isinstance(text, str) or len(text) > MAX_LINE:
        return None
    at = text.find(MARKER)
    if at < 0:
        return None
    body = text[at + len(MARKER):].strip()
    if not body.startswith("{"):
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    if any(key not in data for key in _REQUIRED):
        return None
    rank, step, samples = _int(data["rank"]), _int(data["step"]), _int(data["samples"])
    when = _float(data["time"])
    if rank is None or step is None or samples is None or when is None:
        return None
    if rank < 0 or step < 0 or samples < 0:
        return None
    loss = None
    if data.get("loss") is not None:
        loss = _float(data["loss"])
        if loss is None:
            return None
    extra = {k: v for k, v in data.items() if k not in (*_REQUIRED, "loss")}
    return Sample(rank=rank, step=step, time=when, samples=samples, loss=loss, extra=extra)


def rates(samples: Sequence[Sample], window_s: float = WINDOW_S, *,
          now: float | None = None) -> Rates:
    """Steps and samples per second over the last ``window_s`` seconds of ``samples``.

    ``samples`` in the order printed.  The window ends at ``now`` when given (a rank
    that stopped printing falls to 0 steps/s once its last sample is older than the
    window), else at the last sample.  A restart (the step going back) starts the
    window again.  Samples of several ranks (a node running more than one) are
    rated per rank, then combined: the slowest rank's steps/s and last step (the node
    is as far as its slowest rank), the sum of their samples/s, the lowest rank's loss.
    """
    by_rank: dict[int, list[Sample]] = {}
    for s in samples:
        by_rank.setdefault(s.rank, []).append(s)
    if len(by_rank) <= 1:
        return _rank_rates(samples, window_s, now)
    each = [_rank_rates(by_rank[r], window_s, now) for r in sorted(by_rank)]
    steps = [r.steps_per_s for r in each]
    per_s = [r.samples_per_s for r in each]
    return Rates(steps_per_s=None if None in steps else min(steps),  # type: ignore[type-var]
                 samples_per_s=None if None in per_s else sum(per_s),  # type: ignore[arg-type]
                 last_step=min(r.last_step for r in each if r.last_step is not None),
                 last_loss=each[0].last_loss,
                 last_time=max(r.last_time for r in each if r.last_time is not None))


def _rank_rates(samples: Sequence[Sample], window_s: float, now: float | None) -> Rates:
    if not samples:
        return NO_RATES
    last = samples[-1]
    end = last.time if now is None else max(now, last.time)
    if end - last.time > window_s:
        return Rates(0.0, 0.0, last.step, last.loss, last.time)
    first = last
    for s in reversed(samples):
        if s.step > first.step or s.samples > first.samples:
            break  # the counters went back: an earlier attempt
        if last.time - s.time > window_s:
            break
        first = s
    span = end - first.time
    if first is last or span <= 0:
        return Rates(None, None, last.step, last.loss, last.time)
    return Rates(steps_per_s=(last.step - first.step) / span,
                 samples_per_s=(last.samples - first.samples) / span,
                 last_step=last.step, last_loss=last.loss, last_time=last.time)


def metrics_from_lines(lines: Iterable[tuple[str, str]], *,
                       keep: int = KEEP) -> dict[str, list[Sample]]:
    """``{node: [Sample, ...]}`` from (node, text) lines, the last ``keep`` per node.

    Memory stays bounded however many lines come (a deque per node).  A node that
    printed no metrics line is absent.
    """
    kept: dict[str, deque[Sample]] = {}
    for node, text in lines:
        sample = parse_line(text)
        if sample is not None:
            kept.setdefault(node, deque(maxlen=keep)).append(sample)
    return {node: list(d) for node, d in kept.items()}


def _merged_tail(path: Path, max_bytes: int) -> Iterable[tuple[str, str]]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - max_bytes)
        f.seek(start)
        data = f.read(max_bytes)
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first is likely cut
    for raw in lines:
        if len(raw) > MAX_LINE + 256:
            continue
        parsed = parse_prefixed(raw.decode("utf-8", errors="replace"))
        if parsed is not None:
            yield parsed[0], parsed[2]


def read_log_metrics(path: str | Path, max_bytes: int = MAX_BYTES, *,
                     keep: int = KEEP) -> dict[str, list[Sample]]:
    """``{node: [Sample, ...]}`` from the last ``max_bytes`` of a run's merged.log.

    A missing or unreadable file (or a symlink) gives ``{}``.  Reads at most
    ``max_bytes``; keeps at most ``keep`` samples per node.
    """
    if max_bytes <= 0:
        return {}
    return metrics_from_lines(_merged_tail(Path(path), max_bytes), keep=keep)


# -- what one node comes to, and its Prometheus text -------------------------------

@dataclass(frozen=True)
class NodeMetrics:
    """One node of a run at one refresh: None where a value is not known.

    ``error``: why the node could not be read (then only the rates may be known);
    ``idle``: the node's ranks do not step (or its CPU is near 0) while others work,
    ``idle_why`` says which.
    """

    node: str
    rank: int | None = None
    rates: Rates = NO_RATES
    cpu_percent: float | None = None
    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    gpus: tuple[GpuUse, ...] = ()
    idle: bool = False
    error: str | None = None
    idle_why: str = ""


def escape_label(value: str) -> str:
    """A label value as the exposition format wants it: backslash, quote, newline escaped."""
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


#: (name, help, type) of each family, in the order written
_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("clusterctl_run_steps_per_second", "Training steps per second (metrics lines)", "gauge"),
    ("clusterctl_run_samples_per_second", "Training samples per second (metrics lines)", "gauge"),
    ("clusterctl_run_loss", "Last loss a rank printed", "gauge"),
    ("clusterctl_run_last_step", "Last step a rank printed", "gauge"),
    ("clusterctl_run_idle", "1 when the node does not step while others do", "gauge"),
    ("clusterctl_run_node_up", "1 when the node answered this refresh", "gauge"),
    ("clusterctl_run_container_cpu_percent", "CPU of the run's container (100 = one core)", "gauge"),
    ("clusterctl_run_container_memory_bytes", "Memory used by the run's container", "gauge"),
    ("clusterctl_run_container_memory_limit_bytes", "Memory limit of the run's container", "gauge"),
    ("clusterctl_run_gpu_utilization_percent", "Accelerator utilization", "gauge"),
    ("clusterctl_run_gpu_memory_used_bytes", "Accelerator memory used", "gauge"),
    ("clusterctl_run_gpu_memory_total_bytes", "Accelerator memory", "gauge"),
)


def _values(name: str, m: NodeMetrics) -> list[tuple[dict[str, str], float]]:
    r = m.rates
    plain = {
        "clusterctl_run_steps_per_second": r.steps_per_s,
        "clusterctl_run_samples_per_second": r.samples_per_s,
        "clusterctl_run_loss": r.last_loss,
        "clusterctl_run_last_step": r.last_step,
        "clusterctl_run_idle": int(m.idle),
        "clusterctl_run_node_up": int(m.error is None),
        "clusterctl_run_container_cpu_percent": m.cpu_percent,
        "clusterctl_run_container_memory_bytes": m.memory_bytes,
        "clusterctl_run_container_memory_limit_bytes": m.memory_limit_bytes,
    }
    if name in plain:
        value = plain[name]
        return [] if value is None else [({}, value)]
    attr = {"clusterctl_run_gpu_utilization_percent": "util_percent",
            "clusterctl_run_gpu_memory_used_bytes": "memory_used_bytes",
            "clusterctl_run_gpu_memory_total_bytes": "memory_total_bytes"}[name]
    out = []
    for gpu in m.gpus:
        value = getattr(gpu, attr)
        if value is not None:
            out.append(({"gpu": str(gpu.index)}, value))
    return out


def prometheus_text(run_id: str, per_node: Mapping[str, NodeMetrics]) -> str:
    """The Prometheus text exposition format (0.0.4) of a run's nodes.

    Labels ``run``, ``node``, ``rank`` (``gpu`` on accelerator series); a value that is
    not known is left out, never written as 0.  A family with no series is left out too.
    """
    out: list[str] = []
    for name, help_text, kind in _FAMILIES:
        series: list[str] = []
        for node in sorted(per_node):
            m = per_node[node]
            base = {"run": run_id, "node": m.node or node}
            if m.rank is not None:
                base["rank"] = str(m.rank)
            for more, value in _values(name, m):
                labels = ",".join(f'{k}="{escape_label(v)}"' for k, v in {**base, **more}.items())
                series.append(f"{name}{{{labels}}} {_number(value)}")
        if series:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(series)
    return "\n".join(out) + "\n" if out else ""


__all__ = ["KEEP", "MARKER", "MAX_BYTES", "MAX_LINE", "NO_RATES", "WINDOW_S", "GpuUse", "NodeMetrics",
           "Rates", "Sample", "escape_label", "metrics_from_lines", "parse_line", "prometheus_text",
           "rates", "read_log_metrics"]
