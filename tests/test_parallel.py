"""tests/fixtures/parallel.py: what keeps pytest-xdist's workers apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.fixtures import REPO, parallel


def test_every_grouped_module_exists_and_is_in_one_group_only():
    modules = [m for group in parallel.GROUPS.values() for m in group]
    assert len(modules) == len(set(modules))
    assert [m for m in modules if not (REPO / m).is_file()] == []


def test_a_module_is_its_own_unit_unless_it_is_in_a_group():
    assert parallel.unit_of("tests/run/test_launch.py::test_ddp_smoke_on_three_nodes") == "tree"
    assert parallel.unit_of("tests/cluster/test_tree.py::test_x[a::b]") == "tree"
    assert parallel.unit_of("tests/run/test_plan.py::test_y") == "tests/run/test_plan.py"


def _isolated(env: dict[str, str]) -> dict[str, str]:
    code = ("import json, os; from tests.fixtures import parallel; parallel.isolate_worker(); "
            "print(json.dumps({k: os.environ.get(k) for k in "
            "('CLUSTERCTL_TEST_SANDBOX', 'CLUSTERCTL_TEST_SUBNET', 'COLUMNS')}))")
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTEST_XDIST_WORKER", "CLUSTERCTL_TEST_SANDBOX", "CLUSTERCTL_TEST_SUBNET")}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    import json

    return json.loads(out)


def test_worker_0_keeps_the_defaults_and_the_others_get_a_name_and_subnets_of_their_own():
    assert _isolated({"PYTEST_XDIST_WORKER": "gw0", "COLUMNS": "80"}) == {
        "CLUSTERCTL_TEST_SANDBOX": None, "CLUSTERCTL_TEST_SUBNET": None, "COLUMNS": None}
    one = _isolated({"PYTEST_XDIST_WORKER": "gw1"})
    assert one["CLUSTERCTL_TEST_SANDBOX"] == "tst1" and one["CLUSTERCTL_TEST_SUBNET"] == "10.213.119.0/24"
    two = _isolated({"PYTEST_XDIST_WORKER": "gw2", "CLUSTERCTL_TEST_SANDBOX": "mine",
                     "CLUSTERCTL_TEST_SUBNET": "10.50.0.0/24"})
    assert two["CLUSTERCTL_TEST_SANDBOX"] == "mine2" and two["CLUSTERCTL_TEST_SUBNET"] == "10.50.40.0/24"
    # outside xdist nothing changes, COLUMNS included
    assert _isolated({"COLUMNS": "123"})["COLUMNS"] == "123"


def test_timings_name_each_unit_its_worker_and_its_tests(tmp_path):
    """CLUSTERCTL_TEST_TIMINGS: the file the workers' balance is read from."""
    out = tmp_path / "timings.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                        "tests/core/test_durations.py", "tests/cluster/test_clean.py"],
                       env={**env, "CLUSTERCTL_TEST_TIMINGS": str(out)}, cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert {row["unit"] for row in rows} == {"tests/core/test_durations.py", "tests/cluster/test_clean.py"}
    assert {row["worker"] for row in rows} <= {"gw0", "gw1"}
    assert all(row["tests"] > 0 and row["seconds"] >= 0 and row["last_end"] >= row["first_end"]
               for row in rows)
