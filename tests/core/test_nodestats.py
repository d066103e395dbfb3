"""core.nodestats: the parsers of docker stats, nvidia-smi and cnmon output (fast tier).

docker stats' output is RECORDED on the local engine; nvidia-smi's is RECORDED on a lent H200
machine (``..._captured_...``) and also a STAND-IN in its documented format (several GPUs, N/A
values); cnmon's is a STAND-IN (no MLU was reachable): tests/fixtures/top/README.md.
"""

from __future__ import annotations

import pytest

from clusterctl.core.nodestats import (
    GpuUse,
    parse_cnmon,
    parse_docker_stats,
    parse_nvidia_smi,
    parse_size,
)
from tests.fixtures import REPO

FIXTURES = REPO / "tests" / "fixtures" / "top"
MIB, GIB = 1 << 20, 1 << 30


def test_docker_stats_parse_recorded_output():
    got = parse_docker_stats((FIXTURES / "docker-stats.jsonl").read_text())
    assert [(c.name, c.cpu_percent) for c in got] == [
        ("top-record-29667", 74.07), ("top-record-idle-29667", 0.0), ("tr2-29667", 0.0)]
    busy = got[0]
    assert busy.id == "071de27fc3bf" and busy.memory_bytes == 648 * 1024
    assert busy.memory_limit_bytes == int(23.54 * GIB)
    ended = got[2]  # an exited container: 0B / 0B, no limit known
    assert ended.id.startswith("5db00dc48852") and len(ended.id) == 64
    assert ended.memory_bytes == 0 and ended.memory_limit_bytes is None


def test_docker_stats_skips_junk_lines():
    text = ("Error response from daemon: No such container: x\n{not json\n[1, 2]\n"
            '{"ID": "a", "CPUPerc": "--", "MemUsage": "--"}\n' + "{" * 10000 + "\n")
    got = parse_docker_stats(text)
    assert len(got) == 1 and got[0].cpu_percent is None and got[0].memory_bytes is None
    assert parse_docker_stats("") == []


@pytest.mark.parametrize("text,expected", [
    ("648KiB", 648 * 1024), ("1.04kB", 1040), ("0B", 0), ("23.54GiB", int(23.54 * GIB)),
    ("7.6GB", 7_600_000_000), ("12", 12), (" 3MiB ", 3 * MIB), ("--", None), ("", None),
    ("1.5XB", None), ("-1B", None),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_nvidia_smi_parse_stand_in_output():
    got = parse_nvidia_smi((FIXTURES / "nvidia-smi-query.csv").read_text())
    assert got[0] == GpuUse(0, 97.0, 71234 * MIB, 81559 * MIB)
    assert [g.index for g in got] == [0, 1, 2, 3]
    assert got[2].util_percent == 0.0
    assert got[3] == GpuUse(3, None, None, 81559 * MIB)  # [Not Supported], [N/A]


def test_nvidia_smi_parse_captured_h200_output():
    """Three reads of a real H200 (driver 580.159.04): idle, a small nccl training, bf16 products."""
    got = parse_nvidia_smi((FIXTURES / "nvidia-smi-query-h200.csv").read_text())
    assert got == [GpuUse(0, 0.0, 0, 143771 * MIB), GpuUse(0, 0.0, 529 * MIB, 143771 * MIB),
                   GpuUse(0, 100.0, 1011 * MIB, 143771 * MIB)]


def test_nvidia_smi_skips_what_is_not_a_gpu_line():
    text = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
            "index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n0, 1, 2\n")
    assert parse_nvidia_smi(text) == []


def test_cnmon_parse_stand_in_output():
    got = parse_cnmon((FIXTURES / "cnmon-info-u-m.txt").read_text())
    assert got == [GpuUse(0, 87.0, 20480 * MIB, 49152 * MIB), GpuUse(1, 0.0, 1032 * MIB, 49152 * MIB)]


def test_cnmon_parse_the_health_checks_stand_in_too():
    """The other stand-in layout (tests/fixtures/accel/, `check`'s): the same cards read."""
    got = parse_cnmon((REPO / "tests" / "fixtures" / "accel" / "cnmon-info-mlu370x2.txt").read_text())
    assert got == [GpuUse(0, 0.0, 1045 * MIB, 24576 * MIB), GpuUse(1, 0.0, 1045 * MIB, 24576 * MIB)]


def test_cnmon_virtual_memory_is_not_taken_and_junk_is_skipped():
    text = ("cnmon: warning\nCard : 2\n  Virtual Memory Usage :\n    Total : 9 MiB\n"
            "    Used : 8 MiB\n  MLU Average : n/a %\n")
    assert parse_cnmon(text) == []
    assert parse_cnmon("") == []
