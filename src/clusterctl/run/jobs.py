"""Job specs: what runs in the container on every node, as a small YAML file.

Shipped jobs live in ``jobs/`` (:func:`clusterctl.core.paths.jobs_dir`) and are named
by their file stem (``bert``, ``ddp-smoke``); any other job is given by the path
of its YAML file.  :func:`load_job` accepts either.  A job says WHAT runs; the
inventory says WHERE; :mod:`clusterctl.run.plan` combines both into one
``docker run`` command line per node.

The file is read by the shared YAML reader (:mod:`clusterctl.core.yamlfile`: lines,
repeated keys, merge keys, size and alias limits), and every problem is reported at
once as ``FILE:LINE: key: problem; valid: ...`` (``JobFileError``, exit status 2),
with key paths spelled ``command.1``, ``env.PHASE`` as :meth:`Job.where` takes them.

Keys of a job file (unknown keys are an error) are declared once, in :class:`_Spec`: each
key's type, default, description, what is valid (:data:`KEY_HELP`, the end of its messages)
and its ``launch`` flag, if it has one (:data:`KEY_FLAGS`).  The job-file reference page,
``launch --help``, the messages and the key list at the end of this docstring are derived
from it.

Placeholders
------------
Values in ``env``, ``command``, ``docker_args`` and ``mounts`` may contain
``{name}`` placeholders, filled per node at launch:

``{master_addr}`` ``{master_port}`` ``{node_rank}`` ``{nnodes}``
``{nproc_per_node}`` (this node's) ``{world_size}`` (sum over nodes)
``{node_name}`` ``{run_id}`` ``{backend}`` (the target's torch.distributed
backend, e.g. ``gloo``, ``accl``; empty without a target), ``{device}`` (what
each local rank computes on, from the target: ``cpu``, ``cuda``, ``mlu``; ``cpu``
without a target), plus every ``params`` name.

Write ``{{`` and ``}}`` for literal braces.  An unknown placeholder is an error
naming the file, line and key.  Values given with ``--set`` are never expanded:
they reach the container exactly as typed.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clusterctl.core import paths
from clusterctl.core.durations import DURATION_HELP, parse_duration
from clusterctl.core.errors import UserError, did_you_mean, one_of
from clusterctl.core.secretnames import ENV_NAME, SECRET_RULE, is_secret_name  # noqa: F401 (is_secret_name: request)
from clusterctl.core.text import control_problem, escaped, shown
from clusterctl.core.yamlfile import FileProblems, Problems, dotted, parse, read_text, show
from clusterctl.image import targets

#: The launch values every placeholder may name (see the module docstring).
LAUNCH_VALUES: tuple[str, ...] = (
    "master_addr", "master_port", "node_rank", "nnodes", "nproc_per_node",
    "world_size", "node_name", "run_id", "backend", "device",
)

#: What each launch value holds (the job-file reference lists them as placeholders).
PLACEHOLDERS: dict[str, str] = {
    "master_addr": "the master's address as the other nodes reach it (MASTER_ADDR)",
    "master_port": "the master's port for torch.distributed (MASTER_PORT)",
    "node_rank": "this node's rank, 0 for the master",
    "nnodes": "the number of nodes",
    "nproc_per_node": "this node's number of processes",
    "world_size": "the processes of all nodes together",
    "node_name": "this node's inventory name",
    "run_id": "the run's id",
    "backend": "the target's torch.distributed backend (gloo, nccl, ccl, ...); empty without a target",
    "device": "what each local rank computes on, from the target: cpu, cuda, mlu (cpu without a target)",
}

#: Launch environment every job gets, as templates over LAUNCH_VALUES: what
#: torchrun, torch.distributed.launch and Kubeflow-style launchers read.
BASE_ENV: dict[str, str] = {
    "MASTER_ADDR": "{master_addr}",
    "MASTER_PORT": "{master_port}",
    "NODE_RANK": "{node_rank}",
    "NNODES": "{nnodes}",
    "NPROC_PER_NODE": "{nproc_per_node}",
    "PET_NNODES": "{nnodes}",
    "PET_NODE_RANK": "{node_rank}",
    "PET_NPROC_PER_NODE": "{nproc_per_node}",
    "PET_MASTER_ADDR": "{master_addr}",
    "PET_MASTER_PORT": "{master_port}",
}

#: Environment contracts: extra launch variables on top of BASE_ENV, by name.
CONTRACTS: dict[str, dict[str, str]] = {
    "torchrun": {},
    # seeds/003: RANK and WORLD_SIZE count NODES; run_pretraining.sh starts
    # NPROC_PER_NODE processes itself.
    "accl-bert": {"RANK": "{node_rank}", "WORLD_SIZE": "{nnodes}"},
    # seeds/000, 001: the per-node half of what MPICH/Intel MPI hydra gives each process
    # (PMI_RANK and MPI_LOCALRANKID differ per process: clusterctl.run.mpi starts them).
    "mpi": {"PMI_SIZE": "{world_size}", "MPI_LOCALNRANKS": "{nproc_per_node}",
            "PMI_HOSTNAME": "{node_name}"},
    # seeds/002: deepspeed.launcher.launch's per-node variables; torchrun gives RANK, LOCAL_RANK.
    "deepspeed": {"WORLD_SIZE": "{world_size}", "CROSS_RANK": "{node_rank}",
                  "CROSS_SIZE": "{nnodes}", "LOCAL_SIZE": "{nproc_per_node}"},
}

#: Where a job's workdir is mounted (read-only) in every container, and its working directory.
CODE_MOUNT = "/workspace"

#: The file name a job's path has when the job comes from command-line flags alone.
COMMAND_LINE = "(command line)"
HANG_START_DEFAULT = 300.0  # seconds: the watchdog's allowance before the job has started, at least
MAX_RESTARTS = 10000       # restarts a job may allow (a record read back is held to it too)
HANG_LINE_MAX = 200         # characters of a hang_start_line

#: A secret value shorter than this is never searched for in output (:func:`clusterctl.run.plan.maskable`).
MASK_MIN_CHARS = 8

#: ``docker run`` flags a job may not pass: clusterctl sets them itself (name,
#: labels, detached, host network) or they would break supervision / secrets.
RESERVED_DOCKER_FLAGS: tuple[str, ...] = (
    "--name", "--rm", "-d", "--detach", "-i", "-t", "-it", "-ti", "--interactive",
    "--tty", "--env-file", "--label", "-l", "--net", "--network",
)


#: What is valid for each key, appended to validation messages.


# --------------------------------------------------------------------------- finding jobs

def shipped_jobs() -> dict[str, Path]:
    """The jobs shipped with clusterctl, name -> file, sorted by name."""
    d = paths.jobs_dir()
    files = sorted(d.glob("*.yaml")) if d.is_dir() else []
    return {f.stem: f for f in files}


def job_path(name_or_path: str | Path) -> Path:
    """The file of a job given by shipped name or by path; UserError when neither exists.

    A shipped name wins over a file of the same name in the working directory
    (write ``./bert`` for the file).
    """
    text = str(name_or_path)
    shipped = shipped_jobs()
    if text in shipped:
        return shipped[text]
    p = Path(text).expanduser()
    if p.is_file():
        return p
    if p.exists():
        raise UserError(f"job {text} is not a file; valid: a shipped job name or a job YAML file.")
    looks_like_path = "/" in text or text.endswith((".yaml", ".yml"))
    if looks_like_path:
        raise UserError(f"job file {text} does not exist.")
    raise UserError(
        f'unknown job "{text}"{did_you_mean(text, list(shipped))}: give a shipped job '
        f"({one_of(shipped) or 'none found in ' + str(paths.jobs_dir())}) or the path of a job YAML file.")


def load_job(name_or_path: str | Path, overrides: dict[str, Any] | None = None, *,
             workdir_needed: bool = True) -> Job:
    """Load and validate a job (shipped name or file path); UserError with file:line: key.

    ``overrides``: job keys given on the command line (``launch --target/--workdir/--env ...
    -- COMMAND``), which win over the file's (``env`` is merged, the flag's value winning);
    they are checked like the file's own keys.  A ``workdir``/``requirements`` given here is
    relative to the current directory, the file's to the file's directory.
    ``workdir_needed=False``: the workdir need not exist any more (``launch --rerun`` ships
    the recorded copy from the head's store)."""
    path = job_path(name_or_path)
    problems = Problems(path, spell=_spelling(overrides or {}), error=JobFileError)
    data = parse(read_text(path, "job file"), problems, verbatim=_is_text, like="the shipped jobs/ddp-smoke.yaml")
    if overrides and isinstance(data, dict):
        data = _with_overrides(data, overrides, problems)
    return _validate(path, data, problems, given=overrides or {}, workdir_needed=workdir_needed)


def inline_job(overrides: dict[str, Any], name: str | None = None, *,
               workdir_needed: bool = True) -> Job:
    """A job made of command-line keys alone (``launch --target cpu --workdir . -- python
    train.py``): checked like a file's, its messages name the key as ``(command line)``.
    ``name``: the job's name (default: the workdir's directory name, else ``run``)."""
    problems = Problems(COMMAND_LINE, spell=dotted, error=JobFileError)
    if name is None:
        wd = overrides.get("workdir")
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(wd).absolute().name).strip("-._")[:128] if wd else ""
    return _validate(Path(COMMAND_LINE), dict(overrides), problems, given=overrides, name=name or "run",
                     workdir_needed=workdir_needed)


def _with_overrides(data: dict, overrides: dict[str, Any], problems: Problems) -> dict:
    """The file's keys with the command line's over them; a key from the command line has no
    line in the file (its messages point at the file's first line)."""
    merged = dict(data)
    for key, value in overrides.items():
        if key == "env" and isinstance(data.get("env"), dict):
            merged["env"] = {**data["env"], **value}
        else:
            merged[key] = value
            problems.lines = {k: v for k, v in problems.lines.items() if not k or k[0] != key}
    return merged


def escape_braces(text: str) -> str:
    """``text`` as a job value that means exactly ``text`` (placeholders are not filled in a
    command typed after ``--``)."""
    return text.replace("{", "{{").replace("}", "}}")


#: The launcher put in front of a plain ``python ...`` command of a workdir job (contract
#: torchrun): one torchrun per node starting the node's processes, each with RANK,
#: LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun gives them.
TORCHRUN_PREFIX: tuple[str, ...] = (
    "torchrun", "--nnodes={nnodes}", "--node-rank={node_rank}",
    "--nproc-per-node={nproc_per_node}", "--master-addr={master_addr}",
    "--master-port={master_port}", "--max-restarts=0",
)

#: A job's name (its file's name without .yaml): it goes into container labels, run records,
#: a Slurm script's header and a manifest's, so nothing there may break a line or a word.
JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_PYTHON = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?\Z")


def under_torchrun(command: list[str]) -> list[str]:
    """``command`` as it runs on every node: ``python [-u] SCRIPT ARGS`` and ``python [-u] -m
    MODULE ARGS`` (any python, python3, python3.X) become ``torchrun ... SCRIPT ARGS`` /
    ``torchrun ... -m MODULE ARGS`` (:data:`TORCHRUN_PREFIX`): torchrun starts them with its
    own interpreter, the one torch is installed in, unbuffered.  A python with other options
    runs exactly as written in each process (``torchrun --no-python``).  Any other command
    (``torchrun ...``, ``bash run.sh``) is left as written."""
    if not command or not _PYTHON.match(command[0]):
        return list(command)
    rest = command[2:] if command[1:2] == ["-u"] else command[1:]
    if rest and (not rest[0].startswith("-") or (rest[0] == "-m" and len(rest) > 1)):
        return [*TORCHRUN_PREFIX, *rest]
    return [*TORCHRUN_PREFIX, "--no-python", *command]


def list_jobs() -> list[Job]:
    """Every shipped job, loaded (for `clusterctl jobs` style listings)."""
    return [load_job(p) for p in shipped_jobs().values()]


# --------------------------------------------------------------------------- validation

#: Scalars kept exactly as written: ``PHASE: 1`` gives ``"1"``, ``FLAG: yes`` gives
#: ``"yes"``, ``MASK: 0755`` gives ``"0755"``, ``[sleep, 30]`` gives ``["sleep", "30"]``
#: (the rule of inventory env and of ``--set``).
_TEXT_SECTIONS = ("env", "params", "command", "docker_args", "mounts")


def _is_text(path: tuple) -> bool:
    # nnodes too: YAML 1.1 reads an unquoted 2:4 as the base-60 number 124
    return (len(path) == 2 and path[0] in _TEXT_SECTIONS) or path == ("nnodes",)


@dataclass(frozen=True)
class KeyFlag:
    """A ``launch`` flag that sets a job key (declared on the key's field in :class:`_Spec`):
    its help there ends with ``Job key: NAME.``"""

    flag: str                  # --workdir
    help: str                  # what the flag does, without the "Job key" sentence
    metavar: str | None = None
    kind: Literal["str", "int", "path", "list", "bool"] = "str"   # the value as typed: text, a
    min: int | None = None     # whole number (at least ``min``), a path, repeatable NAME=VALUE, a switch


def key(*, valid: str, flag: KeyFlag | None = None, doc_type: str | None = None) -> dict:
    """A job key's declaration beside its type and description in :class:`_Spec`: what is
    valid (the end of its messages), its ``launch`` flag if it has one, its type as the
    reference page shows it.  Everything else about a key is derived from the model."""
    extra: dict[str, Any] = {"valid": valid}
    if flag is not None:
        extra["flag"] = flag
    if doc_type is not None:
        extra["doc_type"] = doc_type
    return {"json_schema_extra": extra}


class _Spec(BaseModel):
    """The file's schema; pydantic gives the failing key path for messages.

    Each field's description is the key's entry in docs/reference/job-file.md (generated
    from this model): a new key needs one (tests/docs/test_reference.py).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    description: str = Field("", description="One line for listings.",
        **key(valid="a one-line string"))
    target: str | None = Field(None, description=(
        "A target name (`clusterctl targets`). The target gives the default image tag, the "
        "`docker run` flags and devices every container of that stack needs, its default "
        "container environment and the `{backend}` and `{device}` placeholders. At least one "
        "of `target` and `image` is required."),
        **key(valid="a target name (clusterctl targets)",
        flag=KeyFlag("--target", 'The stack whose image runs the command (clusterctl targets), e.g. cpu.')))
    image: str | None = Field(None, description=(
        "An image tag; replaces the target's default tag (`launch --image` replaces both)."),
        **key(valid="an image tag, e.g. clusterctl/cpu:2.13.0"))
    contract: str = Field("torchrun", description=(
        "Which launch variables the program in the image reads: `torchrun` (only the "
        "torchrun-compatible variables every container gets), `accl-bert` (adds `RANK` = the "
        "node rank and `WORLD_SIZE` = the number of nodes), `mpi` (the container starts the "
        "node's processes itself, each with the variables `mpirun` gives) or `deepspeed` (adds "
        "DeepSpeed's `WORLD_SIZE`, `CROSS_RANK`, `CROSS_SIZE`, `LOCAL_SIZE`). See the "
        "container environment reference."),
        **key(valid=f"one of {one_of(CONTRACTS)}",
        flag=KeyFlag("--contract", 'The launch variables the command reads: torchrun (default), accl-bert, mpi, deepspeed.'), doc_type="one of " + ", ".join(f"`{c}`" for c in CONTRACTS)))
    command: list[str] = Field(min_length=1, description=(
        "The container command as a list of strings (argv, no shell); items are text as "
        "written (`[sleep, 30]` is fine). May hold placeholders."),
        **key(valid="a non-empty list of strings (argv, no shell)"))
    nproc_per_node: int | Literal["slots"] = Field("slots", description=(
        "Processes per node: a positive integer, or `slots` for the node's `slots` in the "
        "inventory. `NPROC_PER_NODE` from the inventory env or `--set` wins over it."),
        **key(valid='a positive integer or "slots"',
        flag=KeyFlag("--nproc-per-node", "Processes per node (default: the node's slots, else 1).", kind='int', min=1)))
    env: dict[str, str] = Field({}, description=(
        "Container environment, `NAME: value`. Values are text taken exactly as written "
        "(`PHASE: 1` is `\"1\"`, `FLAG: yes` is `\"yes\"`) and may hold placeholders. Wins over "
        "the target's env; the inventory's env and `--set` win over it."),
        **key(valid="a mapping NAME: value (text)",
        flag=KeyFlag("--env", "A container environment variable, as the job's env (repeatable; may use {placeholders}).", metavar="NAME=VALUE", kind='list')))
    docker_args: list[str] = Field([], description=(
        "Extra `docker run` arguments (e.g. `[--cap-add=IPC_LOCK]`); may hold placeholders. "
        "Flags clusterctl sets itself are refused: " + ", ".join(
            f"`{f}`" for f in RESERVED_DOCKER_FLAGS) + "."),
        **key(valid="a list of strings"))
    mounts: list[str] = Field([], description=(
        "Bind mounts, each `HOST:CONTAINER` or `HOST:CONTAINER:ro` (or `:rw`), each becoming "
        "`-v HOST:CONTAINER[:MODE]`. CONTAINER must be absolute, and HOST too once "
        "placeholders are filled."),
        **key(valid="a list of HOST:CONTAINER[:ro|rw] strings"))
    params: dict[str, str] = Field({}, description=(
        "Named job parameters with defaults, `NAME: default`, usable as `{NAME}` placeholders "
        "in `mounts`, `command`, `docker_args` and `env`. `--set NAME=VALUE` sets one. A "
        "parameter is not itself exported to the container: write `env: {NAME: \"{NAME}\"}`."),
        **key(valid="a mapping NAME: default value (text)"))
    secrets: list[str] = Field([], description=(
        "Names of environment variables whose values are never shown: masked (`****`) in "
        "dry runs, logs and run records, passed through an env file on `docker run`'s stdin, "
        f"never its argv. A secret value shorter than {MASK_MIN_CHARS} characters, a number or an address is "
        "never masked in output (launch warns, naming the variable). " + SECRET_RULE[0].upper()
        + SECRET_RULE[1:] + ". A listed secret no layer sets is taken from clusterctl's own "
        "environment."),
        **key(valid="a list of environment variable names"))
    hang_timeout: str | int | float | None = Field(None, description=(
        "The hang watchdog, as `launch --hang-timeout` (which wins over it): when no rank "
        "has written output for this long, clusterctl dumps every rank's Python stacks into "
        "`runs/<run-id>/stacks/`, stops the run and exits 124. Not set: no watchdog."),
        **key(valid=DURATION_HELP, doc_type="a duration: `90s`, `10m`, `1h30m`; a number alone is seconds"))
    hang_start_timeout: str | int | float | None = Field(None, description=(
        "The silence the hang watchdog allows before the job has started (imports, "
        "rendezvous, data loading): until the first line any rank writes, or the first "
        "line `hang_start_line` matches. `launch --hang-start-timeout` wins. Default: "
        "`hang_timeout` or 5m, whichever is longer."),
        **key(valid=DURATION_HELP,
        flag=KeyFlag("--hang-start-timeout", 'The silence the hang watchdog allows before the job has started (its first line, or the first line --hang-start-line matches): imports, rendezvous, data loading. Default: the longer of --hang-timeout and 5m.', metavar="DURATION"), doc_type="a duration: `90s`, `10m`, `1h30m`; a number alone is seconds"))
    hang_start_line: str | None = Field(None, description=(
        "A regular expression: the hang watchdog's clock (`hang_timeout`) starts at the first "
        "output line it matches (searched anywhere in the line), e.g. `'step \\d+'` once "
        "training runs. Default: the first line any rank writes, torchrun's own log lines "
        "aside. A pattern that repeats a group with a repetition inside (`(a+)+`) is refused: "
        "matching every line against it could take exponential time; an atomic group "
        "(`(?>...)`) is fine. `launch --hang-start-line` wins."),
        **key(valid=f"a regular expression of at most {HANG_LINE_MAX} characters, e.g. 'step \\d+'",
        flag=KeyFlag("--hang-start-line", "The watchdog's clock (--hang-timeout) starts at the first output line this matches, e.g. 'step [0-9]+' (default: the first line any rank writes).", metavar="REGEX")))
    workdir: str | None = Field(None, description=(
        "Your project directory, relative to the job file (`.`: the job file's directory). "
        "Every node gets a copy (only changed files travel; `.gitignore` and "
        "`.clusterctlignore` are honoured), mounted read-only at `/workspace`, the command's "
        "working directory; `CLUSTERCTL_CODE_DIGEST` names the copy. With a workdir, a "
        "command starting with `python` runs under `torchrun` on each node."),
        **key(valid="a directory, relative to the job file (e.g. `.`)",
        flag=KeyFlag("--workdir", 'Ship this project directory to every node (only what changed travels; .gitignore and .clusterctlignore honoured) and run the command in it, at /workspace, read-only.', metavar="DIR", kind='path')))
    requirements: str | None = Field(None, description=(
        "A pip requirements file, relative to the job file. Its packages become an image layer "
        "of their own over the job's image, built here from wheels fetched here (the nodes "
        "need no internet) and rebuilt only when the file changes. Default: "
        "`requirements.txt` in the workdir, when there is one."),
        **key(valid="a pip requirements file, relative to the job file (e.g. requirements.txt)",
        flag=KeyFlag("--requirements", 'A pip requirements file: its packages become a cached image layer (default: requirements.txt in the workdir).', metavar="FILE", kind='path')))
    master_port: int | None = Field(None, ge=1, le=65535, description=(
        "The port rank 0 listens on for this job, when its workload fixes one: wins over the "
        "inventory's `master_port`; `MASTER_PORT` in the inventory's env or `--set "
        "MASTER_PORT=...` win over it; a pinned port must be free on the master. Not set: "
        "the inventory's, or when that is the default, the first free from 29500 up."),
        **key(valid="a whole number from 1 to 65535"))
    max_workdir_size: str | int | None = Field(None, description=(
        "The most the shipped workdir may hold; a bigger one is refused naming its largest "
        "files. Default 100MiB."),
        **key(valid="a size such as 100MiB, 2GiB or 500M",
        flag=KeyFlag("--max-workdir-size", 'The most the shipped workdir may hold (default 100MiB), e.g. 500MiB.', metavar="SIZE"), doc_type="a size: `100MiB`, `2GiB`, `500M`; a number alone is bytes"))
    max_restarts: int = Field(0, ge=0, le=MAX_RESTARTS, description=(
        "How many times clusterctl starts the run again by itself after a failure (a rank "
        "exiting non-zero, a node lost, a hang): every container is stopped, the nodes are "
        "checked again, failed nodes are replaced by spares, and the job starts again as "
        "the same run with `CLUSTERCTL_ATTEMPT` one higher. `launch --max-restarts` wins. "
        "0: the run ends at its first failure."),
        **key(valid="a whole number, 0 or more",
        flag=KeyFlag("--max-restarts", 'After a failure (a rank exits non-zero, a node is lost, a hang), stop every container, check the nodes again, replace failed ones by spares (spare: true) and start again, up to N times; exit 120 when they are used up.', metavar="N", kind='int', min=0)))
    retry_on_exit: list[int] = Field([], description=(
        "Exit codes that mean \"try again\": a rank exiting with one restarts the run without "
        "counting against `max_restarts` and without blaming its node (a crash loop still "
        "stops). Deaths by signal (128 and above) are retried too, and counted."),
        **key(valid="a list of exit codes from 1 to 255"))
    fatal_on_exit: list[int] = Field([], description=(
        "Exit codes that mean \"do not try again\" (a bad configuration): the run ends at "
        "once with that code, whatever `max_restarts` says."),
        **key(valid="a list of exit codes from 1 to 255"))
    exclude_after: int = Field(3, ge=1, le=1000, description=(
        "K: a node blamed for K failures of a run is excluded for the rest of it (a spare "
        "takes its rank), and the same failure (node, exit code, last error line) K times in "
        "a row ends the run as a crash loop. A lost node or one that fails its checks is "
        "excluded at once."),
        **key(valid="a whole number, 1 or more"))
    checkpoint: str | None = Field(None, description=(
        "A directory every node can read and write (shared storage on a real cluster, a "
        "host path in the sandbox), mounted at the same path in every container and named by "
        "`CLUSTERCTL_CHECKPOINT_DIR`: the program saves there and resumes from it. "
        "clusterctl watches it: 3 attempts in a row without a new file there end the run as a "
        "crash loop. `launch --checkpoint` wins."),
        **key(valid="an absolute directory path on the nodes (shared storage), e.g. /shared/ckpt",
        flag=KeyFlag("--checkpoint", 'A directory every node shares (a host path in the sandbox), mounted at the same path in every container as CLUSTERCTL_CHECKPOINT_DIR, to save to and resume from.', metavar="DIR")))
    nnodes: int | str | None = Field(None, description=(
        "How many nodes the run uses: `N` (the first N non-spare nodes of the inventory; "
        "the others wait as spares) or `MIN:MAX` (start on up to MAX, and when nodes fail "
        "and no spare is left, go on with fewer, down to MIN). Not set: every non-spare "
        "node, and no shrinking."),
        **key(valid="a whole number of nodes, or MIN:MAX (e.g. \"2:4\")", doc_type="a whole number, or `MIN:MAX` in quotes"))
    collective_check: bool = Field(False, description=(
        "`true`: before each restart, besides preflight, run the collective check "
        "(`clusterctl check --collective`) on the next attempt's nodes, bounded to 60 s; a "
        "node it names slow or broken is excluded like one that fails preflight (a spare "
        "takes its rank)."),
        **key(valid="true or false"))


def _extra(name: str) -> dict[str, Any]:
    extra = _Spec.model_fields[name].json_schema_extra
    return extra if isinstance(extra, dict) else {}


#: What is valid for each key, appended to validation messages (from :class:`_Spec`).
KEY_HELP: dict[str, str] = {name: _extra(name)["valid"] for name in _Spec.model_fields}

#: The job keys ``launch`` takes as flags, key -> its flag (from :class:`_Spec`).
KEY_FLAGS: dict[str, KeyFlag] = {name: _extra(name)["flag"] for name in _Spec.model_fields
                                 if "flag" in _extra(name)}


#: The keys a loaded :class:`Job` holds in another form than the file's (each converted in
#: ``_validate``): key -> [(the Job field, its type, its default)], in place of the key.
_CONVERTED: dict[str, list[tuple[str, Any, Any]]] = {
    "hang_timeout": [("hang_timeout", float | None, None)],            # seconds
    "hang_start_timeout": [("hang_start_timeout", float | None, None)],  # seconds
    "workdir": [("workdir", Path | None, None)],                        # absolute
    "requirements": [("requirements", Path | None, None)],              # absolute
    "max_workdir_size": [("max_workdir_size", int | None, None)],       # bytes
    "retry_on_exit": [("retry_on_exit", tuple[int, ...], ())],
    "fatal_on_exit": [("fatal_on_exit", tuple[int, ...], ())],
    "nnodes": [("min_nodes", int | None, None), ("max_nodes", int | None, None)],
}


def _job_fields() -> list[tuple]:
    """The fields of :class:`Job`: where it comes from and the command, then every key of
    :class:`_Spec` (as validated, or as :data:`_CONVERTED` says), then the keys' lines."""
    out: list[tuple] = [("name", str), ("path", Path), ("command", list[str])]
    for name, info in _Spec.model_fields.items():
        if name == "command":
            continue
        if name in _CONVERTED:
            out += [(f, t, field(default=d)) for f, t, d in _CONVERTED[name]]
            continue
        default = info.get_default(call_default_factory=False)
        made = (field(default_factory=lambda d=default: type(d)(d))
                if isinstance(default, dict | list) else field(default=default))
        out.append((name, info.annotation, made))
    out.append(("lines", dict[str, int], field(default_factory=dict, compare=False, repr=False)))
    # the keys given on the command line (a message about one names its flag, not the file)
    out.append(("given", frozenset, field(default=frozenset(), compare=False, repr=False)))
    return out


class _JobMethods:
    def where(self, key: str) -> str:
        """``file:line: key`` for a message about ``key`` (its line, else its parent's); a key
        given on the command line: its flag (``--nproc-per-node (job key nproc_per_node)``)."""
        top = key.split(".", 1)[0]
        if top in self.given:
            return _given_as(top, key)
        return _locate(self.path, self.lines, key)

    def check_node_count(self, n: int, option: str) -> int:
        """``n`` when this job may run on that many nodes (its ``nnodes`` MIN:MAX, if it has
        one); UserError naming ``option`` and the job's line otherwise (``--nnodes`` of Slurm
        and export: the job's own count wins over nothing silently)."""
        if self.max_nodes is not None:
            low, high = self.min_nodes or self.max_nodes, self.max_nodes
            if not low <= n <= high:
                said = str(high) if low == high else f"{low}:{high}"
                valid = f"--nnodes {high}" if low == high else f"--nnodes from {low} to {high}"
                raise UserError(f"{option} {n}: {self.where('nnodes')}: the job runs on nnodes "
                                f"{said}; valid: {valid}, or change the job's nnodes.")
        return n

    def check_filled_command(self, command: list[str]) -> list[str]:
        """``command`` (this job's, its placeholders filled) when its first word, the program,
        is not empty; UserError naming the job's line otherwise (``command: ["{CMD}", ...]``
        with ``--set CMD=``: the file's own check sees the placeholder, not the value)."""
        if command and not command[0].strip():
            raise UserError(f"{self.where('command.0')}: the program to run (the command's first "
                            f"word, {shown(self.command[0])}) is empty once its placeholders are "
                            "filled; valid: a program name or path, e.g. --set NAME=python.")
        return command

    @property
    def placeholder_names(self) -> frozenset[str]:
        """Every name a ``{placeholder}`` in this job may use."""
        return frozenset(LAUNCH_VALUES) | frozenset(self.params)


#: A loaded, validated job: ``name``, ``path`` (the file, or ``(command line)``), then one
#: field per job key, made from :class:`_Spec` (a key is declared once, there), and
#: ``lines``, which maps a key path (``"env.PHASE"``, ``"command"``) to its line in ``path``
#: so later checks (at plan time) can point at the file too.
Job = make_dataclass("Job", _job_fields(), bases=(_JobMethods,), frozen=True,
                     namespace={"__module__": __name__, "__doc__": "A loaded, validated job spec "
                                "(one field per key of :class:`_Spec`)."})


def key_flag_help(name: str) -> str:
    """A key flag's ``--help`` text: what it does, then which job key it sets."""
    return f"{KEY_FLAGS[name].help} Job key: {name}."


def flag_values(values: dict[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The job keys given as ``launch`` flags (None: not given), as a job file would hold
    them: paths as text, ``--env NAME=VALUE`` items as a mapping (``--env NAME`` alone: NAME's
    value in ``environ``, clusterctl's environment)."""
    given: dict[str, Any] = {}
    for name, value in values.items():
        kind = KEY_FLAGS[name].kind
        if value is None or (kind == "list" and not value):
            continue
        given[name] = (str(value) if kind == "path" else
                       _env_items(value, environ) if kind == "list" else value)
    return given


def _env_items(items: list[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``--env NAME=VALUE`` items (``NAME`` alone: from ``environ``); a malformed one names
    itself (its value is never shown)."""
    found = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep and ENV_NAME.match(item):
            if environ is None or item not in environ:
                raise UserError(f"--env {item}: {item} is not set in clusterctl's environment; valid: "
                                f"NAME=VALUE (e.g. --env OMP_NUM_THREADS=4), or export {item}=... "
                                "first (a secret then stays off the command line).")
            name, value = item, environ[item]
        elif not sep or not name:
            raise UserError(f"--env: expected NAME=VALUE (e.g. --env OMP_NUM_THREADS=4), got an item "
                            f"of {len(item)} characters (not shown: it may be a secret).")
        found[name] = value
    return found


class JobFileError(FileProblems):
    """Every problem of one job file, one ``FILE:LINE: key: problem; valid: ...`` line each."""

    what = "job file"

    @property
    def path(self) -> Path:
        return Path(self.file)


def _add(problems: Problems, path: tuple, problem: str, valid: str | None = None) -> None:
    """A problem at a key path; what is valid defaults to the help of its top-level key."""
    problems.add(path, problem, KEY_HELP.get(str(path[0]), "") if valid is None else valid)


def _validate(path: Path, data: Any, problems: Problems, *, given: dict[str, Any] | None = None,
              name: str | None = None, workdir_needed: bool = True) -> Job:
    if not isinstance(data, dict):
        got = "is empty" if data is None else f"is {show(data)}, not a YAML mapping"
        problems.add((), f"the file {got}", "a YAML mapping with at least `command` and `target` or `image` "
                                            f"(keys: {', '.join(KEY_HELP)})")
        problems.raise_if_any()
    try:
        spec = _Spec.model_validate(data)
    except ValidationError as e:
        _schema_problems(e, problems)
        problems.raise_if_any()
    _check_semantics(spec, problems)
    fields = spec.model_dump()
    fields["hang_timeout"] = _hang_timeout(spec.hang_timeout, problems)
    fields["hang_start_timeout"] = _hang_timeout(spec.hang_start_timeout, problems, "hang_start_timeout")
    _check_hang_line(spec.hang_start_line, problems)
    fields.pop("nnodes")
    fields.update(_recovery_fields(spec, problems))
    fields.update(_workdir_fields(path, spec, given or {}, problems, needed=workdir_needed))
    if fields["workdir"] is not None and spec.contract == "torchrun":
        fields["command"] = under_torchrun(spec.command)
    name = name or path.stem
    if not JOB_NAME_RE.fullmatch(name):
        problems.add((), f"the job's name {shown(name, 80)} (its file's name without .yaml) cannot "
                     "be used in labels, records and scripts",
                     "a file name of letters, digits, '.', '_' and '-' (at most 128, starting with "
                     "a letter or digit), e.g. train-bert.yaml")
        problems.raise_if_any()
    job = Job(name=name, path=path, given=frozenset(given or {}),
              lines={dotted(k): v for k, v in problems.lines.items() if k}, **fields)
    _check_placeholders(job, problems)
    problems.raise_if_any()
    return job


def _workdir_fields(path: Path, spec: _Spec, given: dict[str, Any], problems: Problems, *,
                    needed: bool = True) -> dict:
    """``workdir``, ``requirements`` (absolute) and ``max_workdir_size`` (bytes): a path from
    the file is relative to the file's directory, one from the command line to the current
    directory.  The workdir must be a directory; the requirements file must exist."""
    from clusterctl.code.snapshot import parse_size  # the code layer: only jobs with a workdir

    def where_from(key: str) -> Path:
        return Path.cwd() if key in given or path.name == COMMAND_LINE else path.parent

    out: dict[str, Any] = {"workdir": None, "requirements": None, "max_workdir_size": None}
    if spec.workdir is not None:
        wd = (where_from("workdir") / Path(spec.workdir).expanduser()).absolute()
        if needed and not wd.is_dir():
            _add(problems, ("workdir",), f"{wd} is {'not a directory' if wd.exists() else 'not there'}")
        out["workdir"] = wd
    if spec.requirements is not None:
        req = (where_from("requirements") / Path(spec.requirements).expanduser()).absolute()
        if not req.is_file():
            _add(problems, ("requirements",), f"{req} is {'not a file' if req.exists() else 'not there'}")
        out["requirements"] = req
    elif out["workdir"] is not None and (out["workdir"] / "requirements.txt").is_file():
        out["requirements"] = out["workdir"] / "requirements.txt"
    if spec.requirements is not None and spec.workdir is None:
        _add(problems, ("requirements",), "needs a `workdir` (the requirements of your project)")
    if spec.max_workdir_size is not None:
        try:
            out["max_workdir_size"] = parse_size(str(spec.max_workdir_size))
        except ValueError as e:
            _add(problems, ("max_workdir_size",), str(e))
    return out


def _recovery_fields(spec: _Spec, problems: Problems) -> dict:
    """``retry_on_exit``/``fatal_on_exit`` as tuples of codes (1-255, not in both), ``checkpoint``
    (an absolute path) and ``nnodes`` as ``min_nodes``/``max_nodes``."""
    out: dict[str, Any] = {"retry_on_exit": tuple(spec.retry_on_exit),
                           "fatal_on_exit": tuple(spec.fatal_on_exit), "min_nodes": None,
                           "max_nodes": None}
    for key in ("retry_on_exit", "fatal_on_exit"):
        for i, code in enumerate(getattr(spec, key)):
            if not 1 <= code <= 255:
                _add(problems, (key, i), f"{code} is not an exit code a program can end with")
    both = sorted(set(spec.retry_on_exit) & set(spec.fatal_on_exit))
    if both:
        _add(problems, ("fatal_on_exit",), f"{', '.join(map(str, both))} also in retry_on_exit",
             "each code in at most one of retry_on_exit and fatal_on_exit")
    if spec.checkpoint is not None:
        problem = control_problem(spec.checkpoint)
        if problem or not spec.checkpoint.startswith("/") or ":" in spec.checkpoint \
                or spec.checkpoint.rstrip("/") == "":
            _add(problems, ("checkpoint",), problem or f"{shown(spec.checkpoint)} is not an absolute "
                                                       "directory path other than / (without ':')")
    if spec.nnodes is not None:
        try:
            out["min_nodes"], out["max_nodes"] = parse_nnodes(spec.nnodes)
        except ValueError as e:
            _add(problems, ("nnodes",), str(e))
    return out


def parse_nnodes(value: int | str) -> tuple[int, int]:
    """``nnodes``: ``N`` -> (N, N); ``"MIN:MAX"`` -> (MIN, MAX); ValueError saying why not."""
    text = str(value).strip()
    low, sep, high = text.partition(":")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        raise ValueError(f"{shown(text)} is not N or MIN:MAX") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"{shown(text)}: need 1 <= MIN <= MAX")
    return lo, hi


def _hang_timeout(value: str | int | float | None, problems: Problems,
                  key: str = "hang_timeout") -> float | None:
    """A watchdog duration in seconds (None: none); a problem naming the key when invalid."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as e:
        _add(problems, (key,), str(e))
        return None


def hang_line_problem(text: str) -> str | None:
    """Why ``text`` cannot be ``hang_start_line`` (None: it can).  Pure."""
    problem = control_problem(text)
    if problem:
        return problem
    if not text or len(text) > HANG_LINE_MAX:
        return f"{escaped(text[:40])!r} is {'empty' if not text else f'longer than {HANG_LINE_MAX} characters'}"
    try:
        re.compile(text)
    except re.error as e:
        return f"{shown(text)} is not a regular expression ({e})"
    if _nested_repeat(text):
        return (f"{shown(text)} repeats a group that repeats inside ((a*)*, (a+)+): matching it can "
                "take exponential time on one line of output, and every line is matched; write "
                "it without nested repetition (a+ for (a+)+), or make the inner part atomic: "
                "(?>\\d+,)*\\d+ or (?:\\d++,)*\\d+")
    return None


def _nested_repeat(pattern: str) -> bool:
    """Whether ``pattern`` holds a repetition (``*``, ``+``, ``{m,n}``) of something that
    itself holds a repetition of more than one: Python's ``re`` may backtrack through those
    exponentially (catastrophic backtracking); an atomic group ``(?>...)`` or a possessive
    ``*+``/``++`` never is backtracked into.  Read from ``re``'s own parse tree."""
    try:
        from re import _parser as sre_parse  # re's own parser, Python 3.11 on
    except ImportError:  # Python 3.10
        import sre_parse
    repeats = {sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT}
    # an atomic group or a possessive repeat is never backtracked into: a barrier
    barriers = {getattr(sre_parse, "ATOMIC_GROUP", None), getattr(sre_parse, "POSSESSIVE_REPEAT", None)} - {None}

    def walk(items, inside: bool) -> bool:
        for op, av in items:
            if op in barriers:
                continue
            if op in repeats:
                low, high, sub = av
                if inside and high != 1:
                    return True
                if walk(sub, inside or high > 1):
                    return True
            elif op is sre_parse.SUBPATTERN:
                if walk(av[-1], inside):
                    return True
            elif op is sre_parse.BRANCH:
                if any(walk(b, inside) for b in av[1]):
                    return True
            elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
                if walk(av[1], inside):
                    return True
        return False
    return walk(sre_parse.parse(pattern), False)


def _check_hang_line(text: str | None, problems: Problems) -> None:
    if text is not None:
        problem = hang_line_problem(text)
        if problem:
            _add(problems, ("hang_start_line",), problem)


def _schema_problems(error: ValidationError, problems: Problems) -> None:
    """One problem per failing key (a union's several member errors count once)."""
    seen = set()
    for e in error.errors():
        loc = tuple(p for p in e["loc"] if not _is_union_tag(p) and p != "[key]")
        if loc in seen:
            continue
        seen.add(loc)
        if e["type"] == "extra_forbidden":
            top = str(loc[0])
            _add(problems, loc[:1], f"unknown key `{top}`{did_you_mean(top, list(KEY_HELP))}",
                 f"one of {', '.join(KEY_HELP)}")
        elif e["type"] == "missing":
            _add(problems, loc, "is missing")
        else:
            _add(problems, loc or ("?",), _friendly(e, show_value=not (loc and loc[0] in ("env", "params"))))


def _line_of(lines: dict[str, int], key: str) -> int:
    """The line of ``key`` or of its nearest parent that has one (0: none)."""
    probe = key
    while probe and probe not in lines:
        probe = probe.rpartition(".")[0]
    return lines.get(probe, 0)


def _given_as(top: str, key: str) -> str:
    """How a message names a job key given on the command line: its flag, and the key."""
    flag = KEY_FLAGS.get(top)
    said = flag.flag if flag else ("the command after --" if top == "command" else "the command line")
    return f"{said} (job key {key})"


def _spelling(given: Mapping[str, Any]):
    """A job file's field spelling that says which fields the command line gave."""
    def spell(path: tuple) -> str:
        text = dotted(path)
        return _given_as(str(path[0]), text) if path and path[0] in given else text
    return spell


def _locate(path: Path, lines: dict[str, int], key: str) -> str:
    """``file:line: key``, with the line of ``key`` or of its nearest parent that has one."""
    line = _line_of(lines, key)
    return f"{path}:{line}: {key}" if line else f"{path}: {key}"


def _is_union_tag(part: Any) -> bool:
    """pydantic puts union member names ("int", "literal['slots']") into error locations."""
    return isinstance(part, str) and (part in {"int", "str"} or part.startswith(("literal[", "function-")))


def _friendly(error: dict, *, show_value: bool = True) -> str:
    """pydantic's message in our words; an env or params value (it may be a secret) is never shown."""
    value = error.get("input")
    if not show_value and not isinstance(value, (dict, list)) and value is not None:
        return f"{error['msg'].rstrip('.').lower()} (the value is not shown: it may be a secret)"
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return f"{error['msg'].rstrip('.').lower()} (got {shown})"


#: Fields whose text may hold tab and line feed (free text); every other field is one line.
_MULTILINE = ("command", "env", "params")


def _check_characters(spec: _Spec, problems: Problems) -> None:
    """NUL and other control characters are refused here, naming the field and the character
    (never the value: an env value or a parameter may be a secret)."""
    for key in ("description", "target", "image", "contract"):
        value = getattr(spec, key)
        problem = control_problem(value) if isinstance(value, str) else None
        if problem:
            _add(problems, (key,), problem)
    for section in ("command", "docker_args", "mounts"):
        for i, value in enumerate(getattr(spec, section)):
            problem = control_problem(value, multiline=section in _MULTILINE)
            if problem:
                _add(problems, (section, i), problem)
    for section in ("env", "params"):
        for name, value in getattr(spec, section).items():
            problem = control_problem(value, multiline=True)
            if problem and ENV_NAME.match(name):
                _add(problems, (section, name), f"the value {problem}")


def _check_semantics(spec: _Spec, problems: Problems) -> None:
    """Rules a schema cannot say: names, characters, contract, target, reserved flags, mounts."""
    _check_characters(spec, problems)
    if spec.command and not spec.command[0].strip():   # an empty argument later is an argument
        _add(problems, ("command", 0), "the program to run (the command's first word) is empty",
             "a program name or path first, e.g. [python, train.py]")
    if not spec.target and not spec.image:
        _add(problems, ("target",), "a job needs `target` (a target name) or `image` (an image tag), or both",
             f"target: {KEY_HELP['target']}; image: {KEY_HELP['image']}")
    if spec.contract not in CONTRACTS:
        _add(problems, ("contract",), f'unknown contract "{spec.contract}"'
                                      f"{did_you_mean(spec.contract, list(CONTRACTS))}")
    if isinstance(spec.nproc_per_node, int) and spec.nproc_per_node < 1:
        _add(problems, ("nproc_per_node",), f"must be at least 1 (got {spec.nproc_per_node})")
    for section in ("env", "params"):
        for name in getattr(spec, section):
            if not ENV_NAME.match(name):
                _add(problems, (section, name), "not a valid variable name (letters, digits, _; "
                                                "not starting with a digit)")
    for name in spec.params:
        if name in LAUNCH_VALUES:
            _add(problems, ("params", name), "a parameter may not reuse a launch value's name",
                 f"a name other than {one_of(LAUNCH_VALUES)}")
    for i, name in enumerate(spec.secrets):
        if not ENV_NAME.match(name):
            _add(problems, ("secrets", i), f'"{escaped(name)}" is not a valid variable name')
    for i, arg in enumerate(spec.docker_args):
        if reserved_flag(arg):
            _add(problems, ("docker_args", i), f"`{reserved_flag(arg)}` is set by clusterctl itself "
                                               "and may not be given here",
                 f"docker run arguments other than {one_of(RESERVED_DOCKER_FLAGS)}")
    for i, mount in enumerate(spec.mounts):
        problem = mount_problem(mount, expanded=False)
        if problem:
            _add(problems, ("mounts", i), problem)
    known = targets.target_names()
    if spec.target and spec.target not in known:
        _add(problems, ("target",), f'unknown target "{spec.target}"{did_you_mean(spec.target, known)}',
             f"one of the known targets: {one_of(known)}")


def reserved_flag(arg: str) -> str | None:
    """The reserved docker flag ``arg`` is (``--name``, ``--rm=true`` ...), else None."""
    head = arg.split("=", 1)[0]
    return head if head in RESERVED_DOCKER_FLAGS else None


def mount_problem(mount: str, *, expanded: bool = True) -> str | None:
    """What is wrong with a ``HOST:CONTAINER[:MODE]`` mount, or None.

    Before placeholders are filled (``expanded=False``) the host part is not
    checked, since ``{BERT_DIR}`` is only a path later.  A path may not hold a control
    character (a line break would split a Slurm script's line) or a ',' (pyxis's
    ``--container-mounts`` separates mounts with it: ``/data,/etc`` would mount /etc).
    """
    parts = mount.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        return f"{shown(mount)} is not HOST:CONTAINER or HOST:CONTAINER:ro"
    if len(parts) == 3 and parts[2] not in ("ro", "rw"):
        return f"mode {shown(parts[2])} in {shown(mount)} is not ro or rw"
    if not parts[1].startswith(("/", "{")):
        return f"container path {shown(parts[1])} in {shown(mount)} must be absolute"
    if expanded and not parts[0].startswith("/"):
        return f"host path {shown(parts[0])} in {shown(mount)} must be absolute"
    bad = control_problem(mount) or ("holds a ','" if "," in mount else None)
    if bad:
        return f"{shown(mount)} {bad}: a mount's paths are plain absolute paths"
    return None


# --------------------------------------------------------------------------- placeholders

def placeholders(template: str) -> list[str]:
    """The placeholder names in ``template`` (``{{``/``}}`` are literal braces).

    Raises ValueError for malformed braces or format specs (``{a:>3}``, ``{a!r}``).
    """
    names = []
    for _literal, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if spec or conversion:
            raise ValueError(f"placeholder {{{name}}} may not carry a format spec or conversion")
        names.append(name)
    return names


def expand(template: str, values: dict[str, str]) -> str:
    """Fill ``{name}`` placeholders from ``values`` (names already checked at load)."""
    out = []
    for literal, name, _spec, _conv in string.Formatter().parse(template):
        out.append(literal)
        if name is not None:
            out.append(values[name])
    return "".join(out)


def _templated_fields(job: Job) -> list[tuple[tuple, str]]:
    """(key path, template) for every value that may hold placeholders."""
    items: list[tuple[tuple, str]] = [(("env", k), v) for k, v in job.env.items()]
    for section in ("command", "docker_args", "mounts"):
        items += [((section, i), v) for i, v in enumerate(getattr(job, section))]
    return items


def _check_placeholders(job: Job, problems: Problems) -> None:
    valid = job.placeholder_names
    listing = ", ".join("{" + v + "}" for v in sorted(valid))
    for path, template in _templated_fields(job):
        try:
            names = placeholders(template)
        except ValueError as e:  # an env value may be a secret: quoted only outside env
            where = "in the value" if path[0] == "env" else f"in {shown(template)}"
            _add(problems, path, f"{e} {where}",
                 "{name} placeholders without format specs; write {{ and }} for literal braces")
            continue
        for name in names:
            if name not in valid:
                _add(problems, path, f"unknown placeholder {{{name}}}{did_you_mean(name, valid)}",
                     f"{listing} (write {{{{ and }}}} for literal braces)")


def keys_doc() -> str:
    """The keys of a job file, one paragraph each, from :class:`_Spec` (this module's
    docstring ends with it)."""
    out = ["", "The keys", "--------"]
    for name, info in _Spec.model_fields.items():
        flag = KEY_FLAGS.get(name)
        out += [f"``{name}``" + (f" (``launch {flag.flag}``)" if flag else ""),
                f"    {info.description}", ""]
    return "\n".join(out)


__doc__ = (__doc__ or "") + keys_doc()
