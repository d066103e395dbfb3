"""Render a target's Dockerfile and build context from ``templates/``, and build it.

Rendering is strict and sandboxed: ``jinja2.sandbox.SandboxedEnvironment`` with
``StrictUndefined`` (an undefined variable is an error, never an empty string)
and only the values this module passes in.  Templates hold text; what differs
between stacks comes from ``clusterctl.targets`` (data).

A render is written to a temporary directory next to its destination and
renamed into place only when complete, so an error never leaves a
half-written ``dockerfiles/<target>/``.  Every input is checked before
anything is written (unknown target or torch version, malformed build arg,
missing wheelhouse, bad image reference): those are ``UserError``.

Public API:
    dockerfile_text(target, *, torch, base_image, offline) -> str    (pure; golden tests)
    render(target, *, torch, wheelhouse, base_image, build_args, out_dir) -> Rendered
    parse_build_args(["K=V", ...]) -> dict
    plan_build(target, *, tag, torch, build_args, wheelhouse, base_image, out_dir) -> BuildPlan
    build_target(client, plan, *, nocache, on_output, log) -> Built
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from clusterctl.build.targets import Resolved, get_target, resolve
from clusterctl.core import paths
from clusterctl.core.errors import ClusterctlError, EnvironmentProblem, UserError, one_of

DOCKERFILES_DIR = Path("dockerfiles")
RENDER_MARKER = ".clusterctl-render"   # marks a directory render() may replace
ENTRYPOINT_TEMPLATE = "blocks/entrypoint.sh.j2"
# Build args the engine accepts without an ARG in the Dockerfile.
PREDEFINED_BUILD_ARGS = frozenset(
    n for name in ("HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "ALL_PROXY")
    for n in (name, name.lower())
)
# A Docker image reference: [registry[:port]/]path[:tag][@sha256:digest].
_REFERENCE = re.compile(
    r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
_BUILD_ARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---------------------------------------------------------------- checks


def check_reference(ref: str, option: str) -> str:
    """``ref`` when it is a valid image reference; otherwise a UserError naming ``option``."""
    if not _REFERENCE.match(ref or ""):
        raise UserError(
            f"{option} {ref!r} is not a valid image reference; expected [REGISTRY/]NAME[:TAG], "
            "lowercase name, e.g. clusterctl/base:bookworm or nvcr.io/nvidia/pytorch:21.09-py3."
        )
    return ref


def parse_build_args(items: Sequence[str]) -> dict[str, str]:
    """``["K=V", ...]`` as a dict; anything not ``NAME=VALUE`` is a UserError."""
    args: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not _BUILD_ARG_NAME.match(name):
            raise UserError(
                f"--build-arg {item!r} is not NAME=VALUE; expected e.g. --build-arg "
                "ACCL_INSTALLER_URL=http://host/accl.sh (NAME: letters, digits, _)."
            )
        args[name] = value
    return args


def check_build_args(resolved: Resolved, args: Mapping[str, str]) -> dict[str, str]:
    """The target's build args with ``args`` applied; unknown names are a UserError."""
    declared = resolved.target.build_args
    unknown = [k for k in args if k not in declared and k not in PREDEFINED_BUILD_ARGS]
    if unknown:
        valid = one_of(sorted(declared)) if declared else "none (besides the proxy variables)"
        raise UserError(
            f"--build-arg {unknown[0]}: target {resolved.target.name} declares no such ARG. "
            f"Its build args: {valid}."
        )
    return {**declared, **args}


def check_wheelhouse(resolved: Resolved, wheelhouse: Path | str | None) -> Path | None:
    """A user's ``--wheelhouse DIR`` checked for this target (pip's wheel when the image needs it)."""
    if wheelhouse is None:
        return None
    from clusterctl.build import wheelhouse as wh

    require = ("pip",) if resolved.target.wheelhouse == "required" else ()
    return wh.validate(wheelhouse, require=require)


# ---------------------------------------------------------------- rendering


def _dq(value: object) -> str:
    """A double-quoted string as Dockerfile LABEL/ENV/ARG read it (JSON escaping)."""
    return json.dumps(str(value))


def environment() -> SandboxedEnvironment:
    """The Jinja environment: sandboxed, strict, loading only from the templates directory."""
    env = SandboxedEnvironment(
        loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["dq"] = _dq
    env.filters["sh"] = lambda v: shlex.quote(str(v))
    return env


def _command(resolved: Resolved) -> str:
    argv = ["clusterctl", "render", "--target", resolved.target.name]
    if resolved.target.torch is not None:
        argv += ["--torch", resolved.torch]
    return shlex.join(argv)


def template_values(resolved: Resolved, *, offline: bool) -> dict[str, object]:
    """Everything a template may use; anything else is undefined (an error)."""
    t = resolved.target
    return {
        "target": t.name,
        "description": t.description,
        "command": _command(resolved),
        "torch": resolved.torch or resolved.pins.get("torch"),
        "pins": resolved.pins,
        "base_image": resolved.base_image,
        "build_args": t.build_args,
        "env": t.env,
        "requirements": resolved.requirements,
        "indexes": [i.model_dump() for i in resolved.indexes],
        "pip_command": t.pip,
        "pip_setup": t.pip_setup or "",
        "pip_flags": t.pip_flags,
        "wheelhouse": offline or t.wheelhouse == "required",
        "entrypoint_env": resolved.entrypoint_env,
    }


def _render_template(env: SandboxedEnvironment, name: str, values: dict[str, object]) -> str:
    try:
        return env.get_template(name).render(**values)
    except jinja2.TemplateNotFound as e:
        raise ClusterctlError(f"template {e.name} not found under {paths.templates_dir()}") from None
    except jinja2.UndefinedError as e:
        raise ClusterctlError(f"template {name}: {e.message} (templates may only use the values "
                              f"clusterctl passes: {', '.join(sorted(values))})") from None
    except jinja2.TemplateError as e:
        raise ClusterctlError(f"template {name}: {e}") from None


def _require_renderable(resolved: Resolved) -> None:
    if not resolved.target.renderable:
        raise UserError(
            f"target {resolved.target.name} is not rendered from a template "
            f"({resolved.target.description}); build it with `clusterctl build --target "
            f"{resolved.target.name}`."
        )


def _texts(resolved: Resolved, *, offline: bool) -> dict[str, str]:
    """The rendered files of the build context, by name (Dockerfile, entrypoint.sh)."""
    _require_renderable(resolved)
    env = environment()
    values = template_values(resolved, offline=offline)
    return {
        "Dockerfile": _render_template(env, resolved.target.template, values),
        "entrypoint.sh": _render_template(env, ENTRYPOINT_TEMPLATE, values),
    }


def dockerfile_text(target: str, *, torch: str | None = None, base_image: str | None = None,
                    offline: bool = False) -> str:
    """The rendered Dockerfile only, written nowhere (``offline``: as with --wheelhouse)."""
    resolved = resolve(target, torch, base_image=base_image and check_reference(base_image, "--base-image"))
    return _texts(resolved, offline=offline)["Dockerfile"]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------- writing


@dataclass
class Rendered:
    """A rendered build context on disk."""

    target: str
    torch: str | None
    dockerfile: str
    context_dir: Path
    build_args: dict[str, str]
    labels: dict[str, str]
    tag: str
    smoke: list[str]
    wheelhouse: Path | None = None

    @property
    def dockerfile_sha256(self) -> str:
        return sha256_text(self.dockerfile)


def labels_for(resolved: Resolved, dockerfile: str) -> dict[str, str]:
    """OCI + io.clusterctl.* labels of the image (imagebuild.image_labels; created = now)."""
    from clusterctl.build.imagebuild import image_labels

    torch = resolved.torch or resolved.pins.get("torch")
    return image_labels(resolved.target.name, version=torch or resolved.target.name, torch=torch,
                        dockerfile_sha256=sha256_text(dockerfile),
                        source=(paths.templates_dir() / resolved.target.template).as_uri())


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


def _copy_examples(dest: Path) -> None:
    """The repository's examples/ (training scripts), baked into every image."""
    examples = paths.examples_dir()
    if examples.is_dir():
        shutil.copytree(examples, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        dest.mkdir()


def _copy_template_files(resolved: Resolved, tmp: Path) -> None:
    """Plain files next to the target's template (e.g. accl/patch_c10d.py), which its Dockerfile COPYs."""
    template_dir = paths.templates_dir() / Path(resolved.target.template).parent
    for extra in sorted(template_dir.iterdir()):
        if extra.is_file() and not extra.name.endswith(".j2"):
            (tmp / template_dir.name).mkdir(exist_ok=True)
            shutil.copy2(extra, tmp / template_dir.name / extra.name)


def _write_context(tmp: Path, texts: Mapping[str, str], resolved: Resolved, wheelhouse: Path | None) -> None:
    (tmp / "Dockerfile").write_text(texts["Dockerfile"])
    entry = tmp / "entrypoint.sh"
    entry.write_text(texts["entrypoint.sh"])
    entry.chmod(0o755)  # COPY keeps the mode; the classic builder has no COPY --chmod
    _copy_examples(tmp / "examples")
    _copy_template_files(resolved, tmp)
    if wheelhouse is not None:
        from clusterctl.build import wheelhouse as wh

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
    """Write the build context to ``dest`` atomically (temp dir next to it, then rename)."""
    dest = Path(dest)
    _check_destination(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        tmp.chmod(0o755)
        _write_context(tmp, texts, resolved, wheelhouse)
        _replace_dir(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def render(target: str, *, torch: str | None = None, wheelhouse: Path | str | None = None,
           base_image: str | None = None, build_args: Mapping[str, str] | None = None,
           out_dir: Path | str | None = None, tag: str | None = None) -> Rendered:
    """Render ``target`` into ``out_dir`` (default ``dockerfiles/<target>/``); returns what was written."""
    plan = plan_build(target, torch=torch, wheelhouse=wheelhouse, base_image=base_image,
                      build_args=build_args, out_dir=out_dir, tag=tag)
    _require_renderable(plan.resolved)
    return plan.write(plan.wheelhouse)


# ---------------------------------------------------------------- build pipeline


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
        return self.resolved.target.wheelhouse == "required" and self.wheelhouse is None

    @property
    def local_base(self) -> str | None:
        """The base image when it is the locally debootstrapped one (built first if missing)."""
        base = get_target("base")
        return self.resolved.base_image if self.resolved.base_image == base.tag else None

    def write(self, wheelhouse: Path | None) -> Rendered:
        context = write_context(self.resolved, self.texts, self.out_dir, wheelhouse)
        return Rendered(
            target=self.target, torch=self.resolved.torch, dockerfile=self.dockerfile,
            context_dir=context, build_args=self.build_args,
            labels=labels_for(self.resolved, self.dockerfile), tag=self.tag,
            smoke=self.resolved.smoke, wheelhouse=wheelhouse,
        )

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
            rows += [("build arg", f"{k}={v}") for k, v in sorted(self.build_args.items())]
            if self.wheelhouse:
                rows.append(("wheelhouse", str(self.wheelhouse)))
            elif self.needs_wheelhouse:
                rows.append(("wheelhouse", "prepared on the host (pip download, cached): "
                             + " ".join(r.requirements)))
        else:
            rows.append(("how", f"debootstrap {r.pins.get('debian', '')} + docker import, only when the "
                                "engine lacks the tag (--no-cache: always)"))
        rows.append(("smoke", shlex.join(r.smoke)))
        return rows


def plan_build(target: str, *, tag: str | None = None, torch: str | None = None,
               build_args: Mapping[str, str] | None = None, wheelhouse: Path | str | None = None,
               base_image: str | None = None, out_dir: Path | str | None = None) -> BuildPlan:
    """Check every input and render in memory; nothing is written and no engine is asked."""
    if base_image is not None:
        check_reference(base_image, "--base-image")
    if tag is not None:
        check_reference(tag, "--tag")
    resolved = resolve(target, torch, base_image=base_image)
    args = check_build_args(resolved, build_args or {})
    if not resolved.target.renderable:
        if base_image is not None or wheelhouse is not None:
            raise UserError(f"target {target} is debootstrapped, not rendered: --base-image and "
                            "--wheelhouse do not apply to it.")
        return BuildPlan(resolved, tag or resolved.tag, args, Path(out_dir or DOCKERFILES_DIR / target), None)
    checked = check_wheelhouse(resolved, wheelhouse)
    texts = _texts(resolved, offline=checked is not None)
    return BuildPlan(resolved, tag or resolved.tag, args, Path(out_dir or DOCKERFILES_DIR / target),
                     checked, texts)


@dataclass
class Built:
    tag: str
    image_id: str
    rendered: Rendered | None
    smoke_output: str


def _python_version(resolved: Resolved) -> str:
    return resolved.pins.get("python", "3.11")


def _smoke_or_untag(client, tag: str, argv: list[str]) -> str:
    """Run the smoke command; when it fails, untag the image so nothing launches it."""
    from clusterctl.build import imagebuild

    try:
        return imagebuild.run_smoke(client, tag, argv)
    except ClusterctlError as e:
        try:
            client.images.remove(tag)
        except Exception:  # noqa: BLE001 - best effort; the smoke failure is what to report
            pass
        raise ClusterctlError(f"{tag} was built but its smoke test failed, so the tag was removed. "
                              f"{e.message}") from None


def build_target(client, plan: BuildPlan, *, nocache: bool = False,
                 on_output: Callable[[str], None] | None = None,
                 log: Callable[[str], None] = print) -> Built:
    """Build ``plan`` on ``client``'s engine, then run the target's smoke command in the image.

    For ``base`` this is baseimage.ensure_base_image.  A target on the local base
    builds the base first when the engine lacks it; a target that installs
    offline gets a wheelhouse prepared on the host when none was given.
    """
    from clusterctl.build import baseimage, imagebuild
    from clusterctl.build import wheelhouse as wh

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
        house = wh.prepare(r.requirements, python_version=_python_version(r), log=log)
    rendered = plan.write(house)
    log(f"rendered {rendered.context_dir}/Dockerfile")
    previous = _image_id(client, plan.tag)
    image_id = imagebuild.build(client, rendered.context_dir, tag=plan.tag, buildargs=plan.build_args,
                                labels=rendered.labels, nocache=nocache, on_output=on_output)
    smoke = _smoke_or_untag(client, plan.tag, r.smoke)
    if previous and previous != image_id:
        _remove_replaced(client, previous)
    return Built(plan.tag, image_id, rendered, smoke)


def _ensure_from_image(client, ref: str, log: Callable[[str], None]) -> None:
    """The FROM image must be in the local engine or pullable; say which, before any work is done."""
    from docker.errors import APIError

    if _image_id(client, ref):
        return
    log(f"base image {ref} is not in the local engine; pulling it")
    try:
        client.images.pull(ref)
    except APIError as e:
        raise EnvironmentProblem(
            f"base image {ref} is not in the local Docker engine and cannot be pulled "
            f"({e.explanation or e}). Load it first (`docker load -i FILE`, e.g. the tarball a vendor "
            "such as Cambricon ships) or build FROM an image you have with --base-image REF."
        ) from None


def _image_id(client, tag: str) -> str | None:
    from docker.errors import ImageNotFound

    try:
        return client.images.get(tag).id
    except ImageNotFound:
        return None


def _remove_replaced(client, image_id: str) -> None:
    """Drop the image a rebuild took the tag from (the created label alone makes a new id),
    so repeated builds do not pile up untagged images; kept when something still uses it."""
    from docker.errors import APIError

    try:
        if client.images.get(image_id).tags:  # another tag still names it: not ours to delete
            return
        client.images.remove(image_id, noprune=False)
    except APIError:
        pass
