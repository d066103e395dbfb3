"""`clusterctl targets | render | build`: image targets, their Dockerfiles, their images.

Thin over clusterctl.targets (facts), clusterctl.render (rendering and the
build pipeline) and clusterctl.imagebuild (the engine build).  Every input is
checked before anything is written or any engine is asked; bad input is a
UserError (one message, exit 2).
"""

from __future__ import annotations

from pathlib import Path

import typer

from clusterctl import console
from clusterctl.console import err, out, print_table

TARGET_HELP = "Target to use (see `clusterctl targets`)."
TORCH_HELP = "torch version (targets with a version table; default: the table's default)."
WHEELHOUSE_HELP = "Install Python packages offline from this directory of wheels (no index)."
BASE_HELP = "Base image reference to build FROM instead of the target's default."


def targets() -> None:
    """List the build targets: base image, backend, torch versions and what a node needs."""
    from clusterctl.targets import load_targets, resolve

    rows = []
    for t in load_targets().values():
        base = resolve(t.name).base_image
        versions = t.torch_versions()
        torch = (f"{', '.join(versions)} (default {t.torch.default})" if t.torch
                 else (f"{t.pins['torch']} (base image)" if "torch" in t.pins else "-"))
        rows.append((t.name, base or "(debootstrap)", t.backend or "-", torch, t.needs))
    print_table("clusterctl build targets", ["target", "base image", "backend", "torch", "needs"], rows)


def render(
    target: str = typer.Option(..., "--target", "-t", help=TARGET_HELP),
    torch: str | None = typer.Option(None, "--torch", help=TORCH_HELP),
    wheelhouse: Path | None = typer.Option(None, "--wheelhouse", help=WHEELHOUSE_HELP),
    base_image: str | None = typer.Option(None, "--base-image", help=BASE_HELP),
    output: Path | None = typer.Option(None, "-o", "--output",
                                       help="Write here instead of dockerfiles/<target>/ (replaced as a whole)."),
) -> None:
    """Write a target's Dockerfile and build context; print the Dockerfile when no -o is given."""
    from clusterctl import render as r

    rendered = r.render(target, torch=torch, wheelhouse=wheelhouse, base_image=base_image, out_dir=output)
    if output is None:
        out.print(rendered.dockerfile, markup=False, highlight=False, end="")
    err.print(f"wrote {rendered.context_dir}/ (Dockerfile sha256 {rendered.dockerfile_sha256[:16]})",
              markup=False, highlight=False)
    if rendered.wheelhouse is None and _needs_wheelhouse(target):
        err.print(f"note: {target} installs offline from wheels/ in the context: pass --wheelhouse DIR, "
                  f"or let `clusterctl build --target {target}` prepare one.", markup=False, highlight=False)


def _needs_wheelhouse(target: str) -> bool:
    from clusterctl.targets import get_target

    return get_target(target).wheelhouse == "required"


def build(
    target: str = typer.Option(..., "--target", "-t", help=TARGET_HELP),
    tag: str | None = typer.Option(None, "--tag", help="Image tag (default: the target's, e.g. clusterctl/cpu:2.13.0)."),
    torch: str | None = typer.Option(None, "--torch", help=TORCH_HELP),
    build_arg: list[str] = typer.Option([], "--build-arg", help="NAME=VALUE for an ARG of the Dockerfile (repeatable)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not use the engine's build cache."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be built with which args; build nothing."),
    wheelhouse: Path | None = typer.Option(None, "--wheelhouse", help=WHEELHOUSE_HELP),
    base_image: str | None = typer.Option(None, "--base-image", help=BASE_HELP),
) -> None:
    """Render a target and build its image on the local Docker engine, then smoke-test it."""
    from clusterctl import engine, imagebuild
    from clusterctl import render as r

    plan = r.plan_build(target, tag=tag, torch=torch, build_args=r.parse_build_args(build_arg),
                        wheelhouse=wheelhouse, base_image=base_image)
    if dry_run:
        print_table(f"would build {plan.tag} (dry run: nothing built)", ["what", "value"], plan.describe())
        return
    client = engine.client()

    def log(line: str) -> None:
        out.print(line, markup=False, highlight=False)

    with imagebuild.BuildDisplay(f"building {plan.tag}", live=console.interactive()) as show:
        built = r.build_target(client, plan, nocache=no_cache, on_output=show, log=log)
    out.print(f"built {built.tag} ({built.image_id[:19]}); smoke test passed: "
              f"{built.smoke_output.strip().splitlines()[-1] if built.smoke_output.strip() else 'ok'}",
              markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("targets")(targets)
    app.command("render")(render)
    app.command("build")(build)
