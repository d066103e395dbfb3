"""Accelerators: the device kinds ranks compute on and the collective backends, one table.

What clusterctl knows about an accelerator -- its torch device type, how a node's driver
version is read, which docker run argument gives a container the device and which
Kubernetes resource that becomes, the collective backend's name, the module the
collective probe imports, the error lines the log scanner knows -- is data in
``core/data/accelerators.yaml`` (its fields are described at its top).  Every layer may
read it: image (a target's ``device`` and ``backend`` must be in it), cluster (the driver
probe of preflight), run (the collective probe, export's resources, the log scanner) and
cli (``check --backend``).  Adding an accelerator is data: docs/how-to/add-a-target.md.

Contract:
    ACCELERATORS_FILE                  the shipped table
    load(path=None) -> Accelerators    validated and cached per path (None: ACCELERATORS_FILE,
                                       read when called); a bad entry is an
                                       ``AcceleratorDataError`` naming the file, line and field
    Accelerators.devices / .backends   {name: Device} / {name: Backend}, in the file's order
    Accelerators.backend_names()       the default backend first, then the file's order
    Accelerators.error_patterns()      ((backend, compiled re), ...) in the file's order
    Accelerators.driver_probe()        shell text printing "NAME VERSION" of the first driver
                                       the node has (an empty line when none)
    Device.driver_needed(version)      (full, minor-compat) oldest driver for a toolkit version
    version_key(text)                  a dotted version as a tuple of ints, for comparing
Pure apart from reading the file.
"""

from __future__ import annotations

import re
import shlex
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from clusterctl.core.errors import one_of
from clusterctl.core.yamlfile import FileProblems, Problems, parse, read_text, show, validate_model

DATA_DIR = Path(__file__).resolve().parent / "data"
ACCELERATORS_FILE = DATA_DIR / "accelerators.yaml"

_NAME = re.compile(r"[a-z][a-z0-9_-]*\Z")           # a device kind or backend name
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")  # a driver's command or printed name
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Driver(_Model):
    """How preflight reads a node's driver version (see the data file)."""

    command: str        # an executable on the node's PATH: the node has this accelerator
    name: str           # printed before the version ("nvidia 550.54.15")
    version: str        # a shell command printing the version on one line

    @field_validator("command", "name")
    @classmethod
    def _word(cls, value: str) -> str:
        if not _WORD.match(value):
            raise ValueError("must be one word of letters, digits, '.', '_', '+' or '-'")
        return value


class Device(_Model):
    """A device kind (torch's device type): its driver, container argument and resource."""

    name: str
    description: str
    unit: str | None = None                 # one device in messages (GPU, MLU)
    driver: Driver | None = None
    docker_flag: str | None = None          # e.g. --gpus (value: all, N or count=N)
    device_files: list[str] = []            # host device file prefixes (--device)
    kubernetes_resource: str | None = None  # e.g. nvidia.com/gpu
    cdi_kind: str | None = None             # e.g. nvidia.com/gpu (CDI runtimes' device names)
    toolkit: str | None = None              # e.g. CUDA
    min_driver: dict[str, str] = {}         # toolkit MAJOR.MINOR[.PATCH] -> oldest driver
    compat_driver: dict[str, str] = {}      # toolkit MAJOR -> oldest driver of minor compatibility
    hardware_errors: dict[int, str] = {}    # driver error code (Xid) -> meaning: the hardware failed
    # what its collective library says when two ranks of a node share one device (a node
    # given more processes than devices): preflight names it when it refuses such a plan
    shared_device_error: str | None = None

    @field_validator("cdi_kind")
    @classmethod
    def _cdi(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z0-9.-]+\.[a-z]+/[a-z0-9_.-]+", value):
            raise ValueError("must be a CDI device kind such as nvidia.com/gpu")
        return value

    @field_validator("min_driver", "compat_driver")
    @classmethod
    def _versions(cls, value: dict[str, str]) -> dict[str, str]:
        for key, driver in value.items():
            if not re.fullmatch(r"\d+(?:\.\d+){0,2}", str(key)):
                raise ValueError(f"key {key!r} is not a toolkit version such as 12.3 or 12.3.1")
            if not re.fullmatch(r"\d+(?:\.\d+)*", str(driver)):
                raise ValueError(f"{key}: {driver!r} is not a driver version such as 545.23.08")
        return value

    def driver_needed(self, toolkit_version: str) -> tuple[str | None, str | None]:
        """(the oldest driver that runs ``toolkit_version`` fully, the oldest that runs it by
        minor version compatibility) from ``min_driver`` / ``compat_driver``; None where the
        table has no row (an unknown release: nothing is judged)."""
        want = version_key(toolkit_version)
        if len(want) < 2:
            return None, None
        rows = [(version_key(k), v) for k, v in self.min_driver.items()
                if version_key(k)[:2] == want[:2] and version_key(k) <= want]
        full = max(rows)[1] if rows else None
        return full, self.compat_driver.get(str(want[0]))

    @field_validator("docker_flag")
    @classmethod
    def _flag(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"--[a-z][a-z0-9-]*", value):
            raise ValueError("must be a long docker run flag such as --gpus")
        return value

    @field_validator("device_files")
    @classmethod
    def _files(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/dev/") or len(path) <= len("/dev/"):
                raise ValueError(f"{path!r} is not a device file prefix under /dev/")
        return value

    def covers(self, path: str) -> bool:
        """Whether host device file ``path`` is one of this kind's ``device_files``."""
        return any(path == p or path.startswith(p if p.endswith("_") else p + "/")
                   for p in self.device_files)


def version_key(text: str) -> tuple[int, ...]:
    """'545.23.08' -> (545, 23, 8); '12.3.2.001' -> (12, 3, 2, 1); digits up to the first
    other character of each part (pure; () for no digits)."""
    out = []
    for part in str(text).strip().lstrip("vV").split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


class Backend(_Model):
    """A torch.distributed collective backend: its device, probe import and error lines."""

    name: str
    device: str
    module: list[str] = []
    version: Literal["torch", "nccl", "module"]
    errors: list[str] = []

    @field_validator("module")
    @classmethod
    def _modules(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _MODULE.match(name):
                raise ValueError(f"{name!r} is not a Python module name")
        return value

    @field_validator("errors")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for i, rx in enumerate(value):
            try:
                re.compile(rx)
            except re.error as e:
                raise ValueError(f"item {i}: {rx!r} is not a regular expression ({e})") from None
        return value

    def probe_config(self) -> dict[str, Any]:
        """What the collective probe needs to know of this backend (in its JSON input)."""
        return {"device": self.device, "module": list(self.module), "version": self.version}


class Accelerators(_Model):
    default_backend: str
    devices: dict[str, Device]
    backends: dict[str, Backend]

    def backend_names(self) -> tuple[str, ...]:
        """Every backend, the default first (as ``check --backend`` lists them)."""
        return (self.default_backend, *(b for b in self.backends if b != self.default_backend))

    def device_names(self) -> tuple[str, ...]:
        return tuple(self.devices)

    @cached_property
    def _compiled(self) -> tuple[tuple[str, re.Pattern[str]], ...]:
        return tuple((b.name, re.compile(rx)) for b in self.backends.values() for rx in b.errors)

    def error_patterns(self) -> tuple[tuple[str, re.Pattern[str]], ...]:
        """(backend, pattern) of every backend's error lines, in the file's order."""
        return self._compiled

    def driver_probe(self) -> str:
        """Shell text printing the first driver the node has, as ``NAME VERSION`` (the
        devices' order), else an empty line."""
        arms = [f"command -v {shlex.quote(d.driver.command)} >/dev/null 2>&1; then "
                f'printf "{d.driver.name} "; {d.driver.version}; '
                for d in self.devices.values() if d.driver is not None]
        if not arms:
            return "echo"
        return "if " + "elif ".join(arms) + "else echo; fi"


class AcceleratorDataError(FileProblems):
    """Every problem of the accelerator table (``FILE:LINE: field: problem; valid: ...``), exit 2."""

    what = "accelerator data"


def _section(raw: dict, key: str, model: type[_Model], problems: Problems) -> dict[str, Any]:
    found = raw.get(key)
    if not isinstance(found, dict) or not found:
        problems.add((key,), f"{show(found)} is not a mapping of {key}",
                     f"{key}: with one mapping per name")
        return {}
    out = {}
    for name, body in found.items():
        if not isinstance(name, str) or not _NAME.match(name):
            problems.add((key, name), f"the name {show(name)} is not a lower-case word",
                         "letters, digits, '_' and '-', starting with a letter")
            continue
        if isinstance(body, dict) and "name" in body:
            problems.add((key, name, "name"), f"an entry is named by its key under {key}:",
                         "no name: field")
            continue
        item = validate_model(model, {**body, "name": name} if isinstance(body, dict) else body,
                         (key, name), problems)
        if item is not None:
            out[name] = item
    return out


@cache
def _load(path: Path) -> Accelerators:
    problems = Problems(path, error=AcceleratorDataError)
    raw = parse(read_text(path, "accelerator data"), problems, like="the shipped accelerators.yaml")
    if not isinstance(raw, dict):
        problems.add((), f"{show(raw)} is not a mapping", "default_backend:, devices: and backends:")
        problems.raise_if_any()
    for key in raw:
        if key not in ("default_backend", "devices", "backends"):
            problems.add((key,), f'unknown field "{key}"', "default_backend:, devices: and backends:")
    devices = _section(raw, "devices", Device, problems)
    backends = _section(raw, "backends", Backend, problems)
    named = list(raw["devices"]) if isinstance(raw.get("devices"), dict) else []  # valid or not
    for name, backend in backends.items():
        if backend.device not in named and named:
            problems.add(("backends", name, "device"), f"{show(backend.device)} is not a device of this file",
                         f"one of {one_of(named)}")
    default = raw.get("default_backend")
    if default not in backends and backends:
        problems.add(("default_backend",), f"{show(default)} is not a backend of this file",
                     f"one of {one_of(list(backends))}")
    problems.raise_if_any()
    return Accelerators(default_backend=default, devices=devices, backends=backends)


def load(path: Path | None = None) -> Accelerators:
    """The accelerator table at ``path`` (None: :data:`ACCELERATORS_FILE`), validated once."""
    return _load(Path(path) if path is not None else ACCELERATORS_FILE)
