"""Render a target's build context as text: facts in, text out (pure; golden-tested).

Rendering is strict and sandboxed: ``jinja2.sandbox.SandboxedEnvironment`` with
``StrictUndefined`` (an undefined variable is an error, never an empty string)
and only the values this module passes in.  Templates hold text; what differs
between stacks comes from ``clusterctl.image.targets`` (data).  Nothing here
writes a file or asks an engine: image/context.py writes what this renders,
image/pipeline.py builds it.

The checks of the options that shape a render (image references, build args)
live here too, so every caller checks them the same way before any work.

Contract:
    context_texts(resolved, *, offline) -> {"Dockerfile": text, "entrypoint.sh": text}
    dockerfile_text(target, *, torch, base_image, offline) -> str    (golden tests)
    entrypoint_text(target, *, torch) -> str                          (golden tests)
    resolve_checked(target, torch, *, base_image, tag) -> Resolved    (references checked)
    parse_build_args(["K=V", ...]) -> dict;  check_build_args(resolved, args) -> dict
    check_reference(ref, option) -> ref;  require_renderable(resolved)
    environment() -> the Jinja environment;  template_values(resolved, *, offline) -> dict
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from clusterctl.core import paths
from clusterctl.core.errors import ClusterctlError, UserError, one_of
from clusterctl.core.imageref import check_image
from clusterctl.core.text import control_problem, shown
from clusterctl.image.targets import Resolved, resolve

ENTRYPOINT_TEMPLATE = "blocks/entrypoint.sh.j2"
# Build args the engine accepts without an ARG in the Dockerfile.
PREDEFINED_BUILD_ARGS = frozenset(
    n for name in ("HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "ALL_PROXY")
    for n in (name, name.lower())
)
_BUILD_ARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


# ---------------------------------------------------------------- checks


def check_reference(ref: str, option: str) -> str:
    """``ref`` when it is a valid image reference; otherwise a UserError naming ``option``
    (:func:`clusterctl.core.imageref.check_image`, the one check of a reference)."""
    return check_image(ref, option)


def parse_build_args(items: Sequence[str]) -> dict[str, str]:
    """``["K=V", ...]`` as a dict; anything not ``NAME=VALUE`` is a UserError."""
    args: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not _BUILD_ARG_NAME.match(name):
            raise UserError(
                f"--build-arg {shown(item)} is not NAME=VALUE; expected e.g. --build-arg "
                "ACCL_INSTALLER_URL=http://host/accl.sh (NAME: letters, digits, _)."
            )
        problem = control_problem(value)
        if problem:   # the value is not quoted back: it may be a secret
            raise UserError(
                f"--build-arg {shown(name)}=...: the value {problem}; valid: one line of text "
                "without control characters, e.g. --build-arg HTTPS_PROXY=http://proxy:3128."
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
            f"--build-arg {shown(unknown[0])}: target {resolved.target.name} declares no such ARG. "
            f"Its build args: {valid}."
        )
    return {**declared, **args}


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
    if resolved.base_image != resolve(resolved.target.name, resolved.torch).base_image:
        argv += ["--base-image", resolved.base_image]
    return shlex.join(argv)


def template_values(resolved: Resolved, *, offline: bool) -> dict[str, object]:
    """Everything a template may use; anything else is undefined (an error)."""
    t = resolved.target
    installs_offline = offline or resolved.wheelhouse == "required"
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
        "tools": resolved.tool_requirements,
        "indexes": [i.model_dump() for i in resolved.indexes],
        "pip_command": resolved.pip,
        "pip_setup": resolved.pip_setup,
        "pip_flags": resolved.pip_flags,
        "wheelhouse": installs_offline,
        "install_stage": installs_offline and resolved.install_stage,
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


def require_renderable(resolved: Resolved) -> None:
    """A UserError unless ``resolved`` is rendered from a template (``base`` is debootstrapped)."""
    if not resolved.target.renderable:
        raise UserError(
            f"target {resolved.target.name} is not rendered from a template "
            f"({resolved.target.description}); build it with `clusterctl build --target "
            f"{resolved.target.name}`."
        )


def context_texts(resolved: Resolved, *, offline: bool) -> dict[str, str]:
    """The rendered files of the build context, by name (Dockerfile, entrypoint.sh).

    ``offline``: install from the context's wheels/ (as with --wheelhouse DIR).
    """
    require_renderable(resolved)
    env = environment()
    values = template_values(resolved, offline=offline)
    return {
        "Dockerfile": _render_template(env, resolved.target.template, values),
        "entrypoint.sh": _render_template(env, ENTRYPOINT_TEMPLATE, values),
    }


def resolve_checked(target: str, torch: str | None = None, *, base_image: str | None = None,
                    tag: str | None = None) -> Resolved:
    """``target`` resolved for ``torch``, after checking the image references the user gave."""
    if base_image is not None:
        check_reference(base_image, "--base-image")
    if tag is not None:
        check_reference(tag, "--tag")
    return resolve(target, torch, base_image=base_image)


def dockerfile_text(target: str, *, torch: str | None = None, base_image: str | None = None,
                    offline: bool = False) -> str:
    """The rendered Dockerfile only, written nowhere (``offline``: as with --wheelhouse)."""
    resolved = resolve_checked(target, torch, base_image=base_image)
    return context_texts(resolved, offline=offline)["Dockerfile"]


def entrypoint_text(target: str, *, torch: str | None = None) -> str:
    """The rendered entrypoint.sh only, written nowhere."""
    return context_texts(resolve_checked(target, torch), offline=False)["entrypoint.sh"]


