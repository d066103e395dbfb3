"""Benchmark: how long validating an inventory takes at 1,000, 10,000 and 100,000 nodes.

For each size it times, in a fresh process each (so memory is per measurement):

* ``hostfile``: an MPI hostfile (``nodeN slots=8``) read by ``load_inventory``: per-node
  checks, the rules across nodes (unique names, unique host and port, one master), rank order;
* ``yaml``: a YAML inventory (``{name: nodeN, host: 10.x.y.z}`` per node) read by
  ``load_inventory``: the YAML reader (lines of every key, limits) and the same checks;
* ``slurm``: ``--nodes slurm`` with ``SLURM_JOB_NODELIST=node[1-N]`` (no file at all).

each with this design and with the previous one in the same run: the previous rank
order (a copy is below: ``names.count(name)`` per node, quadratic) and, for YAML, PyYAML's
pure-Python parser (libyaml's parser is the new design's).  A previous-design run that
uses more than ``--old-limit`` CPU seconds (default 120) is stopped and shown as ``>LIMIT``.

Figures are seconds of wall time and of CPU time of the measuring process (CPU time is the
steadier figure on a busy machine), the peak resident memory, and the ratio previous/new.
Run it from a checkout (no root, no sandbox, no engine):

    .venv/bin/python benchmarks/validate.py [--nodes 1000,10000,100000] [--old-limit 120]
        [--json FILE] [--plot FILE.png]
    make bench-validate

``--json FILE`` writes every printed row and the run's conditions (benchmarks/plot.py's
"validate" shape: per node count and input, new_wall/new_cpu/new_mb and the previous
design's prev_wall/prev_cpu/prev_over_new, or prev_stopped at --old-limit); ``--plot``
draws them (CPU seconds against node count, log-log).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KINDS = ("hostfile", "yaml", "slurm")

if __package__:                 # imported as benchmarks.validate (the tests)
    from . import plot as benchplot
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot


def old_rank_order(nodes, *, where: str = "inventory"):
    """The previous design's rank order, kept as it was (quadratic duplicate check)."""
    from clusterctl.core.errors import UserError, one_of
    if not nodes:
        raise UserError(f"{where}: no nodes; valid: at least one node")
    names = [n.name for n in nodes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"{where}: node names used twice: {one_of(twice)}; valid: a unique name per node")
    masters = [n for n in nodes if n.master]
    if len(masters) > 1:
        raise UserError(f"{where}: {len(masters)} masters ({one_of([m.name for m in masters])}); "
                        "valid: at most one node with master: true")
    master = masters[0] if masters else nodes[0].model_copy(update={"master": True})
    rest = [n for n in nodes if n is not (masters[0] if masters else nodes[0])]
    return [master, *rest]


def write_input(kind: str, n: int, directory: Path) -> Path | None:
    if kind == "hostfile":
        path = directory / f"hosts-{n}"
        path.write_text("".join(f"node{i} slots=8\n" for i in range(n)))
    elif kind == "yaml":
        path = directory / f"inventory-{n}.yaml"
        path.write_text("nodes:\n" + "".join(
            f"  - {{name: node{i}, host: 10.{i >> 16}.{(i >> 8) & 255}.{i & 255}}}\n" for i in range(n)))
    else:
        return None
    return path


def measure_one(kind: str, n: int, design: str, path: str) -> dict:
    """Runs in the child: validate once, return the figures."""
    import yaml

    from clusterctl.cluster.inventory import load_inventory, model
    from clusterctl.core import yamlfile
    if design == "previous":
        model.rank_order = old_rank_order
        yamlfile._FastLoader = yaml.SafeLoader
    if kind == "slurm":
        os.environ["SLURM_JOB_NODELIST"] = f"node[1-{n}]"
        path = "slurm"
    wall, cpu = time.perf_counter(), time.process_time()
    inventory = load_inventory(path)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert len(inventory) == n, (len(inventory), n)
    return {"wall": wall, "cpu": cpu, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_child(kind: str, n: int, design: str, path: Path | None, cpu_limit: int | None) -> dict | None:
    """The figures of one measurement, or None when it used more than ``cpu_limit`` CPU
    seconds (the kernel stops it: RLIMIT_CPU, so a busy machine does not cut it short)."""
    argv = [sys.executable, __file__, "--one", kind, str(n), design, str(path or "")]

    def limited() -> None:
        if cpu_limit:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 5))

    out = subprocess.run(argv, capture_output=True, text=True, preexec_fn=limited)
    if out.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and cpu_limit:
        return None
    if out.returncode != 0:
        raise SystemExit(f"validate.py: the {design} design failed on {kind} x {n}:\n{out.stderr}")
    return json.loads(out.stdout.splitlines()[-1])


def bad(message: str) -> None:
    """Bad input: one message, exit status 2 (nothing was measured)."""
    print(f"validate.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def sizes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v < 1 or v > 2_000_000 for v in values):
        bad(f"--nodes {text!r}: valid: comma-separated node counts from 1 to 2,000,000, e.g. 1000,10000,100000")
    return values


def row(n: int, kind: str, new: dict, old: dict | None, old_limit: float) -> dict:
    """One printed row as the JSON holds it (``old`` None: stopped at ``old_limit`` CPU seconds;
    prev_over_new is then the lower bound the script prints, old_limit / new CPU s)."""
    return {"nodes": n, "input": kind, "new_wall": round(new["wall"], 4),
            "new_cpu": round(new["cpu"], 4), "new_mb": round(new["rss_mb"], 1),
            "prev_wall": round(old["wall"], 4) if old else None,
            "prev_cpu": round(old["cpu"], 4) if old else None,
            "prev_over_new": (round(old["cpu"] / new["cpu"], 2) if old else round(old_limit / new["cpu"]))
            if new["cpu"] else None,
            "prev_stopped": old is None}


def json_document(rows: list[dict], old_limit: float, command: str, conditions: dict) -> dict:
    """The run's rows and conditions as one checked document (plot.py's "validate" shape)."""
    return benchplot.document("validate", command, {**conditions, "old_limit": old_limit},
                              rows=rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        kind, n, design, path = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
        print(json.dumps(measure_one(kind, n, design, path)))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1000,10000,100000", help="node counts, comma-separated")
    ap.add_argument("--old-limit", type=int, default=120,
                    help="CPU seconds after which a previous-design run is stopped (default 120)")
    ap.add_argument("--json", metavar="FILE", help="write the rows and the run's conditions as JSON")
    ap.add_argument("--plot", metavar="FILE.png", help="draw the rows (benchmarks/plot.py)")
    args = ap.parse_args()
    counts = sizes(args.nodes)
    for option, value in (("--json", args.json), ("--plot", args.plot)):
        if value and not Path(value).resolve().parent.is_dir():
            bad(f"{option} {value}: its directory does not exist; valid: a file in an existing directory")
    if args.old_limit <= 0:
        bad(f"--old-limit {args.old_limit}: valid: a whole number of CPU seconds greater than 0")
    print(f"{'nodes':>8} {'input':<9} {'new wall s':>10} {'new CPU s':>10} {'new MB':>7} "
          f"{'prev wall s':>11} {'prev CPU s':>10} {'prev/new':>9}")
    rows, loads = [], benchplot.Loads()
    with tempfile.TemporaryDirectory(prefix="clusterctl-bench-validate-") as tmp:
        for n in counts:
            for kind in KINDS:
                path = write_input(kind, n, Path(tmp))
                new = run_child(kind, n, "new", path, None)
                old = run_child(kind, n, "previous", path, args.old_limit)
                prev = (f"{old['wall']:>11.2f} {old['cpu']:>10.2f} {old['cpu'] / new['cpu']:>8.1f}x" if old else
                        f"{'-':>11} {'>' + str(args.old_limit):>10} "
                        f"{'>' + format(args.old_limit / new['cpu'], '.0f') + 'x':>9}")
                print(f"{n:>8} {kind:<9} {new['wall']:>10.2f} {new['cpu']:>10.2f} {new['rss_mb']:>7.0f} {prev}",
                      flush=True)
                rows.append(row(n, kind, new, old, args.old_limit))
                loads.sample()
                if path:
                    path.unlink()
    print(f"(machine load average at the end: {os.getloadavg()[0]:.1f}; CPU seconds are the steadier figure)")
    if args.json or args.plot:
        doc = json_document(rows, args.old_limit, benchplot.command_line(),
                            benchplot.conditions(loads))
        benchplot.save(doc, args.json, args.plot)


if __name__ == "__main__":
    main()
