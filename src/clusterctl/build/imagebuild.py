"""Build an image from a rendered context on the local engine, label it, smoke-test it.

Uses the docker SDK's low-level ``client.api.build(..., decode=True)`` so every
output line can be streamed as it arrives (the high-level ``images.build``
only returns the log once the build is over).

Public API:
    build(client, context_dir, *, tag, buildargs, labels, nocache, dockerfile, on_output) -> image id
    BuildDisplay(title)        on_output for the CLI: live step + elapsed on a terminal, plain lines
                               otherwise; its .note(line) is a matching log= for base/wheelhouse
    run_smoke(client, image, argv, *, timeout) -> output
    image_labels(target, *, version, torch, dockerfile_sha256, source, created, extra) -> labels
    file_sha256(path) -> hex digest (for the dockerfile label)
"""

from __future__ import annotations

import hashlib
import re
import shlex
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from clusterctl import __version__
from clusterctl.core import console
from clusterctl.core.errors import ClusterctlError, UserError

TAIL_LINES = 20
LABEL_PREFIX = "io.clusterctl."
_STEP = re.compile(r"^Step \d+/\d+ : ")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # the engine colours RUN's stderr red


# ---------------------------------------------------------------- labels


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file (the rendered Dockerfile, for io.clusterctl.dockerfile-sha256)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def image_labels(target: str, *, version: str, torch: str | None = None,
                 dockerfile_sha256: str | None = None, source: str | None = None,
                 created: datetime | None = None,
                 extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """OCI annotations plus io.clusterctl.* labels, so an image says what it is and how it was made.

    ``version`` is the image's own version (a target uses its torch version, the
    base image its Debian suite).  ``source`` defaults to the templates
    directory the image was rendered from.  ``io.clusterctl.version`` records
    which clusterctl built it; ``dockerfile-sha256`` lets ``clusterctl build``
    tell whether an existing image matches the Dockerfile it would render.
    """
    from clusterctl.core.paths import templates_dir

    stamp = (created or datetime.now(timezone.utc)).astimezone(timezone.utc)
    labels = {
        "org.opencontainers.image.title": f"clusterctl {target}",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.created": stamp.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "org.opencontainers.image.source": source or templates_dir().as_uri(),
        f"{LABEL_PREFIX}target": target,
        f"{LABEL_PREFIX}version": __version__,
    }
    if torch:
        labels[f"{LABEL_PREFIX}torch"] = torch
    if dockerfile_sha256:
        labels[f"{LABEL_PREFIX}dockerfile-sha256"] = dockerfile_sha256
    labels.update(extra or {})
    return labels


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


def _plain(line: str) -> None:
    console.out.print(line, markup=False, highlight=False)


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


def build(client, context_dir: Path | str, *, tag: str, buildargs: Mapping[str, str] | None = None,
          labels: Mapping[str, str] | None = None, nocache: bool = False,
          dockerfile: str = "Dockerfile", network_mode: str = "host",
          on_output: Callable[[str], None] | None = None) -> str:
    """Build ``context_dir`` as ``tag``; returns the image id (``sha256:...``).

    Every output line goes to ``on_output`` (default: plain lines on the
    console).  A failing step raises ClusterctlError (exit 1) whose message
    holds the engine's error and the last 20 output lines (also as ``.error``
    and ``.tail``).  Intermediate containers are removed also on failure.
    RUN steps use the host network by default: it works on every engine,
    including ones started with --bridge=none (the node daemons) or whose
    docker0 is gone; builds install from the wheelhouse and need no network.
    """
    from docker.errors import APIError

    context_dir = Path(context_dir)
    _check_context(context_dir, dockerfile)
    lines = _Lines(on_output or _plain)
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


class BuildDisplay:
    """An ``on_output`` for the CLI: a live line with the current step and elapsed time on a
    terminal (each step also kept above it), and every line as plain text otherwise
    (pipes, CI logs, CLUSTERCTL_PLAIN=1).

        with BuildDisplay(f"building {tag}") as show:
            imagebuild.build(client, ctx, tag=tag, on_output=show)
    """

    def __init__(self, title: str, *, con=None, live: bool | None = None) -> None:
        self.title = title
        self.con = con or console.out
        self.live = console.interactive() if live is None else live
        self.progress = None
        self.task = None
        self.started = time.monotonic()

    def __enter__(self) -> BuildDisplay:
        if self.live:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                     TimeElapsedColumn(), TextColumn("[dim]{task.fields[last]}"),
                                     console=self.con, transient=True)
            self.progress.start()
            self.task = self.progress.add_task(self.title, last="")
        else:
            self.con.print(self.title, markup=False, highlight=False)
        return self

    def __call__(self, line: str) -> None:
        if not self.live:
            self.con.print(line, markup=False, highlight=False)
            return
        if _STEP.match(line):
            self.progress.console.print(line, markup=False, highlight=False)
            self.progress.update(self.task, description=f"{self.title}: {line[:60]}")
        elif line.strip():
            self.progress.update(self.task, last=line.strip()[:60])

    def note(self, line: str) -> None:
        """A progress message (debootstrap, pip download): on a terminal it only updates the
        live line, since hundreds of "I: Retrieving ..." lines bury the build; plain otherwise.
        Pass it as ``log=`` to baseimage.ensure_base_image / wheelhouse.prepare."""
        if not self.live:
            self.con.print(line, markup=False, highlight=False)
        elif line.strip():
            self.progress.update(self.task, last=line.strip()[:60])

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()
        elapsed = time.monotonic() - self.started
        verdict = "failed" if exc[0] else "done"
        self.con.print(f"{self.title}: {verdict} in {elapsed:.0f}s", markup=False, highlight=False)


# ---------------------------------------------------------------- smoke


def _tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])


def _kill_quietly(container) -> None:
    from docker.errors import APIError

    try:
        container.kill()
    except APIError:  # it exited between the timeout and the kill
        pass


def run_smoke(client, image: str, argv: Sequence[str], *, timeout: float = 300,
              environment: Mapping[str, str] | None = None, network_mode: str = "host") -> str:
    """Run ``argv`` (a list, never a shell string) in a throwaway container of ``image``.

    Returns the combined stdout/stderr.  A non-zero exit or a run longer than
    ``timeout`` seconds raises ClusterctlError with the output's tail (also as
    ``.output``).  The container is removed in every case.  Host networking
    by default: it is how targets run on nodes (``docker run --net=host``) and
    needs no docker0 bridge.
    """
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
