"""The shell scripts clusterctl sends to nodes, read from the package's own files.

Each layer that runs shell on a node keeps its scripts as files in its own ``scripts/``
directory (``clusterctl/cluster/scripts/``, ``clusterctl/code/scripts/``), named after the
module that sends them, so that ``make lint`` can check them with shellcheck as the shell
they are.  The text a module sends is the file without what is there for the lint only:

* the first line when it is a shebang (``#!/bin/sh``: the dialect shellcheck checks; the
  node runs the text with ``sh -c``, never as a file);
* every line that is only a shellcheck directive (``# shellcheck disable=SC2086 # why``):
  a comment to sh, and the node needs no lint.

Everything else, blank lines and other comments included, is sent byte for byte.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

#: A line that is a shellcheck directive and nothing else (its reason may follow as a comment).
_DIRECTIVE = re.compile(r"[ \t]*# shellcheck [a-z-]+=.*\n?")


def script_body(text: str) -> str:
    """``text`` (a script file's content) without its shebang line and its directive lines
    (pure)."""
    lines = text.splitlines(keepends=True)
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    return "".join(line for line in lines if not _DIRECTIVE.fullmatch(line))


@functools.cache
def script_text(package: str, name: str) -> str:
    """The text to send of script ``name`` in ``package``'s ``scripts/`` directory, e.g.
    ``script_text("clusterctl.cluster", "tree-node.sh")``."""
    return script_body((resources.files(package) / "scripts" / name).read_text(encoding="utf-8"))

