"""clusterctl.image.imagebuild against the real local engine, on the debootstrapped base image."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.image import imagebuild, wheelhouse
from clusterctl.image.labels import file_sha256, image_labels


def _context(tmp_path: Path, dockerfile: str) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(dockerfile)
    return ctx


def _containers_mentioning(client, marker: str) -> list[str]:
    """Containers (any state) whose command or env holds marker: what a test must not leave."""
    found = []
    for c in client.containers.list(all=True):
        cfg = c.attrs.get("Config") or {}
        if marker in " ".join([*(cfg.get("Cmd") or []), *(cfg.get("Env") or [])]):
            found.append(c.short_id)
    return found


# ---------------------------------------------------------------- build


def test_missing_context_or_dockerfile_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as e:
        imagebuild.build(None, tmp_path / "nope", tag="x:y")
    assert str(tmp_path / "nope") in e.value.message and e.value.exit_code == 2
    with pytest.raises(UserError) as e:
        imagebuild.build(None, tmp_path, tag="x:y", dockerfile="Dockerfile.cpu")
    assert "Dockerfile.cpu" in e.value.message


@pytest.mark.docker
def test_build_streams_lines_and_labels_the_image(docker_client, base_image, throwaway_tag, tmp_path):
    marker = uuid.uuid4().hex
    ctx = _context(tmp_path, f"FROM {base_image}\nARG GREETING\n"
                             'RUN echo "greeting=$GREETING" && python3 -c "print(6*7)"\n'
                             f"RUN echo {marker} > /built\n")
    labels = image_labels("demo", version="1.0", torch="2.13.0",
                          dockerfile_sha256=file_sha256(ctx / "Dockerfile"))
    lines: list[str] = []
    image_id = imagebuild.build(docker_client, ctx, tag=throwaway_tag, buildargs={"GREETING": marker},
                                labels=labels, on_output=lines.append)

    image = docker_client.images.get(throwaway_tag)
    assert image.id == image_id and image_id.startswith("sha256:")
    for key, value in labels.items():
        assert image.labels[key] == value, key
    assert f"greeting={marker}" in lines and "42" in lines
    assert any(line.startswith("Step 1/") for line in lines)
    assert all("\n" not in line for line in lines)
    out = imagebuild.run_smoke(docker_client, throwaway_tag, ["cat", "/built"])
    assert out.strip() == marker


@pytest.mark.docker
def test_the_library_prints_nothing_by_default(docker_client, base_image, throwaway_tag, tmp_path, capfd):
    """Without on_output the build's lines go to the module's logger, not to the terminal
    (the CLI passes its display, cli/display.py)."""
    marker = uuid.uuid4().hex
    ctx = _context(tmp_path, f"FROM {base_image}\nRUN echo quiet-{marker}\n")
    imagebuild.build(docker_client, ctx, tag=throwaway_tag)
    out, err = capfd.readouterr()
    assert marker not in out + err and "Step 1/" not in out + err


@pytest.mark.docker
def test_failing_run_raises_with_the_output_tail_and_leaves_no_container(docker_client, base_image, tmp_path):
    marker = uuid.uuid4().hex
    # the failing RUN comes right after FROM, so no intermediate image is left either
    ctx = _context(tmp_path, f"FROM {base_image}\nRUN echo before-{marker} >&2 && exit 7\n")
    lines: list[str] = []
    tag = f"clusterctl-test/fail-{marker[:12]}:t"
    with pytest.raises(ClusterctlError) as e:
        imagebuild.build(docker_client, ctx, tag=tag, on_output=lines.append)
    err = e.value
    assert err.exit_code == 1
    assert "non-zero code: 7" in err.error
    assert f"before-{marker}" in err.message and f"before-{marker}" in err.tail
    assert tag in err.message
    assert len(err.tail) <= imagebuild.TAIL_LINES
    assert f"before-{marker}" in lines  # streamed too, without the colour codes of stderr
    assert _containers_mentioning(docker_client, marker) == []
    assert not docker_client.images.list(name=tag.split(":")[0])


@pytest.mark.docker
def test_unknown_instruction_is_reported_as_a_build_error(docker_client, base_image, tmp_path):
    ctx = _context(tmp_path, f"FROM {base_image}\nFROBNICATE now\n")
    with pytest.raises(ClusterctlError) as e:
        imagebuild.build(docker_client, ctx, tag="clusterctl-test/never:t", on_output=lambda line: None)
    assert "frobnicate" in e.value.message.lower()


@pytest.mark.docker
@pytest.mark.slow
def test_offline_install_from_a_wheelhouse_with_no_network(docker_client, base_image, throwaway_tag, tmp_path):
    """The way target images install: pip from its own wheel, --no-index, network none."""
    cache = Path(tempfile.mkdtemp(prefix="clusterctl-test-cache-"))
    try:
        house = wheelhouse.prepare(["mpmath==1.3.0"], dest=cache / "house", log=lambda line: None)
        ctx = _context(tmp_path, f"FROM {base_image}\nCOPY wheels/ /tmp/wheels/\n"
                                 # a glob never matches "X.whl/pip" (the wheel is a file): expand it first
                                 'RUN set -- /tmp/wheels/pip-*.whl && python3 "$1/pip" install --no-index '
                                 "--find-links /tmp/wheels --break-system-packages mpmath==1.3.0 "
                                 "&& rm -rf /tmp/wheels\n")
        wheelhouse.link_into(house, ctx / "wheels")
        imagebuild.build(docker_client, ctx, tag=throwaway_tag, network_mode="none",
                         on_output=lambda line: None)
    finally:
        shutil.rmtree(cache)
    out = imagebuild.run_smoke(docker_client, throwaway_tag,
                               ["python3", "-c", "import mpmath; print(mpmath.__version__)"],
                               network_mode="none")
    assert out.strip() == "1.3.0"


# ---------------------------------------------------------------- smoke


@pytest.mark.docker
def test_smoke_pass_returns_output(docker_client, base_image):
    marker = uuid.uuid4().hex
    out = imagebuild.run_smoke(docker_client, base_image,
                               ["python3", "-c", "import os, sys; print(sys.version_info[:2], os.environ['MARK'])"],
                               environment={"MARK": marker})
    assert out.strip() == f"(3, 11) {marker}"
    assert _containers_mentioning(docker_client, marker) == []


@pytest.mark.docker
def test_smoke_failure_raises_with_output_and_removes_the_container(docker_client, base_image):
    marker = uuid.uuid4().hex
    with pytest.raises(ClusterctlError) as e:
        imagebuild.run_smoke(docker_client, base_image, ["sh", "-c", f"echo out-{marker}; echo err-{marker} >&2; exit 3"])
    assert e.value.exit_code == 1
    assert "exited 3" in e.value.message
    assert f"out-{marker}" in e.value.output and f"err-{marker}" in e.value.message
    assert _containers_mentioning(docker_client, marker) == []


@pytest.mark.docker
def test_smoke_timeout_kills_and_removes_the_container(docker_client, base_image):
    marker = uuid.uuid4().hex
    with pytest.raises(ClusterctlError) as e:
        imagebuild.run_smoke(docker_client, base_image, ["sh", "-c", f"echo started-{marker}; sleep 60"], timeout=3)
    assert "did not finish within 3s" in e.value.message
    assert f"started-{marker}" in e.value.output
    assert _containers_mentioning(docker_client, marker) == []


def test_smoke_refuses_a_shell_string():
    with pytest.raises(TypeError):
        imagebuild.run_smoke(None, "img", "echo hi; rm -rf /")


@pytest.mark.docker
def test_smoke_unknown_image_is_a_user_error(docker_client):
    with pytest.raises(UserError) as e:
        imagebuild.run_smoke(docker_client, f"clusterctl-test/absent-{uuid.uuid4().hex[:8]}:t", ["true"])
    assert "clusterctl build" in e.value.message
