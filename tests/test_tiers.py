"""The fast tier keeps its promise (tests/fixtures/tiers.py; `make test-fast`, `pytest --fast`).

A probe module of tests is run by a real pytest in a subprocess, with the suite's own
plugins (tests/conftest.py's list) and its markers: a test on an engine's or a sandbox's
fixture, directly or through a fixture of its own, gets the marker without being given
it, and ``--fast`` leaves it out, with the slow ones; a test that reaches the engine or a
sandbox without a marker fails, naming the marker, instead of running on whatever engine
this machine has; nothing reaches either (``sandbox.up``'s machine-changing steps are
stubbed in the probe, so that a broken guard fails the probe, not this machine).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.fixtures import REPO
from tests.fixtures.tiers import NO_ENGINE

PROBE = '''
import os
import subprocess
import sys

import pytest

from clusterctl.cluster import engine, sandbox
from clusterctl.cluster.sandbox import lifecycle, network
from clusterctl.core.errors import EnvironmentProblem


@pytest.fixture
def my_image(docker_client):
    return "tag"


def test_on_the_engine(docker_client):
    pass


def test_on_a_fixture_on_the_engine(my_image):
    pass


def test_on_a_sandbox(clean_nodes):
    pass


@pytest.mark.slow
def test_marked_slow():
    pass


def test_plain():
    pass


def test_reaches_the_engine_unmarked():
    engine.client()


def test_brings_up_a_sandbox_unmarked(tmp_path, monkeypatch):
    # what sandbox.up does before it makes anything, made harmless; its first step that
    # makes something raises, so that a missing guard fails here and changes nothing
    monkeypatch.setenv("CLUSTERCTL_STATE", str(tmp_path / "state"))
    monkeypatch.setattr(lifecycle, "require_environment", lambda what: None)
    monkeypatch.setattr(lifecycle, "_teardown", lambda name: None)
    monkeypatch.setattr(network, "check_subnet_free", lambda sb: None)

    def save(sb):
        raise AssertionError("THE GUARD LET sandbox.up THROUGH")

    monkeypatch.setattr(lifecycle, "save", save)
    sandbox.up(1, name="zzfast", subnet="10.213.251.0/24", inventory_path=tmp_path / "i.yaml")


def test_a_subprocess_finds_no_engine():
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ['DOCKER_HOST'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    print("DOCKER_HOST=" + out)


def test_a_docker_host_of_the_tests_own_gets_the_real_client(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    with pytest.raises(EnvironmentProblem, match="does not answer"):
        engine.client()
'''


def _pytest(tmp_path: Path, *args: str) -> str:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_plugins  # noqa: F401\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    env.pop("DOCKER_HOST", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-q", "-s", "-rA", *args, str(probe)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


def _outcomes(output: str) -> dict[str, str]:
    return {name: outcome for outcome, name in
            re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED)\S* \S*::(test_\w+)", output, re.M)}


def test_the_fast_tier_leaves_out_the_engine_sandbox_and_slow_tests_and_fails_the_unmarked(tmp_path):
    out = _pytest(tmp_path, "--fast")
    assert _outcomes(out) == {
        "test_plain": "PASSED",
        "test_reaches_the_engine_unmarked": "FAILED",
        "test_brings_up_a_sandbox_unmarked": "FAILED",
        "test_a_subprocess_finds_no_engine": "PASSED",
        "test_a_docker_host_of_the_tests_own_gets_the_real_client": "PASSED",
    }, out
    assert "4 deselected" in out, out
    assert "this test reached the Docker engine in the fast tier" in out and "`docker` marker" in out, out
    assert "this test reached a sandbox in the fast tier" in out and "`sandbox` marker" in out, out
    assert "THE GUARD LET" not in out, out
    assert f"DOCKER_HOST={NO_ENGINE}" in out, out


def test_the_markers_come_from_the_fixtures_in_the_whole_suite_too(tmp_path):
    """Without --fast nothing is guarded, but `-m` sees the markers the fixtures gave."""
    out = _pytest(tmp_path, "--collect-only", "-m", "docker or sandbox")
    assert sorted(re.findall(r"::(test_\w+)", out)) == [
        "test_on_a_fixture_on_the_engine", "test_on_a_sandbox", "test_on_the_engine"], out
