"""A directory of wheels, made on the host, from which images install offline.

Containers here cannot verify TLS to package indexes (FIELD-NOTES §1) and
air-gapped clusters have none, so image builds never download: ``prepare``
runs ``pip download`` on the host into a cached wheelhouse and the build
context gets the wheels via ``link_into``.  The wheelhouse always holds pip's
own wheel, because the image runs pip from it (Debian's python3 has no pip):

    RUN set -- /tmp/wheels/pip-*.whl && python3 "$1/pip" install --no-index \
        --find-links /tmp/wheels --break-system-packages torch==2.13.0

Note the ``set --``: a shell glob never matches ``/tmp/wheels/pip-*.whl/pip``
(the wheel is a file, not a directory), so that spelling runs a literal ``*``.

Public API:
    prepare(requirements, *, python_version, platform, indexes, dest, log) -> wheelhouse dir (cached)
    validate(dir, *, require=("pip",)) -> Path       for a user's --wheelhouse DIR
    link_into(wheelhouse, target) -> target          hard links, copies across filesystems
    wheels(dir) -> sorted .whl paths
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.core.paths import cache_dir
from clusterctl.image.baseimage import run_logged

_logger = logging.getLogger(__name__)

MANIFEST = "clusterctl-wheelhouse.json"
_FORMAT = 1  # bump when the layout or the pip arguments change, so old caches are not reused


# pip's words for "these requirements cannot be met": bad input, not a broken machine
_UNSATISFIABLE = ("No matching distribution", "Could not find a version", "ResolutionImpossible")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _dist_name(requirement: str) -> str:
    return _canonical(re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0])


def requirement_name(requirement: str) -> str:
    """The distribution a requirement line names (``py-spy==0.4.3`` -> ``py-spy``)."""
    return re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0]


def wheels(directory: Path) -> list[Path]:
    """The .whl files directly in ``directory``, sorted by name."""
    return sorted(p for p in Path(directory).glob("*.whl") if p.is_file())


def _normalise(requirements: Sequence[str]) -> list[str]:
    """Stripped, de-duplicated, sorted requirements with pip added; rejects option-like values."""
    reqs = {r.strip() for r in requirements if r.strip()}
    for r in sorted(reqs):
        if r.startswith("-"):
            raise UserError(f"requirement {r!r} looks like a pip option; a wheelhouse takes "
                            "requirement specifiers only, like 'torch==2.13.0'.")
    if "pip" not in {_dist_name(r) for r in reqs}:
        reqs.add("pip")
    return sorted(reqs)


def cache_key(requirements: Sequence[str], python_version: str, platform: str | None,
              indexes: Sequence[str] = ()) -> str:
    """Short hash of everything that decides the wheelhouse's contents."""
    blob = json.dumps({"format": _FORMAT, "requirements": _normalise(requirements),
                       "python": python_version, "platform": platform, "indexes": list(indexes)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_dir(requirements: Sequence[str], python_version: str = "3.11",
                platform: str | None = None, indexes: Sequence[str] = ()) -> Path:
    return cache_dir() / "wheelhouse" / cache_key(requirements, python_version, platform, indexes)


def _manifest(directory: Path) -> dict | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def is_complete(directory: Path) -> bool:
    """True when ``directory`` holds a manifest and every wheel it lists, at the listed size."""
    files = (_manifest(directory) or {}).get("files")
    if not isinstance(files, dict):
        return False
    for name, size in files.items():
        try:
            if (directory / name).stat().st_size != size:
                return False
        except OSError:
            return False
    return bool(files)


def _pip_argv(dest: Path, reqs: list[str], python_version: str, platform: str | None,
              indexes: Sequence[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "pip", "download", "--dest", str(dest), "--progress-bar", "off",
            "--only-binary=:all:", "--python-version", python_version, *indexes]
    if platform:
        argv += ["--platform", platform]
    return argv + reqs


def _download(tmp: Path, reqs: list[str], python_version: str, platform: str | None,
              indexes: Sequence[str], log: Callable[[str], None]) -> None:
    code, tail = run_logged(_pip_argv(tmp, reqs, python_version, platform, indexes), log)
    if code == 0:
        return
    text = "\n".join(tail)
    msg = (f"pip download of {' '.join(reqs)} (python {python_version}, platform "
           f"{platform or 'this machine'}{', indexes ' + ' '.join(indexes) if indexes else ''}) "
           f"failed (exit {code}); last lines:\n{text}")
    if any(sign in text for sign in _UNSATISFIABLE):
        raise UserError(msg + "\nCheck the requirement names and versions, or pass --wheelhouse DIR.")
    raise ClusterctlError(msg)


def _write_manifest(directory: Path, reqs: list[str], python_version: str, platform: str | None,
                    indexes: Sequence[str] = ()) -> None:
    files = {p.name: p.stat().st_size for p in wheels(directory)}
    manifest = {"format": _FORMAT, "requirements": reqs, "python": python_version,
                "platform": platform, "indexes": list(indexes), "files": files}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _made_for(directory: Path, reqs: list[str], python_version: str, platform: str | None,
              indexes: Sequence[str] = ()) -> bool:
    m = _manifest(directory) or {}
    return ((m.get("requirements"), m.get("python"), m.get("platform"), m.get("indexes", []))
            == (reqs, python_version, platform, list(indexes)))


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished temp dir into place; a wheelhouse another process finished first wins."""
    try:
        os.rename(tmp, final)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not is_complete(final):
            raise


def prepare(requirements: Sequence[str], *, python_version: str = "3.11", platform: str | None = None,
            indexes: Sequence[str] = (), dest: Path | str | None = None,
            log: Callable[[str], None] = _logger.info) -> Path:
    """A complete wheelhouse for ``requirements`` (+ pip), downloaded once and reused after.

    Goes to ``dest`` or ``cache_dir()/wheelhouse/<hash of the inputs>``.  pip
    downloads into a temporary sibling directory that is renamed into place
    only when complete, so an interrupted run never leaves a wheelhouse that
    looks usable.  ``platform`` is a pip platform tag (``manylinux_2_28_x86_64``);
    None means this machine's.  ``indexes``: pip's index options besides PyPI, as the
    target's version table gives them (``--extra-index-url URL``, ``-f URL``), so that the
    wheelhouse holds what the online install would (e.g. oneccl_bind_pt, on Intel's index).
    """
    reqs = _normalise(requirements)
    final = Path(dest) if dest else default_dir(reqs, python_version, platform, indexes)
    if is_complete(final) and _made_for(final, reqs, python_version, platform, indexes):
        log(f"wheelhouse {final} is complete ({len(wheels(final))} wheels); reused")
        return final
    if final.exists():
        if dest:
            raise UserError(f"{final} exists but is not a complete wheelhouse made by clusterctl for "
                            f"{' '.join(reqs)} (python {python_version}; see its {MANIFEST}); "
                            "remove it or choose another directory.")
        shutil.rmtree(final)  # our own cache entry, damaged by hand
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        log(f"pip download {' '.join(reqs)} -> {final}")
        _download(tmp, reqs, python_version, platform, indexes, log)
        _write_manifest(tmp, reqs, python_version, platform, indexes)
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def validate(directory: Path | str, *, require: Iterable[str] = ("pip",)) -> Path:
    """Check a user's ``--wheelhouse DIR``: a directory of .whl files including ``require``.

    pip's own wheel is required by default because the image runs pip from it.
    """
    path = Path(directory).expanduser()
    expected = ("a directory of .whl files, e.g. made with `pip download -d DIR torch==2.13.0 pip` "
                "(it must include pip's own wheel)")
    if not path.is_dir():
        raise UserError(f"--wheelhouse {path}: no such directory; expected {expected}.")
    found = wheels(path)
    if not found:
        raise UserError(f"--wheelhouse {path}: holds no .whl file; expected {expected}.")
    have = {_canonical(w.name.split("-", 1)[0]) for w in found}
    missing = [r for r in require if _canonical(r) not in have]
    if missing:
        raise UserError(f"--wheelhouse {path}: has no wheel for {', '.join(missing)}; expected {expected}.")
    return path.resolve()


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copy2(src, dst)


def link_into(wheelhouse: Path | str, target: Path | str) -> Path:
    """Make ``target`` hold exactly the wheelhouse's wheels (e.g. ``context_dir / "wheels"``).

    Hard links when on the same filesystem (a 200 MB torch wheel costs nothing),
    copies otherwise.  Stale wheels already in ``target`` are removed.
    """
    source, target = Path(wheelhouse), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    wanted = wheels(source)
    names = {w.name for w in wanted}
    for stale in wheels(target):
        if stale.name not in names:
            stale.unlink()
    for w in wanted:
        dst = target / w.name
        dst.unlink(missing_ok=True)
        _link_or_copy(w, dst)
    return target
