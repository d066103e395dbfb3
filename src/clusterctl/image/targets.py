"""Build targets: per-stack facts loaded from ``src/clusterctl/image/data/*.yaml``.

A target is one accelerator stack (cpu, ipex, accl, nccl, cambricon, base).
What differs between stacks -- base image, build args, pinned versions, the
``docker run`` flags and devices a container needs, default env, backend name,
the smoke command that proves the stack imports, the image tag -- is data in
``targets.yaml`` and the torch version tables next to it, so adding a stack or
a torch version is a data change, not a code change.  This module validates
that data and resolves a target plus a ``--torch`` choice into concrete values
(``Resolved``) that rendering, building and launching use.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from clusterctl.core import accelerators
from clusterctl.core.errors import UserError, did_you_mean, one_of
from clusterctl.core.text import shown
from clusterctl.core.yamlfile import FileProblems, Problems, parse, read_text, show, validate_model

DATA_DIR = Path(__file__).resolve().parent / "data"
TARGETS_FILE = DATA_DIR / "targets.yaml"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSpec(_Model):
    """What ``docker run`` needs for this stack on a node."""

    flags: list[str] = []
    devices: list[str] = []
    per_slot_devices: list[str] = []   # "{i}" is the slot index 0..slots-1
    optional_devices: list[str] = []   # passed only where the node has them

    def devices_for(self, slots: int) -> list[str]:
        """Devices every node passes, plus one per slot (e.g. /dev/cambricon_dev0..N-1)."""
        return [*self.devices, *(d.format(i=i) for i in range(slots) for d in self.per_slot_devices)]


class FlightRecorder(_Model):
    """PyTorch's collective flight recorder, as a launch turns it on (see targets.yaml)."""

    env: dict[str, str] = {}
    dump_env: list[str] = []           # set to f"{dir}/{prefix}": where each rank dumps
    dir: str                           # in the container; bind-mounted from the run's node dir
    prefix: str = "nccl_trace_rank_"   # torch appends the rank

    def environment(self) -> dict[str, str]:
        return {**self.env, **{name: f"{self.dir}/{self.prefix}" for name in self.dump_env}}


class PipFacts(_Model):
    """How an image built FROM the local base installs Python packages (bookworm's python3
    has no pip): these replace the target's own pip facts when a build is FROM that base."""

    python: str                        # CPython minor version of the base (picks the wheels)
    pip: str
    pip_setup: str | None = None
    pip_flags: list[str] = []
    wheelhouse: Literal["required", "optional"] = "required"
    # install in a throw-away build stage and copy only what pip installed, so the
    # wheels never become an image layer (needs a base whose pip paths are its own)
    install_stage: bool = False


class TorchSpec(_Model):
    """Which torch versions a target can be built with."""

    default: str
    versions: list[str] = []
    table: str | None = None           # a version-table file in DATA_DIR


class Target(_Model):
    name: str
    description: str
    template: str | None
    base_image: str | None
    build_args: dict[str, str] = {}
    pins: dict[str, str] = {}
    torch: TorchSpec | None
    requirements: list[str] = []
    wheelhouse: Literal["required", "optional"] = "optional"
    pip: str | None
    pip_setup: str | None = None
    pip_flags: list[str] = []
    entrypoint_env: list[str] = []
    run: RunSpec
    env: dict[str, str] = {}
    passthrough_env: list[str] = []
    flight_recorder: FlightRecorder | None = None
    images_built_on_it: PipFacts | None = None   # only the local base: how images FROM it run pip
    backend: str | None                          # a backend of the accelerator table
    device: str = "cpu"                          # a device kind of the accelerator table
    needs: str
    smoke: list[str]
    tag: str

    @property
    def renderable(self) -> bool:
        return self.template is not None

    def torch_versions(self) -> list[str]:
        """Known torch versions, in table order; [] when torch comes with the base image."""
        if self.torch is None:
            return []
        if self.torch.table:
            return list(version_table(self.torch.table).versions)
        return list(self.torch.versions)


class IndexSpec(_Model):
    option: Literal["-f", "--extra-index-url", "--index-url"]
    url: str

    def pip_args(self) -> list[str]:
        return [self.option, self.url]


class TableRow(_Model):
    """One torch version of a version table (e.g. IPEX + oneccl_bind_pt pins)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    index: str | None = None
    torch_index: str | None = None


class VersionTable(_Model):
    indexes: dict[str, IndexSpec] = {}
    versions: dict[str, TableRow]


class Tool(_Model):
    """A tool every rendered image carries for clusterctl's own use on running containers."""

    requirement: str                   # a pip requirement line, e.g. py-spy==0.4.3
    check: list[str]                   # argv run in the built image; it must exit 0


class Resolved(_Model):
    """A target with its torch version chosen: the values templates and builds use."""

    target: Target
    torch: str | None
    pins: dict[str, str] = Field(default_factory=dict)     # torch, ipex, ccl_module, python, ...
    indexes: list[IndexSpec] = []                          # wheel indexes, in pip order
    base_image: str | None
    requirements: list[str] = []
    tools: list[Tool] = []                                 # installed besides requirements
    smoke: list[str]
    entrypoint_env: list[str] = []
    tag: str
    # how the image runs pip: the target's own facts, or the local base's when FROM it
    pip: str | None = None
    pip_setup: str = ""
    pip_flags: list[str] = []
    wheelhouse: Literal["required", "optional"] = "optional"
    install_stage: bool = False

    @property
    def tool_requirements(self) -> list[str]:
        return [t.requirement for t in self.tools]


class TargetDataError(FileProblems):
    """Every problem of one target data file (``FILE:LINE: field: problem; valid: ...``), exit 2."""

    what = "target data"


def _read(path: Path) -> tuple[Any, Problems]:
    """The values of a data file and its problem collector (lines of every key path)."""
    problems = Problems(path, error=TargetDataError)
    return parse(read_text(path, "target data"), problems, like="the other entries of this file"), problems


def load_targets(path: Path | None = None) -> dict[str, Target]:
    """All targets by name, validated (a bad data file is a TargetDataError naming line and
    field); ``path`` None: :data:`TARGETS_FILE`, read when called.  A target's ``device`` and
    ``backend`` must be in the accelerator table (:mod:`clusterctl.core.accelerators`)."""
    return _load_targets(Path(path) if path is not None else TARGETS_FILE)


def _accelerator_problems(name: str, target: Target, problems: Problems) -> None:
    """A problem for a ``device`` or ``backend`` the accelerator table does not know."""
    table = accelerators.load()
    where = f"one of the {{}} of {accelerators.ACCELERATORS_FILE.name} ({{}})"
    if target.device not in table.devices:
        problems.add(("targets", name, "device"), f"{show(target.device)} is not a known device kind",
                     where.format("devices", one_of(table.device_names())))
    if target.backend is not None and target.backend not in table.backends:
        problems.add(("targets", name, "backend"), f"{show(target.backend)} is not a known backend",
                     where.format("backends", one_of(list(table.backends))) + " or null")


@cache
def _load_targets(path: Path) -> dict[str, Target]:
    raw, problems = _read(path)
    section = raw.get("targets") if isinstance(raw, dict) else raw
    if not isinstance(section, dict):
        problems.add(("targets",), f"{show(section)} is not a mapping of targets",
                     "targets: with one mapping per target name")
        problems.raise_if_any()
    targets = {}
    _tools(raw, problems)
    for name, body in section.items():
        if isinstance(body, dict) and "name" in body:
            problems.add(("targets", name, "name"), "a target is named by its key under targets:",
                         "no name: field")
            continue
        target = validate_model(Target, {**body, "name": name} if isinstance(body, dict) else body,
                           ("targets", name), problems)
        if target is not None:
            _accelerator_problems(name, target, problems)
            targets[name] = target
    problems.raise_if_any()
    return targets


def _tools(raw: Any, problems: Problems) -> list[Tool]:
    """The top-level ``tools:`` list of the targets file, validated."""
    found = raw.get("tools", []) if isinstance(raw, dict) else []
    if not isinstance(found, list):
        problems.add(("tools",), f"{show(found)} is not a list",
                     "a list of {requirement: pip requirement, check: [argv]}")
        return []
    tools = [validate_model(Tool, item, ("tools", i), problems) for i, item in enumerate(found)]
    return [t for t in tools if t is not None]


def image_tools(path: Path | None = None) -> list[Tool]:
    """What every image clusterctl renders carries besides its stack (py-spy, for the hang
    watchdog's stack dumps): the ``tools:`` list of targets.yaml."""
    return _image_tools(Path(path) if path is not None else TARGETS_FILE)


@cache
def _image_tools(path: Path) -> list[Tool]:
    raw, problems = _read(path)
    tools = _tools(raw, problems)
    problems.raise_if_any()
    return tools


@cache
def version_table(filename: str) -> VersionTable:
    raw, problems = _read(DATA_DIR / filename)
    table = validate_model(VersionTable, raw or {}, (), problems)
    problems.raise_if_any()
    return table


def target_names() -> list[str]:
    return list(load_targets())


def get_target(name: str) -> Target:
    """The target called ``name``, or a UserError listing the known ones."""
    targets = load_targets()
    if name in targets:
        return targets[name]
    raise UserError(
        f'unknown target "{shown(name, quoted=False)}"{did_you_mean(name, list(targets))}. '
        f"Known targets: {one_of(list(targets))} (see `clusterctl targets`)."
    )


def _fmt(text: str, values: dict[str, str], where: str) -> str:
    try:
        return text.format(**values)
    except KeyError as e:
        raise UserError(f"{TARGETS_FILE}: {where} uses {{{e.args[0]}}}, which this target does not define "
                        f"(defined: {one_of(sorted(values)) or 'none'}).") from None


def _torch_pins(target: Target, torch: str | None) -> tuple[str | None, dict[str, str], list[IndexSpec]]:
    """(torch version, pins of its table row, wheel indexes) for ``--torch`` (None: the default)."""
    spec = target.torch
    if spec is None:
        if torch is not None:
            raise UserError(
                f"target {target.name} takes torch from its base image ({target.base_image}); "
                f"--torch {shown(torch, quoted=False)} cannot change it. Pick another base with --base-image REF."
            )
        return None, {}, []
    version = torch or spec.default
    known = target.torch_versions()
    if version not in known:
        raise UserError(
            f"torch {shown(version, quoted=False)} is not known for target {target.name}{did_you_mean(version, known)}. "
            f"Known versions: {one_of(known)}"
            + (f" (table src/clusterctl/image/data/{spec.table})." if spec.table else ".")
        )
    pins: dict[str, str] = {"torch": version}
    indexes: list[IndexSpec] = []
    if spec.table:
        table = version_table(spec.table)
        row = table.versions[version]
        pins.update({k: str(v) for k, v in (row.model_extra or {}).items()})
        for key in (row.torch_index, row.index):
            if key is None:
                continue
            if key not in table.indexes:
                raise UserError(f"{DATA_DIR / spec.table}: versions.{version} names index {key!r}, "
                                f"which is not under indexes ({one_of(sorted(table.indexes))}).")
            indexes.append(table.indexes[key])
    return version, pins, indexes


def _local_base_facts(target: Target, base_image: str | None) -> PipFacts | None:
    """The local base's pip facts when ``target`` builds FROM it (e.g. ``--target ipex
    --base-image clusterctl/base:bookworm``), else None."""
    if not target.renderable or base_image is None:
        return None
    for other in load_targets().values():
        if other.images_built_on_it is not None and other.tag == base_image:
            return other.images_built_on_it
    return None


def resolve(name: str, torch: str | None = None, *, base_image: str | None = None) -> Resolved:
    """The target ``name`` with its torch version and every templated field filled in."""
    target = get_target(name)
    version, pins, indexes = _torch_pins(target, torch)
    values = {**target.pins, **pins}
    if base_image and target.torch is None:
        # The pinned facts describe the default base image, not another one.
        values = {k: v for k, v in values.items() if k != "torch"}
    base = base_image or (target.base_image and _fmt(target.base_image, values, "base_image"))
    pip = _local_base_facts(target, base)
    if pip is not None:
        values["python"] = pip.python  # the wheels must fit the base's CPython, not the table's
    return Resolved(
        target=target,
        torch=version,
        pins=values,
        indexes=indexes,
        base_image=base,
        requirements=[_fmt(r, values, "requirements") for r in target.requirements],
        tools=image_tools() if target.renderable else [],
        smoke=[_fmt(a, values, "smoke") for a in target.smoke],
        entrypoint_env=[_fmt(line, values, "entrypoint_env") for line in target.entrypoint_env],
        tag=_fmt(target.tag, values, "tag"),
        pip=pip.pip if pip else target.pip,
        pip_setup=(pip.pip_setup if pip else target.pip_setup) or "",
        pip_flags=pip.pip_flags if pip else target.pip_flags,
        wheelhouse=pip.wheelhouse if pip else target.wheelhouse,
        install_stage=pip.install_stage if pip else False,
    )
