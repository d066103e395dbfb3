#!/usr/bin/env python3
"""Make torch.distributed treat the ``accl`` backend like NCCL, or fail the build.

seeds/003 does this with three ``sed`` edits of distributed_c10d.py.  ``sed``
exits 0 when a pattern matches nothing, so on a torch whose file lacks the
anchors the build succeeded and the image was silently broken.  Here every
edit states how many places it must change; when the count differs the script
exits 1 with a message naming the edit and the torch version, and the file is
left untouched (all edits are applied in memory, checked, then written once).

What applies depends on the torch version (studied on the real files: Debian's
python3-torch 1.13.1 and the torch 2.13.0 wheel):

* torch 1.8 - 1.10 (NGC 21.09, the seed's base): the seed's edits 1 and 3.
  Edit 1 makes the object collectives (all_gather_object, ...) put their
  tensors on the GPU for accl as for nccl; edit 3 lets barrier(device_ids=...)
  accept accl.
* torch 1.11 - 1.13: ``is_nccl_backend =`` is gone; the object collectives ask
  ``_check_for_nccl_backend(group)`` instead, so that function is edited
  (``nccl-check``), plus the seed's edit 3 (``barrier-device-ids``).
* torch >= 2.0: nothing is patched.  ``Backend.register_backend(name, func,
  devices=[...])`` records which devices a third-party backend serves, and the
  object collectives and barrier consult that, so torch_accl registering
  ``accl`` with ``devices=["cuda"]`` is all it takes.  The script checks that
  this torch's register_backend has the ``devices`` parameter and leaves the
  file byte-identical.

The seed's edit 2 (``/GroupNCCL/ {N; /):/ s/:/ or get_backend(group) == "accl":/}``)
is not used: in 1.13.1 it matches nothing, and in 2.x its only hits are
``isinstance(..., ProcessGroupNCCL)`` checks in functions that have no
``group`` variable, where the added ``get_backend(group)`` would raise NameError.

Usage (in the image):  patch_c10d.py --file PATH --torch-version VERSION
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = "# clusterctl: accl patched"


@dataclass(frozen=True)
class Edit:
    name: str
    why: str
    pattern: str          # re.MULTILINE
    replacement: str
    count: int | None     # exact number of places; None: at least one

    def apply(self, text: str) -> tuple[str, int]:
        return re.subn(self.pattern, self.replacement, text, flags=re.MULTILINE)


IS_NCCL_BACKEND = Edit(
    name="is-nccl-backend",
    why="object collectives move their tensors to the GPU for accl as for nccl",
    pattern=r"^(\s*is_nccl_backend = )group_backend == Backend\.NCCL\s*$",
    replacement=r"\1group_backend != Backend.MPI and group_backend != Backend.GLOO",
    count=None,
)

NCCL_CHECK = Edit(
    name="nccl-check",
    why="_check_for_nccl_backend() (used by the object collectives) answers True for accl",
    pattern=r"^(\s*)(isinstance\(pg, ProcessGroupNCCL\))(\n\s*\)\s*$)",
    replacement=r'\1\2\n\1or get_backend(group) == "accl"\3',
    count=1,
)

BARRIER_DEVICE_IDS = Edit(
    name="barrier-device-ids",
    why="barrier(device_ids=...) accepts accl, not only nccl",
    pattern=r'^(\s*if get_backend\(group\) != Backend\.NCCL)(:\s*)$',
    replacement=r'\1 and get_backend(group) != "accl"\2',
    count=1,
)

# (first version, first version not covered, label) -> edits; versions as (major, minor).
PROFILES: list[tuple[tuple[int, int], tuple[int, int], str, list[Edit]]] = [
    ((1, 8), (1, 11), "1.8 to 1.10", [IS_NCCL_BACKEND, BARRIER_DEVICE_IDS]),
    ((1, 11), (2, 0), "1.11 to 1.13", [NCCL_CHECK, BARRIER_DEVICE_IDS]),
]
REGISTER_FROM = (2, 0)


class PatchError(Exception):
    """The file cannot be made to treat accl like nccl; the build must stop."""


def major_minor(version: str) -> tuple[int, int]:
    m = re.match(r"^(\d+)\.(\d+)", version)
    if not m:
        raise PatchError(f"cannot read a torch version from {version!r} (expected e.g. 1.10.0a0)")
    return int(m[1]), int(m[2])


def edits_for(version: str) -> list[Edit] | None:
    """The edits for this torch version; None when it registers instead of patching."""
    mm = major_minor(version)
    if mm >= REGISTER_FROM:
        return None
    for first, stop, _label, edits in PROFILES:
        if first <= mm < stop:
            return edits
    supported = ", ".join(label for _first, _stop, label, _edits in PROFILES)
    raise PatchError(f"torch {version} is not supported by the accl patch (patched: {supported}; "
                     f"from {REGISTER_FROM[0]}.{REGISTER_FROM[1]} on: register_backend)")


def patch_text(text: str, version: str) -> str:
    """The patched file text, or PatchError naming the edit that did not match as required."""
    edits = edits_for(version)
    if edits is None:
        raise PatchError(f"torch {version} needs no patch (register_backend)")
    for edit in edits:
        text, n = edit.apply(text)
        expected = "at least 1" if edit.count is None else str(edit.count)
        if n == 0 or (edit.count is not None and n != edit.count):
            raise PatchError(
                f"edit {edit.name!r} ({edit.why}) changed {n} place(s) in distributed_c10d.py of "
                f"torch {version}, expected {expected}: this torch's file does not have the "
                f"anchor /{edit.pattern}/. The image would not treat accl like nccl; refusing."
            )
    try:
        ast.parse(text)
    except SyntaxError as e:
        raise PatchError(f"the patched distributed_c10d.py of torch {version} is not valid Python "
                         f"(line {e.lineno}: {e.msg}); refusing") from None
    return f"{text.rstrip()}\n{MARKER} ({', '.join(e.name for e in edits)})\n"


def register_backend_has_devices(text: str) -> bool:
    """True when class Backend's register_backend takes a ``devices`` argument (torch >= 2.0)."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == "Backend":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "register_backend":
                    names = [a.arg for a in item.args.args + item.args.kwonlyargs]
                    return "devices" in names
    return False


def run(path: Path, version: str) -> str:
    """Patch ``path`` in place (or check the register path); returns what was done."""
    text = path.read_text()
    if MARKER in text:
        return f"{path}: already patched for accl (torch {version}); nothing to do"
    if edits_for(version) is None:
        if not register_backend_has_devices(text):
            raise PatchError(
                f"torch {version}: Backend.register_backend in {path} has no 'devices' parameter, "
                "so accl cannot be registered as a GPU backend and there is nothing to patch; refusing"
            )
        return (f"torch {version}: {path} left unchanged; accl registers through "
                "torch.distributed.Backend.register_backend('accl', func, devices=['cuda']) "
                "when torch_accl is imported")
    patched = patch_text(text, version)
    path.write_text(patched)
    return f"{path}: patched for accl (torch {version}): " + ", ".join(e.name for e in edits_for(version))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", required=True, type=Path, help="torch/distributed/distributed_c10d.py")
    ap.add_argument("--torch-version", required=True, help="torch.__version__ of that file's torch")
    args = ap.parse_args(argv)
    try:
        print(run(args.file, args.torch_version))
    except (PatchError, OSError) as e:
        print(f"accl patch FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
