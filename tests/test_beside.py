"""``pytest --beside`` (tests/fixtures/beside.py): the selected tests of its modules run in a
second, real pytest, never in the first, and the first prints the second's results."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.fixtures import REPO


def test_the_modules_beside_run_in_a_second_session_whose_output_the_first_prints():
    env = {**os.environ, "CLUSTERCTL_TEST_PREFETCH": "0"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--beside", "-v",
                          "tests/image/test_baseimage.py", "tests/test_tiers.py", "-k",
                          "deb822 or mirror_is_the_first or markers_come_from_the_fixtures_in_the_whole"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    first, _, second = out.partition("the modules run beside (tests/fixtures/beside.py)")
    assert "test_tiers.py::test_the_markers_come_from_the_fixtures_in_the_whole_suite_too PASSED" in first
    assert "test_baseimage.py" not in first.split("its output:")[-1], first   # not run here
    assert "test_baseimage.py::test_deb822_stanzas_with_comments_continuations_and_enabled_no PASSED" in second
    assert "test_baseimage.py::test_mirror_is_the_first_enabled_deb_source_for_exactly_that_suite PASSED" in second
    assert "test_tiers.py" not in second, second
    assert "beside: exit status 0" in second and "2 passed" in second, second


def test_without_beside_one_session_runs_them_all():
    env = {**os.environ, "CLUSTERCTL_TEST_PREFETCH": "0"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v",
                          "tests/image/test_baseimage.py", "-k", "deb822"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "run beside" not in res.stdout and "1 passed" in res.stdout, res.stdout
