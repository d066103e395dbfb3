"""Build an image from a build context on the local engine, and run a smoke command in an image.

Uses the docker SDK's low-level ``client.api.build(..., decode=True)`` so every
output line can be streamed as it arrives (the high-level ``images.build``
only returns the log once the build is over).  The library prints nothing:
each output line goes to the caller's ``on_output`` (the CLI passes its build
display, cli/display.py); without one, to this module's logger.  The labels
come from the caller (labels.py).

Contract:
    build(client, context_dir, *, tag, buildargs, labels, nocache, dockerfile, on_output) -> image id
    run_smoke(client, image, argv, *, timeout) -> output
"""

from __future__ import annotations

import logging
import re
import shlex
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.core.errors import ClusterctlError, EnvironmentProblem, UserError
from clusterctl.image.labels import LABEL_PREFIX

if TYPE_CHECKING:
    from docker import DockerClient

TAIL_LINES = 20
_logger = logging.getLogger(__name__)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # the engine colours RUN's stderr red


# ---------------------------------------------------------------- build


class _Lines:
    """Reassemble the engine's output chunks (which split and join lines freely) into lines."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line
        self.buf = ""
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)

    def feed(self, text: str) -> None:
        self.buf += text
        *complete, self.buf = self.buf.split("\n")
        for line in complete:
            self._emit(line)

    def flush(self) -> None:
        if self.buf:
            self._emit(self.buf)
            self.buf = ""

    def _emit(self, line: str) -> None:
        line = _ANSI.sub("", line).rstrip("\r")
        self.tail.append(line)
        self.on_line(line)


def _check_context(context_dir: Path, dockerfile: str) -> None:
    if not context_dir.is_dir():
        raise UserError(f"build context {context_dir} is not a directory; render the target first "
                        "(clusterctl render TARGET -o DIR) or pass the directory that holds its Dockerfile.")
    if not (context_dir / dockerfile).is_file():
        raise UserError(f"no {dockerfile} in build context {context_dir}: the context must hold the "
                        "Dockerfile the build should use.")


def _consume(chunks: Iterable[dict], lines: _Lines) -> tuple[str | None, str | None]:
    """Stream chunks into lines; returns (image id from the engine, error message)."""
    image_id = error = None
    for chunk in chunks:
        if "stream" in chunk:
            lines.feed(chunk["stream"])
        elif "error" in chunk:
            error = chunk.get("errorDetail", {}).get("message") or chunk["error"]
        elif "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        elif "status" in chunk:  # pull / progress messages
            lines.feed(" ".join(str(chunk[k]) for k in ("status", "progress") if chunk.get(k)) + "\n")
    lines.flush()
    return image_id, error


def _failure(tag: str, error: str, tail: Iterable[str]) -> ClusterctlError:
    e = ClusterctlError(f"building {tag} failed: {error.strip()}\nlast lines of the build:\n"
                        + "\n".join(tail))
    e.error = error
    e.tail = list(tail)
    return e


def build(client: DockerClient, context_dir: Path | str, *, tag: str,
          buildargs: Mapping[str, str] | None = None,
          labels: Mapping[str, str] | None = None, nocache: bool = False,
          dockerfile: str = "Dockerfile", network_mode: str = "host",
          on_output: Callable[[str], None] | None = None) -> str:
    """Build ``context_dir`` as ``tag``; returns the image id (``sha256:...``).

    Every output line goes to ``on_output`` (default: this module's logger,
    at debug level).  A failing step raises ClusterctlError (exit 1) whose message
    holds the engine's error and the last 20 output lines (also as ``.error``
    and ``.tail``).  Intermediate containers are removed also on failure.
    RUN steps use the host network by default: it works on every engine,
    including ones started with --bridge=none (the node daemons) or whose
    docker0 is gone; builds install from the wheelhouse and need no network.
    """
    # the docker SDK is heavy: loaded only when an engine is used
    from docker.errors import APIError

    context_dir = Path(context_dir)
    _check_context(context_dir, dockerfile)
    lines = _Lines(on_output or _logger.debug)
    try:
        chunks = client.api.build(
            path=str(context_dir), tag=tag, dockerfile=dockerfile, buildargs=dict(buildargs or {}),
            labels=dict(labels or {}), nocache=nocache, rm=True, forcerm=True, pull=False,
            network_mode=network_mode, decode=True,
        )
        image_id, error = _consume(chunks, lines)
    except APIError as e:
        raise _failure(tag, str(e.explanation or e), lines.tail) from None
    if error:
        raise _failure(tag, error, lines.tail)
    return image_id or client.images.get(tag).id


# ---------------------------------------------------------------- smoke


def _tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])


def pull_if_missing(client: DockerClient, ref: str, log: Callable[[str], None], *, what: str,
                    hint: str) -> bool:
    """Make sure the engine has ``ref`` (the FROM of a build): pulled when it lacks it; True
    when it had it.  EnvironmentProblem naming ``what`` (``base image``) and ``hint`` (how to
    get one) when it cannot be pulled: nothing can be built on an image that is not here."""
    from docker.errors import APIError, ImageNotFound  # heavy: only when an engine is used

    try:
        client.images.get(ref)
        return True
    except ImageNotFound:
        pass
    log(f"{what} {ref} is not in the local engine; pulling it")
    try:
        client.images.pull(ref)
    except APIError as e:
        raise EnvironmentProblem(f"{what} {ref} is not in the local Docker engine and cannot be "
                                 f"pulled ({e.explanation or e}). {hint}") from None
    return False


def _kill_quietly(container) -> None:
    # the docker SDK is heavy: loaded only when an engine is used
    from docker.errors import APIError

    try:
        container.kill()
    except APIError:  # it exited between the timeout and the kill
        pass


def run_smoke(client: DockerClient, image: str, argv: Sequence[str], *, timeout: float = 300,
              environment: Mapping[str, str] | None = None, network_mode: str = "host") -> str:
    """Run ``argv`` (a list, never a shell string) in a throwaway container of ``image``.

    Returns the combined stdout/stderr.  A non-zero exit or a run longer than
    ``timeout`` seconds raises ClusterctlError with the output's tail (also as
    ``.output``).  The container is removed in every case.  Host networking
    by default: it is how targets run on nodes (``docker run --net=host``) and
    needs no docker0 bridge.
    """
    # the docker SDK (and requests under it) is heavy: loaded only when an engine is used
    from docker.errors import ImageNotFound
    from requests.exceptions import ConnectionError as ReqConnectionError
    from requests.exceptions import ReadTimeout

    if isinstance(argv, str):
        raise TypeError("run_smoke takes an argv list, not a shell string")
    shown = shlex.join(argv)
    try:
        container = client.containers.create(image, command=list(argv), detach=True,
                                             environment=dict(environment or {}),
                                             network_mode=network_mode,
                                             labels={f"{LABEL_PREFIX}role": "smoke"})
    except ImageNotFound:
        raise UserError(f"image {image} is not in the local engine; build it first "
                        "(clusterctl build TARGET).") from None
    try:
        container.start()
        try:
            code = container.wait(timeout=timeout)["StatusCode"]
        except (ReadTimeout, ReqConnectionError):
            code = None
            _kill_quietly(container)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    if code == 0:
        return output
    why = f"did not finish within {timeout:.0f}s" if code is None else f"exited {code}"
    e = ClusterctlError(f"smoke test `{shown}` in {image} {why}; its output:\n{_tail(output)}")
    e.output = output
    raise e
