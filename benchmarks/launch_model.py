"""The launch's head cost at 256 and 1,000 nodes, modelled from measured per-node costs.

Reads a launch benchmark's JSON (``docs/benchmarks/data/launch-tree.json`` by default:
benchmarks/launch.py's figures at 1, 4, 8 and 16 sandbox nodes) and fits, per design,
``cost(n) = fixed + per_node * n`` by least squares to the head's CPU seconds of the
launch itself (``host_cpu``) and, where measured, of the whole clusterctl process and of
the ``clusterctl stop`` process after it (each design's, from the one-node stop); then
prints the fit, its worst error on the measured points, and the projection to 32, 256 and
1,000 nodes with the ratio to one node.  Pure arithmetic over measured figures: it says
where the per-node costs lead, not what a real 1,000-node cluster would measure (whose
nodes do not share this machine's two cores, and whose links are not a bridge).  One
more row per design estimates the wall on such a cluster (:func:`own_cores`): the
one-node wall plus the head's CPU beyond one node's, taken as serial.

    .venv/bin/python benchmarks/launch_model.py [--json FILE] [--nodes 32,256,1000]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "data" / "launch-tree.json"


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per_node) of the least-squares line through ``points`` (n, seconds)."""
    n = len(points)
    if n == 1:
        return points[0][1], 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    per = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - per * mx, per


def _from_one_node(series: dict, rows: list[dict], key: str, what: str) -> None:
    """Per design, the rows' ``key`` against nodes, each series starting from the one-node
    figure (one node never takes the tree, so it is every design's, measured under any)."""
    single = [(1, r[key]) for r in rows if r["nodes"] == 1 and r.get(key) is not None][:1]
    for design in dict.fromkeys(r["design"] for r in rows if r["nodes"] > 1 and r.get(key) is not None):
        series[(design, what)] = single + [(r["nodes"], r[key]) for r in rows
                                           if r["design"] == design and r["nodes"] > 1 and r.get(key) is not None]


def model(doc: dict, targets: list[int]) -> list[dict]:
    """One row per design and measure: the fit, its worst error, the projections."""
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in doc.get("launch", []):
        if r.get("host_cpu") is not None:
            series.setdefault((r["design"], "launch host CPU s"), []).append((r["nodes"], r["host_cpu"]))
    _from_one_node(series, doc.get("launch", []), "stop_host_cpu", "stop host CPU s")
    process = doc.get("process", [])
    for r in process:
        if r.get("cpu") is not None:
            series.setdefault((r["design"], "whole process CPU s"), []).append((r["nodes"], r["cpu"]))
    # `clusterctl stop` takes the tree as the launch's inventory says: per design
    _from_one_node(series, process, "stop_cpu", "stop process CPU s")
    rows = []
    for (design, what), pts in sorted(series.items()):
        if len({x for x, _ in pts}) < 2:
            continue
        fixed, per = fit(pts)
        one = fixed + per
        worst = max(abs(fixed + per * x - y) for x, y in pts)
        rows.append({"design": design, "measure": what, "fixed": fixed, "per_node": per,
                     "measured": sorted(pts), "worst_error": worst,
                     "projected": {n: fixed + per * n for n in targets},
                     "ratio": {n: (fixed + per * n) / one for n in targets}})
    return rows + own_cores(doc, rows, targets)


#: the model's row for the wall a real cluster would see (see :func:`own_cores`)
OWN_CORES = "wall s, nodes on own cores"


def own_cores(doc: dict, rows: list[dict], targets: list[int]) -> list[dict]:
    """The launch's wall where every node has cores of its own (a real cluster), per design:
    the measured one-node wall of the default path, plus the head's own CPU beyond one
    node's, all of it taken as serial (one Python process; the nodes' work, which the
    sandbox queues on this machine's cores, is then per node and in parallel).  An
    estimate from the fitted head CPU, not a measurement: it leaves out the slowest node's
    tail and the links."""
    one = next((r for r in doc.get("launch", []) if r["nodes"] == 1 and r["design"] == "direct"
                and r.get("wall") is not None and r.get("host_cpu") is not None), None)
    if one is None:
        return []
    out = []
    for r in rows:
        if r["measure"] != "launch host CPU s":
            continue
        fixed = one["wall"] - one["host_cpu"] + r["fixed"]
        out.append({"design": r["design"], "measure": OWN_CORES, "fixed": fixed, "per_node": r["per_node"],
                    "measured": [], "worst_error": None,
                    "projected": {n: fixed + r["per_node"] * n for n in targets},
                    "ratio": {n: (fixed + r["per_node"] * n) / one["wall"] for n in targets}})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=DATA)
    p.add_argument("--nodes", default="32,256,1000")
    args = p.parse_args(argv)
    targets = [int(x) for x in args.nodes.split(",")]
    doc = json.loads(args.json.read_text())
    print(f"model of {args.json.name}: cost(n) = fixed + per_node * n (least squares)")
    head = "".join(f" {n:>9} (x1)" for n in targets)
    print(f"{'design':<11} {'measure':<26} {'fixed':>7} {'per node':>9} {'worst err':>9}{head}")
    for r in model(doc, targets):
        proj = "".join(f" {r['projected'][n]:>9.2f} ({r['ratio'][n]:.1f}x)" for n in targets)
        worst = "-" if r["worst_error"] is None else f"{r['worst_error']:.3f}"
        print(f"{r['design']:<11} {r['measure']:<26} {r['fixed']:>7.3f} {r['per_node']:>9.4f} "
              f"{worst:>9}{proj}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
