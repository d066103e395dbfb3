"""The launch plan: exactly what runs on each node, as data, before anything runs.

:func:`make_plan` combines a job (:mod:`clusterctl.jobs`), an inventory, the
interfaces preflight found and the user's ``--set`` values into one
:class:`NodePlan` per node: the container environment and the full
``docker run`` argv.  It is pure logic (no SSH, no Docker), so ``clusterctl
launch --dry-run`` prints it (:func:`render_dry_run`) and tests check it without
nodes; the execution side (:mod:`clusterctl.launch`) runs ``plan.argv`` on
``plan.node`` over SSH and feeds ``plan.stdin`` to it.

Environment precedence (later wins)
-----------------------------------
1. launch values: ``MASTER_ADDR MASTER_PORT NODE_RANK NNODES NPROC_PER_NODE``,
   ``PET_NNODES PET_NODE_RANK PET_NPROC_PER_NODE PET_MASTER_ADDR PET_MASTER_PORT``,
   the job contract's extras (``accl-bert``: ``RANK`` = node rank,
   ``WORLD_SIZE`` = number of nodes), and ``GLOO_SOCKET_IFNAME`` /
   ``NCCL_SOCKET_IFNAME`` = the node's interface (inventory ``interface``,
   else what preflight found);
2. the target's default ``env`` (src/clusterctl/build/data/targets.yaml);
3. the job's ``env`` (placeholders filled);
4. the inventory's ``env`` (``defaults:`` merged with the node's own);
5. ``--set NAME=VALUE``, exactly as typed (never expanded).

``MASTER_ADDR`` is the master node's inventory host as the other nodes reach
it: an ``~/.ssh/config`` alias is resolved to its ``HostName``.  A
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
io.clusterctl.rank=..`` + target flags + job ``docker_args`` + ``-v`` per job
mount + ``--device=`` per target/inventory device + ``extra_docker_args`` +
``-e NAME=VALUE`` per non-secret variable + (``--env-file /dev/stdin`` when
there are secrets) + IMAGE + command.  No ``--rm``: the container stays after
it exits so its exit status and logs can be read; the launcher removes it.

Secrets
-------
A variable is secret when the job lists it under ``secrets`` or its name
contains TOKEN, SECRET, PASSWORD or KEY.  A secret's value never appears in
``argv``: the argv carries ``--env-file /dev/stdin`` and :attr:`NodePlan.stdin`
holds the env-file text (``NAME=value`` lines) that the launcher writes to the
``docker run`` process's stdin over the SSH channel
(``conn.run(plan.argv, stdin=plan.stdin)``), so the value is in no command line,
no process listing and no log.  (``docker inspect`` on the node still shows a
container's env; that is the node's own trust boundary.)  Env-file values are
taken literally to the end of the line, so a secret may not contain a newline.
:func:`masked` / :func:`mask_env` give the copy to show or record: secret values
replaced by ``****``.
"""

from __future__ import annotations

import json as jsonlib
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from clusterctl.build import targets
from clusterctl.core.errors import UserError
from clusterctl.run.jobs import (
    BASE_ENV,
    CONTRACTS,
    Job,
    expand,
    is_secret_name,
    mount_problem,
    reserved_flag,
)

MASK = "****"
#: The env file on ``docker run``'s stdin that carries secret values.
ENV_FILE_STDIN = "/dev/stdin"
LABEL_PREFIX = "io.clusterctl."
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
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

    @property
    def command_line(self) -> str:
        """The argv as one shell-safe line (it holds no secret value)."""
        return shlex.join(self.argv)


# --------------------------------------------------------------------------- inputs

def parse_sets(items: Iterable[str]) -> dict[str, str]:
    """``--set NAME=VALUE`` options -> {NAME: VALUE}; the value is kept exactly as typed.

    UserError (exit 2) for an item without ``=`` or with an invalid name.
    """
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--set {item!r}: expected NAME=VALUE (e.g. --set PHASE=2); "
                            "the value may be empty (NAME=) and may contain anything.")
        if not _NAME.match(name):
            raise UserError(f"--set {item!r}: {name!r} is not a valid variable name; valid: "
                            "letters, digits and _, not starting with a digit (e.g. BATCH_SIZE).")
        out[name] = value
    return out


def resolve_host(host: str, ssh_config: str | os.PathLike | None = None) -> str:
    """The address other nodes use for ``host``: its ssh-config ``HostName``, else itself.

    Reads ~/.ssh/config, or ``ssh_config`` (like ``ssh -F``), through Fabric:
    the same loading :class:`clusterctl.transport.Cluster` connects with.
    """
    from fabric import Config

    try:
        config = (Config(runtime_ssh_path=str(Path(ssh_config).expanduser()))
                  if ssh_config else Config())
        found = config.base_ssh_config.lookup(host).get("hostname")
    except Exception:  # an unreadable ssh config leaves the host as written
        return host
    return found or host


def container_name(run_id: str, node: str) -> str:
    """``<run_id>-<node>`` with characters docker refuses in names replaced by ``-``."""
    return _CONTAINER_UNSAFE.sub("-", f"{run_id}-{node}")


# --------------------------------------------------------------------------- planning

@dataclass(frozen=True)
class _Launch:
    """What is the same for every node of one plan."""

    job: Job
    target: object | None          # clusterctl.targets.Target
    image: str
    run_id: str
    extra_docker_args: tuple[str, ...]
    host_env: Mapping[str, str]


def make_plan(job: Job, inventory, *, run_id: str, image: str | None = None,
              interfaces: Mapping[str, str] | None = None,
              overrides: Mapping[str, str] | None = None,
              extra_docker_args: Sequence[str] = (),
              host_env: Mapping[str, str] | None = None,
              ssh_config: str | os.PathLike | None = None) -> list[NodePlan]:
    """One NodePlan per inventory node, in rank order.  Pure: nothing is contacted.

    ``image`` replaces the job's/target's image; ``interfaces`` maps node name
    to the NIC preflight found; ``overrides`` are the ``--set`` values
    (:func:`parse_sets`); ``host_env`` (default ``os.environ``) supplies listed
    secrets no layer sets; ``ssh_config`` replaces ~/.ssh/config when resolving
    the master's address (pass what the Cluster uses).  UserError (exit 2) on
    anything unusable.
    """
    overrides = dict(overrides or {})
    params = {**job.params, **{k: v for k, v in overrides.items() if k in job.params}}
    env_sets = {k: v for k, v in overrides.items() if k not in job.params}
    target = targets.get_target(job.target) if job.target else None
    image = image or job.image or (targets.resolve(job.target).tag if job.target else None)
    _check_image(job, image)
    for arg in extra_docker_args:
        if reserved_flag(arg):
            raise UserError(f"docker argument {arg!r}: `{reserved_flag(arg)}` is set by clusterctl "
                            "itself and may not be given.")
    launch = _Launch(job, target, image, run_id, tuple(extra_docker_args),
                     os.environ if host_env is None else host_env)

    nodes = list(inventory.nodes)
    uppers = [{**node.env, **env_sets} for node in nodes]    # layers 4 and 5, per node
    nprocs = [_nproc(job, node, upper) for node, upper in zip(nodes, uppers, strict=True)]
    shared = {
        "nnodes": str(len(nodes)),
        "world_size": str(sum(nprocs)),
        "run_id": run_id,
        "backend": (target.backend or "") if target else "",
        "master_addr": resolve_host(inventory.master.host, ssh_config),
        "master_port": str(inventory.master_port),
    }
    plans = []
    for rank, (node, nproc, upper) in enumerate(zip(nodes, nprocs, uppers, strict=True)):
        values = {**shared, "node_rank": str(rank), "nproc_per_node": str(nproc),
                  "node_name": node.name, **params}
        values["master_addr"] = upper.get("MASTER_ADDR", values["master_addr"])
        values["master_port"] = upper.get("MASTER_PORT", values["master_port"])
        iface = node.interface or (interfaces or {}).get(node.name)
        env = _environment(job, target, node, values, iface, env_sets)
        plans.append(_node_plan(launch, node, rank, nproc, env, values))
    return plans


def _nproc(job: Job, node, upper: Mapping[str, str]) -> int:
    """Processes on ``node``: NPROC_PER_NODE from inventory env / --set, else the job's value."""
    given = upper.get("NPROC_PER_NODE")
    if given is not None:
        if not given.isdigit() or int(given) < 1:
            raise UserError(f"NPROC_PER_NODE={given!r} for node {node.name} (inventory env or --set) "
                            "is not a positive whole number; valid: e.g. NPROC_PER_NODE=4.")
        return int(given)
    return node.slots if job.nproc_per_node == "slots" else int(job.nproc_per_node)


def _environment(job: Job, target, node, values: dict[str, str], iface: str | None,
                 env_sets: Mapping[str, str]) -> dict[str, str]:
    """The layered container env (see the module docstring for the order)."""
    launch = {k: expand(v, values) for k, v in {**BASE_ENV, **CONTRACTS[job.contract]}.items()}
    if iface:
        launch.update(GLOO_SOCKET_IFNAME=iface, NCCL_SOCKET_IFNAME=iface)
    target_env = dict(target.env) if target else {}
    job_env = {k: expand(v, values) for k, v in job.env.items()}
    return {**launch, **target_env, **job_env, **node.env, **env_sets}


def _node_plan(launch: _Launch, node, rank: int, nproc: int, env: dict[str, str],
               values: dict[str, str]) -> NodePlan:
    job = launch.job
    secrets = _secret_names(job, env, launch.host_env)
    name = container_name(launch.run_id, node.name)
    labels = {f"{LABEL_PREFIX}run": launch.run_id, f"{LABEL_PREFIX}job": job.name,
              f"{LABEL_PREFIX}node": node.name, f"{LABEL_PREFIX}rank": str(rank)}
    argv = ["docker", "run", "-d", "--net=host", "--name", name]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    argv += _docker_options(job, launch.target, node, values, launch.extra_docker_args)
    for key, value in env.items():
        if key not in secrets:
            argv += ["-e", f"{key}={value}"]
    stdin = None
    if secrets:
        argv += ["--env-file", ENV_FILE_STDIN]
        stdin = _env_file(job, {k: env[k] for k in env if k in secrets})
    argv += [launch.image, *(expand(a, values) for a in job.command)]
    return NodePlan(node=node.name, host=node.host, rank=rank, env=env, argv=argv,
                    container=name, run_id=launch.run_id, job=job.name, image=launch.image,
                    nproc=nproc, labels=labels, secrets=frozenset(secrets), stdin=stdin)


def _check_image(job: Job, image: str | None) -> None:
    """The image must be a plain reference: docker would read ``-x`` as an option."""
    if not image:
        raise UserError(f"{job.path}: job {job.name} has no image: give `image` or `target` in "
                        "the job, or --image.")
    if image.startswith("-") or any(c.isspace() for c in image):
        raise UserError(f"image {image!r} is not an image reference (it starts with '-' or "
                        "contains whitespace); valid: e.g. clusterctl/cpu:2.13.0.")


def _docker_options(job: Job, target, node, values: dict[str, str],
                    extra: Sequence[str]) -> list[str]:
    """Target flags, job docker_args, mounts, devices and extra args; exact repeats dropped."""
    out: list[str] = []
    if target:
        out += target.run.flags
    for i, arg in enumerate(job.docker_args):
        arg = expand(arg, values)
        if reserved_flag(arg):
            raise UserError(f"{job.where(f'docker_args.{i}')}: expands to {arg!r}; "
                            f"`{reserved_flag(arg)}` is set by clusterctl itself.")
        out.append(arg)
    for i, mount in enumerate(job.mounts):
        spec = expand(mount, values)
        problem = mount_problem(spec)
        if problem:
            raise UserError(f"{job.where(f'mounts.{i}')}: {problem} (after filling placeholders "
                            f"from {mount!r}); set the parameter with --set NAME=/absolute/path.")
        out += ["-v", spec]
    devices = (target.run.devices_for(node.slots) if target else []) + list(node.devices)
    out += [f"--device={d}" for d in devices]
    out += list(extra)
    return _drop_repeats(out)


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


def _secret_names(job: Job, env: dict[str, str], host_env: Mapping[str, str]) -> set[str]:
    """Secret names in ``env``; listed secrets missing from every layer come from ``host_env``."""
    for name in job.secrets:
        if name in env:
            continue
        if name not in host_env:
            raise UserError(f"{job.where('secrets')}: secret {name} is set by no layer and not "
                            f"in clusterctl's environment: export {name}=... before launching "
                            f"(or --set {name}=...).")
        env[name] = host_env[name]
    return {k for k in env if is_secret_name(k, job.secrets)}


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


def mask_text(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of the given secret values replaced by ``****``."""
    for value in sorted({v for v in values if v}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def secret_values(plans: Iterable[NodePlan]) -> list[str]:
    """Every secret value of the plans, for masking other text (log lines, clusterctl's own
    command line with ``--set TOKEN=...`` in run.json) with :func:`mask_text`."""
    return sorted({p.env[k] for p in plans for k in p.secrets if p.env.get(k)})


def masked(plan: NodePlan) -> NodePlan:
    """The plan as it may be shown or recorded: secret values masked, no stdin."""
    secret_values = [plan.env[k] for k in plan.secrets if k in plan.env]
    return replace(plan, env=mask_env(plan.env, plan.secrets),
                   argv=[mask_text(a, secret_values) for a in plan.argv], stdin=None)


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
    "MASK", "NodePlan", "container_name", "make_plan", "mask_env", "mask_text", "masked",
    "parse_sets", "plan_record", "render_dry_run", "resolve_host", "secret_values",
]
