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
* :meth:`version` prints the engine's version and exits 0 only when the engine answers;
  :meth:`info` with ``DOCKER_INFO_FORMAT``-style templates prints those fields.

A second runtime is one module beside ``docker.py`` (subclass this, or ``DockerRuntime``
where its CLI is docker's) and one entry in :data:`clusterctl.cluster.runtime.RUNTIMES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar


class ContainerRuntime(ABC):
    """One container runtime's command lines on a node (see the module docstring)."""

    #: the name an inventory gives it (``docker``); the key in ``RUNTIMES``
    name: ClassVar[str]
    #: the command on the node (``docker``)
    binary: ClassVar[str]

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
    def exec(self, container: str, argv: Sequence[str]) -> list[str]:
        """Run ``argv`` inside the running container."""

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
