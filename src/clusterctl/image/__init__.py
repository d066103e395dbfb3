"""The image side: from a target's facts to a smoke-tested image on the local engine.

Data flows down this list; each module imports only the ones above it:

    targets     per-target facts from data/*.yaml, resolved for a --torch choice
    labels      the labels every image carries (OCI + io.clusterctl.*), defined once
    render      pure rendering: facts in, Dockerfile and entrypoint.sh text out (golden-tested)
    baseimage   the Debian base image, debootstrapped here and imported into the engine
    wheelhouse  a directory of wheels for offline installs: checked, prepared (pip download), linked
    context     a rendered build context written to disk atomically (examples/, wheels/, marker)
    imagebuild  build a context on the engine with streamed output; run a smoke command in an image
    pipeline    plan a build (pure: checks + render in memory), then carry it out
    deps        a project's requirements.txt as a cached image layer over any image, installed
                offline from wheels fetched here (launch --workdir)
    codeimage   a project's tree as a thin image layer at /workspace, for engines that need an
                image (Slurm/pyxis, Kubernetes exports)

Contract (what the CLI and other subpackages call):
    targets.load_targets() / get_target(name) / resolve(name, torch) -> Resolved
    render.dockerfile_text(target, ...) / entrypoint_text(target, ...) -> str
    context.render_context(target, *, torch, wheelhouse, base_image, out_dir) -> Rendered
    pipeline.plan_build(target, ...) -> BuildPlan;  BuildPlan.describe() -> dry-run rows
    pipeline.build_target(client, plan, *, nocache, on_output, log) -> Built
    imagebuild.run_smoke(client, image, argv) -> output
    deps.requirements_image(base_ref, requirements, *, client, log) -> DepsImage
    codeimage.code_image(base_ref, tree_tar, digest, *, workdir, client, log) -> ref

The library prints nothing: progress goes to the caller's ``log`` and build
output to ``on_output`` callbacks (the CLI's are in cli/display.py), by default
to the modules' loggers.  Bad input is a UserError (exit 2) raised before
anything is written or any engine is asked.
"""
