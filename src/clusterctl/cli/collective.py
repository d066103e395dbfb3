"""Printing for ``clusterctl check --collective``: option parsing, the node table, the
node-by-node bandwidth matrix (coloured on a terminal, plain under CLUSTERCTL_PLAIN or
when piped), the verdict line, the saved JSON.  The check itself is
:mod:`clusterctl.run.collective`."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from clusterctl.core.console import interactive, out
from clusterctl.core.errors import UserError
from clusterctl.core.text import digits
from clusterctl.run import records
from clusterctl.run.collective import model
from clusterctl.run.collective.check import CheckResult

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?", re.IGNORECASE)
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(b/s|bps|bit/s|/s|)", re.IGNORECASE)
_BIN = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_DEC = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_sizes(text: str, option: str = "--sizes") -> tuple[int, ...]:
    """'1M,4M,16M' -> bytes (binary units), each at least 4 bytes and at most 4 GiB."""
    sizes = []
    for part in text.split(","):
        m = _SIZE.fullmatch(part.strip())
        value = int(float(m.group(1)) * _BIN[m.group(2).lower()]) if m else 0
        if not m or not 4 <= value <= 4 << 30:
            raise UserError(f"{option} {text!r}: {part.strip()!r} is not a message size; valid: "
                            "sizes from 4 bytes to 4G with an optional unit K, M or G (binary), "
                            "comma-separated, e.g. 1M,4M,16M")
        sizes.append(value)
    return tuple(sorted(set(sizes)))


def parse_pair_rounds(text: str) -> int | None:
    """'3' -> 3 rounds; 'all' -> None (every pair)."""
    t = text.strip().lower()
    if t == "all":
        return None
    if digits(t) and 1 <= int(t) <= 10_000:
        return int(t)
    raise UserError(f"--pair-rounds {text!r} is not a number of rounds; valid: a whole number "
                    "from 1 (each node meets that many partners) or 'all' (every pair)")


def parse_rate(text: str, option: str = "--min-busbw") -> float:
    """'2.5GB/s', '800MB/s', '10Gbps' (bits), '1e9' -> bytes per second (decimal units)."""
    t = text.strip()
    m = _RATE.fullmatch(t)
    if not m:
        try:
            value = float(t)
        except ValueError:
            value = -1.0
        if value > 0:
            return value
        raise UserError(f"{option} {text!r} is not a bandwidth; valid: bytes per second with "
                        "an optional decimal unit, e.g. 2.5GB/s, 800MB/s, or bits as 10Gbps")
    value = float(m.group(1)) * _DEC[m.group(2).lower()]
    if m.group(3).lower() in ("bps", "bit/s"):
        value /= 8
    if value <= 0:
        raise UserError(f"{option} {text!r} must be above zero")
    return value


_STYLE = {model.OK: "green", model.SLOW: "bold red", model.BROKEN: "bold red",
          model.STOPPED: "yellow"}


def report(result: CheckResult, thresholds: model.Thresholds, *, saved: Path | None) -> None:
    """The node table, the matrix, the all-node figures and the verdict line."""
    colour = interactive()
    console = out if colour else Console(file=out.file, width=200, highlight=False,
                                         no_color=True, force_terminal=False)
    m, v = result.measurements, result.verdict
    nodes = Table(title=f"collective check {result.check_id}: {len(m.nodes)} nodes, "
                        f"backend {result.backend}, image {escape(result.image)}",
                  header_style="bold")
    for col in ("node", "rank", "status", "best pair busbw", "joined", "torch", "backend",
                "reason"):
        nodes.add_column(col)
    for nv in v.nodes:
        rep = m.reports[nv.node]
        status = f"[{_STYLE[nv.status]}]{nv.status}[/]" if colour else nv.status
        nodes.add_row(escape(nv.node), str(nv.rank), status, model.fmt_rate(nv.score),
                      f"{rep.joined:.1f} s" if rep.joined is not None else "-",
                      escape(str(rep.versions.get("torch", "-"))),
                      escape(str(rep.versions.get("backend_version", "-"))),
                      escape(nv.reason) or "-")
    console.print(nodes)
    if m.pairs:
        console.print(matrix_table(result, thresholds, colour))
    for s in m.world:
        console.print(f"all_reduce {model.fmt_bytes(s.nbytes):>8} across {len(m.nodes)} nodes: "
                      f"{s.seconds * 1e3:9.1f} ms  algbw {model.fmt_rate(s.algbw):>11}  "
                      f"busbw {model.fmt_rate(s.busbw):>11}", markup=False)
    for a, b in sorted(m.unfinished):
        console.print(f"pair {m.nodes[a]} - {m.nodes[b]}: cut short, not finished within the "
                      "budget", markup=False)
    for nbytes in m.skipped:
        console.print(f"all_reduce {model.fmt_bytes(nbytes):>8} across {len(m.nodes)} nodes: "
                      "left out, one iteration would not fit in the budget", markup=False)
    for c in result.preflight or []:
        for warning in c.warnings:
            console.print(f"{c.node}: warning: {warning}", markup=False)
    where = f" (saved {saved})" if saved else ""
    line = ("PASS: " if v.ok else "FAIL: ") + v.message + f" in {result.seconds:.1f} s" + where
    if colour:
        console.print(f"[{'green' if v.ok else 'bold red'}]{escape(line)}[/]")
    else:
        console.print(line, markup=False)


def matrix_table(result: CheckResult, thresholds: model.Thresholds, colour: bool) -> Table:
    """Node-by-node pair bus bandwidth; red where a pair is slower than the median node's
    best pair by more than --max-slowdown (or below --min-busbw)."""
    m, v = result.measurements, result.verdict
    rows = model.matrix_rows(m)
    size = model.fmt_bytes(m.pair_bytes) if m.pair_bytes else "?"
    top = max(m.pairs.values(), default=0.0)
    unit, scale = next((u, f) for u, f in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3), ("B/s", 1))
                       if top >= f or f == 1)
    t = Table(title=f"pair all_reduce busbw, {size} ({unit})", header_style="bold")
    t.add_column("")
    for name in m.nodes:
        t.add_column(escape(name), justify="right")
    limit = 0.0
    if v.reference:
        limit = v.reference / thresholds.max_slowdown
    if thresholds.min_busbw:
        limit = max(limit, thresholds.min_busbw)
    for i, name in enumerate(m.nodes):
        cells = []
        for j, bw in enumerate(rows[i]):
            if i == j:
                cells.append("-")
            elif bw is None:
                cells.append("?")
            else:
                text = f"{bw / scale:.1f}"
                cells.append(f"[{'red' if bw < limit else 'green'}]{text}[/]" if colour else text)
        t.add_row(escape(name), *cells)
    return t


def save(result: CheckResult, thresholds: model.Thresholds, path: Path | None) -> Path:
    """Write the JSON to ``path`` or runs/<check-id>/collective.json (atomically)."""
    target = path or records.run_path(result.check_id) / "collective.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(result.to_json(thresholds), indent=2) + "\n")
    tmp.replace(target)
    return target
