"""What clusterctl left on the nodes, shown and removed: ``clusterctl clean``.

A launch leaves three kinds of things on a node that outlive it, on purpose (each makes the
next launch cheaper), and nothing else removes them all:

* code trees: ``CODE_DIR/trees/<digest>/`` (:mod:`clusterctl.code.sync`; sync drops a tree
  itself only when the node holds more than 16 and it went unused for a day);
* images: the ones clusterctl built (label ``io.clusterctl.target``), pushed or pulled there;
* kept-login directories: ``/tmp/clusterctl-mux.*`` (:mod:`clusterctl.cluster.transport.tree`),
  left when a launch was killed before its end.

Three steps, each its own function:

1. :func:`survey`: ONE command per node (``scripts/clean-list.sh``) lists them all, with
   every container of the node (its inspect, any state) and the node's clock; nothing changes.
2. :func:`decide` (pure): what goes, from the listing and a :class:`Policy`.  A code tree a
   live container (not exited or dead) mounts stays, as does an image any container uses
   (the engine would refuse it), a kept-login directory with a live login (a socket) in it
   or made in the last :data:`LOGIN_GRACE` seconds (a call may be making it); trees and
   images used in the last ``older_than`` seconds stay; with ``keep_size``, unused images go,
   oldest first, until clusterctl's images on the node fit in it.
3. :func:`remove` (``--yes``): a second command per node (``scripts/clean-remove.sh``)
   removes exactly the chosen items, each checked again there: a tree by its digest under
   the node's own trees directory, only when it is a directory (never a link followed) whose
   time of last use has not changed since the listing (a launch that used it meanwhile
   keeps it); a kept-login directory by its name under ``/tmp``, only when it is ours and
   still has no socket; an image by its ID through the node's runtime.  Nothing here takes
   a path from a file: the names are the listing's, checked here and again on the node.

Disk use is ``du``'s for a tree or a directory (files a tree shares, by hard links, with a
tree that stays are not freed with it), the engine's ``Size`` for an image (layers images
share are counted in each).

Contract: :func:`survey`, :func:`decide`, :func:`remove`, :func:`clean`; :class:`Policy`,
:class:`Listing`, :class:`Item`, :class:`Verdict`, :class:`NodeReport`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from clusterctl.cluster.containers import RUN_LABEL
from clusterctl.cluster.runtime import ContainerRuntime, node_runtime
from clusterctl.cluster.transport import tree
from clusterctl.core.errors import NodeError
from clusterctl.core.scripts import script_text
from clusterctl.core.text import digits

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Node
    from clusterctl.cluster.transport import Cluster

#: the label every image clusterctl builds carries (image.labels: ``io.clusterctl.target``)
IMAGE_LABEL = "io.clusterctl.target"
#: seconds a kept-login directory without a login in it is left alone (a tree call may be
#: making its first login), as the tree's own sweep does (``MUX_SWEEP_MIN``)
LOGIN_GRACE = 600.0
#: seconds each node's listing or removal may take
TIMEOUT = 300.0
#: container states that are not live: what such a container mounts may go
ENDED = frozenset({"exited", "dead"})

_LIST = script_text("clusterctl.cluster", "clean-list.sh")
_REMOVE = script_text("clusterctl.cluster", "clean-remove.sh")
_HEX = re.compile(r"[0-9a-f]{64}\Z")
_LOGIN = re.compile(r"clusterctl-mux\.[A-Za-z0-9._-]+\Z")
_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}\Z")


# --------------------------------------------------------------------------- the data

@dataclass(frozen=True)
class Policy:
    """What may go: trees and images unused for ``older_than`` seconds (0: any unused one);
    ``keep_size``: bytes of clusterctl's images a node may keep (None: no limit)."""

    older_than: float = 24 * 3600.0
    keep_size: int | None = None


@dataclass(frozen=True)
class Item:
    """One thing on a node: ``kind`` (``tree``, ``image``, ``login``), ``name`` (a tree's
    digest, an image's ID, a directory's name under /tmp), ``bytes`` on disk, ``used``
    (epoch seconds: a tree's last launch, an image's arrival, a directory's change),
    ``stamp`` (what the removal checks again: a tree's mtime), ``detail`` (an image's names;
    a login directory's socket count)."""

    kind: str
    name: str
    bytes: int
    used: float
    stamp: str = "-"
    detail: str = ""


@dataclass(frozen=True)
class Container:
    """A container on the node, as the listing saw it: its state, image ID, run label, and
    the sources of its mounts."""

    id: str
    status: str
    image: str
    run: str
    mounts: tuple[str, ...] = ()

    @property
    def live(self) -> bool:
        return self.status not in ENDED


@dataclass(frozen=True)
class Listing:
    """What one node holds that clusterctl left (``now``: the node's clock)."""

    node: str
    now: float
    trees_dir: str | None
    items: tuple[Item, ...]
    containers: tuple[Container, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """An item and whether it goes, with why."""

    item: Item
    remove: bool
    reason: str


@dataclass
class NodeReport:
    """One node's outcome: the verdicts, and after ``--yes`` what each removal did
    (``removed``: name -> bytes freed; ``left``: name -> why it stayed after all);
    ``error``: why the node could not be listed or cleaned (the node failed)."""

    node: str
    verdicts: list[Verdict] = field(default_factory=list)
    removed: dict[str, int] = field(default_factory=dict)
    left: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def chosen(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.remove]

    @property
    def ok(self) -> bool:
        return self.error is None and not self.left


# --------------------------------------------------------------------------- reading a listing

def _docker_epoch(value: object) -> float:
    """An engine's RFC 3339 time (nanoseconds, Z or an offset) -> epoch seconds; 0 for none."""
    if not isinstance(value, str) or not value or value.startswith("0001-01-01"):
        return 0.0
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:\d\d)?", value)
    if not m:
        return 0.0
    zone = m.group(2) or "Z"
    return datetime.fromisoformat(m.group(1) + ("+00:00" if zone == "Z" else zone)).timestamp()


def parse_listing(node: str, text: str) -> Listing:
    """``clean-list.sh``'s output on ``node`` -> a :class:`Listing` (pure); ValueError
    naming the line that is not what the script writes."""
    now, trees_dir = None, None
    items: list[Item] = []
    containers: list[Container] = []
    for number, line in enumerate(text.splitlines(), 1):
        word, _, rest = line.partition(" ")
        try:
            if word == "now":
                now = float(rest)
            elif word == "trees":
                trees_dir = rest
            elif word == "tree":
                name, kib, mtime = rest.split(" ")
                if not _HEX.match(name):
                    raise ValueError("not a tree digest")
                items.append(Item("tree", name, int(kib) * 1024, float(mtime), stamp=mtime))
            elif word == "login":
                name, kib, mtime, sockets = rest.split(" ")
                if not _LOGIN.match(name):
                    raise ValueError("not a kept-login directory")
                items.append(Item("login", name, int(kib or 0) * 1024, float(mtime), detail=sockets))
            elif word == "container":
                c = json.loads(rest)
                labels = (c.get("Config") or {}).get("Labels") or {}
                containers.append(Container(
                    str(c["Id"]), str((c.get("State") or {}).get("Status", "")), str(c.get("Image", "")),
                    str(labels.get(RUN_LABEL, "")),
                    tuple(str(m.get("Source", "")) for m in c.get("Mounts") or ())))
            elif word == "image":
                i = json.loads(rest)
                if not _IMAGE_ID.match(str(i.get("Id", ""))):
                    raise ValueError("not an image ID")
                if any(x.kind == "image" and x.name == i["Id"] for x in items):
                    continue   # listed once per name it carries
                used = max(_docker_epoch(i.get("Created")),
                           _docker_epoch((i.get("Metadata") or {}).get("LastTagTime")))
                items.append(Item("image", i["Id"], int(i.get("Size") or 0), used,
                                  detail=" ".join(i.get("RepoTags") or ())))
            elif word == "engine-error":
                raise ValueError(f"the container runtime did not answer: {rest.strip()}")
            elif line.strip():
                raise ValueError("not a line clean-list.sh writes")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"listing line {number}: {e}: {line[:200]!r}") from None
    if now is None:
        raise ValueError("the listing has no 'now' line (the node's sh did not run it)")
    return Listing(node, now, trees_dir, tuple(items), tuple(containers))


# --------------------------------------------------------------------------- the decision

def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def _mounts_tree(source: str, digest: str) -> bool:
    """Whether a mount source is that tree (or inside it): a ``trees/<digest>`` pair of
    path components, whichever path led there."""
    parts = source.rstrip("/").split("/")
    return any(a == "trees" and b == digest for a, b in zip(parts, parts[1:], strict=False))


def decide(listing: Listing, policy: Policy) -> list[Verdict]:
    """What goes on one node (pure): every item of ``listing`` with its verdict, in the
    listing's order (see the module docstring for the rules)."""
    live = [c for c in listing.containers if c.live]
    out: dict[int, Verdict] = {}
    images: list[tuple[int, Item]] = []
    for k, item in enumerate(listing.items):
        age = listing.now - item.used
        if item.kind == "tree":
            users = [c for c in live if any(_mounts_tree(s, item.name) for s in c.mounts)]
            if users:
                out[k] = Verdict(item, False, "mounted by a live container" + _of_runs(users))
            elif age < policy.older_than:
                out[k] = Verdict(item, False, f"used {_age(age)} ago (--older-than)")
            else:
                out[k] = Verdict(item, True, f"no live container mounts it; last used {_age(age)} ago")
        elif item.kind == "login":
            if item.detail not in ("", "0"):
                out[k] = Verdict(item, False, "a kept login is live in it")
            elif age < LOGIN_GRACE:
                out[k] = Verdict(item, False, f"made {_age(age)} ago (a call may be using it)")
            else:
                out[k] = Verdict(item, True, "no login is live in it")
        elif item.kind == "image":
            users = [c for c in listing.containers if c.image == item.name]
            if users:
                state = "a live" if any(c.live for c in users) else "an ended"
                out[k] = Verdict(item, False, f"{state} container uses it" + _of_runs(users))
            elif age >= policy.older_than:
                out[k] = Verdict(item, True, f"no container uses it; arrived {_age(age)} ago")
            else:
                images.append((k, item))
        else:
            out[k] = Verdict(item, False, f"not a kind clean removes ({item.kind})")
    # the images that stay so far: the used ones and the young ones
    total = sum(item.bytes for k, item in enumerate(listing.items)
                if item.kind == "image" and not (k in out and out[k].remove))
    for k, item in sorted(images, key=lambda p: p[1].used):
        age = listing.now - item.used
        if policy.keep_size is not None and total > policy.keep_size:
            out[k] = Verdict(item, True, f"no container uses it; oldest past --keep-size "
                                         f"(arrived {_age(age)} ago)")
            total -= item.bytes
        else:
            out[k] = Verdict(item, False, f"arrived {_age(age)} ago (--older-than)")
    return [out[k] for k in range(len(listing.items))]


def _of_runs(containers: Sequence[Container]) -> str:
    runs = sorted({c.run for c in containers if c.run})
    return f" (run {', '.join(runs)})" if runs else ""


# --------------------------------------------------------------------------- on the nodes

def _filled(text: str, values: Mapping[str, list[str]]) -> str:
    """A script with each ``$NAME`` placeholder replaced by an argv as shell words."""
    for name, argv in values.items():
        text = text.replace(f"${name}", shlex.join(argv))
    return text


#: Of each container and image, the fields :func:`parse_listing` reads, one JSON line each.
#: Not ``{{json .}}``: Podman prints that as one indented array, not a line per object (and
#: refuses ``{{json .Id}}``); an ID is hex, so it needs no quoting of its own.
CONTAINER_FORMAT = ('{"Id":"{{.Id}}","State":{"Status":"{{.State.Status}}"},"Image":"{{.Image}}",'
                    '"Config":{"Labels":{{json .Config.Labels}}},"Mounts":{{json .Mounts}}}')
IMAGE_FORMAT = ('{"Id":"{{.Id}}","Created":{{json .Created}},"Metadata":{{json .Metadata}},'
                '"Size":{{json .Size}},"RepoTags":{{json .RepoTags}}}')


def list_command(node: Node) -> tuple[str, ...]:
    """The listing's argv on ``node`` (its runtime's commands in the script)."""
    rt: ContainerRuntime = node_runtime(node)
    script = _filled(_LIST, {
        "INSPECT_CONTAINERS": rt.inspect([], format=CONTAINER_FORMAT),
        "INSPECT_IMAGES": rt.image_inspect([], format=IMAGE_FORMAT),
        "CONTAINERS": rt.ps(labels={}),
        "IMAGES": rt.images(label=IMAGE_LABEL)})
    return ("sh", "-c", script, "clusterctl-clean", str(node.code_dir))


def remove_command(node: Node, chosen: Sequence[Item]) -> tuple[str, ...]:
    """The removal's argv on ``node``: exactly ``chosen``, each as KIND NAME STAMP (names
    checked here too: a tree's digest, a login directory's name, an image's ID)."""
    script = _filled(_REMOVE, {"REMOVE_IMAGE": node_runtime(node).remove_images([])})
    words: list[str] = []
    for item in chosen:
        valid = {"tree": _HEX, "login": _LOGIN, "image": _IMAGE_ID}.get(item.kind)
        if valid is None or not valid.match(item.name):
            raise ValueError(f"{item.kind} {item.name!r} is not an item clean removes")
        words += [item.kind, item.name, item.stamp]
    return ("sh", "-c", script, "clusterctl-clean", str(node.code_dir), *words)


def survey(cluster: Cluster, policy: Policy) -> list[NodeReport]:
    """List every node's leftovers (one command each, at once) and decide on them."""
    nodes = {n.name: n for n in cluster.inventory.nodes}
    got = tree.run_commands(cluster, {name: [tree.Command(list_command(n))] for name, n in nodes.items()},
                            timeout=TIMEOUT)
    reports = []
    for name in nodes:
        result = got[name]
        if isinstance(result, NodeError):
            reports.append(NodeReport(name, error=result.reason))
            continue
        r = result[0]
        try:
            listing = parse_listing(name, r.stdout)
        except ValueError as e:
            said = " ".join((r.stderr or "").split())[-300:]
            why = (str(e) + (f": {said}" if said else "")) if r.exit_code in (0, 3) else \
                f"the listing exited {r.exit_code}: {said or r.stdout.strip()[-300:]}"
            reports.append(NodeReport(name, error=why))
            continue
        reports.append(NodeReport(name, decide(listing, policy)))
    return reports


def parse_removal(text: str, chosen: Sequence[Item]) -> tuple[dict[str, int], dict[str, str]]:
    """``clean-remove.sh``'s lines -> (removed: name -> bytes freed, left: name -> why);
    an item the node said nothing of is left, saying so (pure)."""
    sizes = {i.name: i.bytes for i in chosen}
    removed: dict[str, int] = {}
    left: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split(" ", 3)
        if len(words) < 3 or words[2] not in sizes:
            continue
        what, _, name = words[:3]
        if what == "removed":
            kib = words[3] if len(words) > 3 else "0"
            removed[name] = int(kib) * 1024 if digits(kib) and kib != "0" else sizes[name]
        elif what == "gone":
            removed[name] = 0
        elif what == "kept":
            left[name] = words[3] if len(words) > 3 else "kept"
    for item in chosen:
        if item.name not in removed and item.name not in left:
            left[item.name] = "the node did not say it removed it"
    return removed, left


def remove(cluster: Cluster, reports: Sequence[NodeReport]) -> None:
    """Remove each report's chosen items on its node (one command each, at once); fill in
    each report's ``removed`` and ``left`` (or ``error``)."""
    nodes = {n.name: n for n in cluster.inventory.nodes}
    todo = {r.node: r for r in reports if r.error is None and r.chosen}
    if not todo:
        return
    commands = {name: [tree.Command(remove_command(nodes[name], [v.item for v in r.chosen]))]
                for name, r in todo.items()}
    got = tree.run_commands(cluster, commands, timeout=TIMEOUT)
    for name, report in todo.items():
        result = got[name]
        if isinstance(result, NodeError):
            report.error = result.reason
            continue
        r = result[0]
        report.removed, report.left = parse_removal(r.stdout, [v.item for v in report.chosen])
        if r.exit_code != 0:
            report.error = f"the removal exited {r.exit_code}: {(r.stderr or r.stdout).strip()[-300:]}"


def clean(cluster: Cluster, policy: Policy, *, apply: bool) -> list[NodeReport]:
    """``clusterctl clean``: every node's verdicts, and with ``apply`` the chosen removed."""
    reports = survey(cluster, policy)
    if apply:
        remove(cluster, reports)
    return reports


__all__ = ["ENDED", "IMAGE_LABEL", "LOGIN_GRACE", "Container", "Item", "Listing", "NodeReport",
           "Policy", "Verdict", "clean", "decide", "list_command", "parse_listing", "parse_removal",
           "remove", "remove_command", "survey"]
