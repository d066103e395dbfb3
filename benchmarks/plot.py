"""The benchmarks' JSON results: their shapes, checks, tables and plots.

Every benchmark script takes ``--json FILE`` (its results, one documented shape per
script: :data:`SHAPES`) and ``--plot FILE.png`` (the plot of those results, drawn here).
Run on its own, this script draws every data file of ``docs/benchmarks/data/`` into
``docs/benchmarks/img/`` (``make bench-plots``), one PNG of the same name each::

    .venv/bin/python benchmarks/plot.py [--data DIR] [--out DIR]
    .venv/bin/python benchmarks/plot.py FILE.json [--out FILE.png]
    .venv/bin/python benchmarks/plot.py --tables [FILE.json ...]   # the Markdown tables the pages hold

A document (every shape)::

    {"benchmark": "push" | "launch" | "collective" | "validate" | "scale" | "workdir" | "recovery"
                  | "registry",
     "schema": 1,
     "source": "where the figures come from, in words (a run of this script, or transcribed)",
     "command": "the command line that produced them",
     "conditions": {"date": "2026-11-23", "host": ..., "cpus": 2,
                    "load_average": [lowest, highest] of the 1-minute load average seen, ...},
     <row lists>: [{...}, ...]}

Each shape names its conditions and, per row list, each row's fields; a field ending
in ``?`` may be missing or null (a transcribed run that did not print it). A file
missing a required field, or holding the wrong type, is one message naming the file,
the row and the field (exit status 2). Nothing here needs root, Docker or the
package: only matplotlib (the Agg backend) and the standard library.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "docs" / "benchmarks" / "data"
IMG = REPO / "docs" / "benchmarks" / "img"
SCHEMA = 1
SIZE = (8.0, 4.5)      # inches at DPI: 800 x 450 pixels
DPI = 100

#: benchmark -> {"conditions": fields, <row list>: row fields}; "name?" is optional
#: (missing or null), a type after ":" (num: int or float, int, str, bool, list, dict).
SHAPES: dict[str, dict[str, tuple[str, ...]]] = {
    "push": {
        "conditions": ("bandwidth:str", "bytes_per_second:num", "image_mb:num", "ideal_seconds:num",
                       "image?:str", "layers?:int", "layer_mb?:num"),
        # way: by-hand | star | relay | relay+zstd; case: cold | warm | layer;
        # mb_out: MB that left this machine (bridge tx); image_mb: image MB clusterctl counted;
        # t_over_t1: T(N)/T(1) for the same way and case; t_over_ideal: T/(S/B);
        # where: a relay's phases in seconds (plan, start, hops_up, head_sends,
        # to_chain_end, load_results); design/run: labels when runs of two designs are kept
        "rows": ("nodes:int", "way:str", "case:str", "seconds:num", "mb_out?:num",
                 "image_mb?:num", "t_over_t1?:num", "t_over_ideal?:num", "result?:str",
                 "where?:dict", "design?:str", "run?:str"),
    },
    "launch": {
        "conditions": ("repeat?:int", "image?:str", "fail_grace?:num"),
        # launch -> every container running, medians: host_cpu = CPU s of the clusterctl
        # process (cpu_pre: preflight+plan, cpu_start: start); wall = seconds, mostly the nodes
        "launch": ("nodes:int", "design:str", "host_cpu:num", "cpu_pre?:num", "cpu_start?:num",
                   "wall?:num", "wall_pre?:num", "wall_start?:num", "node_cpu?:num",
                   "node_cpu_per_node_ms?:num", "node_floor?:num", "dispatch?:num"),
        # the whole `clusterctl launch --detach` process: CPU s (imports included), wall s;
        # then the `clusterctl stop` process that tore that run down: its CPU s and wall s
        "process": ("nodes:int", "design:str", "cpu:num", "wall?:num", "stop_cpu?:num", "stop_wall?:num"),
        # rank failure -> last other container stopped (stopped, s; medians), detection,
        # stop calls, lines written (first/last, after the failure was noticed), each node's
        # line -> stopped (median node / slowest), every run's figure, the load average after
        "teardown": ("nodes:int", "design:str", "stopped:num", "detection?:num", "stop_calls?:num",
                     "lines_first?:num", "lines_last?:num", "line_median?:num", "line_max?:num",
                     "each_run?:list", "run?:str", "load_average?:list"),
        # T(hi)/T(lo) per design, as printed: {"design": d, "what": "host_cpu"|..., "value": x}
        "ratios": ("design:str", "what:str", "value:num", "nodes?:list"),
    },
    "collective": {
        "conditions": ("bandwidth:str", "slow_bandwidth:str", "image?:str", "push_seconds?:num"),
        # the by-hand way's unit: one 2-node check
        "pair": ("seconds:num", "verdict:str"),
        # verdict_s: check --collective to its verdict (torch_up_s + measuring_s + the rest);
        # all_pairs_s: the previous design (every pair), null where it equals 3 rounds;
        # by_hand_s: pair after pair, n(n-1)/2 x the pair's seconds; vs_*: those over verdict_s;
        # busbw, reference: bytes/s (all-node bus bandwidth, the median node's best pair)
        "rows": ("nodes:int", "verdict_s:num", "by_hand_s:num", "verdict:str", "torch_up_s?:num",
                 "measuring_s?:num", "all_pairs_s?:num", "vs_all?:num", "vs_hand?:num",
                 "busbw?:num", "reference?:num"),
    },
    "validate": {
        "conditions": ("old_limit:num",),
        # input: hostfile | yaml | slurm; new_*: this design (wall s, CPU s, peak resident MB);
        # prev_*: the previous design, null when stopped at old_limit CPU seconds (prev_stopped)
        "rows": ("nodes:int", "input:str", "new_cpu:num", "new_wall?:num", "new_mb?:num",
                 "prev_wall?:num", "prev_cpu?:num", "prev_over_new?:num", "prev_stopped?:bool"),
    },
    "scale": {
        "conditions": ("nodes:int", "rate:num", "seconds:num", "stall?:num", "image?:str",
                       "sandbox_up_s?:num", "sandbox_down_s?:num", "push_s?:num"),
        # one row per run: lines on stdout / in runs/ (node logs), what went wrong with them,
        # memory (MB): peak, steady (median), growth (peak after the first line over the
        # memory then)
        "rows": ("run:str", "wall:num", "stdout:int", "peak_mb:num", "growth_mb:num",
                 "exit?:int", "missing?:int", "duplicated?:int", "out_of_order?:int",
                 "garbled?:int", "node_log?:int", "merged?:int", "steady_mb?:num",
                 "threads?:int", "note?:str"),
    },
    "workdir": {
        "conditions": ("bandwidth:str", "files:int", "repeat?:int", "image?:str", "slots?:int",
                       "seed?:int", "nodes_held?:int", "push_s?:num", "mem_available_min_mb?:int",
                       "note?:str"),
        # the walk and hashing of the generated tree (clusterctl.code.snapshot.take): case cold |
        # warm; median and worst seconds of ``runs``; how the cold case was made cold
        "snapshot": ("case:str", "files:int", "mb:num", "median:num", "worst?:num", "runs?:int",
                     "how?:str"),
        # bytes a node is sent (clusterctl.code.sync.payload) for a one-line edit and for the
        # whole tree: no node involved
        "delta": ("what:str", "bytes:int"),
        # way: workdir | by-hand | rsync; program: python (edit -> every rank printed the new
        # value) | no-op (edit -> exit) | no-op, unchanged (no edit; workdir only); seconds:
        # cold (the first ship), median and worst of the repeats, each_run; ranks_exit: python's
        # end to end (median); bytes per node: bytes_node (the way's own count, largest node,
        # median of the repeats), cold_bytes_node, link_node (the busiest node's link, the whole
        # loop); phases: where the time went (median seconds, one after the other)
        "rows": ("nodes:int", "way:str", "program:str", "median:num", "cold?:num", "worst?:num",
                 "each_run?:list", "ranks_exit?:num", "bytes_node?:int", "cold_bytes_node?:int",
                 "link_node?:int", "phases?:dict", "result?:str"),
        # another way's median over workdir's, per node count and program
        "ratios": ("nodes:int", "program:str", "what:str", "value:num"),
        # the goals: limit (seconds or bytes), value measured (null: not measured), met
        "goals": ("what:str", "limit:num", "value?:num", "met?:bool"),
    },
    "exec": {
        "conditions": ("repeat:int", "command:str", "fanout:int", "pdsh?:str", "clush?:str",
                       "openssh?:str"),
        # one row per node count and way (clusterctl | clusterctl-eager | clusterctl-tree | pdsh |
        # clush | by-hand):
        # head CPU s of one command on every node (the way's process tree), per node in ms,
        # wall s, each round's CPU s, and CPU and wall over clusterctl's at the same count
        "rows": ("nodes:int", "way:str", "cpu:num", "cpu_per_node_ms:num", "wall:num",
                 "each_run?:list", "cpu_over_clusterctl?:num", "wall_over_clusterctl?:num"),
    },
    "peers": {
        "conditions": ("repeat:int", "steps:int", "image?:str", "venv_install_s?:num",
                       "venv_mb?:num", "ray?:str", "torchx?:str", "torch?:str",
                       "sandbox_up_s?:num", "image_push_s?:num", "note?:str"),
        # one row per node count and way (clusterctl | by-hand | ray | mpirun | clusterctl-slurm |
        # torchx): needs (what every node
        # holds); setup_s (nothing of the project on the nodes -> every rank of the first run
        # running; ray: ray start on every node included, cluster_up_s of it); edit_s (a
        # one-line edit -> every rank running it, median of edit_runs); fail_stop_s (a rank's
        # exit -> every process of the job gone), fail_exit_s (-> the user's command returned),
        # fail_rc (its exit status); head_cpu_s, head_mb (the user's command's process tree,
        # an edit run); ray_head_*: the Ray head node's daemons; lines_ok of lines_expected
        # metrics lines arrived whole, lines_mixed not; x_FIGURE: over clusterctl's;
        # lost_*: the node-lost run (ways that recover): lost_s (node2's link down -> every
        # rank of the next attempt training), lost_resumed_from (the checkpoint's step),
        # lost_same_weights (the final weights are an uninterrupted run's), lost_rc, lost_note;
        # edit_queued_s (clusterctl-slurm, torchx): of edit_s, the seconds Slurm kept the job queued;
        # xs_FIGURE (torchx): over clusterctl-slurm's
        "rows": ("nodes:int", "way:str", "result:str", "needs?:str", "setup_s?:num",
                 "cluster_up_s?:num", "edit_s?:num", "edit_runs?:list", "fail_stop_s?:num",
                 "fail_exit_s?:num", "fail_rc?:int", "fail_note?:str", "head_cpu_s?:num",
                 "head_mb?:num", "ray_head_mb?:num", "ray_head_procs?:int", "ray_worker_mb?:num",
                 "ray_head_cpu_s?:num", "lines_expected?:int", "lines_ok?:int", "lines_mixed?:int",
                 "x_setup_s?:num", "x_edit_s?:num", "x_fail_stop_s?:num", "x_head_cpu_s?:num",
                 "x_head_mb?:num", "lost_s?:num", "lost_rc?:int", "lost_resumed_from?:int",
                 "lost_weights?:str", "lost_same_weights?:bool", "lost_note?:str", "x_lost_s?:num",
                 "edit_queued_s?:num", "xs_setup_s?:num", "xs_edit_s?:num", "xs_fail_stop_s?:num"),
        # published figures of the peers that cannot set up here, transcribed
        "published": ("what:str", "seconds:num", "source?:str"),
    },
    "ssh_clients": {
        "conditions": ("repeat:int", "commands:int", "openssh?:str", "paramiko?:str"),
        # one row per node count and client (clusterctl | paramiko | openssh | openssh-kex):
        # head CPU s of a round (this process and its ssh children), per node in ms, wall s,
        # each round's CPU s, and the CPU over clusterctl's at the same node count
        "rows": ("nodes:int", "client:str", "cpu:num", "cpu_per_node_ms:num", "wall:num",
                 "each_run?:list", "over_clusterctl?:num"),
    },
    "recovery": {
        # hang_timeout: --hang-timeout (sigstop runs only), null with the rule that chose it
        "conditions": ("steps:int", "fault_step:int", "hang_timeout?:num", "hang_timeout_rule?:str",
                       "image?:str", "bandwidth?:str", "spares?:int", "sandbox_up_s?:num",
                       "push_s?:num", "mem_available_min_mb?:int", "wall_min?:num", "note?:str"),
        # one row per run: fault kill | link-down | engine-stop | sigstop; way recovery
        # (launch --max-restarts) | by-hand (fail-fast exit, then a new launch from the
        # checkpoint); seconds: detect (fault -> noticed), stop (-> every container stopped),
        # check_start (-> the next attempt's last container started; wrap_up + check + start),
        # resume (-> every rank's first step line), exit (by-hand: fault -> the launch
        # returned), running and first_step (from the fault), program_start (attempt 0:
        # last container started -> every rank's first step line), failure_before (the
        # record's failure time before the fault's)
        "runs": ("nodes:int", "fault:str", "way:str", "run:int", "result:str", "detect?:num",
                 "stop?:num", "check_start?:num", "resume?:num", "wrap_up?:num", "check?:num",
                 "start?:num", "to_starting?:num", "to_resumed?:num", "exit?:num", "running?:num",
                 "first_step?:num", "program_start?:num", "failure_before?:num", "ended?:str",
                 "replaced?:dict", "resumed_from?:int", "hang_timeout?:num"),
        # per node count and fault: the recovery runs' medians (X) and worst (X_worst);
        # beyond_start: first_step minus the program's start (median at that node count);
        # by_hand*: the by-hand runs' medians, by_hand_over: by_hand / first_step
        "rows": ("nodes:int", "fault:str", "runs:int", "detect?:num", "detect_worst?:num",
                 "stop?:num", "stop_worst?:num", "check_start?:num", "check_start_worst?:num",
                 "resume?:num", "resume_worst?:num", "wrap_up?:num", "wrap_up_worst?:num",
                 "check?:num", "check_worst?:num", "start?:num", "start_worst?:num",
                 "to_starting?:num", "to_starting_worst?:num", "to_resumed?:num",
                 "to_resumed_worst?:num", "running?:num", "running_worst?:num", "first_step?:num",
                 "first_step_worst?:num",
                 "beyond_start?:num", "beyond_start_worst?:num", "by_hand?:num",
                 "by_hand_exit?:num", "by_hand_detect?:num", "by_hand_runs?:int",
                 "by_hand_over?:num", "hang_timeout?:num", "what?:str", "failed?:int"),
        # the program's own start (attempt 0): last container started -> every rank's first step
        "program_start": ("nodes:int", "median:num", "worst?:num", "runs?:int"),
        # published figures of other tools, transcribed (not measured here)
        "peers": ("what:str", "seconds:num", "source?:str"),
        "goals": ("what:str", "limit:num", "value?:num", "met?:bool"),
    },
    "registry": {
        # S = image_mb (the engine's size), B = bytes_per_second, S/B = ideal_seconds;
        # registry_mb: what the registry stores of it (gzip, as `docker push` sends it)
        "conditions": ("bandwidth:str", "bytes_per_second:num", "image_mb:num", "ideal_seconds:num",
                       "image?:str", "layers?:int", "registry_mb?:num", "layer_mb?:num",
                       "repeat?:int", "sandbox_up_s?:num", "wall_min?:num", "note?:str"),
        # way: pull (every node pulls from the registry) | relay (clusterctl push, no
        # registry) | registry+relay (clusterctl push with a registry: the push to the registry
        # on this machine, the layers by the relay, each node's pull by digest); case: cold |
        # warm; seconds: until every node holds the image (by digest for pull, registry+relay);
        # head_mb: MB that crossed the head's link (the bridge's tx); x_s: head bytes / S;
        # t_over_ideal: seconds / (S/B); registry_s, relay_s, pull_s: its phases; wire: what the
        # relay sent (zstd | none); cpu_busy: share of this machine's cores busy during the run
        "rows": ("nodes:int", "way:str", "case:str", "seconds:num", "head_mb?:num", "x_s?:num",
                 "t_over_ideal?:num", "registry_s?:num", "relay_s?:num", "pull_s?:num",
                 "wire?:str", "cpu_busy?:num", "run?:int", "result?:str"),
        # per node count and case, from the medians: "a/c seconds", "b/c seconds",
        # "a/c head bytes", "b/c head bytes" (a = pull, b = relay, c = registry+relay)
        "ratios": ("nodes:int", "case:str", "what:str", "value:num"),
        # the goal: limit (x S/B of the head's link), value measured, met
        "goals": ("what:str", "limit:num", "value?:num", "met?:bool"),
    },
}
TOP = ("benchmark:str", "schema:int", "source:str", "command:str", "conditions:dict")
COMMON_CONDITIONS = ("date:str", "host?:str", "cpus?:int", "load_average?:list")


class DataError(Exception):
    """A data file that does not have its shape: the message names the file and the field."""


def _type_ok(value, kind: str) -> bool:
    if kind == "num":
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, {"str": str, "bool": bool, "list": list, "dict": dict}[kind])


def _check_fields(obj, fields, where: str, source: str) -> None:
    if not isinstance(obj, dict):
        raise DataError(f"{source}: {where}: expected an object with fields "
                        f"{', '.join(f.split(':')[0].rstrip('?') for f in fields)}")
    for spec in fields:
        name, kind = spec.split(":")
        optional = name.endswith("?")
        name = name.rstrip("?")
        value = obj.get(name)
        if value is None:
            if optional:
                continue
            raise DataError(f'{source}: {where}: missing field "{name}" (a {kind})')
        if not _type_ok(value, kind):
            raise DataError(f'{source}: {where}: field "{name}" is {json.dumps(value)[:60]}; '
                            f"valid: a {kind}")


def validate(doc, source: str = "<document>") -> dict:
    """``doc`` if it has its benchmark's shape, else :class:`DataError` naming ``source``,
    the row and the field."""
    _check_fields(doc, TOP, "top level", source)
    shape = SHAPES.get(doc["benchmark"])
    if shape is None:
        raise DataError(f'{source}: field "benchmark" is "{doc["benchmark"]}"; '
                        f"valid: one of {', '.join(SHAPES)}")
    if doc["schema"] != SCHEMA:
        raise DataError(f'{source}: field "schema" is {doc["schema"]}; valid: {SCHEMA}')
    _check_fields(doc["conditions"], COMMON_CONDITIONS + shape["conditions"], "conditions", source)
    lists = [k for k in shape if k != "conditions"]
    for key in lists:
        value = doc.get(key)
        if value is None:
            continue
        if key == "pair":                     # one object, not a list
            _check_fields(value, shape[key], key, source)
            continue
        if not isinstance(value, list):
            raise DataError(f'{source}: field "{key}" is {json.dumps(value)[:60]}; valid: a list of rows')
        for i, row in enumerate(value):
            _check_fields(row, shape[key], f"{key}[{i}]", source)
    if not any(doc.get(k) for k in lists if k not in ("pair", "ratios")):
        raise DataError(f'{source}: no rows: give at least one of the fields '
                        f"{', '.join(k for k in lists if k not in ('pair', 'ratios'))}")
    return doc


def load(path: str | os.PathLike) -> dict:
    """A data file, checked (:class:`DataError` names the file and the field)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError(f"{path}: cannot read it: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {e.lineno}: not JSON: {e.msg}") from None
    return validate(doc, str(path))


def dumps(doc: dict) -> str:
    """The document as the files hold it: checked, indented, keys in the shape's order."""
    validate(doc)
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def write(doc: dict, path: str | os.PathLike) -> None:
    Path(path).write_text(dumps(doc), encoding="utf-8")


class Loads:
    """The 1-minute load average, sampled as a benchmark goes: its range is a condition."""

    def __init__(self) -> None:
        self.seen: list[float] = []
        self.sample()

    def sample(self) -> float:
        value = os.getloadavg()[0]
        self.seen.append(round(value, 2))
        return value

    def range(self) -> list[float]:
        self.sample()
        return [min(self.seen), max(self.seen)]


def busy_cpu_seconds() -> float:
    """CPU seconds this machine's cores have been busy since boot, every process together
    (/proc/stat: all but idle and iowait).  Between two reads, less a process's own CPU
    time, it is what the rest did: in the sandbox, the nodes' sshd, docker and containers."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def conditions(loads: Loads | None = None, **extra) -> dict:
    """A run's conditions: when, where (host name, cores), the load seen, and ``extra``."""
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
            "cpus": os.cpu_count(), "load_average": loads.range() if loads else None, **extra}


def document(benchmark: str, command: str, conditions_: dict, source: str | None = None,
             **lists) -> dict:
    """A checked document of ``benchmark``'s shape: what every script's ``--json`` writes."""
    doc = {"benchmark": benchmark, "schema": SCHEMA,
           "source": source or f"measured: a run of benchmarks/{benchmark}.py "
                               f"on {conditions_.get('host') or 'this machine'}",
           "command": command, "conditions": conditions_, **lists}
    return validate(doc)


def save(doc: dict, json_path: str | None, plot_path: str | None) -> None:
    """A script's ``--json FILE`` and ``--plot FILE.png``: each written when given."""
    if json_path:
        write(doc, json_path)
    if plot_path:
        draw(doc, plot_path)


def run_main(parser, check, run, argv: list[str] | None = None) -> int:
    """A benchmark script's ``main``: parse (malformed values: argparse's usage message, exit
    2), ``check(args)`` the input before anything is made, then ``run(args)``; a clusterctl
    error is its message and exit status, as the CLI gives it, never a traceback."""
    from clusterctl.core.errors import ClusterctlError

    args = parser().parse_args(argv)
    try:
        check(args)
        return run(args)
    except ClusterctlError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return e.exit_code


def node_counts(example: str):
    """An argparse ``type`` for ``--nodes``: node counts separated by commas (sorted, once
    each), each from 1 to the sandbox's maximum; ``example`` goes in the message."""
    def parse(text: str) -> list[int]:
        from clusterctl.cluster.sandbox import MAX_NODES

        try:
            counts = sorted({int(x) for x in text.split(",")})
        except ValueError:
            counts = []
        if not counts or not all(1 <= n <= MAX_NODES for n in counts):
            raise argparse.ArgumentTypeError(
                f'"{text}": give node counts from 1 to {MAX_NODES} separated by commas, e.g. {example}')
        return counts
    return parse


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number, 1 or more (else argparse's usage message, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f'"{text}": give a whole number, 1 or more')
    return value


def cli_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    """``env`` for running the clusterctl imported here as its own process (``python -m
    clusterctl``) the way an installed copy runs: PYTHONPATH at that code and with its
    bytecode.  pip compiles an installed package; a working tree run under
    PYTHONDONTWRITEBYTECODE would compile every module again on every start (0.3 s of CPU
    per command on this project's machine), which no user's clusterctl spends.  The tree's
    ``__pycache__`` directories are git-ignored; they are written once, here."""
    import subprocess

    import clusterctl

    pkg = Path(clusterctl.__file__).resolve().parent
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out.update({"PYTHONPATH": str(pkg.parent), **extra})
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(pkg)], env=out, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def check_outputs(*paths: str | None) -> None:
    """A script's --json/--plot files can be written (their directory exists), checked
    before the benchmark runs: the clusterctl UserError (exit 2) naming the option's value."""
    for path in paths:
        if path and not Path(path).resolve().parent.is_dir():
            from clusterctl.core.errors import UserError
            raise UserError(f"{path}: its directory does not exist; valid: a file in an existing "
                            "directory (--json FILE, --plot FILE.png)")


def command_line(argv: list[str] | None = None) -> str:
    """The command that ran, as a user would type it (``benchmarks/X.py ARGS``)."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0])
    try:
        script = script.resolve().relative_to(REPO)
    except ValueError:
        pass
    return " ".join([f"python {script}", *argv[1:]])


# --------------------------------------------------------------------------- tables
# The pages' tables are these functions' output: docs/benchmarks/*.md holds each one after a
# line `<!-- bench-table: FILE.json -->`, and tests/benchmarks/ checks that they are equal.


def _f(value, digits: int, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


WAYS = ("by-hand", "star", "relay", "relay+zstd")
DESIGNS = ("direct", "default", "default-each", "tree-key", "tree-agent", "old", "before", "now",
           "followed direct", "followed default", "followed default-each")
TEARDOWN_DESIGNS = ("new", "channel", "old")
PHASES = ("plan", "start", "hops_up", "head_sends", "to_chain_end", "load_results")


def _ordered(names, order) -> list[str]:
    seen = list(dict.fromkeys(names))
    return sorted(seen, key=lambda n: (order.index(n) if n in order else len(order), seen.index(n)))


def _phases_only(doc: dict) -> bool:
    return bool(doc["rows"]) and all(r.get("where") for r in doc["rows"])


def push_table(doc: dict) -> str:
    if _phases_only(doc):
        header = ["run", "design", "nodes", "case", "seconds (x S/B)",
                  *(p.replace("_", " ").replace("load results", "load+results") for p in PHASES)]
        rows = [[r.get("run") or "-", r.get("design") or "-", str(r["nodes"]), r["case"],
                 f"{r['seconds']:.1f} ({_f(r.get('t_over_ideal'), 2)})",
                 *(_f(r["where"].get(p), 2) for p in PHASES)] for r in doc["rows"]]
        return _md(header, rows)
    header = ["nodes", "way", "case", "seconds", "MB out", "image MB", "T(N)/T(1)", "T/(S/B)", "result"]
    rows = [[str(r["nodes"]), r["way"], r["case"], _f(r["seconds"], 1), _f(r.get("mb_out"), 1),
             _f(r.get("image_mb"), 1), _f(r.get("t_over_t1"), 2), _f(r.get("t_over_ideal"), 2),
             r.get("result") or "-"] for r in doc["rows"]]
    return _md(header, rows)


def _launch_pivot(doc: dict) -> str | None:
    launch, process = doc.get("launch") or [], doc.get("process") or []
    if not launch and not process:
        return None
    counts = sorted({r["nodes"] for r in launch + process})
    host = _ordered([r["design"] for r in launch], DESIGNS)
    wall = _ordered([r["design"] for r in launch if r.get("wall") is not None], DESIGNS)
    proc = _ordered([r["design"] for r in process], DESIGNS)
    by = {("launch", r["nodes"], r["design"]): r for r in launch}
    by.update({("process", r["nodes"], r["design"]): r for r in process})

    def host_cell(r) -> str:
        if r is None:
            return "-"
        cell = f"{r['host_cpu']:.3f}"
        if r.get("cpu_pre") is not None and r.get("cpu_start") is not None:
            cell += f" ({r['cpu_pre']:.3f} / {r['cpu_start']:.3f})"
        return cell

    header = ["nodes", *(f"host CPU s, {d}" for d in host), *(f"wall s, {d}" for d in wall),
              *(f"whole process CPU s, {d}" for d in proc)]
    rows = []
    for n in counts:
        rows.append([str(n), *(host_cell(by.get(("launch", n, d))) for d in host),
                     *(_f((by.get(("launch", n, d)) or {}).get("wall"), 2) for d in wall),
                     *(_f((by.get(("process", n, d)) or {}).get("cpu"), 2) for d in proc)])
    return _md(header, rows)


def _teardown_table(doc: dict) -> str | None:
    rows_in = doc.get("teardown") or []
    if not rows_in:
        return None
    designs = _ordered([r["design"] for r in rows_in], TEARDOWN_DESIGNS)
    groups: dict[tuple[str, int], dict[str, dict]] = {}
    for r in rows_in:
        groups.setdefault((r.get("run") or "-", r["nodes"]), {})[r["design"]] = r
    header = ["run", "nodes", *(f"{d} s" for d in designs), "detection s",
              "line -> stopped s, median node / slowest", "each run s"]
    rows = []
    for (run, n), got in groups.items():
        first = got.get(designs[0]) or next(iter(got.values()))
        each = "; ".join(f"{d} " + " / ".join(f"{x:.2f}" for x in got[d]["each_run"])
                         for d in designs if d in got and got[d].get("each_run"))
        rows.append([run, str(n), *(_f(got[d]["stopped"], 2) if d in got else "-" for d in designs),
                     _f(first.get("detection"), 2),
                     f"{_f(first.get('line_median'), 2)} / {_f(first.get('line_max'), 2)}",
                     each or "-"])
    return _md(header, rows)


def _process_table(doc: dict) -> str | None:
    """The whole processes a user runs, for the rows that also timed the teardown: ``launch
    --detach`` and then ``stop``, CPU and wall (the ratios to one node are the page's words:
    a table shows only the data's own figures)."""
    rows_in = [r for r in doc.get("process") or [] if r.get("stop_cpu") is not None]
    if not rows_in:
        return None
    rows = [[str(r["nodes"]), r["design"], _f(r["cpu"], 2), _f(r.get("wall"), 2),
             _f(r["stop_cpu"], 2), _f(r.get("stop_wall"), 2)]
            for r in sorted(rows_in, key=lambda r: (r["nodes"], DESIGNS.index(r["design"])
                                                    if r["design"] in DESIGNS else len(DESIGNS)))]
    header = ["nodes", "design", "launch --detach CPU s", "launch --detach wall s", "stop CPU s", "stop wall s"]
    return _md(header, rows)


def _launch_split(doc: dict) -> str | None:
    """Where the wall goes, for the rows that measured the nodes' CPU: the wall, the nodes'
    CPU (and per node), that CPU spread over this machine's cores (the least wall the
    nodes' work alone needs here) and the head's dispatch spread."""
    rows_in = [r for r in doc.get("launch") or [] if r.get("node_floor") is not None]
    if not rows_in:
        return None
    cores = (doc.get("conditions") or {}).get("cpus") or "the"
    rows = [[str(r["nodes"]), r["design"], _f(r.get("wall"), 2), _f(r["node_cpu"], 2),
             _f(r["node_cpu_per_node_ms"], 0), _f(r["node_floor"], 2), _f(r.get("dispatch"), 3)]
            for d in _ordered([r["design"] for r in rows_in], DESIGNS)
            for r in sorted((r for r in rows_in if r["design"] == d), key=lambda r: r["nodes"])]
    header = ["nodes", "design", "wall s", "nodes' CPU s", "per node ms",
              f"nodes' CPU / {cores} cores s", "head's dispatch s"]
    return _md(header, rows)


def _stop_table(doc: dict) -> str | None:
    """The stop after each launch, measured inside the benchmark's process (its own CPU and
    wall: no interpreter start, no imports), for the rows that have it."""
    rows_in = [r for r in doc.get("launch") or [] if r.get("stop_host_cpu") is not None]
    if not rows_in:
        return None
    rows = [[str(r["nodes"]), r["design"], _f(r["stop_host_cpu"], 3), _f(r.get("stop_wall"), 2)]
            for d in _ordered([r["design"] for r in rows_in], DESIGNS)
            for r in sorted((r for r in rows_in if r["design"] == d), key=lambda r: r["nodes"])]
    return _md(["nodes", "design", "stop's own CPU s", "stop's own wall s"], rows)


def launch_table(doc: dict) -> str:
    return "\n\n".join(t for t in (_launch_pivot(doc), _process_table(doc), _stop_table(doc),
                                     _launch_split(doc), _teardown_table(doc)) if t)


def collective_table(doc: dict) -> str:
    header = ["nodes", "verdict s", "torch up s", "measuring s", "every pair s (previous)",
              "by hand s", "every pair / verdict", "by hand / verdict", "verdict"]
    rows = [[str(r["nodes"]), _f(r["verdict_s"], 1), _f(r.get("torch_up_s"), 1),
             _f(r.get("measuring_s"), 1),
             _f(r.get("all_pairs_s"), 1) if r.get("all_pairs_s") is not None else "(= 3 rounds)",
             _f(r["by_hand_s"], 0), _f(r.get("vs_all"), 1, "x"), _f(r.get("vs_hand"), 1, "x"),
             r["verdict"]] for r in doc["rows"]]
    return _md(header, rows)


def validate_table(doc: dict) -> str:
    limit = doc["conditions"]["old_limit"]
    header = ["nodes", "input", "CPU s", "wall s", "peak MB", "previous CPU s", "previous / new"]
    rows = []
    for r in doc["rows"]:
        stopped = r.get("prev_stopped")
        ratio = r.get("prev_over_new")
        if stopped and ratio is None and r["new_cpu"]:
            ratio = limit / r["new_cpu"]      # what the script prints: > limit / new CPU s
        rows.append([f"{r['nodes']:,}", r["input"], _f(r["new_cpu"], 2), _f(r.get("new_wall"), 2),
                     _f(r.get("new_mb"), 0),
                     f"> {limit:g} (stopped)" if stopped else _f(r.get("prev_cpu"), 2),
                     ("> " if stopped else "") + _f(ratio, 1 if not stopped else 0, "x")])
    return _md(header, rows)


def scale_table(doc: dict) -> str:
    def n(value) -> str:
        return "-" if value is None else f"{value:,}"

    header = ["run", "wall s", "lines on stdout", "in runs/", "missing", "duplicated",
              "out of order", "garbled", "peak MB", "growth MB"]
    rows = [[r["run"], _f(r["wall"], 1), n(r["stdout"]), n(r.get("node_log")), n(r.get("missing")),
             n(r.get("duplicated")), n(r.get("out_of_order")), n(r.get("garbled")),
             _f(r["peak_mb"], 1), f"{r['growth_mb']:+.1f}"] for r in doc["rows"]]
    return _md(header, rows)


WORKDIR_WAYS = ("workdir", "by-hand", "rsync")
WORKDIR_PROGRAMS = ("python", "no-op", "no-op, unchanged")


def _bytes(value) -> str:
    return "-" if value is None else f"{value:,}"


def workdir_table(doc: dict) -> str:
    """The walk+hash table, the payloads, the loops (one row per node count, way and
    program), the ratios and the goals: tables one after the other."""
    tables = []
    snap = doc.get("snapshot") or []
    if snap:
        tables.append(_md(["walk + hash", "files", "MB", "median s", "worst s", "runs", "how"],
                          [[r["case"], f"{r['files']:,}", _f(r["mb"], 1), _f(r["median"], 3),
                            _f(r.get("worst"), 3), str(r.get("runs") or "-"), r.get("how") or "-"]
                           for r in snap]))
    delta = doc.get("delta") or []
    if delta:
        tables.append(_md(["payload a node is sent", "bytes"],
                          [[d["what"], _bytes(d["bytes"])] for d in delta]))
    rows = doc.get("rows") or []
    if rows:
        ordered = sorted(rows, key=lambda r: (r["nodes"], _rank(r["way"], WORKDIR_WAYS),
                                              _rank(r["program"], WORKDIR_PROGRAMS)))
        tables.append(_md(
            ["nodes", "way", "program", "cold s", "median s", "worst s", "bytes/node",
             "cold bytes/node", "link bytes, busiest node", "where the time went (median s)", "result"],
            [[str(r["nodes"]), r["way"], r["program"], _f(r.get("cold"), 2), _f(r["median"], 2),
              _f(r.get("worst"), 2), _bytes(r.get("bytes_node")), _bytes(r.get("cold_bytes_node")),
              _bytes(r.get("link_node")),
              ", ".join(f"{k} {v:.2f}" for k, v in (r.get("phases") or {}).items()) or "-",
              (r.get("result") or "-").replace("|", "/")] for r in ordered]))
    ratios = doc.get("ratios") or []
    if ratios:
        whats = _ordered([r["what"] for r in ratios], ("by-hand / workdir", "rsync / workdir"))
        by = {(r["nodes"], r["program"], r["what"]): r["value"] for r in ratios}
        keys = sorted({(r["nodes"], r["program"]) for r in ratios},
                      key=lambda k: (k[0], _rank(k[1], WORKDIR_PROGRAMS)))
        tables.append(_md(["nodes", "program", *whats],
                          [[str(n), p, *(_f(by.get((n, p, w)), 2, "x") for w in whats)]
                           for n, p in keys]))
    goals = doc.get("goals") or []
    if goals:
        tables.append(_md(["goal", "limit", "measured", "met"],
                          [[g["what"], _goal_value(g["limit"]), _goal_value(g.get("value")),
                            "-" if g.get("met") is None else ("yes" if g["met"] else "**no**")]
                           for g in goals]))
    return "\n\n".join(tables)


def _rank(name: str, order) -> int:
    return order.index(name) if name in order else len(order)


def _goal_value(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer() and value >= 100:
        return f"{int(value):,}"
    return f"{value:.3f}" if abs(value) < 1 else f"{value:.2f}"


RECOVERY_FAULTS = ("kill", "link-down", "engine-stop", "sigstop")


def _mw(row: dict, key: str) -> str:
    """``median / worst`` of a recovery row's figure."""
    if row.get(key) is None:
        return "-"
    w = row.get(f"{key}_worst")
    return f"{row[key]:.2f}" + ("" if w is None else f" / {w:.2f}")


def recovery_table(doc: dict) -> str:
    """The summary (median / worst per node count and fault), where check+start went and
    the by-hand way, the program's start, every run, the peers' figures and the goals."""
    tables = []
    rows = sorted(doc.get("rows") or [], key=lambda r: (r["nodes"], _rank(r["fault"], RECOVERY_FAULTS)))
    if rows:
        tables.append(_md(
            ["nodes", "fault", "runs", "detect s", "stop s", "check+start s", "resume -> first step s",
             "fault -> all running s", "fault -> first step s", "beyond the program's start s",
             "what happened"],
            [[str(r["nodes"]), r["fault"], str(r["runs"]), _mw(r, "detect"), _mw(r, "stop"),
              _mw(r, "check_start"), _mw(r, "resume"), _mw(r, "running"), _mw(r, "first_step"),
              _mw(r, "beyond_start"), (r.get("what") or "-").replace("|", "/")] for r in rows]))
        tables.append(_md(
            ["nodes", "fault", "wrap-up s", "check s", "start s", "every rank \"starting\" s",
             "every rank \"resumed\" s", "by hand: runs", "by hand: detect s",
             "by hand: fault -> exit s", "by hand: fault -> first step s", "by hand / clusterctl"],
            [[str(r["nodes"]), r["fault"], _mw(r, "wrap_up"), _mw(r, "check"), _mw(r, "start"),
              _mw(r, "to_starting"), _mw(r, "to_resumed"),
              str(r.get("by_hand_runs") or 0), _f(r.get("by_hand_detect"), 2),
              _f(r.get("by_hand_exit"), 2), _f(r.get("by_hand"), 2), _f(r.get("by_hand_over"), 2, "x")]
             for r in rows]))
    prog = doc.get("program_start") or []
    if prog:
        tables.append(_md(["nodes", "runs", "program's start s, median", "worst"],
                          [[str(p["nodes"]), str(p.get("runs") or "-"), _f(p["median"], 2),
                            _f(p.get("worst"), 2)] for p in prog]))
    runs = doc.get("runs") or []
    if runs:
        tables.append(_md(
            ["nodes", "fault", "way", "run", "detect", "stop", "check+start", "resume", "running",
             "first step", "program start", "hang timeout", "resumed from step", "result"],
            [[str(r["nodes"]), r["fault"], r["way"], str(r["run"]), _f(r.get("detect"), 2),
              _f(r.get("stop"), 2), _f(r.get("check_start"), 2), _f(r.get("resume"), 2),
              _f(r.get("running"), 2), _f(r.get("first_step"), 2), _f(r.get("program_start"), 2),
              _f(r.get("hang_timeout"), 0), "-" if r.get("resumed_from") is None else str(r["resumed_from"]),
              r["result"].replace("|", "/")] for r in runs]))
    peers = doc.get("peers") or []
    if peers:
        tables.append(_md(["peer (published, not measured here)", "seconds", "source"],
                          [[p["what"], _f(p["seconds"], 0), p.get("source") or "-"] for p in peers]))
    goals = doc.get("goals") or []
    if goals:
        tables.append(_md(["goal", "limit s", "measured s", "met"],
                          [[g["what"], _f(g["limit"], 0), _f(g.get("value"), 2),
                            "-" if g.get("met") is None else ("yes" if g["met"] else "**no**")]
                           for g in goals]))
    return "\n\n".join(tables)


REGISTRY_WAYS = ("pull", "relay", "registry+relay")
REGISTRY_RATIOS = ("a/c seconds", "b/c seconds", "a/c head bytes", "b/c head bytes")


def registry_table(doc: dict) -> str:
    """Every run (node count, case, way), the ratios a/c and b/c, the goals."""
    tables = []
    rows = sorted(doc.get("rows") or [], key=lambda r: (r["nodes"], r["case"] != "cold",
                                                        r.get("run") or 0, _rank(r["way"], REGISTRY_WAYS)))
    if rows:
        tables.append(_md(
            ["nodes", "case", "run", "way", "seconds", "x S/B", "head MB", "head bytes x S",
             "registry s", "relay s", "pull s", "wire", "CPU busy", "result"],
            [[str(r["nodes"]), r["case"], "-" if r.get("run") is None else str(r["run"]), r["way"],
              _f(r["seconds"], 1), _f(r.get("t_over_ideal"), 2), _f(r.get("head_mb"), 1),
              _f(r.get("x_s"), 3), _f(r.get("registry_s"), 1), _f(r.get("relay_s"), 1),
              _f(r.get("pull_s"), 1), r.get("wire") or "-", _f(r.get("cpu_busy"), 2),
              (r.get("result") or "-").replace("|", "/")]
             for r in rows]))
    ratios = doc.get("ratios") or []
    if ratios:
        whats = _ordered([r["what"] for r in ratios], REGISTRY_RATIOS)
        by = {(r["nodes"], r["case"], r["what"]): r["value"] for r in ratios}
        keys = sorted({(r["nodes"], r["case"]) for r in ratios}, key=lambda k: (k[0], k[1] != "cold"))
        tables.append(_md(["nodes", "case", *whats],
                          [[str(n), c, *(_f(by.get((n, c, w)), 2, "x") for w in whats)]
                           for n, c in keys]))
    goals = doc.get("goals") or []
    if goals:
        tables.append(_md(["goal", "limit", "measured", "met"],
                          [[g["what"], _f(g["limit"], 2), _f(g.get("value"), 2),
                            "-" if g.get("met") is None else ("yes" if g["met"] else "**no**")]
                           for g in goals]))
    return "\n\n".join(tables)


def ssh_clients_table(doc: dict) -> str:
    header = ["nodes", "client", "head CPU ms per node", "x clusterctl's", "head CPU s", "wall s"]
    return _md(header, [[str(r["nodes"]), r["client"], _f(r["cpu_per_node_ms"], 1),
                         _f(r.get("over_clusterctl"), 2, "x"), _f(r["cpu"], 3), _f(r["wall"], 2)]
                        for r in doc["rows"]])


def exec_table(doc: dict) -> str:
    header = ["nodes", "way", "head CPU s", "x clusterctl's", "wall s", "x clusterctl's"]
    return _md(header, [[str(r["nodes"]), r["way"], _f(r["cpu"], 3),
                         _f(r.get("cpu_over_clusterctl"), 2, "x"), _f(r["wall"], 2),
                         _f(r.get("wall_over_clusterctl"), 2, "x")] for r in doc["rows"]])


PEER_WAYS = ("clusterctl", "by-hand", "mpirun", "ray", "clusterctl-slurm", "torchx")
SLURM_PEER_WAYS = ("clusterctl-slurm", "torchx")


def peers_table(doc: dict) -> str:
    """One row per node count and way (ratios over clusterctl's beside), then what each node
    needs, then the published figures of the peers that cannot set up here."""
    def x(r: dict, key: str) -> str:
        return "" if r.get(f"x_{key}") is None or r["way"] == "clusterctl" else f" ({r[f'x_{key}']:.2f}x)"

    def rc(r: dict) -> str:
        if r.get("fail_rc") is None:
            return "-" if not r.get("fail_note") else "killed"
        return str(r["fail_rc"])

    rows = sorted(doc.get("rows") or [], key=lambda r: (r["nodes"], _rank(r["way"], PEER_WAYS)))
    tables = [_md(
        ["nodes", "way", "set-up -> first run s", "one-line edit -> every rank s",
         "rank fails -> every process gone s", "-> command returns s", "exit status",
         "head CPU s", "head MB", "metrics lines whole", "result"],
        [[str(r["nodes"]), r["way"], _f(r.get("setup_s"), 1) + x(r, "setup_s"),
          _f(r.get("edit_s"), 1) + x(r, "edit_s"), _f(r.get("fail_stop_s"), 1) + x(r, "fail_stop_s"),
          _f(r.get("fail_exit_s"), 1), rc(r), _f(r.get("head_cpu_s"), 1) + x(r, "head_cpu_s"),
          _f(r.get("head_mb"), 0) + x(r, "head_mb"),
          "-" if r.get("lines_ok") is None else f"{r['lines_ok']:,} of {r.get('lines_expected') or 0:,}",
          (r.get("result") or "-").split(":")[0]] for r in rows])]
    lost = [r for r in rows if r.get("lost_rc") is not None or r.get("lost_note")]
    if lost:
        tables.append(_md(
            ["nodes", "way", "node2 lost -> every rank training again s", "resumed from step",
             "final weights = uninterrupted run's", "exit status", "note"],
            [[str(r["nodes"]), r["way"], _f(r.get("lost_s"), 1) + x(r, "lost_s"),
              "-" if r.get("lost_resumed_from") is None else str(r["lost_resumed_from"]),
              {True: "yes", False: "NO", None: "-"}[r.get("lost_same_weights")],
              "-" if r.get("lost_rc") is None else str(r["lost_rc"]), r.get("lost_note") or ""]
             for r in lost]))
    on_slurm = [r for r in rows if r["way"] in SLURM_PEER_WAYS]
    if on_slurm:
        def over(r: dict, key: str) -> str:        # over clusterctl's Slurm way's, as the data says
            return "" if r.get(f"xs_{key}") is None else f" ({r[f'xs_{key}']:.2f}x)"
        tables.append(_md(
            ["nodes", "on Slurm", "set-up -> first run s", "one-line edit -> every rank s",
             "of it queued by Slurm s", "rank fails -> every process gone s", "exit status"],
            [[str(r["nodes"]), r["way"], _f(r.get("setup_s"), 1) + over(r, "setup_s"),
              _f(r.get("edit_s"), 1) + over(r, "edit_s"), _f(r.get("edit_queued_s"), 0),
              _f(r.get("fail_stop_s"), 1) + over(r, "fail_stop_s"), rc(r)] for r in on_slurm]))
    ray = [r for r in rows if r.get("ray_head_mb") is not None]
    if ray:
        tables.append(_md(
            ["nodes", "Ray's head node: processes", "MB", "CPU s during one job", "a worker node's Ray MB",
             "ray start on every node -> cluster up s"],
            [[str(r["nodes"]), str(r.get("ray_head_procs") or "-"), _f(r["ray_head_mb"], 0),
              _f(r.get("ray_head_cpu_s"), 1), _f(r.get("ray_worker_mb"), 0), _f(r.get("cluster_up_s"), 1)]
             for r in ray]))
    needs = {r["way"]: r["needs"] for r in rows if r.get("needs")}
    if needs:
        tables.append(_md(["way", "what every node needs"],
                          [[w, needs[w]] for w in _ordered(list(needs), PEER_WAYS)]))
    pub = doc.get("published") or []
    if pub:
        tables.append(_md(["peer (published or tried by hand, not measured in this run)", "seconds", "source"],
                          [[p["what"], _f(p["seconds"], 1), p.get("source") or "-"] for p in pub]))
    return "\n\n".join(tables)


TABLES = {"push": push_table, "launch": launch_table, "collective": collective_table,
          "validate": validate_table, "scale": scale_table, "workdir": workdir_table,
          "recovery": recovery_table, "registry": registry_table,
          "ssh_clients": ssh_clients_table, "exec": exec_table, "peers": peers_table}


def table(doc: dict) -> str:
    """The Markdown table(s) of a checked document, as the benchmark pages hold them."""
    return TABLES[doc["benchmark"]](doc)


# --------------------------------------------------------------------------- plots

COLORS = {"by-hand": "#7f7f7f", "star": "#1f77b4", "relay": "#2ca02c", "relay+zstd": "#d62728",
          "direct": "#1f77b4", "default": "#d62728", "tree-key": "#2ca02c", "tree-agent": "#9467bd", "old": "#7f7f7f",
          "followed direct": "#17becf", "followed default": "#ff7f0e", "default-each": "#8c564b",
          "followed default-each": "#8c564b",
          "before": "#7f7f7f", "now": "#1f77b4", "new": "#1f77b4", "channel": "#ff7f0e",
          "hostfile": "#1f77b4", "yaml": "#2ca02c", "slurm": "#9467bd",
          "clusterctl": "#1f77b4", "paramiko": "#2ca02c", "openssh": "#d62728", "openssh-kex": "#ff7f0e",
          "clusterctl-tree": "#17becf", "pdsh": "#d62728", "clush": "#ff7f0e",
          "clusterctl-eager": "#aec7e8"}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.hashsalt": "clusterctl", "font.size": 9,
                                "axes.titlesize": 10, "legend.fontsize": 8})
    import matplotlib.pyplot as plt
    return plt


def _subtitle(doc: dict) -> str:
    c = doc["conditions"]
    load = c.get("load_average")
    bits = [str(c["date"]).split(" ")[0]]
    if load:
        bits.append(f"load {load[0]:g} to {load[-1]:g}")
    if c.get("cpus"):
        bits.append(f"{c['cpus']} cores")
    return ", ".join(bits)


def _push_nodes(plt, doc: dict):
    c, rows = doc["conditions"], doc["rows"]
    fig, (cold, small) = plt.subplots(1, 2, figsize=SIZE, dpi=DPI)
    ways = _ordered([r["way"] for r in rows], WAYS)
    counts = sorted({r["nodes"] for r in rows})
    for way in ways:
        pts = sorted((r["nodes"], r["seconds"]) for r in rows if r["way"] == way and r["case"] == "cold")
        if pts:
            cold.plot(*zip(*pts, strict=True), marker="o", color=COLORS.get(way), label=way)
        for case, style in (("layer", "-"), ("warm", ":")):
            pts = sorted((r["nodes"], r["seconds"]) for r in rows if r["way"] == way and r["case"] == case)
            if pts:
                small.plot(*zip(*pts, strict=True), marker="o" if case == "layer" else "s",
                           linestyle=style, color=COLORS.get(way), label=f"{way}, {case}")
    ideal = c["ideal_seconds"]
    cold.axhline(ideal, color="black", linestyle="--", linewidth=1, label=f"S/B = {ideal:g} s (one copy)")
    cold.plot(counts, [n * ideal for n in counts], color="black", linestyle=":", linewidth=1,
              label="N x S/B (every copy from here)")
    cold.set_title(f"cold: S = {c['image_mb']:g} MB, links {c['bandwidth']}")
    small.set_title(f"one changed {c.get('layer_mb') or '?'} MB layer, and warm")
    for ax in (cold, small):
        ax.set_xlabel("nodes")
        ax.set_ylabel("seconds")
        ax.set_xticks(counts)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    fig.suptitle(f"push time vs nodes ({_subtitle(doc)})")
    return fig


def _push_phases(plt, doc: dict):
    rows = doc["rows"]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    labels = [f"{r.get('design') or ''} {r.get('run') or ''}, {r['nodes']} node{'s' * (r['nodes'] > 1)}".strip()
              for r in rows]
    cmap = plt.get_cmap("tab10")
    left = [0.0] * len(rows)
    for i, phase in enumerate(PHASES):
        widths = [r["where"].get(phase) or 0.0 for r in rows]
        ax.barh(range(len(rows)), widths, left=left, color=cmap(i),
                label=phase.replace("_", " ").replace("load results", "load+results"))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ideal = doc["conditions"]["ideal_seconds"]
    ax.axvline(ideal, color="black", linestyle="--", linewidth=1, label=f"S/B = {ideal:g} s")
    ax.axvline(1.3 * ideal, color="black", linestyle=":", linewidth=1, label="1.3 x S/B (goal)")
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the push's start")
    ax.set_title(f"where a cold relay push's time goes, phase after phase\n"
                 f"(S = {doc['conditions']['image_mb']:g} MB, links {doc['conditions']['bandwidth']}; "
                 f"{_subtitle(doc)})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=4)
    ax.grid(axis="x", alpha=0.3)
    return fig


def _lines(ax, rows, key, field, order, style="-", marker="o", suffix=""):
    for name in _ordered([r[key] for r in rows], order):
        pts = sorted((r["nodes"], r[field]) for r in rows if r[key] == name and r.get(field) is not None)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, linestyle=style, color=COLORS.get(name),
                    label=f"{name}{suffix}")


def _launch(plt, doc: dict):
    launch, process, teardown = (doc.get(k) or [] for k in ("launch", "process", "teardown"))
    panels = [p for p, have in (("host", launch or process),
                                ("wall", any(r.get("wall") is not None for r in launch)),
                                ("teardown", teardown)) if have]
    fig, axes = plt.subplots(1, len(panels), figsize=SIZE, dpi=DPI, squeeze=False)
    counts = sorted({r["nodes"] for r in launch + process + teardown})
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "host":
            _lines(ax, launch, "design", "host_cpu", DESIGNS, suffix=", launch")
            _lines(ax, process, "design", "cpu", DESIGNS, style="--", marker="s", suffix=", whole process")
            _lines(ax, process, "design", "stop_cpu", DESIGNS, style=":", marker="^", suffix=", stop process")
            _lines(ax, launch, "design", "stop_host_cpu", DESIGNS, style="-.", marker="v", suffix=", stop's own")
            ax.set_ylabel("CPU seconds on this machine")
            followed_only = not launch and all(r["design"].startswith("followed") for r in process)
            ax.set_title("host CPU: a followed launch, start to end (fail-fast included)" if followed_only
                         else "host CPU: launch -> all running" + (", stop" if any(
                r.get("stop_cpu") is not None for r in process) else ""))
            if len(ax.get_lines()) > 10:   # launch, whole process and both stops: under the panel
                ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize="xx-small")
            else:
                ax.legend(loc="best", fontsize="x-small" if any(
                    r.get("stop_cpu") is not None for r in process) else None)
            if process and launch:
                ax.set_yscale("log")
        elif panel == "wall":
            _lines(ax, launch, "design", "wall", DESIGNS)
            cores = (doc.get("conditions") or {}).get("cpus") or "the"
            split = sorted((r["nodes"], r["node_floor"]) for r in launch
                           if r["design"] == "direct" and r.get("node_floor") is not None)
            if split:   # the least wall the nodes' own work needs on these cores
                ax.plot(*zip(*split, strict=True), linestyle=":", color=COLORS.get("direct"),
                        label=f"direct: nodes' CPU / {cores} cores")
            ax.set_ylabel(f"wall seconds (the nodes share {cores} cores)")
            ax.set_title("wall: launch -> all running")
        else:
            for design in _ordered([r["design"] for r in teardown], TEARDOWN_DESIGNS):
                mine = [r for r in teardown if r["design"] == design]
                each = [(r["nodes"], x) for r in mine for x in r.get("each_run") or []]
                if each:
                    ax.scatter(*zip(*each, strict=True), s=10, color=COLORS.get(design), alpha=0.4)
                ns = sorted({r["nodes"] for r in mine})
                med = [sorted(r["stopped"] for r in mine if r["nodes"] == n) for n in ns]
                ax.plot(ns, [m[len(m) // 2] for m in med], marker="o", color=COLORS.get(design),
                        label=f"{design} (median over runs)")
                ax.scatter([r["nodes"] for r in mine], [r["stopped"] for r in mine], marker="x",
                           color=COLORS.get(design))
            ax.axhline(1.5, color="black", linestyle=":", linewidth=1, label="goal at 16 nodes: 1.5 s")
            ax.set_ylabel("seconds, rank failure -> all stopped")
            ax.set_title("teardown (x: median, dots: runs)")
            ax.set_xticks(sorted({r["nodes"] for r in teardown}))
        ax.set_xlabel("nodes")
        if panel != "teardown":
            ax.set_xticks(counts)
        ax.grid(alpha=0.3)
        if panel != "host":
            ax.legend(loc="upper left")
    what = " and ".join(x for x, have in (("launch", launch or process), ("teardown", teardown)) if have)
    fig.suptitle(f"{what} vs nodes ({_subtitle(doc)})")
    return fig


def _collective(plt, doc: dict):
    rows = sorted(doc["rows"], key=lambda r: r["nodes"])
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    ns = [r["nodes"] for r in rows]
    ax.plot(ns, [r["verdict_s"] for r in rows], marker="o", color="#1f77b4",
            label="check --collective (3 pair rounds): to its verdict")
    if all(r.get("torch_up_s") is not None for r in rows):
        ax.plot(ns, [r["torch_up_s"] for r in rows], marker=".", linestyle=":", color="#1f77b4",
                label="of which: until torch is up in every container")
    pts = [(r["nodes"], r["all_pairs_s"] if r.get("all_pairs_s") is not None else r["verdict_s"])
           for r in rows]
    ax.plot(*zip(*pts, strict=True), marker="s", linestyle="--", color="#ff7f0e",
            label="previous design: every pair (= 3 rounds below 5 nodes)")
    ax.plot(ns, [r["by_hand_s"] for r in rows], marker="^", color="#7f7f7f",
            label="by hand: one 2-node all_reduce per pair, pair after pair")
    ax.axhline(60, color="black", linestyle=":", linewidth=1, label="goal at 8 nodes: 60 s")
    c = doc["conditions"]
    ax.set_title(f"collective check: seconds to name the slow node\n(links {c['bandwidth']}, "
                 f"the slow node's {c['slow_bandwidth']}; {_subtitle(doc)})")
    ax.set_xlabel("nodes")
    ax.set_ylabel("seconds")
    ax.set_xticks(ns)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    return fig


def _validate(plt, doc: dict):
    rows, limit = doc["rows"], doc["conditions"]["old_limit"]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    floor = 0.005      # a CPU time printed as 0.00 is drawn at the axis' floor
    for kind in _ordered([r["input"] for r in rows], ("hostfile", "yaml", "slurm")):
        mine = sorted((r for r in rows if r["input"] == kind), key=lambda r: r["nodes"])
        ax.plot([r["nodes"] for r in mine], [max(r["new_cpu"], floor) for r in mine], marker="o",
                color=COLORS.get(kind), label=f"{kind}")
        done = [(r["nodes"], max(r["prev_cpu"], floor)) for r in mine if r.get("prev_cpu") is not None]
        if done:
            ax.plot(*zip(*done, strict=True), marker="s", linestyle="--", color=COLORS.get(kind),
                    alpha=0.7, label=f"{kind}, previous design")
        stopped = [r["nodes"] for r in mine if r.get("prev_stopped")]
        if stopped:
            ax.scatter(stopped, [limit] * len(stopped), marker="^", s=60, color=COLORS.get(kind),
                       label=f"{kind}, previous: stopped at {limit:g} s")
    ax.axhline(5, color="black", linestyle=":", linewidth=1, label="goal at 100,000 nodes: 5 s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes in the inventory")
    ax.set_ylabel("CPU seconds to validate (log)")
    ax.set_title(f"inventory validation vs node count ({_subtitle(doc)})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", ncol=2)
    return fig


def _scale(plt, doc: dict):
    rows, c = doc["rows"], doc["conditions"]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    y = range(len(rows))
    ax.barh([i - 0.2 for i in y], [r["peak_mb"] for r in rows], height=0.4, color="#1f77b4",
            label="peak resident MB")
    ax.barh([i + 0.2 for i in y], [r["growth_mb"] for r in rows], height=0.4, color="#ff7f0e",
            label="growth after the first line, MB")
    ax.set_yticks(list(y), [r["run"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("MB (resident memory of clusterctl launch, or of the ssh clients by hand)")
    ax.set_title(f"a chatty job, {c['nodes']} nodes x {c['rate']:g} lines/s x {c['seconds']:g} s: "
                 f"memory\n({_subtitle(doc)})")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower right")
    return fig


WORKDIR_COLORS = {"workdir": "#1f77b4", "by-hand": "#7f7f7f", "rsync": "#ff7f0e"}


def _workdir(plt, doc: dict):
    rows, c = doc.get("rows") or [], doc["conditions"]
    snap = {r["case"]: r for r in doc.get("snapshot") or []}
    walk = ", ".join(f"{case} {r['median']:.2f} s" for case, r in snap.items())
    files = next(iter(snap.values()))["files"] if snap else c["files"]
    if not rows:       # --snapshot-only: the walk and hashing alone
        fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
        cases = list(snap)
        ax.bar(cases, [snap[k]["median"] for k in cases], color="#1f77b4", label="median")
        ax.scatter(cases, [snap[k].get("worst") or snap[k]["median"] for k in cases], marker="_",
                   s=400, color="black", label="worst")
        ax.axhline(0.5, color="black", linestyle=":", linewidth=1, label="goal, warm: 0.5 s")
        ax.set_ylabel("seconds")
        ax.set_title(f"walk and hashing of a {files:,}-file tree ({_subtitle(doc)})")
        ax.legend(loc="upper right")
        ax.grid(axis="y", alpha=0.3)
        return fig
    fig, (secs, size) = plt.subplots(1, 2, figsize=SIZE, dpi=DPI)
    counts = sorted({r["nodes"] for r in rows})
    ok = [r for r in rows if (r.get("result") or "ok") == "ok"]
    for way in _ordered([r["way"] for r in ok], WORKDIR_WAYS):
        color = WORKDIR_COLORS.get(way)
        for program, style, marker in (("python", "-", "o"), ("no-op", "--", "s"),
                                       ("no-op, unchanged", ":", "^")):
            mine = sorted((r for r in ok if r["way"] == way and r["program"] == program),
                          key=lambda r: r["nodes"])
            if not mine:
                continue
            xs = [r["nodes"] for r in mine]
            ys = [r["median"] for r in mine]
            low = [y - y for y in ys]
            high = [(r.get("worst") or r["median"]) - r["median"] for r in mine]
            label = {"python": f"{way}: edit -> every rank runs it",
                     "no-op": f"{way}: no-op, edit -> exit",
                     "no-op, unchanged": f"{way}: no-op, unchanged tree"}[program]
            secs.errorbar(xs, ys, yerr=[low, high], marker=marker, linestyle=style, color=color,
                          capsize=2, label=label)
        mine = sorted((r for r in ok if r["way"] == way and r["program"] == "python"
                       and r.get("bytes_node") is not None), key=lambda r: r["nodes"])
        if mine:
            size.plot([r["nodes"] for r in mine], [max(r["bytes_node"], 1) for r in mine],
                      marker="o", color=color, label=f"{way}: one-line edit")
        cold = sorted((r for r in ok if r["way"] == way and r.get("cold_bytes_node") is not None),
                      key=lambda r: r["nodes"])
        if cold:
            size.plot([r["nodes"] for r in cold], [max(r["cold_bytes_node"], 1) for r in cold],
                      marker="x", linestyle=":", color=color, label=f"{way}: first ship")
    goals = [(n, g) for n, g in ((4, 3.0), (16, 5.0)) if n in counts]
    if goals:
        secs.scatter([n for n, _ in goals], [g for _, g in goals], marker="*", s=80, color="black",
                     zorder=5, label="goal: workdir's no-op (3 s at 4, 5 s at 16)")
    top = max((r.get("worst") or r["median"]) for r in ok) if ok else 1.0
    secs.set_ylim(0, top * 1.45)
    secs.set_ylabel("seconds (median; bar: worst)")
    secs.set_title(f"edit -> run, links {c['bandwidth']}, {c.get('slots') or 1} rank/node")
    secs.legend(loc="upper left", fontsize=6)
    size.axhline(64 * 1024, color="black", linestyle=":", linewidth=1, label="goal: 64 KiB")
    size.set_yscale("log")
    size.set_ylabel("bytes sent per node (the way's own count)")
    size.set_title(f"bytes per node (walk+hash {walk})", fontsize=8)
    size.legend(loc="center right", fontsize=6)
    for ax in (secs, size):
        ax.set_xlabel("nodes")
        ax.set_xticks(counts)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"one-line edit -> every rank, a {files:,}-file project ({_subtitle(doc)})")
    return fig


RECOVERY_PHASES = (("detect", "detect", "#d62728"), ("stop", "stop", "#ff7f0e"),
                   ("check_start", "check+start", "#1f77b4"),
                   ("resume", "resume -> first step", "#2ca02c"))


def _recovery(plt, doc: dict):
    rows = sorted(doc.get("rows") or [], key=lambda r: (r["nodes"], _rank(r["fault"], RECOVERY_FAULTS)))
    rows = [r for r in rows if r.get("runs")]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    for key, label, color in RECOVERY_PHASES:
        widths = [r.get(key) or 0.0 for r in rows]
        ax.barh(y, widths, left=left, color=color, label=label, height=0.6)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    worst = [(r["first_step_worst"], i) for i, r in enumerate(rows) if r.get("first_step_worst") is not None]
    if worst:
        ax.scatter([w for w, _ in worst], [i for _, i in worst], marker="|", s=120, color="black",
                   label="worst run")
    prog = {p["nodes"]: p["median"] for p in doc.get("program_start") or []}
    hand = [(r["by_hand"], i) for i, r in enumerate(rows) if r.get("by_hand") is not None]
    if hand:
        ax.scatter([h for h, _ in hand], [i for _, i in hand], marker="x", s=50, color="#7f7f7f",
                   zorder=5, label="by hand: fail-fast + relaunch")
    for p, style in zip(doc.get("peers") or [], (":", "--"), strict=False):
        ax.axvline(p["seconds"], color="black", linestyle=style, linewidth=1,
                   label=f"{p['what'].split(',')[0]} {p['seconds']:g} s")
    ax.set_yticks(y, [f"{r['nodes']} nodes, {r['fault']}"
                      + (f" (start {prog[r['nodes']]:.0f} s)" if r["nodes"] in prog else "")
                      for r in rows])
    ax.invert_yaxis()
    ends = [r.get(k) or 0.0 for r in rows for k in ("first_step_worst", "by_hand")]
    ends += [p["seconds"] for p in doc.get("peers") or []]
    ax.set_xlim(0, max(ends + [1.0]) * 1.04)
    ax.set_xlabel("seconds from the fault (medians, phase after phase)")
    c = doc["conditions"]
    ax.set_title(f"fault -> every rank training again: launch --max-restarts, "
                 f"{c.get('spares') or 1} spare\n({_subtitle(doc)}; start: the program's own, attempt 0)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.45, -0.14), ncol=4, fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    return fig


REGISTRY_STYLE = {"pull": ("#7f7f7f", "s", "(a) every node pulls from the registry"),
                  "relay": ("#2ca02c", "o", "(b) relay push, no registry"),
                  "registry+relay": ("#1f77b4", "^", "(c) push with a registry: registry + relay")}


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _registry(plt, doc: dict):
    c = doc["conditions"]
    rows = [r for r in doc["rows"] if (r.get("result") or "ok") == "ok"]
    counts = sorted({r["nodes"] for r in doc["rows"]})
    fig, (cold, warm, link) = plt.subplots(1, 3, figsize=SIZE, dpi=DPI)
    for way in _ordered([r["way"] for r in rows], REGISTRY_WAYS):
        color, marker, label = REGISTRY_STYLE.get(way, (None, "o", way))
        for ax, case in ((cold, "cold"), (warm, "warm")):
            mine = [r for r in rows if r["way"] == way and r["case"] == case]
            ns = sorted({r["nodes"] for r in mine})
            if ns:
                ax.plot(ns, [_median([r["seconds"] for r in mine if r["nodes"] == n]) for n in ns],
                        marker=marker, color=color, label=label)
                ax.scatter([r["nodes"] for r in mine], [r["seconds"] for r in mine], marker=marker,
                           s=12, color=color, alpha=0.5)
        for case, style in (("cold", "-"), ("warm", ":")):
            mine = [r for r in rows if r["way"] == way and r["case"] == case and r.get("x_s") is not None]
            ns = sorted({r["nodes"] for r in mine})
            if ns:
                link.plot(ns, [max(_median([r["x_s"] for r in mine if r["nodes"] == n]), 1e-4) for n in ns],
                          marker=marker, linestyle=style, color=color, label=f"{way}, {case}")
    ideal = c["ideal_seconds"]
    cold.axhline(ideal, color="black", linestyle="--", linewidth=1, label=f"S/B = {ideal:g} s")
    cold.axhline(1.3 * ideal, color="black", linestyle=":", linewidth=1, label="goal: 1.3 x S/B")
    link.axhline(1.3, color="black", linestyle=":", linewidth=1, label="goal: 1.3 x S")
    link.set_yscale("log")
    link.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _pos: f"{v:g}"))
    cold.set_title(f"cold: S = {c['image_mb']:g} MB", fontsize=9)
    warm.set_title(f"warm: one new {c.get('layer_mb') or '?'} MB layer", fontsize=9)
    link.set_title("bytes over the head's link, x S", fontsize=9)
    cold.set_ylabel("seconds until every node holds the image (median)")
    link.set_ylabel("head link bytes / S (median)")
    for ax in (cold, warm, link):
        ax.set_xlabel("nodes")
        ax.set_xticks(counts)
        ax.grid(alpha=0.3, which="both")
    cold.set_ylim(bottom=0)
    warm.set_ylim(bottom=0)
    cold.legend(loc="upper left", fontsize=6)
    link.legend(loc="center right", fontsize=5)
    fig.suptitle(f"image to every node and into the registry, links {c['bandwidth']} ({_subtitle(doc)})")
    return fig


def _ssh_clients(plt, doc: dict):
    rows, c = doc["rows"], doc["conditions"]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for client in _ordered([r["client"] for r in rows], ("clusterctl", "paramiko", "openssh", "openssh-kex")):
        mine = sorted((r for r in rows if r["client"] == client), key=lambda r: r["nodes"])
        ax.plot([r["nodes"] for r in mine], [r["cpu_per_node_ms"] for r in mine], marker="o",
                color=COLORS.get(client), label=client)
    ax.set_xscale("log", base=2)
    counts = sorted({r["nodes"] for r in rows})
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_yscale("log")
    ax.set_xlabel("nodes, all at once")
    ax.set_ylabel("head CPU ms per node (log)")
    ax.set_title(f"a login and {c['commands']} commands per node, by SSH client ({_subtitle(doc)})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower left", ncol=2)
    return fig


EXEC_WAYS = ("clusterctl", "clusterctl-eager", "clusterctl-tree", "pdsh", "clush", "by-hand")


def _exec(plt, doc: dict):
    rows, c = doc["rows"], doc["conditions"]
    fig, (cpu, wall) = plt.subplots(1, 2, figsize=(SIZE[0] * 1.5, SIZE[1]), dpi=DPI)
    counts = sorted({r["nodes"] for r in rows})
    for way in _ordered([r["way"] for r in rows], EXEC_WAYS):
        mine = sorted((r for r in rows if r["way"] == way), key=lambda r: r["nodes"])
        for ax, key in ((cpu, "cpu"), (wall, "wall")):
            ax.plot([r["nodes"] for r in mine], [r[key] for r in mine], marker="o",
                    color=COLORS.get(way), label=way,
                    linestyle="--" if way in ("by-hand", "clusterctl-eager") else "-")
    for ax, what in ((cpu, "head CPU s"), (wall, "wall s")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_yscale("log")
        ax.set_xlabel("nodes")
        ax.set_ylabel(f"{what} (log)")
        ax.grid(alpha=0.3, which="both")
    cpu.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"`{c['command']}` on every node, as typed ({_subtitle(doc)})")
    return fig


PEER_COLORS = {"clusterctl": "#1f77b4", "by-hand": "#7f7f7f", "mpirun": "#2ca02c", "ray": "#ff7f0e",
               "clusterctl-slurm": "#17becf", "torchx": "#9467bd"}


def _peers(plt, doc: dict):
    rows = [r for r in doc["rows"] if (r.get("result") or "ok") == "ok"]
    panels = (("setup_s", "set-up -> first run s"), ("edit_s", "edit -> every rank s"),
              ("fail_stop_s", "rank fails -> gone s"), ("lost_s", "node lost -> training s"),
              ("head_mb", "head MB (+ Ray's head)"))
    fig, axes = plt.subplots(1, len(panels), figsize=SIZE, dpi=DPI)
    counts = sorted({r["nodes"] for r in doc["rows"]})
    ways = _ordered([r["way"] for r in doc["rows"]], PEER_WAYS)
    width = 0.8 / max(len(ways), 1)
    for ax, (key, title) in zip(axes, panels, strict=True):
        for i, way in enumerate(ways):
            xs, ys = [], []
            for j, n in enumerate(counts):
                r = next((r for r in rows if r["way"] == way and r["nodes"] == n), None)
                if r is None or r.get(key) is None:
                    continue
                value = r[key] + (r.get("ray_head_mb") or 0 if key == "head_mb" else 0)
                xs.append(j + (i - (len(ways) - 1) / 2) * width)
                ys.append(value)
            ax.bar(xs, ys, width=width, color=PEER_COLORS.get(way), label=way)
        ax.set_xticks(range(len(counts)), [f"{n} nodes" for n in counts])
        ax.set_title(title, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=7)
    fig.suptitle(f"own-project DDP through clusterctl and its peers, same nodes, one run ({_subtitle(doc)})",
                 fontsize=9)
    return fig


def figure(doc: dict):
    """The matplotlib figure of a checked document."""
    plt = _pyplot()
    kind = doc["benchmark"]
    if kind == "push":
        return (_push_phases if _phases_only(doc) else _push_nodes)(plt, doc)
    return {"launch": _launch, "collective": _collective, "validate": _validate,
            "scale": _scale, "workdir": _workdir, "recovery": _recovery,
            "registry": _registry, "ssh_clients": _ssh_clients, "exec": _exec,
            "peers": _peers}[kind](plt, doc)


def draw(doc: dict, out: str | os.PathLike) -> Path:
    """``doc`` (checked) drawn into the PNG ``out``: 800 x 450, the same bytes for the same
    document (no date or version in the file)."""
    validate(doc, str(out))
    plt = _pyplot()
    fig = figure(doc)
    fig.set_size_inches(*SIZE)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI, format="png", metadata={"Software": None})
    plt.close(fig)
    return Path(out)


def draw_all(data: Path = DATA, out: Path = IMG) -> list[Path]:
    """Every ``data/*.json`` drawn into ``out/<same name>.png``; the PNGs written."""
    files = sorted(Path(data).glob("*.json"))
    if not files:
        raise DataError(f"{data}: no *.json data files")
    docs = [(f, load(f)) for f in files]       # every file checked before anything is drawn
    Path(out).mkdir(parents=True, exist_ok=True)
    return [draw(doc, Path(out) / f"{f.stem}.png") for f, doc in docs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", metavar="FILE.json",
                    help="data files to draw (default: every file of --data)")
    ap.add_argument("--data", default=str(DATA), help="directory of data files (default: %(default)s)")
    ap.add_argument("--out", default=None,
                    help="directory for the PNGs (default: docs/benchmarks/img), or the PNG "
                         "for a single FILE.json")
    ap.add_argument("--tables", action="store_true",
                    help="print each file's Markdown table (what the pages hold) instead of drawing")
    args = ap.parse_args(argv)
    try:
        if args.tables:
            files = args.files or sorted(str(p) for p in Path(args.data).glob("*.json"))
            for f in files:
                print(f"<!-- bench-table: {Path(f).name} -->\n{table(load(f))}\n")
            return 0
        if args.files:
            single = len(args.files) == 1 and args.out and args.out.endswith(".png")
            written = []
            for f in args.files:
                target = Path(args.out) if single else Path(args.out or IMG) / f"{Path(f).stem}.png"
                target.parent.mkdir(parents=True, exist_ok=True)
                written.append(draw(load(f), target))
        else:
            written = draw_all(Path(args.data), Path(args.out or IMG))
    except DataError as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    for path in written:
        try:
            shown = path.resolve().relative_to(Path.cwd())
        except ValueError:
            shown = path
        print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
