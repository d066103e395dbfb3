"""A project's code as one thin image layer, for engines that can only run an image.

An SSH launch mounts the code (a content-addressed copy on each node, read-only); Slurm with
pyxis and the Kubernetes exports cannot mount the head's copy, so they get an image: ``FROM
<base>`` + the tree at ``workdir`` in ONE layer + ``WORKDIR workdir`` + ``ENV
CLUSTERCTL_CODE_DIGEST=<digest>``, tagged ``clusterctl-code/<base repo slug>:<digest 12 hex>``.

``tree_tar`` is the deterministic tar of the tree (clusterctl.code.snapshot.write_tar: its
members are the project's files at its root).  The build context is made by re-packing those
members under ``root/<workdir>/`` next to a generated Dockerfile, with mtime 0, uid/gid 0, no
owner names and the members' permission bits (set-id and sticky bits dropped), and the
Dockerfile says ``COPY root/ /``: the workdir directory itself and its parents then come from
the context too, so the layer holds no time of the build and the same tree gives the same
layer digest on every build and machine.  (The image ID still differs from build to build:
the classic builder stamps the image config with its creation time.)

An image with the tag is reused without building when its labels say it was made from the
same digest, workdir and base image ID; otherwise it is built again (a moved base tag).

Public API:
    code_image(base_ref, tree_tar, digest, *, client, workdir="/workspace", log=None) -> ref
    code_tag(base_ref, digest) -> "clusterctl-code/<slug>:<12 hex>"
    write_context(tree_tar, fileobj, *, workdir, dockerfile)    the re-packed build context
"""

from __future__ import annotations

import io
import logging
import re
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from clusterctl import __version__
from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.image.deps import (
    base_attrs,
    dockerfile_labels,
    image_attrs,
    repo_slug,
)
from clusterctl.image.labels import LABEL_PREFIX

if TYPE_CHECKING:
    from docker import DockerClient

CODE_REPO = "clusterctl-code"
DIGEST_ENV = "CLUSTERCTL_CODE_DIGEST"
L_DIGEST = f"{LABEL_PREFIX}code.digest"
L_WORKDIR = f"{LABEL_PREFIX}code.workdir"
L_BASE_ID = f"{LABEL_PREFIX}code.base-id"
_CONTEXT_ROOT = "root"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_logger = logging.getLogger(__name__)


def check_digest(digest: str) -> str:
    if not _DIGEST.fullmatch(digest or ""):
        raise UserError(f"code digest {digest!r} is not valid; valid: 'sha256:' and 64 lower-case "
                        "hex digits (a tree's digest, clusterctl.code.snapshot).")
    return digest


def check_workdir(workdir: str) -> str:
    """An absolute path of plain names (it is written into the Dockerfile as it is)."""
    parts = PurePosixPath(workdir).parts if workdir.startswith("/") else ()
    if len(parts) < 2 or any(not _PART.fullmatch(p) for p in parts[1:]) or workdir.rstrip("/") != str(PurePosixPath(workdir)):
        raise UserError(f"workdir {workdir!r} is not valid in an image; valid: an absolute path "
                        "below / of letters, digits, '.', '_' and '-' (e.g. /workspace).")
    return str(PurePosixPath(workdir))


def code_tag(base_ref: str, digest: str) -> str:
    return f"{CODE_REPO}/{repo_slug(base_ref)}:{check_digest(digest).split(':', 1)[1][:12]}"


def _dockerfile(base_id: str, workdir: str, digest: str, labels: dict[str, str]) -> str:
    return (f"# clusterctl code layer: the project tree {digest} at {workdir}\n"
            f"FROM {base_id}\nCOPY {_CONTEXT_ROOT}/ /\nWORKDIR {workdir}\n"
            f"ENV {DIGEST_ENV}={digest}\n" + dockerfile_labels(labels))


def _info(name: str, kind: bytes, mode: int, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, linkname
    info.mtime = info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _member_name(member: tarfile.TarInfo, tree_tar: Path) -> str:
    name = member.name.rstrip("/")
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ClusterctlError(f"{tree_tar}: member {member.name!r} is not a relative path inside "
                              "the tree; the tree tar is clusterctl.code.snapshot.write_tar's output.")
    return name


def write_context(tree_tar: Path, fileobj: BinaryIO, *, workdir: str, dockerfile: str) -> None:
    """The build context as a tar: ``Dockerfile``, then ``root/`` + the workdir's directories,
    then every member of ``tree_tar`` under ``root/<workdir>/``, in the tree tar's order."""
    prefix = _CONTEXT_ROOT + workdir
    with tarfile.open(tree_tar, "r:*") as src, \
            tarfile.open(fileobj=fileobj, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8") as out:
        data = dockerfile.encode()
        out.addfile(_info("Dockerfile", tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        parts = prefix.split("/")
        for i in range(1, len(parts) + 1):
            out.addfile(_info("/".join(parts[:i]), tarfile.DIRTYPE, 0o755))
        for m in src:
            name = f"{prefix}/{_member_name(m, tree_tar)}"
            mode = m.mode & 0o777
            if m.isreg():
                out.addfile(_info(name, tarfile.REGTYPE, mode, m.size), src.extractfile(m))
            elif m.isdir():
                out.addfile(_info(name, tarfile.DIRTYPE, mode))
            elif m.issym():
                out.addfile(_info(name, tarfile.SYMTYPE, 0o777, linkname=m.linkname))
            elif m.islnk():
                target = f"{prefix}/{_member_name(tarfile.TarInfo(m.linkname), tree_tar)}"
                out.addfile(_info(name, tarfile.LNKTYPE, mode, linkname=target))
            else:
                raise ClusterctlError(f"{tree_tar}: member {m.name!r} is neither a file, a "
                                      "directory nor a link; a code tree holds only those.")


def _reusable(attrs: dict | None, digest: str, workdir: str, base_id: str) -> bool:
    labels = ((attrs or {}).get("Config") or {}).get("Labels") or {}
    return (labels.get(L_DIGEST), labels.get(L_WORKDIR), labels.get(L_BASE_ID)) == (digest, workdir, base_id)


def _build(client: DockerClient, context: BinaryIO, tag: str) -> str:
    """Build the context tar (custom_context: it is made here, not read from a directory)."""
    from docker.errors import APIError, BuildError  # heavy: only when an engine is used

    try:
        image, _ = client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True,
                                       forcerm=True, pull=False, network_mode="host")
    except BuildError as e:
        tail = [str(c.get("stream", c.get("error", ""))).rstrip() for c in e.build_log][-20:]
        raise ClusterctlError(f"building {tag} failed: {e.msg}\nlast lines of the build:\n"
                              + "\n".join(t for t in tail if t)) from None
    except APIError as e:
        raise ClusterctlError(f"building {tag} failed: {e.explanation or e}") from None
    return image.id


def _remove_untagged(client: DockerClient, image_id: str) -> None:
    """Drop the image the tag named before, unless another tag or a container still uses it."""
    from docker.errors import APIError  # heavy: only when an engine is used

    try:
        if not (image_attrs(client, image_id) or {}).get("RepoTags"):
            client.images.remove(image_id)
    except APIError:
        pass


def code_image(base_ref: str, tree_tar: Path | str, digest: str, *, workdir: str = "/workspace",
               client: DockerClient, log: Callable[[str], None] | None = None) -> str:
    """The ref of the image ``FROM base_ref`` with the tree of ``tree_tar`` at ``workdir``.

    Built only when the engine has no image with the tag made from this digest, workdir and
    base image ID; the image the tag named before (if any, and no longer tagged) is removed.
    """
    log = log or _logger.info
    digest, workdir = check_digest(digest), check_workdir(workdir)
    tree_tar = Path(tree_tar)
    if not tree_tar.is_file():
        raise UserError(f"code tree {tree_tar}: no such file; expected the tree's tar "
                        "(clusterctl.code.snapshot.write_tar).")
    tag = code_tag(base_ref, digest)
    base_id = base_attrs(client, base_ref, log)["Id"]
    previous = image_attrs(client, tag)
    if _reusable(previous, digest, workdir, base_id):
        log(f"code image {tag} holds tree {digest[:19]} at {workdir}; reused")
        return tag
    labels = {L_DIGEST: digest, L_WORKDIR: workdir, L_BASE_ID: base_id,
              f"{LABEL_PREFIX}version": __version__, "org.opencontainers.image.base.name": base_ref}
    with tempfile.TemporaryFile() as context:
        write_context(tree_tar, context, workdir=workdir,
                      dockerfile=_dockerfile(base_id, workdir, digest, labels))
        context.seek(0)
        image_id = _build(client, context, tag)
    if previous and previous["Id"] != image_id:
        _remove_untagged(client, previous["Id"])
    log(f"code image {tag} ({image_id[:19]}): tree {digest[:19]} at {workdir}")
    return tag
