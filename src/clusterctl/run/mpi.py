"""The ``mpi`` contract: each node's processes get exactly the rank variables that
``mpirun -f hostfile -n N -ppn P`` (MPICH's or Intel MPI's hydra) gives them.

seeds/000 and 001 start oneCCL training with ``mpirun``.  The programs they start
(transformers' Trainer with ``--xpu_backend ccl``, ``accelerate launch``, and
oneccl_bindings_for_pytorch under ``init_process_group("ccl")``) read their place in the
job from hydra's variables and rendezvous through torch's TCP store at ``MASTER_ADDR``;
they never call ``MPI_Init``.  So clusterctl does not run mpirun (which would need SSH
from container to container and an MPI in every image): it starts one container per node
as for every job, and in it this module's spawner starts the node's processes with the
variables hydra would give.  The container's environment carries the per-node half
(:data:`clusterctl.run.jobs.CONTRACTS` ``["mpi"]``: ``PMI_SIZE``, ``MPI_LOCALNRANKS``,
``PMI_HOSTNAME``); the spawner adds the per-process half, :func:`process_env`:
``PMI_RANK`` = the node's first rank + i and ``MPI_LOCALRANKID`` = i.

Not given: hydra's ``PMI_FD`` / ``HYDI_CONTROL_FD`` (file descriptors of hydra's PMI
server, which does not exist here).  A program that calls ``MPI_Init`` (mpi4py, an MPI
build of oneCCL with ``CCL_ATL_TRANSPORT=mpi``) needs a real mpirun.

The spawner is the container's PID 1: it starts each process in a process group of its
own, forwards SIGTERM/SIGINT to every group, and as soon as one process exits non-zero it
terminates the others (their whole groups) and exits with that code
(a process killed by signal S counts as 128+S), as hydra does; 0 when all exit 0.  It is
Python source passed with ``python3 -c`` (every image clusterctl builds has python3), so
nothing is copied to the node.  Pure: this module only builds argv.
"""

from __future__ import annotations

from collections.abc import Sequence

from clusterctl.core.text import digits

#: The interpreter that runs the spawner in the container.
PYTHON = "python3"

#: What the spawner's argv holds between the source and the command.
SEPARATOR = "--"

#: The spawner: ``python3 -c SPAWNER FIRST_RANK NPROC -- COMMAND...``.
SPAWNER = """\
import os, signal, sys
first, count, cmd = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4:]
procs = {}
def stop(sig=signal.SIGTERM, _frame=None):
    for pid in procs:   # each its own process group, not yet reaped: no pid reuse
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
for i in range(count):
    env = dict(os.environ, PMI_RANK=str(first + i), MPI_LOCALRANKID=str(i))
    try:
        procs[os.posix_spawnp(cmd[0], cmd, env, setsid=True)] = i
    except OSError as e:
        print(f"clusterctl mpi: cannot start {cmd[0]!r}: {e}", file=sys.stderr, flush=True)
        stop()
        sys.exit(127)
status = 0
while procs:
    pid, raw = os.wait()
    if procs.pop(pid, None) is None:
        continue
    code = os.waitstatus_to_exitcode(raw)
    code = 128 - code if code < 0 else code
    if code and not status:
        status = code
        stop()
sys.exit(status)
"""


def spawn_command(first_rank: int | str, nproc: int, command: Sequence[str]) -> list[str]:
    """The container command that starts ``nproc`` copies of ``command`` with hydra's
    per-process variables, ranks ``first_rank`` .. ``first_rank + nproc - 1`` (a scheduler's
    stand-in for a value known only at run time is passed through as text)."""
    return [PYTHON, "-c", SPAWNER, str(first_rank), str(nproc), SEPARATOR, *command]


def split_spawn(command: Sequence[str]) -> tuple[int | str, int, list[str]] | None:
    """(first rank, processes, inner command) of a :func:`spawn_command`, else None."""
    head = [PYTHON, "-c", SPAWNER]
    if list(command[:3]) != head or len(command) < 6 or command[5] != SEPARATOR:
        return None
    first = command[3]
    return (int(first) if digits(first) else first), int(command[4]), list(command[6:])


def process_env(first_rank: int, nproc: int) -> list[dict[str, str]]:
    """The per-process variables the spawner adds, one dict per local process."""
    return [{"PMI_RANK": str(first_rank + i), "MPI_LOCALRANKID": str(i)} for i in range(nproc)]


__all__ = ["PYTHON", "SPAWNER", "process_env", "spawn_command", "split_spawn"]
