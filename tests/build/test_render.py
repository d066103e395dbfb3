"""Rendering (clusterctl.render): strict + sandboxed Jinja, the build context, atomic writes, checks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import jinja2
import pytest

from clusterctl.build import render
from clusterctl.build.imagebuild import LABEL_PREFIX
from clusterctl.core import paths
from clusterctl.core.errors import ClusterctlError, UserError


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def wheelhouse(tmp_path) -> Path:
    """A real wheelhouse of the torch wheel in /opt/wheels and pip's own wheel (hard links)."""
    house = tmp_path / "house"
    house.mkdir()
    torch = sorted(Path("/opt/wheels").glob("torch-2.13.0*.whl"))
    assert torch, "the torch 2.13.0 wheel is expected in /opt/wheels"
    os.link(torch[-1], house / torch[-1].name)
    import pip

    pip_wheel = house / f"pip-{pip.__version__}-py3-none-any.whl"
    shutil.make_archive(str(pip_wheel.with_suffix("")), "zip", Path(pip.__file__).parent.parent, "pip")
    pip_wheel.with_suffix(".zip").rename(pip_wheel)
    return house


def _templates(tmp_path, monkeypatch, files: dict[str, str]) -> None:
    root = tmp_path / "templates"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(paths, "templates_dir", lambda: root)


def test_an_undefined_variable_is_an_error_not_empty(tmp_path, monkeypatch):
    _templates(tmp_path, monkeypatch, {"t.j2": "FROM {{ base_imagee }}\n"})
    with pytest.raises(ClusterctlError) as e:
        render._render_template(render.environment(), "t.j2", {"base_image": "x"})
    assert "base_imagee" in str(e.value) and "is undefined" in str(e.value)


def test_undefined_attribute_of_a_defined_value_is_an_error_too(tmp_path, monkeypatch):
    _templates(tmp_path, monkeypatch, {"t.j2": "{{ pins.nope }}"})
    with pytest.raises(ClusterctlError, match="nope"):
        render._render_template(render.environment(), "t.j2", {"pins": {"torch": "2.13.0"}})


def test_templates_run_sandboxed(tmp_path, monkeypatch):
    _templates(tmp_path, monkeypatch, {"t.j2": "{{ ''.__class__.__mro__[1].__subclasses__() }}"})
    with pytest.raises(ClusterctlError):
        render._render_template(render.environment(), "t.j2", {})
    env = render.environment()
    assert isinstance(env, jinja2.sandbox.SandboxedEnvironment)
    assert env.undefined is jinja2.StrictUndefined


def test_render_writes_the_context(in_tmp):
    r = render.render("accl")

    ctx = in_tmp / "dockerfiles" / "accl"
    assert r.context_dir == Path("dockerfiles/accl")
    assert (ctx / "Dockerfile").read_text() == r.dockerfile == render.dockerfile_text("accl")
    assert os.access(ctx / "entrypoint.sh", os.X_OK)
    assert (ctx / "entrypoint.sh").read_text().startswith("#!/bin/bash\n")
    assert (ctx / "accl" / "patch_c10d.py").read_bytes() == \
        (paths.templates_dir() / "accl" / "patch_c10d.py").read_bytes()
    assert (ctx / "examples").is_dir()
    assert not (ctx / "Dockerfile.j2").exists() and not (ctx / "accl" / "Dockerfile.j2").exists()
    assert [p.name for p in (in_tmp / "dockerfiles").iterdir()] == ["accl"]   # no temp dirs left


def test_examples_are_copied_into_the_context(in_tmp, monkeypatch, tmp_path):
    examples = tmp_path / "ex"
    examples.mkdir()
    (examples / "ddp_smoke.py").write_text("print('hi')\n")
    monkeypatch.setattr(paths, "examples_dir", lambda: examples)

    r = render.render("cpu")

    assert (r.context_dir / "examples" / "ddp_smoke.py").read_text() == "print('hi')\n"
    assert "COPY examples/ /opt/clusterctl/examples/" in r.dockerfile


def test_ipex_entrypoint_sources_setvars(in_tmp):
    r = render.render("ipex", torch="1.11.0")
    script = (r.context_dir / "entrypoint.sh").read_text()
    assert "import os, torch_ccl as m" in script
    assert '. "$ccl_dir/env/setvars.sh" || fail 2' in script
    assert script.rstrip().endswith('exec "$@"')
    assert "setvars" not in r.dockerfile.split("ENTRYPOINT")[0].replace("# setvars.sh", "")


def test_rerender_replaces_the_previous_render(in_tmp):
    render.render("ipex", torch="1.12.1")
    (in_tmp / "dockerfiles" / "ipex" / "stale").write_text("x")
    r = render.render("ipex", torch="2.3.1")
    assert not (r.context_dir / "stale").exists()
    assert "torch==2.3.1" in (r.context_dir / "Dockerfile").read_text()


def test_render_refuses_to_replace_a_directory_it_did_not_write(in_tmp):
    mine = in_tmp / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="was not written by `clusterctl render`"):
        render.render("nccl", out_dir=mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("where", [".", ".."])
def test_render_never_replaces_the_working_directory(in_tmp, where):
    with pytest.raises(UserError, match="working directory or above it"):
        render.render("nccl", out_dir=Path(where))
    assert list(in_tmp.iterdir()) == []


def test_an_injected_failure_while_writing_leaves_nothing(in_tmp, wheelhouse, monkeypatch):
    from clusterctl.build import wheelhouse as wh

    def broken_link(src, dst):  # failure injection: the disk fills up while linking wheels
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wh, "link_into", broken_link)
    with pytest.raises(OSError):
        render.render("cpu", wheelhouse=wheelhouse)
    assert list((in_tmp / "dockerfiles").iterdir()) == []


def test_wheelhouse_goes_into_the_context_and_switches_to_offline(in_tmp, wheelhouse):
    r = render.render("ipex", torch="2.3.1", wheelhouse=wheelhouse)
    assert sorted(p.name for p in (r.context_dir / "wheels").iterdir()) == \
        sorted(p.name for p in wheelhouse.iterdir())
    assert "--no-index --find-links /tmp/wheels" in r.dockerfile
    assert "--extra-index-url" not in r.dockerfile
    assert r.wheelhouse == wheelhouse.resolve()


def test_missing_wheelhouse_is_a_user_error_and_writes_nothing(in_tmp):
    with pytest.raises(UserError, match="--wheelhouse .*no such directory"):
        render.render("cpu", wheelhouse=in_tmp / "nope")
    assert not (in_tmp / "dockerfiles").exists()


def test_cpu_wheelhouse_must_hold_pip(in_tmp, wheelhouse):
    for p in wheelhouse.glob("pip-*.whl"):
        p.unlink()
    with pytest.raises(UserError, match="no wheel for pip"):
        render.render("cpu", wheelhouse=wheelhouse)
    assert not (in_tmp / "dockerfiles").exists()


def test_base_image_override_and_bad_references(in_tmp):
    r = render.render("cambricon", base_image="pytorch:v1.15.0-torch1.9-ubuntu18.04-py37")
    assert "\nFROM pytorch:v1.15.0-torch1.9-ubuntu18.04-py37\n" in r.dockerfile
    for bad in ["Ubuntu", "x:y\nRUN rm -rf /", "a b", ""]:
        with pytest.raises(UserError, match="not a valid image reference"):
            render.render("nccl", base_image=bad, out_dir=in_tmp / "o")
    assert not (in_tmp / "o").exists()


def test_build_args(in_tmp):
    assert render.parse_build_args(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in ["NOEQUALS", "=v", "1A=v", "A B=v"]:
        with pytest.raises(UserError, match="is not NAME=VALUE"):
            render.parse_build_args([bad])
    plan = render.plan_build("accl", build_args={"TORCH_ACCL_WHEEL_URL": "http://h/w.whl", "HTTP_PROXY": "p"})
    assert plan.build_args["TORCH_ACCL_WHEEL_URL"] == "http://h/w.whl"
    assert plan.build_args["ACCL_INSTALLER_URL"].endswith("accl-v1.3.2-4-ubuntu20.04-cuda11.4.sh")
    with pytest.raises(UserError, match="declares no such ARG. Its build args: ACCL_INSTALLER_URL or "
                                        "TORCH_ACCL_WHEEL_URL"):
        render.plan_build("accl", build_args={"ACCL_URL": "x"})


def test_labels_carry_the_dockerfile_sha256(in_tmp):
    r = render.render("ipex", torch="1.12.1")
    import hashlib

    assert r.labels[f"{LABEL_PREFIX}dockerfile-sha256"] == \
        hashlib.sha256((r.context_dir / "Dockerfile").read_bytes()).hexdigest()
    assert r.labels[f"{LABEL_PREFIX}target"] == "ipex"
    assert r.labels[f"{LABEL_PREFIX}torch"] == "1.12.1"
    for key in ("title", "version", "created", "source"):
        assert r.labels[f"org.opencontainers.image.{key}"]


def test_base_is_built_not_rendered(in_tmp):
    with pytest.raises(UserError, match="not rendered from a template"):
        render.render("base")
    plan = render.plan_build("base")
    assert plan.tag == "clusterctl/base:bookworm" and not plan.texts
    assert not (in_tmp / "dockerfiles").exists()


def test_dry_run_description_names_tag_args_and_wheelhouse(in_tmp):
    rows = dict(render.plan_build("cpu", tag="me/cpu:x").describe())
    assert rows["tag"] == "me/cpu:x"
    assert "clusterctl build --target base" in rows["base image"]
    assert rows["wheelhouse"].endswith("torch==2.13.0")
    assert not (in_tmp / "dockerfiles").exists()


@pytest.mark.parametrize("target", ["cpu", "ipex", "accl", "nccl", "cambricon"])
def test_entrypoint_runs_the_command(in_tmp, target):
    import subprocess

    r = render.render(target)
    script = r.context_dir / "entrypoint.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if target == "ipex":
        return  # needs the oneCCL bindings; see the next test
    proc = subprocess.run([str(script), "echo", "ran", "with args"], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (0, "ran with args\n"), proc.stderr


def test_ipex_entrypoint_stops_when_the_ccl_environment_cannot_be_set_up(in_tmp):
    """Here the oneCCL bindings are not installed: the entrypoint must not run the command."""
    import subprocess

    r = render.render("ipex", torch="2.3.1")
    proc = subprocess.run([str(r.context_dir / "entrypoint.sh"), "echo", "should not run"],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "should not run" not in proc.stdout
    assert "clusterctl entrypoint (ipex): environment step 1 failed" in proc.stderr
    assert "oneccl_bindings_for_pytorch" in proc.stderr   # python's ModuleNotFoundError
