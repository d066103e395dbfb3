"""The build pipeline of one target: plan it (pure), then base image, wheelhouse, context, build, smoke.

``plan_build`` checks every input and renders in memory: nothing is written
and no engine is asked, so ``clusterctl build --dry-run`` is ``plan_build`` +
``BuildPlan.describe``.  ``build_target`` then carries the plan out on an
engine: the base image first (debootstrapped when it is the local one and
missing, otherwise present or pullable), a wheelhouse prepared on the host when
the image installs offline and none was given, the context written
(context.py), the image built and labelled (imagebuild.py, labels.py), and the
target's smoke command run in it.  An image whose smoke command fails is
untagged, so nothing launches it; the image a rebuild replaced is removed.

Progress goes to the caller's ``log`` (a line at a time) and the engine's
build output to ``on_output``; by default both go to this module's logger.

Contract:
    plan_build(target, *, tag, torch, build_args, wheelhouse, base_image, out_dir) -> BuildPlan
    BuildPlan.describe() -> [(what, value)] rows for --dry-run
    build_target(client, plan, *, nocache, on_output, log) -> Built
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.core.errors import ClusterctlError
from clusterctl.core.text import without_credentials
from clusterctl.image import baseimage, context, imagebuild, render
from clusterctl.image import wheelhouse as wh
from clusterctl.image.context import Rendered
from clusterctl.image.labels import sha256_text, target_labels
from clusterctl.image.targets import Resolved, get_target

if TYPE_CHECKING:
    from docker import DockerClient

_logger = logging.getLogger(__name__)


@dataclass
class BuildPlan:
    """Everything a build will do, decided and checked before anything is written or started."""

    resolved: Resolved
    tag: str
    build_args: dict[str, str]
    out_dir: Path
    wheelhouse: Path | None                 # the user's --wheelhouse, validated
    texts: dict[str, str] = field(default_factory=dict)   # rendered files (empty for base)

    @property
    def target(self) -> str:
        return self.resolved.target.name

    @property
    def dockerfile(self) -> str:
        return self.texts.get("Dockerfile", "")

    @property
    def needs_wheelhouse(self) -> bool:
        """True when the image installs offline and no --wheelhouse was given (build prepares one)."""
        return self.resolved.wheelhouse == "required" and self.wheelhouse is None

    @property
    def local_base(self) -> str | None:
        """The base image when it is the locally debootstrapped one (built first if missing)."""
        base = get_target("base")
        return self.resolved.base_image if self.resolved.base_image == base.tag else None

    def describe(self) -> list[tuple[str, str]]:
        """(what, value) rows for --dry-run: what would be built with which args."""
        r = self.resolved
        rows = [("target", self.target), ("tag", self.tag)]
        if r.target.renderable:
            rows += [
                ("torch", r.torch or f"{r.pins.get('torch', '?')} (from the base image)"),
                ("base image", str(r.base_image)
                 + (" (built first when missing: clusterctl build --target base)" if self.local_base else "")),
                ("Dockerfile", f"{self.out_dir / 'Dockerfile'} (sha256 {sha256_text(self.dockerfile)[:16]})"),
            ]
            rows += [("build arg", f"{k}={without_credentials(v)}")   # a proxy URL's password
                     for k, v in sorted(self.build_args.items())]
            if self.wheelhouse:
                rows.append(("wheelhouse", str(self.wheelhouse)))
            elif self.needs_wheelhouse:
                rows.append(("wheelhouse", "prepared on the host (pip download, cached): "
                             + " ".join([*r.requirements, *r.tool_requirements])
                             + "".join(f" {i.option} {i.url}" for i in r.indexes)))
        else:
            rows.append(("how", f"debootstrap {r.pins.get('debian', '')} + docker import, only when the "
                                "engine lacks the tag (--no-cache: always)"))
        rows.append(("smoke", shlex.join(r.smoke)))
        return rows


def plan_build(target: str, *, tag: str | None = None, torch: str | None = None,
               build_args: Mapping[str, str] | None = None, wheelhouse: Path | str | None = None,
               base_image: str | None = None, out_dir: Path | str | None = None) -> BuildPlan:
    """Check every input and render in memory; nothing is written and no engine is asked."""
    resolved = render.resolve_checked(target, torch, base_image=base_image, tag=tag)
    args = render.check_build_args(resolved, build_args or {})
    checked = context.check_options(resolved, base_image=base_image, wheelhouse=wheelhouse)
    texts = render.context_texts(resolved, offline=checked is not None) if resolved.target.renderable else {}
    return BuildPlan(resolved, tag or resolved.tag, args, Path(out_dir or context.default_dir(target)),
                     checked, texts)


# ---------------------------------------------------------------- build


@dataclass
class Built:
    tag: str
    image_id: str
    rendered: Rendered | None
    smoke_output: str


def build_target(client: DockerClient, plan: BuildPlan, *, nocache: bool = False,
                 on_output: Callable[[str], None] | None = None,
                 log: Callable[[str], None] = _logger.info) -> Built:
    """Build ``plan`` on ``client``'s engine, then run the target's smoke command in the image.

    For ``base`` this is baseimage.ensure_base_image.  A target on the local base
    builds the base first when the engine lacks it; a target that installs
    offline gets a wheelhouse prepared on the host when none was given.
    """
    r = plan.resolved
    if not r.target.renderable:
        image_id = baseimage.ensure_base_image(client, tag=plan.tag, rebuild=nocache, log=log)
        return Built(plan.tag, image_id, None, _smoke_or_untag(client, plan.tag, r.smoke))
    if plan.local_base:
        baseimage.ensure_base_image(client, tag=plan.local_base, log=log)
    else:
        _ensure_from_image(client, r.base_image, log)
    house = plan.wheelhouse
    if plan.needs_wheelhouse:
        house = wh.prepare([*r.requirements, *r.tool_requirements],
                           python_version=r.pins.get("python", "3.11"),
                           indexes=[a for i in r.indexes for a in i.pip_args()], log=log)
    context_dir = context.write_context(r, plan.texts, plan.out_dir, house)
    rendered = Rendered(target=plan.target, torch=r.torch, dockerfile=plan.dockerfile,
                        context_dir=context_dir, wheelhouse=house)
    log(f"rendered {context_dir}/Dockerfile")
    previous = _image_id(client, plan.tag)
    image_id = imagebuild.build(client, context_dir, tag=plan.tag, buildargs=plan.build_args,
                                labels=target_labels(r, plan.dockerfile), nocache=nocache,
                                on_output=on_output)
    smoke = _smoke_or_untag(client, plan.tag, r.smoke)
    for tool in r.tools:  # clusterctl's own tools (py-spy) must work in the image too
        _smoke_or_untag(client, plan.tag, tool.check)
    if previous and previous != image_id:
        _remove_replaced(client, previous)
    return Built(plan.tag, image_id, rendered, smoke)


def _smoke_or_untag(client: DockerClient, tag: str, argv: list[str]) -> str:
    """Run the smoke command; when it fails, untag the image so nothing launches it."""
    try:
        return imagebuild.run_smoke(client, tag, argv)
    except ClusterctlError as e:
        try:
            client.images.remove(tag)
        except Exception:  # noqa: BLE001 - best effort; the smoke failure is what to report
            pass
        raise ClusterctlError(f"{tag} was built but its smoke test failed, so the tag was removed. "
                              f"{e.message}") from None


def _ensure_from_image(client: DockerClient, ref: str, log: Callable[[str], None]) -> None:
    """The FROM image must be in the local engine or pullable; say which, before any work is done."""
    imagebuild.pull_if_missing(
        client, ref, log, what="base image",
        hint="Load it first (`docker load -i FILE`, e.g. the tarball a vendor such as Cambricon "
             "ships) or build FROM an image you have with --base-image REF.")


def _image_id(client: DockerClient, tag: str) -> str | None:
    # the docker SDK is heavy: loaded only when an engine is used
    from docker.errors import ImageNotFound

    try:
        return client.images.get(tag).id
    except ImageNotFound:
        return None


def _remove_replaced(client: DockerClient, image_id: str) -> None:
    """Drop the image a rebuild took the tag from (the created label alone makes a new id),
    so repeated builds do not pile up untagged images; kept when something still uses it."""
    # the docker SDK is heavy: loaded only when an engine is used
    from docker.errors import APIError

    try:
        if client.images.get(image_id).tags:  # another tag still names it: not ours to delete
            return
        client.images.remove(image_id, noprune=False)
    except APIError:
        pass
