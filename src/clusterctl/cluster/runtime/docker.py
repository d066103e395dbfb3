"""Docker: the ``docker`` CLI on the node (the default runtime; every command clusterctl ran
on a node before the runtime seam, argument for argument)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from clusterctl.cluster.runtime.base import ContainerRuntime


class DockerRuntime(ContainerRuntime):
    """The ``docker`` CLI (see :class:`~clusterctl.cluster.runtime.base.ContainerRuntime`)."""

    name = "docker"
    binary = "docker"

    def run(self, image, command, *, name=None, detach=False, remove=False, network=None,
            labels=None, options=(), env=(), env_names=(), env_file=None) -> list[str]:
        argv = [self.binary, "run", *(["-d"] if detach else []), *(["--rm"] if remove else []),
                *([f"--net={network}"] if network else []), *(["--name", name] if name else [])]
        for key, value in (labels or {}).items():
            argv += ["--label", f"{key}={value}"]
        argv += list(options)
        for key, value in env:
            argv += ["-e", f"{key}={value}"]
        for key in env_names:
            argv += ["-e", key]
        if env_file is not None:
            argv += ["--env-file", env_file]
        return [*argv, image, *command]

    def ps(self, *, labels: Mapping[str, str], status: str | None = None, all: bool = True,
           no_trunc: bool = True) -> list[str]:
        argv = [self.binary, "ps", *(["-a"] if all else []), "-q", *(["--no-trunc"] if no_trunc else [])]
        for key, value in labels.items():
            argv += ["--filter", f"label={key}={value}"]
        if status is not None:
            argv += ["--filter", f"status={status}"]
        return argv

    def inspect(self, containers: Sequence[str], *, format: str | None = None) -> list[str]:
        return [self.binary, "inspect", "--type", "container",
                *(["--format", format] if format is not None else []), *containers]

    def wait(self, container: str) -> list[str]:
        return [self.binary, "wait", container]

    def logs(self, container: str, *, follow: bool = False, tail: int | None = None,
             since: str | None = None, timestamps: bool = False) -> list[str]:
        argv = [self.binary, "logs"]
        if follow:
            argv.append("--follow")
        if tail is not None:
            argv += ["--tail", str(tail)]
        if since is not None:
            argv += ["--since", since]
        if timestamps:
            argv.append("--timestamps")
        return [*argv, container]

    def stats(self, containers: Sequence[str]) -> list[str]:
        return [self.binary, "stats", "--no-stream", "--no-trunc", "--format", "{{json .}}",
                *containers]

    def exec(self, container: str, argv: Sequence[str]) -> list[str]:
        return [self.binary, "exec", container, *argv]

    def exec_interactive(self, container: str, argv: Sequence[str], *,
                         env: Sequence[tuple[str, str]] = ()) -> list[str]:
        return [self.binary, "exec", "--interactive", "--tty",
                *(a for key, value in env for a in ("--env", f"{key}={value}")), container, *argv]

    def stop(self, containers: Sequence[str], *, grace: int) -> list[str]:
        return [self.binary, "stop", "--time", str(int(grace)), *containers]

    def kill(self, container: str, *, signal: str) -> list[str]:
        return [self.binary, "kill", "--signal", signal, container]

    def rm(self, containers: Sequence[str], *, force: bool = True) -> list[str]:
        return [self.binary, "rm", *(["--force"] if force else []), *containers]

    def load(self) -> list[str]:
        return [self.binary, "load"]

    def image_inspect(self, images: Sequence[str], *, format: str) -> list[str]:
        return [self.binary, "image", "inspect", "--format", format, *images]

    def image_ids(self) -> list[str]:
        return [self.binary, "image", "ls", "-a", "-q", "--no-trunc"]

    def images(self, *, label: str) -> list[str]:
        return [self.binary, "image", "ls", "-q", "--no-trunc", "--filter", f"label={label}"]

    def remove_images(self, images: Sequence[str]) -> list[str]:
        return [self.binary, "image", "rm", "--force", *images]

    def tag(self, image: str, reference: str) -> list[str]:
        return [self.binary, "tag", image, reference]

    def pull(self, reference: str, *, quiet: bool = True) -> list[str]:
        return [self.binary, "pull", *(["--quiet"] if quiet else []), reference]

    def version(self) -> list[str]:
        return [self.binary, "version", "--format", "{{.Server.Version}}"]

    def info(self, format: str) -> list[str]:
        return [self.binary, "info", "--format", format]
