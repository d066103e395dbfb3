"""A project's ``requirements.txt`` as an image layer of its own, over the job's image.

``launch --workdir DIR`` runs a user's project on every node with no Dockerfile: the code
travels on its own (clusterctl.code), and what the project needs from PyPI becomes one
cached image, ``FROM <base>`` plus the requirements installed OFFLINE.  The wheels are
fetched on this machine (``wheelhouse.prepare``: pip download into a cached wheelhouse):
containers here reach no package index (FIELD-NOTES section 1), and the nodes need no
internet because the image is pushed to them later (only its missing layer travels).

Rebuilt only when it must be: the tag is ``clusterctl-deps/<base repo slug>:<12 hex>``, the
hex a sha256 over (FORMAT, the base image's ID, the normalised requirement lines), so an
unchanged file on an unchanged base is one inspect and ``cached=True``.

What is checked before anything is downloaded or built (UserError, exit 2, naming the file
and line): every line is a requirement by name (``six==1.16.0``, extras, specifiers, markers);
pip options (``-r``, ``--index-url``, ``-e``, ``--hash``), URLs and local paths are refused,
since the nodes have no network and the image must be rebuildable from the file alone.  A
package pip cannot find fails in ``pip download``, before any build, as a UserError that
names its line and the versions that do exist.

How the image is made (the engine's classic builder, no BuildKit: docker-py does not use
it, so no ``RUN --mount``):

1. a throw-away *stage image* FROM the base: the wheels and :data:`INSTALL_PY` are COPYed in
   and pip (run from the wheelhouse's own pip wheel: bookworm's python3 has none) installs
   with ``--no-index --root /opt/clusterctl-deps``.  ``--root`` keeps pip aware of what the
   base already has (torch in the cpu image is not installed again), and puts the rest under
   one directory.  ``--break-system-packages`` is passed only when the image's Python is
   externally managed (its EXTERNALLY-MANAGED file, PEP 668), never to a pip too old to know
   the flag.  Times are set to 0 and pip compiles checked-hash .pyc files
   (SOURCE_DATE_EPOCH), so the same wheels give the same bytes;
2. the image: ``FROM <base>`` + ``COPY --from=<stage> /opt/clusterctl-deps/ /``, labelled.
   Only what pip installed is in it; the wheels were in the stage image only, which is
   removed.  Two builds because the labels record what was installed, which only the
   stage knows, and the classic builder takes labels before it starts.

A requirement that would *replace* a package of the base (``numpy==1.26.4`` over the cpu
image's numpy 2.4.6) is refused: the layer can add files but not delete the base's, so the
image would hold both versions' metadata.

The Python version and platform ``pip download`` targets: for an image built on clusterctl's
debootstrapped base (its layers start with that image's) the targets data knows them
(``images_built_on_it.python`` in data/targets.yaml; this machine's platform, as ``clusterctl
build`` uses); for any other base the image is asked once (``python3 -c`` in a container)
and the answer is kept under ``cache_dir()/deps/python/<image id>.json``.

Public API:
    requirements_image(base_ref, requirements, *, client, log=None) -> DepsImage
    DepsImage(ref, image_id, requirements_digest, cached, packages)
    read_requirements(path) -> [Requirement]       the checks above, no engine
    normalised(requirements) -> bytes               what the digest is over
    deps_tag(base_ref, base_id, normalised) -> "clusterctl-deps/<slug>:<12 hex>"
    repo_slug(ref) -> a repository path component made from an image reference
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl import __version__
from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.core.files import one_at_a_time, read_input
from clusterctl.core.paths import cache_dir
from clusterctl.core.text import shown
from clusterctl.image import imagebuild
from clusterctl.image import wheelhouse as wh
from clusterctl.image.labels import LABEL_PREFIX

if TYPE_CHECKING:
    from docker import DockerClient

FORMAT = 1          # bump when the layer's layout or the install changes: old tags are not reused
DEPS_REPO = "clusterctl-deps"
STAGE_ROOT = "/opt/clusterctl-deps"
_IN = "/tmp/clusterctl-deps-in"
_logger = logging.getLogger(__name__)

L_DIGEST = f"{LABEL_PREFIX}deps.requirements-sha256"
L_BASE = f"{LABEL_PREFIX}deps.base"
L_BASE_ID = f"{LABEL_PREFIX}deps.base-id"
L_PACKAGES = f"{LABEL_PREFIX}deps.packages"
L_PYTHON = f"{LABEL_PREFIX}deps.python"

VALID_LINE = ("one requirement per line by name, with optional extras, version specifiers and "
              "markers (e.g. 'six==1.16.0', 'requests[socks]>=2.31; python_version >= \"3.10\"'); "
              "comments and blank lines")


@dataclass
class DepsImage:
    """The requirements layer's image: its tag, ID, what it was made from and what it holds."""

    ref: str
    image_id: str
    requirements_digest: str          # "sha256:<hex>" of normalised(requirements)
    cached: bool                      # True: the engine had it, nothing was built
    packages: list[str] = field(default_factory=list)   # what pip installed, name==version


# ---------------------------------------------------------------- the requirements file


@dataclass(frozen=True)
class Requirement:
    """One requirement line of the file: where it is, its text as pip reads it, its name."""

    line: int
    text: str
    name: str                         # canonical (PEP 503): lower case, runs of -_. as -


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_AFTER_NAME = re.compile(r"\s*(?:\[[^\]]*\])?\s*(?:\(?\s*[<>=!~][^;]*)?\s*(?:;.*)?")
_COMMENT = re.compile(r"(^|\s)#.*\Z")
_ARCHIVE = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) as pip reads a requirements file: lines ending in ``\\``
    joined with the next, then comments (``#`` at the start or after a space) cut."""
    start, parts = None, []
    for n, raw in enumerate(text.splitlines(), 1):
        start = n if start is None else start
        if raw.endswith("\\") and not raw.lstrip().startswith("#"):
            parts.append(raw[:-1])
            continue
        parts.append(raw)
        yield start, _COMMENT.sub("", "".join(parts)).strip()
        start, parts = None, []
    if parts:
        yield start, _COMMENT.sub("", "".join(parts)).strip()


def _line_problem(text: str) -> str | None:
    """Why a (non-empty) line is not a requirement by name, or None."""
    if text.startswith("-"):
        option = text.split()[0].split("=")[0]
        return (f"pip option {option} is not supported: the nodes have no network and the image "
                "is built from this file alone (only requirements by name are)")
    if "://" in text or "@" in text.split(";", 1)[0]:
        return "a URL requirement is not supported (the nodes have no network); name the package instead"
    head = text.split(";", 1)[0].strip()
    if (head.startswith((".", "/", "~")) or "/" in head or "\\" in head
            or head.lower().endswith(_ARCHIVE)):
        return "a local path is not supported: the file must name packages from the package index"
    m = _NAME.match(text)
    if not m:
        return "is not a requirement"
    rest = text[m.end():]
    if re.search(r"\s--?[A-Za-z]", rest.split(";", 1)[0]):
        return ("per-requirement options (e.g. --hash) are not supported; give the requirement "
                "alone")
    if not _AFTER_NAME.fullmatch(rest):
        return "is not a requirement"
    return None


#: The most a requirements file may hold (a long lock file is ~100 KiB).
MAX_REQUIREMENTS_BYTES = 4 << 20


def read_requirements(path: Path | str) -> list[Requirement]:
    """The requirements of ``path``, checked: UserError naming the file and line otherwise."""
    path = Path(path)
    try:  # a regular file of bounded size (a FIFO is never waited on, a huge file never read)
        text = read_input(path, "the requirements file", limit=MAX_REQUIREMENTS_BYTES,
                          valid="a pip requirements file").decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; expected a pip requirements file "
                        f"({VALID_LINE}).") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: is not UTF-8 text (byte {e.start}); expected a pip "
                        "requirements file.") from None
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror or e}).") from None
    found: list[Requirement] = []
    seen: dict[str, int] = {}
    for n, line in _logical_lines(text.lstrip("\ufeff")):
        if not line:
            continue
        problem = _line_problem(line)
        said = shown(line, quoted=False)     # bounded and escaped: the line is untrusted
        if problem:
            raise UserError(f"{path}:{n}: {said}: {problem}; valid: {VALID_LINE}.")
        name = canonical(_NAME.match(line).group(0))
        if name in seen:
            raise UserError(f"{path}:{n}: {said}: {name} is already required on line {seen[name]}; "
                            "valid: each package on one line (pip refuses double requirements).")
        seen[name] = n
        found.append(Requirement(n, line, name))
    return found


def normalised(requirements: Sequence[Requirement]) -> bytes:
    """The requirement lines as pip reads them, one a line: comments, blank lines, CRs,
    continuations and surrounding spaces do not change the digest; anything else does."""
    return "".join(r.text + "\n" for r in requirements).encode()


def digest_of(requirements: Sequence[Requirement]) -> str:
    return "sha256:" + hashlib.sha256(normalised(requirements)).hexdigest()


# ---------------------------------------------------------------- names


def repo_slug(ref: str) -> str:
    """``clusterctl/cpu:2.13.0`` -> ``clusterctl-cpu``: the repository, as one path component
    a Docker repository name allows (lower case alphanumerics joined by single dashes)."""
    ref = ref.split("@", 1)[0]
    if re.fullmatch(r"(sha256:)?[0-9a-f]{12,64}", ref):
        return "image"
    head, sep, last = ref.rpartition("/")
    repo = head + sep + last.split(":", 1)[0]
    slug = re.sub(r"[^a-z0-9]+", "-", repo.lower()).strip("-")[:64].strip("-")
    return slug or "image"


def deps_tag(base_ref: str, base_id: str, normalised_bytes: bytes) -> str:
    """The tag of the layer for these requirements on exactly this base image."""
    h = hashlib.sha256(f"clusterctl-deps {FORMAT}\n{base_id}\n".encode() + normalised_bytes)
    return f"{DEPS_REPO}/{repo_slug(base_ref)}:{h.hexdigest()[:12]}"


# ---------------------------------------------------------------- the engine


def image_attrs(client: DockerClient, ref: str) -> dict | None:
    """The engine's inspect of ``ref``, or None when it lacks it."""
    from docker.errors import ImageNotFound  # heavy: only when an engine is used

    try:
        return client.api.inspect_image(ref)
    except ImageNotFound:
        return None


def base_attrs(client: DockerClient, ref: str, log: Callable[[str], None]) -> dict:
    """The base image's inspect; pulled first when the engine lacks it (EnvironmentProblem
    when that fails too: nothing can be built on an image that is not here)."""
    attrs = image_attrs(client, ref)
    if attrs is not None:
        return attrs
    imagebuild.pull_if_missing(client, ref, log, what="image", hint=(
        "Build it first (clusterctl build --target T), or load it (`docker load -i FILE`)."))
    return client.api.inspect_image(ref)


def _labels(attrs: dict) -> dict[str, str]:
    return (attrs.get("Config") or {}).get("Labels") or {}


def _layers(attrs: dict) -> list[str]:
    return (attrs.get("RootFS") or {}).get("Layers") or []


def remove_quietly(client: DockerClient, ref: str) -> None:
    from docker.errors import APIError  # heavy: only when an engine is used

    try:
        client.images.remove(ref, force=True)
    except APIError:
        pass


# ---------------------------------------------------------------- which Python


@dataclass(frozen=True)
class PythonFacts:
    """What ``pip download`` must target for an image: its CPython minor version and the
    platform tags its Python accepts (empty: this machine's), and where that was learnt."""

    version: str
    platforms: tuple[str, ...] = ()
    source: str = ""


PROBE = """\
import json, os, platform, sys, sysconfig
print(json.dumps({"version": "%d.%d" % sys.version_info[:2], "machine": platform.machine(),
                  "libc": list(platform.libc_ver()), "platform": sysconfig.get_platform(),
                  "implementation": sys.implementation.name}))
"""


def platform_tags(machine: str, libc: Sequence[str], sysconfig_platform: str) -> tuple[str, ...]:
    """The platform tags a Python with this machine and C library accepts, newest first.

    pip's ``--platform manylinux_2_36_x86_64`` matches that exact tag only (it expands the
    legacy ``manylinux2014`` names, not the PEP 600 ones), so every glibc 2.N down to 2.5 is
    listed, then manylinux2014 for wheels tagged only with the legacy names.  Without glibc
    (musl), the image's own platform: only pure-Python wheels will match.
    """
    arch = machine.replace("-", "_").replace(".", "_")
    name, version = (list(libc) + ["", ""])[:2]
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if name == "glibc" and m and int(m.group(1)) == 2:
        tags = [f"manylinux_2_{minor}_{arch}" for minor in range(int(m.group(2)), 4, -1)]
        return (*tags, f"manylinux2014_{arch}")
    return (re.sub(r"[-.]", "_", sysconfig_platform),)


def _probe_cache(image_id: str) -> Path:
    return cache_dir() / "deps" / "python" / f"{image_id.split(':')[-1]}.json"


def _probe(client: DockerClient, image_id: str, base_ref: str) -> dict:
    """Ask the image's python3 for its version and platform (once per image ID)."""
    from docker.errors import APIError, ContainerError  # heavy: only when an engine is used

    cached = _probe_cache(image_id)
    with contextlib.suppress(OSError, ValueError):
        return json.loads(cached.read_text())
    try:
        out = client.containers.run(image_id, ["-c", PROBE], entrypoint=["python3"], remove=True,
                                    network_mode="host", user="0", stdout=True, stderr=True)
        answer = json.loads(out.decode().strip().splitlines()[-1])
    except (ContainerError, APIError, ValueError, IndexError) as e:
        raise UserError(
            f"image {base_ref} cannot say which Python it has (`python3 -c ...` in it failed: "
            f"{str(e).strip()[:300]}); a requirements layer installs with the image's own "
            "python3, so the image must have one on its PATH.") from None
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(answer, sort_keys=True) + "\n")
    tmp.replace(cached)
    return answer


def _on_local_base(client: DockerClient, attrs: dict) -> PythonFacts | None:
    """Facts from the targets data when the image is clusterctl's debootstrapped base or built
    on it (the base's layers come first in its own), else None."""
    from clusterctl.image.targets import load_targets  # pydantic: only when needed

    for target in load_targets().values():
        facts = target.images_built_on_it
        if facts is None:
            continue
        base = image_attrs(client, target.tag)
        own, theirs = _layers(base or {}), _layers(attrs)
        if own and theirs[:len(own)] == own:
            return PythonFacts(facts.python, (), f"targets data: built on {target.tag}")
    return None


def python_facts(client: DockerClient, base_ref: str, attrs: dict) -> PythonFacts:
    """The Python ``pip download`` must target for the image ``attrs`` (see the module doc)."""
    known = _on_local_base(client, attrs)
    if known is not None:
        return known
    answer = _probe(client, attrs["Id"], base_ref)
    if answer.get("implementation") != "cpython":
        raise UserError(f"image {base_ref}: its python3 is {answer.get('implementation')}, not "
                        "CPython; requirements layers install CPython wheels only.")
    return PythonFacts(answer["version"],
                       platform_tags(answer["machine"], answer["libc"], answer["platform"]),
                       f"asked the image ({answer['machine']}, {' '.join(answer['libc']) or 'no glibc'})")


# ---------------------------------------------------------------- wheels


_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
_INVALID = re.compile(r"Invalid (?:requirement|marker|specifier|version)\b[^\n]*")
_VERSIONS = re.compile(r"satisfies the requirement (\S+)(?: \(from ([^)]*)\))? \(from versions: ([^)]*)\)")


def _line_of(name: str, requirements: Sequence[Requirement]) -> Requirement | None:
    return next((r for r in requirements if r.name == canonical(name)), None)


def _download_problem(path: Path, requirements: Sequence[Requirement], facts: PythonFacts,
                      err: UserError) -> UserError:
    """pip download's failure as the requirements file's line that caused it."""
    text = err.message
    where = f"python {facts.version}" + (f", {facts.platforms[0]}" if facts.platforms else "")
    m = _NO_MATCH.search(text)
    if m:
        spec = m.group(1)
        name = _NAME.match(spec).group(0) if _NAME.match(spec) else spec
        v = _VERSIONS.search(text)
        versions = v.group(3).strip() if v else ""
        needed_by = v.group(2) if v and v.group(2) else None
        req = _line_of(name, requirements)
        if req is None and needed_by:
            req = _line_of(_NAME.match(needed_by).group(0), requirements)
        valid = (f"one of the versions with a wheel for {where}: {versions}" if versions and versions != "none"
                 else f"a package name on the indexes this machine's pip uses, with a wheel for {where} "
                      "(`pip config list` shows them)")
        what = f"{spec}: no matching distribution for {where}"
        if needed_by and (req is None or req.name != canonical(name)):
            what = f"{needed_by} needs {spec}, which has no matching distribution for {where}"
        at = f"{path}:{req.line}: " if req else f"{path}: "
        return UserError(f"{at}{what}; valid: {valid}.")
    return UserError(f"{path}: the requirements cannot be installed together ({where}):\n{text}")


def _wheelhouse(path: Path, requirements: Sequence[Requirement], facts: PythonFacts,
                log: Callable[[str], None]) -> Path:
    # wheelhouse.prepare takes one --platform; the others ride along as extra pip arguments
    # (they are part of its cache key, as they must be).
    extra = [a for p in facts.platforms[1:] for a in ("--platform", p)]
    try:
        return wh.prepare([r.text for r in requirements], python_version=facts.version,
                          platform=facts.platforms[0] if facts.platforms else None,
                          indexes=extra, log=log)
    except UserError as e:
        raise _download_problem(path, requirements, facts, e) from None
    except ClusterctlError as e:   # pip's own parser is stricter than the checks above
        m = _INVALID.search(e.message)
        if m is None:
            raise
        quoted = re.search(r"'([^']+)'", m.group(0))
        req = next((r for r in requirements if quoted and quoted.group(1) in r.text), None)
        at = f"{path}:{req.line}: {req.text}" if req else str(path)
        raise UserError(f"{at}: pip cannot read it ({m.group(0).strip()}); valid: {VALID_LINE}.") from None


# ---------------------------------------------------------------- building

# Runs in the stage image with the image's own python3 (no shell needed).  Kept to syntax every
# python3 of the last years reads.
INSTALL_PY = r'''
import glob, os, subprocess, sys, sysconfig
IN, ROOT = sys.argv[1], sys.argv[2]

def dists(dirs):
    found = {}
    for d in dirs:
        for p in glob.glob(os.path.join(d, "*.dist-info")) + glob.glob(os.path.join(d, "*.egg-info")):
            name, _, rest = os.path.basename(p).rpartition(".")[0].partition("-")
            found[name.replace("_", "-").replace(".", "-").lower()] = (name, rest.split("-")[0])
    return found

before = dists([p for p in sys.path if p and os.path.isdir(p)])
pip = glob.glob(os.path.join(IN, "wheels", "pip-*.whl"))[0]
argv = [sys.executable, os.path.join(pip, "pip"), "install", "--no-cache-dir", "--no-index",
        "--find-links", os.path.join(IN, "wheels"), "--root", ROOT, "--disable-pip-version-check",
        "--no-warn-script-location", "--progress-bar", "off"]
if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")):
    argv.append("--break-system-packages")   # PEP 668; the image is the user's to change
argv += ["-r", os.path.join(IN, "requirements.txt")]
env = dict(os.environ, SOURCE_DATE_EPOCH="0")   # checked-hash .pyc files: same bytes each build
os.makedirs(ROOT, exist_ok=True)
code = subprocess.call(argv, env=env)
if code:
    sys.exit(code)
installed = {}
for top, dirs, files in os.walk(ROOT):
    installed.update(dists([top]))
replaced = sorted("%s %s -> %s" % (before[k][0], before[k][1], v[1]) for k, v in installed.items() if k in before)
if replaced:
    print("CLUSTERCTL-DEPS-REPLACES: " + "; ".join(replaced))
    sys.exit(3)
for top, dirs, files in os.walk(ROOT):
    for n in dirs + files:
        os.utime(os.path.join(top, n), (0, 0), follow_symlinks=False)
os.utime(ROOT, (0, 0))
print("CLUSTERCTL-DEPS-INSTALLED: " + " ".join(sorted("%s==%s" % v for v in installed.values())))
'''


def _stage_dockerfile(base_id: str) -> str:
    return (f"# clusterctl requirements layer, stage: pip installs offline under {STAGE_ROOT}\n"
            f"FROM {base_id}\nUSER 0\nCOPY in/ {_IN}/\n"
            f'RUN ["python3", "{_IN}/install.py", "{_IN}", "{STAGE_ROOT}"]\n')


def dockerfile_labels(labels: dict[str, str]) -> str:
    """One LABEL instruction (the build API's ``labels`` costs the classic builder a step and
    a container per label): JSON strings, as LABEL reads them, with ``$`` escaped."""
    def word(text: str) -> str:
        return json.dumps(text).replace("$", "\\$")

    return "LABEL " + " \\\n      ".join(f"{word(k)}={word(v)}" for k, v in sorted(labels.items())) + "\n"


def _final_dockerfile(base_id: str, stage_tag: str, labels: dict[str, str]) -> str:
    return (f"# clusterctl requirements layer: only what pip installed in the stage image\n"
            f"FROM {base_id}\nCOPY --from={stage_tag} {STAGE_ROOT}/ /\n" + dockerfile_labels(labels))


def _marker(lines: Sequence[str], name: str) -> str | None:
    prefix = f"CLUSTERCTL-DEPS-{name}: "
    return next((line[len(prefix):] for line in reversed(lines) if line.startswith(prefix)), None)


def _lock(tag: str, log: Callable[[str], None]):
    """One build of a tag at a time on this machine: a second launch waits and finds it built."""
    path = cache_dir() / "deps" / "locks" / (re.sub(r"[^A-Za-z0-9.-]", "_", tag) + ".lock")
    return one_at_a_time(path, log, f"build of {tag}")


def _cached(tag: str, attrs: dict | None, digest: str) -> DepsImage | None:
    if attrs is None or _labels(attrs).get(L_DIGEST) != digest:
        return None
    return DepsImage(tag, attrs["Id"], digest, True, _labels(attrs).get(L_PACKAGES, "").split())


def _build(client: DockerClient, tag: str, *, base_ref: str, base_id: str, path: Path,
           requirements: Sequence[Requirement], house: Path, facts: PythonFacts,
           log: Callable[[str], None]) -> DepsImage:
    digest = digest_of(requirements)
    stage_tag = f"{tag}-stage-{uuid.uuid4().hex[:8]}"
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        _logger.debug(line)

    scratch = Path(tempfile.mkdtemp(prefix="clusterctl-deps-"))
    try:
        stage, final = scratch / "stage", scratch / "final"
        (stage / "in").mkdir(parents=True)
        final.mkdir()
        wh.link_into(house, stage / "in" / "wheels")
        (stage / "in" / "requirements.txt").write_bytes(normalised(requirements))
        (stage / "in" / "install.py").write_text(INSTALL_PY)
        (stage / "Dockerfile").write_text(_stage_dockerfile(base_id))
        log(f"installing {len(requirements)} requirement(s) of {path} offline in a stage image")
        try:
            imagebuild.build(client, stage, tag=stage_tag, network_mode="none", on_output=out)
        except ClusterctlError as e:
            replaced = _marker(lines, "REPLACES")
            if replaced:
                first = _line_of(replaced.split()[0], requirements)
                at = f"{path}:{first.line}: {first.text}" if first else str(path)
                raise UserError(
                    f"{at}: installing it would replace what image {base_ref} has: {replaced}; "
                    "a layer cannot remove the base's files, so the image would hold both. "
                    "valid: the base's version (or no pin) for these packages, or another base "
                    "image.") from None
            raise ClusterctlError(f"installing the requirements of {path} on {base_ref} failed "
                                  f"(python {facts.version}, {facts.source}). {e.message}") from None
        packages = (_marker(lines, "INSTALLED") or "").split()
        labels = {
            L_DIGEST: digest, L_BASE: base_ref, L_BASE_ID: base_id, L_PACKAGES: " ".join(packages),
            L_PYTHON: facts.version, f"{LABEL_PREFIX}version": __version__,
            "org.opencontainers.image.base.name": base_ref,
        }
        (final / "Dockerfile").write_text(_final_dockerfile(base_id, stage_tag, labels))
        image_id = imagebuild.build(client, final, tag=tag, on_output=out)
    finally:
        remove_quietly(client, stage_tag)
        shutil.rmtree(scratch, ignore_errors=True)
    log(f"requirements layer {tag} ({image_id[:19]}): {' '.join(packages) or 'nothing new to install'}")
    return DepsImage(tag, image_id, digest, False, packages)


def requirements_image(base_ref: str, requirements: Path | str, *, client: DockerClient,
                       log: Callable[[str], None] | None = None) -> DepsImage:
    """The image ``FROM base_ref`` with ``requirements`` installed, built unless cached.

    Order: the file is checked (no engine); the base is inspected and the tag computed; an
    image with that tag is returned as is (``cached=True``).  Otherwise the Python to target
    is found, the wheels are downloaded on this machine (a package that cannot be had fails
    here, as a UserError naming its line; nothing is built), and the layer is built.  A file
    with no requirement lines gives the base image itself.
    """
    log = log or _logger.info
    path = Path(requirements)
    reqs = read_requirements(path)
    digest = digest_of(reqs)
    attrs = base_attrs(client, base_ref, log)
    base_id = attrs["Id"]
    if not reqs:
        log(f"{path} names no requirement: {base_ref} is used as it is")
        return DepsImage(base_ref, base_id, digest, True, [])
    tag = deps_tag(base_ref, base_id, normalised(reqs))
    hit = _cached(tag, image_attrs(client, tag), digest)
    if hit is not None:
        log(f"requirements layer {tag} is up to date with {path}; reused")
        return hit
    with _lock(tag, log):
        hit = _cached(tag, image_attrs(client, tag), digest)
        if hit is not None:
            return hit
        facts = python_facts(client, base_ref, attrs)
        log(f"requirements of {path} for python {facts.version} ({facts.source})")
        house = _wheelhouse(path, reqs, facts, log)
        return _build(client, tag, base_ref=base_ref, base_id=base_id, path=path,
                      requirements=reqs, house=house, facts=facts, log=log)
