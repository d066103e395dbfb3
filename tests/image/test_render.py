"""Pure rendering (build/render.py): strict + sandboxed Jinja, the text of each file, input checks.

Nothing here writes a build context: tests/image/test_context.py covers writing,
tests/image/test_pipeline.py the build plan, tests/image/test_golden.py the exact text.
"""

from __future__ import annotations

import subprocess

import jinja2
import pytest

from clusterctl.core import paths
from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.image import render
from clusterctl.image.targets import resolve


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


def test_context_texts_are_the_dockerfile_and_the_entrypoint():
    texts = render.context_texts(resolve("accl"), offline=False)
    assert sorted(texts) == ["Dockerfile", "entrypoint.sh"]
    assert texts["Dockerfile"] == render.dockerfile_text("accl")
    assert texts["entrypoint.sh"] == render.entrypoint_text("accl")
    assert texts["entrypoint.sh"].startswith("#!/bin/bash\n")


def test_ipex_entrypoint_sources_setvars():
    script = render.entrypoint_text("ipex", torch="1.11.0")
    dockerfile = render.dockerfile_text("ipex", torch="1.11.0")
    assert "import os, torch_ccl as m" in script
    assert '. "$ccl_dir/env/setvars.sh" || fail 2' in script
    assert script.rstrip().endswith('exec "$@"')
    assert "setvars" not in dockerfile.split("ENTRYPOINT")[0].replace("# setvars.sh", "")


def test_offline_installs_from_the_context_wheels():
    dockerfile = render.dockerfile_text("ipex", torch="2.3.1", offline=True)
    assert "--no-index --find-links /tmp/wheels" in dockerfile
    assert "--extra-index-url" not in dockerfile


def test_base_image_override_and_bad_references():
    dockerfile = render.dockerfile_text("cambricon", base_image="pytorch:v1.15.0-torch1.9-ubuntu18.04-py37")
    assert "\nFROM pytorch:v1.15.0-torch1.9-ubuntu18.04-py37\n" in dockerfile
    for bad in ["Ubuntu", "x:y\nRUN rm -rf /", "a b", ""]:
        with pytest.raises(UserError, match="not a valid image reference"):
            render.dockerfile_text("nccl", base_image=bad)
        with pytest.raises(UserError, match="--tag .* not a valid image reference"):
            render.resolve_checked("nccl", tag=bad)


def test_parse_build_args():
    assert render.parse_build_args(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in ["NOEQUALS", "=v", "1A=v", "A B=v"]:
        with pytest.raises(UserError, match="is not NAME=VALUE"):
            render.parse_build_args([bad])


def test_base_is_not_rendered():
    with pytest.raises(UserError, match="not rendered from a template"):
        render.context_texts(resolve("base"), offline=False)


@pytest.mark.parametrize("target", ["cpu", "ipex", "accl", "nccl", "cambricon"])
def test_entrypoint_runs_the_command(tmp_path, target):
    script = tmp_path / "entrypoint.sh"
    script.write_text(render.entrypoint_text(target))
    script.chmod(0o755)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if target == "ipex":
        return  # needs the oneCCL bindings; see the next test
    proc = subprocess.run([str(script), "echo", "ran", "with args"], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (0, "ran with args\n"), proc.stderr


def test_ipex_entrypoint_stops_when_the_ccl_environment_cannot_be_set_up(tmp_path):
    """Here the oneCCL bindings are not installed: the entrypoint must not run the command."""
    script = tmp_path / "entrypoint.sh"
    script.write_text(render.entrypoint_text("ipex", torch="2.3.1"))
    script.chmod(0o755)
    proc = subprocess.run([str(script), "echo", "should not run"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "should not run" not in proc.stdout
    assert "clusterctl entrypoint (ipex): environment step 1 failed" in proc.stderr
    assert "oneccl_bindings_for_pytorch" in proc.stderr   # python's ModuleNotFoundError
