"""clusterctl.image.deps: a requirements.txt as a cached image layer, with real pip and a real engine.

The engine tests build on the debootstrapped base (``base_image``) with small pure-Python
packages (six, tomli: a few KB of wheels each), so each build takes about 2 s on the 2-core
development machine; the wheelhouses and the probe answers go to a private cache.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from clusterctl.core.errors import UserError
from clusterctl.image import deps, imagebuild

SIX = "six==1.16.0"
TOMLI = "tomli==2.0.1"


@pytest.fixture(scope="module", autouse=True)
def cache():
    """A private clusterctl cache for this module (wheelhouses, probe answers), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="clusterctl-deps-cache-"))
    mp = pytest.MonkeyPatch()
    mp.setenv("CLUSTERCTL_CACHE", str(d))
    yield d
    mp.undo()
    shutil.rmtree(d, ignore_errors=True)


def _write(tmp_path: Path, text: str, name: str = "requirements.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the file, no engine


def test_requirement_lines_are_read_as_pip_reads_them(tmp_path):
    path = _write(tmp_path, "# the project's deps\n\nsix==1.16.0  # pinned\r\n"
                            "requests[socks] >= 2.31 ; python_version >= \"3.10\"\n"
                            "tomli \\\n  ==2.0.1\n")
    reqs = deps.read_requirements(path)
    assert [(r.line, r.text, r.name) for r in reqs] == [
        (3, "six==1.16.0", "six"),
        (4, 'requests[socks] >= 2.31 ; python_version >= "3.10"', "requests"),
        (5, "tomli   ==2.0.1", "tomli"),
    ]


@pytest.mark.parametrize(("line", "says"), [
    ("-r other.txt", "pip option -r"),
    ("--index-url https://pypi.example/simple", "pip option --index-url"),
    ("--extra-index-url=https://pypi.example/simple", "pip option --extra-index-url"),
    ("-e .", "pip option -e"),
    ("six @ https://files.example/six-1.16.0-py2.py3-none-any.whl", "URL"),
    ("git+https://github.com/benjaminp/six", "URL"),
    ("./vendor/six", "local path"),
    ("six-1.16.0-py2.py3-none-any.whl", "local path"),
    ("six==1.16.0 --hash=sha256:abcd", "--hash"),
    ("six 1.16", "is not a requirement"),
])
def test_options_urls_and_paths_are_refused_naming_the_file_and_line(tmp_path, line, says):
    path = _write(tmp_path, f"# ok\ntomli==2.0.1\n{line}\n")
    with pytest.raises(UserError) as e:
        deps.read_requirements(path)
    assert e.value.exit_code == 2
    assert e.value.message.startswith(f"{path}:3: {line}: ")
    assert says in e.value.message and "valid: one requirement per line by name" in e.value.message


def test_a_package_required_twice_is_refused(tmp_path):
    with pytest.raises(UserError, match=r":2: Six>=1: six is already required on line 1"):
        deps.read_requirements(_write(tmp_path, "six==1.16.0\nSix>=1\n"))


def test_a_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        deps.read_requirements(tmp_path / "requirements.txt")


def test_digest_ignores_comments_blank_lines_and_line_endings_only(tmp_path):
    plain = deps.digest_of(deps.read_requirements(_write(tmp_path, "six==1.16.0\ntomli==2.0.1\n", "a")))
    noisy = deps.digest_of(deps.read_requirements(
        _write(tmp_path, "# deps\r\n\r\nsix==1.16.0   # pinned\r\n  tomli==2.0.1\r\n", "b")))
    changed = deps.digest_of(deps.read_requirements(_write(tmp_path, "six==1.17.0\ntomli==2.0.1\n", "c")))
    assert plain == noisy != changed
    assert plain.startswith("sha256:") and len(plain) == 7 + 64


def test_tag_names_the_base_repository_and_depends_on_the_base_id_and_the_lines():
    lines = b"six==1.16.0\n"
    tag = deps.deps_tag("clusterctl/cpu:2.13.0", "sha256:" + "a" * 64, lines)
    assert tag.startswith("clusterctl-deps/clusterctl-cpu:") and len(tag.split(":")[1]) == 12
    assert tag != deps.deps_tag("clusterctl/cpu:2.13.0", "sha256:" + "b" * 64, lines)
    assert tag != deps.deps_tag("clusterctl/cpu:2.13.0", "sha256:" + "a" * 64, b"six==1.17.0\n")
    assert deps.repo_slug("localhost:5000/Team/PyTorch:24.01-py3") == "localhost-5000-team-pytorch"
    assert deps.repo_slug("nvcr.io/nvidia/pytorch@sha256:" + "c" * 64) == "nvcr-io-nvidia-pytorch"
    assert deps.repo_slug("sha256:" + "d" * 64) == "image"


def test_platform_tags_list_every_glibc_down_to_2_5_and_the_legacy_names():
    tags = deps.platform_tags("x86_64", ["glibc", "2.36"], "linux-x86_64")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_28_x86_64" in tags
    assert "manylinux_2_5_x86_64" in tags and tags[-1] == "manylinux2014_x86_64"
    assert deps.platform_tags("aarch64", ["", ""], "linux-aarch64") == ("linux_aarch64",)


# ---------------------------------------------------------------- engine


def _deps_tags(client, base: str) -> set[str]:
    """The tags of the layers made on ``base`` (only: another test may be building on others)."""
    repo = deps.deps_tag(base, "", b"").rsplit(":", 1)[0]
    return {t for i in client.images.list(name=repo) for t in i.tags}


@pytest.fixture
def cleanup(docker_client):
    """Tags a test made (or may have made): removed after it, whatever happened."""
    made: list[str] = []
    yield made
    for ref in made:
        deps.remove_quietly(docker_client, ref)


def _fresh(client, base: str, path: Path, cleanup: list[str]) -> str:
    """The tag ``path`` gets on ``base``, removed first (an earlier session may have left it)."""
    tag = deps.deps_tag(base, client.images.get(base).id, deps.normalised(deps.read_requirements(path)))
    deps.remove_quietly(client, tag)
    cleanup.append(tag)
    return tag


def _no_build(*a, **k):
    raise AssertionError("an image was built")


@pytest.mark.docker
def test_layer_is_built_once_then_cached_and_a_changed_file_gets_a_new_tag(
        docker_client, base_image, tmp_path, cleanup, monkeypatch):
    path = _write(tmp_path, f"# one small pure-python package\n{SIX}\n")
    tag = _fresh(docker_client, base_image, path, cleanup)
    log: list[str] = []

    built = deps.requirements_image(base_image, path, client=docker_client, log=log.append)
    assert (built.ref, built.cached, built.packages) == (tag, False, [SIX])
    assert built.requirements_digest == deps.digest_of(deps.read_requirements(path))
    out = imagebuild.run_smoke(docker_client, tag, ["python3", "-c", "import six; print(six.__version__)"])
    assert out.strip() == "1.16.0"
    image = docker_client.images.get(tag)
    assert image.id == built.image_id
    assert image.labels[deps.L_DIGEST] == built.requirements_digest
    assert image.labels[deps.L_BASE] == base_image
    assert image.labels[deps.L_BASE_ID] == docker_client.images.get(base_image).id
    assert image.labels[deps.L_PACKAGES] == SIX
    # only what pip installed: no wheels, no stage image left behind, one small layer
    leftovers = imagebuild.run_smoke(docker_client, tag, ["sh", "-c", f"ls {deps._IN} {deps.STAGE_ROOT} 2>&1; true"])
    assert "No such file" in leftovers and leftovers.count("No such file") == 2
    assert not [t for t in _deps_tags(docker_client, base_image) if "-stage-" in t]
    base_layers = docker_client.images.get(base_image).attrs["RootFS"]["Layers"]
    assert image.attrs["RootFS"]["Layers"][:-1] == base_layers

    # unchanged (a comment and blank lines do not count): one inspect, nothing built
    monkeypatch.setattr(imagebuild, "build", _no_build)
    path.write_text(f"{SIX}   # pinned\n\n")
    again = deps.requirements_image(base_image, path, client=docker_client, log=log.append)
    assert (again.ref, again.image_id, again.cached, again.packages) == (tag, built.image_id, True, [SIX])
    monkeypatch.undo()

    # changed: a new tag, the old one stays (another run may still use it)
    path.write_text(f"{SIX}\n{TOMLI}\n")
    new_tag = _fresh(docker_client, base_image, path, cleanup)
    changed = deps.requirements_image(base_image, path, client=docker_client, log=log.append)
    assert changed.ref == new_tag != tag and not changed.cached
    assert changed.packages == [SIX, TOMLI]
    assert docker_client.images.get(tag).id == built.image_id


@pytest.mark.docker
def test_the_layer_is_deterministic(docker_client, base_image, tmp_path, cleanup):
    """Built twice (the image removed in between), the layer has the same digest: nodes that
    hold it need nothing sent again, and a rebuild is not a new 'version' of the deps."""
    path = _write(tmp_path, f"{TOMLI}\n")
    _fresh(docker_client, base_image, path, cleanup)
    first = deps.requirements_image(base_image, path, client=docker_client, log=lambda line: None)
    layer = docker_client.images.get(first.ref).attrs["RootFS"]["Layers"][-1]
    docker_client.images.remove(first.ref)
    second = deps.requirements_image(base_image, path, client=docker_client, log=lambda line: None)
    assert not second.cached
    assert docker_client.images.get(second.ref).attrs["RootFS"]["Layers"][-1] == layer


@pytest.mark.docker
@pytest.mark.parametrize(("line", "says"), [
    ("no-such-package-xyz==1.0", "no-such-package-xyz==1.0: no matching distribution for python 3.11"),
    ("six==99", "six==99: no matching distribution for python 3.11; valid: one of the versions "),
])
def test_an_uninstallable_package_fails_before_any_build_naming_its_line(
        docker_client, base_image, tmp_path, monkeypatch, line, says):
    path = _write(tmp_path, f"{TOMLI}\n# the bad one:\n{line}\n")
    monkeypatch.setattr(imagebuild, "build", _no_build)
    before = _deps_tags(docker_client, base_image)
    with pytest.raises(UserError) as e:
        deps.requirements_image(base_image, path, client=docker_client, log=lambda line: None)
    assert e.value.message.startswith(f"{path}:3: {says}")
    valid = "1.16.0, 1.17.0" if line.startswith("six") else "valid: a package name on the indexes"
    assert valid in e.value.message
    assert _deps_tags(docker_client, base_image) == before


def test_an_option_line_is_refused_before_the_engine_is_asked(tmp_path):
    path = _write(tmp_path, f"{SIX}\n--index-url https://pypi.example/simple\n")
    with pytest.raises(UserError, match=r":2: --index-url .*: pip option --index-url is not supported"):
        deps.requirements_image("clusterctl/base:bookworm", path, client=object())


@pytest.mark.docker
def test_replacing_a_package_of_the_base_is_refused(docker_client, base_image, tmp_path, throwaway_tag, cleanup):
    """A layer cannot delete the base's files: six 1.15.0 in the base and six==1.16.0 asked for
    would leave both versions' metadata in the image."""
    ctx = tmp_path / "ctx"
    dist = "usr/local/lib/python3.11/dist-packages/six-1.15.0.dist-info"
    (ctx / dist).mkdir(parents=True)
    (ctx / dist / "METADATA").write_text("Metadata-Version: 2.1\nName: six\nVersion: 1.15.0\n")
    (ctx / dist / "RECORD").write_text(f"{dist.split('/')[-1]}/METADATA,,\n{dist.split('/')[-1]}/RECORD,,\n")
    (ctx / "Dockerfile").write_text(f"FROM {base_image}\nCOPY usr/ /usr/\n")
    imagebuild.build(docker_client, ctx, tag=throwaway_tag, on_output=lambda line: None)
    path = _write(tmp_path, f"{TOMLI}\n{SIX}\n")
    tag = _fresh(docker_client, throwaway_tag, path, cleanup)
    with pytest.raises(UserError) as e:
        deps.requirements_image(throwaway_tag, path, client=docker_client, log=lambda line: None)
    assert e.value.message.startswith(f"{path}:2: {SIX}: installing it would replace what image "
                                      f"{throwaway_tag} has: six 1.15.0 -> 1.16.0")
    assert tag not in _deps_tags(docker_client, throwaway_tag)
    assert not [t for t in _deps_tags(docker_client, throwaway_tag) if "-stage-" in t]


@pytest.mark.docker
def test_an_image_not_built_on_the_local_base_is_asked_for_its_python_once(
        docker_client, base_image, cache, monkeypatch):
    """Any other base: python3 in the image says its version and C library; the answer is
    kept by image ID (a second call reads it, here a doctored answer, proving no re-ask)."""
    attrs = docker_client.api.inspect_image(base_image)
    assert deps.python_facts(docker_client, base_image, attrs).source.startswith("targets data")
    monkeypatch.setattr(deps, "_on_local_base", lambda client, attrs: None)
    facts = deps.python_facts(docker_client, base_image, attrs)
    assert facts.version == "3.11"
    assert facts.platforms[0] == "manylinux_2_36_x86_64" and "manylinux2014_x86_64" in facts.platforms
    answer = cache / "deps" / "python" / f"{attrs['Id'].split(':')[1]}.json"
    doctored = dict(json.loads(answer.read_text()), version="3.99")
    answer.write_text(json.dumps(doctored))
    assert deps.python_facts(docker_client, base_image, attrs).version == "3.99"
