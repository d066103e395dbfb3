"""The sbatch script of a Slurm launch: pure, from the job spec, the options and the run.

One task per node (``srun --kill-on-bad-exit=1 --label --ntasks-per-node=1``); each
task starts the same container an SSH launch starts (:func:`clusterctl.run.plan.make_plan`
gives the layered environment and the ``docker run`` options), but the values only Slurm
knows are shell variables read when the task runs:

====================  =====================================================
placeholder / var     at run time
====================  =====================================================
``{node_rank}``       ``$SLURM_NODEID``
``{nnodes}``          ``$SLURM_NNODES``
``{node_name}``       ``$SLURMD_NODENAME``
``{master_addr}``     the first host of ``scontrol show hostnames "$SLURM_JOB_NODELIST"``
                      (its ``NodeAddr``, the address the other nodes reach)
``{master_port}``     ``$((SLURM_JOB_ID % 4536 + 61000))``, the enroot PyTorch hook's rule
``{world_size}``      ``$((SLURM_NNODES * nproc_per_node))``
(contract ``mpi``)    the node's first rank, ``$((SLURM_NODEID * nproc_per_node))``, set by
                      each task for :func:`clusterctl.run.mpi.spawn_command`
(resume contract)     ``CLUSTERCTL_ATTEMPT=${SLURM_RESTART_COUNT:-0}``: how often Slurm
                      requeued the job (0 at first)
====================  =====================================================

Every value is quoted with :func:`shlex.quote`; a runtime value is spliced in as
``"${VAR}"``.  Secret VALUES are never in the text (slurmctld stores the script):
sbatch gets them in its environment (:attr:`SlurmScript.environment`, exported to the
tasks) and the script names them only (``-e NAME`` for docker).

Docker mode: each task runs ``docker run -d --net=host`` with the SSH launch's name
scheme (``<run_id>-<node>``) and labels, follows its output, waits for it and writes the
container's OWN exit code and finish time to ``<run_dir>/slurm/<node>.json``: srun's own
status is the highest exit code of all tasks (the survivors it kills give 137/143), so
the first failure is read from these records; a task stopped by a signal records
``"stopped": true`` (its 137/143 is the teardown's, not a failure).  No ``--rm``: the task removes the
container after recording it.  SIGTERM (scancel, ``--kill-on-bad-exit``) stops the
container, records it and exits 143; a provisional "stopped, 143" record is written first, so a
task that Slurm kills before the container is gone (``KillWait`` after the TERM) still has one.

Pyxis mode (rendered and golden-tested only: enroot/pyxis are not packaged here):
``srun --container-image=IMAGE --container-mounts=SRC:DST,... --no-container-mount-home
[--container-workdir=DIR]``; the environment is exported in the task, the run directory
is mounted so the task records its exit code the same way.  ``docker run`` options with
no pyxis equivalent are listed in a comment, not applied.  An image in a registry is
written as enroot's URI wants it, ``REGISTRY#IMAGE`` (:func:`enroot_image`).

Images by digest: with an inventory's ``registry:`` the caller passes the image pinned
(``HOST[:PORT]/[NS/]NAME@sha256:...``, :func:`clusterctl.cluster.registry.lookup.pinned_reference`),
so ``docker run`` (which pulls it where a node lacks it) and pyxis run exactly that image.

Recovery (the job's recovery keys; :mod:`clusterctl.run.recovery` for an SSH launch, whose
rules :func:`recovery_shell` renders as the script's requeue block): the resume contract's
``CLUSTERCTL_ATTEMPT`` is Slurm's restart count, and the job's ``checkpoint`` directory is
mounted and named by ``CLUSTERCTL_CHECKPOINT_DIR`` as in an SSH launch.  Each attempt
first moves the task records an earlier one left to ``<run_dir>/slurm/attempt-<K>/`` and
prints :data:`ATTEMPT_MARK` with its nodes in task order (unlabelled: in
``slurm-<job>.out`` only), so a reader maps each attempt's labels to
its own nodes.  With ``max_restarts > 0`` the job is submitted ``--requeue
--open-mode=append`` (one output file for every attempt) and, when its step failed,
requeues itself (``scontrol requeue``) while ``SLURM_RESTART_COUNT < max_restarts``,
unless a rank exited by itself with a code of ``fatal_on_exit`` (any rank: srun hides which
was first) or ``clusterctl stop`` asked for the end (scancel and the time limit kill the
script first).  Slurm counts every requeue, its own too (node failure, preemption), so a
code of ``retry_on_exit`` counts like any failure here.  A requeued job waits the site's
``cred_expire`` (slurm.conf ``AuthInfo``, 120 s by default) before it starts again.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from clusterctl.cluster.inventory import Inventory, Node
from clusterctl.cluster.runtime import ContainerRuntime, runtime_for
from clusterctl.core.errors import UserError
from clusterctl.core.text import digits
from clusterctl.run import mpi, recovery
from clusterctl.run import plan as planning
from clusterctl.run.jobs import Job
from clusterctl.run.slurm.options import SlurmOptions

#: Where each task records its container's exit code, under the run's directory.
RECORDS_DIR = "slurm"
TASK_END = "CLUSTERCTL_TASK_END"
#: The unlabelled line each attempt prints first: ``[clusterctl] attempt K on node1,node2``.
ATTEMPT_MARK = "[clusterctl] attempt "
#: The resume contract's attempt variable: a shell variable of the script, not a fixed value.
ATTEMPT_VAR = "CLUSTERCTL_ATTEMPT"
#: What ``clusterctl stop`` leaves in the run directory before scancel (no requeue then).
STOP_REQUEST = "stop-request.json"
NOW = "$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)"

_MARK = re.compile("\x00([A-Za-z_][A-Za-z0-9_]*)\x00")


def mark(var: str) -> str:
    """A stand-in for shell variable ``var`` inside a planned value."""
    return f"\x00{var}\x00"


#: Placeholder values only Slurm knows, as the shell variables the script reads.
RUNTIME = {
    "node_rank": mark("SLURM_NODEID"),
    "nnodes": mark("SLURM_NNODES"),
    "node_name": mark("SLURMD_NODENAME"),
    "master_addr": mark("CLUSTERCTL_MASTER_ADDR"),
    "master_port": mark("CLUSTERCTL_MASTER_PORT"),
    "world_size": mark("CLUSTERCTL_WORLD_SIZE"),
    "first_rank": mark("CLUSTERCTL_FIRST_RANK"),     # contract mpi: set by each task
}


def parse_attempt_mark(line: str) -> tuple[int, list[str]] | None:
    """:data:`ATTEMPT_MARK`'s line -> (the attempt, its nodes in task order); None for any other."""
    if not line.startswith(ATTEMPT_MARK):
        return None
    number, _, nodes = line[len(ATTEMPT_MARK):].partition(" on ")
    if not digits(number):
        return None
    return int(number), [n for n in nodes.strip().split(",") if n]


@dataclass(frozen=True)
class SlurmScript:
    """The rendered script and what sbatch needs beside it."""

    text: str
    run_id: str
    job: str
    image: str
    container: str                 # docker | podman | pyxis
    nnodes: int
    nproc: int
    run_dir: str
    secrets: frozenset[str] = frozenset()
    environment: dict[str, str] = field(default_factory=dict, repr=False)  # secret values for sbatch's env

    @property
    def records_dir(self) -> Path:
        return Path(self.run_dir) / RECORDS_DIR


def shell_word(text: str) -> str:
    """``text`` as one shell word: literal parts quoted, stand-ins as ``"${VAR}"``."""
    parts = _MARK.split(text)
    if len(parts) == 1:
        return shlex.quote(text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append('"${' + part + '}"')
        elif part:
            out.append(shlex.quote(part))
    return "".join(out)


def template_inventory(options: SlurmOptions, inventory: Inventory | None) -> Inventory:
    """The inventory the plan is made from: the given one, or one node standing for each
    node Slurm allocates (``--nnodes``)."""
    if inventory is not None:
        return inventory
    return Inventory(path=Path("<slurm allocation>"), nodes=[Node(name="slurm-node", host="localhost")])


def render_script(job: Job, options: SlurmOptions, *, run_id: str, run_dir: str | Path,
                  inventory: Inventory | None = None, image: str | None = None,
                  overrides: Mapping[str, str] | None = None,
                  host_env: Mapping[str, str] | None = None,
                  addresses: Mapping[str, str] | None = None) -> SlurmScript:
    """The sbatch script for ``job`` (UserError, exit 2, on unusable input).  Pure.

    ``addresses``: node name -> IPv4 address of the inventory's nodes (what
    :func:`clusterctl.run.launch.local_facts` finds), for the containers' ``--add-host``
    entries, as in an SSH launch; None with ``--nnodes`` (the nodes are Slurm's choice)."""
    run_dir = str(run_dir)
    if not Path(run_dir).is_absolute():
        raise UserError(f"run directory {run_dir!r} must be absolute: the tasks run elsewhere.")
    inv = template_inventory(options, inventory)
    plans = planning.make_plan(job, inv, run_id=run_id, image=image, overrides=overrides,
                               host_env=host_env, addresses=addresses, runtime=RUNTIME,
                               flight_recorder=False,  # an SSH launch's (it collects the dumps)
                               attempt=planning.Attempt(checkpoint=job.checkpoint))
    template = _uniform(plans, inv)
    if ATTEMPT_VAR in template.env:    # the resume contract: the attempt is Slurm's to say
        template = replace(template, env={**template.env, ATTEMPT_VAR: mark(ATTEMPT_VAR)})
    secrets = frozenset(template.secrets)
    environment = {k: template.env[k] for k in sorted(secrets)}
    # with restarts the script goes on after a failed step (srun's status in $code)
    after = " && code=0 || code=$?" if job.max_restarts > 0 else ""
    if options.container == "pyxis":
        body = _pyxis_task(template, run_id, run_dir, after)
    else:   # docker, podman: the runtime's own run, inspect, stop, logs, wait
        body = _docker_task(template, run_id, run_dir, after, runtime_for(options.container))
    text = _header(job, options, template, run_id, run_dir) + body + recovery_shell(job)
    return SlurmScript(text=text, run_id=run_id, job=job.name, image=template.image,
                       container=options.container, nnodes=options.nnodes, nproc=template.nproc,
                       run_dir=run_dir, secrets=secrets, environment=environment)


def _uniform(plans: Sequence[planning.NodePlan], inv: Inventory) -> planning.NodePlan:
    """One script serves every node: their planned containers must agree."""
    first = plans[0]
    for p in plans[1:]:
        for what in ("env", "options", "command", "nproc", "image"):
            if getattr(p, what) != getattr(first, what):
                raise UserError(
                    f"{inv.path}: node {p.node} differs from {first.node} in its container's "
                    f"{what} (slots, env, devices or interface); one sbatch script starts the same "
                    "container on every node: make the nodes alike or launch over SSH.")
    return first


def _header(job: Job, options: SlurmOptions, template: planning.NodePlan, run_id: str,
            run_dir: str) -> str:
    sb = [f"--job-name={run_id}", f"--nodes={options.nnodes}", "--ntasks-per-node=1"]
    if options.partition:
        sb.append(f"--partition={options.partition}")
    if options.time:
        sb.append(f"--time={options.time}")
    if options.nodelist:
        sb.append(f"--nodelist={','.join(options.nodelist)}")
    sb.append(f"--output={run_dir}/slurm-%j.out")
    if job.max_restarts > 0:      # one output file for every attempt: the follower reads on
        sb += ["--requeue", "--open-mode=append"]
    lines = [
        "#!/bin/bash",
        f"# clusterctl run {run_id}: job {job.name} on {options.nnodes} Slurm node(s), "
        f"{options.container} mode. Generated; do not edit.",
        "# Secret values are not in this script: sbatch receives them in its environment.",
        *(f"#SBATCH {shlex.quote(s)}" for s in sb),
        "set -euo pipefail",
        "",
        "# The environment contract from Slurm's variables (MASTER_PORT: the enroot PyTorch hook's rule).",
        'CLUSTERCTL_MASTER_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
        "CLUSTERCTL_MASTER_ADDR=\"$(scontrol -o show node \"$CLUSTERCTL_MASTER_NODE\" "
        "| sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')\"",
        'CLUSTERCTL_MASTER_ADDR="${CLUSTERCTL_MASTER_ADDR:-$CLUSTERCTL_MASTER_NODE}"',
        'CLUSTERCTL_MASTER_PORT="$((SLURM_JOB_ID % 4536 + 61000))"',
        f'CLUSTERCTL_WORLD_SIZE="$((SLURM_NNODES * {template.nproc}))"',
        f"CLUSTERCTL_RUN_DIR={shlex.quote(run_dir)}",
        f'{ATTEMPT_VAR}="${{SLURM_RESTART_COUNT:-0}}"   # how often Slurm requeued this job',
        "export CLUSTERCTL_MASTER_ADDR CLUSTERCTL_MASTER_PORT CLUSTERCTL_WORLD_SIZE CLUSTERCTL_RUN_DIR "
        + ATTEMPT_VAR,
        f'mkdir -p "$CLUSTERCTL_RUN_DIR/{RECORDS_DIR}"',
        "",
    ]
    return "\n".join(lines) + "\n" + _ATTEMPT_START


#: Each attempt's start: the task records of earlier attempts (a requeued job) to
#: slurm/attempt-<K>/, then the attempt and its nodes in task order (:data:`ATTEMPT_MARK`).
_ATTEMPT_START = (
    "# A requeued job: the task records of earlier attempts go to slurm/attempt-<K>/.\n"
    f'for f in "$CLUSTERCTL_RUN_DIR/{RECORDS_DIR}/"*.json; do\n'
    '  [ -e "$f" ] || continue\n'
    """  k="$(sed -n 's/.*"attempt": \\([0-9]*\\).*/\\1/p' "$f")"\n"""
    f'  mkdir -p "$CLUSTERCTL_RUN_DIR/{RECORDS_DIR}/attempt-${{k:-0}}"\n'
    f'  mv -f "$f" "$CLUSTERCTL_RUN_DIR/{RECORDS_DIR}/attempt-${{k:-0}}/"\n'
    "done\n"
    f'echo "{ATTEMPT_MARK}${ATTEMPT_VAR} on $(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)"\n'
    "\n")


def recovery_shell(job: Job, rules: Sequence[recovery.Rule] = recovery.RULES) -> str:
    """With ``max_restarts``: the script's end, which requeues the job after a failed step
    or says why not; without: nothing (srun's status ends it).  Generated from the recovery
    rules (:data:`clusterctl.run.recovery.RULES`), in their order: each rule with a Slurm form
    is an arm of the ``if``/``elif`` chain (:func:`_arm`); an exit-code rule without one is a
    comment where the job lists its codes (see the module docstring)."""
    if job.max_restarts <= 0:
        return ""
    n = job.max_restarts
    notes, arms = [], []
    for rule in rules:
        if rule.slurm.says is None:
            codes = rule.codes_of(job)
            if codes:
                notes.append(f"# {rule.label} ({', '.join(map(str, codes))}): {rule.slurm.why}.\n")
        elif (arm := _arm(rule, job)) is not None:
            arms.append(arm)
    chain = "".join(("  else\n" if not test else f"  {'elif' if i else 'if'} {test}; then\n") + lines
                    for i, (test, lines) in enumerate(arms))
    return (f"# Recovery: a failed attempt requeues this job, up to max_restarts ({n}) times.\n"
            + "".join(notes) +
            'if [ "$code" -ne 0 ]; then\n'
            + chain +
            "  fi\n"
            "fi\n"
            'exit "$code"\n')


def _arm(rule: recovery.Rule, job: Job) -> tuple[str, str] | None:
    """One rule's arm of the requeue chain: (its shell test, "" for the last ``else``; its
    lines), or None where the rule is the chain's frame (``succeeded``: the step's status 0
    skips it; ``no-restarts``: no chain at all) or lists no code for this job."""
    n = job.max_restarts
    if rule.when == "stopped":
        return (f'[ -e "$CLUSTERCTL_RUN_DIR/{STOP_REQUEST}" ]',
                '    echo "[clusterctl] no requeue: clusterctl stop ended the run"\n')
    if rule.when == "exit-code" and rule.action == "end":
        codes = sorted(set(rule.codes_of(job)))
        if not codes:
            return None
        pattern = '"exit_code": (' + "|".join(map(str, codes)) + '), .*"stopped": false'
        return (f'grep -qsE {shlex.quote(pattern)} "$CLUSTERCTL_RUN_DIR/{RECORDS_DIR}/"*.json',
                f'    echo "[clusterctl] no requeue: a rank exited with a code of {rule.label} '
                f'({", ".join(map(str, codes))})"\n'
                + (f"    code={rule.status}\n" if rule.status is not None else ""))
    if rule.when == "restarts-used":
        return (f'[ "${ATTEMPT_VAR}" -ge {n} ]',
                f'    echo "[clusterctl] no requeue: attempt ${ATTEMPT_VAR} failed (exit $code), restarts '
                f'used up ({n}/{n})"\n')
    if rule.when == "failure":
        return ("",
                f'    echo "[clusterctl] requeue: attempt ${ATTEMPT_VAR} failed (exit $code), restart '
                f'$(({ATTEMPT_VAR} + 1))/{n}"\n'
                '    scontrol requeue "$SLURM_JOB_ID" || echo "[clusterctl] scontrol requeue failed" >&2\n')
    return None


def _argv_lines(argv: Sequence[str], *, breaks: Sequence[int] = (), indent: str = "  ") -> str:
    """An argv as shell words: one option (with its value) per continued line, and a new
    line at each index in ``breaks`` (the image, the command)."""
    lines, current = [], []
    for i, raw in enumerate(argv):
        if current and (i in breaks or (raw.startswith("-") and i < min(breaks, default=i + 1))):
            lines.append(" ".join(current))
            current = []
        current.append(shell_word(raw))
    lines.append(" ".join(current))
    return (" \\\n" + indent).join(lines)


_RECORD = (
    'record() {  # $1: exit code, $2: finish time (UTC), $3: stopped by a signal; atomically\n'
    '  printf \'{"node": "%s", "rank": %s, "exit_code": %s, "finished": "%s", "stopped": %s, "slurm_job": "%s", "attempt": %s}\\n\' \\\n'
    '    "$SLURMD_NODENAME" "$SLURM_NODEID" "$1" "$2" "${3:-false}" "$SLURM_JOB_ID" "$CLUSTERCTL_ATTEMPT" > "$rec.tmp"\n'
    '  mv -f "$rec.tmp" "$rec"\n'
    '}\n')


def _docker_task(t: planning.NodePlan, run_id: str, run_dir: str, after: str = "",
                 runtime: ContainerRuntime | None = None) -> str:
    """The task of the docker and podman modes: ``runtime``'s own commands (default docker)."""
    runtime = runtime or runtime_for("docker")
    rt = shlex.quote(runtime.binary)
    name = f"{run_id}-" + mark("SLURMD_NODENAME")
    # the attempt is a shell variable here (run_labels writes it as text)
    labels = planning.run_labels(run_id, t.job, mark("SLURMD_NODENAME"), mark("SLURM_NODEID"),
                                 mark(ATTEMPT_VAR))
    argv = planning.docker_run_argv(name=mark("name"), labels=labels, options=[*t.hosts, *t.options],
                                    env=t.env, secrets=t.secrets, image=t.image,
                                    command=t.command,
                                    secrets_by_name=True, runtime=runtime)
    task = (
        "set -uo pipefail\n"
        + _first_rank(t) +
        f"name={shell_word(name)}\n"
        f'[ "${ATTEMPT_VAR}" = 0 ] || name="$name-a${ATTEMPT_VAR}"   # as an SSH launch names it\n'
        f'rec="$CLUSTERCTL_RUN_DIR/{RECORDS_DIR}/$SLURMD_NODENAME.json"\n'
        "logs=\n"
        + _RECORD +
        "finish() {  # $1: code if no container, $2: stopped; the container's own exit code\n"
        "  local state  # and finish time are recorded, then it is removed\n"
        f"  if state=\"$({rt} inspect --format '{{{{.State.ExitCode}}}} {{{{.State.FinishedAt}}}}' \"$name\" 2>/dev/null)\"; then\n"
        f'    code="${{state%% *}}"; record "$code" "${{state#* }}" "$2"; {rt} rm "$name" >/dev/null 2>&1\n'
        "  else\n"
        f'    code="$1"; record "$code" "{NOW}" "$2"\n'
        "  fi\n"
        "}\n"
        "stop() {  # scancel, or srun --kill-on-bad-exit after another node failed\n"
        f'  record 143 "{NOW}" true   # first: Slurm kills this task KillWait after its TERM\n'
        f'  {rt} stop --time 3 "$name" >/dev/null 2>&1\n'
        '  finish 143 true\n'
        '  [ -n "$logs" ] && kill "$logs" 2>/dev/null\n'
        "  exit 143\n"
        "}\n"
        "trap stop TERM INT\n"
        + _argv_lines(argv, breaks=[len(argv) - len(t.command) - 1, len(argv) - len(t.command)])
        + " >/dev/null || {\n"
        f'  code=$?; record "$code" "{NOW}"; exit "$code"\n'
        "}\n"
        f'{rt} logs --follow "$name" & logs=$!\n'
        f'{rt} wait "$name" >/dev/null & wait $!\n'
        'wait "$logs"\n'
        "finish 0 false\n"
        'exit "$code"\n')
    return ("# One task per node: its container, its output (labelled by srun), its own exit code.\n"
            f"read -r -d '' CLUSTERCTL_TASK <<'{TASK_END}' || true\n{task}{TASK_END}\n\n"
            'srun --kill-on-bad-exit=1 --label --ntasks-per-node=1 bash -c "$CLUSTERCTL_TASK"'
            + after + "\n")


def _first_rank(t: planning.NodePlan) -> str:
    """Contract mpi: the task's line that sets its node's first rank (nodes are alike)."""
    if mpi.split_spawn(t.command) is None:
        return ""
    return f'CLUSTERCTL_FIRST_RANK="$((SLURM_NODEID * {t.nproc}))"\n'


def enroot_image(image: str) -> str:
    """``image`` as pyxis' ``--container-image`` takes it: ``[REGISTRY#]IMAGE[:TAG|@DIGEST]``.
    Pure.

    pyxis documents ``--container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH`` (NVIDIA/pyxis,
    ``srun --help``), an enroot URI: the registry, a port included, ends at ``#``, not at the
    first ``/`` (``registry.example:5000#team/cpu``; enroot doc/cmd/import.md
    ``docker://[USER@][REGISTRY#]IMAGE[:TAG]``).  A digest follows the image as in Docker's
    syntax: enroot's URI parser (src/docker.sh ``docker::_parse_uri``) takes
    ``REGISTRY#IMAGE@sha256:...``, and pyxis' own tests pull ``IMAGE@sha256:...``
    (tests/docker_image.bats).  Older enroot 3.x releases parse ``REGISTRY#IMAGE[:TAG]`` only
    and refuse a digest ("Invalid image reference").  The registry is the first path part
    when Docker's rule says so (a '.' or ':' in it, or ``localhost``); an image without one
    (``clusterctl/cpu:2.13.0``) is left as it is."""
    if "#" in image:
        return image
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


_PYXIS_MAPPED = {"-v": "mount", "--volume": "mount", "-w": "workdir", "--workdir": "workdir"}


def _pyxis_flags(t: planning.NodePlan, run_dir: str) -> tuple[list[str], list[str]]:
    """(pyxis srun flags, docker options pyxis has no equivalent for)."""
    mounts, workdir, unmapped, opts, i = [], None, [], list(t.options), 0
    while i < len(opts):
        flag, has_value, value = opts[i].partition("=")
        if not has_value and flag in _PYXIS_MAPPED and i + 1 < len(opts):
            value, i = opts[i + 1], i + 1
        if flag in _PYXIS_MAPPED and (has_value or value):
            if _PYXIS_MAPPED[flag] == "mount":
                mounts.append(value)
            else:
                workdir = value
        else:
            unmapped.append(opts[i])
        i += 1
    flags = [f"--container-image={enroot_image(t.image)}",
             "--container-mounts=" + ",".join([f"{run_dir}:{run_dir}", *mounts]),
             "--no-container-mount-home"]
    if workdir:
        flags.append(f"--container-workdir={workdir}")
    return flags, unmapped


def _pyxis_task(t: planning.NodePlan, run_id: str, run_dir: str, after: str = "") -> str:
    flags, unmapped = _pyxis_flags(t, run_dir)
    exports = "".join(f"export {k}={shell_word(v)}\n" for k, v in t.env.items()
                      if k not in t.secrets)
    task = (
        "set -u\n"
        + _first_rank(t) +
        f'rec="$CLUSTERCTL_RUN_DIR/{RECORDS_DIR}/$SLURMD_NODENAME.json"\n'
        + _RECORD +
        f"trap 'record 143 \"{NOW}\" true; exit 143' TERM INT\n"
        + exports
        + _argv_lines(t.command, breaks=[0]) + "\n"
        "code=$?\n"
        f'record "$code" "{NOW}"\n'
        'exit "$code"\n')
    masked = planning.masked(t)
    note = ""
    if unmapped:
        note = ("# docker run options with no pyxis equivalent (not applied; pyxis containers "
                "see the node's devices): " + " ".join(shlex.quote(o) for o in masked.options
                                                       if o in unmapped) + "\n")
    secrets = "".join(f"# secret {k}: from sbatch's environment (exported to the task)\n"
                      for k in sorted(t.secrets))
    srun = ["srun", "--kill-on-bad-exit=1", "--label", "--ntasks-per-node=1", *flags]
    return ("# One task per node, inside the image (pyxis/enroot); the task records its exit code.\n"
            + note + secrets +
            f"read -r -d '' CLUSTERCTL_TASK <<'{TASK_END}' || true\n{task}{TASK_END}\n\n"
            + _argv_lines(srun) + ' \\\n  sh -c "$CLUSTERCTL_TASK"' + after + "\n")
