"""``--nodes slurm``: the inventory of the Slurm allocation this process runs in.

Inside ``salloc``/``sbatch``, Slurm names the allocated nodes in
``SLURM_JOB_NODELIST`` in its compressed hostlist syntax (``node[1-3,5]``,
``a[01-02]b``); python-hostlist expands it in Slurm's order, which is also the
order of ``SLURM_NODEID``, so node rank 0 (the master) is Slurm's first node.
Each node's host is its name: SSH reaches it the way Slurm does (or through
``~/.ssh/config``).  Pure: the environment is an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import hostlist
from pydantic import ValidationError

from clusterctl.cluster.inventory.model import Inventory, Node
from clusterctl.core.errors import UserError

#: The word ``--nodes`` takes for "this Slurm allocation".
SLURM_WORD = "slurm"
NODELIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")


def is_slurm(nodes: object) -> bool:
    """Whether a ``--nodes`` value is the word ``slurm`` rather than a file."""
    return str(nodes) == SLURM_WORD


def inventory_from_slurm(environ: Mapping[str, str]) -> Inventory:
    """The allocation's nodes as an Inventory, in Slurm's order; UserError (exit 2) outside
    an allocation or on a hostlist Slurm would not write."""
    var = next((v for v in NODELIST_VARS if environ.get(v)), None)
    if var is None:
        raise UserError("--nodes slurm: SLURM_JOB_NODELIST is not set, so this is not inside a "
                        "Slurm allocation; valid: run under salloc/sbatch, or give --nodes FILE "
                        "(a YAML inventory or a hostfile).")
    text = environ[var]
    try:
        names = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as e:
        raise UserError(f"--nodes slurm: {var}={text!r} is not a Slurm hostlist ({e}); valid: "
                        "e.g. node[1-3,5] or a[01-02]b,c7.") from None
    if not names:
        raise UserError(f"--nodes slurm: {var} is empty; valid: the allocation's nodes, e.g. node[1-3].")
    try:
        nodes = [Node(name=n, host=n) for n in names]
    except ValidationError as e:
        raise UserError(f"--nodes slurm: {var}={text!r} names a node clusterctl cannot use as a "
                        f"host: {e.errors()[0]['msg']}") from None
    return Inventory(path=Path(f"<{var}>"), nodes=nodes, format="slurm")
