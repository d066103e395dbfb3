"""`clusterctl check --nodes FILE`: is every node ready to push to and launch on?

Thin over :mod:`clusterctl.preflight`: load the inventory, connect to every
node in parallel, print one table row per node and then each problem as a
line naming its node. Exit 0 when every node is ready, 1 when any is not, 2
for bad input (the inventory, an option).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from clusterctl.cli.nodes import NodesOption
from clusterctl.cluster import netcheck, preflight
from clusterctl.cluster.inventory import Inventory, load_inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.core import accelerators
from clusterctl.core.console import interactive, out, table
from clusterctl.core.errors import UserError
from clusterctl.core.imageref import check_image
from clusterctl.image.targets import get_target
from clusterctl.run.collective import model as collective_model
from clusterctl.run.jobs import load_job

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


def parse_size(text: str, option: str = "--need-disk") -> int:
    """'20G', '1.5TiB', '500M', '1048576' -> bytes (binary units); UserError otherwise."""
    m = _SIZE_RE.fullmatch(text.strip())
    if not m:
        raise UserError(f"{option} {text!r} is not a size; valid: a number of bytes with an "
                        "optional unit K, M, G or T (binary, e.g. 20G or 1.5TiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def check(
    nodes: NodesOption,
    target: Annotated[str | None, typer.Option(
        "--target", "-t", help="Also require the devices this target's containers need "
        "(e.g. cambricon: /dev/cambricon_ctl and one /dev/cambricon_devN per slot).")] = None,
    accept_new_host_keys: Annotated[bool, typer.Option(
        "--accept-new-host-keys", help="Trust and record the host key of a node not yet in "
        "known_hosts (like ssh's accept-new). A CHANGED key is still refused.")] = False,
    fanout: Annotated[int | None, typer.Option(
        "--fanout", min=1, help="Nodes contacted at once (default: the inventory's ssh.fanout, 32).",
        show_default=False)] = None,
    need_disk: Annotated[str | None, typer.Option(
        "--need-disk", metavar="SIZE", help="Free space every node needs where Docker keeps "
        "images, e.g. 20G.")] = None,
    image: Annotated[str | None, typer.Option(
        "--image", metavar="REF", help="A local image the nodes must take: its architecture "
        "must be the node's and its size must fit in the free disk (unless --need-disk).")] = None,
    json_: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object per node (all fields) instead of the table.")] = False,
    network: Annotated[bool, typer.Option(
        "--network", help="Also check node-to-node reachability: from every node a TCP connect "
        "to each other node's SSH port, to the master's master port and to a listener on each "
        "node (the collective's ports), 3 s each; a blocked pair is named "
        "(node1 -> node3:22 blocked (timeout)).")] = False,
    connect_timeout: Annotated[float | None, typer.Option(
        "--connect-timeout", min=0.1, metavar="SECONDS",
        help="SSH connect timeout per node (default: the inventory's, 10).")] = None,
    collective: Annotated[bool, typer.Option(
        "--collective", help="Run an all_reduce benchmark in the job's image on every node "
        "(the target's backend), then pairwise rounds that name a slow or broken node.",
        rich_help_panel="Collective check")] = False,
    job: Annotated[str | None, typer.Option(
        "--job", metavar="JOB", help="With --collective: run in this job's image, env and "
        "docker flags (a shipped job's name or a YAML file).",
        rich_help_panel="Collective check")] = None,
    sizes: Annotated[str, typer.Option(
        "--sizes", metavar="SIZES", help="All-node all_reduce message sizes.",
        rich_help_panel="Collective check")] = "1M,4M,16M",
    pair_size: Annotated[str, typer.Option(
        "--pair-size", metavar="SIZE", help="Message size of each pair's all_reduce.",
        rich_help_panel="Collective check")] = "4M",
    iters: Annotated[int, typer.Option(
        "--iters", min=1, max=1000, help="Timed iterations per size and pair.",
        rich_help_panel="Collective check")] = 5,
    pair_rounds: Annotated[str, typer.Option(
        "--pair-rounds", metavar="N|all", help="Pair rounds: each node meets N partners "
        "(enough to tell N-1 slow nodes apart), or 'all' for every pair (n-1 rounds).",
        rich_help_panel="Collective check")] = str(collective_model.DEFAULT_PAIR_ROUNDS),
    min_busbw: Annotated[str | None, typer.Option(
        "--min-busbw", metavar="RATE", help="Absolute threshold, e.g. 10GB/s or 100Gbps: "
        "every node's best pair and the all-node bus bandwidth must reach it.",
        rich_help_panel="Collective check")] = None,
    max_slowdown: Annotated[float, typer.Option(
        "--max-slowdown", min=1.0, help="Relative threshold: a node whose best pair is this "
        "many times slower than the median node's is slow.",
        rich_help_panel="Collective check")] = 3.0,
    backend: Annotated[str | None, typer.Option(
        "--backend", help="torch.distributed backend (default: the target's; gloo for a bare "
        "--image).", rich_help_panel="Collective check")] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=5.0, metavar="SECONDS", help="Seconds the check's containers may run (preflight and push "
        "come before).",
        rich_help_panel="Collective check")] = 300.0,
    push: Annotated[bool, typer.Option(
        "--push/--no-push", help="Put the image on nodes that lack it first, as launch does.",
        rich_help_panel="Collective check")] = True,
    save: Annotated[Path | None, typer.Option(
        "--save", metavar="PATH", help="Write the collective check's JSON here (default: "
        "runs/<check-id>/collective.json).", rich_help_panel="Collective check")] = None,
) -> None:
    """Check every node in parallel: SSH, Docker daemon, architecture, free disk, devices,
    the network interface launch will use, the master port, and on GPU and MLU nodes what
    their own tools say (driver, container toolkit, health, busy GPUs).  With --network:
    node-to-node reachability, naming each blocked pair.  With --collective: measure
    all_reduce bus bandwidth across the nodes in the job's image and name the slow or
    broken node (exit 1)."""
    if collective and network:
        raise UserError("--network belongs to the node check; run it without --collective.")
    if collective:
        _collective(nodes, target=target, image=image, job=job, sizes=sizes, pair_size=pair_size,
                    iters=iters, pair_rounds=pair_rounds, min_busbw=min_busbw, max_slowdown=max_slowdown, backend=backend,
                    timeout=timeout, push=push, save=save, json_=json_,
                    accept_new_host_keys=accept_new_host_keys)
        return
    for given, name in ((job, "--job"), (min_busbw, "--min-busbw"), (save, "--save")):
        if given is not None:
            raise UserError(f"{name} belongs to the collective check; add --collective.")
    required = parse_size(need_disk) if need_disk is not None else None
    if image is not None:
        check_image(image, "--image")
    inventory = load_inventory(nodes)
    needs = preflight.image_needs(image) if image else None
    if needs is not None and required is None:
        required = needs.size
    devices_for = _target_devices(target) if target is not None else None
    spec = get_target(target) if target is not None else None
    toolkit = (needs.cuda if needs else None) or (spec.pins.get("cuda") if spec else None)
    with Cluster(inventory, fanout=fanout, connect_timeout=connect_timeout,
                 accept_new_host_keys=True if accept_new_host_keys else None) as cluster:
        checks = preflight.run_preflight(cluster, devices_for=devices_for, required_bytes=required,
                                         expected_arch=needs.arch if needs else None,
                                         image_ref=image, toolkit_version=toolkit,
                                         wants_device=spec.device if spec else None)
        if spec is not None:   # what a job with nproc_per_node: slots would start
            preflight.judge_processes(checks, {n.name: n.slots for n in inventory.nodes},
                                      source="`slots:` gives", warn_only=True)
        if network:
            netcheck.check_nodes(cluster, checks)
    if json_:
        typer.echo(json.dumps([{**asdict(c), "ok": c.ok} for c in checks], indent=2))
    else:
        _report(inventory, checks)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


def _collective(nodes, *, target, image, job: str | None, sizes, pair_size, iters, pair_rounds,
                min_busbw, max_slowdown, backend, timeout, push, save, json_,
                accept_new_host_keys) -> None:
    """``check --collective``: every input checked first (exit 2), then the check."""
    # imported here: every other command (launch above all) starts without them
    from clusterctl.cli import collective as collective_view
    from clusterctl.run.collective import check as collective_check
    thresholds = collective_model.Thresholds(
        min_busbw=collective_view.parse_rate(min_busbw) if min_busbw is not None else None,
        max_slowdown=max_slowdown)
    options = collective_check.Options(
        sizes=collective_view.parse_sizes(sizes),
        pair_bytes=collective_view.parse_sizes(pair_size, "--pair-size")[0], iters=iters,
        pair_rounds=collective_view.parse_pair_rounds(pair_rounds),
        timeout=timeout, collective_timeout=min(120.0, timeout), thresholds=thresholds,
        push=push, backend=backend)
    known = accelerators.load().backend_names()
    if backend is not None and backend not in known:
        raise UserError(f"--backend {backend!r} is not known; valid: {', '.join(known)}")
    if save is not None and (save.is_dir() or not save.parent.is_dir()):
        raise UserError(f"--save {save}: valid: a file path in an existing directory")
    spec = load_job(job) if job is not None else None
    inventory = load_inventory(nodes)
    note = (lambda msg: out.print(f"[dim]{escape(msg)}[/]")) if interactive() and not json_ \
        else (lambda msg: None)
    result = collective_check.run_check(
        inventory, job=spec, target=target, image=image, options=options,
        accept_new_host_keys=True if accept_new_host_keys else None, note=note)
    path = collective_view.save(result, thresholds, save)
    if json_:
        typer.echo(json.dumps(result.to_json(thresholds), indent=2))
    else:
        collective_view.report(result, thresholds, saved=path)
    if not result.verdict.ok:
        raise typer.Exit(1)


#: torch.distributed backends the probe knows how to set up: the accelerator table's
#: (core/data/accelerators.yaml), the default first.
BACKENDS = accelerators.load().backend_names()


def _target_devices(name: str):
    """node -> the devices the target's containers get on it (per slot where the stack says)."""
    run_spec = get_target(name).run
    return lambda node: run_spec.devices_for(node.slots)


def _report(inventory: Inventory, checks: list[preflight.NodeCheck]) -> None:
    rows = preflight.table_rows(checks, compact=True)
    t = table(f"{inventory.path}: {len(checks)} nodes", preflight.COLUMNS,
              [[escape(cell) for cell in row] for row in rows])
    if interactive():
        out.print(t)
    else:  # logs and pipes get whole values, not cells folded to a default 80 columns
        Console(file=out.file, width=_natural_width(preflight.COLUMNS, rows),
                highlight=False).print(t)
    for c in checks:
        for problem in c.problems:
            out.print(f"{c.node}: {problem}", markup=False)
    for c in checks:
        for warning in c.warnings:
            out.print(f"{c.node}: warning: {warning}", markup=False)
    bad = [c.node for c in checks if not c.ok]
    if bad:
        out.print(f"{len(bad)} of {len(checks)} nodes not ready: {', '.join(bad)}", markup=False)
    else:
        master = checks[0]
        port = f"; master port {master.master_port} free" if master.master_port else ""
        out.print(f"all {len(checks)} nodes ready{port}", markup=False)


def _natural_width(columns, rows) -> int:
    """Width at which no cell of the table folds."""
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    return sum(widths) + 3 * len(widths) + 1


def register(app: typer.Typer) -> None:
    app.command("check")(check)
