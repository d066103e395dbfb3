"""`clusterctl targets | render | build`: image targets, their Dockerfiles, their images.

Thin over clusterctl.image: targets (facts), context (render a target and write
its build context) and pipeline (plan and build an image); the build's output
is shown by cli/display.py.  Every input is checked before anything is written
or any engine is asked; bad input is a UserError (one message, exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from clusterctl.cli.display import BuildDisplay
from clusterctl.cluster import engine
from clusterctl.core import console
from clusterctl.core.console import err, out, print_table
from clusterctl.image.targets import load_targets, resolve

TARGET_HELP = "Target to use (see `clusterctl targets`)."
TORCH_HELP = "torch version (targets with a version table; default: the table's default)."
WHEELHOUSE_HELP = "Install Python packages offline from this directory of wheels (no index)."
BASE_HELP = "Base image reference to build FROM instead of the target's default."
OUTPUT_HELP = "Write here instead of dockerfiles/<target>/ (replaced as a whole)."
TAG_HELP = "Image tag (default: the target's, e.g. clusterctl/cpu:2.13.0)."
BUILD_ARG_HELP = "NAME=VALUE for an ARG of the Dockerfile (repeatable)."
DRY_RUN_HELP = "Print what would be built with which args; build nothing (no engine needed)."


def targets() -> None:
    """List the build targets: base image, backend, torch versions and what a node needs."""
    rows = []
    for t in load_targets().values():
        base = resolve(t.name).base_image
        versions = t.torch_versions()
        torch = (f"{', '.join(versions)} (default {t.torch.default})" if t.torch
                 else (f"{t.pins['torch']} (base image)" if "torch" in t.pins else "-"))
        rows.append((t.name, base or "(debootstrap)", t.backend or "-", torch, t.needs))
    print_table("clusterctl build targets", ["target", "base image", "backend", "torch", "needs"], rows)


def render(
    target: Annotated[str, typer.Option("--target", "-t", help=TARGET_HELP)],
    torch: Annotated[str | None, typer.Option("--torch", help=TORCH_HELP)] = None,
    wheelhouse: Annotated[Path | None, typer.Option("--wheelhouse", help=WHEELHOUSE_HELP)] = None,
    base_image: Annotated[str | None, typer.Option("--base-image", help=BASE_HELP)] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help=OUTPUT_HELP)] = None,
) -> None:
    """Write a target's Dockerfile and build context; print the Dockerfile when no -o is given."""
    from clusterctl.image import context  # jinja2 and the templates: only for render and build
    rendered = context.render_context(target, torch=torch, wheelhouse=wheelhouse, base_image=base_image,
                                      out_dir=output)
    if output is None:
        out.print(rendered.dockerfile, markup=False, highlight=False, end="")
    err.print(f"wrote {rendered.context_dir}/ (Dockerfile sha256 {rendered.dockerfile_sha256[:16]})",
              markup=False, highlight=False)
    if rendered.wheels_missing:
        err.print(f"note: {target} installs offline from wheels/ in the context: pass --wheelhouse DIR, "
                  f"or let `clusterctl build --target {target}` prepare one.", markup=False, highlight=False)


def build(
    target: Annotated[str, typer.Option("--target", "-t", help=TARGET_HELP)],
    tag: Annotated[str | None, typer.Option("--tag", help=TAG_HELP)] = None,
    torch: Annotated[str | None, typer.Option("--torch", help=TORCH_HELP)] = None,
    build_arg: Annotated[list[str] | None, typer.Option("--build-arg", help=BUILD_ARG_HELP)] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not use the engine's build cache.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=DRY_RUN_HELP)] = False,
    wheelhouse: Annotated[Path | None, typer.Option("--wheelhouse", help=WHEELHOUSE_HELP)] = None,
    base_image: Annotated[str | None, typer.Option("--base-image", help=BASE_HELP)] = None,
) -> None:
    """Render a target and build its image on the local Docker engine, then smoke-test it."""
    from clusterctl.image import pipeline  # jinja2 and the templates: only for render and build
    from clusterctl.image.render import parse_build_args
    plan = pipeline.plan_build(target, tag=tag, torch=torch, build_args=parse_build_args(build_arg or []),
                               wheelhouse=wheelhouse, base_image=base_image)
    if dry_run:
        print_table(f"would build {escape(plan.tag)} (dry run: nothing built)", ["what", "value"],
                    [[escape(str(c)) for c in row] for row in plan.describe()])   # values, not markup
        return
    client = engine.client()

    def log(line: str) -> None:
        out.print(line, markup=False, highlight=False)

    with BuildDisplay(f"building {plan.tag}", live=console.interactive()) as show:
        built = pipeline.build_target(client, plan, nocache=no_cache, on_output=show, log=log)
    out.print(f"built {built.tag} ({built.image_id[:19]}); smoke test passed: "
              f"{built.smoke_output.strip().splitlines()[-1] if built.smoke_output.strip() else 'ok'}",
              markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("targets")(targets)
    app.command("render")(render)
    app.command("build")(build)
