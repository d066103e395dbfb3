"""What a container runtime on a node must say: the argv of each operation clusterctl asks of it.

Pure: every method returns an argv list (the node's command, run over SSH as is, never
through a shell) and touches nothing.  The callers (``cluster.containers``, ``cluster.preflight``,
``cluster.distribute.node``, ``run.plan``, ``run.faults``, ``run.supervise``) run it on the
node's connection and read its output; what they read is part of the contract:

* :meth:`ContainerRuntime.inspect` without a format prints a JSON list, one object per
  container, with ``Name``, ``State.Status`` / ``ExitCode`` / ``StartedAt`` / ``FinishedAt``
  (RFC 3339) and ``Config.Labels`` (what ``cluster.containers.state_from_inspect`` reads);
* :meth:`ps` prints container IDs, one a word; :meth:`wait` the exit code as its last word;
  :meth:`logs` with ``timestamps`` starts each line with an RFC 3339 UTC time and a space;
* :meth:`load` reads an image archive on stdin and prints ``Loaded image ID: sha256:...``;
  :meth:`image_inspect` with a Go-template format prints one line per image;
* :meth:`exec_interactive` runs on a terminal the node's SSH channel has and exits with the
  command's status;
* :meth:`version` prints the engine's version and exits 0 only when the engine answers;
  :meth:`info` with ``DOCKER_INFO_FORMAT``-style templates prints those fields.

A second runtime is one module beside ``docker.py`` (subclass this, or ``DockerRuntime``
where its CLI is docker's) and one entry in :data:`clusterctl.cluster.runtime.RUNTIMES`.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

from clusterctl.core.text import digits


def cdi_names(gpus: str) -> list[str]:
    """Docker's ``--gpus`` value -> the CDI device names it stands for: ``all`` -> [all],
    ``2`` / ``count=2`` -> [0, 1], ``device=0,2`` or ``"device=GPU-..."`` -> those (pure)."""
    value = gpus.strip().strip('"').strip("'")
    if value in ("all", "count=all"):
        return ["all"]
    count = value.split("=", 1)[1] if value.startswith("count=") else value
    if digits(count):
        return [str(i) for i in range(int(count))]
    if value.startswith("device="):
        return [d.strip() for d in value.split("=", 1)[1].split(",") if d.strip()]
    raise ValueError(f"--gpus {gpus!r}: valid: all, N, count=N or device=I[,J...]")


class ContainerRuntime(ABC):
    """One container runtime's command lines on a node (see the module docstring)."""

    #: the name an inventory gives it (``docker``); the key in ``RUNTIMES``
    name: ClassVar[str]
    #: the command on the node (``docker``)
    binary: ClassVar[str]
    #: how the runtime takes GPUs: "flag" (docker's ``--gpus VALUE``) or "cdi" (only CDI
    #: device names, ``--device=nvidia.com/gpu=all``: Podman); see :meth:`gpu_options`
    gpu_style: ClassVar[str] = "flag"
    #: what its stderr says (lowercased) when an image asked for is not there
    missing_image: ClassVar[tuple[str, ...]] = ("no such image",)

    def is_missing_image(self, stderr: str) -> bool:
        """True when ``stderr`` (of an image command) says the image is not there."""
        low = stderr.lower()
        return any(words in low for words in self.missing_image)

    def script(self, text: str) -> str:
        """Shell script ``text`` (sent as ``sh -c TEXT``) with ``$RT`` set to this runtime's
        command: the node scripts call the runtime as ``"$RT"`` (each starts with
        ``: "${RT:=docker}"`` for the lint and for running it by hand).  Pure."""
        return f"RT={shlex.quote(self.binary)}\n{text}"

    def gpu_options(self, options: Sequence[str], cdi_kind: str) -> list[str]:
        """``options`` (run flags as a target or job gives them, in docker's words) with each
        ``--gpus VALUE`` said the way this runtime takes GPUs: unchanged for "flag"; for "cdi"
        ``all`` -> ``--device=KIND=all``, ``N`` / ``count=N`` -> ``--device=KIND=0`` ..
        ``KIND=N-1``, ``device=0,2`` -> one ``--device`` per index or UUID (KIND: ``cdi_kind``,
        the accelerator table's).  Pure."""
        if self.gpu_style != "cdi":
            return list(options)
        out: list[str] = []
        args = list(options)
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--gpus" and i + 1 < len(args):
                value, i = args[i + 1], i + 2
            elif arg.startswith("--gpus="):
                value, i = arg.split("=", 1)[1], i + 1
            else:
                out.append(arg)
                i += 1
                continue
            out += [f"--device={cdi_kind}={name}" for name in cdi_names(value)]
        return out

    # ----------------------------------------------------------------- containers

    @abstractmethod
    def run(self, image: str, command: Sequence[str], *, name: str | None = None,
            detach: bool = False, remove: bool = False, network: str | None = None,
            labels: Mapping[str, str] | None = None, options: Sequence[str] = (),
            env: Sequence[tuple[str, str]] = (), env_names: Sequence[str] = (),
            env_file: str | None = None) -> list[str]:
        """Create and start a container of ``image`` running ``command``: ``detach`` (print
        its ID and return), ``remove`` (removed when it ends), ``network`` (``host``,
        ``none``), ``labels``, ``options`` (the runtime's own flags, passed as they are),
        ``env`` (``NAME=value`` each), ``env_names`` (each value from the runtime's own
        environment), ``env_file`` (``NAME=value`` lines read from that path)."""

    @abstractmethod
    def ps(self, *, labels: Mapping[str, str], status: str | None = None, all: bool = True,
           no_trunc: bool = True) -> list[str]:
        """The IDs of the containers carrying every label of ``labels`` (and in ``status``);
        ``all``: stopped ones too; ``no_trunc``: whole IDs."""

    @abstractmethod
    def inspect(self, containers: Sequence[str], *, format: str | None = None) -> list[str]:
        """The containers' states: JSON (see the module docstring), or ``format`` (a Go template)."""

    @abstractmethod
    def wait(self, container: str) -> list[str]:
        """Block until the container ends; its exit code."""

    @abstractmethod
    def logs(self, container: str, *, follow: bool = False, tail: int | None = None,
             since: str | None = None, timestamps: bool = False) -> list[str]:
        """Its output, both streams: ``follow`` until it ends, the last ``tail`` lines,
        from ``since`` (RFC 3339, inclusive), each line with its time."""

    @abstractmethod
    def stats(self, containers: Sequence[str]) -> list[str]:
        """One sample of the containers' use (``clusterctl top``): one JSON object a line per
        container, with ``ID``, ``Name``, ``CPUPerc`` (``"74.07%"``; 100% is one core) and
        ``MemUsage`` (``"648KiB / 23.54GiB"``), as ``docker stats --no-stream`` prints them."""

    @abstractmethod
    def exec(self, container: str, argv: Sequence[str]) -> list[str]:
        """Run ``argv`` inside the running container."""

    @abstractmethod
    def exec_interactive(self, container: str, argv: Sequence[str], *,
                         env: Sequence[tuple[str, str]] = ()) -> list[str]:
        """Run ``argv`` inside the running container on a terminal (``clusterctl shell``):
        stdin kept open and a pseudo-terminal of the container's own, the command's input
        and output being the node's terminal (the SSH channel's); ``env`` (``NAME=value``
        each) set for it only.  Its exit status is the command's."""

    @abstractmethod
    def stop(self, containers: Sequence[str], *, grace: int) -> list[str]:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""

    @abstractmethod
    def kill(self, container: str, *, signal: str) -> list[str]:
        """Send ``signal`` (``KILL``, ``STOP``) to the container's PID 1."""

    @abstractmethod
    def rm(self, containers: Sequence[str], *, force: bool = True) -> list[str]:
        """Remove the containers (``force``: running ones too)."""

    # ----------------------------------------------------------------- images

    @abstractmethod
    def load(self) -> list[str]:
        """Load an image archive from stdin."""

    @abstractmethod
    def image_inspect(self, images: Sequence[str], *, format: str) -> list[str]:
        """``format`` (a Go template) of each image."""

    @abstractmethod
    def image_ids(self) -> list[str]:
        """Every image's whole ID, intermediate ones too."""

    @abstractmethod
    def images(self, *, label: str) -> list[str]:
        """The whole IDs of the images (not intermediate ones) carrying label ``label`` (any
        value), one a line (``clusterctl clean``: the images clusterctl made)."""

    @abstractmethod
    def remove_images(self, images: Sequence[str]) -> list[str]:
        """Remove the images by ID with every name they carry (an image with several names
        too); the engine refuses one a running container uses (``clusterctl clean --yes``,
        which removes only images no container uses)."""

    @abstractmethod
    def tag(self, image: str, reference: str) -> list[str]:
        """Give ``image`` the name ``reference``."""

    @abstractmethod
    def pull(self, reference: str, *, quiet: bool = True) -> list[str]:
        """Pull ``reference`` from its registry."""

    # ----------------------------------------------------------------- the engine

    @abstractmethod
    def version(self) -> list[str]:
        """The engine's version (exit 0 and a version only when the engine answers)."""

    @abstractmethod
    def info(self, format: str) -> list[str]:
        """``format`` (a Go template) of the engine's facts."""
