"""Write a target's build context to disk, atomically: what render.py renders, plus the files it COPYs.

A build context is a directory: the rendered Dockerfile and entrypoint.sh, the
repository's examples/, the plain files next to the target's template (e.g.
accl/patch_c10d.py), the wheelhouse as wheels/ when the image installs offline,
and a marker file that says clusterctl wrote it.  It is written to a temporary
directory next to its destination and renamed into place only when complete,
so an error never leaves a half-written ``dockerfiles/<target>/``; a directory
without the marker (the user's files) is never replaced.  Every input is
checked before anything is written: those are ``UserError``.

Contract:
    render_context(target, *, torch, wheelhouse, base_image, out_dir) -> Rendered   (`clusterctl render`)
    check_options(resolved, *, base_image, wheelhouse) -> validated wheelhouse or None
    write_context(resolved, texts, dest, wheelhouse) -> dest
    default_dir(target) -> dockerfiles/<target>
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterctl.core import paths
from clusterctl.core.errors import UserError
from clusterctl.core.invoker import hand_over_tree, owner_of_place
from clusterctl.image import render
from clusterctl.image import wheelhouse as wh
from clusterctl.image.labels import sha256_text
from clusterctl.image.targets import Resolved

DOCKERFILES_DIR = Path("dockerfiles")
RENDER_MARKER = ".clusterctl-render"   # marks a directory write_context may replace


@dataclass
class Rendered:
    """A rendered build context on disk."""

    target: str
    torch: str | None
    dockerfile: str
    context_dir: Path
    wheelhouse: Path | None = None
    wheels_missing: bool = False   # the image installs offline, but no wheels/ was written

    @property
    def dockerfile_sha256(self) -> str:
        return sha256_text(self.dockerfile)


def default_dir(target: str) -> Path:
    """Where a target's context goes without -o DIR."""
    return DOCKERFILES_DIR / target


# ---------------------------------------------------------------- checks


def check_options(resolved: Resolved, *, base_image: str | None = None,
                  wheelhouse: Path | str | None = None) -> Path | None:
    """The user's ``--wheelhouse DIR`` validated for this target (pip's wheel when the image needs
    it), or None; --base-image and --wheelhouse are refused for a debootstrapped target."""
    if not resolved.target.renderable:
        if base_image is not None or wheelhouse is not None:
            raise UserError(f"target {resolved.target.name} is debootstrapped, not rendered: "
                            "--base-image and --wheelhouse do not apply to it.")
        return None
    if wheelhouse is None:
        return None
    require = ("pip",) if resolved.wheelhouse == "required" else ()
    tools = tuple(wh.requirement_name(r) for r in resolved.tool_requirements)
    return wh.validate(wheelhouse, require=require + tools)


def _check_destination(dest: Path) -> None:
    """Refuse to replace a directory that is not an earlier render (it may hold the user's files)."""
    here = Path.cwd().resolve()
    if dest.resolve() == here or dest.resolve() in here.parents:
        raise UserError(f"output directory {dest} is the working directory or above it; a render "
                        "replaces its directory as a whole, so give a subdirectory with -o DIR.")
    if dest.exists() and not (dest / RENDER_MARKER).exists():
        if not dest.is_dir() or any(dest.iterdir()):
            raise UserError(
                f"output directory {dest} exists and was not written by `clusterctl render`; "
                "choose an empty or new directory with -o DIR (it is replaced as a whole)."
            )


# ---------------------------------------------------------------- writing


def _copy_examples(dest: Path) -> None:
    """The training scripts of the repository's examples/ (its files, e.g. ddp_smoke.py), baked
    into every image.  Its directories are example projects that `launch --workdir` ships
    (examples/own-project): they stay out, so editing one never changes an image."""
    examples = paths.examples_dir()
    dest.mkdir(parents=True, exist_ok=True)
    if examples.is_dir():
        for f in sorted(examples.iterdir()):
            if f.is_file() and f.suffix != ".pyc":
                shutil.copy2(f, dest / f.name)
    else:
        dest.mkdir()


def _copy_template_files(resolved: Resolved, tmp: Path) -> None:
    """Plain files next to the target's template (e.g. accl/patch_c10d.py), which its Dockerfile COPYs."""
    template_dir = paths.templates_dir() / Path(resolved.target.template).parent
    for extra in sorted(template_dir.iterdir()):
        if extra.is_file() and not extra.name.endswith(".j2"):
            (tmp / template_dir.name).mkdir(exist_ok=True)
            shutil.copy2(extra, tmp / template_dir.name / extra.name)


def _fill(tmp: Path, texts: Mapping[str, str], resolved: Resolved, wheelhouse: Path | None) -> None:
    (tmp / "Dockerfile").write_text(texts["Dockerfile"])
    entry = tmp / "entrypoint.sh"
    entry.write_text(texts["entrypoint.sh"])
    entry.chmod(0o755)  # COPY keeps the mode; the classic builder has no COPY --chmod
    _copy_examples(tmp / "examples")
    _copy_template_files(resolved, tmp)
    if wheelhouse is not None:
        wh.link_into(wheelhouse, tmp / "wheels")
    (tmp / RENDER_MARKER).write_text(f"{resolved.target.name}\n")


def _replace_dir(tmp: Path, dest: Path) -> None:
    """Put the finished ``tmp`` at ``dest``; the old render, if any, is removed after (or put back)."""
    if not dest.exists():
        tmp.rename(dest)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
    dest.rename(old / dest.name)
    try:
        tmp.rename(dest)
    except OSError:
        (old / dest.name).rename(dest)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def write_context(resolved: Resolved, texts: Mapping[str, str], dest: Path, wheelhouse: Path | None) -> Path:
    """Write the build context to ``dest`` atomically (temp dir next to it, then rename).
    Under sudo, into a place of the invoking user's (their checkout's ``dockerfiles/``), what
    is written becomes theirs, so that a later ``clusterctl render`` without sudo can
    replace it."""
    dest = Path(dest)
    _check_destination(dest)
    theirs = owner_of_place(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        tmp.chmod(0o755)
        _fill(tmp, texts, resolved, wheelhouse)
        _replace_dir(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if theirs is not None:
        hand_over_tree(dest, below=theirs[1], to=theirs[0])
    return dest


def render_context(target: str, *, torch: str | None = None, wheelhouse: Path | str | None = None,
                   base_image: str | None = None, out_dir: Path | str | None = None) -> Rendered:
    """Render ``target`` into ``out_dir`` (default ``dockerfiles/<target>/``); returns what was written."""
    resolved = render.resolve_checked(target, torch, base_image=base_image)
    checked = check_options(resolved, base_image=base_image, wheelhouse=wheelhouse)
    texts = render.context_texts(resolved, offline=checked is not None)
    context_dir = write_context(resolved, texts, Path(out_dir or default_dir(target)), checked)
    return Rendered(target=resolved.target.name, torch=resolved.torch, dockerfile=texts["Dockerfile"],
                    context_dir=context_dir, wheelhouse=checked,
                    wheels_missing=checked is None and resolved.wheelhouse == "required")
