"""Writing a build context (build/context.py): what goes in it, atomic replacement, checks first."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pip
import pytest

from clusterctl.core import paths
from clusterctl.core.errors import UserError
from clusterctl.image import context, render
from clusterctl.image import wheelhouse as wh
from clusterctl.image.targets import image_tools


@pytest.fixture
def wheelhouse(tmp_path) -> Path:
    """A real wheelhouse of the torch wheel in /opt/wheels, pip's own wheel (hard links) and
    the wheels of clusterctl's image tools (py-spy: `pip download`ed once, cached)."""
    house = tmp_path / "house"
    house.mkdir()
    torch = sorted(Path("/opt/wheels").glob("torch-2.13.0*.whl"))
    assert torch, "the torch 2.13.0 wheel is expected in /opt/wheels"
    os.link(torch[-1], house / torch[-1].name)
    tools = wh.prepare([t.requirement for t in image_tools()], log=lambda line: None)
    for w in wh.wheels(tools):
        if not w.name.startswith("pip-"):
            os.link(w, house / w.name)
    pip_wheel = house / f"pip-{pip.__version__}-py3-none-any.whl"
    shutil.make_archive(str(pip_wheel.with_suffix("")), "zip", Path(pip.__file__).parent.parent, "pip")
    pip_wheel.with_suffix(".zip").rename(pip_wheel)
    return house


def test_render_writes_the_context(in_tmp):
    r = context.render_context("accl")

    ctx = in_tmp / "dockerfiles" / "accl"
    assert r.context_dir == Path("dockerfiles/accl")
    assert (ctx / "Dockerfile").read_text() == r.dockerfile == render.dockerfile_text("accl")
    assert (ctx / "entrypoint.sh").read_text() == render.entrypoint_text("accl")
    assert os.access(ctx / "entrypoint.sh", os.X_OK)
    assert (ctx / "accl" / "patch_c10d.py").read_bytes() == \
        (paths.templates_dir() / "accl" / "patch_c10d.py").read_bytes()
    assert (ctx / "examples").is_dir()
    assert (ctx / context.RENDER_MARKER).read_text() == "accl\n"
    assert not r.wheels_missing   # accl installs from an index unless given --wheelhouse
    assert context.render_context("cpu", out_dir=in_tmp / "cpu").wheels_missing
    assert not (ctx / "Dockerfile.j2").exists() and not (ctx / "accl" / "Dockerfile.j2").exists()
    assert [p.name for p in (in_tmp / "dockerfiles").iterdir()] == ["accl"]   # no temp dirs left


def test_examples_are_copied_into_the_context(in_tmp, monkeypatch, tmp_path):
    examples = tmp_path / "ex"
    examples.mkdir()
    (examples / "ddp_smoke.py").write_text("print('hi')\n")
    monkeypatch.setattr(paths, "examples_dir", lambda: examples)

    r = context.render_context("cpu")

    assert (r.context_dir / "examples" / "ddp_smoke.py").read_text() == "print('hi')\n"
    assert "COPY examples/ /opt/clusterctl/examples/" in r.dockerfile


def test_rerender_replaces_the_previous_render(in_tmp):
    context.render_context("ipex", torch="1.12.1")
    (in_tmp / "dockerfiles" / "ipex" / "stale").write_text("x")
    r = context.render_context("ipex", torch="2.3.1")
    assert not (r.context_dir / "stale").exists()
    assert "torch==2.3.1" in (r.context_dir / "Dockerfile").read_text()


def test_render_refuses_to_replace_a_directory_it_did_not_write(in_tmp):
    mine = in_tmp / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="was not written by `clusterctl render`"):
        context.render_context("nccl", out_dir=mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("where", [".", ".."])
def test_render_never_replaces_the_working_directory(in_tmp, where):
    with pytest.raises(UserError, match="working directory or above it"):
        context.render_context("nccl", out_dir=Path(where))
    assert list(in_tmp.iterdir()) == []


def test_an_injected_failure_while_writing_leaves_nothing(in_tmp, wheelhouse, monkeypatch):
    def broken_link(src, dst):  # failure injection: the disk fills up while linking wheels
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wh, "link_into", broken_link)
    with pytest.raises(OSError):
        context.render_context("cpu", wheelhouse=wheelhouse)
    assert list((in_tmp / "dockerfiles").iterdir()) == []


def test_wheelhouse_goes_into_the_context_and_switches_to_offline(in_tmp, wheelhouse):
    r = context.render_context("ipex", torch="2.3.1", wheelhouse=wheelhouse)
    assert sorted(p.name for p in (r.context_dir / "wheels").iterdir()) == \
        sorted(p.name for p in wheelhouse.iterdir())
    assert r.dockerfile == render.dockerfile_text("ipex", torch="2.3.1", offline=True)
    assert r.wheelhouse == wheelhouse.resolve() and not r.wheels_missing


def test_missing_wheelhouse_is_a_user_error_and_writes_nothing(in_tmp):
    with pytest.raises(UserError, match="--wheelhouse .*no such directory"):
        context.render_context("cpu", wheelhouse=in_tmp / "nope")
    assert not (in_tmp / "dockerfiles").exists()


def test_cpu_wheelhouse_must_hold_pip(in_tmp, wheelhouse):
    for p in wheelhouse.glob("pip-*.whl"):
        p.unlink()
    with pytest.raises(UserError, match="no wheel for pip"):
        context.render_context("cpu", wheelhouse=wheelhouse)
    assert not (in_tmp / "dockerfiles").exists()


def test_a_wheelhouse_must_hold_the_image_tools(in_tmp, wheelhouse):
    """Every image carries py-spy (the hang watchdog's stack dumps): a wheelhouse without it
    is refused by name, for a target that installs offline anyway (cpu) and one that
    installs from its wheelhouse only when given one (nccl)."""
    for p in wheelhouse.glob("py_spy-*.whl"):
        p.unlink()
    for target in ("cpu", "nccl"):
        with pytest.raises(UserError, match="no wheel for py-spy"):
            context.render_context(target, wheelhouse=wheelhouse)
    assert not (in_tmp / "dockerfiles").exists()


def test_a_bad_base_image_writes_nothing(in_tmp):
    r = context.render_context("cambricon", base_image="pytorch:v1.15.0-torch1.9-ubuntu18.04-py37")
    assert "\nFROM pytorch:v1.15.0-torch1.9-ubuntu18.04-py37\n" in r.dockerfile
    for bad in ["Ubuntu", "x:y\nRUN rm -rf /", "a b", ""]:
        with pytest.raises(UserError, match="not a valid image reference"):
            context.render_context("nccl", base_image=bad, out_dir=in_tmp / "o")
    assert not (in_tmp / "o").exists()


def test_base_is_built_not_rendered(in_tmp):
    with pytest.raises(UserError, match="not rendered from a template"):
        context.render_context("base")
    with pytest.raises(UserError, match="debootstrapped, not rendered"):
        context.render_context("base", wheelhouse=in_tmp)
    assert not (in_tmp / "dockerfiles").exists()
