"""The hang watchdog's work on the nodes: dump every rank's stacks, save them, name the odd ranks.

``launch --hang-timeout DURATION`` (or the job key ``hang_timeout``) makes the supervisor
(:mod:`clusterctl.run.supervise`) watch the merged output: when no rank has written a line
for that long, the run is hung.  Before it is torn down, :func:`dump_stacks`:

1. runs :data:`clusterctl.run.stacks.DUMP_SCRIPT` in every node's container, in parallel
   (``docker exec CONTAINER python3 -c SCRIPT``, argv over the node's SSH connection,
   bounded in time): py-spy dumps the Python stacks of every rank process.  The containers
   of a run with a hang timeout get ``--cap-add=SYS_PTRACE`` (:data:`PTRACE_OPTIONS`), the
   one capability py-spy needs to read another process of the container;
2. saves them under ``runs/<id>/stacks/`` (one ``<node>-rank<R>.txt`` per rank process);
3. names the ranks whose stacks differ from the majority, or that are stopped, or could not
   be dumped (:func:`clusterctl.run.stacks.odd_ranks`).

The supervisor then stops every container and the run exits :data:`HANG_EXIT` (124).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.cluster.containers import exec_in_container
from clusterctl.core import exitcodes
from clusterctl.core.deadline import bounded
from clusterctl.core.durations import show_duration
from clusterctl.run.logs import Source
from clusterctl.run.stacks import (
    DUMP_SCRIPT,
    DUMP_TIMEOUT,
    NodeDump,
    Odd,
    RankStack,
    majority_frame,
    odd_ranks,
    parse_dump,
    stack_file_name,
    stack_file_text,
)

if TYPE_CHECKING:
    from clusterctl.cluster.transport import Cluster, NodeConnection

#: Exit status of a run the watchdog found hung (as GNU timeout's).
HANG_EXIT = exitcodes.HUNG  # 124

#: ``docker run`` options a run with a hang timeout adds: py-spy reads another process's
#: memory (process_vm_readv / ptrace), which needs CAP_SYS_PTRACE in the container.
PTRACE_OPTIONS = ("--cap-add=SYS_PTRACE",)

#: The directory under runs/<id>/ where the stacks go.
STACKS_DIR = "stacks"


@dataclass
class HangReport:
    """What the watchdog found and did."""

    timeout: float                     # the hang timeout, seconds
    silent_for: float                  # seconds without output when the hang was declared
    last_output: float                 # epoch seconds of the last line (or of the start)
    detected: float                    # epoch seconds when the hang was declared
    dumps: list[NodeDump] = field(default_factory=list)
    odd: list[Odd] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    stacks_dir: Path | None = None
    majority: str | None = None        # the innermost frame where the majority waits
    dump_seconds: float = 0.0
    error: str = ""                    # the dump as a whole failed (the run is torn down anyway)
    starting: bool = False             # hung before the job had started (its start timeout)
    start_line: str | None = None      # the hang_start_line that had not been seen

    @property
    def stacks(self) -> list[RankStack]:
        return [s for d in self.dumps for s in d.stacks]

    @property
    def node_errors(self) -> dict[str, str]:
        return {d.node: d.error for d in self.dumps if d.error}

    def summary_lines(self) -> list[str]:
        """The end-of-run report of a hung run."""
        if self.starting:
            head = ("HANG: the job did not start: no rank wrote "
                    + (f"a line matching '{self.start_line}' (hang_start_line)" if self.start_line
                       else "its first line")
                    + f", and no output for {show_duration(self.silent_for)} "
                      f"(--hang-start-timeout {show_duration(self.timeout)})")
        else:
            head = (f"HANG: no rank wrote output for {show_duration(self.silent_for)} "
                    f"(--hang-timeout {show_duration(self.timeout)})")
        lines = [f"{head}; stacks of {len(self.stacks)} rank "
                 f"process{'es' if len(self.stacks) != 1 else ''} dumped with py-spy in "
                 f"{self.dump_seconds:.1f}s" + (f" into {self.stacks_dir}" if self.files else "")]
        if self.majority:
            lines.append(f"the majority waits in {self.majority}")
        if self.stacks and all(s.rank is None for s in self.stacks):
            lines.append("no rank process was found (no process with LOCAL_RANK: the job may still be "
                         "starting, e.g. torchrun importing torch); the Python processes' stacks are saved")
        if self.odd:
            lines.append("ranks not with the majority:")
            lines += [f"  {o.stack.label} (pid {o.stack.pid}): {o.reason}" for o in self.odd]
        elif self.majority:
            lines.append("every rank's stack is the same: no rank stands out")
        elif self.stacks:
            lines.append("no majority: the stacks differ, and no rank is stopped or undumpable")
        for node, why in sorted(self.node_errors.items()):
            lines.append(f"NO STACKS from {node}: {why}")
        if self.error:
            lines.append(f"NO STACKS: dumping them failed: {self.error}")
        return lines

    def record(self) -> dict:
        """For run.json."""
        return {"timeout_seconds": self.timeout, "silent_seconds": round(self.silent_for, 3),
                "phase": "start" if self.starting else "running",
                "last_output": _iso(self.last_output), "detected": _iso(self.detected),
                "dump_seconds": round(self.dump_seconds, 3),
                "stacks_dir": str(self.stacks_dir) if self.stacks_dir else None,
                "files": [p.name for p in self.files], "majority_frame": self.majority,
                "odd_ranks": [{"node": o.stack.node, "rank": o.stack.rank, "pid": o.stack.pid,
                               "state": o.stack.state, "reason": o.reason} for o in self.odd],
                "node_errors": self.node_errors, "error": self.error}


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


def dump_node(conn: NodeConnection, src: Source, *, image: str = "",
              timeout: float = DUMP_TIMEOUT * 2 + 30) -> NodeDump:
    """Every rank process's stacks in ``src``'s container (bounded by ``timeout``)."""
    argv = ["python3", "-c", DUMP_SCRIPT, str(DUMP_TIMEOUT)]
    res = bounded(lambda: exec_in_container(conn, src.container, argv, timeout=timeout), timeout + 5,
                  name=f"stacks-{src.node}")
    if res.exit_code != 0 and not res.stdout.strip():
        why = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        if res.exit_code in (126, 127) or "executable file not found" in why:
            why = f"no python3 in the container to look for rank processes ({why})"
        return NodeDump(src.node, error=f"docker exec failed: {why}")
    return parse_dump(src.node, res.stdout, image)


def dump_stacks(cluster: Cluster, sources: Sequence[Source], run_dir: Path, *, timeout: float,
                silent_for: float, last_output: float, image: str = "", starting: bool = False,
                start_line: str | None = None) -> HangReport:
    """Dump, save and compare the stacks of every rank of the run (see the module docstring).
    ``timeout``: the silence that was allowed; ``starting``: before the job had started."""
    report = HangReport(timeout=timeout, silent_for=silent_for, last_output=last_output,
                        detected=time.time(), starting=starting, start_line=start_line)
    t0 = time.monotonic()
    by_node = {s.node: s for s in sources}
    got = cluster.map(lambda conn: dump_node(conn, by_node[conn.name], image=image), nodes=list(by_node))
    for node in by_node:  # rank order
        r = got.get(node)
        report.dumps.append(r if isinstance(r, NodeDump)
                            else NodeDump(node, error=getattr(r, "reason", str(r))))
    report.dump_seconds = time.monotonic() - t0
    report.odd = odd_ranks(report.stacks)
    report.majority = majority_frame(report.stacks)
    if report.stacks:
        out = run_dir / STACKS_DIR
        out.mkdir(parents=True, exist_ok=True)
        for s in report.stacks:
            path = out / stack_file_name(s)
            path.write_text(stack_file_text(s), encoding="utf-8")
            report.files.append(path)
        report.stacks_dir = out
    return report
