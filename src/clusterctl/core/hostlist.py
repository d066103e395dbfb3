"""Host lists: many node names in one short text (``node[1-3,5]``), and back.

One job: :func:`fold` (names -> the folded text ClusterShell's ``clush -b`` and Slurm
print: ``node1 node2 node3 node5`` -> ``node[1-3,5]``) and its inverse :func:`expand`.
The syntax is Slurm's (python-hostlist, the library ``--nodes slurm`` already reads
``SLURM_JOB_NODELIST`` with): the last run of digits of each name is folded, a width
kept (``n[01-02]``), names without digits listed as they are.  Pure.

Contract: :func:`fold`, :func:`expand` (UserError on a text that is no host list).
"""

from __future__ import annotations

from collections.abc import Iterable

import hostlist

from clusterctl.core.errors import UserError


def fold(names: Iterable[str]) -> str:
    """``["node1", "node2", "node3", "node5"]`` -> ``"node[1-3,5]"`` (sorted, each name once)."""
    names = list(dict.fromkeys(names))
    return hostlist.collect_hostlist(names) if names else ""


def expand(text: str) -> list[str]:
    """``"node[1-3,5]"`` -> ``["node1", "node2", "node3", "node5"]``; UserError naming the
    text when it is no host list."""
    try:
        return hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as e:
        raise UserError(f"{text!r} is not a host list ({e}); valid: names and ranges such as "
                        "node[1-3,5],login1") from None


__all__ = ["expand", "fold"]
