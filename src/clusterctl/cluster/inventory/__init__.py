"""The inventory: which nodes a cluster has, and how clusterctl reaches them.

One file, three accepted formats (auto-detected, see ``detect_format``):

* a YAML inventory (documented by ``inventories/example.yaml``; read by ``yaml``),
* an MPI hostfile (``host``, ``user@host``, ``host:N`` or ``host slots=N [max_slots=M]``
  per line, ``#`` comments; read by ``hostfiles``),
* a DeepSpeed hostfile (``host slots=N`` per line; read by ``hostfiles``),

or the word ``slurm``: the nodes of the Slurm allocation clusterctl runs in
(``SLURM_JOB_NODELIST``, read by ``slurm`` with python-hostlist).

Everything is validated before anything touches a node, and every problem is reported in
our own words as ``FILE:LINE: field: problem; valid: ...`` (one line per problem, ALL
problems at once) through ``InventoryError`` (a ``UserError``, exit status 2): a newcomer
editing the file should be able to fix it in one pass.  Ranks: the master
(``master: true``, else the first node) is rank 0, then file order.

The package, along the way the data flows:

``model``      Node, SSHSettings, Inventory and rank order (no file is read there)
``checks``     pydantic errors in our words, rules across nodes, InventoryError
``hostfiles``  MPI and DeepSpeed hostfiles -> Inventory
``yaml``       YAML inventories -> Inventory (on ``core.yamlfile``)
``slurm``      ``--nodes slurm``: SLURM_JOB_NODELIST -> Inventory (Slurm's order = rank)

Contract (what other modules import from here): ``load_inventory``, ``detect_format``,
``inventory_from_slurm``, ``is_slurm``, ``SLURM_WORD``,
``Inventory``, ``Node``, ``SSHSettings``, ``rank_order``, ``InventoryError``, ``Problem``,
``DEFAULT_MASTER_PORT`` and the field tuples.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from clusterctl.cluster.inventory.checks import InventoryError
from clusterctl.cluster.inventory.hostfiles import read_hostfile
from clusterctl.cluster.inventory.model import (
    DEFAULT_FIELDS,
    DEFAULT_MASTER_PORT,
    NODE_FIELDS,
    SSH_FIELDS,
    TOP_FIELDS,
    Inventory,
    Node,
    SSHSettings,
    rank_order,
)
from clusterctl.cluster.inventory.slurm import SLURM_WORD, inventory_from_slurm, is_slurm
from clusterctl.cluster.inventory.yaml import read_yaml
from clusterctl.core.errors import UserError, did_you_mean
from clusterctl.core.gcpause import paused_gc
from clusterctl.core.yamlfile import Problem, read_text

__all__ = [
    "DEFAULT_FIELDS", "DEFAULT_MASTER_PORT", "NODE_FIELDS", "SSH_FIELDS", "TOP_FIELDS",
    "SLURM_WORD", "Inventory", "InventoryError", "Node", "Problem", "SSHSettings",
    "detect_format", "inventory_from_slurm", "is_slurm", "load_inventory", "rank_order",
]


#: Largest inventory file read (bytes): a 100,000-node YAML inventory or hostfile is a few
#: MB; a bigger file is a wrong path (a log, a disk image), refused before it fills memory.
MAX_BYTES = 16 * 1024 * 1024


def load_inventory(path: str | os.PathLike) -> Inventory:
    """Read and validate an inventory (YAML, MPI or DeepSpeed hostfile); InventoryError on bad input.

    The word ``slurm`` instead of a path: the nodes of the Slurm allocation this process
    runs in (:func:`~clusterctl.cluster.inventory.slurm.inventory_from_slurm`)."""
    if is_slurm(path):
        with paused_gc():  # a large allocation: millions of acyclic objects (see core.gcpause)
            return inventory_from_slurm(os.environ)
    path = Path(path)
    text = _read(path)
    with paused_gc():
        if detect_format(path, text) == "hostfile":
            return read_hostfile(path, text)
        return read_yaml(path, text)


def _read(path: Path) -> str:
    file = str(path)
    try:
        is_file = stat.S_ISREG(path.stat().st_mode)
    except FileNotFoundError:
        raise UserError(f"{file}: inventory file does not exist; valid: a YAML inventory "
                        "(see inventories/example.yaml), an MPI or a DeepSpeed hostfile") from None
    except OSError as e:   # a directory above it is closed to this user: another user's file
        raise UserError(f"{file}: cannot reach the inventory ({e.strerror or e}): a directory "
                        "above it is closed to you (another user's?); give --nodes an inventory "
                        "you can read") from None
    if not is_file:
        raise UserError(f"{file}: is not a file; valid: a YAML inventory, an MPI or a DeepSpeed hostfile")
    return read_text(path, "inventory", limit=MAX_BYTES)


_YAML_MARKERS = re.compile(r"---|\{|-(\s|\Z)|\s+[^\s#:]+\s*:(\s|\Z)")  # document, flow map, list, indented key
_TOP_KEY = re.compile(r"([A-Za-z_]+)\s*:(\s|\Z)")


def detect_format(path: Path, text: str) -> str:
    """"yaml" for .yaml/.yml files or text that is recognisably YAML; "hostfile" otherwise.

    Hostfile lines (``host``, ``host:4``, ``host slots=4``) are never indented
    keys, list items or flow mappings, and a top-level ``key:`` counts as YAML
    only when the key is (close to) an inventory section: so ``node9:`` in a
    hostfile is a host with a missing count, while ``node:`` (a typo of
    ``nodes:``) in a malformed inventory is still reported as YAML with its line.
    """
    if path.suffix.lower() in (".yaml", ".yml"):
        return "yaml"
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key = _TOP_KEY.match(line)
        if _YAML_MARKERS.match(line) or (key and (key[1] in TOP_FIELDS or did_you_mean(key[1], TOP_FIELDS))):
            return "yaml"
    return "hostfile"
