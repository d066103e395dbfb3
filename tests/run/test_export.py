"""Kubernetes manifests of a job (clusterctl.run.export): golden files, and validation with the
official model packages (kubernetes, kubeflow-training, kubeflow-trainer-api).

No API server runs here: the models are the schema, and a manifest must survive a round trip
through them unchanged (an unknown or misspelt field would be dropped and show as a
difference).  Rewrite the golden files after a reviewed change with
``UPDATE_GOLDEN=1 python -m pytest tests/run/test_export.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clusterctl.core.errors import UserError
from clusterctl.run.export import OPERATOR_ENV, build_manifest, docker_size, pod_settings
from clusterctl.run.jobs import load_job
from tests.fixtures.golden import matches_golden

GOLDEN_DIR = Path(__file__).parent / "golden"

# (golden file, job, kind, options)
VARIANTS = [
    ("ddp-smoke.pytorchjob.yaml", "ddp-smoke", "pytorchjob", {"nnodes": 3}),
    ("ddp-smoke.trainjob.yaml", "ddp-smoke", "trainjob", {"nnodes": 3}),
    ("bert.pytorchjob.yaml", "bert", "pytorchjob",
     {"nnodes": 4, "slots": 8, "overrides": {"BERT_DIR": "/data/BERT", "PHASE": "2"}}),
    ("bert.trainjob.yaml", "bert", "trainjob",
     {"nnodes": 4, "slots": 8, "overrides": {"BERT_DIR": "/data/BERT", "PHASE": "2"}}),
]


def _manifest(job, kind, options):
    return build_manifest(load_job(job), kind=kind, **options)


@pytest.mark.parametrize(("golden", "job", "kind", "options"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_manifest_matches_golden(golden, job, kind, options):
    matches_golden(GOLDEN_DIR, golden, _manifest(job, kind, options).text(), f"{kind} of {job}")


class _Response:
    """What the generated ApiClient.deserialize reads: a response with JSON in ``data``."""

    def __init__(self, obj: dict):
        self.data = json.dumps(obj)


def _round_trip_kubernetes(client, obj: dict, klass: str) -> dict:
    return client.sanitize_for_serialization(client.deserialize(_Response(obj), klass))


@pytest.mark.parametrize(("golden", "job", "kind", "options"),
                         [v for v in VARIANTS if v[2] == "pytorchjob"], ids=lambda v: str(v))
def test_pytorchjob_validates_against_models_no_cluster(golden, job, kind, options):
    from kubeflow.training import ApiClient as TrainingClient
    from kubernetes.client import ApiClient

    body = yaml.safe_load(_manifest(job, kind, options).text())
    assert (body["apiVersion"], body["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert _round_trip_kubernetes(TrainingClient(), body, "KubeflowOrgV1PyTorchJob") == body
    for replica in body["spec"]["pytorchReplicaSpecs"].values():
        template = replica["template"]
        assert _round_trip_kubernetes(ApiClient(), template, "V1PodTemplateSpec") == template
    assert sum(r["replicas"] for r in body["spec"]["pytorchReplicaSpecs"].values()) == options["nnodes"]


@pytest.mark.parametrize(("golden", "job", "kind", "options"),
                         [v for v in VARIANTS if v[2] == "trainjob"], ids=lambda v: str(v))
def test_trainjob_validates_against_models_no_cluster(golden, job, kind, options):
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
    from kubernetes.client import ApiClient

    body = yaml.safe_load(_manifest(job, kind, options).text())
    assert (body["apiVersion"], body["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert TrainerV1alpha1TrainJob.from_dict(body).to_dict() == body
    trainer = body["spec"]["trainer"]
    assert trainer["numNodes"] == options["nnodes"]
    for env in trainer["env"]:
        assert _round_trip_kubernetes(ApiClient(), env, "V1EnvVar") == env


def test_model_round_trip_catches_a_misspelt_field_no_cluster():
    """The check above is worth something: a field the models do not know is dropped."""
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
    from kubernetes.client import ApiClient

    body = yaml.safe_load(_manifest("ddp-smoke", "trainjob", {"nnodes": 2}).text())
    body["spec"]["trainer"]["numNode"] = 2
    assert TrainerV1alpha1TrainJob.from_dict(body).to_dict() != body
    template = yaml.safe_load(_manifest("ddp-smoke", "pytorchjob", {"nnodes": 2}).text())[
        "spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    template["spec"]["hostNetwrok"] = True
    assert _round_trip_kubernetes(ApiClient(), template, "V1PodTemplateSpec") != template


# --------------------------------------------------------------------------- contents

def _container(body: dict) -> dict:
    if body["kind"] == "PyTorchJob":
        return body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return body["spec"]["trainer"]


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_rank_variables_are_left_to_the_operator(kind):
    body = _manifest("ddp-smoke", kind, {"nnodes": 3}).body
    names = {e["name"] for e in _container(body)["env"]}
    assert not names & {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "NODE_RANK"}
    assert not any(n.startswith("PET_") for n in names)
    assert {"NNODES", "NPROC_PER_NODE", "DDP_SMOKE_STEPS", "OMP_NUM_THREADS"} <= names
    args = _container(body)["args"]
    assert "--node-rank=$(PET_NODE_RANK)" in args
    addr = "$(MASTER_ADDR)" if kind == "pytorchjob" else "$(PET_MASTER_ADDR)"
    assert f"--master-addr={addr}" in args
    assert addr.strip("$()") in OPERATOR_ENV[kind]


def test_pytorchjob_master_and_workers_and_host_network():
    spec = _manifest("ddp-smoke", "pytorchjob", {"nnodes": 3}).body["spec"]
    assert spec["nprocPerNode"] == "2"
    assert spec["pytorchReplicaSpecs"]["Master"]["replicas"] == 1
    assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    pod = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in pod["volumes"]
    one = _manifest("ddp-smoke", "pytorchjob", {"nnodes": 1}).body["spec"]["pytorchReplicaSpecs"]
    assert list(one) == ["Master"]


def test_bert_gpus_rdma_memlock_mounts_and_contract():
    m = _manifest("bert", "pytorchjob", {"nnodes": 2, "slots": 8, "overrides": {"BERT_DIR": "/data/BERT"}})
    c = _container(m.body)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/hca": "1"}
    assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    pod = m.body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert {"name": "mount-0", "hostPath": {"path": "/data/BERT"}} in pod["volumes"]
    assert {"name": "mount-0", "mountPath": "/workspace/BERT"} in c["volumeMounts"]
    # accl-bert: WORLD_SIZE counts nodes, so the operator's replicas x nprocPerNode must be nodes
    assert m.body["spec"]["nprocPerNode"] == "1"
    assert {"name": "NPROC_PER_NODE", "value": "8"} in c["env"]
    assert any("memlock" in n for n in m.notes)


def test_trainjob_says_what_it_cannot_express():
    m = _manifest("bert", "trainjob", {"nnodes": 2, "slots": 4})
    assert m.body["spec"]["trainer"]["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "4", "rdma/hca": "1"}}
    text = m.text()
    assert "a TrainJob cannot set hostNetwork" in text
    assert "RANK=$PET_NODE_RANK, WORLD_SIZE=$PET_NNODES" in text      # derived, not a warning
    assert "WARNING" not in text
    patch = m.body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["name"] == "node"


# Trainer's torch plugin (pkg/runtime/framework/plugins/torch/torch.go) sets exactly these
# in the `node` container of pod N of a TrainJob named bert with numNodes 4:
TRAINER_POD_ENV = {"PET_NNODES": "4", "PET_NPROC_PER_NODE": "8", "PET_NODE_RANK": "2",
                   "PET_MASTER_ADDR": "bert-node-0-0.bert", "PET_MASTER_PORT": "29400"}


def test_exported_bert_trainjob_runs_as_is_with_only_the_trainer_env_no_cluster(tmp_path):
    """The exported args run in a real /bin/sh with the environment Trainer gives a pod (no
    RANK, WORLD_SIZE, MASTER_ADDR): the program sees the accl-bert contract, derived from PET_*.
    The job's command is replaced by `env` (what the program would read); no cluster here."""
    import os
    import subprocess

    m = _manifest("bert", "trainjob", {"nnodes": 4, "slots": 8, "overrides": {"BERT_DIR": "/data/BERT"}})
    trainer = m.body["spec"]["trainer"]
    args = trainer["args"]
    assert args[-1] == "/workspace/BERT/run_pretraining.sh"      # the job's command, unchanged, last
    pod_env = {e["name"]: e["value"] for e in trainer["env"] if "value" in e}
    run = [*args[:-1], "env"]                                    # what run_pretraining.sh would see
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **pod_env, **TRAINER_POD_ENV}
    seen = dict(line.split("=", 1) for line in subprocess.run(
        run, env=env, capture_output=True, text=True, check=True).stdout.splitlines() if "=" in line)
    assert {k: seen[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK",
                                  "NPROC_PER_NODE")} == {
        "RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "bert-node-0-0.bert", "MASTER_PORT": "29400",
        "NODE_RANK": "2", "NPROC_PER_NODE": "8"}
    # an argument with spaces and quotes reaches the program as one word (exec "$@", no re-parse)
    odd = subprocess.run([*args[:-1], "printf", "%s|", "a b", "'c'"], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert odd == "a b|'c'|"


def test_pytorchjob_command_is_not_wrapped_the_operator_sets_rank_and_world_size():
    args = _container(_manifest("bert", "pytorchjob", {"nnodes": 2, "slots": 8}).body)["args"]
    assert args == ["/workspace/BERT/run_pretraining.sh"]


def _job(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_secrets_are_references_never_values(tmp_path):
    job = load_job(_job(tmp_path, "image: reg/app:1\nsecrets: [HF_TOKEN]\ncommand: [python, train.py]\n"))
    m = build_manifest(job, kind="pytorchjob", nnodes=2)
    env = _container(m.body)["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "job-secrets", "key": "HF_TOKEN"}}} in env
    assert m.secret_name == "job-secrets" and m.secret_keys == ("HF_TOKEN",) and m.secret_given == {}
    assert m.secret_command() == "kubectl create secret generic job-secrets --from-literal=HF_TOKEN=..."
    assert m.secret_command() in " ".join(m.text().replace("# ", "").split())


@pytest.mark.parametrize("where", ["job", "set"])
@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_a_secret_value_becomes_a_reference_and_is_written_nowhere(tmp_path, where, kind):
    env = "env: {API_KEY: s3cr3t-value, PLAIN: x}\n" if where == "job" else ""
    job = load_job(_job(tmp_path, f"image: reg/app:1\n{env}command: [run]\n"))
    overrides = {"API_KEY": "s3cr3t-value"} if where == "set" else {}
    m = build_manifest(job, kind=kind, nnodes=2, overrides=overrides, namespace="ml")
    env = _container(m.body)["env"]
    assert {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "job-secrets", "key": "API_KEY"}}} in env
    assert "s3cr3t" not in m.text() and "s3cr3t" not in repr(m)
    assert m.secret_command() == "kubectl create secret generic job-secrets -n ml --from-literal=API_KEY=..."
    assert m.secret_given == {"API_KEY": "--set API_KEY=..." if where == "set" else job.where("env.API_KEY")}


def test_a_secret_parameter_copied_into_another_variable_makes_it_a_reference(tmp_path):
    job = load_job(_job(tmp_path, "image: reg/app:1\nparams: {HF_TOKEN: ''}\n"
                                  "env: {AUTH: 'Bearer {HF_TOKEN}', OTHER: plain}\ncommand: [run]\n"))
    m = build_manifest(job, kind="trainjob", nnodes=1, overrides={"HF_TOKEN": "hf_tainted"})
    assert "hf_tainted" not in m.text()
    assert m.secret_keys == ("AUTH",)
    assert {"name": "OTHER", "value": "plain"} in _container(m.body)["env"]


def test_a_secret_parameter_in_the_command_is_refused_unshown(tmp_path):
    job = load_job(_job(tmp_path, "image: reg/app:1\nparams: {HF_TOKEN: ''}\ncommand: [run, '{HF_TOKEN}']\n"))
    with pytest.raises(UserError, match="command.1: {HF_TOKEN} is a secret parameter") as e:
        build_manifest(job, kind="pytorchjob", nnodes=1, overrides={"HF_TOKEN": "hf_in_argv"})
    assert "hf_in_argv" not in e.value.message and e.value.exit_code == 2


def test_the_secret_name_is_overridable_and_checked(tmp_path):
    job = load_job(_job(tmp_path, "image: reg/app:1\nsecrets: [HF_TOKEN]\ncommand: [run]\n"))
    m = build_manifest(job, kind="trainjob", nnodes=1, secret_name="team.hf-1")
    assert _container(m.body)["env"][-1]["valueFrom"]["secretKeyRef"]["name"] == "team.hf-1"
    assert m.secret_command().startswith("kubectl create secret generic team.hf-1 ")
    for bad in ("Team", "-x", "x-", "a_b", "x" * 254, ""):
        with pytest.raises(UserError, match="--secret-name .*: not a Kubernetes Secret name; valid: lower-case") as e:
            build_manifest(job, kind="trainjob", nnodes=1, secret_name=bad)
        assert e.value.exit_code == 2
    no_secrets = build_manifest(load_job("ddp-smoke"), kind="pytorchjob", nnodes=1, secret_name="unused")
    assert no_secrets.secret_name is None and no_secrets.secret_command() is None


def test_a_device_kubernetes_cannot_express_is_refused(tmp_path):
    job = load_job(_job(tmp_path, "image: reg/app:1\ndocker_args: [--device=/dev/kfd]\ncommand: [run]\n"))
    with pytest.raises(UserError, match="device /dev/kfd cannot be expressed in Kubernetes"):
        build_manifest(job, kind="pytorchjob", nnodes=1)


def test_cambricon_devices_become_the_mlu_resource_and_ipex_asks_for_none(tmp_path):
    job = load_job(_job(tmp_path, "target: cambricon\ncommand: [run]\n"))
    limits = _container(build_manifest(job, kind="pytorchjob", nnodes=1, slots=4).body)["resources"]["limits"]
    assert limits == {"cambricon.com/mlu": "4"}
    job = load_job(_job(tmp_path, "target: ipex\ncommand: [run]\n"))
    assert "resources" not in _container(build_manifest(job, kind="pytorchjob", nnodes=1).body)


@pytest.mark.parametrize(("kind", "nnodes", "message"), [
    ("helmchart", 2, "unknown kind"), ("pytorchjob", 0, "at least 1 node")])
def test_bad_kind_or_node_count(kind, nnodes, message):
    with pytest.raises(UserError, match=message):
        build_manifest(load_job("ddp-smoke"), kind=kind, nnodes=nnodes)


def test_a_per_pod_placeholder_in_env_is_exported_by_the_wrapper(tmp_path):
    job = load_job(_job(tmp_path, "image: reg/app:1\nenv: {ME: 'n{node_rank}'}\ncommand: [run]\n"))
    m = build_manifest(job, kind="pytorchjob", nnodes=2)
    c = _container(m.body)
    assert "ME" not in {e["name"] for e in c["env"]}
    assert c["args"][:3] == ["/bin/sh", "-c", "export ME='n'\"$PET_NODE_RANK\"; exec \"$@\""]
    assert c["args"][-1] == "run" and any("ME differs per pod" in n for n in m.notes)
    mounts = load_job(_job(tmp_path, "image: reg/app:1\nmounts: ['/d{node_rank}:/d']\ncommand: [run]\n"))
    with pytest.raises(UserError, match="mounts.0: {node_rank} differs per pod"):
        build_manifest(mounts, kind="pytorchjob", nnodes=2)


def test_an_operator_variable_from_set_is_refused():
    with pytest.raises(UserError, match="MASTER_PORT is set by the trainjob operator"):
        build_manifest(load_job("ddp-smoke"), kind="trainjob", nnodes=2, overrides={"MASTER_PORT": "1"})


def test_dollar_text_reaches_the_container_as_written(tmp_path):
    job = load_job(_job(tmp_path, "image: reg/app:1\nenv: {A: '$(HOME)'}\n"
                                  "command: [sh, -c, 'echo $$ $(date)', '{node_name}']\n"))
    body = build_manifest(job, kind="pytorchjob", nnodes=1, overrides={"B": "x$$y"}).body
    c = _container(body)
    assert c["args"] == ["sh", "-c", "echo $$$ $$(date)", "$(CLUSTERCTL_POD_NAME)"]
    assert c["env"][0] == {"name": "CLUSTERCTL_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    assert {"name": "A", "value": "$$(HOME)"} in c["env"] and {"name": "B", "value": "x$$$y"} in c["env"]


def test_set_nproc_per_node_and_slots():
    m = _manifest("ddp-smoke", "trainjob", {"nnodes": 2, "overrides": {"NPROC_PER_NODE": "4"}})
    assert m.body["spec"]["trainer"]["numProcPerNode"] == 4
    assert "--nproc-per-node=4" in m.body["spec"]["trainer"]["args"]


@pytest.mark.parametrize("job", ["torchrun-nccl", "deepspeed", "yolov5-mlu"])
def test_seed_jobs_keep_their_working_directory_in_both_kinds(job):
    """The seed jobs run in their mounted code (-w), where the pages' relative paths work: a
    PyTorchJob's workingDir; a TrainJob (no field for it) cds there in its wrapper."""
    from kubernetes.client import ApiClient

    body = yaml.safe_load(_manifest(job, "pytorchjob", {"nnodes": 2, "slots": 2}).text())
    template = body["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert _round_trip_kubernetes(ApiClient(), template, "V1PodTemplateSpec") == template
    workdir = load_job(job).docker_args[load_job(job).docker_args.index("-w") + 1]
    assert template["spec"]["containers"][0]["workingDir"] == workdir
    trainer = _manifest(job, "trainjob", {"nnodes": 2, "slots": 2}).body["spec"]["trainer"]
    assert trainer["args"][2].startswith('cd "$1" || exit; shift; ')
    assert trainer["args"][3:5] == ["clusterctl-contract", workdir]


@pytest.mark.parametrize(("docker", "quantity"), [("8g", "8Gi"), ("512m", "512Mi"), ("1.5G", "1.5Gi"), ("1024", "1024")])
def test_docker_sizes_become_quantities(docker, quantity):
    assert docker_size(docker) == quantity


def test_unknown_docker_flag_is_refused():
    with pytest.raises(UserError, match="'--privileged' cannot be exported"):
        pod_settings(["--privileged"], [], slots=1)
    pod = pod_settings(["--ulimit", "stack=67108864", "--cap-add=sys_ptrace", "--gpus", "2"], [], slots=8)
    assert pod.capabilities == ["SYS_PTRACE"] and pod.resources == {"nvidia.com/gpu": "2"}
    assert any("stack=67108864" in n for n in pod.notes)


# --------------------------------------------------------------------------- recovery (issue 22)

def _recovering(tmp_path, keys: str):
    return load_job(_job(tmp_path, "image: reg/app:1\ncommand: [run]\n" + keys))


def _replicas(body: dict) -> dict:
    return body["spec"]["pytorchReplicaSpecs"]


def test_no_recovery_keys_keep_never_and_backoff_0_and_the_run_id_is_the_name():
    body = _manifest("ddp-smoke", "pytorchjob", {"nnodes": 3}).body
    assert {r["restartPolicy"] for r in _replicas(body).values()} == {"Never"}
    assert body["spec"]["runPolicy"]["backoffLimit"] == 0
    env = {e["name"]: e for e in _container(body)["env"]}
    assert env["CLUSTERCTL_RUN_ID"] == {"name": "CLUSTERCTL_RUN_ID", "value": "ddp-smoke"}
    assert "CLUSTERCTL_ATTEMPT" not in env and "CLUSTERCTL_EXCLUDED_NODES" not in env


def test_max_restarts_becomes_on_failure_and_backoff_limit(tmp_path):
    m = build_manifest(_recovering(tmp_path, "max_restarts: 3\n"), kind="pytorchjob", nnodes=4)
    assert {r["restartPolicy"] for r in _replicas(m.body).values()} == {"OnFailure"}
    assert m.body["spec"]["runPolicy"] == {"backoffLimit": 3, "cleanPodPolicy": "None"}
    text = " ".join(m.notes)     # the YAML header says them
    assert "restartPolicy OnFailure, runPolicy.backoffLimit 3" in text
    assert "counts up to 4 (one per pod) against the 3" in text
    assert "CLUSTERCTL_ATTEMPT is not set" in text
    assert "CLUSTERCTL_ATTEMPT" not in {e["name"] for e in _container(m.body)["env"]}


def test_exit_code_lists_become_exit_code_and_what_cannot_map_is_said(tmp_path):
    m = build_manifest(_recovering(tmp_path, "max_restarts: 2\nretry_on_exit: [138, 75]\n"
                                              "fatal_on_exit: [2, 143]\n"),
                       kind="pytorchjob", nnodes=2)
    assert {r["restartPolicy"] for r in _replicas(m.body).values()} == {"ExitCode"}
    assert m.body["spec"]["runPolicy"]["backoffLimit"] == 2
    text = " ".join(m.notes)     # the YAML header says them
    assert "recreates a pod that exited 130, 137, 138, 143 and fails the job on any other code" in text
    assert ("Not expressible under ExitCode: retry_on_exit 75 (the operator fails the job on it; "
            "exit 138 to be retried); fatal_on_exit 143 (the operator retries it)") in text
    assert "kubeflow/trainer#2045" in text
    assert "retry_on_exit 138" not in text.split("Not expressible")[1]     # 138 maps
    # retry codes alone (no counted restarts): no backoffLimit of 0 that would end it at once
    only = build_manifest(_recovering(tmp_path, "retry_on_exit: [137]\n"), kind="pytorchjob", nnodes=2)
    assert only.body["spec"]["runPolicy"]["backoffLimit"] == 100
    assert {r["restartPolicy"] for r in _replicas(only.body).values()} == {"ExitCode"}


def test_trainjob_restarts_are_the_runtimes_the_attempt_is_jobsets(tmp_path):
    m = build_manifest(_recovering(tmp_path, "max_restarts: 2\nfatal_on_exit: [3]\n"),
                       kind="trainjob", nnodes=2, runtime="torch-hostnet")
    spec = m.body["spec"]
    assert set(spec) == {"runtimeRef", "trainer"}             # no field of its own for restarts
    text = " ".join(m.notes)     # the YAML header says them
    assert ("set spec.template.spec.failurePolicy.maxRestarts: 2 in the ClusterTrainingRuntime "
            "torch-hostnet") in text
    assert "podFailurePolicy rule (onExitCodes, action FailJob)" in text
    env = {e["name"]: e for e in spec["trainer"]["env"]}
    assert env["CLUSTERCTL_ATTEMPT"]["valueFrom"] == {"fieldRef": {
        "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"}}


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_checkpoint_is_a_host_path_at_the_same_path_and_named(tmp_path, kind):
    m = build_manifest(_recovering(tmp_path, "checkpoint: /shared/ckpt\n"), kind=kind, nnodes=2)
    if kind == "pytorchjob":
        pod = _replicas(m.body)["Worker"]["template"]["spec"]
        mounts = pod["containers"][0]["volumeMounts"]
    else:
        pod = m.body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
            "replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "checkpoint", "hostPath": {"path": "/shared/ckpt"}} in pod["volumes"]
    assert {"name": "checkpoint", "mountPath": "/shared/ckpt"} in mounts
    assert {"name": "CLUSTERCTL_CHECKPOINT_DIR", "value": "/shared/ckpt"} in _container(m.body)["env"]
    assert "every Kubernetes node needs the same shared storage there" in " ".join(m.notes)


def test_a_checkpoint_where_a_mount_is_is_refused(tmp_path):
    job = _recovering(tmp_path, "checkpoint: /data\nmounts: ['/srv/data:/data']\n")
    with pytest.raises(UserError, match="checkpoint: /data is also the container path of a mount") as e:
        build_manifest(job, kind="pytorchjob", nnodes=1)
    assert e.value.exit_code == 2


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_recovery_manifests_validate_against_the_models_no_cluster(tmp_path, kind):
    from kubeflow.training import ApiClient as TrainingClient
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
    job = _recovering(tmp_path, "max_restarts: 2\nretry_on_exit: [138]\ncheckpoint: /shared/ckpt\n")
    body = yaml.safe_load(build_manifest(job, kind=kind, nnodes=3).text())
    if kind == "pytorchjob":
        assert _round_trip_kubernetes(TrainingClient(), body, "KubeflowOrgV1PyTorchJob") == body
    else:
        assert TrainerV1alpha1TrainJob.from_dict(body).to_dict() == body
