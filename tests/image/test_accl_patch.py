"""The ACCL patch script (templates/accl/patch_c10d.py) against REAL distributed_c10d.py files.

The files come from real packages, fetched once per machine into the cache:
Debian's python3-torch 1.13.1 (`apt-get download`, then `dpkg-deb -x`; never
installed) and the torch 2.13.0 wheel in /opt/wheels (only the two files
needed are unzipped).  The script runs as in the image: a subprocess given
the file and that torch's own ``__version__``.
"""

from __future__ import annotations

import ast
import difflib
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from clusterctl.core.paths import cache_dir, templates_dir
from clusterctl.image.render import dockerfile_text

SCRIPT = templates_dir() / "accl" / "patch_c10d.py"
C10D = "torch/distributed/distributed_c10d.py"
WHEEL_DIR = Path("/opt/wheels")


def _torch_version(version_py: Path) -> str:
    return re.search(r"__version__ = '([^']+)'", version_py.read_text())[1]


def _debian_torch(root: Path) -> tuple[Path, str]:
    """distributed_c10d.py and torch.__version__ of Debian's python3-torch, fetched and extracted."""
    pkg = root / "usr/lib/python3/dist-packages/torch"
    if not (pkg / "distributed/distributed_c10d.py").exists():
        if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
            pytest.fail("apt-get and dpkg-deb are needed to fetch Debian's python3-torch")
        download = root.parent / "deb"
        download.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["apt-get", "download", "python3-torch"], cwd=download,
                              capture_output=True, text=True)
        debs = sorted(download.glob("python3-torch_1.13.1*.deb"))
        assert debs, f"apt-get download python3-torch gave no 1.13.1 .deb: {proc.stderr}"
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(root)], check=True)
    return pkg / "distributed/distributed_c10d.py", _torch_version(pkg / "version.py")


def _wheel_torch(root: Path) -> tuple[Path, str]:
    """distributed_c10d.py and torch.__version__ of the torch 2.13.0 wheel in /opt/wheels."""
    target = root / C10D
    if not target.exists():
        wheels = sorted(WHEEL_DIR.glob("torch-2.13.0*.whl"))
        assert wheels, f"no torch 2.13.0 wheel in {WHEEL_DIR}"
        with zipfile.ZipFile(wheels[-1]) as z:
            z.extract(C10D, root)
            z.extract("torch/version.py", root)
    return target, _torch_version(root / "torch/version.py")


@pytest.fixture(scope="session")
def real_c10d() -> dict[str, tuple[Path, str]]:
    """{"1.13": (file, version), "2.13": (file, version)}, cached across sessions."""
    base = cache_dir() / "test-accl-patch"
    return {"1.13": _debian_torch(base / "debian-python3-torch" / "root"),
            "2.13": _wheel_torch(base / "torch-2.13.0-wheel")}


def _copy(real: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "distributed_c10d.py"
    shutil.copyfile(real, dst)
    return dst


def _patch(path: Path, version: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--file", str(path), "--torch-version", version],
                          capture_output=True, text=True, timeout=60)


def _changes(before: str, after: str) -> list[str]:
    return [line for line in difflib.ndiff(before.splitlines(), after.splitlines())
            if line[:2] in ("- ", "+ ")]


def test_the_real_files_are_the_versions_studied(real_c10d):
    # Debian builds 1.13.1 but its version.py says 1.13.0a0: the image passes this value.
    assert real_c10d["1.13"][1] == "1.13.0a0"
    assert real_c10d["2.13"][1] == "2.13.0+cpu"


def test_debian_1_13_gets_exactly_the_nccl_check_and_barrier_edits(real_c10d, tmp_path):
    real, version = real_c10d["1.13"]
    path = _copy(real, tmp_path)
    before = path.read_text()

    proc = _patch(path, version)

    assert proc.returncode == 0, proc.stderr
    assert "patched for accl (torch 1.13.0a0): nccl-check, barrier-device-ids" in proc.stdout
    after = path.read_text()
    assert _changes(before, after) == [
        '+         or get_backend(group) == "accl"',
        "-         if get_backend(group) != Backend.NCCL:",
        '+         if get_backend(group) != Backend.NCCL and get_backend(group) != "accl":',
        "+ # clusterctl: accl patched (nccl-check, barrier-device-ids)",
    ]
    # The object collectives' device choice now says "GPU" for accl as for nccl:
    # _check_for_nccl_backend returns (nccl available and isinstance NCCL) or backend == "accl".
    fn = next(n for n in ast.walk(ast.parse(after))
              if isinstance(n, ast.FunctionDef) and n.name == "_check_for_nccl_backend")
    ret = fn.body[-1].value
    assert isinstance(ret, ast.BoolOp) and isinstance(ret.op, ast.Or)
    assert ast.unparse(ret.values[1]) == "get_backend(group) == 'accl'"
    assert ast.unparse(ret.values[0]) == "is_nccl_available() and isinstance(pg, ProcessGroupNCCL)"


def test_patching_twice_is_a_no_op(real_c10d, tmp_path):
    real, version = real_c10d["1.13"]
    path = _copy(real, tmp_path)
    assert _patch(path, version).returncode == 0
    once = path.read_text()

    proc = _patch(path, version)

    assert proc.returncode == 0
    assert "already patched" in proc.stdout
    assert path.read_text() == once


def test_torch_2_13_is_left_unchanged_and_registers_instead(real_c10d, tmp_path):
    real, version = real_c10d["2.13"]
    path = _copy(real, tmp_path)

    proc = _patch(path, version)

    assert proc.returncode == 0, proc.stderr
    assert "torch 2.13.0+cpu" in proc.stdout
    assert "register_backend('accl', func, devices=['cuda'])" in proc.stdout
    assert path.read_bytes() == real.read_bytes()


def test_the_seed_sed_edits_would_silently_break_torch_2_13(real_c10d, tmp_path):
    """Why the script exists: seeds/003's sed exits 0 on 2.13 and rewrites unrelated lines."""
    real, _ = real_c10d["2.13"]
    path = _copy(real, tmp_path)
    proc = subprocess.run(["sed", "-i",
                           "-e", "/is_nccl_backend =/s/=.*/= group_backend != Backend.MPI and group_backend != Backend.GLOO/g",
                           "-e", '/GroupNCCL/ {N; /):/ s/:/ or get_backend(group) == "accl":/}',
                           "-e", '/!= Backend.NCCL:/s/:/ and get_backend(group) != "accl":/',
                           str(path)], capture_output=True, text=True)
    assert proc.returncode == 0
    changed = [c for c in _changes(real.read_text(), path.read_text()) if c.startswith("+ ")]
    assert changed and all("ProcessGroupNCCL" in c for c in changed)


@pytest.mark.parametrize(("which", "claimed", "edit"), [
    ("1.13", "1.10.0a0", "is-nccl-backend"),   # a 1.10 profile on a file without its anchor
    ("2.13", "1.13.1", "nccl-check"),          # a 1.13 profile on the 2.13 file
])
def test_a_missing_anchor_fails_naming_the_edit_and_version(real_c10d, tmp_path, which, claimed, edit):
    real, _ = real_c10d[which]
    path = _copy(real, tmp_path)

    proc = _patch(path, claimed)

    assert proc.returncode == 1
    assert f"edit '{edit}'" in proc.stderr
    assert f"torch {claimed}" in proc.stderr
    assert "changed 0 place(s)" in proc.stderr
    assert path.read_bytes() == real.read_bytes()


def test_register_path_refused_when_register_backend_has_no_devices(real_c10d, tmp_path):
    real, _ = real_c10d["1.13"]   # 1.13's register_backend(name, func, extended_api)
    path = _copy(real, tmp_path)

    proc = _patch(path, "2.0.0")

    assert proc.returncode == 1
    assert "no 'devices' parameter" in proc.stderr and "torch 2.0.0" in proc.stderr
    assert path.read_bytes() == real.read_bytes()


def test_unsupported_old_torch_is_refused(real_c10d, tmp_path):
    path = _copy(real_c10d["1.13"][0], tmp_path)

    proc = _patch(path, "1.7.1")

    assert proc.returncode == 1
    assert "torch 1.7.1 is not supported by the accl patch" in proc.stderr
    assert "1.8 to 1.10, 1.11 to 1.13" in proc.stderr


def _patch_run_step() -> str:
    """The shell command of the accl Dockerfile's patch RUN step, as rendered."""
    lines = dockerfile_text("accl").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("RUN c10d="))
    step = []
    for line in lines[start:]:
        step.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    return " ".join(step).removeprefix("RUN ")


@pytest.mark.docker
def test_the_rendered_run_step_takes_the_register_path_in_a_real_torch_2_13_image(docker_client, cpu_image):
    """The RUN step itself (locate the file via torch, read torch.__version__, run the script)
    in the real cpu image, whose torch is 2.13.0+cpu.  NGC images have `python`; Debian's
    python3 gets that name first."""
    command = "ln -s /usr/bin/python3 /usr/local/bin/python && " + _patch_run_step()
    container = docker_client.containers.create(
        cpu_image, ["bash", "-c", command], network_mode="none",
        volumes={str(SCRIPT): {"bind": "/opt/clusterctl/accl/patch_c10d.py", "mode": "ro"}},
    )
    try:
        container.start()
        code = container.wait(timeout=120)["StatusCode"]
        output = container.logs(stdout=True, stderr=True).decode()
    finally:
        container.remove(force=True)
    assert code == 0, output
    assert ("torch 2.13.0+cpu: /usr/local/lib/python3.11/dist-packages/torch/distributed/"
            "distributed_c10d.py left unchanged; accl registers through") in output
