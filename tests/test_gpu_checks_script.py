"""scripts/gpu-checks (the GPU figures of docs/how-to/gpu-mlu-nodes.md) refuses clearly where
it cannot run: no GPU is reachable here, so what it measures ran on a lent H200 machine and
its output is read by tests/cluster/test_accelprobe.py and tests/core/test_nodestats.py."""

from __future__ import annotations

import shutil
import subprocess

from tests.fixtures import REPO

SCRIPT = REPO / "scripts" / "gpu-checks"


def _run(path: str, out, **env) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT), str(out)], capture_output=True, text=True,
                          timeout=60, env={"PATH": path, **env})


def test_without_nvidia_smi_it_exits_2_and_writes_nothing(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("dirname", "mkdir", "mktemp", "rm", "date"):
        found = shutil.which(tool)
        if found:
            (bare / tool).symlink_to(found)
    r = _run(str(bare), tmp_path / "out")
    assert r.returncode == 2, r
    assert r.stderr.strip() == ("gpu-checks: no nvidia-smi on this machine: run it where an NVIDIA "
                                "GPU and its driver are")
    assert not (tmp_path / "out").exists()


def test_with_a_python_that_has_no_cuda_torch_it_exits_2_naming_it(tmp_path):
    """A stand-in nvidia-smi (no GPU here); this machine's python3 has no torch."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bare / "nvidia-smi").chmod(0o755)
    python = shutil.which("python3")
    r = _run(f"{bare}:/usr/bin:/bin", tmp_path / "out", PYTHON=python)
    assert r.returncode == 2, r
    assert r.stderr.strip() == (f"gpu-checks: {python} has no torch that sees a GPU (set PYTHON=... "
                                "to one that has)")
    assert not (tmp_path / "out").exists()


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
