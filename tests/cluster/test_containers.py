"""The pure half of clusterctl.cluster.containers: docker's times, inspect JSON, log argv.

The commands themselves run against real nodes in tests/run/test_launch.py (sandbox).
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from clusterctl.cluster import containers


def test_docker_times_parse_with_nanoseconds_and_zero_time():
    assert containers.parse_docker_time("2026-11-22T04:30:58.865205123Z") == datetime(
        2026, 11, 22, 4, 30, 58, 865205, tzinfo=timezone.utc)
    assert containers.parse_docker_time("0001-01-01T00:00:00Z") is None
    st = containers.state_from_inspect("node1", {
        "Name": "/r-node1", "State": {"Status": "running", "ExitCode": 0, "StartedAt": "2026-11-22T04:30:58Z",
                                      "FinishedAt": "0001-01-01T00:00:00Z"},
        "Config": {"Labels": {containers.RANK_LABEL: "2"}}})
    assert (st.name, st.running, st.exit_code, st.finished, st.rank) == ("r-node1", True, None, None, 2)


@pytest.mark.parametrize("kw,argv", [
    ({}, ["docker", "logs", "c"]),
    ({"follow": True, "tail": 5, "timestamps": True},
     ["docker", "logs", "--follow", "--tail", "5", "--timestamps", "c"]),
])
def test_docker_logs_argv(kw, argv):
    assert containers.docker_logs_argv("c", **kw) == argv
