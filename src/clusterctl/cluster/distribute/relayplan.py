"""Which node feeds which in a relay push: a pure plan from what each node needs.

One job: turn "node -> the layers it lacks" into chains of nodes that forward
while they receive.  Contract:

* :func:`plan_relay` - nodes that need the same layers form a group; each
  group becomes ``width`` chains (1 by default); the head feeds the first
  node of every chain, every other node is fed by the node before it;
* :class:`RelayPlan` - ``feeder(node)`` (None: the head), ``children(node)``,
  ``roots``, ``chains``, ``downstream(node)``, ``hops`` (node-to-node links);
* :func:`choose_strategy` - ``star`` or ``relay`` for a push;
* :func:`cut_off` - after a failure: the nodes their chain can no longer feed;
* :func:`plan_refeed` - who feeds those again: new chains from the head;
* :func:`failed_upstream` - the failure that cut a node off (what the display names).

Why chains: with every link at rate B, a chain moves S bytes to N nodes in
about (S + (N-1) x c)/B for a pipeline chunk c, and the head's uplink carries
S once instead of N x S (a star); a tree of fan-out k costs each inner node
k x S/B of upload.  A chain forwards one stream unchanged, so only nodes
that lack exactly the same layers can share one: each set of needs is its
own group, with its own stream from the head (nodes still get only what
they lack).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

STRATEGIES = ("auto", "star", "relay")
#: ``auto`` relays from this many nodes needing the image (benchmarks/push.py: at 2
#: nodes relay halves the head's bytes but was not faster on the 2-core sandbox)
RELAY_FROM_NODES = 3
#: ... and only when the star would send at least this many bytes in all (when the source
#: knows its layers' sizes): below it the star's extra copies cost less than the relay's
#: fixed per-node setup, ~2 s measured, on any link of 1 Gbit/s or more (256 MiB at
#: 1 Gbit/s is 2.1 s), so a small change, one layer to a few nodes, goes by star.
RELAY_FROM_BYTES = 256 << 20


@dataclass(frozen=True)
class RelayPlan:
    """Chains of nodes: the head feeds each chain's first node; each node feeds the next."""

    chains: tuple[tuple[str, ...], ...]
    _feeder: dict[str, str | None] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for chain in self.chains:
            for i, node in enumerate(chain):
                self._feeder[node] = chain[i - 1] if i else None

    @property
    def nodes(self) -> list[str]:
        return [n for chain in self.chains for n in chain]

    @property
    def roots(self) -> list[str]:
        """The nodes the head streams to (one per chain)."""
        return [chain[0] for chain in self.chains]

    @property
    def hops(self) -> list[tuple[str, str]]:
        """Every node-to-node link, (feeder, fed)."""
        return [(chain[i - 1], chain[i]) for chain in self.chains for i in range(1, len(chain))]

    def feeder(self, node: str) -> str | None:
        """The node that feeds ``node``; None when the head does."""
        return self._feeder[node]

    def children(self, node: str) -> list[str]:
        return [fed for feeder, fed in self.hops if feeder == node]

    def keep(self, nodes: Iterable[str]) -> RelayPlan:
        """The same chains with only ``nodes`` in them, in their order (a chain left empty
        is dropped; a node dropped from a chain's middle: the next one is fed by the one
        before it)."""
        wanted = set(nodes)
        return RelayPlan(tuple(c for c in (tuple(n for n in chain if n in wanted)
                                           for chain in self.chains) if c))

    def downstream(self, node: str) -> list[str]:
        """Every node fed, directly or not, through ``node`` (in feeding order)."""
        for chain in self.chains:
            if node in chain:
                return list(chain[chain.index(node) + 1:])
        return []


def plan_relay(needs: Mapping[str, frozenset[str]], *, width: int = 1) -> RelayPlan:
    """Chains for the nodes in ``needs`` (node -> what it lacks), in the mapping's order.

    Nodes with the same need share chains; ``width`` chains per group (at most
    one per node), their lengths differing by at most one."""
    if width < 1:
        raise ValueError("width must be at least 1")
    groups: dict[frozenset[str], list[str]] = {}
    for node, need in needs.items():
        groups.setdefault(frozenset(need), []).append(node)
    chains: list[tuple[str, ...]] = []
    for members in groups.values():
        k = min(width, len(members))
        size, extra = divmod(len(members), k)
        start = 0
        for i in range(k):
            end = start + size + (1 if i < extra else 0)
            chains.append(tuple(members[start:end]))
            start = end
    return RelayPlan(tuple(chains))


def cut_off(plan: RelayPlan, *, lost: Collection[str],
            broken: Collection[tuple[str, str]] = (),
            completed: Collection[str] = ()) -> list[str]:
    """The nodes of ``plan`` that their chain can no longer feed, in the plan's order.

    ``lost``: nodes that failed as feeders (stopped answering, their command gone);
    ``broken``: hops (feeder, fed) that broke while the feeder went on; ``completed``:
    nodes that have the image.  A node is cut off when it has not completed, is not
    lost itself (a lost node is failed, not fed again), and its feeder is lost or cut
    off, or its hop broke: everything after a failure in a chain, up to its end."""
    out: list[str] = []
    for chain in plan.chains:
        for feeder, node in zip(chain, chain[1:], strict=False):
            if node in completed or node in lost:
                continue
            if feeder in lost or feeder in out or (feeder, node) in broken:
                out.append(node)
    return out


def plan_refeed(plan: RelayPlan, nodes: Iterable[str]) -> RelayPlan:
    """Who feeds ``nodes`` (cut off from their chains in ``plan``) again: the head, as new
    chains, one per chain they were cut from, in the same order.

    The same chains keep the same need (one stream each) and the push's width; the head,
    not a node that completed, feeds them: it has the stream at hand (the layer store or
    ``docker save``), where a node would first have to export the image (``docker save``
    on that node, a full export whatever the others lack) over an uplink that may still
    be feeding its own chain.  ValueError for a node not in ``plan``."""
    nodes = list(nodes)
    unknown = [n for n in nodes if n not in plan.nodes]
    if unknown:
        raise ValueError(f"not in the plan: {', '.join(unknown)}")
    return plan.keep(nodes)


def failed_upstream(plan: RelayPlan, node: str, *, lost: Collection[str],
                    broken: Collection[tuple[str, str]] = ()) -> str | None:
    """The failure that cut ``node`` off: the nearest node above it in its chain that is
    lost, or whose hop down the chain broke (then that feeder); None when there is none."""
    below, feeder = node, plan.feeder(node)
    while feeder is not None:
        if feeder in lost or (feeder, below) in broken:
            return feeder
        below, feeder = feeder, plan.feeder(feeder)
    return None


def choose_strategy(requested: str, streaming: Sequence[str], star_bytes: int | None = None) -> str:
    """``star`` or ``relay`` for a push to the nodes in ``streaming`` (those that need bytes).

    ``auto``: relay once RELAY_FROM_NODES or more nodes need the image, unless ``star_bytes``
    (what the star would send, summed over those nodes; None: not known) is under
    RELAY_FROM_BYTES."""
    if requested not in STRATEGIES:
        raise ValueError(f"unknown strategy {requested!r}")
    if requested != "auto":
        return requested
    if star_bytes is not None and star_bytes < RELAY_FROM_BYTES:
        return "star"
    return "relay" if len(streaming) >= RELAY_FROM_NODES else "star"
