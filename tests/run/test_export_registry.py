"""Images by digest where a machine reads them (issue 23, item 3) and imagePullSecrets
(item 4), against a real registry: Distribution on loopback (tests/fixtures/registry.py),
a tiny image pushed to it by the local Docker engine.

* ``export --registry`` names the image ``127.0.0.1:PORT/NAME@sha256:X``, X the digest the
  push reported, and the manifest still validates against the official CRDs; an image not
  pushed there is exit 2 naming the image, the registry and the push command, nothing written;
* ``imagePullSecrets`` iff the Docker config (a temporary DOCKER_CONFIG) has credentials for
  the registry, and no credential text anywhere in stdout, stderr or the manifest;
* ``launch --scheduler slurm --dry-run`` with an inventory's ``registry:`` names the same
  digest, docker and pyxis (enroot's ``REGISTRY#IMAGE@DIGEST``) alike.
"""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster.registry import lookup
from clusterctl.cluster.registry.reference import Registry
from clusterctl.core.errors import UserError
from tests.fixtures.k8s_schema import schema_errors

KINDS = ("pytorchjob", "trainjob")
USER, PASSWORD = "regbot-user", "s3cret-pw-never-shown"
AUTH = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


@pytest.fixture
def docker_config(tmp_path, monkeypatch):
    """An empty DOCKER_CONFIG directory of this test's own; write(config) fills it."""
    home = tmp_path / "docker-config"
    home.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(home))

    def write(config: dict | str) -> None:
        (home / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return write


def _export(*args: str):
    return CliRunner().invoke(app, ["export", *args])


def _pods(body: dict) -> list[dict]:
    """The pod specs of a manifest that may carry imagePullSecrets."""
    if body["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in body["spec"]["pytorchReplicaSpecs"].values()]
    return [j["template"]["spec"]["template"]["spec"] for p in body["spec"].get("runtimePatches", [])
            for j in p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]


def _image(body: dict) -> str:
    if body["kind"] == "TrainJob":
        return body["spec"]["trainer"]["image"]
    return body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["image"]


@pytest.mark.parametrize("kind", KINDS)
def test_export_names_the_image_by_the_digest_the_push_reported(kind, pushed_image, docker_config,
                                                                tmp_path):
    reg = pushed_image.registry
    out = tmp_path / "m.yaml"
    res = _export("ddp-smoke", "--to", kind, "--nnodes", "2", "--image", pushed_image.image,
                  "--registry", str(reg), "-o", str(out))
    assert res.exit_code == 0, res.output
    body = yaml.safe_load(out.read_text())
    name = pushed_image.image.split(":")[0].rsplit("/", 1)[-1]
    assert _image(body) == f"127.0.0.1:{reg.port}/{name}@{pushed_image.digest}"
    assert schema_errors(body) == []
    # no credentials for it in the (empty) Docker config: no pull Secret
    assert all("imagePullSecrets" not in pod for pod in _pods(body))
    assert "docker-registry" not in res.stderr


def test_a_namespace_of_the_registry_is_part_of_the_reference(pushed_image, docker_config):
    """The same engine record, asked for NS in that registry: not pushed there, exit 2."""
    res = _export("ddp-smoke", "--to", "pytorchjob", "--nnodes", "1", "--image", pushed_image.image,
                  "--registry", f"{pushed_image.registry}/team")
    assert res.exit_code == 2, res.output
    assert f"{pushed_image.registry}/team/" in res.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_an_image_not_pushed_there_is_exit_2_naming_the_push_command(kind, local_registry,
                                                                     unpushed_image, docker_config,
                                                                     tmp_path):
    out = tmp_path / "m.yaml"
    res = _export("ddp-smoke", "--to", kind, "--nnodes", "2", "--image", unpushed_image,
                  "--registry", str(local_registry), "-o", str(out))
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert f"clusterctl push {unpushed_image} --registry {local_registry}" in res.stderr
    assert unpushed_image in res.stderr and str(local_registry) in res.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "docker-config"]


@pytest.mark.docker   # it asks the engine, which answers that it lacks the image
def test_an_image_not_in_the_engine_is_exit_2(local_registry, docker_config):
    res = _export("ddp-smoke", "--to", "trainjob", "--nnodes", "1", "--image",
                  "clusterctl-test/no-such-image:never", "--registry", str(local_registry))
    assert res.exit_code == 2, res.output
    assert "is not in this machine's Docker engine" in res.stderr
    assert f"clusterctl push clusterctl-test/no-such-image:never --registry {local_registry}" in res.stderr


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("key", ["{addr}", "https://{addr}", "http://{addr}/v1/"])
def test_pull_secret_iff_the_docker_config_has_credentials_and_none_shown(kind, key, pushed_image,
                                                                          docker_config, tmp_path):
    reg = pushed_image.registry
    docker_config({"auths": {key.format(addr=reg.address): {"auth": AUTH}},
                   "HttpHeaders": {"User-Agent": "x"}})
    out = tmp_path / "m.yaml"
    res = _export("ddp-smoke", "--to", kind, "--nnodes", "2", "-n", "ml", "--image", pushed_image.image,
                  "--registry", str(reg), "-o", str(out))
    assert res.exit_code == 0, res.output
    text = out.read_text()
    body = yaml.safe_load(text)
    assert schema_errors(body) == []
    pods = _pods(body)
    assert pods and all(pod["imagePullSecrets"] == [{"name": "ddp-smoke-registry"}] for pod in pods)
    assert (f"kubectl create secret docker-registry ddp-smoke-registry -n ml "
            f"--docker-server={reg.address} --docker-username=... --docker-password=...") in res.stderr
    for secret in (USER, PASSWORD, AUTH):
        assert secret not in res.stdout and secret not in res.stderr and secret not in text


def test_cred_helpers_count_other_registries_do_not(pushed_image, docker_config):
    reg = pushed_image.registry
    docker_config({"auths": {"127.0.0.1:1": {"auth": AUTH}, "registry.example": {}},
                   "credsStore": "pass"})
    assert lookup.has_credentials(reg) is False
    res = _export("ddp-smoke", "--to", "pytorchjob", "--nnodes", "1", "--image", pushed_image.image,
                  "--registry", str(reg))
    assert res.exit_code == 0, res.output
    assert "imagePullSecrets" not in res.stdout
    docker_config({"credHelpers": {reg.address: "secretservice"}})
    assert lookup.has_credentials(reg) is True


def test_pull_secret_name_can_be_given_and_is_checked(pushed_image, docker_config):
    docker_config({"auths": {pushed_image.registry.address: {"auth": AUTH}}})
    args = ("ddp-smoke", "--to", "pytorchjob", "--nnodes", "1", "--image", pushed_image.image,
            "--registry", str(pushed_image.registry))
    res = _export(*args, "--pull-secret", "team-pull")
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(res.stdout)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "imagePullSecrets"] == [{"name": "team-pull"}]
    res = _export(*args, "--pull-secret", "Team_Pull")
    assert res.exit_code == 2 and "--pull-secret 'Team_Pull': not a Kubernetes Secret name" in res.stderr


def test_a_docker_config_that_is_not_json_is_exit_2_naming_it(local_registry, docker_config,
                                                             pushed_image):
    docker_config('{"auths": {')
    res = _export("ddp-smoke", "--to", "pytorchjob", "--nnodes", "1", "--image", pushed_image.image,
                  "--registry", str(local_registry))
    assert res.exit_code == 2, res.output
    assert "config.json: line 1: not JSON" in res.stderr


def test_an_unreachable_engine_is_a_clear_exit_2(local_registry, monkeypatch, docker_config):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/clusterctl-test/docker.sock")
    res = _export("ddp-smoke", "--to", "pytorchjob", "--nnodes", "1", "--registry", str(local_registry))
    assert res.exit_code == 2, res.output
    assert "does not answer" in res.stderr and "Traceback" not in res.output


def test_an_image_already_pinned_there_needs_no_engine(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/clusterctl-test/docker.sock")
    reg = Registry("registry.example", 5000, "team")
    ref = "registry.example:5000/team/cpu@sha256:" + "a" * 64
    assert lookup.pinned_reference(ref, reg) == ref
    with pytest.raises(UserError, match="pinned by digest but not in the registry"):
        lookup.pinned_reference("other.example/cpu@sha256:" + "a" * 64, reg)


def test_a_bad_registry_address_is_exit_2():
    res = _export("ddp-smoke", "--to", "pytorchjob", "--nnodes", "1", "--registry", "https://r.example")
    assert res.exit_code == 2 and "--registry: 'https://r.example' has a scheme" in res.stderr


# --------------------------------------------------------------------------- Slurm

@pytest.mark.parametrize("container", ["docker", "pyxis"])
def test_slurm_dry_run_names_the_digest(container, pushed_image, tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    reg = pushed_image.registry
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"registry: {reg}\nnodes:\n  - {{name: n1, host: 10.99.0.1}}\n"
                   "  - {name: n2, host: 10.99.0.2}\n")
    res = CliRunner().invoke(app, ["launch", "ddp-smoke", "--scheduler", "slurm", "--nodes", str(inv),
                                   "--container", container, "--image", pushed_image.image, "--dry-run"])
    assert res.exit_code == 0, res.output
    name = pushed_image.image.split(":")[0].rsplit("/", 1)[-1]
    if container == "pyxis":
        assert f"--container-image={reg.address}#{name}@{pushed_image.digest}" in res.stdout
    else:
        assert f"{reg.address}/{name}@{pushed_image.digest}" in res.stdout
    assert pushed_image.image not in res.stdout      # never the local tag


def test_slurm_dry_run_refuses_an_image_not_pushed_there(local_registry, unpushed_image, tmp_path,
                                                         monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"registry: {local_registry}\nnodes:\n  - {{name: n1, host: 10.99.0.1}}\n")
    res = CliRunner().invoke(app, ["launch", "ddp-smoke", "--scheduler", "slurm", "--nodes", str(inv),
                                   "--image", unpushed_image, "--dry-run"])
    assert res.exit_code == 2, res.output
    assert f"clusterctl push {unpushed_image} --registry {local_registry}" in res.stderr
    assert "#!/bin/bash" not in res.stdout
