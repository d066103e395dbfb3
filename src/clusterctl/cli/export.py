"""`clusterctl export JOB --to pytorchjob|trainjob --nnodes N`: the job as a Kubernetes manifest.

Parsing and writing only, over the Kubernetes backend (:mod:`clusterctl.run.backends.kubernetes`,
which renders only: :func:`clusterctl.run.export.build_manifest`, pure).  The
YAML goes to stdout, or with ``-o FILE`` to that file (written whole, atomically, only
when the manifest could be built: bad input writes nothing and exits 2).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from clusterctl.cluster.registry import lookup
from clusterctl.cluster.registry.reference import Registry, registry_option
from clusterctl.core.console import err
from clusterctl.core.errors import UserError
from clusterctl.core.files import write_atomic
from clusterctl.core.imageref import check_image
from clusterctl.core.text import escaped, shown
from clusterctl.run import backends
from clusterctl.run import export as exporting
from clusterctl.run import workspace as workspaces
from clusterctl.run.jobs import load_job
from clusterctl.run.plan import image_of, parse_sets


def export(
    job: Annotated[str, typer.Argument(help="A shipped job (a file of jobs/ by its name: ddp-smoke, bert, ...) or the path of a job YAML file.",
                                       show_default=False)],
    to: Annotated[str, typer.Option("--to", help="pytorchjob (Kubeflow training operator, kubeflow.org/v1) "
                                                 "or trainjob (Kubeflow Trainer v2, trainer.kubeflow.org/v1alpha1).",
                                    show_default=False)],
    nnodes: Annotated[int, typer.Option("--nnodes", help="Number of nodes (pods), as in torchrun.",
                                        show_default=False)],
    slots: Annotated[int, typer.Option(
        "--slots", help="Accelerators (processes) per node, as an inventory's `slots`: the GPU "
                        "count and nproc_per_node: slots.")] = 1,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="NAME=VALUE",
        help="Set a job parameter or container env variable (repeatable; value taken as typed).")] = None,
    image: Annotated[str | None, typer.Option("--image", help="The image the cluster pulls (default: the job's).")] = None,
    registry: Annotated[str | None, typer.Option(
        "--registry", metavar="HOST[:PORT][/NS]",
        help="Name the image as pushed to this registry, by digest (HOST[:PORT]/[NS/]NAME@sha256:...), "
             "from this machine's Docker engine's record of the push (`clusterctl push IMAGE "
             "--registry ...`); exit 2 when it was not pushed there. With credentials for it in "
             "the Docker config (`docker login`), the pods pull with a Secret (--pull-secret).")] = None,
    pull_secret: Annotated[str | None, typer.Option(
        "--pull-secret", metavar="NAME",
        help="The Secret (type docker-registry) the pods pull the image with: imagePullSecrets. "
             "Default: <job>-registry when --registry has credentials in the Docker config, else "
             "none. stderr says how to create it (credentials elided).")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="metadata.namespace (default: none; kubectl's).")] = None,
    runtime: Annotated[str, typer.Option("--runtime", help="trainjob: the ClusterTrainingRuntime to use.")] = exporting.DEFAULT_RUNTIME,
    rdma_resource: Annotated[str, typer.Option(
        "--rdma-resource", help="Resource name of the site's RDMA device plugin, for /dev/infiniband.")] = exporting.DEFAULT_RDMA_RESOURCE,
    secret_name: Annotated[str | None, typer.Option(
        "--secret-name", metavar="NAME",
        help="The Secret the job's secrets are read from (secretKeyRef; default: <job>-secrets). "
             "A secret given a value (job, --set) is read from it too: the value is never written.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the manifest to FILE (default: stdout).")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", metavar="DIR",
        help="Your project: built into a thin image layer at /workspace over the job's image "
             "(its requirements too), which the manifest names. Job key: workdir.")] = None,
) -> None:
    """Write JOB as a Kubeflow PyTorchJob or TrainJob manifest (YAML): the same image, command,
    env (rank variables left to the operator), devices, /dev/shm, host network, mounts and
    secrets (as references to the Secret <job>-secrets, or --secret-name; stderr says how to
    create it, values elided) as an SSH launch.  With --registry the image is named by digest
    as pushed there.  No cluster (nor registry) is contacted."""
    reg = registry_option(registry)
    if image is not None:
        check_image(image, "--image")     # before a workdir image is built or an engine asked
    spec = load_job(job, {"workdir": str(workdir)} if workdir is not None else None)
    if spec.workdir is not None:
        image = _code_image(spec, image, reg)
    if reg is not None:
        local = image_of(spec, image)
        if local is None:
            raise UserError(f"{spec.path}: job {spec.name} has no image: give `image` or `target`, or --image.")
        image = lookup.pinned_reference(local, reg)
    if pull_secret is None and reg is not None and lookup.has_credentials(reg):
        pull_secret = exporting.pull_secret_name(spec)
    manifest = backends.BACKENDS["kubernetes"].render(
        spec, kind=to, nnodes=nnodes, slots=slots, image=image, overrides=parse_sets(set_ or [], os.environ),
        namespace=namespace, runtime=runtime, rdma_resource=rdma_resource, secret_name=secret_name,
        pull_secret=pull_secret, registry_server=reg.address if reg is not None else None)
    text = manifest.text()
    if output is None:
        typer.echo(text, nl=False)
    else:
        _write(output, text)
        err.print(f"wrote {manifest.body['kind']} {manifest.body['metadata']['name']} to {escaped(str(output))}",
                  markup=False, highlight=False)
    if manifest.secret_name:
        given = manifest.secret_given
        err.print(f"the manifest reads {', '.join(manifest.secret_keys)} from the Secret "
                  f"{manifest.secret_name}; create it before applying (each ... is the value):\n"
                  f"  {manifest.secret_command()}"
                  + (f"\n(the value{'s' if len(given) > 1 else ''} given by {', '.join(given.values())} "
                     f"{'are' if len(given) > 1 else 'is'} written nowhere)" if given else ""),
                  markup=False, highlight=False, soft_wrap=True)
    if manifest.pull_secret:
        where = (" (a runtime patch of the runtime's node pods: a TrainJob's own spec has no "
                 "imagePullSecrets)" if to == "trainjob" else "")
        err.print(f"the pods pull {escaped(manifest.image)} with the Secret {escaped(manifest.pull_secret)}{where}; "
                  "create it before applying (the username and password of your `docker login`, "
                  f"elided here):\n  {escaped(manifest.pull_secret_command())}",
                  markup=False, highlight=False, soft_wrap=True)


def _code_image(spec, image: str | None, registry: Registry | None = None) -> str:
    """The job's workdir as an image over its image; stderr says the cluster must be able to
    pull it."""
    base = image_of(spec, image)
    if base is None:
        raise UserError(f"{spec.path}: job {spec.name} has no image: give `image` or `target`, or --image.")
    ws = workspaces.prepare(spec, base, log=_note)
    ref = workspaces.code_image(ws, base, log=_note)
    if registry is None:
        err.print(f"note: the manifest names {ref}, your code ({ws.tree.digest}) at /workspace over "
                  f"{ws.image or base}, built in this machine's Docker engine. A cluster pulls from a "
                  f"registry: `{lookup.push_command(ref, Registry('REGISTRY'))}`, then export again "
                  "with --registry REGISTRY (the manifest names it by digest).",
                  markup=False, highlight=False, soft_wrap=True)
    return ref


def _note(line: str) -> None:
    err.print(line, markup=False, highlight=False)


def _write(path: Path, text: str) -> None:
    """``text`` to ``path`` whole or not at all (a temporary file in the same directory, renamed)."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"-o {shown(str(path))}: directory {shown(str(parent))} does not exist; valid: "
                        "a file in an existing directory.")
    if path.is_dir():
        raise UserError(f"-o {shown(str(path))}: is a directory; valid: a file name, e.g. "
                        f"{shown(str(path / 'job.yaml'))}.")
    if path.exists() and not path.is_file():   # the file is replaced whole: never a device node
        raise UserError(f"-o {shown(str(path))}: is not a regular file (a device, a pipe or a "
                        "socket), which writing the manifest would replace; valid: a file name, "
                        "or leave -o out to print the manifest.")
    write_atomic(path, text)


def register(app: typer.Typer) -> None:
    app.command("export")(export)
