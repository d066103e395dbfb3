"""clusterctl.dockerd against the real dockerd binary."""

import shutil

import pytest

from clusterctl.cluster import dockerd
from clusterctl.core.errors import EnvironmentProblem

pytestmark = pytest.mark.skipif(shutil.which("dockerd") is None, reason="docker.io not installed")


def test_a_daemon_that_dies_is_reported_with_its_log_not_waited_for(tmp_path):
    paths = dockerd.DaemonPaths(root=tmp_path / "state", data_root=tmp_path / "data")
    with pytest.raises(EnvironmentProblem) as e:
        dockerd.start(paths, extra_args=["--no-such-flag"], timeout=600)
    # the 600 s wait was cut short because the process exited, and its own words are shown
    assert "exited with status" in e.value.message
    assert "unknown flag: --no-such-flag" in e.value.message
    assert not dockerd.socket_answers(paths.socket)
