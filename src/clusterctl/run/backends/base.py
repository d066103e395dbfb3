"""The run-backend interface: what every way of running a job offers, declared once.

A backend starts a prepared launch (:class:`clusterctl.run.request.Prepared`) and looks
after the runs it started: their logs, status, stop, and its own form of the job's
recovery policy.  The CLI picks a backend once, by ``--scheduler`` for a new run and by the
run record for an existing one (:func:`clusterctl.run.backends.for_record`), and never
branches on the scheduler itself.  A backend that only renders (Kubernetes) says so with
``renders_only`` and refuses the rest.

Backends print nothing themselves: what a person sees goes through :class:`Ui`, which the
CLI implements (library users pass their own).

How to add a backend (docs/concepts/design.md says the same):

1. a module in ``run/backends/`` with a :class:`Backend` subclass: its ``name`` (the
   ``--scheduler`` word and the record's ``scheduler``), its ``options`` (``launch`` flags
   of its own, name -> :class:`BackendOption`), and the methods below;
2. one line in ``run/backends/__init__.py``'s ``BACKENDS``;
3. tests in ``tests/run/`` and a how-to page.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TextIO

from clusterctl.core.errors import UserError
from clusterctl.run import records
from clusterctl.run.jobs import Job
from clusterctl.run.request import LaunchRequest


class Ui(Protocol):
    """What a backend shows a person (the CLI prints it; a library user may collect it)."""

    stdout: TextIO      # the job's own output (followed runs, logs)
    stderr: TextIO
    progress: Any       # push progress (clusterctl.cli.push.PlainProgress or alike)

    def note(self, line: str) -> None:
        """A line about what is happening (stderr)."""

    def say(self, line: str) -> None:
        """A line of the command's result (stdout)."""

    def echo(self, text: str) -> None:
        """Text exactly as given (a plan, a script, JSON) on stdout."""

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], *,
              stderr: bool = False) -> None:
        """A table of plain cells."""


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) before anything was started: the launch ends with ``exit_code``."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


@dataclass
class Status:
    """A run's nodes as the backend sees them now."""

    rows: list[records.NodeStatus]
    note: str = ""                       # one line of the backend's own (the Slurm job's state)
    extra: dict[str, Any] = field(default_factory=dict)   # in --json, beside the nodes


@dataclass(frozen=True)
class BackendOption:
    """A ``launch`` option of one backend's own (``--partition``): the CLI adds it to
    ``launch`` and passes its value in ``LaunchRequest.scheduler_options``; another backend
    refuses it when given."""

    flag: str
    help: str
    default: Any = None
    kind: str = "str"          # the value as typed: str or int


class Backend(ABC):
    """One way to run a job: start it, follow it, tell its status, stop it."""

    name: ClassVar[str]
    #: the backend's own ``launch`` options (``launch --help`` lists them): name -> option
    options: ClassVar[dict[str, BackendOption]] = {}
    #: True: the backend only renders (a manifest to apply elsewhere); it starts nothing
    renders_only: ClassVar[bool] = False
    #: True: a run's containers stay on the nodes after it ended until `stop` removes them
    leaves_containers: ClassVar[bool] = False

    def check(self, req: LaunchRequest, others: Sequence[Backend]) -> None:
        """Refuse options this backend does not take (another backend's, given)."""
        given = [opt.flag for b in others if b is not self
                 for key, opt in b.options.items()
                 if req.scheduler_options.get(key, opt.default) != opt.default]
        if given:
            owners = ", ".join(sorted({b.name for b in others if b is not self and b.options}))
            raise UserError(f"{', '.join(given)}: only with --scheduler {owners}; {self.only_note}")

    #: what the refusal of another backend's options adds (how this backend picks nodes)
    only_note: ClassVar[str] = ""

    @abstractmethod
    def launch(self, req: LaunchRequest, ui: Ui) -> int:
        """Run (or, with ``req.dry_run``, show) the launch ``req``; its exit status."""

    @abstractmethod
    def logs(self, record: records.RunRecord, ui: Ui, *, node: str | None, follow: bool,
             tail: int | None, nodes: Path | None) -> int:
        """Show a run's merged output (``follow``: until it ends); an exit status."""

    @abstractmethod
    def attach(self, record: records.RunRecord, ui: Ui) -> int:
        """Follow a run again to its end; the run's exit status."""

    @abstractmethod
    def status(self, record: records.RunRecord, ui: Ui, *, nodes: Path | None) -> Status:
        """Each node of a run now (the record settled with what was found)."""

    @abstractmethod
    def stop(self, record: records.RunRecord, ui: Ui, *, nodes: Path | None, grace: int) -> int:
        """Stop a run everywhere; 0, or 1 when a node could not be reached."""

    def refresh(self, record: records.RunRecord) -> None:  # noqa: B027 - most have nothing to do
        """Make ``record`` say what is true now, cheaply (``clusterctl runs``)."""

    @abstractmethod
    def recovery(self, job: Job) -> Any:
        """The job's recovery policy in this backend's own form."""


class RendersOnly(Backend):
    """A backend that renders a manifest for another system to run: everything that would
    act on a run is refused."""

    renders_only = True

    def _refuse(self, what: str):
        raise UserError(f"the {self.name} backend only renders a manifest (`clusterctl export`); "
                        f"{what} is the cluster's own (kubectl).")

    def launch(self, req: LaunchRequest, ui: Ui) -> int:
        self._refuse("starting it")

    def logs(self, record: records.RunRecord, ui: Ui, *, node: str | None, follow: bool,
             tail: int | None, nodes: Path | None) -> int:
        self._refuse("its logs")

    def attach(self, record: records.RunRecord, ui: Ui) -> int:
        self._refuse("following it")

    def status(self, record: records.RunRecord, ui: Ui, *, nodes: Path | None) -> Status:
        self._refuse("its status")

    def stop(self, record: records.RunRecord, ui: Ui, *, nodes: Path | None, grace: int) -> int:
        self._refuse("stopping it")
