"""Podman: the ``podman`` CLI on the node, rootful or rootless (the login user's own Podman).

Podman's CLI is docker's for every command clusterctl runs (``run --net=host``, ``ps
--filter label=``, ``inspect``, ``logs --timestamps``, ``wait``, ``load``, ``tag``, ...), so
this is :class:`DockerRuntime` with the few places where Podman answers differently said
here, so that every caller reads the same output from either runtime:

* an image's ``{{.Id}}`` (and a container's ``{{.Image}}``) is bare hex on Podman: the
  format asks for ``sha256:{{.Id}}``; an image has no ``.Metadata`` (its last tag time):
  ``{}`` stands in;
* ``stats`` formats docker's JSON keys itself (``{{json .}}`` has Podman's own);
* there is no daemon: :meth:`version` asks ``podman info`` (which opens the storage, so it
  fails where Podman cannot work) and :meth:`info` says ``.DockerRootDir`` as Podman's
  graph root and ``.InitBinary`` as ``catatonit`` (what ``run --init`` starts);
* GPUs only by CDI names (``gpu_style``);
* ``run`` leaves out ``--shm-size`` beside ``--ipc=host`` (docker ignores it there, as the
  host's /dev/shm is the container's; Podman refuses the pair: "cannot set shmsize when
  running in the host IPC Namespace").

Podman's own words for a missing image (``image not known``) are in ``missing_image``, read
by :meth:`~clusterctl.cluster.runtime.base.ContainerRuntime.is_missing_image`.
"""

from __future__ import annotations

from collections.abc import Sequence

from clusterctl.cluster.runtime.docker import DockerRuntime

#: ``podman stats``' fields as docker's ``{{json .}}`` names them (the base's contract)
STATS_FORMAT = ('{"ID":"{{.ID}}","Name":"{{.Name}}","CPUPerc":"{{.CPUPerc}}",'
                '"MemUsage":"{{.MemUsage}}"}')

#: docker info fields -> Podman's (``podman info`` has no InitBinary: ``run --init`` starts
#: catatonit, from containers.conf's ``init_path``, /usr/libexec/podman/ by default)
INFO_FIELDS = {".DockerRootDir": ".Store.GraphRoot", "{{.InitBinary}}": "/usr/libexec/podman/catatonit"}


def without_shm_size(options: Sequence[str]) -> list[str]:
    """``options`` without ``--shm-size V`` / ``--shm-size=V`` when they hold ``--ipc=host``
    (or ``--ipc host``); unchanged otherwise.  Pure."""
    args = list(options)
    host_ipc = "--ipc=host" in args or any(a == "--ipc" and b == "host" for a, b in zip(args, args[1:], strict=False))
    if not host_ipc:
        return args
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--shm-size":
            skip = True
        elif not a.startswith("--shm-size="):
            out.append(a)
    return out


class PodmanRuntime(DockerRuntime):
    """The ``podman`` CLI (see :class:`~clusterctl.cluster.runtime.base.ContainerRuntime`)."""

    name = "podman"
    binary = "podman"
    gpu_style = "cdi"
    missing_image = ("no such image", "image not known")

    def run(self, image, command, *, name=None, detach=False, remove=False, network=None,
            labels=None, options=(), env=(), env_names=(), env_file=None) -> list[str]:
        return super().run(image, command, name=name, detach=detach, remove=remove,
                           network=network, labels=labels, options=without_shm_size(options),
                           env=env, env_names=env_names, env_file=env_file)

    def stats(self, containers: Sequence[str]) -> list[str]:
        return [self.binary, "stats", "--no-stream", "--no-trunc", "--format", STATS_FORMAT,
                *containers]

    def image_inspect(self, images: Sequence[str], *, format: str) -> list[str]:
        return super().image_inspect(images, format=format.replace("{{.Id}}", "sha256:{{.Id}}")
                                     .replace("{{json .Metadata}}", "{}"))

    def inspect(self, containers: Sequence[str], *, format: str | None = None) -> list[str]:
        if format is not None:
            format = format.replace('"{{.Image}}"', '"sha256:{{.Image}}"')
        return super().inspect(containers, format=format)

    def version(self) -> list[str]:
        return [self.binary, "info", "--format", "{{.Version.Version}}"]

    def info(self, format: str) -> list[str]:
        for docker_field, podman_field in INFO_FIELDS.items():
            format = format.replace(docker_field, podman_field)
        return [self.binary, "info", "--format", format]
