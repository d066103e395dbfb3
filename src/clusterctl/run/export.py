"""Kubernetes manifests of a job: a Kubeflow PyTorchJob or a Kubeflow Trainer TrainJob.

:func:`build_manifest` is pure: the job (:mod:`clusterctl.run.jobs`), its target's
facts (:mod:`clusterctl.image.targets`) and the options in, a :class:`Manifest` (the
object as a dict, plus notes on what Kubernetes cannot say) out; :meth:`Manifest.text`
is the YAML ``clusterctl export`` writes.  Nothing is contacted and no API server is
needed.

What an SSH launch gives a container, and where it goes here
------------------------------------------------------------
* image, command: ``args`` of the container, so the image's ENTRYPOINT (clusterctl's
  entrypoint.sh) still runs first, as with ``docker run IMAGE COMMAND``.  A TrainJob also
  sets ``command``, because its runtime's container has one of its own (Trainer's
  ``torch-distributed`` runs a ``/bin/bash -c`` script that would ignore the args): the
  image's entrypoint (:data:`IMAGE_ENTRYPOINT`) for a job with a clusterctl target, else
  the command itself;
* the image: the reference the caller gives (``export --registry``: pinned by digest,
  ``HOST[:PORT]/[NS/]NAME@sha256:...``); a pull Secret (``pull_secret``) becomes
  ``imagePullSecrets`` of the pod spec (PyTorchJob) or of a runtime patch of the runtime's
  ``node`` pods (TrainJob: its own spec has no such field; Trainer 2.3's pod patch has);
* the environment: the same layers as :mod:`clusterctl.run.plan` (target env, job env,
  ``--set``; :func:`clusterctl.run.plan.job_environment`).  The rank variables
  (``MASTER_ADDR MASTER_PORT RANK WORLD_SIZE NODE_RANK PET_*``) are left to the operator
  (:data:`OPERATOR_ENV` says which it sets); a TrainJob's command is wrapped in
  ``/bin/sh -c 'export RANK="$PET_NODE_RANK" ...; exec "$@"'`` (:func:`wrap_args`),
  because Trainer's torch runtime sets ``PET_*`` only and the job's contract may read
  ``MASTER_ADDR``, ``NODE_RANK``, ``RANK``, ``WORLD_SIZE``; ``NNODES`` and ``NPROC_PER_NODE``, the same
  on every node, are written.  ``{master_addr}``, ``{master_port}``, ``{node_rank}``,
  ``{node_name}`` in the command become Kubernetes ``$(VAR)`` references to the
  operator's variables.  An env value holding one (``CROSS_RANK`` of the deepspeed
  contract, accelerate's config) cannot be an env entry (Kubernetes expands ``$(VAR)`` in
  env only from variables listed BEFORE it, and the operators add theirs after): the
  command runs through the ``/bin/sh`` wrapper (:func:`wrap_args`), which exports it with
  the operator's variable in place (``CROSS_RANK="$PET_NODE_RANK"``; the rest of the
  value single-quoted, so nothing else is expanded).  Literal ``$`` is escaped (``$$``)
  so text reaches the container exactly as written;
* secrets (the job's ``secrets``, names like one (:func:`~clusterctl.core.secretnames.is_secret_name`), and variables
  holding a secret parameter's value): ``secretKeyRef`` to the Secret ``<job>-secrets``
  (``secret_name`` / ``--secret-name``), key = the variable name, never a value; a value
  given in the job, the target or ``--set`` is left out (:attr:`Manifest.secret_keys`,
  :meth:`Manifest.secret_command` say which Secret to create, the value elided);
* contract mpi (hydra's variables, :mod:`clusterctl.run.mpi`): the wrapper starts the
  node's processes through the same spawner as an SSH launch, first rank
  ``PET_NODE_RANK x nproc``; a PyTorchJob's ``RANK``/``WORLD_SIZE`` (the operator's,
  node-level) are unset first, as an SSH launch does not set them;
* ``docker run`` flags of the target and the job (:func:`pod_settings`): ``--net=host``
  -> ``hostNetwork`` + ``dnsPolicy: ClusterFirstWithHostNet``; ``--shm-size`` and
  ``--ipc=host`` -> a memory-backed emptyDir at /dev/shm (with that ``sizeLimit``);
  ``--gpus`` -> ``nvidia.com/gpu`` = slots (an accelerator's ``docker_flag`` ->
  its ``kubernetes_resource``, core/data/accelerators.yaml); ``--ulimit memlock=-1`` -> capability
  IPC_LOCK (Kubernetes sets no ulimits; with IPC_LOCK the memlock limit does not bind);
  ``--cap-add`` -> capabilities; ``--device`` -> a device plugin's resource
  (:func:`device_resources`) or a refusal; ``-w``/``--workdir`` -> the container's
  ``workingDir`` (PyTorchJob); a TrainJob has no field for it (Trainer 2.3's container
  patch takes env, securityContext, volumeMounts only): the wrapper ``cd``s there first
  and fails if it cannot;
* mounts -> ``hostPath`` volumes.

Recovery (the job's ``max_restarts``, ``retry_on_exit``, ``fatal_on_exit``, ``checkpoint``;
an SSH launch: :mod:`clusterctl.run.recovery`), see :func:`recovery_settings`:

* PyTorchJob: ``max_restarts`` N > 0 -> ``restartPolicy: OnFailure`` for every replica and
  ``runPolicy.backoffLimit: N``; a job that lists ``retry_on_exit``/``fatal_on_exit`` gets
  ``restartPolicy: ExitCode``, whose classes are the operator's, not the job's (see
  :data:`KUBEFLOW_RETRYABLE`); what does not map is said in the notes.  Nothing set:
  ``Never`` and ``backoffLimit: 0``, the run ends at its first failure, as before;
* TrainJob: restarts belong to the runtime (JobSet ``failurePolicy.maxRestarts`` in the
  ClusterTrainingRuntime); a TrainJob has no field for them (nor a runtime patch), so the
  notes name the runtime's fields to set and nothing else is written;
* the resume contract (:data:`clusterctl.run.recovery.RESUME_ENV`): ``CLUSTERCTL_RUN_ID``
  is the object's name (the same in every pod and restart); ``CLUSTERCTL_ATTEMPT`` only in a
  TrainJob, from the JobSet restart count every pod carries (the annotation
  :data:`JOBSET_RESTART_ANNOTATION`, downward API): a PyTorchJob's pods are not told how
  often they were restarted, so it is left out there; ``CLUSTERCTL_EXCLUDED_NODES`` is left
  out (the scheduler picks the nodes); ``checkpoint`` -> a ``hostPath`` volume mounted at
  the same path, as mounts are, and ``CLUSTERCTL_CHECKPOINT_DIR``.
"""

from __future__ import annotations

import copy
import re
import shlex
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import yaml

from clusterctl.cluster.containers import JOB_LABEL
from clusterctl.cluster.inventory.model import MAX_SLOTS
from clusterctl.cluster.registry.reference import digest_of
from clusterctl.core import accelerators
from clusterctl.core.errors import UserError, did_you_mean, one_of
from clusterctl.core.imageref import check_image
from clusterctl.core.secretnames import is_secret_name
from clusterctl.core.text import digits, shown, without_credentials
from clusterctl.image import targets
from clusterctl.run import mpi, recovery
from clusterctl.run.jobs import (
    BASE_ENV,
    CONTRACTS,
    Job,
    expand,
    mount_problem,
    placeholders,
)
from clusterctl.run.plan import (
    job_environment,
    nproc_for,
    secret_params,
    secret_placeholder_use,
    split_sets,
)

KINDS: tuple[str, ...] = ("pytorchjob", "trainjob")

#: Environment each operator sets in every node's container (not written by clusterctl).
OPERATOR_ENV: dict[str, tuple[str, ...]] = {
    # training-operator v1 (pkg/controller.v1/pytorch/envvar.go): WORLD_SIZE = replicas x nprocPerNode
    "pytorchjob": ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "PET_NNODES",
                   "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PYTHONUNBUFFERED"),
    # Trainer v2 torch plugin: the torchrun variables only
    "trainjob": ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                 "PET_MASTER_PORT"),
}

#: Rank variables never written: the operator owns them (or, where it does not set one,
#: a program takes it from PET_*).
RANK_VARIABLES: frozenset[str] = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "NODE_RANK"}
    | {k for k in BASE_ENV if k.startswith("PET_")})

#: Placeholders that differ per pod, as ``$(VAR)`` references for each kind.
RANK_REFS: dict[str, dict[str, str]] = {
    "pytorchjob": {"master_addr": "$(MASTER_ADDR)", "master_port": "$(MASTER_PORT)",
                   "node_rank": "$(PET_NODE_RANK)", "node_name": "$(CLUSTERCTL_POD_NAME)"},
    "trainjob": {"master_addr": "$(PET_MASTER_ADDR)", "master_port": "$(PET_MASTER_PORT)",
                 "node_rank": "$(PET_NODE_RANK)", "node_name": "$(CLUSTERCTL_POD_NAME)"},
}
POD_NAME_VAR = "CLUSTERCTL_POD_NAME"

#: The PET_* variable each launch placeholder is derived from in a pod (what both operators
#: set, from Trainer's torch plugin: pkg/runtime/framework/plugins/torch/torch.go).
PET_SOURCES: dict[str, str] = {
    "{master_addr}": "PET_MASTER_ADDR", "{master_port}": "PET_MASTER_PORT",
    "{node_rank}": "PET_NODE_RANK", "{nnodes}": "PET_NNODES",
    "{nproc_per_node}": "PET_NPROC_PER_NODE",
}
#: ``$0`` of the contract wrapper (shows in ``ps`` and in the shell's own messages).
CONTRACT_WRAPPER = "clusterctl-contract"

#: The exit codes the training operator retries under ``restartPolicy: ExitCode``
#: (kubeflow/trainer v1 ``pkg/util/train/train_util.go`` IsRetryableExitCode: SIGINT, SIGKILL,
#: SIGUSR1 (the code Kubeflow reserves for "retry me"), SIGTERM); every other non-zero code
#: fails the job at once.  Kubeflow's docs say "1-127 permanent, 128-255 retryable"; the code
#: is narrower (128 and 139, SIGSEGV, are permanent too; kubeflow/website#443).
KUBEFLOW_RETRYABLE: tuple[int, ...] = (130, 137, 138, 143)
#: The JobSet restart count on every pod of a TrainJob (JobSet's RestartsKey, a label and
#: an annotation), 0 before the first restart.
JOBSET_RESTART_ANNOTATION = "jobset.sigs.k8s.io/restart-attempt"
CHECKPOINT_VOLUME = "checkpoint"


def derived_variables(contract: str, kind: str) -> dict[str, str]:
    """The contract's rank variables the ``kind`` operator does NOT set, each with the PET_*
    variable it is derived from in the pod (TrainJob: ``MASTER_ADDR`` <- ``PET_MASTER_ADDR``,
    ``NODE_RANK`` <- ``PET_NODE_RANK``; accl-bert adds ``RANK`` <- ``PET_NODE_RANK`` and
    ``WORLD_SIZE`` <- ``PET_NNODES``).  Pure."""
    wanted = {**BASE_ENV, **CONTRACTS[contract]}
    return {k: PET_SOURCES[v] for k, v in wanted.items()
            if k in RANK_VARIABLES and k not in OPERATOR_ENV[kind] and v in PET_SOURCES}


def wrap_args(args: Sequence[str], *, exports: Sequence[tuple[str, str]] = (),
              workdir: str | None = None, unset: Sequence[str] = (),
              spawn: int | None = None) -> list[str]:
    """``args`` run through ``/bin/sh -c``, which first ``cd``s to ``workdir`` (exit if it
    cannot), unsets ``unset``, exports each ``(NAME, WORD)`` of ``exports`` (WORD is shell
    text: ``"$PET_NODE_RANK"``, ``'literal'"$VAR"``), then ``exec``s the command unchanged
    (argv, no second shell parse) or, with ``spawn`` = processes per node, the mpi spawner
    (:func:`clusterctl.run.mpi.spawn_command`) with first rank ``PET_NODE_RANK x spawn``.
    ``args`` are as Kubernetes takes them (``$(VAR)`` expanded, ``$$`` a ``$``); what this
    adds is escaped for it.  No wrapper is needed: ``args`` unchanged.  Pure."""
    if not (exports or workdir is not None or unset or spawn):
        return list(args)
    steps, extra = [], []
    if workdir is not None:
        steps += ['cd "$1" || exit', "shift"]
        extra.append(_escape(workdir))
    if spawn:
        steps += ["s=$1", "shift"]
        extra.append(_escape(mpi.SPAWNER))
    if unset:
        steps.append("unset " + " ".join(unset))
    if exports:
        steps.append("export " + " ".join(f"{k}={w}" for k, w in exports))
    steps.append(f'exec {mpi.PYTHON} -c "$s" "$((PET_NODE_RANK * {spawn}))" {spawn} '
                 f'{mpi.SEPARATOR} "$@"' if spawn else 'exec "$@"')
    return ["/bin/sh", "-c", _escape("; ".join(steps)), CONTRACT_WRAPPER, *extra, *args]


def shell_word(template: str, values: Mapping[str, str], shell_refs: Mapping[str, str]) -> str:
    """``template`` as one ``sh`` word: placeholders in ``shell_refs`` as ``"$VAR"``, all
    else (literal text, other placeholders filled from ``values``) single-quoted, so the
    shell expands nothing of it.  Pure."""
    out, text = [], ""
    for literal, name, _spec, _conv in string.Formatter().parse(template):
        text += literal
        if name is None:
            continue
        if name in shell_refs:
            out += [_quote(text)] if text else []
            out.append(f'"${shell_refs[name]}"')
            text = ""
        else:
            text += values[name]
    if text or not out:
        out.append(_quote(text))
    return "".join(out)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


#: The ENTRYPOINT of every image clusterctl builds (templates/blocks/entrypoint.j2): it
#: sets the target's environment up, then ``exec "$@"``.
IMAGE_ENTRYPOINT = "/opt/clusterctl/entrypoint.sh"
#: A Secret's name: a DNS-1123 subdomain (lower-case alphanumerics, '-', '.'), at most 253.
#: The largest value of a Kubernetes int32 field (replicas, numNodes, backoffLimit, ports).
INT32_MAX = 2**31 - 1
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")    # RFC 1123 label: a namespace
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")   # a resource's NAME

DEFAULT_RDMA_RESOURCE = "rdma/hca"
#: Device path prefixes of the RDMA device plugin (k8s-rdma-shared-dev-plugin: its resource
#: name is site config, --rdma-resource; one per pod).  The accelerators' own come from the
#: accelerator table (core/data/accelerators.yaml: device_files, kubernetes_resource).
_RDMA_DEVICES: dict[str, tuple[str | None, int | None]] = {"/dev/infiniband": (None, 1)}


def device_resources() -> dict[str, tuple[str | None, int | None]]:
    """Device path prefixes a device plugin provides, with its resource name (None: the RDMA
    resource given by --rdma-resource) and how many a pod asks for (None: slots)."""
    return {**_RDMA_DEVICES, **{prefix: (d.kubernetes_resource, None)
                                for d in accelerators.load().devices.values()
                                if d.kubernetes_resource for prefix in d.device_files}}


def device_flags() -> dict[str, str]:
    """docker run flags that give a container accelerators (``--gpus``), with the resource a
    pod asks for instead (its value: all = slots, N or count=N)."""
    return {d.docker_flag: d.kubernetes_resource for d in accelerators.load().devices.values()
            if d.docker_flag and d.kubernetes_resource}


#: Containers the operators expect by name.
CONTAINER = {"pytorchjob": "pytorch", "trainjob": "node"}
PYTORCHJOB_PORT = 23456    # the operator's default, named pytorchjob-port
DEFAULT_RUNTIME = "torch-distributed"
_DNS = re.compile(r"[^a-z0-9-]+")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([bkmgtp]?)b?\Z", re.IGNORECASE)
#: docker run flags export understands; the ones taking a value may also be given as two
#: tokens.  The accelerators' flags (:func:`device_flags`, ``--gpus``) go after --shm-size.
_VALUE_FLAGS_BEFORE = ("--net", "--network", "--ipc", "--shm-size")
_VALUE_FLAGS_AFTER = ("--ulimit", "--cap-add", "--device", "-w", "--workdir")


def _value_flags() -> tuple[str, ...]:
    return (*_VALUE_FLAGS_BEFORE, *device_flags(), *_VALUE_FLAGS_AFTER)


@dataclass(frozen=True)
class Manifest:
    """One Kubernetes object (``body``) and what the YAML's header says (``notes``)."""

    kind: str
    name: str
    body: dict
    notes: list[str] = field(default_factory=list)
    secret_name: str | None = None
    #: The Secret's keys the manifest refers to (variable names), in order.
    secret_keys: tuple[str, ...] = ()
    #: Those of them given a value (job, target or ``--set``: where), left out of the manifest.
    secret_given: dict[str, str] = field(default_factory=dict)
    #: The Secret of type docker-registry the pods pull the image with (imagePullSecrets).
    pull_secret: str | None = None
    #: The registry it is for (``HOST[:PORT]``; None: Docker Hub, kubectl's default).
    pull_server: str | None = None

    @property
    def image(self) -> str:
        """The image reference the pods run."""
        spec = self.body["spec"]
        if self.kind == "trainjob":
            return spec["trainer"]["image"]
        return spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["image"]

    def pull_secret_command(self) -> str | None:
        """The ``kubectl create secret docker-registry`` line that makes :attr:`pull_secret`,
        the username and password elided (``...``)."""
        if not self.pull_secret:
            return None
        ns = self.body["metadata"].get("namespace")
        # each value is validated (a Secret name, a namespace, a checked reference's registry);
        # quoted anyway: a copy-paste line never runs what a value holds
        return (f"kubectl create secret docker-registry {shlex.quote(self.pull_secret)}"
                + (f" -n {shlex.quote(ns)}" if ns else "")
                + (f" --docker-server={shlex.quote(self.pull_server)}" if self.pull_server else "")
                + " --docker-username=... --docker-password=...")

    def secret_command(self) -> str | None:
        """The ``kubectl create secret`` line that makes the Secret, each value elided
        (``...``: a placeholder for the user's value, never the value)."""
        if not self.secret_name:
            return None
        ns = self.body["metadata"].get("namespace")
        return (f"kubectl create secret generic {self.secret_name}" + (f" -n {ns}" if ns else "")
                + "".join(f" --from-literal={k}=..." for k in self.secret_keys))

    def text(self) -> str:
        """The YAML file: a comment header with the notes, then the object."""
        head = [f"# {self.body['kind']} of clusterctl job {self.name}, written by `clusterctl export`."]
        head += [f"# {line}" for note in self.notes for line in _wrap(note)]
        return "\n".join(head) + "\n" + yaml.safe_dump(self.body, sort_keys=False, width=100)


@dataclass
class PodSettings:
    """What the ``docker run`` flags of a target and a job become in a pod."""

    host_network: bool = False
    shm_limit: str | None = None       # Kubernetes quantity, e.g. 8Gi
    shm: bool = False                  # /dev/shm as a memory emptyDir
    resources: dict[str, str] = field(default_factory=dict)
    capabilities: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    workdir: str | None = None         # -w / --workdir: the container's workingDir


# --------------------------------------------------------------------------- the builder

def build_manifest(job: Job, *, kind: str, nnodes: int, slots: int = 1, image: str | None = None,
                   overrides: Mapping[str, str] | None = None, namespace: str | None = None,
                   runtime: str = DEFAULT_RUNTIME,
                   rdma_resource: str = DEFAULT_RDMA_RESOURCE,
                   secret_name: str | None = None, pull_secret: str | None = None,
                   registry_server: str | None = None) -> Manifest:
    """The manifest of ``job`` on ``nnodes`` pods of ``slots`` accelerators each.  Pure.

    ``kind``: ``pytorchjob`` or ``trainjob``; ``overrides``: the ``--set`` values
    (:func:`clusterctl.run.plan.parse_sets`); ``runtime``: the ClusterTrainingRuntime a
    TrainJob refers to; ``rdma_resource``: the resource name of the site's RDMA device
    plugin; ``secret_name``: the Secret the secrets are read from (default ``<job>-secrets``);
    ``pull_secret``: a Secret of type docker-registry every pod pulls the image with
    (``imagePullSecrets``; :func:`pull_secret_name` gives the usual one), None: none;
    ``registry_server``: the registry it is for (``HOST[:PORT]``; default: the image's).
    ``image`` is the final reference (pinned by digest where the caller found one:
    :func:`clusterctl.cluster.registry.lookup.pinned_reference`).
    UserError (exit 2) for anything a manifest cannot carry.
    """
    if kind not in KINDS:
        raise UserError(f'--to {shown(kind)}: unknown kind{did_you_mean(kind, KINDS)}; valid: {one_of(KINDS)}.')
    if not 1 <= nnodes <= INT32_MAX:
        raise UserError(f"--nnodes {nnodes}: a job needs at least 1 node and a manifest holds at most "
                        f"{INT32_MAX} (replicas and numNodes are Kubernetes int32 fields); valid: a "
                        f"whole number from 1 to {INT32_MAX}.")
    job.check_node_count(nnodes, "--nnodes")
    if not 1 <= slots <= MAX_SLOTS:
        raise UserError(f"--slots {slots}: valid: accelerators (processes) per node, a whole number "
                        f"from 1 to {MAX_SLOTS}.")
    if namespace is not None and not (len(namespace) <= 63 and _LABEL.match(namespace)):
        raise UserError(f"--namespace {shown(namespace)}: not a Kubernetes namespace; valid: at most 63 "
                        "lower-case letters, digits and '-', starting and ending with a letter or digit "
                        "(e.g. team-a).")
    if not (len(runtime) <= 253 and _SUBDOMAIN.match(runtime)):
        raise UserError(f"--runtime {shown(runtime)}: not a ClusterTrainingRuntime name; valid: at most "
                        "253 lower-case letters, digits, '-' and '.', starting and ending with a letter "
                        f"or digit (e.g. {DEFAULT_RUNTIME}).")
    if not _resource_name(rdma_resource):
        raise UserError(f"--rdma-resource {shown(rdma_resource)}: not a Kubernetes resource name; valid: "
                        "[DOMAIN/]NAME, NAME at most 63 letters, digits, '-', '_' and '.', starting and "
                        f"ending with a letter or digit (e.g. {DEFAULT_RDMA_RESOURCE}).")
    target = targets.get_target(job.target) if job.target else None
    what = "--image" if image else job.where("image")
    image = image or job.image or (targets.resolve(job.target).tag if job.target else None)
    if not image:
        raise UserError(f"{job.path}: job {job.name} has no image: give `image` or `target` in "
                        "the job, or --image REGISTRY/REPO:TAG (the cluster's nodes pull it).")
    check_image(image, what)    # also what the kubectl line names as the registry
    name = _dns_name(job.name)
    if secret_name is not None and not (len(secret_name) <= 253 and _SUBDOMAIN.match(secret_name)):
        raise UserError(f"--secret-name {shown(secret_name)}: not a Kubernetes Secret name; valid: lower-case "
                        "letters, digits, '-' and '.', starting and ending with a letter or digit, "
                        "at most 253 characters (e.g. bert-secrets).")
    secret_name = secret_name or f"{name}-secrets"
    if pull_secret is not None and not (len(pull_secret) <= 253 and _SUBDOMAIN.match(pull_secret)):
        raise UserError(f"--pull-secret {shown(pull_secret)}: not a Kubernetes Secret name; valid: lower-case "
                        "letters, digits, '-' and '.', starting and ending with a letter or digit, "
                        f"at most 253 characters (e.g. {name}-registry).")
    params, env_sets = split_sets(job, overrides or {})
    nproc = nproc_for(job, slots, env_sets, "--set")
    if nproc > MAX_SLOTS:
        raise UserError(f"NPROC_PER_NODE={nproc}: valid: processes per node from 1 to {MAX_SLOTS} "
                        "(nprocPerNode and numProcPerNode are Kubernetes int32 fields).")
    values = {"nnodes": str(nnodes), "nproc_per_node": str(nproc), "world_size": str(nnodes * nproc),
              "run_id": name, "backend": (target.backend or "") if target else "",
              "device": target.device if target else "cpu", **params}
    refs = RANK_REFS[kind]
    _check_templates(job, refs)
    launch, upper = job_environment(job, target, {**values, **dict.fromkeys(refs, "")}, {}, env_sets)
    for key in upper:
        if key in RANK_VARIABLES:
            raise UserError(f"{_origin(job, target, env_sets, key)}: {key} is set by the {kind} operator "
                            f"in each pod; valid: leave it out (the operator sets {', '.join(OPERATOR_ENV[kind])}).")
    secret = _secret_variables(job, params, upper)
    per_pod = _per_pod_env(job, values, upper, env_sets, refs)
    for key in per_pod:
        if key in secret:
            raise UserError(f"{_origin(job, target, env_sets, key)}: {key} is a secret and differs per pod "
                            "(a placeholder such as {node_rank}); its value would be written into the "
                            "pod's command; valid: keep per-pod values and secrets in separate variables.")
    env = _env_list(job, launch, upper, secret, set(per_pod), secret_name)
    secret_keys = tuple(e["name"] for e in env if "secretKeyRef" in e.get("valueFrom", {}))
    given = {k: _origin(job, target, env_sets, k) for k in secret_keys if upper.get(k)}
    args = job.check_filled_command([_fill(a, values, refs) for a in job.command])
    flags = [expand(a, values) for a in (target.run.flags if target else [])]
    flags += [expand(a, values) for a in job.docker_args]
    devices = _target_devices(target, slots)
    pod = pod_settings(flags, devices, slots=slots, rdma_resource=rdma_resource, where=job.name)
    exports = list(per_pod.items())
    if kind == "trainjob":   # Trainer sets PET_* only: the rest of the contract comes from them
        exports = [(k, f'"${v}"') for k, v in derived_variables(job.contract, kind).items()] + exports
    args = wrap_args(args, exports=exports,
                     workdir=pod.workdir if kind == "trainjob" else None,
                     unset=("RANK", "WORLD_SIZE") if job.contract == "mpi" and kind == "pytorchjob" else (),
                     spawn=nproc if job.contract == "mpi" else None)
    if any(POD_NAME_VAR in a for a in args):
        env.insert(0, {"name": POD_NAME_VAR, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    resume = resume_env(job, kind, name)      # after the values, before the secrets' references
    env = [e for e in env if e["name"] not in {r["name"] for r in resume}]
    at = next((i for i, e in enumerate(env) if "secretKeyRef" in e.get("valueFrom", {})), len(env))
    env[at:at] = resume
    volumes, mounts = _volumes(job, values, pod)
    restart_policy, backoff, recovery_notes = recovery_settings(job, kind, nnodes, runtime)
    notes = _notes(job, kind, nnodes, nproc, pod, runtime, per_pod, image) + recovery_notes
    container = {"name": CONTAINER[kind], "image": image, "args": args, "env": env}
    if pod.workdir and kind == "pytorchjob":
        container["workingDir"] = pod.workdir
    metadata = {"name": name, **({"namespace": namespace} if namespace else {}),
                "labels": {"app.kubernetes.io/managed-by": "clusterctl", JOB_LABEL: name}}
    if kind == "pytorchjob":
        body = _pytorchjob(job, metadata, container, pod, volumes, mounts, nnodes, nproc, notes,
                           restart_policy=restart_policy, backoff=backoff, pull_secret=pull_secret)
    else:
        body = _trainjob(job, metadata, container, pod, volumes, mounts, nnodes, nproc, runtime,
                         pull_secret=pull_secret)
    manifest = Manifest(kind=kind, name=job.name, body=body, notes=notes,
                        secret_name=secret_name if secret_keys else None, secret_keys=secret_keys,
                        secret_given=given, pull_secret=pull_secret,
                        pull_server=registry_server or image_registry(image))
    if pull_secret:
        manifest.notes.append(
            f"The pods pull the image with the Secret {pull_secret} (imagePullSecrets"
            + (", a runtimePatch of the runtime's node pods: a TrainJob's own spec has no field for "
               "it" if kind == "trainjob" else "") + f"); create it first: {manifest.pull_secret_command()}")
    if secret_keys:
        manifest.notes.append(
            f"Secrets ({', '.join(secret_keys)}) come from the Secret {secret_name}, never from this "
            f"file; create it first: {manifest.secret_command()}"
            + (f" (the value{'s' if len(given) > 1 else ''} given by {', '.join(given.values())} "
               f"{'are' if len(given) > 1 else 'is'} not written)" if given else ""))
    return manifest


def _pytorchjob(job: Job, metadata, container, pod, volumes, mounts, nnodes, nproc, notes, *,
                restart_policy: str = "Never", backoff: int | None = 0,
                pull_secret: str | None = None) -> dict:
    container = {**container, "ports": [{"name": "pytorchjob-port", "containerPort": PYTORCHJOB_PORT}]}
    if pod.resources:
        container["resources"] = {"limits": dict(pod.resources)}
    if pod.capabilities:
        container["securityContext"] = {"capabilities": {"add": list(pod.capabilities)}}
    if mounts:
        container["volumeMounts"] = mounts
    spec: dict = {}
    if pod.host_network:
        spec.update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")
    spec["containers"] = [container]
    if volumes:
        spec["volumes"] = volumes
    if pull_secret:
        spec["imagePullSecrets"] = [{"name": pull_secret}]
    template = {"metadata": {"labels": dict(metadata["labels"])}, "spec": spec}
    # The operator's WORLD_SIZE is replicas x nprocPerNode: a contract whose WORLD_SIZE counts
    # nodes (accl-bert) gets nprocPerNode 1 and its processes per node in NPROC_PER_NODE.
    counts_nodes = CONTRACTS[job.contract].get("WORLD_SIZE") == "{nnodes}"
    if counts_nodes:
        notes.append(f"contract {job.contract}: WORLD_SIZE counts nodes, so nprocPerNode is 1 (the "
                     f"operator sets WORLD_SIZE = replicas x nprocPerNode = {nnodes}) and "
                     f"NPROC_PER_NODE={nproc} carries the processes the program starts per node.")
    replicas = {"Master": {"replicas": 1, "restartPolicy": restart_policy, "template": template}}
    if nnodes > 1:
        replicas["Worker"] = {"replicas": nnodes - 1, "restartPolicy": restart_policy,
                              "template": copy.deepcopy(template)}   # a copy: no YAML alias
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata,
            "spec": {"nprocPerNode": "1" if counts_nodes else str(nproc),
                     "runPolicy": {**({"backoffLimit": backoff} if backoff is not None else {}),
                                   "cleanPodPolicy": "None"},
                     "pytorchReplicaSpecs": replicas}}


def _trainjob(job: Job, metadata, container, pod, volumes, mounts, nnodes, nproc, runtime, *,
              pull_secret: str | None = None) -> dict:
    # The runtime's container has a command of its own (torch-distributed: a /bin/bash -c
    # script), which args alone would only be appended to: the TrainJob sets its command.
    argv = container["args"]
    command, args = ([IMAGE_ENTRYPOINT], argv) if job.target else (argv[:1], argv[1:])
    trainer = {"image": container["image"], "command": command, **({"args": args} if args else {}),
               "env": container["env"], "numNodes": nnodes, "numProcPerNode": nproc}
    if pod.resources:
        trainer["resourcesPerNode"] = {"limits": dict(pod.resources)}
    spec: dict = {"runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org",
                                 "kind": "ClusterTrainingRuntime"},
                  "trainer": trainer}
    patch_container: dict = {"name": CONTAINER["trainjob"]}
    if pod.capabilities:
        patch_container["securityContext"] = {"capabilities": {"add": list(pod.capabilities)}}
    if mounts:
        patch_container["volumeMounts"] = mounts
    pod_patch: dict = {}
    if volumes:
        pod_patch["volumes"] = volumes
    if len(patch_container) > 1:
        pod_patch["containers"] = [patch_container]
    if pull_secret:   # Trainer 2.3: a runtime patch may set the pods' imagePullSecrets
        pod_patch["imagePullSecrets"] = [{"name": pull_secret}]
    if pod_patch:
        job_patch = {"name": CONTAINER["trainjob"],
                     "template": {"spec": {"template": {"spec": pod_patch}}}}
        spec["runtimePatches"] = [{"manager": "clusterctl", "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [job_patch]}}}}]
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": metadata,
            "spec": spec}


# --------------------------------------------------------------------------- environment

def _check_templates(job: Job, refs: Mapping[str, str]) -> None:
    """Per-pod placeholders not in mounts or docker_args (Kubernetes expands nothing in a
    host path or a pod setting); secret parameters not in command, docker_args or mounts
    (they would be written into the manifest)."""
    for section in ("mounts", "docker_args"):
        for i, template in enumerate(getattr(job, section)):
            for name in placeholders(template):
                if name in refs:
                    raise UserError(
                        f"{job.where(f'{section}.{i}')}: {{{name}}} differs per pod and Kubernetes "
                        f"cannot fill it in {section}; valid: a value the same on every node "
                        f"({{nnodes}}, {{nproc_per_node}}, params), or launch over SSH.")
    if found := secret_placeholder_use(job):
        where, name = found
        raise UserError(f"{where}: {{{name}}} is a secret parameter and "
                        "would be written into the manifest; valid: pass it through env "
                        f"(env: {{{name}: \"{{{name}}}\"}}), which becomes a reference "
                        "to the Secret, and read it from the environment.")


def _origin(job: Job, target, env_sets: Mapping[str, str], key: str) -> str:
    """Where the value of ``key`` comes from, for a message (never the value)."""
    if key in env_sets:
        return f"--set {key}=..."
    if key in job.env:
        return job.where(f"env.{key}")
    return f"target {target.name if target else '?'} env {key}"


def _secret_variables(job: Job, params: Mapping[str, str], upper: Mapping[str, str]) -> set[str]:
    """The variables whose value is secret: by name (``secrets``, *TOKEN* ...), because they
    hold a secret parameter's value (``AUTH: "Bearer {HF_TOKEN}"``), or a URL's credential
    (``https://user:pw@host``), as in a launch."""
    hidden = [params[p] for p in secret_params(job) if params.get(p)]
    return {k for k, v in upper.items()
            if is_secret_name(k, job.secrets) or (v and any(h in v for h in hidden))
            or (v and without_credentials(v) != v)}


def _per_pod_env(job: Job, values: Mapping[str, str], upper: Mapping[str, str],
                 env_sets: Mapping[str, str], refs: Mapping[str, str]) -> dict[str, str]:
    """The variables whose value differs per pod (a launch or job env template holding
    ``{node_rank}`` etc.), each as the ``sh`` word that gives it in the pod."""
    shell = {k: v[2:-1] for k, v in refs.items()}      # "$(PET_NODE_RANK)" -> PET_NODE_RANK
    out = {}
    for key, template in {**BASE_ENV, **CONTRACTS[job.contract]}.items():
        if key not in RANK_VARIABLES and key not in upper and set(placeholders(template)) & set(refs):
            out[key] = shell_word(template, values, shell)
    for key, template in job.env.items():
        if key not in env_sets and set(placeholders(template)) & set(refs):
            out[key] = shell_word(template, values, shell)
    return out


def _env_list(job: Job, launch: Mapping[str, str], upper: Mapping[str, str], secret: set[str],
              per_pod: set[str], secret_name: str) -> list[dict]:
    """Values, then the secrets as references (never a value); without the per-pod
    variables (the wrapper exports those)."""
    out = [{"name": k, "value": _escape(v)} for k, v in launch.items()
           if k not in RANK_VARIABLES and k not in per_pod]
    out += [{"name": k, "value": _escape(v)} for k, v in upper.items() if k not in secret | per_pod]
    for key in [*(k for k in upper if k in secret), *(k for k in job.secrets if k not in upper)]:
        out.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": key}}})
    return out


def _escape(text: str) -> str:
    """``text`` as Kubernetes must see it to give the container ``text``: ``$$`` for a ``$``
    that starts ``$(`` or ``$$`` (Kubernetes' escape)."""
    return re.sub(r"\$(?=[$(])", "$$", text)   # re.sub: "$" is not special in the replacement


def _fill(template: str, values: Mapping[str, str], refs: Mapping[str, str]) -> str:
    """``template`` with literal text escaped, placeholders filled from ``values`` (escaped) or
    ``refs`` (``$(VAR)`` references, as they are)."""
    out = []
    for literal, name, _spec, _conv in string.Formatter().parse(template):
        out.append(_escape(literal))
        if name is not None:
            out.append(refs[name] if name in refs else _escape(values[name]))
    return "".join(out)


# --------------------------------------------------------------------------- docker flags

def _target_devices(target, slots: int) -> list[str]:
    if not target:
        return []
    return [*target.run.devices_for(slots), *target.run.optional_devices]


def docker_size(text: str) -> str:
    """A docker size (``8g``, ``512m``, ``1.5G``; binary units) as a Kubernetes quantity."""
    m = _SIZE.match(text.strip())
    if not m:
        raise ValueError(text)
    unit = m.group(2).lower()
    return m.group(1) + ("" if unit in ("", "b") else unit.upper() + "i")


def _flag_items(flags: Sequence[str]) -> list[tuple[str, str]]:
    """(flag, value) pairs of ``--flag=value`` and ``--flag value``; value '' for a bare flag."""
    items, i, value_flags = [], 0, _value_flags()
    while i < len(flags):
        arg = flags[i]
        head, sep, value = arg.partition("=")
        if not sep and head in value_flags and i + 1 < len(flags):
            value, i = flags[i + 1], i + 1
        items.append((head, value))
        i += 1
    return items


def pod_settings(flags: Sequence[str], devices: Sequence[str], *, slots: int,
                 rdma_resource: str = DEFAULT_RDMA_RESOURCE, where: str = "job") -> PodSettings:
    """What ``docker run`` flags and devices become in a pod; UserError for what cannot be said."""
    pod = PodSettings()
    resource_of_flag = device_flags()
    for flag, value in _flag_items(flags):
        if flag in ("--net", "--network"):
            if value != "host":
                raise UserError(f"{where}: `{flag}={value}`: only host networking can be exported; "
                                "valid: --net=host or no network flag.")
            pod.host_network = True
        elif flag == "--ipc":
            pod.shm = True
            if value == "host":
                pod.notes.append("--ipc=host: a pod does not share the node's IPC namespace here; "
                                 "/dev/shm is a memory-backed emptyDir instead.")
        elif flag == "--shm-size":
            try:
                pod.shm, pod.shm_limit = True, docker_size(value)
            except ValueError:
                raise UserError(f"{where}: --shm-size={value!r} is not a size; valid: e.g. 8g, 512m.") from None
        elif flag in resource_of_flag:
            resource = resource_of_flag[flag]
            count = str(slots) if value in ("all", "") else value.removeprefix("count=")
            if not digits(count):
                raise UserError(f"{where}: {flag}={value!r} cannot be exported; valid: {flag}=all "
                                f"({resource} = slots) or {flag}=N.")
            pod.resources[resource] = count
        elif flag == "--ulimit":
            limit = value.partition("=")[0]
            if limit == "memlock":
                _add_cap(pod, "IPC_LOCK")
                pod.notes.append(f"--ulimit {value}: Kubernetes sets no ulimits; the container gets "
                                 "capability IPC_LOCK, with which the memlock limit does not bind.")
            else:
                pod.notes.append(f"--ulimit {value}: not expressible in Kubernetes (no ulimits); the "
                                 "node's container runtime defaults apply.")
        elif flag == "--cap-add":
            _add_cap(pod, value.upper().removeprefix("CAP_"))
        elif flag == "--device":
            devices = [*devices, value]
        elif flag in ("-w", "--workdir"):
            pod.workdir = value
        else:
            raise UserError(f"{where}: docker run flag {flag!r} cannot be exported to Kubernetes; "
                            f"valid: {one_of(_value_flags())} (or launch over SSH).")
    for device in dict.fromkeys(devices):
        _device_resource(pod, device.split(":", 1)[0], slots, rdma_resource, where)
    return pod


def _add_cap(pod: PodSettings, cap: str) -> None:
    if cap not in pod.capabilities:
        pod.capabilities.append(cap)


def _device_resource(pod: PodSettings, device: str, slots: int, rdma_resource: str, where: str) -> None:
    known_devices = device_resources()
    for prefix, (resource, count) in known_devices.items():
        if device == prefix or device.startswith(prefix if prefix.endswith("_") else prefix + "/"):
            pod.resources[resource or rdma_resource] = str(count or slots)
            return
    known = ", ".join(f"{p}* ({r or rdma_resource})" for p, (r, _c) in known_devices.items())
    raise UserError(f"{where}: device {device} cannot be expressed in Kubernetes: a pod gets host "
                    f"devices only as a device plugin's resource, and clusterctl knows {known}; "
                    "valid: drop the device from the job, or launch over SSH.")


# --------------------------------------------------------------------------- volumes, names, notes

def _volumes(job: Job, values: Mapping[str, str], pod: PodSettings) -> tuple[list[dict], list[dict]]:
    volumes, mounts = [], []
    if pod.shm:
        empty = {"medium": "Memory", **({"sizeLimit": pod.shm_limit} if pod.shm_limit else {})}
        volumes.append({"name": "dshm", "emptyDir": empty})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    for i, mount in enumerate(job.mounts):
        spec = expand(mount, values)   # a host path: Kubernetes expands nothing in it
        problem = mount_problem(spec)
        if problem:
            raise UserError(f"{job.where(f'mounts.{i}')}: {problem} (after filling placeholders "
                            f"from {mount!r}); set the parameter with --set NAME=/absolute/path.")
        host, container, *mode = spec.split(":")
        volumes.append({"name": f"mount-{i}", "hostPath": {"path": host}})
        mounts.append({"name": f"mount-{i}", "mountPath": container,
                       **({"readOnly": True} if mode == ["ro"] else {})})
    if job.checkpoint:       # as an SSH launch mounts it: the same path on the node and inside
        if any(m["mountPath"].rstrip("/") == job.checkpoint.rstrip("/") for m in mounts):
            raise UserError(f"{job.where('checkpoint')}: {job.checkpoint} is also the container path "
                            "of a mount (or /dev/shm); valid: a checkpoint directory no mount uses.")
        volumes.append({"name": CHECKPOINT_VOLUME, "hostPath": {"path": job.checkpoint}})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": job.checkpoint})
    return volumes, mounts


# --------------------------------------------------------------------------- recovery

def resume_env(job: Job, kind: str, name: str) -> list[dict]:
    """The resume contract's variables a pod of ``kind`` can be given (module docstring):
    the run id (the object's name), the attempt (TrainJob: JobSet's restart count), the
    checkpoint directory.  Pure."""
    env = [{"name": "CLUSTERCTL_RUN_ID", "value": _escape(name)}]
    if kind == "trainjob":
        env.append({"name": "CLUSTERCTL_ATTEMPT", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{JOBSET_RESTART_ANNOTATION}']"}}})
    if job.checkpoint:
        env.append({"name": "CLUSTERCTL_CHECKPOINT_DIR", "value": _escape(job.checkpoint)})
    assert {e["name"] for e in env} <= set(recovery.RESUME_ENV)
    return env


def recovery_settings(job: Job, kind: str, nnodes: int, runtime: str,
                      rules: Sequence[recovery.Rule] = recovery.RULES
                      ) -> tuple[str, int | None, list[str]]:
    """(a PyTorchJob's replica ``restartPolicy``, its ``runPolicy.backoffLimit`` (None: not
    written), the notes on what maps and what cannot) for the job's recovery keys.  Pure.

    PyTorchJob (training operator v1): OnFailure restarts a failed pod's container in place
    (kubelet) and the operator fails the job once the container restarts of its running pods
    add up to backoffLimit.  ExitCode recreates a pod whose container exited with a code of
    :data:`KUBEFLOW_RETRYABLE` and fails the job on any other non-zero code; the recreations
    are not container restarts, so backoffLimit does not bound them (kubeflow/trainer#2045,
    "a specification, not a bug").  The exit-code rules of ``rules``
    (:data:`clusterctl.run.recovery.RULES`) whose codes the job lists choose ExitCode: an
    ``end`` rule's code maps where the operator fails the job on it, any other's where it
    retries it; the rest is said in the notes with the rule's reason."""
    n = job.max_restarts
    coded = [(rule, codes) for rule in rules if (codes := sorted(set(rule.codes_of(job))))]
    notes = [f"{rule.label} {', '.join(map(str, codes))}: not on Kubernetes: {rule.kubernetes.why}."
             for rule, codes in coded if rule.kubernetes.says is None]
    coded = [(rule, codes) for rule, codes in coded if rule.kubernetes.says is not None]
    if kind == "trainjob":
        if n:
            notes.append(f"Restarts (max_restarts {n}): a TrainJob has no field for them; the "
                         f"runtime has: set spec.template.spec.failurePolicy.maxRestarts: {n} in the "
                         f"ClusterTrainingRuntime {runtime} (JobSet restarts every node's pod; "
                         "CLUSTERCTL_ATTEMPT is its restart count).")
        if coded:
            notes.append(_codes(coded) + ": a TrainJob cannot say them. In the runtime, "
                         "fatal codes are a podFailurePolicy rule (onExitCodes, action FailJob) of "
                         "the node job's template with a JobSet failurePolicy rule "
                         "(onJobFailureReasons: [PodFailurePolicy], action FailJobSet); every "
                         "JobSet restart counts against maxRestarts, retryable codes too.")
        if job.checkpoint:
            notes.append(_checkpoint_note(job.checkpoint))
        return "Never", 0, notes
    if coded:
        policy, backoff = "ExitCode", n if n else recovery.MAX_ATTEMPTS
        words = ", ".join(map(str, KUBEFLOW_RETRYABLE))
        notes.append(f"{_codes(coded)}: restartPolicy ExitCode, whose classes are the "
                     f"training operator's: it recreates a pod that exited {words} and fails the "
                     "job on any other code.")
        cannot = [f"{rule.label} {c} ({rule.kubernetes.why})" for rule, codes in coded for c in codes
                  if (c in KUBEFLOW_RETRYABLE) == (rule.action == "end")]
        if cannot:
            notes.append("Not expressible under ExitCode: " + "; ".join(cannot) + ".")
        notes.append(f"The operator does not count ExitCode's pod re-creations against "
                     f"backoffLimit ({backoff}) (kubeflow/trainer#2045)"
                     + (f", and any other failing code ends the job: max_restarts {n} bounds "
                        "nothing here." if n else "."))
    elif n:
        policy, backoff = "OnFailure", n
        notes.append(f"Restarts (max_restarts {n}): restartPolicy OnFailure, runPolicy.backoffLimit "
                     f"{n}: the kubelet restarts a failed container in its pod, not the whole job "
                     "(the other ranks restart when they fail in turn), and the operator adds up the "
                     f"container restarts of all {nnodes} pods: a failure that takes every pod down "
                     f"counts up to {nnodes} (one per pod) against the {n}.")
    else:
        policy, backoff = "Never", 0
    if policy != "Never":
        notes.append("CLUSTERCTL_ATTEMPT is not set: a PyTorchJob's pods are not told how often "
                     "they were restarted; resume from what the checkpoint directory holds.")
    if job.checkpoint:
        notes.append(_checkpoint_note(job.checkpoint))
    return policy, backoff, notes


def _codes(coded: Sequence[tuple[recovery.Rule, Sequence[int]]]) -> str:
    return " and ".join(f"{rule.label} {', '.join(map(str, codes))}" for rule, codes in coded)


def _checkpoint_note(path: str) -> str:
    return (f"checkpoint {path}: a hostPath volume at the same path (as mounts are), named by "
            "CLUSTERCTL_CHECKPOINT_DIR: every Kubernetes node needs the same shared storage there "
            "(or replace the volume by a PersistentVolumeClaim every pod can write).")


def pull_secret_name(job: Job) -> str:
    """The usual name of the Secret a job's pods pull its image with: ``<job>-registry``."""
    return f"{_dns_name(job.name)}-registry"


def image_registry(image: str) -> str | None:
    """The registry ``HOST[:PORT]`` an image reference names, by Docker's rule (a first path
    part with a '.' or ':', or ``localhost``); None: Docker Hub.  Pure."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def _resource_name(name: str) -> bool:
    """Whether ``name`` is a Kubernetes (extended) resource name: ``[DOMAIN/]NAME``."""
    prefix, _, base = name.rpartition("/")
    return (bool(_QUALIFIED.match(base)) and len(base) <= 63
            and (not prefix or (len(prefix) <= 253 and bool(_SUBDOMAIN.match(prefix)))))


def _dns_name(name: str) -> str:
    """A job name as a Kubernetes object name (RFC 1035 label: a-z, 0-9, '-', a letter
    first, at most 63)."""
    out = _DNS.sub("-", name.lower()).strip("-")
    if digits(out[:1]):      # RFC 1035 (both operators check it): a letter first
        out = "job-" + out
    out = out[:63].rstrip("-")
    if not out:
        raise UserError(f"job name {shown(name)} gives no Kubernetes name; valid: a job file named with "
                        "letters, digits and '-'.")
    return out


def _notes(job: Job, kind: str, nnodes: int, nproc: int, pod: PodSettings, runtime: str,
           per_pod: Mapping[str, str], image: str) -> list[str]:
    pull = ("the nodes pull the image by digest: exactly the image pushed there" if digest_of(image)
            else "the image must be pullable by the cluster's nodes (push it to a registry and pass "
                 "--image)")
    notes = [f"{nnodes} node(s), {nproc} process(es) per node; {pull}.",
             f"The operator sets {', '.join(OPERATOR_ENV[kind])} in each pod; clusterctl writes no rank "
             "variable (NODE_RANK is PET_NODE_RANK there).",
             "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME are not set (no node was inspected); "
             "--set NCCL_SOCKET_IFNAME=IFACE where the nodes need it."]
    if kind == "trainjob":
        notes.append(f"Needs Kubeflow Trainer v2 with the ClusterTrainingRuntime {runtime} (torch); "
                     "volumes and capabilities are runtimePatches of its `node` job.")
        derived = derived_variables(job.contract, kind)
        if derived:
            notes.append("The torch runtime sets PET_* only; the command runs through /bin/sh, which "
                         "first exports " + ", ".join(f"{k}=${v}" for k, v in derived.items())
                         + " (the rest of the launch contract), then execs it.")
        if pod.host_network:
            notes.append("Host networking (docker --net=host): a TrainJob cannot set hostNetwork; "
                         f"the runtime {runtime} must (hostNetwork: true, dnsPolicy: "
                         "ClusterFirstWithHostNet in its node pod template; name it with --runtime).")
        if pod.workdir:
            notes.append(f"Working directory {pod.workdir} (docker -w): a TrainJob has no field for "
                         "it; the command runs through /bin/sh, which cds there first (and fails if "
                         "it cannot).")
        if job.target:
            notes.append(f"The TrainJob sets command {IMAGE_ENTRYPOINT} (the image's entrypoint) "
                         "because its runtime's container has a command of its own.")
    else:
        notes.append("Needs the Kubeflow training operator (kubeflow.org/v1 PyTorchJob).")
    if per_pod:
        notes.append(f"{', '.join(per_pod)} differ{'s' if len(per_pod) == 1 else ''} per pod: the "
                     "command runs through /bin/sh, which exports "
                     f"{'it' if len(per_pod) == 1 else 'them'} from the operator's variables "
                     "(an env entry cannot refer to variables the operator adds after it).")
    if job.contract == "mpi":
        notes.append(f"contract mpi: /bin/sh starts the node's {nproc} processes through clusterctl's "
                     "spawner (python3 in the image), PMI_RANK from PET_NODE_RANK x "
                     f"{nproc}" + (", after unsetting the operator's RANK and WORLD_SIZE (node-level)"
                                   if kind == "pytorchjob" else "") + ".")
    return notes + pod.notes


def _wrap(text: str, width: int = 96) -> list[str]:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    return [*lines, line] if line else lines


__all__ = ["IMAGE_ENTRYPOINT", "KINDS", "KUBEFLOW_RETRYABLE", "Manifest", "OPERATOR_ENV",
           "build_manifest", "docker_size", "image_registry", "pod_settings", "pull_secret_name",
           "recovery_settings", "resume_env", "shell_word", "wrap_args"]
