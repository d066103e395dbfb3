"""Kubernetes manifests of a job: a Kubeflow PyTorchJob or a Kubeflow Trainer TrainJob.

:func:`build_manifest` is pure: the job (:mod:`clusterctl.run.jobs`), its target's
facts (:mod:`clusterctl.image.targets`) and the options in, a :class:`Manifest` (the
object as a dict, plus notes on what Kubernetes cannot say) out; :meth:`Manifest.text`
is the YAML ``clusterctl export`` writes.  Nothing is contacted and no API server is
needed.

What an SSH launch gives a container, and where it goes here
------------------------------------------------------------
* image, command: ``args`` of the container, so the image's ENTRYPOINT (clusterctl's
  entrypoint.sh) still runs first, as with ``docker run IMAGE COMMAND``;
* the environment: the same layers as :mod:`clusterctl.run.plan` (target env, job env,
  ``--set``; :func:`clusterctl.run.plan.job_environment`).  The rank variables
  (``MASTER_ADDR MASTER_PORT RANK WORLD_SIZE NODE_RANK PET_*``) are left to the operator
  (:data:`OPERATOR_ENV` says which it sets); a TrainJob's command is wrapped in
  ``/bin/sh -c 'export RANK="$PET_NODE_RANK" ...; exec "$@"'`` (:func:`contract_args`),
  because Trainer's torch runtime sets ``PET_*`` only and the job's contract may read
  ``MASTER_ADDR``, ``NODE_RANK``, ``RANK``, ``WORLD_SIZE``; ``NNODES`` and ``NPROC_PER_NODE``, the same
  on every node, are written.  ``{master_addr}``, ``{master_port}``, ``{node_rank}``,
  ``{node_name}`` in the command become Kubernetes ``$(VAR)`` references to the
  operator's variables; in env values they are refused (Kubernetes expands ``$(VAR)`` in
  env only from variables listed BEFORE it, and the operators add theirs after).
  Literal ``$`` is escaped (``$$``) so text reaches the container exactly as written;
* secrets (the job's ``secrets`` and names with TOKEN, SECRET, PASSWORD, KEY):
  ``secretKeyRef`` to the Secret ``<job>-secrets``, key = the variable name, never a
  value; a secret given a value in the job, the target or ``--set`` is refused;
* ``docker run`` flags of the target and the job (:func:`pod_settings`): ``--net=host``
  -> ``hostNetwork`` + ``dnsPolicy: ClusterFirstWithHostNet``; ``--shm-size`` and
  ``--ipc=host`` -> a memory-backed emptyDir at /dev/shm (with that ``sizeLimit``);
  ``--gpus`` -> ``nvidia.com/gpu`` = slots; ``--ulimit memlock=-1`` -> capability
  IPC_LOCK (Kubernetes sets no ulimits; with IPC_LOCK the memlock limit does not bind);
  ``--cap-add`` -> capabilities; ``--device`` -> a device plugin's resource
  (:data:`DEVICE_RESOURCES`) or a refusal; ``-w``/``--workdir`` -> the container's
  ``workingDir`` (PyTorchJob; a TrainJob's runtime owns its container: refused);
* mounts -> ``hostPath`` volumes.
"""

from __future__ import annotations

import copy
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import yaml

from clusterctl.cluster.containers import JOB_LABEL
from clusterctl.core.errors import UserError, did_you_mean, one_of
from clusterctl.image import targets
from clusterctl.run.jobs import (
    BASE_ENV,
    CONTRACTS,
    Job,
    expand,
    is_secret_name,
    mount_problem,
    placeholders,
)
from clusterctl.run.plan import job_environment, nproc_for, secret_params, split_sets

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


def derived_variables(contract: str, kind: str) -> dict[str, str]:
    """The contract's rank variables the ``kind`` operator does NOT set, each with the PET_*
    variable it is derived from in the pod (TrainJob: ``MASTER_ADDR`` <- ``PET_MASTER_ADDR``,
    ``NODE_RANK`` <- ``PET_NODE_RANK``; accl-bert adds ``RANK`` <- ``PET_NODE_RANK`` and
    ``WORLD_SIZE`` <- ``PET_NNODES``).  Pure."""
    wanted = {**BASE_ENV, **CONTRACTS[contract]}
    return {k: PET_SOURCES[v] for k, v in wanted.items()
            if k in RANK_VARIABLES and k not in OPERATOR_ENV[kind] and v in PET_SOURCES}


def contract_args(args: Sequence[str], derived: Mapping[str, str]) -> list[str]:
    """``args`` run through ``/bin/sh -c`` that first exports each derived variable from its
    PET_* source (``RANK="$PET_NODE_RANK"``), then ``exec``s the command unchanged (argv,
    no second shell parse).  ``$NAME`` is not Kubernetes' ``$(NAME)``: it reaches the
    shell as written.  Pure."""
    if not derived:
        return list(args)
    exports = " ".join(f'{k}="${v}"' for k, v in derived.items())
    return ["/bin/sh", "-c", f'export {exports}; exec "$@"', CONTRACT_WRAPPER, *args]

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_RDMA_RESOURCE = "rdma/hca"
#: Device path prefixes a device plugin provides, with its resource name (None: the RDMA
#: resource given by --rdma-resource) and how many a pod asks for (None: slots).
DEVICE_RESOURCES: dict[str, tuple[str | None, int | None]] = {
    "/dev/infiniband": (None, 1),              # k8s-rdma-shared-dev-plugin (resource name is site config)
    "/dev/cambricon_": ("cambricon.com/mlu", None),   # Cambricon's device plugin: one per MLU
}
#: Containers the operators expect by name.
CONTAINER = {"pytorchjob": "pytorch", "trainjob": "node"}
PYTORCHJOB_PORT = 23456    # the operator's default, named pytorchjob-port
DEFAULT_RUNTIME = "torch-distributed"
_DNS = re.compile(r"[^a-z0-9-]+")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([bkmgtp]?)b?\Z", re.IGNORECASE)
#: docker run flags export understands; the ones taking a value may also be given as two tokens.
_VALUE_FLAGS = ("--net", "--network", "--ipc", "--shm-size", "--gpus", "--ulimit", "--cap-add",
                "--device", "-w", "--workdir")


@dataclass(frozen=True)
class Manifest:
    """One Kubernetes object (``body``) and what the YAML's header says (``notes``)."""

    kind: str
    name: str
    body: dict
    notes: list[str] = field(default_factory=list)
    secret_name: str | None = None

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
                   rdma_resource: str = DEFAULT_RDMA_RESOURCE) -> Manifest:
    """The manifest of ``job`` on ``nnodes`` pods of ``slots`` accelerators each.  Pure.

    ``kind``: ``pytorchjob`` or ``trainjob``; ``overrides``: the ``--set`` values
    (:func:`clusterctl.run.plan.parse_sets`); ``runtime``: the ClusterTrainingRuntime a
    TrainJob refers to; ``rdma_resource``: the resource name of the site's RDMA device
    plugin.  UserError (exit 2) for anything a manifest cannot carry.
    """
    if job.contract == "mpi":
        raise UserError(f"{job.where('contract')}: contract mpi (each container starts its node's "
                        "processes, clusterctl.run.mpi) is not exported yet; valid: launch it over "
                        "SSH (clusterctl launch JOB --nodes FILE), or export a torchrun job.")
    if kind not in KINDS:
        raise UserError(f'--to {kind!r}: unknown kind{did_you_mean(kind, KINDS)}; valid: {one_of(KINDS)}.')
    if nnodes < 1:
        raise UserError(f"--nnodes {nnodes}: a job needs at least 1 node; valid: a whole number >= 1.")
    if slots < 1:
        raise UserError(f"--slots {slots}: valid: accelerators (processes) per node, a whole number >= 1.")
    target = targets.get_target(job.target) if job.target else None
    image = image or job.image or (targets.resolve(job.target).tag if job.target else None)
    if not image or image.startswith("-") or any(c.isspace() for c in image):
        raise UserError(f"job {job.name}: image {image!r} is not an image reference; valid: --image "
                        "REGISTRY/REPO:TAG (the cluster's nodes pull it).")
    name = _dns_name(job.name)
    params, env_sets = split_sets(job, overrides or {})
    nproc = nproc_for(job, slots, env_sets, "--set")
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
    secret_name = f"{name}-secrets"
    _refuse_secret_copies(job, params, upper, env_sets, target, secret_name)
    env = _env_list(job, target, kind, launch, upper, env_sets, secret_name)
    args = [_fill(a, values, refs) for a in job.command]
    if kind == "trainjob":   # Trainer sets PET_* only: the rest of the contract comes from them
        args = contract_args(args, derived_variables(job.contract, kind))
    if any("$(" + POD_NAME_VAR + ")" in a for a in args):
        env.insert(0, {"name": POD_NAME_VAR, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    flags = [_fill(a, values, {}) for a in (target.run.flags if target else [])]
    flags += [_fill(a, values, {}) for a in job.docker_args]
    devices = _target_devices(target, slots)
    pod = pod_settings(flags, devices, slots=slots, rdma_resource=rdma_resource, where=job.name)
    volumes, mounts = _volumes(job, values, pod)
    used_secret = any("secretKeyRef" in e.get("valueFrom", {}) for e in env)
    notes = _notes(job, kind, nnodes, nproc, pod, secret_name if used_secret else None, runtime)
    container = {"name": CONTAINER[kind], "image": image, "args": args, "env": env}
    if pod.workdir and kind == "trainjob":
        raise UserError(f"{job.name}: -w {pod.workdir} (the working directory) cannot be set in a "
                        "TrainJob: its runtime owns the container; valid: --to pytorchjob, or "
                        "launch over SSH.")
    if pod.workdir:
        container["workingDir"] = pod.workdir
    metadata = {"name": name, **({"namespace": namespace} if namespace else {}),
                "labels": {"app.kubernetes.io/managed-by": "clusterctl", JOB_LABEL: name}}
    if kind == "pytorchjob":
        body = _pytorchjob(job, metadata, container, pod, volumes, mounts, nnodes, nproc, notes)
    else:
        body = _trainjob(metadata, container, pod, volumes, mounts, nnodes, nproc, runtime)
    return Manifest(kind=kind, name=job.name, body=body, notes=notes,
                    secret_name=secret_name if used_secret else None)


def _pytorchjob(job, metadata, container, pod, volumes, mounts, nnodes, nproc, notes) -> dict:
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
    template = {"metadata": {"labels": dict(metadata["labels"])}, "spec": spec}
    # The operator's WORLD_SIZE is replicas x nprocPerNode: a contract whose WORLD_SIZE counts
    # nodes (accl-bert) gets nprocPerNode 1 and its processes per node in NPROC_PER_NODE.
    counts_nodes = CONTRACTS[job.contract].get("WORLD_SIZE") == "{nnodes}"
    if counts_nodes:
        notes.append(f"contract {job.contract}: WORLD_SIZE counts nodes, so nprocPerNode is 1 (the "
                     f"operator sets WORLD_SIZE = replicas x nprocPerNode = {nnodes}) and "
                     f"NPROC_PER_NODE={nproc} carries the processes the program starts per node.")
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if nnodes > 1:
        replicas["Worker"] = {"replicas": nnodes - 1, "restartPolicy": "Never",
                              "template": copy.deepcopy(template)}   # a copy: no YAML alias
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata,
            "spec": {"nprocPerNode": "1" if counts_nodes else str(nproc),
                     "runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "None"},
                     "pytorchReplicaSpecs": replicas}}


def _trainjob(metadata, container, pod, volumes, mounts, nnodes, nproc, runtime) -> dict:
    trainer = {"image": container["image"], "args": container["args"], "env": container["env"],
               "numNodes": nnodes, "numProcPerNode": nproc}
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
    if pod_patch:
        job_patch = {"name": CONTAINER["trainjob"],
                     "template": {"spec": {"template": {"spec": pod_patch}}}}
        spec["runtimePatches"] = [{"manager": "clusterctl", "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [job_patch]}}}}]
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": metadata,
            "spec": spec}


# --------------------------------------------------------------------------- environment

def _check_templates(job: Job, refs: Mapping[str, str]) -> None:
    """Per-pod placeholders only in ``command``: Kubernetes expands nothing in a host path or
    a pod setting, and ``$(VAR)`` in env only from variables listed before it."""
    for section in ("mounts", "docker_args"):
        for i, template in enumerate(getattr(job, section)):
            for name in placeholders(template):
                if name in refs:
                    raise UserError(
                        f"{job.where(f'{section}.{i}')}: {{{name}}} differs per pod and Kubernetes "
                        f"cannot fill it in {section}; valid: a value the same on every node "
                        f"({{nnodes}}, {{nproc_per_node}}, params), or launch over SSH.")
    for key, template in job.env.items():
        for name in placeholders(template):
            if name in refs:
                raise UserError(
                    f"{job.where(f'env.{key}')}: {{{name}}} differs per pod and cannot be exported in an "
                    "env value: Kubernetes expands $(VAR) in env only from variables listed before it, "
                    "and the operator adds its variables after the job's; valid: read MASTER_ADDR / "
                    "PET_NODE_RANK etc. in the program, or use the placeholder in `command`.")


def _origin(job: Job, target, env_sets: Mapping[str, str], key: str) -> str:
    """Where the value of ``key`` comes from, for a message (never the value)."""
    if key in env_sets:
        return f"--set {key}=..."
    if key in job.env:
        return job.where(f"env.{key}")
    return f"target {target.name if target else '?'} env {key}"


def _refuse_secret_copies(job: Job, params: Mapping[str, str], upper: Mapping[str, str],
                          env_sets: Mapping[str, str], target, secret_name: str) -> None:
    """A secret parameter's value copied into a variable of another name (``COPY:
    "{HF_TOKEN}"``) would be written into the manifest as that variable's value: refused,
    naming the variable and the parameter, never the value."""
    hidden = {p: params[p] for p in secret_params(job) if params.get(p)}
    for key, value in upper.items():
        source = next((p for p, v in hidden.items() if v in value), None)
        if source and not is_secret_name(key, job.secrets):
            raise UserError(
                f"{_origin(job, target, env_sets, key)}: {key} holds the value of the secret parameter "
                f"{source}, and a manifest never carries secret values; valid: list {key} under "
                f"`secrets` and create the Secret: kubectl create secret generic {secret_name} "
                f"--from-literal={key}=...")


def _env_list(job: Job, target, kind: str, launch: dict[str, str], upper: dict[str, str],
              env_sets: Mapping[str, str], secret_name: str) -> list[dict]:
    out = [{"name": k, "value": _escape(v)} for k, v in launch.items() if k not in RANK_VARIABLES]
    for key, value in upper.items():
        if is_secret_name(key, job.secrets):
            raise UserError(
                f"{_origin(job, target, env_sets, key)}: {key} is a secret (listed under `secrets` or "
                "named *TOKEN*, *SECRET*, *PASSWORD*, *KEY*) and a manifest never carries secret "
                f"values; valid: drop the value, list {key} under `secrets`, and create the Secret: "
                f"kubectl create secret generic {secret_name} --from-literal={key}=...")
        out.append({"name": key, "value": _escape(value)})
    for key in job.secrets:
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
    items, i = [], 0
    while i < len(flags):
        arg = flags[i]
        head, sep, value = arg.partition("=")
        if not sep and head in _VALUE_FLAGS and i + 1 < len(flags):
            value, i = flags[i + 1], i + 1
        items.append((head, value))
        i += 1
    return items


def pod_settings(flags: Sequence[str], devices: Sequence[str], *, slots: int,
                 rdma_resource: str = DEFAULT_RDMA_RESOURCE, where: str = "job") -> PodSettings:
    """What ``docker run`` flags and devices become in a pod; UserError for what cannot be said."""
    pod = PodSettings()
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
        elif flag == "--gpus":
            count = str(slots) if value in ("all", "") else value.removeprefix("count=")
            if not count.isdigit():
                raise UserError(f"{where}: --gpus={value!r} cannot be exported; valid: --gpus=all "
                                f"({GPU_RESOURCE} = slots) or --gpus=N.")
            pod.resources[GPU_RESOURCE] = count
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
                            f"valid: {one_of(_VALUE_FLAGS)} (or launch over SSH).")
    for device in dict.fromkeys(devices):
        _device_resource(pod, device.split(":", 1)[0], slots, rdma_resource, where)
    return pod


def _add_cap(pod: PodSettings, cap: str) -> None:
    if cap not in pod.capabilities:
        pod.capabilities.append(cap)


def _device_resource(pod: PodSettings, device: str, slots: int, rdma_resource: str, where: str) -> None:
    for prefix, (resource, count) in DEVICE_RESOURCES.items():
        if device == prefix or device.startswith(prefix if prefix.endswith("_") else prefix + "/"):
            pod.resources[resource or rdma_resource] = str(count or slots)
            return
    known = ", ".join(f"{p}* ({r or rdma_resource})" for p, (r, _c) in DEVICE_RESOURCES.items())
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
    return volumes, mounts


def _dns_name(name: str) -> str:
    """A job name as a Kubernetes object name (RFC 1123 label: a-z, 0-9, '-', at most 63)."""
    out = _DNS.sub("-", name.lower()).strip("-")[:63].rstrip("-")
    if not out:
        raise UserError(f"job name {name!r} gives no Kubernetes name; valid: a job file named with "
                        "letters, digits and '-'.")
    return out


def _notes(job: Job, kind: str, nnodes: int, nproc: int, pod: PodSettings, secret: str | None,
           runtime: str) -> list[str]:
    notes = [f"{nnodes} node(s), {nproc} process(es) per node; the image must be pullable by the "
             "cluster's nodes (push it to a registry and pass --image).",
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
    else:
        notes.append("Needs the Kubeflow training operator (kubeflow.org/v1 PyTorchJob).")
    if secret:
        notes.append(f"Secrets come from the Secret {secret} (kubectl create secret generic {secret} "
                     f"--from-literal={job.secrets[0]}=...), never from this file.")
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


__all__ = ["KINDS", "Manifest", "OPERATOR_ENV", "build_manifest", "docker_size", "pod_settings"]
