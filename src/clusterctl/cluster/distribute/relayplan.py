"""Which node feeds which in a relay push: a pure plan from what each node needs.

One job: turn "node -> the layers it lacks" into chains of nodes that forward
while they receive.  Contract:

* :func:`plan_relay` - nodes that need the same layers form a group; each
  group becomes ``width`` chains (1 by default); the head feeds the first
  node of every chain, every other node is fed by the node before it;
* :class:`RelayPlan` - ``feeder(node)`` (None: the head), ``children(node)``,
  ``roots``, ``chains``, ``downstream(node)``, ``hops`` (node-to-node links);
* :func:`choose_strategy` - ``star`` or ``relay`` for a push.

Why chains: with every link at rate B, a chain moves S bytes to N nodes in
about (S + (N-1) x c)/B for a pipeline chunk c, and the head's uplink carries
S once instead of N x S (a star); a tree of fan-out k costs each inner node
k x S/B of upload.  A chain forwards one stream unchanged, so only nodes
that lack exactly the same layers can share one: each set of needs is its
own group, with its own stream from the head (nodes still get only what
they lack).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
