"""The exit statuses of the ``clusterctl`` command: one table, its numbers named.

Every number a command ends with is one of these constants (or, for ``launch``, the
exit code of a container of the run: :data:`CONTAINER`).  The reference page
``docs/reference/exit-status.md`` and each command's section of
``docs/reference/cli.md`` are generated from :data:`EXIT_STATUSES`, so a status
added here is documented there; tests/docs/test_reference.py checks that every
number the source raises is in the table.
"""

from __future__ import annotations

from dataclasses import dataclass

OK = 0
#: Something failed that is no input mistake: a node not ready, a push or a start that
#: failed, a node ``stop`` could not reach, a ClusterctlError that is not a UserError.
FAILURE = 1
#: Bad input (a file, a flag, a value; ``UserError``) or a failed preflight: nothing was
#: started.  Also click's own usage errors (an unknown option, a missing argument).
BAD_INPUT = 2
#: ``launch --max-restarts N``: the run failed again after its N restarts.
RESTARTS_EXHAUSTED = 120
#: A crash loop: the same failure ``exclude_after`` times in a row, or 3 attempts without
#: checkpoint progress; the run stopped itself.
CRASH_LOOP = 121
#: Nodes failed and neither a spare nor the job's ``nnodes: MIN:MAX`` let the run go on.
NOT_ENOUGH_NODES = 122
#: The hang watchdog found the run hung (as GNU timeout exits).
HUNG = 124
#: Every container exited 0 but the output shows a collective-library error.
SUSPICIOUS = 125
#: Ctrl-C (128 + SIGINT), after every container of the run was stopped.
INTERRUPTED = 130
#: SIGTERM (128 + SIGTERM), after every container was stopped; also the status recorded
#: for a run ``clusterctl stop`` stopped.
TERMINATED = 143
#: The first failure was a node that stopped answering (as ssh reports a lost connection).
NODE_LOST = 255

#: ``commands`` value of a status every command may end with.
ALL = "*"


@dataclass(frozen=True)
class ExitStatus:
    """One row of the table: the number (None: a container's own exit code), a short
    name, what it means, and the commands (space-separated paths such as ``launch`` or
    ``sandbox status``; :data:`ALL` for every command) that may end with it."""

    code: int | None
    name: str
    meaning: str
    commands: tuple[str, ...] = (ALL,)

    def applies_to(self, command: str) -> bool:
        """True when the command ``command`` (``"launch"``, ``"sandbox up"``) may end with it."""
        return ALL in self.commands or command in self.commands


#: Every exit status, in numeric order (the container's own code last).
EXIT_STATUSES: tuple[ExitStatus, ...] = (
    ExitStatus(OK, "ok", "Success: the command did what it was asked; for `launch`, every "
               "container exited 0 and the output showed no collective-library error."),
    ExitStatus(FAILURE, "failed", "A failure that is not an input mistake: `check` found a node "
               "not ready, `push` failed on a node, `launch` could not push the image or start a "
               "container (nothing left running), `stop` could not reach a node, `exec` found a "
               "node whose command did not exit 0 (or timed out, or could not be reached), `top --once` "
               "found a node that did not answer, "
               "`engine status` found no engine, `sandbox status --name` found no such sandbox, "
               "`clean` could not list a node or remove what it chose there."),
    ExitStatus(BAD_INPUT, "bad input", "Bad input: an unknown option or command, a malformed "
               "value, an invalid inventory or job file (every problem as `FILE:LINE: field: "
               "problem; valid: ...`), a missing tool, or a failed preflight of `launch`. Nothing "
               "was started or changed."),
    ExitStatus(RESTARTS_EXHAUSTED, "restarts exhausted", "The run failed after using every "
               "restart `--max-restarts` (the job's `max_restarts`) allowed; `runs`, `status` and "
               "run.json say why each attempt ended.", ("launch", "attach")),
    ExitStatus(CRASH_LOOP, "crash loop", "The run stopped itself: the same failure (node, exit "
               "code, last line) `exclude_after` times in a row, or 3 attempts in a row without a "
               "new file in the checkpoint directory.", ("launch", "attach")),
    ExitStatus(NOT_ENOUGH_NODES, "not enough nodes", "Nodes were excluded (lost, failing their "
               "checks, or blamed too often) and no spare was left to take their ranks, and the "
               "job's `nnodes: MIN:MAX` does not allow fewer nodes.", ("launch", "attach")),
    ExitStatus(HUNG, "hung", "The hang watchdog (`--hang-timeout`, the job's `hang_timeout`) "
               "saw no output from any rank for that long: the stacks were dumped to "
               "`runs/<run-id>/stacks/` and the run was stopped.", ("launch", "attach")),
    ExitStatus(SUSPICIOUS, "suspicious", "Every container exited 0, but the output shows a "
               "collective-library error (NCCL, gloo, oneCCL, ...): not a clean success.",
               ("launch", "attach")),
    ExitStatus(INTERRUPTED, "interrupted", "Ctrl-C (SIGINT): `launch` stopped every container "
               "of the run first; `logs --follow` and `attach` just stop following.", ("launch", "logs", "attach")),
    ExitStatus(TERMINATED, "terminated", "SIGTERM: `launch` stopped every container of the run "
               "first. Also the exit status recorded for a run `clusterctl stop` stopped.",
               ("launch", "attach")),
    ExitStatus(NODE_LOST, "node lost", "The first failure of the run was a node that stopped "
               "answering (15 s without an answer from its sshd).", ("launch", "attach")),
    ExitStatus(None, "the container's exit code", "Any other status: the exit code of the run's first "
               "failed container, by finish time on its node (`logs --follow` of a Slurm run "
               "ends with the run's exit status; `shell` ends with its shell's own exit status).",
               ("launch", "logs", "attach", "shell")),
)


def statuses_for(command: str) -> list[ExitStatus]:
    """The rows that apply to ``command`` (a space-separated path: ``"sandbox up"``)."""
    return [s for s in EXIT_STATUSES if s.applies_to(command)]


def codes() -> frozenset[int]:
    """Every numbered exit status of the table."""
    return frozenset(s.code for s in EXIT_STATUSES if s.code is not None)
