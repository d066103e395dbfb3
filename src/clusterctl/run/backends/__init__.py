"""Run backends: one interface (:class:`~clusterctl.run.backends.base.Backend`), one module
per way of running a job, and the table below that names them once.

``ssh`` (the default: a container per node over SSH), ``slurm`` (an sbatch script) and
``kubernetes`` (renders a manifest only).  :func:`get` picks one by ``--scheduler``;
:func:`for_record` the one a recorded run went through.
"""

from __future__ import annotations

from clusterctl.core.errors import UserError, one_of
from clusterctl.core.text import shown
from clusterctl.run.backends.base import (
    Backend,
    BackendOption,
    Interrupted,
    RendersOnly,
    Status,
    Ui,
)
from clusterctl.run.backends.kubernetes import KubernetesBackend
from clusterctl.run.backends.slurm import SlurmBackend
from clusterctl.run.backends.ssh import SshBackend
from clusterctl.run.records import RunRecord
from clusterctl.run.request import LaunchRequest

#: Every backend, by the name ``--scheduler`` and the run record use.
BACKENDS: dict[str, Backend] = {b.name: b for b in (SshBackend(), SlurmBackend(), KubernetesBackend())}

__all__ = ["BACKENDS", "Backend", "BackendOption", "Interrupted", "RendersOnly", "Status", "Ui",
           "for_record", "get"]


def get(name: str) -> Backend:
    """The backend ``launch --scheduler NAME`` runs through; UserError naming the valid ones."""
    backend = BACKENDS.get(name)
    if backend is None or backend.renders_only:
        valid = [b.name for b in launchers()]
        raise UserError(f"--scheduler {shown(name)} is not a scheduler; valid: {one_of(valid)}.")
    return backend


def for_record(record: RunRecord) -> Backend:
    """The backend a recorded run went through (records before backends had one: ssh)."""
    return BACKENDS.get(record.scheduler or "ssh", BACKENDS["ssh"])


def launchers() -> list[Backend]:
    """The backends that start runs, in ``--scheduler``'s order."""
    return [b for b in BACKENDS.values() if not b.renders_only]


def for_request(req: LaunchRequest) -> Backend:
    """The backend a launch runs through: ``--scheduler``'s; ``--rerun`` and ``--resume``
    go on with a recorded SSH run."""
    return BACKENDS["ssh"] if req.resume is not None or req.rerun is not None else get(req.scheduler)


def launch_options() -> dict[str, BackendOption]:
    """Every backend's own ``launch`` options, by name, in the table's order."""
    return {name: opt for b in BACKENDS.values() for name, opt in b.options.items()}
