"""A node's image store on a small file system of its own, and removing such mounts again.

For disk-full tests: :func:`limit_data_root` stops the node's dockerd, mounts a
fresh ext4 file system of the given size (a sparse image file, loop-mounted) over
the node's data root and starts dockerd again on it, so the node has a disk of
that size with an empty image store; ``size=None`` undoes it (dockerd stopped,
unmounted, the loop device detached, the file removed, dockerd started on the
store it had before).  A loop-mounted ext4 rather than a size-limited tmpfs: it
is a real disk file system (overlay2 on ext4, as on a node), ENOSPC comes from
the same code paths, and it does not count against the machine's memory.

Everything is derived from the sandbox name: the image file of node i is
``data_base()/<name>/node<i>.img``, mounted at the node's data root, so ``down``
(also after a crash) finds and removes it with :func:`unmount_all` and
:func:`detach_loops`.

Contract: :func:`limit_data_root`, :func:`data_root_limited`, :func:`image_file`,
:func:`unmount_all`, :func:`detach_loops`.  Imports the model and processes of the
sandbox package.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from pathlib import Path

from clusterctl.cluster import dockerd
from clusterctl.cluster.sandbox.model import SandboxNode, load
from clusterctl.cluster.sandbox.processes import processes_using, run, start_dockerd, terminate
from clusterctl.core.errors import UserError
from clusterctl.core.tools import require_binaries

_SIZE_RE = re.compile(r"^([0-9]+)([KMG])\Z")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
#: below this ext4 has no room for its journal and dockerd's own files
MIN_SIZE = 32 << 20


def parse_size(size: str) -> int:
    """Bytes of a size such as "256M" or "2G"; UserError otherwise."""
    m = _SIZE_RE.match(size or "")
    if not m or int(m.group(1)) * _UNITS[m.group(2)] < MIN_SIZE:
        raise UserError(f'invalid data root size "{size}": give a whole number with K, M or G, '
                        f"at least {MIN_SIZE >> 20}M, e.g. 256M.")
    return int(m.group(1)) * _UNITS[m.group(2)]


def image_file(node: SandboxNode) -> Path:
    """The node's file-system image (a sibling of its data root, so ``down`` removes it)."""
    return node.daemon.data_root.with_name(f"{node.name}.img")


def _mounts() -> list[str]:
    """Mount points, one entry per mount (a path mounted over twice is listed twice)."""
    targets = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            targets.append(line.split()[4].replace("\\040", " "))
    return targets


def data_root_limited(node: SandboxNode) -> bool:
    return image_file(node).exists()


def unmount_all(path: Path) -> None:
    """Unmount every mount at or below ``path``, deepest first, and again while any is
    left: mounts can be stacked on one path (dockerd may bind-mount its data root over
    itself, here over a loop mount).  Lazily: a killed daemon may have left a file open."""
    prefix = str(path) + "/"
    for _ in range(16):  # a few levels of stacking at most; never loop forever
        below = [t for t in _mounts() if t == str(path) or t.startswith(prefix)]
        if not below:
            return
        for target in sorted(set(below), key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, stdin=subprocess.DEVNULL)


def _loop_devices() -> dict[str, str]:
    """/dev/loopN -> its backing file, for every attached loop device."""
    found = {}
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            found[f"/dev/{backing.parent.parent.name}"] = backing.read_text().strip()
    return found


def detach_loops(path: Path) -> None:
    """Detach loop devices whose backing file is ``path`` or lies below it (deleted or not)."""
    prefix = str(path) + "/"
    for dev, backing in _loop_devices().items():
        backing = backing.removesuffix(" (deleted)")
        if backing == str(path) or backing.startswith(prefix):
            subprocess.run(["losetup", "-d", dev], capture_output=True, stdin=subprocess.DEVNULL)


def _stop_daemon(node: SandboxNode) -> None:
    """The node's dockerd and whatever it left (its containerd, shims) stopped."""
    dockerd.stop(node.daemon)
    terminate(processes_using(node.daemon.exec_root), grace=5.0)


def _release(node: SandboxNode) -> None:
    unmount_all(node.daemon.data_root)
    detach_loops(image_file(node))
    image_file(node).unlink(missing_ok=True)


def limit_data_root(name: str, node: str, size: str | None) -> None:
    """Give a node's dockerd a data root of ``size`` (e.g. "256M"): a fresh, empty image
    store on a file system of its own; None: back to the node's own store."""
    n = load(name).node(node)
    nbytes = None if size is None else parse_size(size)
    if nbytes is not None:
        require_binaries("mkfs.ext4", packages="e2fsprogs")
        require_binaries("mount", "umount", "losetup", packages="mount")
    _stop_daemon(n)
    _release(n)
    if nbytes is not None:
        img = image_file(n)
        try:
            img.parent.mkdir(parents=True, exist_ok=True)
            with open(img, "wb") as f:
                f.truncate(nbytes)
            # -m 0: no blocks reserved for root (dockerd is root: it would use them anyway)
            run(["mkfs.ext4", "-q", "-F", "-m", "0", str(img)], node=n.name)
            n.daemon.data_root.mkdir(parents=True, exist_ok=True)
            run(["mount", "-o", "loop", str(img), str(n.daemon.data_root)], node=n.name)
        except BaseException:
            _release(n)
            raise
    start_dockerd(n)
