"""A Debian base image made on this machine: no image registry is reachable here.

``ensure_base_image`` runs ``debootstrap --variant=minbase`` into a temporary
rootfs and streams a tar of it straight into the engine's image import (the
API behind ``docker import -``), so no whole-image temp file is written.  The
Debian mirror is the one this machine's apt already uses (FIELD-NOTES §1: never
hard-code a host); ``mirror=`` or ``CLUSTERCTL_DEBIAN_MIRROR`` overrides it.
Downloaded .debs are kept in ``cache_dir()/debootstrap/<suite>`` so a rebuild
does not fetch them again.

Public API:
    ensure_base_image(client, tag=DEFAULT_TAG, *, suite, include, mirror, rebuild, log) -> image id
    apt_mirror(suite) -> mirror URL from /etc/apt/sources.list{,.d/*.list,.d/*.sources}
    check_can_build() -> raises EnvironmentProblem when not root / no debootstrap
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from clusterctl.core.errors import ClusterctlError, EnvironmentProblem, UserError
from clusterctl.core.files import one_at_a_time
from clusterctl.core.paths import cache_dir
from clusterctl.core.tools import require_binaries
from clusterctl.image.labels import image_labels

if TYPE_CHECKING:
    from docker import DockerClient

DEFAULT_TAG = "clusterctl/base:bookworm"
MIRROR_ENV = "CLUSTERCTL_DEBIAN_MIRROR"
SOURCES_LIST = Path("/etc/apt/sources.list")
SOURCES_DIR = Path("/etc/apt/sources.list.d")
# docker import gives an image no config at all; these make it behave like a normal base.
_IMAGE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["/bin/bash"]',
)
_TAIL = 20
_logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- apt sources


@dataclass
class AptSource:
    """One apt source entry, from either file format."""

    types: list[str]
    uris: list[str]
    suites: list[str]
    origin: str  # "file:line" for messages
    enabled: bool = True
    components: list[str] = field(default_factory=list)


_ONE_LINE = re.compile(r"^(?P<type>deb(?:-src)?)\s+(?:\[[^\]]*\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)(?P<rest>.*)\Z")


def parse_one_line(text: str, origin: str) -> list[AptSource]:
    """Entries of a classic ``sources.list`` (``deb [opts] URI SUITE COMPONENTS...``)."""
    found = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        m = _ONE_LINE.match(line)
        if m:
            found.append(AptSource([m["type"]], [m["uri"]], [m["suite"]], f"{origin}:{n}",
                                   components=m["rest"].split()))
    return found


def parse_deb822(text: str, origin: str) -> list[AptSource]:
    """Stanzas of a deb822 ``*.sources`` file (``Types:``, ``URIs:``, ``Suites:``, ``Enabled:``)."""
    found: list[AptSource] = []
    fields: dict[str, str] = {}
    key = None
    start = 1

    def flush() -> None:
        if fields:
            found.append(AptSource(
                types=fields.get("types", "").split(), uris=fields.get("uris", "").split(),
                suites=fields.get("suites", "").split(), origin=f"{origin}:{start}",
                enabled=fields.get("enabled", "yes").strip().lower() not in ("no", "false", "0"),
                components=fields.get("components", "").split(),
            ))
        fields.clear()

    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            flush()
            key = None
            continue
        if line[0] in " \t" and key:
            fields[key] += " " + line.strip()
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        if not fields:
            start = n
        key = name.strip().lower()
        fields[key] = value.strip()
    flush()
    return found


def read_apt_sources(sources_list: Path = SOURCES_LIST, sources_dir: Path = SOURCES_DIR) -> list[AptSource]:
    """Every entry in sources.list, sources.list.d/*.list and sources.list.d/*.sources, in apt's order."""
    entries: list[AptSource] = []
    if sources_list.is_file():
        entries += parse_one_line(sources_list.read_text(errors="replace"), str(sources_list))
    if sources_dir.is_dir():
        for f in sorted(sources_dir.iterdir()):
            if f.suffix == ".list":
                entries += parse_one_line(f.read_text(errors="replace"), str(f))
            elif f.suffix == ".sources":
                entries += parse_deb822(f.read_text(errors="replace"), str(f))
    return entries


def apt_mirror(suite: str, *, sources_list: Path = SOURCES_LIST, sources_dir: Path = SOURCES_DIR) -> str:
    """The first enabled ``deb`` URI that serves ``suite`` exactly (not ``suite-security``)."""
    for entry in read_apt_sources(sources_list, sources_dir):
        if entry.enabled and "deb" in entry.types and suite in entry.suites and entry.uris:
            return entry.uris[0]
    raise EnvironmentProblem(
        f"no apt source on this machine serves the Debian suite {suite!r} (read {sources_list} and "
        f"{sources_dir}/*.list, *.sources), so debootstrap has no mirror. Pass a mirror URL "
        f"(e.g. the one your apt uses for {suite}) or set {MIRROR_ENV}."
    )


def redact(url: str) -> str:
    """The URL without user:password, for logs and labels (a mirror may carry credentials)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


# ---------------------------------------------------------------- building


def check_can_build() -> None:
    """debootstrap needs root (mknod, chroot) and the debootstrap package."""
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "building the base image needs root: debootstrap creates device nodes and runs "
            "a chroot. Run it with sudo (or build on a machine where you are root)."
        )
    require_binaries("debootstrap", packages="debootstrap")


def _resolve_mirror(mirror: str | None, suite: str) -> str:
    mirror = mirror or os.environ.get(MIRROR_ENV) or apt_mirror(suite)
    if urlsplit(mirror).scheme not in ("http", "https", "file"):
        raise UserError(f"Debian mirror {redact(mirror)!r} is not an http://, https:// or file:// URL.")
    return mirror


def run_logged(argv: Sequence[str], log: Callable[[str], None]) -> tuple[int, list[str]]:
    """Run argv (a list), sending each output line to log; returns (exit status, last lines).

    Shared with wheelhouse.py: both run a long host tool whose progress the user should see.
    """
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, text=True, errors="replace") as proc:
        for line in proc.stdout:
            line = line.rstrip("\n")
            log(line)
            tail = (tail + [line])[-_TAIL:]
    return proc.returncode, tail


def debootstrap(rootfs: Path, *, suite: str, include: Sequence[str], mirror: str,
                log: Callable[[str], None]) -> None:
    """Run debootstrap minbase into rootfs; raise with its last lines when it fails."""
    debs = cache_dir() / "debootstrap" / suite
    debs.mkdir(parents=True, exist_ok=True)
    argv = ["debootstrap", "--variant=minbase", f"--cache-dir={debs.resolve()}"]
    if include:
        argv.append("--include=" + ",".join(include))
    argv += [suite, str(rootfs), mirror]
    code, tail = run_logged(argv, log)
    if code != 0:
        raise ClusterctlError(
            f"debootstrap of {suite} from {redact(mirror)} failed (exit {code}); last lines:\n"
            + "\n".join(tail)
        )


@dataclass
class _TarStatus:
    returncode: int | None = None
    stderr: str = ""


def _tar_stream(rootfs: Path, status: _TarStatus, chunk: int = 1 << 20) -> Iterator[bytes]:
    """A tar of rootfs as chunks, streamed from ``tar`` (never a whole-image file).

    Errors are recorded in ``status`` instead of raised: an exception inside the
    HTTP body would surface as an unrelated connection error.
    """
    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", "-", "."],
                                stdout=subprocess.PIPE, stderr=errf, stdin=subprocess.DEVNULL)
        try:
            while data := proc.stdout.read(chunk):
                yield data
        finally:
            proc.stdout.close()
            status.returncode = proc.wait()
            errf.seek(0)
            status.stderr = errf.read().decode(errors="replace")[-2000:]


def _label_changes(labels: dict[str, str]) -> list[str]:
    # json.dumps quotes and escapes the way the Dockerfile LABEL parser reads it.
    return [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items())]


def import_rootfs(client: DockerClient, rootfs: Path, tag: str, labels: dict[str, str]) -> str:
    """Stream rootfs into the engine as image ``tag``; returns the image id."""
    # the docker SDK is heavy: loaded only when an engine is used
    from docker.errors import APIError
    from docker.utils import parse_repository_tag

    repository, version = parse_repository_tag(tag)
    status = _TarStatus()
    try:
        client.api.import_image(src=_tar_stream(rootfs, status), repository=repository,
                                tag=version or "latest", stream_src=True,
                                changes=[*_IMAGE_CHANGES, *_label_changes(labels)])
    except APIError as e:
        raise ClusterctlError(f"the Docker engine refused to import {rootfs} as {tag}: "
                              f"{e.explanation or e}") from None
    image = client.images.get(tag)
    if status.returncode != 0:
        # The engine may have tagged a truncated rootfs: never leave that behind.
        client.images.remove(image.id, force=True)
        raise ClusterctlError(f"tar of {rootfs} failed (exit {status.returncode}): {status.stderr}")
    return image.id


def _remove_mounts_under(root: Path) -> None:
    """Unmount whatever debootstrap left mounted inside root (it mounts /proc, /sys) before rmtree."""
    prefix = str(root.resolve()) + "/"
    try:
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    except OSError:
        return
    for point in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _cleanup_rootfs(root: Path, log: Callable[[str], None]) -> None:
    _remove_mounts_under(root)
    still = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
             if str(root.resolve()) + "/" in line]
    if still:  # rmtree through a live /proc or /dev mount would be destructive
        log(f"warning: {root} still has mounts; left in place")
        return
    shutil.rmtree(root, ignore_errors=True)


def _existing(client: DockerClient, tag: str):
    # the docker SDK is heavy: loaded only when an engine is used
    from docker.errors import ImageNotFound

    try:
        return client.images.get(tag)
    except ImageNotFound:
        return None


def base_labels(suite: str, include: Sequence[str], mirror: str) -> dict[str, str]:
    """OCI labels plus io.clusterctl.* for the base image (target ``base``)."""
    return image_labels("base", version=suite, source=redact(mirror), extra={
        "io.clusterctl.debian.suite": suite,
        "io.clusterctl.debian.include": ",".join(include),
    })


def ensure_base_image(client: DockerClient, tag: str = DEFAULT_TAG, *, suite: str = "bookworm",
                      include: Sequence[str] = ("python3",), mirror: str | None = None,
                      rebuild: bool = False, log: Callable[[str], None] = _logger.info) -> str:
    """The id of image ``tag``, debootstrapping and importing it first when absent (or ``rebuild``).

    Idempotent: an existing tag is kept unless ``rebuild``.  Raises
    EnvironmentProblem (exit 2) when not root, debootstrap is missing, or no
    mirror is known; ClusterctlError when debootstrap or the import fails.
    The temporary rootfs is always removed.
    """
    old = _existing(client, tag)
    if old is not None and not rebuild:
        log(f"base image {tag} exists ({old.short_id}); kept")
        return old.id
    check_can_build()
    mirror = _resolve_mirror(mirror, suite)
    with _build_lock(suite, log):
        if not rebuild and (done := _existing(client, tag)) is not None:
            log(f"base image {tag} was built meanwhile ({done.short_id}); kept")
            return done.id
        return _build(client, tag, suite=suite, include=include, mirror=mirror, old=old, log=log)


def _build_lock(suite: str, log: Callable[[str], None]):
    """One base build per suite at a time on this machine: parallel test sessions and
    CLI runs share the .deb cache and usually want the same tag."""
    return one_at_a_time(cache_dir() / "debootstrap" / f"{suite}.lock", log, "base image build")


def _build(client: DockerClient, tag: str, *, suite: str, include: Sequence[str], mirror: str, old,
           log: Callable[[str], None]) -> str:
    rootfs = Path(tempfile.mkdtemp(prefix="clusterctl-rootfs-"))
    try:
        rootfs.chmod(0o755)  # becomes the image's "/": mkdtemp's 0700 would lock out non-root users
        log(f"rootfs {rootfs}")
        log(f"debootstrap {suite} (minbase, +{','.join(include) or 'nothing'}) from {redact(mirror)}")
        debootstrap(rootfs, suite=suite, include=include, mirror=mirror, log=log)
        log(f"importing {rootfs} as {tag}")
        image_id = import_rootfs(client, rootfs, tag, base_labels(suite, include, mirror))
    finally:
        _cleanup_rootfs(rootfs, log)
    if old is not None and old.id != image_id:
        _remove_quietly(client, old.id)
    log(f"base image {tag} is {image_id[:19]}")
    return image_id


def _remove_quietly(client: DockerClient, image_id: str) -> None:
    """Drop the image a rebuild replaced, unless other images are built on it."""
    # the docker SDK is heavy: loaded only when an engine is used
    from docker.errors import APIError

    try:
        client.images.remove(image_id)
    except APIError:
        pass
