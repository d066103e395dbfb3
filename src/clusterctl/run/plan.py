"""The launch plan: exactly what runs on each node, as data, before anything runs.

:func:`make_plan` combines a job (:mod:`clusterctl.run.jobs`), an inventory,
the user's ``--set`` values and the facts about the nodes (the interfaces
preflight found, the master's address, clusterctl's own environment for listed
secrets) into one :class:`NodePlan` per node: the container environment, the
devices and the full ``docker run`` argv.  It is pure (no SSH, no Docker, no
``os.environ``, no ssh config: every fact is an argument), so ``clusterctl
launch --dry-run`` prints it (:func:`render_dry_run`) and tests check it
without nodes; the execution side (:mod:`clusterctl.run.launch`) gathers the
facts, calls it once, runs ``plan.argv`` on ``plan.node`` over SSH and feeds
``plan.stdin`` to it.

Contract: :func:`check_inputs` (every input problem, before any node is
contacted), :func:`node_devices` (what preflight checks before the plan
exists), :func:`make_plan`, and for showing: :func:`render_dry_run`,
:func:`plan_record`, :func:`masked`, :func:`mask_env`, :func:`mask_text`,
:func:`secret_values`.

Environment precedence (later wins)
-----------------------------------
1. launch values: ``MASTER_ADDR MASTER_PORT NODE_RANK NNODES NPROC_PER_NODE``,
   ``PET_NNODES PET_NODE_RANK PET_NPROC_PER_NODE PET_MASTER_ADDR PET_MASTER_PORT``,
   the job contract's extras (``accl-bert``: ``RANK`` = node rank,
   ``WORLD_SIZE`` = number of nodes), and ``GLOO_SOCKET_IFNAME`` /
   ``NCCL_SOCKET_IFNAME`` = the node's interface (inventory ``interface``,
   else what preflight found);
2. the target's default ``env`` (src/clusterctl/image/data/targets.yaml);
3. the job's ``env`` (placeholders filled);
4. the inventory's ``env`` (``defaults:`` merged with the node's own);
5. ``--set NAME=VALUE``, exactly as typed (never expanded).

``MASTER_ADDR`` is the master node's address as the other nodes reach it,
given as ``master_addr`` (launch resolves an ``~/.ssh/config`` alias to its
``HostName`` with :func:`clusterctl.cluster.sshconfig.resolve_host`; default:
the inventory host as written).  A
``MASTER_ADDR`` / ``MASTER_PORT`` / ``NPROC_PER_NODE`` given by layer 4 or 5
also becomes the ``{master_addr}`` / ``{master_port}`` / ``{nproc_per_node}``
placeholder value (and counts in ``{world_size}``), so ``PET_*`` and a command
line such as torchrun's ``--master-addr={master_addr}`` agree with it:
``--set NPROC_PER_NODE=4`` runs 4 processes per node whatever the job says.
``--set NAME=VALUE`` where NAME is one of the job's ``params`` sets that
parameter instead of an environment variable.

docker run argv, in order
-------------------------
``docker run -d --net=host --name <run_id>-<node> --label io.clusterctl.run=..
--label io.clusterctl.job=.. --label io.clusterctl.node=.. --label
io.clusterctl.rank=..`` + ``--add-host`` per node whose address is known
(:func:`host_entries`) + target flags + job ``docker_args`` + ``-v`` per job
mount + ``--device=`` per target/inventory device + ``extra_docker_args`` +
``-e NAME=VALUE`` per non-secret variable + (``--env-file /dev/stdin`` when
there are secrets) + IMAGE + command (``contract: mpi``: wrapped by
:func:`clusterctl.run.mpi.spawn_command`, which starts the node's processes).
No ``--rm``: the container stays after it exits so its exit status and logs can
be read; the launcher removes it.

Secrets
-------
A variable is secret when the job lists it under ``secrets`` or its name is
like one (:func:`clusterctl.core.secretnames.is_secret_name`: a word SECRET, PASSWORD or
PASSWD, or a last word TOKEN, KEY or APIKEY).  A secret's value never appears in
``argv``: the argv carries ``--env-file /dev/stdin`` and :attr:`NodePlan.stdin`
holds the env-file text (``NAME=value`` lines) that the launcher writes to the
``docker run`` process's stdin over the SSH channel
(``conn.run(plan.argv, stdin=plan.stdin)``), so the value is in no command line,
no process listing and no log.  (``docker inspect`` on the node still shows a
container's env; that is the node's own trust boundary.)  Env-file values are
taken literally to the end of the line, so a secret may not contain a newline.
:func:`masked` / :func:`mask_env` give the copy to show or record: secret values
replaced by ``****``.  Only :func:`maskable` values are searched for in text (a value
shorter than 8 characters, a number or an address would rewrite every ``0`` or address
and taint MASTER_PORT); :func:`unmasked_secrets` names the others for launch's warning.
"""

from __future__ import annotations

import ipaddress
import json as jsonlib
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from clusterctl.cluster.containers import (
    ATTEMPT_LABEL,
    JOB_LABEL,
    NODE_LABEL,
    RANK_LABEL,
    RUN_LABEL,
)
from clusterctl.cluster.inventory.model import MAX_SLOTS
from clusterctl.cluster.runtime import ContainerRuntime, node_runtime, runtime_for
from clusterctl.core import accelerators
from clusterctl.core.errors import UserError
from clusterctl.core.imageref import check_image
from clusterctl.core.secretnames import ENV_NAME, is_secret_name
from clusterctl.core.text import control_problem, digits, shown, without_credentials
from clusterctl.image import targets
from clusterctl.run import mpi, recovery
from clusterctl.run.jobs import (
    BASE_ENV,
    CODE_MOUNT,
    CONTRACTS,
    MASK_MIN_CHARS,
    Job,
    expand,
    mount_problem,
    placeholders,
    reserved_flag,
)

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory, Node

MASK = "****"
#: The env file on ``docker run``'s stdin that carries secret values.
ENV_FILE_STDIN = "/dev/stdin"

#: The variables naming the network interface gloo and NCCL use (layer 1, when known).
INTERFACE_ENV: tuple[str, ...] = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

#: The variables EVERY container gets, whatever its job and target, with what each holds
#: (the job's contract adds its own: :data:`clusterctl.run.jobs.CONTRACTS`).  Layer 1 of
#: the precedence above: a target, job, inventory or ``--set`` value for the same name
#: wins.  docs/reference/environment.md is generated from this table; a test compares it
#: with the keys of a real plan.
CONTAINER_ENV: dict[str, str] = {
    "MASTER_ADDR": "The master's (rank 0's) address as the other nodes reach it: its "
                   "inventory host, an ~/.ssh/config alias resolved to its HostName.",
    "MASTER_PORT": "The port the master listens on for torch.distributed: the job's or the "
                   "inventory's master_port when one is set, else the first port from 29500 up "
                   "that is free on the master and held by no other run.",
    "NODE_RANK": "This node's rank: 0 for the master, then the inventory's file order.",
    "NNODES": "The number of nodes of the run.",
    "NPROC_PER_NODE": "The processes this node starts: the job's nproc_per_node, or the "
                      "node's slots when it says slots.",
    "PET_NNODES": "NNODES, under the name torchrun reads as the default of --nnodes.",
    "PET_NODE_RANK": "NODE_RANK, as torchrun's default for --node-rank.",
    "PET_NPROC_PER_NODE": "NPROC_PER_NODE, as torchrun's default for --nproc-per-node.",
    "PET_MASTER_ADDR": "MASTER_ADDR, as torchrun's default for --master-addr.",
    "PET_MASTER_PORT": "MASTER_PORT, as torchrun's default for --master-port.",
    "GLOO_SOCKET_IFNAME": "The network interface gloo uses: the inventory's interface, else "
                          "the one preflight found holding the node's address.",
    "NCCL_SOCKET_IFNAME": "The network interface NCCL uses, the same as GLOO_SOCKET_IFNAME.",
}

#: What a container of a job with a ``workdir`` gets besides :data:`CONTAINER_ENV` (launch
#: values too: a later layer may replace them, nothing should).
CODE_ENV: dict[str, str] = {
    "CLUSTERCTL_CODE_DIGEST": "The content digest (sha256:...) of the project copy mounted at "
                              "/workspace: the same on every rank of a run, and in its record.",
}


@dataclass(frozen=True)
class Attempt:
    """Which attempt of a run a plan is for (:mod:`clusterctl.run.recovery`)."""

    number: int = 0
    excluded: tuple[str, ...] = ()      # nodes excluded so far, in the order they were
    checkpoint: str | None = None       # the shared checkpoint directory, same path inside


@dataclass(frozen=True)
class CodeMount:
    """The project copy a run's containers get (``launch --workdir``): its digest, and the
    directory that holds it on each node (:func:`clusterctl.code.sync.sync` says where)."""

    digest: str
    paths: Mapping[str, str]   # node name -> the tree's directory on that node


#: The layers of a container's environment, lowest first (a later layer wins), above
#: the launch values of :data:`CONTAINER_ENV` and the contract: (layer, what sets it).
ENV_LAYERS: tuple[tuple[str, str], ...] = (
    ("target", "the target's default env (src/clusterctl/image/data/targets.yaml)"),
    ("job", "the job's env, placeholders filled"),
    ("inventory", "the inventory's env: defaults.env merged with the node's own env"),
    ("--set", "--set NAME=VALUE on the command line, exactly as typed"),
)
_CONTAINER_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")


@dataclass(frozen=True)
class NodePlan:
    """What runs on one node.

    ``env`` holds the REAL values (secrets included): show or record only
    :func:`masked` copies.  ``argv`` never contains a secret value; when
    ``secrets`` is non-empty it reads them from ``--env-file /dev/stdin`` and
    ``stdin`` must be fed to the ``docker run`` process.
    """

    node: str                  # inventory node name
    host: str                  # inventory host (what SSH connects to)
    rank: int                  # node rank, 0 = master
    env: dict[str, str]        # full container env, real values
    argv: list[str]            # ["docker", "run", "-d", ...]: run as is on the node
    container: str             # container name, "<run_id>-<node>"
    run_id: str = ""
    job: str = ""
    image: str = ""
    nproc: int = 1             # processes this node starts
    labels: dict[str, str] = field(default_factory=dict)
    secrets: frozenset[str] = frozenset()   # names in env whose values are secret
    stdin: bytes | None = field(default=None, repr=False)   # env file of secret values, or None
    devices: list[str] = field(default_factory=list)  # --device= specs (:func:`node_devices`)
    options: list[str] = field(default_factory=list)  # docker run options between the labels and -e
    command: list[str] = field(default_factory=list)  # the container command, placeholders filled
    hosts: list[str] = field(default_factory=list)    # the --add-host options (:func:`host_entries`)
    hidden: frozenset[str] = field(default=frozenset(), repr=False)  # every secret value (masked anywhere)
    flight_dir: str | None = None  # the node's directory mounted for flight recorder dumps, or None

    @property
    def command_line(self) -> str:
        """The argv as one shell-safe line (it holds no secret value)."""
        return shlex.join(self.argv)


# --------------------------------------------------------------------------- inputs

def parse_sets(items: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``--set NAME=VALUE`` options -> {NAME: VALUE}; the value is kept exactly as typed.
    ``--set NAME`` alone takes NAME's value from ``environ`` (clusterctl's environment: the
    way to give a secret that never shows in the process list).

    UserError (exit 2) for a name ``environ`` lacks, an item without a name, or an invalid name.
    """
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep and ENV_NAME.match(item) and environ is not None and item in environ:
            name, value = item, environ[item]
        elif not sep:  # a name without its value, or a value (maybe a secret) without its name
            if ENV_NAME.match(item):
                raise UserError(f"--set {item}: {item} is not set in clusterctl's environment; valid: "
                                f"NAME=VALUE (e.g. --set PHASE=2; the value may be empty: NAME=), or "
                                f"export {item}=... first (a secret then stays off the command line).")
            raise UserError(f"--set (an item of {len(item)} characters, not shown: it may be a secret): "
                            "expected NAME=VALUE (e.g. --set PHASE=2); the value may be empty (NAME=).")
        if not ENV_NAME.match(name):
            raise UserError(f"--set {shown(name)}=...: {shown(name)} is not a valid variable name; "
                            "valid: at most 255 letters, digits and _, not starting with a digit (e.g. BATCH_SIZE).")
        problem = control_problem(value, multiline=True)
        if problem:
            raise UserError(f"--set {name}=...: the value {problem}; valid: text without NUL or control "
                            "characters other than tab and line feed (the value is not shown: it may "
                            "be a secret).")
        out[name] = value
    return out


def container_name(run_id: str, node: str, attempt: int = 0) -> str:
    """``<run_id>-<node>`` (``<run_id>-<node>-a<K>`` for attempt K > 0) with characters docker
    refuses in names replaced by ``-``."""
    return _CONTAINER_UNSAFE.sub("-", f"{run_id}-{node}" + (f"-a{attempt}" if attempt else ""))


# --------------------------------------------------------------------------- the master port

#: How many ports from the default master port up launch tries (29500-29599).
MASTER_PORT_SPAN = 100


@dataclass(frozen=True)
class PinnedPort:
    """A master port the user fixed, and where (for messages)."""

    port: int
    where: str


def pinned_master_port(job: Job, inventory: Inventory, overrides: Mapping[str, str] | None = None
                       ) -> PinnedPort | None:
    """The master port the user fixed, by precedence: ``--set MASTER_PORT``, the master's
    inventory env, the job's env (a number), the job's ``master_port``, the inventory's
    ``master_port`` when it is not the default (29500).  None: nothing fixes it, and launch
    takes the first free port from the inventory's up (:func:`choose_master_port`).
    UserError naming where, for a value that is not a port.  Pure."""
    from clusterctl.cluster.inventory.model import DEFAULT_MASTER_PORT

    _params, env_sets = split_sets(job, overrides or {})
    master = inventory.master
    job_env = job.env.get("MASTER_PORT")
    given = [("--set MASTER_PORT", env_sets.get("MASTER_PORT")),
             (f"MASTER_PORT in the inventory env of {master.name}", master.env.get("MASTER_PORT")),
             ("MASTER_PORT in the job's env", job_env if job_env and not placeholders(job_env) else None),
             ("the job's master_port", job.master_port)]
    for where, value in given:
        if value is None:
            continue
        text = str(value)
        if not digits(text) or not 1 <= int(text) <= 65535:
            raise UserError(f"{where} = {shown(value)} is not a port; valid: a whole number "
                            "from 1 to 65535 (or leave it out: launch picks a free one from "
                            f"{DEFAULT_MASTER_PORT} up).")
        return PinnedPort(int(text), where)
    if inventory.master_port != DEFAULT_MASTER_PORT:
        return PinnedPort(inventory.master_port, f"master_port in {inventory.path}")
    return None


def choose_master_port(first: int, busy: Iterable[int], held: Mapping[int, str], *,
                       span: int = MASTER_PORT_SPAN, where: str = "the master") -> int:
    """The first port from ``first`` up (``span`` of them) that nothing listens on
    (``busy``: the master's listening ports) and no run holds (``held``: port -> that run,
    in words).  UserError naming the range when every one is taken.  Pure."""
    taken = set(busy) | set(held)
    last = min(first + span, 65536) - 1
    for port in range(first, last + 1):
        if port not in taken:
            return port
    raise UserError(f"no free master port on {where}: {first}-{last} are all in use or held by "
                    "runs; stop a run (`clusterctl runs` lists them) or pin a port outside that "
                    "range (--set MASTER_PORT=PORT, or master_port in the job or inventory).")


# --------------------------------------------------------------------------- planning

def node_devices(job: Job, node: Node) -> list[str]:
    """The ``--device=`` specs ``node``'s container gets: the target's (per slot where the
    stack says) then the inventory node's, repeats dropped.  Pure: preflight checks them
    on the nodes before any plan exists."""
    target = targets.get_target(job.target) if job.target else None
    found = (target.run.devices_for(node.slots) if target else []) + list(node.devices)
    return list(dict.fromkeys(found))


def job_devices(job: Job) -> list[str]:
    """The ``--device`` specs a job's own ``docker_args`` ask for (``--device=SPEC`` or
    ``--device SPEC``), for preflight to check too; a spec with a placeholder is known only
    per node, after planning, and is left to docker."""
    args, found = list(job.docker_args), []
    for i, arg in enumerate(args):
        if arg.startswith("--device="):
            found.append(arg.split("=", 1)[1])
        elif arg == "--device" and i + 1 < len(args):
            found.append(args[i + 1])
    return [d for d in dict.fromkeys(found) if d and "{" not in d]


@dataclass(frozen=True)
class _Launch:
    """What is the same for every node of one plan."""

    job: Job
    target: object | None          # clusterctl.image.targets.Target
    image: str
    run_id: str
    extra_docker_args: tuple[str, ...]


@dataclass(frozen=True)
class _Node:
    """One node's resolved and checked inputs: everything of its plan but node facts."""

    node: object                   # clusterctl.cluster.inventory.Node
    rank: int
    nproc: int
    values: dict[str, str]         # placeholder values
    launch_env: dict[str, str]     # layer 1 without the interface
    upper_env: dict[str, str]      # layers 2-5, then listed secrets from clusterctl's environment
    secrets: frozenset[str]
    options: list[str]             # docker run options between the labels and the -e list
    stdin: bytes | None
    hidden: frozenset[str] = frozenset()   # every secret value of this node (to mask anywhere)
    first_rank: str = "0"          # global rank of this node's first process (contract mpi)


def image_of(job: Job, image: str | None = None) -> str | None:
    """The image a job runs: ``image`` (``--image``), else the job's, else its target's tag."""
    return image or job.image or (targets.resolve(job.target).tag if job.target else None)


def check_inputs(job: Job, inventory: Inventory, *, run_id: str, image: str | None = None,
                 overrides: Mapping[str, str] | None = None,
                 extra_docker_args: Sequence[str] = (),
                 host_env: Mapping[str, str] | None = None,
                 master_addr: str | None = None) -> str:
    """Every problem of the inputs :func:`make_plan` would refuse, as UserError (exit 2),
    without node facts and without building the plan; returns the image reference.

    Pure, like make_plan (same arguments less ``interfaces``): launch calls it
    before any node is contacted, then make_plan once with what preflight found.
    """
    launch, _ = _resolve(job, inventory, run_id=run_id, image=image, overrides=overrides,
                         extra_docker_args=extra_docker_args, host_env=host_env,
                         master_addr=master_addr)
    return launch.image


def make_plan(job: Job, inventory: Inventory, *, run_id: str, image: str | None = None,
              interfaces: Mapping[str, str] | None = None,
              overrides: Mapping[str, str] | None = None,
              extra_docker_args: Sequence[str] = (),
              host_env: Mapping[str, str] | None = None,
              master_addr: str | None = None,
              addresses: Mapping[str, str] | None = None,
              runtime: Mapping[str, str] | None = None,
              flight_recorder: bool = True,
              init_nodes: Iterable[str] = (),
              code: CodeMount | None = None,
              attempt: Attempt | None = None) -> list[NodePlan]:
    """One NodePlan per inventory node, in rank order.  Pure: nothing is contacted or read.

    Every fact comes in as an argument: ``image`` replaces the job's/target's
    image; ``interfaces`` maps node name to the NIC preflight found;
    ``overrides`` are the ``--set`` values (:func:`parse_sets`); ``host_env``
    (clusterctl's own environment; default: empty) supplies listed secrets no
    layer sets; ``master_addr`` is the master as the other nodes reach it
    (default: its inventory host as written; launch passes the ssh-config
    ``HostName``, :func:`clusterctl.cluster.sshconfig.resolve_host`);
    ``addresses`` maps node name to the IPv4 address the others reach it at:
    every container gets ``/etc/hosts`` entries for each (:func:`host_entries`),
    so the cluster's addresses resolve to node names without DNS.
    ``runtime`` replaces placeholder values that a scheduler decides only when the job
    runs (``node_rank``, ``nnodes``, ``master_addr``, ...) with the caller's stand-ins
    (:mod:`clusterctl.run.slurm` renders them as shell variables); a MASTER_ADDR or
    MASTER_PORT from the inventory env or ``--set`` still wins.
    ``flight_recorder``: on a target with a ``flight_recorder`` (nccl), turn it on
    (:func:`flight_dir`); launch collects the dumps.
    ``init_nodes``: the nodes whose container gets ``--init`` (Docker's init, tini, as PID 1:
    it passes SIGTERM on to the command, so a stop costs the ranks' exit, not the grace;
    launch passes the nodes where preflight found the init binary).
    ``code``: the project copy of a job with a ``workdir``, mounted read-only at
    ``/workspace`` (the working directory) with ``CLUSTERCTL_CODE_DIGEST`` set.
    ``attempt``: which attempt of the run this is (default: the first), the nodes excluded
    so far and the checkpoint directory (mounted at its own path): the resume contract
    (:func:`clusterctl.run.recovery.environment`) every container gets; an attempt after
    the first has its own container names (``<run>-<node>-a<K>``).
    UserError (exit 2) on anything unusable.
    """
    pinned_master_port(job, inventory, overrides)   # a MASTER_PORT given is a port, whoever runs it
    hosts = host_entries(addresses or {})
    launch, nodes = _resolve(job, inventory, run_id=run_id, image=image, overrides=overrides,
                             extra_docker_args=extra_docker_args, host_env=host_env,
                             master_addr=master_addr, runtime=runtime)
    init_nodes = set(init_nodes)
    attempt = attempt or Attempt()
    return [_node_plan(launch, n, n.node.interface or (interfaces or {}).get(n.node.name), hosts,
                       flight_recorder, n.node.name in init_nodes, code, attempt)
            for n in nodes]


#: Where a run keeps its files on a node (flight recorder dumps), removed when it ends.
NODE_RUN_ROOT = "/var/tmp/clusterctl/runs"


def flight_dir(run_id: str, node: str) -> str:
    """The directory on ``node`` that its container's flight recorder dumps go to."""
    return f"{NODE_RUN_ROOT}/{run_id}/{_CONTAINER_UNSAFE.sub('-', node)}/flight"


def host_entries(addresses: Mapping[str, str]) -> list[str]:
    """``--add-host`` options naming each node's IPv4 address, plain and IPv4-mapped IPv6.

    torch's c10d store logs every connection with the peer's name
    (``getnameinfo``); its sockets are dual-stack, so a peer shows up as
    ``::ffff:<address>``, which ``/etc/hosts`` matches only when listed in that
    form.  Without these entries each lookup goes to DNS, and where no DNS
    server is reachable (an air-gapped cluster, the sandbox's namespaced nodes)
    it fails and c10d warns "The hostname of the client socket cannot be
    retrieved" on every connection.
    """
    return [f"--add-host={name}:{prefix}{address}" for name, address in addresses.items()
            for prefix in ("", "::ffff:")]


def _resolve(job: Job, inventory: Inventory, *, run_id: str, image: str | None,
             overrides: Mapping[str, str] | None, extra_docker_args: Sequence[str],
             host_env: Mapping[str, str] | None,
             master_addr: str | None,
             runtime: Mapping[str, str] | None = None) -> tuple[_Launch, list[_Node]]:
    """The inputs of every node, checked: each UserError the plan can raise is raised here."""
    params, env_sets = split_sets(job, overrides or {})
    _check_secret_placeholders(job)
    target = targets.get_target(job.target) if job.target else None
    what = "--image" if image is not None else job.where("image")
    image = image if image is not None else image_of(job)    # an empty --image is refused
    _check_image(job, image, what)
    for arg in extra_docker_args:
        if reserved_flag(arg):
            raise UserError(f"docker argument {shown(arg)}: `{reserved_flag(arg)}` is set by clusterctl "
                            "itself and may not be given.")
    launch = _Launch(job, target, image, run_id, tuple(extra_docker_args))

    nodes = list(inventory.nodes)
    uppers = [{**node.env, **env_sets} for node in nodes]    # layers 4 and 5, per node
    nprocs = list(node_processes(job, inventory, overrides).values())   # one count, preflight's too
    shared = {
        "nnodes": str(len(nodes)),
        "world_size": str(sum(nprocs)),
        "run_id": run_id,
        "backend": (target.backend or "") if target else "",
        "device": target.device if target else "cpu",
        "master_addr": master_addr or inventory.master.host,
        "master_port": str(inventory.master_port),
    }
    resolved = []
    for rank, (node, nproc, upper) in enumerate(zip(nodes, nprocs, uppers, strict=True)):
        values = {**shared, "node_rank": str(rank), "nproc_per_node": str(nproc),
                  "node_name": node.name, **(runtime or {}), **params}
        values["master_addr"] = upper.get("MASTER_ADDR", values["master_addr"])
        values["master_port"] = upper.get("MASTER_PORT", values["master_port"])
        launch_env, upper_env = job_environment(job, target, values, node.env, env_sets)
        secrets = _secret_names(job, {**launch_env, **upper_env}, upper_env, host_env or {})
        env = {**launch_env, **upper_env}
        hidden = _secret_texts(job, params, env, secrets)
        secrets |= _tainted(env, hidden)
        stdin = None
        if secrets:
            stdin = _env_file(job, {k: env[k] for k in env if k in secrets})
        options = _docker_options(job, target, node, values, launch.extra_docker_args)
        resolved.append(_Node(node, rank, nproc, values, launch_env, upper_env,
                              frozenset(secrets), options, stdin, frozenset(hidden),
                              first_rank=(runtime or {}).get("first_rank", str(sum(nprocs[:rank])))))
    return launch, resolved


def secret_params(job: Job) -> list[str]:
    """The job's parameters whose values are secret: listed under ``secrets`` or named like
    one (:func:`clusterctl.core.secretnames.is_secret_name`)."""
    return [name for name in job.params if is_secret_name(name, job.secrets)]


def _secret_texts(job: Job, params: Mapping[str, str], env: Mapping[str, str],
                  secrets: Iterable[str]) -> set[str]:
    """Every secret value of one node: its secret variables' and the job's secret parameters'
    (a parameter may be copied into any other variable through a placeholder)."""
    found = {env[k] for k in secrets if env.get(k)}
    return {v for v in found | {params[p] for p in secret_params(job) if params.get(p)} if maskable(v)}


def _tainted(env: Mapping[str, str], hidden: set[str]) -> set[str]:
    """Variables whose value holds a secret value, whatever their name: a secret copied into
    ``COPY: "{HF_TOKEN}"`` is as secret as HF_TOKEN, so it goes through the env file and is
    masked wherever the plan is shown."""
    return {k for k, v in env.items() if v and any(h in v for h in hidden)}


def secret_placeholder_use(job: Job) -> tuple[str, str] | None:
    """The first place (``job.where`` text, parameter) where a secret parameter fills the
    command, docker_args or mounts, else None.  Pure."""
    hidden = set(secret_params(job))
    for section in ("command", "docker_args", "mounts"):
        for i, template in enumerate(getattr(job, section)):
            used = sorted(hidden & set(placeholders(template)))
            if used:
                return job.where(f"{section}.{i}"), used[0]
    return None


def _check_secret_placeholders(job: Job) -> None:
    """A secret parameter may fill env values (they go through the env file) but not the
    command, docker_args or mounts: those are docker run's argv, visible in process listings
    and ``docker inspect`` on the node.  The message names the place, never the value."""
    if found := secret_placeholder_use(job):
        where, name = found
        raise UserError(f"{where}: {{{name}}} is a secret parameter and "
                        f"would be on docker run's command line; valid: pass it through env "
                        f"(env: {{{name}: \"{{{name}}}\"}}) and read it from the environment.")


def split_sets(job: Job, overrides: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``--set`` values split into (the job's params with them applied, env variables):
    a NAME that is one of the job's ``params`` sets that parameter, any other an env variable."""
    params = {**job.params, **{k: v for k, v in overrides.items() if k in job.params}}
    return params, {k: v for k, v in overrides.items() if k not in job.params}


def nproc_for(job: Job, slots: int, upper: Mapping[str, str], who: str) -> int:
    """Processes per node: NPROC_PER_NODE from ``upper`` (inventory env / --set), else the
    job's value, ``slots`` when the job says so.  ``who`` names the node in the message."""
    given = upper.get("NPROC_PER_NODE")
    if given is not None:
        if not digits(given) or not 1 <= int(given) <= MAX_SLOTS:
            raise UserError(f"NPROC_PER_NODE={shown(given)} for {who} (inventory env or --set) "
                            f"is not a whole number from 1 to {MAX_SLOTS}; valid: e.g. "
                            "NPROC_PER_NODE=4.")
        return int(given)
    if job.nproc_per_node == "slots":
        return slots
    if not 1 <= int(job.nproc_per_node) <= MAX_SLOTS:
        raise UserError(f"{job.where('nproc_per_node')}: {job.nproc_per_node} processes per node; "
                        f"valid: a whole number from 1 to {MAX_SLOTS}, or slots.")
    return int(job.nproc_per_node)


def node_processes(job: Job, inventory: Inventory, overrides: Mapping[str, str] | None = None
                   ) -> dict[str, int]:
    """{node: processes it starts} as the plan will count them (:func:`nproc_for`), for
    preflight to compare with the node's GPUs or MLUs before anything starts."""
    _, env_sets = split_sets(job, overrides or {})
    return {n.name: nproc_for(job, n.slots, {**n.env, **env_sets}, f"node {n.name}")
            for n in inventory.nodes}


def job_device(job: Job) -> tuple[str | None, str | None]:
    """(the accelerator kind the job's ranks compute on, the toolkit version its target's
    image is built against): (None, None) for a CPU job or one without a target."""
    target = targets.get_target(job.target) if job.target else None
    if target is None or target.device in (None, "cpu"):
        return None, None
    return target.device, target.pins.get("cuda")


def job_environment(job: Job, target, values: Mapping[str, str], node_env: Mapping[str, str],
                    env_sets: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Layer 1 (launch values and the contract's extras; the interface is added by
    :func:`_node_plan`) and layers 2-5 over it (target env, job env with placeholders
    filled from ``values``, the node's inventory env, ``--set``), see the module docstring.
    Shared with :mod:`clusterctl.run.export`, which fills placeholders with its own values."""
    launch = {k: expand(v, values) for k, v in {**BASE_ENV, **CONTRACTS[job.contract]}.items()}
    target_env = dict(target.env) if target else {}
    job_env = {k: expand(v, values) for k, v in job.env.items()}
    return launch, {**target_env, **job_env, **node_env, **env_sets}


def _node_plan(launch: _Launch, n: _Node, iface: str | None, hosts: list[str],
               flight_recorder: bool = True, init: bool = False,
               code: CodeMount | None = None, attempt: Attempt = Attempt()) -> NodePlan:
    """Assemble one node's plan from its checked inputs, the interface it uses, the
    cluster's ``--add-host`` options and the flight recorder (target layer, before the
    job's env, so a job, node or ``--set`` may change or turn it off)."""
    job, node = launch.job, n.node
    nic = {name: iface for name in INTERFACE_ENV} if iface else {}
    recorder = launch.target.flight_recorder if launch.target is not None and flight_recorder else None
    flight, options, fr_env = None, [*(["--init"] if init else []), *n.options], {}
    if recorder is not None:
        flight = flight_dir(launch.run_id, node.name)
        options += ["-v", f"{flight}:{recorder.dir}"]
        fr_env = recorder.environment()
    code_env = {}
    if code is not None:
        options += ["-v", f"{code.paths[node.name]}:{CODE_MOUNT}:ro", "-w", CODE_MOUNT]
        code_env = {"CLUSTERCTL_CODE_DIGEST": code.digest}
    if attempt.checkpoint:
        options += ["-v", f"{attempt.checkpoint}:{attempt.checkpoint}"]
    resume_env = recovery.environment(launch.run_id, attempt.number, attempt.excluded, attempt.checkpoint)
    env = {**n.launch_env, **nic, **fr_env, **n.upper_env, **code_env, **resume_env}
    name = container_name(launch.run_id, node.name, attempt.number)
    labels = run_labels(launch.run_id, job.name, node.name, str(n.rank), attempt.number)
    command = job.check_filled_command([expand(a, n.values) for a in job.command])
    if job.contract == "mpi":       # the container starts the node's processes as mpirun would
        command = mpi.spawn_command(n.first_rank, n.nproc, command)
    argv = docker_run_argv(name=name, labels=labels, options=[*hosts, *options], env=env,
                           secrets=n.secrets, image=launch.image, command=command,
                           runtime=node_runtime(node))
    return NodePlan(node=node.name, host=node.host, rank=n.rank, env=env, argv=argv,
                    container=name, run_id=launch.run_id, job=job.name, image=launch.image,
                    nproc=n.nproc, labels=labels, secrets=n.secrets, stdin=n.stdin,
                    devices=node_devices(job, node), options=options, command=command,
                    hosts=list(hosts), hidden=n.hidden, flight_dir=flight)


def run_labels(run_id: str, job: str, node: str, rank: str, attempt: int = 0) -> dict[str, str]:
    """The labels every run container carries (what ``stop``/``status`` find it by)."""
    return {RUN_LABEL: run_id, JOB_LABEL: job, NODE_LABEL: node, RANK_LABEL: rank,
            ATTEMPT_LABEL: str(attempt)}


def docker_run_argv(*, name: str, labels: Mapping[str, str], options: Sequence[str],
                    env: Mapping[str, str], secrets: Iterable[str], image: str,
                    command: Sequence[str], secrets_by_name: bool = False,
                    detach: bool = True, runtime: ContainerRuntime | None = None) -> list[str]:
    """The ``docker run`` argv of one run container (see the module docstring for the order),
    in ``runtime``'s words (default: the default runtime's, :mod:`clusterctl.cluster.runtime`).

    Secret values never enter it: they come from ``--env-file /dev/stdin``, or with
    ``secrets_by_name`` as ``-e NAME`` (docker takes the value from its own
    environment, as a batch scheduler passes it).  ``detach=False`` leaves out ``-d``.
    """
    secrets = set(secrets)
    return (runtime or runtime_for()).run(
        image, command, name=name, detach=detach, network="host", labels=labels, options=options,
        env=[(k, v) for k, v in env.items() if k not in secrets],
        env_names=[k for k in env if k in secrets] if secrets and secrets_by_name else (),
        env_file=ENV_FILE_STDIN if secrets and not secrets_by_name else None)


def _check_image(job: Job, image: str | None, what: str = "image") -> None:
    """The image must be a plain reference (:func:`clusterctl.core.imageref.check_image`):
    docker would read ``-x`` as an option, a node would log a credential."""
    if image is None:
        raise UserError(f"{job.path}: job {job.name} has no image: give `image` or `target` in "
                        "the job, or --image.")
    check_image(image, what)


def _docker_options(job: Job, target, node: Node, values: dict[str, str],
                    extra: Sequence[str]) -> list[str]:
    """Target flags, job docker_args, mounts, devices and extra args; exact repeats dropped."""
    out: list[str] = []
    if target:
        out += target.run.flags
    for i, arg in enumerate(job.docker_args):
        arg = expand(arg, values)
        if reserved_flag(arg):
            raise UserError(f"{job.where(f'docker_args.{i}')}: expands to {shown(arg)}; "
                            f"`{reserved_flag(arg)}` is set by clusterctl itself.")
        out.append(arg)
    for i, mount in enumerate(job.mounts):
        spec = expand(mount, values)
        problem = mount_problem(spec)
        if problem:
            raise UserError(f"{job.where(f'mounts.{i}')}: {problem} (after filling placeholders "
                            f"from {shown(mount)}); set the parameter with --set NAME=/absolute/path.")
        out += ["-v", spec]
    out += [f"--device={d}" for d in node_devices(job, node)]
    out += list(extra)
    return _drop_repeats(_gpus_for_runtime(out, node))


def _gpus_for_runtime(options: list[str], node: Node) -> list[str]:
    """``--gpus`` said the way the node's runtime takes GPUs (docker's flag, or CDI names on a
    runtime that takes only those: :meth:`ContainerRuntime.gpu_options`), the CDI kind from
    the accelerator table (the device whose docker flag is ``--gpus``)."""
    runtime = node_runtime(node)
    if runtime.gpu_style == "flag":
        return options
    kind = next((d.cdi_kind for d in accelerators.load().devices.values()
                 if d.docker_flag == "--gpus" and d.cdi_kind), None)
    if kind is None:
        return options
    try:
        return runtime.gpu_options(options, kind)
    except ValueError as e:
        raise UserError(f"node {node.name} ({runtime.name}): {e}") from None


def _drop_repeats(args: list[str]) -> list[str]:
    """Drop a one-token ``--flag=value`` already present (``--net=host`` from the target, a
    device both the target and the inventory list); other arguments are kept as given."""
    seen = {"--net=host"}
    out = []
    for a in args:
        if a.startswith("--") and "=" in a:
            if a in seen or (a.startswith("--network=host") and "--net=host" in seen):
                continue
            seen.add(a)
        out.append(a)
    return out


def _secret_names(job: Job, env: Mapping[str, str], upper: dict[str, str],
                  host_env: Mapping[str, str]) -> set[str]:
    """Secret names of the node's env; listed secrets missing from every layer are added to
    ``upper`` from ``host_env`` (clusterctl's own environment), or UserError."""
    for name in job.secrets:
        if name in env or name in upper:
            continue
        if name not in host_env:
            raise UserError(f"{job.where('secrets')}: secret {name} is set by no layer and not "
                            f"in clusterctl's environment: export {name}=... before launching "
                            f"(or --set {name}=...).")
        upper[name] = host_env[name]
    both = {**env, **upper}
    # by name, or by value: a URL or registry reference holding a password or token
    # (PIP_INDEX_URL=https://user:pw@host/...) is a secret whatever its variable is called
    return {k for k, v in both.items() if is_secret_name(k, job.secrets) or without_credentials(v) != v}


def _env_file(job: Job, secrets: dict[str, str]) -> bytes:
    """The ``NAME=value`` lines docker reads from --env-file (values literal to end of line)."""
    for name, value in secrets.items():
        if "\n" in value or "\r" in value or "\0" in value:
            raise UserError(f"secret {name} of job {job.name} contains a line break or NUL; "
                            "an env file carries one NAME=value per line, so it cannot pass it.")
    return "".join(f"{k}={v}\n" for k, v in secrets.items()).encode("utf-8")


# --------------------------------------------------------------------------- showing

def mask_env(env: Mapping[str, str], secrets: Iterable[str] = ()) -> dict[str, str]:
    """A copy of ``env`` with secret values (listed or by name) replaced by ``****``."""
    listed = set(secrets)
    return {k: MASK if is_secret_name(k, listed) else v for k, v in env.items()}


def maskable(value: str) -> bool:
    """Whether a secret value may be searched for and replaced in text (:func:`mask_text`,
    log lines): not when it is shorter than :data:`MASK_MIN_CHARS` (a boolean, a PIN, a
    rank), a number or a port, or an IP address: replacing those would rewrite every ``0``,
    ``false`` or address of the output and taint every variable that holds one
    (MASTER_PORT).  Such a secret still travels only through the env file; launch warns
    (:func:`unmasked_secrets`)."""
    text = value.strip()
    if len(text) < MASK_MIN_CHARS:
        return False
    try:
        float(text)
        return False
    except ValueError:
        pass
    try:
        ipaddress.ip_address(text)
        return False
    except ValueError:
        return True


def mask_text(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of the given secret values replaced by ``****``
    (only the :func:`maskable` ones: a short or common value is left alone)."""
    for value in sorted({v for v in values if v and maskable(v)}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


#: clusterctl's own flags whose NAME=VALUE items :func:`mask_argv` masks by name.
_VALUE_FLAGS = ("--set", "--env")


def mask_argv(argv: Sequence[str], names: Iterable[str], values: Iterable[str]) -> list[str]:
    """clusterctl's own command line as run.json keeps it: a ``--set``/``--env NAME=VALUE``
    whose NAME is secret (``names``, or named like one) gets ``****`` for its whole value,
    whatever its length; every other item gets :func:`mask_text` with ``values``."""
    names = set(names)
    out: list[str] = []
    for i, arg in enumerate(argv):
        flag, eq, item = arg.partition("=") if arg.startswith(_VALUE_FLAGS) and "=" in arg else ("", "", arg)
        after_flag = i > 0 and argv[i - 1] in _VALUE_FLAGS
        if (flag in _VALUE_FLAGS or after_flag) and "=" in item:
            name, _, _ = item.partition("=")
            if is_secret_name(name, names):
                out.append(f"{flag}{eq}{name}={MASK}")
                continue
        out.append(mask_text(arg, values))
    return out


def secret_values(plans: Iterable[NodePlan]) -> list[str]:
    """Every secret value of the plans that may be masked (:func:`maskable`), for masking
    other text (log lines, clusterctl's own command line with ``--set TOKEN=...`` in
    run.json) with :func:`mask_text`."""
    return sorted(v for v in {p.env[k] for p in plans for k in p.secrets if p.env.get(k)}
                  | {v for p in plans for v in p.hidden if v} if maskable(v))


def unmasked_secrets(plans: Iterable[NodePlan]) -> list[str]:
    """The secret variables whose value is not :func:`maskable` (too short or common to be
    searched for in output), by name, for launch's warning: never the value."""
    return sorted({k for p in plans for k in p.secrets if p.env.get(k) and not maskable(p.env[k])})


def masked(plan: NodePlan) -> NodePlan:
    """The plan as it may be shown or recorded: secret values masked, no stdin."""
    secret_values = sorted({plan.env[k] for k in plan.secrets if k in plan.env} | set(plan.hidden))
    return replace(plan, env=mask_env(plan.env, plan.secrets),
                   argv=[mask_text(a, secret_values) for a in plan.argv],
                   options=[mask_text(a, secret_values) for a in plan.options],
                   command=[mask_text(a, secret_values) for a in plan.command], stdin=None)


def plan_record(plan: NodePlan) -> dict:
    """JSON-able dict of a (masked) plan, for dry-run JSON and run.json."""
    m = masked(plan)
    return {"node": m.node, "host": m.host, "rank": m.rank, "container": m.container,
            "image": m.image, "nproc": m.nproc, "env": m.env, "secrets": sorted(m.secrets),
            "argv": m.argv}


def render_dry_run(plans: Sequence[NodePlan], json: bool = False) -> str:
    """What ``launch --dry-run`` prints: per node the exact command (secrets masked), or JSON."""
    if json:
        return jsonlib.dumps([plan_record(p) for p in plans], indent=2)
    blocks = []
    for p in plans:
        m = masked(p)
        head = f"# {m.node} (host {m.host}, rank {m.rank}, {m.nproc} process{'es' if m.nproc != 1 else ''})"
        lines = [head]
        if m.secrets:
            shown = ", ".join(f"{k}={MASK}" for k in sorted(m.secrets))
            lines.append(f"# secrets via {ENV_FILE_STDIN} (stdin): {shown}")
        lines.append(shlex.join(m.argv))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


__all__ = [
    "CODE_ENV", "MASK", "CodeMount", "NodePlan", "check_inputs", "container_name", "docker_run_argv", "host_entries",
    "job_devices", "job_environment", "make_plan", "mask_env", "mask_text", "masked", "node_devices",
    "job_device", "node_processes", "nproc_for", "parse_sets", "plan_record", "render_dry_run", "run_labels", "secret_params",
    "secret_values", "split_sets",
]
