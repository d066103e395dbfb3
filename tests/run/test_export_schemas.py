"""Every shipped job exports to both kinds, and every exported object is what the official
CRDs accept: their openAPIV3Schema (jsonschema, unknown fields are errors: a server would
prune them silently), their CEL rules (cel-python) and the server's metadata checks
(tests/fixtures/k8s_schema.py).  The CRDs are tests/fixtures/k8s-crds/ (kubeflow/trainer v1.9.4
PyTorchJob, v2.3.0 TrainJob).  No API server runs here; with KUBECONFIG set,
test_every_shipped_job_applies_with_kubectl_server_dry_run asks a real one (a site's own check).

The wrappers the exporter writes (/bin/sh: working directory, per-pod variables, the mpi
spawner) run here in a real shell, with the args expanded as the kubelet does and only the
environment the operator gives a pod.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from clusterctl.core.errors import UserError
from clusterctl.run.export import IMAGE_ENTRYPOINT, KINDS, build_manifest
from clusterctl.run.jobs import load_job
from tests.fixtures.k8s_schema import kube_expand, schema_errors

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (REPO / "jobs").glob("*.yaml"))


# options each job is exported with: defaults, one node, a namespace + a secret given a value
VARIANTS = {
    "2x2": {"nnodes": 2, "slots": 2},
    "1x1": {"nnodes": 1, "slots": 1},
    "ns+secret": {"nnodes": 3, "slots": 8, "namespace": "ml",
                  "overrides": {"HF_TOKEN": "hf_never_written"}},
}


def _body(job: str, kind: str, options: dict) -> dict:
    manifest = build_manifest(load_job(job), kind=kind, **options)
    body = yaml.safe_load(manifest.text())      # what kubectl reads: the YAML, not the dict
    assert "hf_never_written" not in manifest.text()
    return body


def test_every_shipped_job_is_covered():
    assert len(SHIPPED) >= 9 and {"bert", "deepspeed", "accelerate-ipex", "optimum-qa-ccl"} <= set(SHIPPED)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("job", SHIPPED)
def test_every_shipped_job_exports_and_validates_against_the_crd(job, kind, variant):
    body = _body(job, kind, VARIANTS[variant])
    assert schema_errors(body) == []


@pytest.mark.parametrize(("kind", "breakage", "expected"), [
    ("trainjob", lambda b: b["spec"]["trainer"].__setitem__("numNode", 2), "'numNode' was unexpected"),
    ("trainjob", lambda b: b["metadata"].__setitem__("name", "2-bert"), "RFC 1035"),
    ("trainjob", lambda b: b["spec"]["trainer"].__setitem__("numNodes", "2"), "is not of type 'integer'"),
    ("trainjob", lambda b: b["spec"].__setitem__("managedBy", "me"), "ManagedBy must be"),
    ("pytorchjob", lambda b: b["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"].__setitem__(
        "hostNetwrok", True), "'hostNetwrok' was unexpected"),
    ("pytorchjob", lambda b: b["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
     ["env"].append({"name": "X", "valueFrom": {"secretRef": {"name": "s"}}}), "'secretRef' was unexpected"),
    ("pytorchjob", lambda b: b["metadata"]["labels"].__setitem__("x", "not a label"), "not a label value"),
])
def test_the_validation_catches_what_a_server_refuses_or_prunes(kind, breakage, expected):
    """The check above is worth something: each breakage is found, and named."""
    body = _body("ddp-smoke", kind, {"nnodes": 2})
    assert schema_errors(copy.deepcopy(body)) == []
    breakage(body)
    errors = schema_errors(body)
    assert any(expected in e for e in errors), errors


def test_the_default_runtime_shape_the_trainjob_relies_on_is_a_valid_runtime():
    """A site's torch runtime with host networking (what the notes ask for) is a valid
    ClusterTrainingRuntime; it has a command of its own, as Trainer's torch-distributed does,
    which is why the TrainJob sets its command."""
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "torch-distributed-hostnet"},
               "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {
                            "template": {"spec": {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
                                                  "containers": [{"name": "node", "image": "x",
                                                                  "command": ["/bin/bash", "-c", "true"]}]}}}}}]}}}}
    assert schema_errors(runtime) == []
    runtime["spec"]["mlPolicy"]["mpi"] = {}        # the CEL rule on mlPolicy
    assert any("Only one of the policy can be configured" in e for e in schema_errors(runtime))


@pytest.mark.parametrize("job", SHIPPED)
def test_a_trainjob_sets_its_command_the_runtime_has_its_own(job):
    trainer = _body(job, "trainjob", {"nnodes": 2})["spec"]["trainer"]
    assert trainer["command"] == [IMAGE_ENTRYPOINT]      # every shipped job has a clusterctl target


def test_the_image_entrypoint_is_the_one_clusterctl_builds():
    assert f'ENTRYPOINT ["{IMAGE_ENTRYPOINT}"]' in (REPO / "templates/blocks/entrypoint.j2").read_text()


def test_a_job_with_its_own_image_runs_its_command_as_the_trainjob_command(tmp_path):
    job = tmp_path / "own.yaml"
    job.write_text("image: reg/app:1\ncommand: [python, train.py, --lr, '0.1']\n")
    trainer = build_manifest(load_job(str(job)), kind="trainjob", nnodes=2).body["spec"]["trainer"]
    # no clusterctl entrypoint to run: the argv itself is the command (here the contract wrapper's
    # /bin/sh, which execs the job's command last)
    assert trainer["command"] == ["/bin/sh"]
    assert trainer["args"][0] == "-c" and trainer["args"][-4:] == ["python", "train.py", "--lr", "0.1"]


def test_a_job_name_starting_with_a_digit_gets_a_letter_first(tmp_path):
    job = tmp_path / "3d-unet.yaml"
    job.write_text("image: reg/app:1\ncommand: [run]\n")
    body = build_manifest(load_job(str(job)), kind="trainjob", nnodes=1).body
    assert body["metadata"]["name"] == "job-3d-unet"


# --------------------------------------------------------------------------- the wrappers, run

def _run_pod(args: list[str], env: dict[str, str], pod_env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """``args`` (with ``env`` entries) as the kubelet runs them: $(VAR) expanded from the
    container's env (its entries, then the operator's ``pod_env``), in a real /bin/sh."""
    values = {e["name"]: kube_expand(e["value"], {}) for e in env if "value" in e}
    values.update({e["name"]: "pod-7" for e in env if "fieldRef" in e.get("valueFrom", {})})
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **values, **pod_env}
    argv = [kube_expand(a, full) for a in args]
    return subprocess.run(argv, env=full, cwd=cwd, capture_output=True, text=True, timeout=60)


def _job(tmp_path: Path, text: str) -> str:
    path = tmp_path / "wjob.yaml"
    path.write_text(text)
    return str(path)


def test_trainjob_workdir_and_per_pod_variables_reach_the_program(tmp_path):
    """deepspeed's CROSS_RANK ({node_rank}) and a job env value mixing a per-pod placeholder
    with quotes and dollars: the wrapper gives the program exactly what an SSH launch would."""
    work = tmp_path / "code dir"
    work.mkdir()
    job = _job(tmp_path, f"target: nccl\ncontract: deepspeed\nnproc_per_node: 2\n"
                         f"docker_args: [-w, '{work}']\n"
                         "env: {MIX: \"it's $(HOME) $$ rank={node_rank} at {master_addr}:{master_port} n={nnodes}\"}\n"
                         "command: [sh, -c, 'pwd; env']\n")
    body = build_manifest(load_job(job), kind="trainjob", nnodes=4).body
    trainer = body["spec"]["trainer"]
    assert schema_errors(body) == []
    assert not {"CROSS_RANK", "MIX"} & {e["name"] for e in trainer["env"]}
    pod = {"PET_NNODES": "4", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "3",
           "PET_MASTER_ADDR": "wjob-node-0-0.wjob", "PET_MASTER_PORT": "29400"}
    done = _run_pod(trainer["args"], trainer["env"], pod, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str(work)
    seen = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    assert seen["CROSS_RANK"] == "3" and seen["NODE_RANK"] == "3" and seen["CROSS_SIZE"] == "4"
    assert seen["MIX"] == "it's $(HOME) $$ rank=3 at wjob-node-0-0.wjob:29400 n=4"


def test_trainjob_workdir_that_does_not_exist_fails_before_the_command(tmp_path):
    job = _job(tmp_path, f"target: cpu\ndocker_args: [-w, '{tmp_path}/missing']\n"
                         f"command: [touch, '{tmp_path}/ran']\n")
    trainer = build_manifest(load_job(job), kind="trainjob", nnodes=1).body["spec"]["trainer"]
    done = _run_pod(trainer["args"], trainer["env"], {"PET_NODE_RANK": "0"}, tmp_path)
    assert done.returncode != 0 and not (tmp_path / "ran").exists()


@pytest.mark.skipif(shutil.which("python3") is None, reason="the mpi spawner runs with python3")
@pytest.mark.parametrize("kind", KINDS)
def test_mpi_contract_starts_the_node_processes_with_hydra_ranks(tmp_path, kind):
    job = _job(tmp_path, "target: ipex\ncontract: mpi\nnproc_per_node: 3\n"
                         "command: [sh, -c, 'echo $PMI_RANK $MPI_LOCALRANKID $PMI_SIZE $MPI_LOCALNRANKS "
                         "$PMI_HOSTNAME ${{RANK-none}} ${{WORLD_SIZE-none}}']\n")
    body = build_manifest(load_job(job), kind=kind, nnodes=2).body
    assert schema_errors(body) == []
    c = body["spec"]["trainer"] if kind == "trainjob" else \
        body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    operator = {"PET_NODE_RANK": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "3"}
    if kind == "pytorchjob":       # the training operator's node-level RANK / WORLD_SIZE
        operator |= {"RANK": "1", "WORLD_SIZE": "6", "MASTER_ADDR": "wjob-master-0", "MASTER_PORT": "23456"}
    done = _run_pod(c["args"], c["env"], operator, tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"{3 + i} {i} 6 3 pod-7 none none" for i in range(3)]


def test_a_secret_that_differs_per_pod_is_refused_unshown(tmp_path):
    job = _job(tmp_path, "image: reg/app:1\nenv: {MY_TOKEN: 'tok-{node_rank}'}\ncommand: [run]\n")
    with pytest.raises(UserError, match="MY_TOKEN is a secret and differs per pod") as info:
        build_manifest(load_job(job), kind="pytorchjob", nnodes=2)
    assert "tok-" not in info.value.message and info.value.exit_code == 2


# --------------------------------------------------------------------------- a real API server

@pytest.mark.skipif(not os.environ.get("KUBECONFIG") or not shutil.which("kubectl"),
                    reason="opt-in: set KUBECONFIG (a cluster with the Kubeflow CRDs) and have kubectl")
def test_every_shipped_job_applies_with_kubectl_server_dry_run(tmp_path):
    """What a site runs to check for itself: the API server validates (and would prune)
    each manifest without creating it. One test, every job and kind, every failure listed."""
    failures = []
    for job in SHIPPED:
        for kind in KINDS:
            path = tmp_path / f"{job}.{kind}.yaml"
            path.write_text(build_manifest(load_job(job), kind=kind, nnodes=2, slots=2).text())
            done = subprocess.run(["kubectl", "apply", "--dry-run=server", "-f", str(path)],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode != 0 or "Warning: unknown field" in done.stderr:
                failures.append(f"{job} --to {kind}: {done.stderr.strip()}")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- recovery (issue 22)

RECOVERY = {"max_restarts": 2, "retry_on_exit": [138, 75], "fatal_on_exit": [3],
            "checkpoint": "/shared/ckpt"}


@pytest.mark.parametrize("keys", [{"max_restarts": 2}, RECOVERY], ids=["restarts", "all-keys"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("job", SHIPPED)
def test_every_shipped_job_with_recovery_keys_validates_against_the_crd(job, kind, keys):
    body = yaml.safe_load(build_manifest(load_job(job, keys), kind=kind, nnodes=3, slots=2).text())
    assert schema_errors(body) == []
    if kind == "pytorchjob":
        policies = {r["restartPolicy"] for r in body["spec"]["pytorchReplicaSpecs"].values()}
        assert policies == ({"ExitCode"} if "retry_on_exit" in keys else {"OnFailure"})
        assert body["spec"]["runPolicy"]["backoffLimit"] == 2


def test_the_runtime_fields_the_trainjob_notes_name_are_the_runtimes():
    """What a TrainJob's notes ask of the ClusterTrainingRuntime (JobSet failurePolicy
    maxRestarts and a rule on PodFailurePolicy failures; a podFailurePolicy on exit codes in
    the node job) is a valid runtime, and a TrainJob itself has none of it."""
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "torch-restarts"},
               "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                        "template": {"spec": {
                            "failurePolicy": {"maxRestarts": 2, "rules": [
                                {"name": "fatalExitCodes", "action": "FailJobSet",
                                 "onJobFailureReasons": ["PodFailurePolicy"]}]},
                            "replicatedJobs": [{"name": "node", "template": {"spec": {
                                "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
                                    "containerName": "node", "operator": "In", "values": [3]}}]},
                                "template": {"spec": {"restartPolicy": "Never", "containers": [
                                    {"name": "node", "image": "x"}]}}}}}]}}}}
    assert schema_errors(runtime) == []
    body = _body("ddp-smoke", "trainjob", {"nnodes": 2})
    body["spec"]["failurePolicy"] = {"maxRestarts": 2}
    assert any("'failurePolicy' was unexpected" in e for e in schema_errors(body))


# --------------------------------------------------------------------------- image by digest, pull Secret

PINNED = "registry.example:5000/team/cpu@sha256:" + "c" * 64


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("job", ["ddp-smoke", "bert"])
def test_a_pinned_image_and_a_pull_secret_validate_in_the_pod_spec(job, kind):
    """imagePullSecrets where each CRD has a pod spec: a PyTorchJob replica's template, a
    TrainJob's runtime patch of the node pods (Trainer 2.3; the TrainJob spec has none)."""
    body = _body(job, kind, {"nnodes": 2, "image": PINNED, "pull_secret": f"{job}-registry",
                             "registry_server": "registry.example:5000"})
    assert schema_errors(body) == []
    if kind == "pytorchjob":
        pods = [r["template"]["spec"] for r in body["spec"]["pytorchReplicaSpecs"].values()]
        assert body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["image"] == PINNED
    else:
        assert body["spec"]["trainer"]["image"] == PINNED
        pods = [j["template"]["spec"]["template"]["spec"] for p in body["spec"]["runtimePatches"]
                for j in p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
    assert pods and all(p["imagePullSecrets"] == [{"name": f"{job}-registry"}] for p in pods)


def test_a_job_with_nothing_else_to_patch_gets_a_patch_for_its_pull_secret_alone(tmp_path):
    job = tmp_path / "plain.yaml"
    job.write_text("image: reg.example/app:1\ncommand: [run]\n")
    manifest = build_manifest(load_job(str(job)), kind="trainjob", nnodes=1, pull_secret="pull")
    (patch,) = manifest.body["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["template"]["spec"] == {"imagePullSecrets": [{"name": "pull"}]}
    assert schema_errors(manifest.body) == []
    assert manifest.pull_secret_command() == ("kubectl create secret docker-registry pull "
                                              "--docker-server=reg.example --docker-username=... "
                                              "--docker-password=...")


@pytest.mark.parametrize(("kind", "misplace"), [
    ("trainjob", lambda b: b["spec"]["trainer"].__setitem__("imagePullSecrets", [{"name": "p"}])),
    ("trainjob", lambda b: b["spec"].__setitem__("imagePullSecrets", [{"name": "p"}])),
    ("pytorchjob", lambda b: b["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
     .__setitem__("imagePullSecrets", [{"name": "p"}])),
])
def test_a_pull_secret_in_the_wrong_place_is_caught(kind, misplace):
    body = _body("ddp-smoke", kind, {"nnodes": 2})
    misplace(body)
    assert any("'imagePullSecrets' was unexpected" in e for e in schema_errors(body))


def test_a_bad_pull_secret_name_is_refused():
    with pytest.raises(UserError, match="--pull-secret 'Bad_Name': not a Kubernetes Secret name"):
        build_manifest(load_job("ddp-smoke"), kind="pytorchjob", nnodes=1, pull_secret="Bad_Name")
