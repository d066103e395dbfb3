"""What a run does after one of its attempts ends: restart, swap in a spare, shrink, or stop.

Pure: facts in (the job's policy, how each attempt ended, which nodes are left), a
:class:`Decision` out.  :mod:`clusterctl.run.launch` runs the attempts and asks
:func:`decide` after each; nothing here touches a machine.

The rules, in the order they apply (docs/how-to/restarts.md says the same):

1. the run succeeded, was stopped by the user (Ctrl-C, SIGTERM, ``clusterctl stop``) or
   ended suspicious (exit 0 with a collective error in the output): it ends so;
2. a rank exited with a code of the job's ``fatal_on_exit``: the run ends with that code;
3. a crash loop: the same failure (node, exit code, last line) ``exclude_after`` (K, at
   least 2) times in a row, or, with a checkpoint directory, :data:`NO_PROGRESS_ATTEMPTS` attempts
   in a row that left no new file there: the run ends with ``CRASH_LOOP`` (121);
4. which nodes are excluded for the rest of the run: a lost node or one whose engine
   died (at once), a node blamed for K failures (an exit code below 128 that is not in
   ``retry_on_exit``; the odd ranks of a hang).  A code in ``retry_on_exit`` and a death by
   signal (128 and above: killed from outside) blame nobody;
5. the restart budget: a code in ``retry_on_exit`` restarts without counting; every other
   failure counts, and a failure after ``max_restarts`` counted restarts ends the run with
   ``RESTARTS_EXHAUSTED`` (120) (with ``max_restarts: 0`` the run ends with its own
   exit status, as without recovery).  At most :data:`MAX_ATTEMPTS` attempts in all;
6. the next attempt's nodes (:func:`replace_nodes`): each excluded node's place (its
   rank) goes to the first spare left; with no spare the run shrinks only down to the
   job's ``nnodes`` MIN, else it ends with ``NOT_ENOUGH_NODES`` (122).  Rank 0 is simply
   whoever holds the first place, so losing the master is like losing any other node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from clusterctl.core import exitcodes

RESTARTS_EXHAUSTED = exitcodes.RESTARTS_EXHAUSTED
CRASH_LOOP = exitcodes.CRASH_LOOP
NOT_ENOUGH_NODES = exitcodes.NOT_ENOUGH_NODES

#: Attempts in a row without a new file in the checkpoint directory that make a crash loop.
NO_PROGRESS_ATTEMPTS = 3
#: Attempts of one run at most, counted or not (a retryable code that never stops).
MAX_ATTEMPTS = 100
#: States an attempt ends in that are final whatever the policy says.
_FINAL = {"succeeded": None, "suspicious": None, "interrupted": None}


@dataclass(frozen=True)
class Policy:
    """A job's recovery keys (:class:`clusterctl.run.jobs.Job`), with the flags' values."""

    max_restarts: int = 0
    retry_on_exit: frozenset[int] = frozenset()
    fatal_on_exit: frozenset[int] = frozenset()
    exclude_after: int = 3
    min_nodes: int | None = None      # None: never fewer nodes than the run started with
    checkpoint: str | None = None

    @classmethod
    def of(cls, job, *, max_restarts: int | None = None, checkpoint: str | None = None) -> Policy:
        return cls(max_restarts=job.max_restarts if max_restarts is None else max_restarts,
                   retry_on_exit=frozenset(job.retry_on_exit),
                   fatal_on_exit=frozenset(job.fatal_on_exit),
                   exclude_after=job.exclude_after, min_nodes=job.min_nodes,
                   checkpoint=checkpoint if checkpoint is not None else job.checkpoint)

    @property
    def recovers(self) -> bool:
        """Whether a failure may be followed by another attempt at all."""
        return self.max_restarts > 0 or bool(self.retry_on_exit)


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended, reduced to what the rules need."""

    attempt: int
    state: str                       # succeeded | failed | hung | suspicious | interrupted | start-failed
    exit_code: int
    node: str | None = None          # the first failure's node (None: no failure, or a hang)
    kind: str | None = None          # exit | lost | hang | start | check
    last_line: str = ""              # the failed rank's last output line
    lost: tuple[str, ...] = ()       # nodes that stopped answering (or whose engine died)
    blamed: tuple[str, ...] = ()     # nodes a hang report names (odd ranks)
    checkpoint: str | None = None    # the checkpoint directory's newest file after it (None: unknown)

    @property
    def signature(self) -> tuple:
        """What makes two failures "the same failure"."""
        return (self.kind, self.node, self.exit_code, self.last_line.strip())


@dataclass(frozen=True)
class Decision:
    """What to do after an attempt: ``restart`` (with the nodes to exclude) or ``end``."""

    action: str                      # restart | end
    exit_code: int                   # the run's exit status when it ends
    reason: str                      # in words, for the terminal and the record
    counted: bool = False            # the restart counts against max_restarts
    exclude: dict[str, str] = field(default_factory=dict)   # node -> why, excluded from now on


def blamed_nodes(end: AttemptEnd, policy: Policy) -> list[str]:
    """The nodes one failure counts against (rule 4)."""
    if end.kind == "hang":
        return list(end.blamed)
    if end.kind in ("exit", "start") and end.node is not None:
        if end.exit_code in policy.retry_on_exit or end.exit_code >= 128:
            return []
        return [end.node]
    return []


def blame_counts(history: Sequence[AttemptEnd], policy: Policy) -> Counter:
    """How many failures of the run each node is blamed for."""
    return Counter(n for end in history for n in blamed_nodes(end, policy))


def crash_loop(history: Sequence[AttemptEnd], policy: Policy, initial_checkpoint: str | None = None
               ) -> str | None:
    """Why the run is a crash loop (rule 3), or None."""
    k = max(2, policy.exclude_after)     # once is no loop
    last = list(history[-k:])
    if len(last) == k and all(e.state not in _FINAL for e in last) and len({e.signature for e in last}) == 1:
        e = last[-1]
        what = f"{e.node} lost" if e.kind == "lost" else (
            "a hang" if e.kind == "hang" else f"{e.node} exited {e.exit_code}")
        line = f" ({e.last_line.strip()[:160]})" if e.last_line.strip() else ""
        return f"the same failure {k} times in a row: {what}{line}"
    if policy.checkpoint and len(history) >= NO_PROGRESS_ATTEMPTS:
        marks = [initial_checkpoint, *(e.checkpoint for e in history)]
        window = marks[-(NO_PROGRESS_ATTEMPTS + 1):]
        if None not in window[1:] and len(set(window)) == 1:
            return (f"no checkpoint progress in {NO_PROGRESS_ATTEMPTS} attempts: nothing new in "
                    f"{policy.checkpoint} (newest: {window[-1] or 'nothing'})")
    return None


def decide(history: Sequence[AttemptEnd], policy: Policy, *, excluded: Mapping[str, str] = (),
           initial_checkpoint: str | None = None) -> Decision:
    """What follows the last attempt of ``history`` (rules 1-5; the nodes: :func:`replace_nodes`).

    ``excluded``: the nodes excluded before this attempt ended (not excluded twice)."""
    end = history[-1]
    if end.state in _FINAL:
        return Decision("end", end.exit_code, f"attempt {end.attempt} {end.state}")
    if end.kind in ("exit", "start") and end.exit_code in policy.fatal_on_exit:
        return Decision("end", end.exit_code, f"{end.node} exited {end.exit_code}, which the job "
                                              "marks fatal (fatal_on_exit)")
    if not policy.recovers:
        return Decision("end", end.exit_code, f"attempt {end.attempt} {end.state}; no restarts "
                                              "allowed (max_restarts: 0)")
    loop = crash_loop(history, policy, initial_checkpoint)
    if loop:
        return Decision("end", CRASH_LOOP, "crash loop: " + loop)
    exclude = {n: "lost (stopped answering, or its Docker engine died)" for n in end.lost
               if n not in excluded}
    counts = blame_counts(history, policy)
    for node in blamed_nodes(end, policy):
        if counts[node] >= policy.exclude_after and node not in excluded and node not in exclude:
            exclude[node] = f"blamed for {counts[node]} failures (exclude_after: {policy.exclude_after})"
    counted = not (end.kind in ("exit", "start") and end.exit_code in policy.retry_on_exit)
    used = sum(1 for e in history[:-1] if _counted(e, policy))
    if counted and used >= policy.max_restarts:
        return Decision("end", RESTARTS_EXHAUSTED if policy.max_restarts else end.exit_code,
                        f"restarts exhausted: {used} of {policy.max_restarts} used", exclude=exclude)
    if len(history) >= MAX_ATTEMPTS:
        return Decision("end", RESTARTS_EXHAUSTED, f"{MAX_ATTEMPTS} attempts, the most one run may make",
                        exclude=exclude)
    why = _failure_words(end)
    return Decision("restart", end.exit_code, f"{why}: restart" + ("" if counted else
                    " (retryable exit code: not counted)") + f" {used + counted}/{policy.max_restarts}",
                    counted=counted, exclude=exclude)


def _counted(end: AttemptEnd, policy: Policy) -> bool:
    return end.state not in _FINAL and not (end.kind in ("exit", "start")
                                            and end.exit_code in policy.retry_on_exit)


def _failure_words(end: AttemptEnd) -> str:
    if end.kind == "lost":
        return f"{end.node} lost"
    if end.kind == "hang":
        return "hung"
    if end.kind == "check":
        return "nodes failed their checks"
    return f"{end.node} exited {end.exit_code}" if end.node else f"attempt {end.attempt} {end.state}"


class NotEnoughNodes(Exception):
    """No spare left and the job may not shrink further (NOT_ENOUGH_NODES)."""


def replace_nodes(current: Sequence[str], spares: Sequence[str], exclude: Mapping[str, str], *,
                  min_nodes: int | None) -> tuple[list[str], list[str], dict[str, str]]:
    """The next attempt's nodes in rank order, the spares left, and who replaced whom.

    Each excluded node's place goes to the first spare left (so it takes that rank); with
    no spare left the place is dropped, down to ``min_nodes`` (None: no fewer than now).
    NotEnoughNodes saying what is missing otherwise."""
    floor = len(current) if min_nodes is None else min_nodes
    left = [s for s in spares if s not in exclude]
    nodes: list[str] = []
    swaps: dict[str, str] = {}
    for node in current:
        if node not in exclude:
            nodes.append(node)
        elif left:
            swaps[node] = left.pop(0)
            nodes.append(swaps[node])
    if len(nodes) < floor:
        gone = [n for n in current if n in exclude]
        raise NotEnoughNodes(
            f"{len(gone)} node(s) excluded ({', '.join(f'{n}: {exclude[n]}' for n in gone)}) and "
            f"{'no spare is left' if not left else 'too few spares'}: {len(nodes)} node(s) remain, "
            f"the run needs {floor}" + ("" if min_nodes is not None else
                                        " (give spares with `spare: true`, or let the job shrink "
                                        "with nnodes: MIN:MAX)"))
    return nodes, left, swaps


def initial_nodes(active: Sequence[str], spares: Sequence[str], *, max_nodes: int | None,
                  min_nodes: int | None) -> tuple[list[str], list[str]]:
    """The first attempt's nodes and its spares: the first ``max_nodes`` non-spare nodes
    (all without ``nnodes``), the rest of them spares before the inventory's spares."""
    if max_nodes is None:
        return list(active), list(spares)
    if len(active) < (min_nodes or max_nodes):
        raise NotEnoughNodes(f"the job needs {min_nodes or max_nodes} node(s) (nnodes) and the "
                             f"inventory has {len(active)} that are not spares")
    return list(active[:max_nodes]), [*active[max_nodes:], *spares]


def environment(run_id: str, attempt: int, excluded: Sequence[str], checkpoint: str | None
                ) -> dict[str, str]:
    """The resume contract every container of an attempt gets (the same on every rank)."""
    env = {"CLUSTERCTL_RUN_ID": run_id, "CLUSTERCTL_ATTEMPT": str(attempt),
           "CLUSTERCTL_EXCLUDED_NODES": ",".join(excluded)}
    if checkpoint:
        env["CLUSTERCTL_CHECKPOINT_DIR"] = checkpoint
    return env


#: The resume contract, for the container environment reference (docs/reference).
RESUME_ENV: dict[str, str] = {
    "CLUSTERCTL_RUN_ID": "The run's id: the same in every attempt of the run.",
    "CLUSTERCTL_ATTEMPT": "0 in the first attempt, then 1, 2, ... after each restart; the same "
                          "on every rank of an attempt.",
    "CLUSTERCTL_EXCLUDED_NODES": "The inventory names of the nodes excluded so far, comma-separated "
                                 "(empty in the first attempt).",
    "CLUSTERCTL_CHECKPOINT_DIR": "Only with `checkpoint` / `launch --checkpoint DIR`: the directory, "
                                 "mounted at the same path in every container, to save to and "
                                 "resume from.",
}
