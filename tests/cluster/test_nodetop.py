"""cluster.nodetop: the one script a node runs per `top` refresh, and reading its answer (fast tier).

The answers below are built from RECORDED docker stats output (tests/fixtures/top/) and the
nvidia-smi / cnmon STAND-INS (no GPU or MLU here); the script itself runs for real on the
sandbox in tests/run/test_top_sandbox.py.
"""

from __future__ import annotations

import shutil
import subprocess

from clusterctl.cluster.nodetop import SECTION, parse_read, read_script
from clusterctl.cluster.runtime import runtime_for
from tests.fixtures import REPO

FIXTURES = REPO / "tests" / "fixtures" / "top"
STATS = (FIXTURES / "docker-stats.jsonl").read_text()
BUSY = "071de27fc3bf26928431ddb41797ebca46da8d7eba0ba4fd32b5c6f7724b7cfb"
IDLE = "9c558a47c417428e3042dd82de3bde509e4e339f94d8af1816970f2342861630"
LINE = 'clusterctl-metrics {"rank": 1, "step": 3, "loss": 0.5, "samples": 192, "time": 1764369000.5}'


def answer(stats: str = STATS, gpu: str = "none", metrics: str = LINE, end: bool = True) -> str:
    parts = [f"{SECTION}stats", stats.rstrip("\n"), f"{SECTION}gpu", gpu, f"{SECTION}metrics", metrics]
    return "\n".join(parts + ([f"{SECTION}end"] if end else [])) + "\n"


def test_read_script_is_one_sh_script_through_the_runtime():
    script = read_script(runtime_for("docker"), BUSY, log_lines=500, keep=50)
    assert f"docker stats --no-stream --no-trunc --format '{{{{json .}}}}' {BUSY} 2>&1" in script
    assert f"docker logs --tail 500 {BUSY} 2>&1 | grep -F clusterctl-metrics | tail -n 50" in script
    assert "nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total" in script
    assert "cnmon info -u 2>&1; cnmon info -m 2>&1" in script
    subprocess.run(["sh", "-n", "-c", script], check=True)  # valid sh


def test_read_script_on_a_node_without_docker_or_gpu_tools_still_ends(tmp_path):
    """Run for real by sh with a PATH that has neither docker nor a GPU tool: every section
    comes, the read says what is missing instead of failing."""
    script = read_script(runtime_for("docker"), BUSY)
    for tool in ("grep", "tail"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                          env={"PATH": str(tmp_path)}, timeout=30)
    got = parse_read("node1", 0, BUSY, done.stdout)
    assert got.container is None and got.gpu_tool is None and not got.metric_lines
    assert any("not found" in p for p in got.problems), got.problems


def test_parse_read_takes_the_run_container_and_metrics():
    got = parse_read("node2", 1, IDLE, answer())
    assert got.container is not None and got.container.name == "top-record-idle-29667"
    assert got.container.cpu_percent == 0.0
    assert got.metric_lines == (LINE,) and got.problems == () and got.error is None


def test_parse_read_gpus_from_nvidia_smi_and_cnmon_stand_ins():
    nv = parse_read("n", 0, BUSY, answer(gpu="nvidia-smi\n" + (FIXTURES / "nvidia-smi-query.csv").read_text()))
    assert nv.gpu_tool == "nvidia-smi" and [g.index for g in nv.gpus] == [0, 1, 2, 3]
    cn = parse_read("n", 0, BUSY, answer(gpu="cnmon\n" + (FIXTURES / "cnmon-info-u-m.txt").read_text()))
    assert cn.gpu_tool == "cnmon" and [g.util_percent for g in cn.gpus] == [87.0, 0.0]
    broken = parse_read("n", 0, BUSY, answer(gpu="nvidia-smi\nFailed to initialize NVML: Driver/library "
                                                  "version mismatch"))
    assert broken.gpus == () and broken.problems == (
        "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch",)


def test_parse_read_names_a_gone_container_and_a_cut_answer():
    gone = parse_read("n", 0, "abc", answer(stats="Error response from daemon: No such container: abc"))
    assert gone.container is None
    assert gone.problems == ("container abc: Error response from daemon: No such container: abc",)
    cut = parse_read("n", 0, BUSY, answer(end=False))
    assert "the node's answer was cut short" in cut.problems
    other = parse_read("n", 0, BUSY, "sh: 1: Syntax error\n")
    assert other.problems == ("the node's answer was not the read's: sh: 1: Syntax error",)


def test_parse_read_a_training_printing_a_section_line_does_not_confuse_it():
    metrics = LINE + f"\n{SECTION}stats\nnoise"
    got = parse_read("n", 0, BUSY, answer(metrics=metrics))
    assert got.container is not None and got.container.id == "071de27fc3bf"
    assert got.metric_lines == (LINE,)
