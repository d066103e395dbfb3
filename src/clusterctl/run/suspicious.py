"""Collective-library errors in a run's output: a run that "succeeded" after one is suspicious (pure).

A training script that catches an exception, or a launcher that swallows a worker's
failure, can leave every process exiting 0 after NCCL (or gloo, oneCCL, CNCL) reported
an error - SkyPilot #4421: a job shown as succeeded after an NCCL error on a worker.
clusterctl reads every output line anyway (:mod:`clusterctl.run.logs`), so the
supervisor gives each to a :class:`Scanner` (:func:`classify` with each node's context: the
lines of torchrun's exit-barrier report are none); when all containers exit 0 but a line
matched, the run ends *suspicious* (exit :data:`SUSPICIOUS_EXIT`), not succeeded, and
the matching lines are in the summary and ``run.json``.

The patterns are errors, not warnings: ``NCCL WARN`` lines, NCCL_DEBUG=INFO chatter
and c10d's store warnings do not match.  Each pattern names its library; they are the
``errors`` of each backend in the accelerator table (core/data/accelerators.yaml), and
torch.distributed's own (:func:`patterns`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from clusterctl.core import accelerators, exitcodes

#: Exit status of a run whose containers all exited 0 while its output shows a
#: collective-library error (next to 124, the hang watchdog's: as with GNU timeout).
SUSPICIOUS_EXIT = exitcodes.SUSPICIOUS  # 125

#: How many matching lines a run keeps (the first ones: what came later is mostly fallout).
KEEP = 20

#: Errors of torch.distributed itself, whichever backend: tried after every backend's.
_TORCH_DISTRIBUTED: tuple[tuple[str, re.Pattern[str]], ...] = (
    # its own exception types for a backend or network failure
    ("torch.distributed", re.compile(r"\b(?:torch\.distributed\.)?Dist(?:Backend|Network|Store)Error\b")),
)


def patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """(library, pattern): an error line of that collective library (or of torch.distributed
    about it), searched anywhere in the line (prefixes such as ``[rank1]:`` vary).  Every
    backend's ``errors`` of the accelerator table (:mod:`clusterctl.core.accelerators`), in
    its order, then torch.distributed's own; the first match names the library."""
    return (*accelerators.load().error_patterns(), *_TORCH_DISTRIBUTED)


#: :func:`patterns` of the shipped table, as one tuple.
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = patterns()


@dataclass(frozen=True)
class Finding:
    """One output line that shows a collective-library error."""

    node: str
    rank: int
    library: str
    line: str


# A C++ stack frame of a torch exception ("frame #2: c10::DistNetworkError::DistNetworkError(...")
# names a function, the error class's constructor among them; it reports nothing itself (the
# exception's own message line does).
_CPP_FRAME = re.compile(r"^frame #[0-9]+: ")
# torchrun's exit barrier: once every local worker has SUCCEEDED, each node's agent waits in a
# store barrier hosted by node rank 0's agent, which exits as soon as the barrier is complete.
# A slower agent (16 nodes on a busy machine) then logs "Error waiting on exit barrier" with the
# store's DistNetworkError, and exits 0 - after the training, not in a collective.  Its lines
# share one glog prefix (level, date, time, pid, file:line), which marks the whole report.
_GLOG_PREFIX = re.compile(r"^([IWEF][0-9]{4} [0-9:.]+ +[0-9]+ \S+:[0-9]+\])")
_EXIT_BARRIER = re.compile(r"\] Error waiting on exit barrier\b")


def classify(text: str) -> str | None:
    """The library whose error ``text`` (one output line) shows, else None."""
    if _CPP_FRAME.match(text):
        return None
    for library, pattern in accelerators.load().error_patterns():
        if pattern.search(text):
            return library
    for library, pattern in _TORCH_DISTRIBUTED:
        if pattern.search(text):
            return library
    return None


class Scanner:
    """:func:`classify` over each node's lines in order, with the context one line lacks: the
    lines of torchrun's exit-barrier report (see ``_EXIT_BARRIER``) are no collective error."""

    def __init__(self) -> None:
        self._exit_barrier: dict[str, str] = {}  # node -> the glog prefix of its report

    def classify(self, node: str, text: str) -> str | None:
        m = _GLOG_PREFIX.match(text)
        if m is not None:
            if _EXIT_BARRIER.search(text):
                self._exit_barrier[node] = m.group(1)
                return None
            if self._exit_barrier.get(node) == m.group(1):
                return None
        return classify(text)


def findings(lines: Iterable[tuple[str, int, str]], keep: int = KEEP) -> list[Finding]:
    """The first ``keep`` lines of (node, rank, text) that show a collective error."""
    found: list[Finding] = []
    scanner = Scanner()
    for node, rank, text in lines:
        library = scanner.classify(node, text)
        if library is not None:
            found.append(Finding(node, rank, library, text))
            if len(found) >= keep:
                break
    return found


def summary_lines(found: list[Finding]) -> list[str]:
    """What launch prints for a suspicious run."""
    if not found:
        return []
    libs = ", ".join(sorted({f.library for f in found}))
    lines = [f"SUSPICIOUS: every container exited 0, but the output shows a collective-library error "
             f"({libs}); exit status {SUSPICIOUS_EXIT} (not a clean success). First lines:"]
    lines += [f"  {f.node}[{f.rank}]| {f.line}" for f in found[:5]]
    return lines
