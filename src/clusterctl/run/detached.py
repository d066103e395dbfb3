"""A supervisor that outlives the terminal, and ``attach`` to follow it again.

``launch --detach`` of a run that clusterctl must keep watching (restarts, a hang
watchdog) cannot just start the containers and return: someone has to notice a failure
and start the next attempt.  So the launching process forks a *supervisor*: a process of
its own session (no controlling terminal: closing the terminal sends it no SIGHUP) whose
standard output and error go to ``runs/<id>/supervisor.log``, which runs the followed
launch to its end.  The launching process shows that log until the run's containers run
(or the supervisor ended first), then returns.  The record names the supervisor
(``RunRecord.launcher``): ``status`` tells whether it still runs, ``stop`` asks it to
stop the run (SIGTERM, as Ctrl-C would), and ``attach`` follows the run's merged output
attempt after attempt until it ends, exiting with its exit status.

A supervisor killed with SIGKILL leaves the containers running and findable by their
labels; ``launch --resume RUN`` takes the run over (:func:`clusterctl.run.launch.launch`
with ``resume``).

Contract: :func:`start` (fork; the parent's side returns a :class:`Started`),
:func:`attach` (follow the files to the end) and :func:`ask_to_stop`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from clusterctl.core.errors import ClusterctlError
from clusterctl.core.files import CHUNK, open_append, read_from
from clusterctl.core.paths import runs_dir
from clusterctl.run import records

SUPERVISOR_LOG = "supervisor.log"
#: States after which nothing more happens to a run.
_GOING = ("starting", "running", "restarting")


@dataclass
class Started:
    """What the launching process knows when it returns."""

    pid: int
    log: str
    exit_code: int | None = None     # the supervisor ended before the run ran: its status
    record: records.RunRecord | None = None


def start(run_id: str, follow: Callable[[], int], *, show: Callable[[str], None],
          poll: float = 0.2) -> Started:
    """Fork the supervisor, which calls ``follow()`` (the followed launch; its return value is
    the supervisor's exit status).  Here, ``show`` gets each line of its log until the run's
    containers run, the run ends, or the supervisor exits."""
    run_dir = records.own_run_dir(run_id)
    log = run_dir / SUPERVISOR_LOG
    open_append(log).close()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:                                       # the supervisor
        code = 1
        try:
            os.setsid()
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdin = open(0, closefd=False)         # noqa: SIM115 - the process's own stdio
            sys.stdout = open(1, "w", buffering=1, closefd=False)   # noqa: SIM115
            sys.stderr = open(2, "w", buffering=1, closefd=False)   # noqa: SIM115
            code = follow()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:  # noqa: BLE001 - written to the log, never lost
            print(f"supervisor: {e.__class__.__name__}: {e}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    offset = 0
    while True:
        offset = _show_new(log, offset, show)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _show_new(log, offset, show)
            return Started(pid, str(log), exit_code=os.waitstatus_to_exitcode(status))
        try:
            rec = records.load(run_id)
        except ClusterctlError:
            rec = None
        if rec is not None and (rec.state == "running" or rec.state not in _GOING):
            return Started(pid, str(log), record=rec)
        time.sleep(poll)


def _new_lines(path, offset: int) -> tuple[str, int]:
    """The complete lines of the run's file ``path`` after ``offset`` (one text, at most
    :data:`~clusterctl.core.files.CHUNK` bytes: call again for more; a line longer than that
    comes in pieces) and the new offset; none while the file is not there yet.

    Read as every file under the runs directory is (:func:`~clusterctl.core.files.read_from`):
    no symlink followed at any component below it, never a FIFO, never the whole file;
    UserError naming a file that is not to be read."""
    try:
        data = read_from(runs_dir(), path, offset, limit=CHUNK)
    except FileNotFoundError:
        return "", offset
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == CHUNK:       # a line longer than a chunk: this piece of it
        end = len(data)
    return data[:end].decode("utf-8", "replace"), offset + end


def _each_new(path, offset: int, take: Callable[[str], None]) -> int:
    """Hand ``take`` the complete lines of ``path`` after ``offset``, a chunk at a time, until
    none is left; the new offset."""
    while True:
        text, new = _new_lines(path, offset)
        if text:
            take(text)
        if new == offset:
            return offset
        offset = new


def _show_new(path, offset: int, show: Callable[[str], None]) -> int:
    """Show the complete lines of ``path`` after ``offset``; the new offset."""
    def each(text: str) -> None:
        for line in text.splitlines():
            show(line)
    return _each_new(path, offset, each)


def attach(run_id: str, stream: TextIO, *, note: Callable[[str], None], poll: float = 0.5,
           stop: Callable[[], bool] = lambda: False) -> records.RunRecord:
    """Follow a run's merged output, attempt after attempt, until it ends; its final record.

    ClusterctlError when the run is going on but nobody supervises it (its supervisor or
    launch died): ``launch --resume`` takes it over."""
    attempt, offset = None, 0
    while True:
        rec = records.load(run_id)
        if attempt is None:
            attempt = rec.attempt
            note(f"attach {run_id}: attempt {attempt}, {rec.state}")
        offset = _copy_new(rec.attempt_dir(attempt) / records.MERGED_LOG, offset, stream)
        if rec.attempt != attempt:             # the old attempt's file is read to its end
            attempt, offset = rec.attempt, 0
            note(f"attempt {attempt} started on {', '.join(n.node for n in rec.nodes)}")
            continue
        if rec.state not in _GOING:
            offset = _copy_new(rec.attempt_dir(attempt) / records.MERGED_LOG, offset, stream)
            return rec
        if records.launcher_gone(rec.launcher):
            raise ClusterctlError(
                f"run {run_id} is {rec.state} but its supervisor (pid "
                f"{rec.launcher.pid if rec.launcher else '?'}) is gone: nobody follows it. "
                f"`clusterctl launch --resume {run_id}` takes it over; `clusterctl stop "
                f"{run_id}` ends it.")
        if stop():
            return rec
        time.sleep(poll)


def _copy_new(path, offset: int, stream: TextIO) -> int:
    """Write the complete lines of ``path`` after ``offset`` to ``stream``; the new offset."""
    def each(text: str) -> None:
        stream.write(text)
        stream.flush()
    return _each_new(path, offset, each)


def ask_to_stop(record: records.RunRecord, *, timeout: float = 60.0) -> bool:
    """SIGTERM the process following ``record`` (its supervisor, or a launch in another
    terminal) when it runs on this machine, and wait until the record has an outcome.
    False when there is no such process here (or it did not finish in time)."""
    if record.launcher is None or records.launcher_gone(record.launcher) is not False:
        return False
    try:      # the pid comes from the record: signal it only when it is the record owner's process
        if os.stat(f"/proc/{record.launcher.pid}").st_uid != record.uid or record.uid is None:
            return False
        os.kill(record.launcher.pid, signal.SIGTERM)
    except OSError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if records.load(record.run_id).state not in _GOING:
            return True
        time.sleep(0.2)
    return False
