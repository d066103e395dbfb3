"""clusterctl.wheelhouse with real pip: the torch 2.13.0 CPU wheel lies on this machine's disk."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from clusterctl.core.errors import UserError
from clusterctl.image import wheelhouse

TORCH = "torch==2.13.0"


@pytest.fixture(scope="module", autouse=True)
def cache():
    """A private clusterctl cache for this module (200 MB of wheels), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="clusterctl-wheel-cache-"))
    mp = pytest.MonkeyPatch()
    mp.setenv("CLUSTERCTL_CACHE", str(d))
    yield d
    mp.undo()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def torch_house(cache):
    log: list[str] = []
    path = wheelhouse.prepare([TORCH], log=log.append)
    return path, log


def test_prepare_downloads_torch_and_pip_into_the_cache(cache, torch_house):
    path, log = torch_house
    assert path.parent == cache / "wheelhouse"
    names = [w.name for w in wheelhouse.wheels(path)]
    assert any(n.startswith("torch-2.13.0") for n in names), names
    assert any(n.startswith("pip-") for n in names), names
    # torch's own dependencies came along: the image installs with --no-index
    assert any(n.startswith("sympy-") for n in names) and any(n.startswith("filelock-") for n in names)
    manifest = json.loads((path / wheelhouse.MANIFEST).read_text())
    assert manifest["requirements"] == ["pip", TORCH]
    assert set(manifest["files"]) == set(names)
    assert any("pip download" in line for line in log)
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name], "temp dir left behind"


def test_second_prepare_reuses_the_cache_without_running_pip(torch_house, monkeypatch):
    path, _ = torch_house
    torch_wheel = next(w for w in wheelhouse.wheels(path) if w.name.startswith("torch-"))
    before = (torch_wheel.stat().st_ino, torch_wheel.stat().st_mtime_ns, (path / wheelhouse.MANIFEST).stat().st_mtime_ns)

    def no_pip(*a, **k):
        raise AssertionError("pip ran although the wheelhouse was complete")

    monkeypatch.setattr(wheelhouse, "_download", no_pip)
    log: list[str] = []
    # same inputs in another order and with pip spelled out: same wheelhouse
    assert wheelhouse.prepare(["pip", f" {TORCH} "], log=log.append) == path
    after = (torch_wheel.stat().st_ino, torch_wheel.stat().st_mtime_ns, (path / wheelhouse.MANIFEST).stat().st_mtime_ns)
    assert after == before
    assert any("reused" in line for line in log)


def test_cache_key_depends_on_every_input():
    base = wheelhouse.cache_key([TORCH], "3.11", None)
    assert base == wheelhouse.cache_key(["pip", TORCH], "3.11", None)
    assert base != wheelhouse.cache_key([TORCH], "3.12", None)
    assert base != wheelhouse.cache_key([TORCH], "3.11", "manylinux_2_28_aarch64")
    assert base != wheelhouse.cache_key(["torch==2.12.0"], "3.11", None)
    assert base != wheelhouse.cache_key([TORCH], "3.11", None, ["--extra-index-url", "https://x.example/"])


def test_a_wheel_that_only_the_targets_index_serves_is_fetched_from_that_index(tmp_path):
    """The ipex table's oneccl_bind_pt is on Intel's index, not PyPI: prepare passes the target's
    index options to pip. Here the "index" is a local -f directory holding the CCL stand-in wheel
    (tests/fixtures/ccl_stand_in.py); without it pip finds no such distribution."""
    from tests.fixtures import ccl_stand_in

    links = tmp_path / "links"
    links.mkdir()
    ccl_stand_in.write_wheel(links, "2.8.0")
    with pytest.raises(UserError) as e:
        wheelhouse.prepare(["oneccl_bind_pt==2.8.0"], dest=tmp_path / "without", log=lambda line: None)
    assert "oneccl_bind_pt==2.8.0" in e.value.message
    house = wheelhouse.prepare(["oneccl_bind_pt==2.8.0"], indexes=["-f", str(links)],
                               dest=tmp_path / "with", log=lambda line: None)
    assert [w.name for w in wheelhouse.wheels(house) if w.name.startswith("oneccl")] == \
        ["oneccl_bind_pt-2.8.0-py3-none-any.whl"]
    assert json.loads((house / wheelhouse.MANIFEST).read_text())["indexes"] == ["-f", str(links)]


def test_a_damaged_wheelhouse_is_not_complete(torch_house, tmp_path):
    path, _ = torch_house
    copy = tmp_path / "copy"
    wheelhouse.link_into(path, copy)
    shutil.copy(path / wheelhouse.MANIFEST, copy / wheelhouse.MANIFEST)
    assert wheelhouse.is_complete(copy)
    next(w for w in wheelhouse.wheels(copy) if w.name.startswith("sympy-")).unlink()
    assert not wheelhouse.is_complete(copy)


def test_unknown_version_is_a_user_error_and_leaves_nothing(cache):
    before = set(os.listdir(cache / "wheelhouse")) if (cache / "wheelhouse").exists() else set()
    with pytest.raises(UserError) as e:
        wheelhouse.prepare(["torch==0.0.0"], log=lambda line: None)
    assert e.value.exit_code == 2
    assert "torch==0.0.0" in e.value.message and "--wheelhouse" in e.value.message
    assert set(os.listdir(cache / "wheelhouse")) == before  # no half-written wheelhouse, no temp dir


def test_option_like_requirement_is_refused_before_pip_runs():
    with pytest.raises(UserError) as e:
        wheelhouse.prepare(["--index-url=http://evil.example/simple"], log=lambda line: None)
    assert "looks like a pip option" in e.value.message


def test_dest_that_is_something_else_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError) as e:
        wheelhouse.prepare([TORCH], dest=tmp_path, log=lambda line: None)
    assert str(tmp_path) in e.value.message
    assert (tmp_path / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- validate


def test_validate_missing_directory(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(UserError) as e:
        wheelhouse.validate(missing)
    assert e.value.exit_code == 2
    assert str(missing) in e.value.message and "no such directory" in e.value.message
    assert ".whl" in e.value.message


def test_validate_directory_without_wheels(tmp_path):
    (tmp_path / "torch-2.13.0.tar.gz").write_bytes(b"not a wheel")
    with pytest.raises(UserError) as e:
        wheelhouse.validate(tmp_path)
    assert str(tmp_path) in e.value.message and "no .whl" in e.value.message


def test_validate_requires_pips_own_wheel(torch_house, tmp_path):
    path, _ = torch_house
    wheelhouse.link_into(path, tmp_path)
    next(tmp_path.glob("pip-*.whl")).unlink()
    with pytest.raises(UserError) as e:
        wheelhouse.validate(tmp_path)
    assert "pip" in e.value.message and str(tmp_path) in e.value.message


def test_validate_accepts_a_real_wheelhouse_and_extra_requirements(torch_house):
    path, _ = torch_house
    assert wheelhouse.validate(path, require=("pip", "torch", "typing-extensions")) == path.resolve()
    with pytest.raises(UserError) as e:
        wheelhouse.validate(path, require=("pip", "oneccl-bind-pt"))
    assert "oneccl-bind-pt" in e.value.message


# ---------------------------------------------------------------- link_into


def test_link_into_hard_links_on_the_same_filesystem_and_drops_stale_wheels(torch_house, tmp_path):
    path, _ = torch_house
    target = tmp_path / "context" / "wheels"
    target.mkdir(parents=True)
    (target / "stale-1.0-py3-none-any.whl").write_bytes(b"old")
    if os.stat(path).st_dev != os.stat(target).st_dev:
        pytest.skip("the cache and tmp_path are on different filesystems here")
    wheelhouse.link_into(path, target)
    assert [w.name for w in wheelhouse.wheels(target)] == [w.name for w in wheelhouse.wheels(path)]
    for w in wheelhouse.wheels(path):
        assert (target / w.name).stat().st_ino == w.stat().st_ino
    assert not (target / wheelhouse.MANIFEST).exists()


def test_link_into_copies_across_filesystems(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem (/dev/shm) here")
    src = tmp_path / "house"
    src.mkdir()
    (src / "demo-1.0-py3-none-any.whl").write_bytes(b"wheel bytes")
    target = Path(tempfile.mkdtemp(dir=shm, prefix="clusterctl-test-"))
    try:
        wheelhouse.link_into(src, target)
        copied = target / "demo-1.0-py3-none-any.whl"
        assert copied.read_bytes() == b"wheel bytes"
        assert copied.stat().st_ino != (src / "demo-1.0-py3-none-any.whl").stat().st_ino
    finally:
        shutil.rmtree(target)


def test_dest_is_reused_for_the_same_inputs_and_refused_for_others(tmp_path):
    dest = tmp_path / "house"
    first = wheelhouse.prepare(["mpmath==1.3.0"], dest=dest, log=lambda line: None)
    assert first == dest
    assert {w.name.split("-")[0] for w in wheelhouse.wheels(dest)} == {"mpmath", "pip"}
    log: list[str] = []
    assert wheelhouse.prepare(["mpmath==1.3.0"], dest=dest, log=log.append) == dest
    assert any("reused" in line for line in log)
    with pytest.raises(UserError) as e:
        wheelhouse.prepare(["mpmath==1.3.0"], python_version="3.12", dest=dest, log=lambda line: None)
    assert str(dest) in e.value.message and "python 3.12" in e.value.message
    assert wheelhouse.is_complete(dest)  # the refusal touched nothing
