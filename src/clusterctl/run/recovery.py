"""What a run does after one of its attempts ends: restart, swap in a spare, shrink, or stop.

Pure: facts in (the job's policy, how each attempt ended, which nodes are left), a
:class:`Decision` out.  :mod:`clusterctl.run.launch` runs the attempts and asks
:func:`decide` after each; nothing here touches a machine.

The rules are one table, :data:`RULES`, in the order they apply: each a :class:`Rule` with
its condition as data (``when``; an exit-code rule's codes: a job key or fixed codes), its
action (end, exclude a node, not counted, restart), the exit status it ends with, and how
Slurm and Kubernetes say it (:class:`Form`; None with the reason where they cannot).
:func:`decide` evaluates the table; the sbatch script's requeue block
(:func:`clusterctl.run.slurm.script.recovery_shell`) and an export's restart policy
(:func:`clusterctl.run.export.recovery_settings`) are generated from it, and
docs/how-to/restarts.md shows it (:func:`rules_markdown`; a test keeps the page equal).
In short: a success or a stop ends the run; a ``retry_on_exit`` code restarts without
counting; a ``fatal_on_exit`` code ends it with that code; a crash loop ends it with
``CRASH_LOOP`` (121); lost nodes and nodes blamed ``exclude_after`` times are excluded;
used-up restarts end it with ``RESTARTS_EXHAUSTED`` (120); any other failure restarts.

The next attempt's nodes (:func:`replace_nodes`): each excluded node's place (its rank)
goes to the first spare left; with no spare the run shrinks only down to the job's
``nnodes`` MIN, else it ends with ``NOT_ENOUGH_NODES`` (122).  Rank 0 is simply whoever
holds the first place, so losing the master is like losing any other node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clusterctl.core import exitcodes

if TYPE_CHECKING:
    from clusterctl.run.jobs import Job

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
    def of(cls, job: Job, *, max_restarts: int | None = None, checkpoint: str | None = None) -> Policy:
        return cls(max_restarts=job.max_restarts if max_restarts is None else max_restarts,
                   retry_on_exit=frozenset(job.retry_on_exit),
                   fatal_on_exit=frozenset(job.fatal_on_exit),
                   exclude_after=job.exclude_after, min_nodes=job.min_nodes,
                   checkpoint=checkpoint if checkpoint is not None else job.checkpoint)

    @property
    def recovers(self) -> bool:
        """Whether a failure may be followed by another attempt at all (:func:`recovers`)."""
        return recovers(self)


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


# --------------------------------------------------------------------------- the rules

#: What a rule does when its condition holds (:attr:`Rule.action`), in words.
ACTIONS: dict[str, str] = {
    "end": "end the run",
    "exclude": "exclude the node for the rest of the run; the next rules go on",
    "not-counted": "a restart that follows does not count and blames no node; the next rules go on",
    "restart": "restart",
}


@dataclass(frozen=True)
class Form:
    """How one engine (Slurm, Kubernetes) says a rule: ``says``, in words, or None and
    ``why`` it cannot (an exit-code rule's codes are then reported where a job lists them:
    the sbatch script's comments, launch's notes, an export's header notes)."""

    says: str | None
    why: str = ""


@dataclass(frozen=True)
class Rule:
    """One recovery rule: a condition (``when``, and for an exit-code rule its codes), an
    action, the exit status it ends the run with, and its forms on Slurm and Kubernetes.

    ``when`` is one of :data:`CONDITIONS`' keys; :func:`decide` evaluates it, the Slurm
    script's generator and the export's generator read it.  An ``exit-code`` rule holds when
    a rank exited (or its container could not start) with one of its codes: the job key
    ``codes_key`` lists them (``fatal_on_exit``), or ``codes`` fixes them for every job."""

    name: str
    when: str
    action: str
    doc: str                          # one line: the condition and what follows
    status: int | None = None         # the run's exit status when it ends (None: the attempt's own)
    codes_key: str | None = None      # exit-code: the job key that lists the codes ...
    codes: frozenset[int] = frozenset()   # ... or these codes, whatever the job says
    slurm: Form = Form(None)
    kubernetes: Form = Form(None)

    def __post_init__(self):
        if self.when not in CONDITIONS or self.action not in ACTIONS:
            raise ValueError(f"rule {self.name}: unknown condition {self.when!r} or action {self.action!r}")
        if (self.when == "exit-code") != (bool(self.codes_key) != bool(self.codes)):
            raise ValueError(f"rule {self.name}: an exit-code rule, and only one, has a codes_key "
                             "or codes (not both)")

    @property
    def label(self) -> str:
        """What reports call the rule's codes by: its job key, else its name."""
        return self.codes_key or self.name

    def codes_of(self, keys) -> tuple[int, ...]:
        """An exit-code rule's codes for a :class:`Policy` or a job (the job key's, in the
        job's order; the fixed ones sorted); () for any other rule."""
        if self.when != "exit-code":
            return ()
        return tuple(getattr(keys, self.codes_key)) if self.codes_key else tuple(sorted(self.codes))


@dataclass
class _Facts:
    """What the conditions look at, and what the rules passed so far decided."""

    history: Sequence[AttemptEnd]
    policy: Policy
    rules: Sequence[Rule]
    excluded: Mapping[str, str]
    initial_checkpoint: str | None
    exclude: dict[str, str] = field(default_factory=dict)
    counted: bool = True

    @property
    def end(self) -> AttemptEnd:
        return self.history[-1]

    @property
    def used(self) -> int:
        return sum(1 for e in self.history[:-1] if _counted(e, self.policy, self.rules))


def _exit_code(rule: Rule, f: _Facts):
    e = f.end
    if e.kind not in ("exit", "start") or e.exit_code not in rule.codes_of(f.policy):
        return None
    if rule.action == "exclude":
        return {e.node: f"exited {e.exit_code} ({rule.label})"} if e.node and e.node not in f.excluded else {}
    if rule.action == "end":
        return f"{e.node} exited {e.exit_code}, which " + (
            f"the job marks fatal ({rule.codes_key})" if rule.codes_key else f"ends the run ({rule.name})")
    return f"{e.node} exited {e.exit_code}"


def _no_restarts(rule: Rule, f: _Facts):
    if recovers(f.policy, f.rules):
        return None
    return f"attempt {f.end.attempt} {f.end.state}; no restarts allowed (max_restarts: 0)"


def _crash_loop(rule: Rule, f: _Facts):
    loop = crash_loop(f.history, f.policy, f.initial_checkpoint)
    return "crash loop: " + loop if loop else None


def _blamed(rule: Rule, f: _Facts):
    counts = blame_counts(f.history, f.policy, rules=f.rules)
    return {node: f"blamed for {counts[node]} failures (exclude_after: {f.policy.exclude_after})"
            for node in blamed_nodes(f.end, f.policy, rules=f.rules)
            if counts[node] >= f.policy.exclude_after and node not in f.excluded and node not in f.exclude}


def _restarts_used(rule: Rule, f: _Facts):
    if not (f.counted and f.used >= f.policy.max_restarts):
        return None
    return (f"restarts exhausted: {f.used} of {f.policy.max_restarts} used",
            rule.status if f.policy.max_restarts else f.end.exit_code)


def _failure(rule: Rule, f: _Facts):
    return (f"{_failure_words(f.end)}: restart" + ("" if f.counted else " (retryable exit code: not counted)")
            + f" {f.used + f.counted}/{f.policy.max_restarts}")


#: Each condition a rule may have (:attr:`Rule.when`) and how :func:`decide` evaluates it:
#: None (it does not hold), a reason (an ``end``/``restart`` rule's words; with an ``end``
#: rule's status as a pair where it is not the rule's), or the nodes to exclude.
CONDITIONS: dict[str, Callable[[Rule, _Facts], object]] = {
    "succeeded": lambda rule, f: (f"attempt {f.end.attempt} {f.end.state}"
                                  if f.end.state in ("succeeded", "suspicious") else None),
    "stopped": lambda rule, f: (f"attempt {f.end.attempt} {f.end.state}"
                                if f.end.state == "interrupted" else None),
    "exit-code": _exit_code,
    "no-restarts": _no_restarts,
    "crash-loop": _crash_loop,
    "lost": lambda rule, f: {n: "lost (stopped answering, or its Docker engine died)"
                             for n in f.end.lost if n not in f.excluded},
    "blamed": _blamed,
    "restarts-used": _restarts_used,
    "attempts-used": lambda rule, f: (f"{MAX_ATTEMPTS} attempts, the most one run may make"
                                      if len(f.history) >= MAX_ATTEMPTS else None),
    "failure": _failure,
    "no-spare": lambda rule, f: None,     # replace_nodes' (NotEnoughNodes), after the decision
}


_NODES_SLURM = ("Slurm picks each attempt's nodes with `--nnodes` (and requeues on a node failure "
                "by itself); with `--nodes FILE` the job names its nodes, and a requeued attempt "
                "waits for them")
_NODES_KUBE = "the scheduler picks the pods' nodes"

#: The recovery rules, in the order :func:`decide` applies them (the first ``end`` or
#: ``restart`` that holds decides).  docs/how-to/restarts.md shows this table.
RULES: tuple[Rule, ...] = (
    Rule("succeeded", "succeeded", "end",
         "the attempt succeeded, or ended suspicious (exit 0 with a collective error in the output)",
         slurm=Form("the step's status 0: no requeue"),
         kubernetes=Form("the job succeeds")),
    Rule("stopped", "stopped", "end", "the user stopped it (Ctrl-C, SIGTERM, `clusterctl stop`)",
         slurm=Form("`clusterctl stop` leaves a stop request: no requeue (scancel and the time "
                    "limit end the script first)"),
         kubernetes=Form("deleting the object ends it")),
    Rule("retry_on_exit", "exit-code", "not-counted",
         "a rank exited with a code of the job's `retry_on_exit`", codes_key="retry_on_exit",
         slurm=Form(None, "Slurm counts every requeue, so these codes count too"),
         kubernetes=Form("PyTorchJob `restartPolicy: ExitCode` (only 130, 137, 138, 143 retry); "
                         "TrainJob: the runtime's", "the operator fails the job on it; exit 138 to "
                         "be retried")),
    Rule("fatal_on_exit", "exit-code", "end",
         "a rank exited with a code of the job's `fatal_on_exit`", codes_key="fatal_on_exit",
         slurm=Form("no requeue when a rank exited with it by itself (any rank: srun hides which "
                    "was first)"),
         kubernetes=Form("PyTorchJob `restartPolicy: ExitCode` (every code but 130, 137, 138, 143 "
                         "ends the job); TrainJob: the runtime's `podFailurePolicy`",
                         "the operator retries it")),
    Rule("no-restarts", "no-restarts", "end",
         "the job allows no restart (`max_restarts: 0` and no `retry_on_exit`)",
         slurm=Form("no `--requeue`: srun's status ends the script"),
         kubernetes=Form("`restartPolicy: Never`, `backoffLimit: 0`")),
    Rule("crash-loop", "crash-loop", "end",
         "the same failure (node, exit code, last line) `exclude_after` times in a row, or "
         f"{NO_PROGRESS_ATTEMPTS} attempts in a row without a new file in the checkpoint directory",
         status=CRASH_LOOP,
         slurm=Form(None, "the script does not compare attempts: it requeues until restarts are "
                          "used up"),
         kubernetes=Form(None, "the operator does not compare failures")),
    Rule("lost", "lost", "exclude",
         "a node stopped answering, or its Docker engine died",
         slurm=Form(None, _NODES_SLURM), kubernetes=Form(None, _NODES_KUBE)),
    Rule("blamed", "blamed", "exclude",
         "a node is blamed for `exclude_after` failures (an exit code below 128 not in "
         "`retry_on_exit`; the odd ranks of a hang)",
         slurm=Form(None, _NODES_SLURM), kubernetes=Form(None, _NODES_KUBE)),
    Rule("restarts-used", "restarts-used", "end",
         "a counted failure after `max_restarts` counted restarts (with `max_restarts: 0`: the "
         "attempt's own status)", status=RESTARTS_EXHAUSTED,
         slurm=Form("no requeue once `SLURM_RESTART_COUNT` is `max_restarts`; the run ends with "
                    "its last attempt's status"),
         kubernetes=Form("PyTorchJob `runPolicy.backoffLimit` (`restartPolicy: OnFailure`); "
                         "TrainJob: the runtime's `failurePolicy.maxRestarts`")),
    Rule("attempts-used", "attempts-used", "end",
         f"{MAX_ATTEMPTS} attempts in all, counted or not", status=RESTARTS_EXHAUSTED,
         slurm=Form(None, "every requeue counts against `max_restarts`, which bounds them"),
         kubernetes=Form(f"PyTorchJob `backoffLimit: {MAX_ATTEMPTS}` under `restartPolicy: "
                         "ExitCode` without `max_restarts`")),
    Rule("failure", "failure", "restart",
         "any other failure (it counts against `max_restarts`; the next attempt runs on the nodes "
         "left, a spare in an excluded node's place)",
         slurm=Form("`scontrol requeue` of its own job"),
         kubernetes=Form("PyTorchJob `restartPolicy: OnFailure` (the kubelet restarts the "
                         "container in its pod); TrainJob: a JobSet restart")),
    Rule("no-spare", "no-spare", "end",
         "an excluded node has no spare to take its place and the job may not shrink "
         "(`nnodes: MIN:MAX`) further (found as the next attempt's nodes are chosen)",
         status=NOT_ENOUGH_NODES,
         slurm=Form(None, _NODES_SLURM), kubernetes=Form(None, _NODES_KUBE)),
)


def rules_markdown(rules: Sequence[Rule] = RULES) -> str:
    """The rules as the Markdown table docs/how-to/restarts.md shows (a test keeps it equal)."""
    def form(f: Form) -> str:
        return f.says if f.says is not None else f"no: {f.why}"

    def status(r: Rule) -> str:
        return "" if r.action != "end" else "its own" if r.status is None else str(r.status)

    rows = ["| # | rule | when | then | exit | Slurm | Kubernetes |", "|---|---|---|---|---|---|---|"]
    rows += ["| " + " | ".join(cell.replace("|", "\\|") for cell in (
        str(i), f"`{r.name}`", r.doc, ACTIONS[r.action], status(r), form(r.slurm), form(r.kubernetes)))
        + " |" for i, r in enumerate(rules, 1)]
    return "\n".join(rows) + "\n"


def not_counted_codes(keys, rules: Sequence[Rule] = RULES) -> frozenset[int]:
    """The exit codes whose failure neither counts nor blames a node (``not-counted`` rules)."""
    return frozenset(c for r in rules if r.action == "not-counted" for c in r.codes_of(keys))


def recovers(policy: Policy, rules: Sequence[Rule] = RULES) -> bool:
    """Whether a failure may be followed by another attempt at all."""
    return policy.max_restarts > 0 or bool(not_counted_codes(policy, rules))


def blamed_nodes(end: AttemptEnd, policy: Policy, *, rules: Sequence[Rule] = RULES) -> list[str]:
    """The nodes one failure counts against (the ``blamed`` rule)."""
    if end.kind == "hang":
        return list(end.blamed)
    if end.kind in ("exit", "start") and end.node is not None:
        if end.exit_code in not_counted_codes(policy, rules) or end.exit_code >= 128:
            return []
        return [end.node]
    return []


def blame_counts(history: Sequence[AttemptEnd], policy: Policy, *, rules: Sequence[Rule] = RULES
                 ) -> Counter:
    """How many failures of the run each node is blamed for."""
    return Counter(n for end in history for n in blamed_nodes(end, policy, rules=rules))


def crash_loop(history: Sequence[AttemptEnd], policy: Policy, initial_checkpoint: str | None = None
               ) -> str | None:
    """Why the run is a crash loop (the ``crash-loop`` rule), or None."""
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
           initial_checkpoint: str | None = None, rules: Sequence[Rule] = RULES) -> Decision:
    """What follows the last attempt of ``history``: the first ``end`` or ``restart`` rule of
    ``rules`` that holds, with the nodes the ``exclude`` rules before it excluded and whether
    a ``not-counted`` rule held (the nodes: :func:`replace_nodes`).

    ``excluded``: the nodes excluded before this attempt ended (not excluded twice)."""
    facts = _Facts(history, policy, rules, excluded, initial_checkpoint)
    for rule in rules:
        hit = CONDITIONS[rule.when](rule, facts)
        if hit is None:
            continue
        if rule.action == "exclude":
            for node, why in hit.items():
                facts.exclude.setdefault(node, why)
        elif rule.action == "not-counted":
            facts.counted = False
        elif rule.action == "restart":
            return Decision("restart", facts.end.exit_code, hit, counted=facts.counted,
                            exclude=facts.exclude)
        else:
            reason, status = hit if isinstance(hit, tuple) else (hit, rule.status)
            return Decision("end", facts.end.exit_code if status is None else status, reason,
                            exclude=facts.exclude)
    end = facts.end
    return Decision("end", end.exit_code, f"attempt {end.attempt} {end.state}: no rule restarts it",
                    exclude=facts.exclude)


def _counted(end: AttemptEnd, policy: Policy, rules: Sequence[Rule] = RULES) -> bool:
    return end.state not in _FINAL and not (end.kind in ("exit", "start")
                                            and end.exit_code in not_counted_codes(policy, rules))


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
