"""`clusterctl targets | render | build` through typer's CliRunner.

Bad input must give one message, exit 2, no traceback, and nothing in
dockerfiles/.  The docker-marked tests build the real `cpu` image on the local
engine and look inside it.
"""

from __future__ import annotations

import hashlib
import traceback
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from clusterctl.cli import app
from clusterctl.core.paths import examples_dir
from clusterctl.image import targets, wheelhouse
from clusterctl.image.imagebuild import run_smoke
from clusterctl.image.render import dockerfile_text
from tests.fixtures.images import CPU_TEST_TAG

runner = CliRunner()


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch) -> None:
    """Plain lines, as in a pipe or CI log (in_tmp, tests/fixtures/workdir.py, gives each test its cwd)."""
    monkeypatch.setenv("CLUSTERCTL_PLAIN", "1")


def _refused(result: Result) -> str:
    """The output of a command that must have stopped with one message and exit 2, no traceback.

    CliRunner catches what the command raises: a refusal is a SystemExit(2)
    (ClusterctlError turned into a message and an exit status); anything else
    escaped the CLI's error handling and would have been a traceback.
    """
    text = result.output
    if not isinstance(result.exception, SystemExit):
        shown = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else "no exception"
        pytest.fail(f"expected one message and exit 2, got {result.exception!r}:\n{shown}\n"
                    f"output:\n{text}", pytrace=False)
    assert result.exception.code == 2 and result.exit_code == 2, text
    assert "Traceback" not in text, text
    assert text.count("error:") == 1, text
    return text


def _bad(args: list[str], *fragments: str, cwd: Path) -> str:
    text = _refused(runner.invoke(app, args))
    for f in fragments:
        assert f in text, f"{f!r} not in:\n{text}"
    assert not (cwd / "dockerfiles").exists(), "a refused command wrote into dockerfiles/"
    return text


@pytest.mark.parametrize("command", ["render", "build"])
def test_unknown_target(in_tmp, command):
    _bad([command, "--target", "ipx"], 'unknown target "ipx"', 'did you mean "ipex"',
         "base, cpu, ipex, accl, nccl or cambricon", cwd=in_tmp)


@pytest.mark.parametrize("command", ["render", "build"])
def test_unknown_torch_version(in_tmp, command):
    _bad([command, "--target", "ipex", "--torch", "1.12.5"], "torch 1.12.5 is not known for target ipex",
         "Known versions: 1.10.0", "2.8.0", cwd=in_tmp)


def test_malformed_build_arg(in_tmp):
    _bad(["build", "--target", "accl", "--build-arg", "ACCL_INSTALLER_URL"],
         "--build-arg 'ACCL_INSTALLER_URL' is not NAME=VALUE", cwd=in_tmp)


def test_build_arg_the_dockerfile_does_not_declare(in_tmp):
    _bad(["build", "--target", "accl", "--build-arg", "ACCL_URL=x", "--dry-run"],
         "declares no such ARG", "ACCL_INSTALLER_URL or TORCH_ACCL_WHEEL_URL", cwd=in_tmp)


@pytest.mark.parametrize("command", ["render", "build"])
def test_missing_wheelhouse(in_tmp, command):
    _bad([command, "--target", "cpu", "--wheelhouse", str(in_tmp / "no-such-dir")],
         "no such directory", "pip download -d DIR", cwd=in_tmp)


def test_bad_base_image(in_tmp):
    _bad(["render", "--target", "nccl", "--base-image", "NGC Latest"], "not a valid image reference",
         cwd=in_tmp)


def test_no_reachable_engine(in_tmp, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{in_tmp}/no-engine.sock")
    _bad(["build", "--target", "nccl"], "does not answer", "clusterctl engine up", cwd=in_tmp)


def test_targets_lists_every_target(in_tmp, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")   # one table row per line
    result = runner.invoke(app, ["targets"])
    assert result.exit_code == 0, result.output
    for name in ("base", "cpu", "ipex", "accl", "nccl", "cambricon"):
        assert f"│ {name}" in result.output
    for fact in ("gloo", "ccl", "cncl", "nvcr.io/nvidia/pytorch:21.09-py3", "1.12.1", "(debootstrap)"):
        assert fact in result.output


def test_render_prints_and_writes_the_dockerfile(in_tmp):
    result = runner.invoke(app, ["render", "--target", "ipex", "--torch", "1.12.1"])
    assert result.exit_code == 0, result.output
    expected = dockerfile_text("ipex", torch="1.12.1")
    assert expected in result.stdout
    assert (in_tmp / "dockerfiles" / "ipex" / "Dockerfile").read_text() == expected


def test_render_to_an_output_dir_does_not_print_the_dockerfile(in_tmp):
    result = runner.invoke(app, ["render", "--target", "nccl", "-o", "out/nccl"])
    assert result.exit_code == 0, result.output
    assert "FROM " not in result.stdout
    assert (in_tmp / "out" / "nccl" / "Dockerfile").read_text() == dockerfile_text("nccl")
    assert not (in_tmp / "dockerfiles").exists()


def test_dry_run_needs_no_engine_and_builds_nothing(in_tmp, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{in_tmp}/no-engine.sock")
    result = runner.invoke(app, ["build", "--target", "accl", "--dry-run", "--tag", "me/accl:1",
                                 "--build-arg", "TORCH_ACCL_WHEEL_URL=http://mirror/t.whl"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "me/accl:1" in out and "TORCH_ACCL_WHEEL_URL=http://mirror/t.whl" in out
    assert "ACCL_INSTALLER_URL=http://eflops" in out
    assert "nvcr.io/nvidia/pytorch:21.09-py3" in out
    assert not (in_tmp / "dockerfiles").exists()


# ---------------------------------------------------------------- real builds


@pytest.mark.docker
def test_a_base_image_the_engine_lacks_and_cannot_pull(in_tmp, docker_client):
    """Real engine, real failed pull (no registry is reachable here): exit 2 before any work."""
    text = _refused(runner.invoke(app, ["build", "--target", "cambricon"]))
    assert "base image pytorch:v1.17.0-torch1.13.1-ubuntu20.04-py310 is not in the local Docker engine" \
        in text
    assert "docker load -i FILE" in text and "--base-image REF" in text
    assert not (in_tmp / "dockerfiles").exists()


def _label_and_smoke(docker_client, tag: str) -> tuple[dict, str]:
    labels = docker_client.images.get(tag).labels
    probe = run_smoke(docker_client, tag, [
        "python3", "-c",
        "import os, torch, torch.distributed as d; "
        "print('gloo', d.is_gloo_available(), torch.__version__, os.path.isdir('/opt/clusterctl/examples'))",
    ])
    # torch may warn on stderr first (no NumPy in the image); the probe's line is the last.
    return labels, probe.strip().splitlines()[-1]


@pytest.mark.docker
@pytest.mark.slow
def test_build_cpu_for_real(in_tmp, docker_client, cpu_image, throwaway_tag):
    """`clusterctl build --target cpu` builds (cached after cpu_image), labels and smoke-tests the image."""
    result = runner.invoke(app, ["build", "--target", "cpu", "--tag", throwaway_tag])
    assert result.exit_code == 0, result.output
    assert f"built {throwaway_tag}" in result.output and "gloo ok" in result.output

    labels, probe = _label_and_smoke(docker_client, throwaway_tag)
    assert probe.split() == ["gloo", "True", "2.13.0+cpu", "True"]
    dockerfile = (in_tmp / "dockerfiles" / "cpu" / "Dockerfile").read_bytes()
    assert labels["io.clusterctl.dockerfile-sha256"] == hashlib.sha256(dockerfile).hexdigest()
    assert labels["io.clusterctl.target"] == "cpu"
    assert labels["io.clusterctl.torch"] == "2.13.0"
    assert labels["org.opencontainers.image.title"] == "clusterctl cpu"
    assert labels["org.opencontainers.image.version"] == "2.13.0"
    assert labels["org.opencontainers.image.created"].endswith("Z")
    assert labels["org.opencontainers.image.source"].endswith("/templates/cpu/Dockerfile.j2")


@pytest.mark.docker
def test_cpu_image_fixture_is_the_real_cpu_target(docker_client, cpu_image):
    labels, probe = _label_and_smoke(docker_client, cpu_image)
    assert cpu_image == CPU_TEST_TAG
    assert probe.split() == ["gloo", "True", "2.13.0+cpu", "True"]
    assert labels["io.clusterctl.dockerfile-sha256"] == hashlib.sha256(
        dockerfile_text("cpu").encode()).hexdigest()


@pytest.mark.docker
def test_cpu_image_holds_the_repository_examples(docker_client, cpu_image):
    """The scripts of examples/; its project directories (own-project) ship with --workdir."""
    expected = sorted(p.name for p in examples_dir().iterdir() if p.is_file() and p.suffix != ".pyc")
    assert "ddp_smoke.py" in expected and (examples_dir() / "own-project").is_dir()
    listing = run_smoke(docker_client, cpu_image, ["ls", "-1", "/opt/clusterctl/examples/"])
    assert sorted(listing.split()) == expected


@pytest.mark.docker
@pytest.mark.slow
def test_build_cpu_from_a_user_wheelhouse(in_tmp, docker_client, cpu_image, throwaway_tag):
    """--wheelhouse DIR replaces the prepared one: its wheels are what the image installs from."""
    house = in_tmp / "my-wheels"
    cpu = targets.resolve("cpu")   # a user's wheelhouse carries the image's tools (py-spy) too
    cached = wheelhouse.prepare([*cpu.requirements, *cpu.tool_requirements], log=lambda line: None)
    wheelhouse.link_into(cached, house)   # a plain directory of wheels, no clusterctl manifest

    result = runner.invoke(app, ["build", "--target", "cpu", "--tag", throwaway_tag,
                                 "--wheelhouse", str(house)])

    assert result.exit_code == 0, result.output
    assert "pip download" not in result.output     # nothing was prepared
    context_wheels = sorted(p.name for p in (in_tmp / "dockerfiles" / "cpu" / "wheels").iterdir())
    assert context_wheels == sorted(p.name for p in house.iterdir())
    _, probe = _label_and_smoke(docker_client, throwaway_tag)
    assert probe.split()[:3] == ["gloo", "True", "2.13.0+cpu"]
