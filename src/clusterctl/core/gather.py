"""Gathered output: the same output from many nodes shown once, as ``clush -b`` does.

One job: :func:`fold_outputs` - ``{node: (status, output)}`` -> :class:`Group` s, each
the nodes (folded: ``node[1-3]``) that gave exactly the same status and output, the
largest group first, then the odd ones out (ties in the order of their first node).
``status`` is any text that names how the node ended (``exit 0``, ``timeout``...): two
nodes whose outputs match but whose statuses differ are two groups.  Pure.

Contract: :func:`fold_outputs`, :class:`Group`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from clusterctl.core.hostlist import fold


@dataclass(frozen=True)
class Group:
    """Nodes that gave the same status and output."""

    nodes: tuple[str, ...]   # in the order given
    status: str
    output: str

    @property
    def folded(self) -> str:
        return fold(self.nodes)


def fold_outputs(results: Mapping[str, tuple[str, str]]) -> list[Group]:
    """``{node: (status, output)}`` -> groups, largest first, then by first node's order."""
    members: dict[tuple[str, str], list[str]] = {}
    for node, key in results.items():
        members.setdefault(key, []).append(node)
    order = {node: i for i, node in enumerate(results)}
    groups = [Group(tuple(nodes), status, output) for (status, output), nodes in members.items()]
    return sorted(groups, key=lambda g: (-len(g.nodes), order[g.nodes[0]]))


__all__ = ["Group", "fold_outputs"]
