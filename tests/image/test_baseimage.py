"""clusterctl.baseimage: apt-source parsing, the environment checks, and a real debootstrap build."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from clusterctl.core.errors import ClusterctlError, EnvironmentProblem, UserError
from clusterctl.image import baseimage, imagebuild
from tests.fixtures.images import random_layers_image

ONE_LINE = """\
# a comment line
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://mirror.example/debian bookworm main contrib
deb-src http://src.example/debian bookworm main
deb http://security.example/debian-security bookworm-security main  # trailing comment
"""

DEB822 = """\
Types: deb
# a comment inside the stanza
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb deb-src
URIs: http://a.example/debian
 http://b.example/debian
Suites: bookworm bookworm-updates
Components: main
"""


def _sources(tmp_path: Path, one_line: str = "", deb822: str = "") -> tuple[Path, Path]:
    lst, d = tmp_path / "sources.list", tmp_path / "sources.list.d"
    d.mkdir()
    lst.write_text(one_line)
    if deb822:
        (d / "debian.sources").write_text(deb822)
    (d / "ignored.list.disabled").write_text("deb http://never.example/debian bookworm main\n")
    return lst, d


def test_one_line_format_keeps_options_out_of_the_uri():
    entries = baseimage.parse_one_line(ONE_LINE, "sources.list")
    assert [(e.types, e.uris, e.suites) for e in entries] == [
        (["deb"], ["http://mirror.example/debian"], ["bookworm"]),
        (["deb-src"], ["http://src.example/debian"], ["bookworm"]),
        (["deb"], ["http://security.example/debian-security"], ["bookworm-security"]),
    ]
    assert entries[0].origin == "sources.list:2"
    assert entries[0].components == ["main", "contrib"]


def test_deb822_stanzas_with_comments_continuations_and_enabled_no():
    entries = baseimage.parse_deb822(DEB822, "debian.sources")
    assert [e.enabled for e in entries] == [False, True]
    assert entries[1].uris == ["http://a.example/debian", "http://b.example/debian"]
    assert entries[1].suites == ["bookworm", "bookworm-updates"]
    assert entries[1].origin == "debian.sources:8"


def test_mirror_is_the_first_enabled_deb_source_for_exactly_that_suite(tmp_path):
    lst, d = _sources(tmp_path, "deb http://security.example/s bookworm-security main\n", DEB822)
    assert baseimage.apt_mirror("bookworm", sources_list=lst, sources_dir=d) == "http://a.example/debian"
    assert baseimage.apt_mirror("bookworm-updates", sources_list=lst, sources_dir=d) == "http://a.example/debian"


def test_one_line_file_comes_before_the_directory(tmp_path):
    lst, d = _sources(tmp_path, ONE_LINE, DEB822)
    assert baseimage.apt_mirror("bookworm", sources_list=lst, sources_dir=d) == "http://mirror.example/debian"


def test_no_source_for_the_suite_is_an_environment_problem_naming_files_and_the_override(tmp_path):
    lst, d = _sources(tmp_path, ONE_LINE, DEB822)
    with pytest.raises(EnvironmentProblem) as e:
        baseimage.apt_mirror("trixie", sources_list=lst, sources_dir=d)
    assert e.value.exit_code == 2
    assert "'trixie'" in e.value.message and str(lst) in e.value.message
    assert baseimage.MIRROR_ENV in e.value.message


def test_this_machines_mirror_comes_from_its_own_apt_sources():
    mirror = baseimage.apt_mirror("bookworm")
    texts = [baseimage.SOURCES_LIST.read_text()] if baseimage.SOURCES_LIST.exists() else []
    texts += [f.read_text() for f in baseimage.SOURCES_DIR.glob("*.*") if f.suffix in (".list", ".sources")]
    assert any(mirror in t for t in texts)


def test_mirror_credentials_never_reach_logs_or_labels():
    assert baseimage.redact("http://user:s3cret@mirror.example/debian") == "http://mirror.example/debian"
    assert baseimage.redact("http://mirror.example/debian") == "http://mirror.example/debian"
    labels = baseimage.base_labels("bookworm", ["python3"], "https://u:s3cret@m.example/debian")
    assert "s3cret" not in repr(labels)
    assert labels["io.clusterctl.target"] == "base"


def test_a_mirror_that_is_not_a_url_is_a_user_error():
    with pytest.raises(UserError) as e:
        baseimage._resolve_mirror("bookworm main", "bookworm")
    assert e.value.exit_code == 2 and "http://" in e.value.message


def test_missing_debootstrap_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH dir: debootstrap is not found
    with pytest.raises(EnvironmentProblem) as e:
        baseimage.check_can_build()
    assert e.value.exit_code == 2
    assert "apt-get install -y debootstrap" in e.value.message


def test_not_root_is_an_environment_problem():
    """Runs the real check as user nobody (setpriv) on a copy of the package nobody can read."""
    system_python = Path("/usr/bin/python3")  # the pyenv one under /root is unreadable for nobody
    if os.geteuid() != 0 or not shutil.which("setpriv") or not system_python.exists():
        pytest.skip("needs root, setpriv and /usr/bin/python3 to run as nobody")
    tmp = Path(tempfile.mkdtemp(prefix="clusterctl-nobody-"))
    try:
        tmp.chmod(0o755)
        src = Path(baseimage.__file__).parent.parent  # the clusterctl package
        shutil.copytree(src, tmp / "clusterctl", ignore=shutil.ignore_patterns("__pycache__", "cli"))
        code = ("from clusterctl.image import baseimage\n"
                "from clusterctl.core.errors import EnvironmentProblem\n"
                "try:\n    baseimage.check_can_build()\n"
                "except EnvironmentProblem as e:\n    print(e.exit_code, e.message)\n")
        res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              str(system_python), "-c", code], cwd=tmp, env={"PYTHONPATH": str(tmp), "PATH": os.environ["PATH"],
                                                         "HOME": str(tmp)},
                             capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(tmp)
    if res.returncode != 0 and "Permission denied" in res.stderr:
        pytest.skip(f"nobody cannot run this Python: {res.stderr.strip()[-200:]}")
    assert res.stdout.startswith("2 "), res.stdout + res.stderr
    assert "needs root" in res.stdout and "sudo" in res.stdout


@pytest.mark.docker
def test_missing_debootstrap_stops_before_anything_is_made(docker_client, throwaway_tag, monkeypatch, tmp_path):
    log: list[str] = []
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EnvironmentProblem):
        baseimage.ensure_base_image(docker_client, throwaway_tag, log=log.append)
    with pytest.raises(ImageNotFound):
        docker_client.images.get(throwaway_tag)
    assert log == [], "nothing may be started before the checks pass"


@pytest.mark.docker
@pytest.mark.slow
def test_debootstrap_build_runs_python_is_labelled_kept_and_rebuilt(docker_client, throwaway_tag):
    """One debootstrap (a minute of 2 cores' time): the tag first holds a small image of no
    use, which is kept as it is, then replaced by ``rebuild``.  The build of an absent tag is
    the session's own base image (tests/fixtures/images.py) and the failing build below."""
    placeholder, _ = random_layers_image(docker_client, throwaway_tag, [64])
    kept: list[str] = []
    assert baseimage.ensure_base_image(docker_client, throwaway_tag, log=kept.append) == placeholder.id
    assert not any("debootstrap" in line for line in kept), kept
    assert any("kept" in line for line in kept)

    log: list[str] = []
    image_id = baseimage.ensure_base_image(docker_client, throwaway_tag, rebuild=True, log=log.append)
    assert any("Base system installed successfully" in line for line in log), log[-20:]
    rootfs = [line.split()[1] for line in log if line.startswith("importing /")]
    assert len(rootfs) == 1 and not Path(rootfs[0]).exists(), "the temporary rootfs was left behind"
    image = docker_client.images.get(throwaway_tag)
    assert image.id == image_id != placeholder.id
    with pytest.raises(ImageNotFound):  # the replaced image had no children, so it is gone
        docker_client.images.get(placeholder.id)
    labels = image.labels
    assert labels["io.clusterctl.target"] == "base"
    assert labels["org.opencontainers.image.version"] == "bookworm"
    assert labels["org.opencontainers.image.source"] == baseimage.redact(baseimage.apt_mirror("bookworm"))
    assert labels["org.opencontainers.image.created"].endswith("Z")
    assert labels["org.opencontainers.image.title"] == "clusterctl base"

    out = imagebuild.run_smoke(docker_client, throwaway_tag, ["python3", "--version"], timeout=120)
    assert out.startswith("Python 3.11")
    # the image's root must be usable by non-root users (mkdtemp makes 0700 dirs)
    out = imagebuild.run_smoke(docker_client, throwaway_tag, ["stat", "-c", "%a", "/"], timeout=60)
    assert out.strip() == "755"

    again: list[str] = []
    assert baseimage.ensure_base_image(docker_client, throwaway_tag, log=again.append) == image_id
    assert not any("debootstrap" in line for line in again), again


@pytest.mark.docker
def test_session_base_image_fixture_is_the_default_tag(base_image, docker_client):
    image = docker_client.images.get(base_image)
    assert base_image == baseimage.DEFAULT_TAG
    assert image.labels.get("io.clusterctl.target") == "base"


@pytest.mark.docker
def test_failed_debootstrap_raises_its_tail_and_removes_the_rootfs(docker_client, throwaway_tag, tmp_path):
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        pytest.skip("needs root and debootstrap")
    empty_mirror = tmp_path / "mirror"  # a file:// mirror with no dists/: debootstrap fails at once
    empty_mirror.mkdir()
    log: list[str] = []
    with pytest.raises(ClusterctlError) as e:
        baseimage.ensure_base_image(docker_client, throwaway_tag, mirror=empty_mirror.as_uri(), log=log.append)
    assert e.value.exit_code == 1
    assert "debootstrap of bookworm" in e.value.message and str(empty_mirror) in e.value.message
    assert "last lines" in e.value.message
    rootfs = [line.split()[-1] for line in log if line.startswith("rootfs ")]
    assert len(rootfs) == 1 and not Path(rootfs[0]).exists()
    with pytest.raises(ImageNotFound):
        docker_client.images.get(throwaway_tag)
