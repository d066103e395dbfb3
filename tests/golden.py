"""Golden files shared by the tests that fix rendered text (Dockerfiles, Kubernetes manifests).

``UPDATE_GOLDEN=1`` rewrites a golden file with the rendered text (after review); otherwise a
difference fails with a unified diff.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest


def assert_matches_golden(golden: Path, text: str, what: str) -> None:
    """``text`` must equal the file ``golden`` (rewritten first under UPDATE_GOLDEN=1)."""
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: run UPDATE_GOLDEN=1 python -m pytest (after review)"
    expected = golden.read_text()
    if text != expected:
        name = f"{golden.parent.name}/{golden.name}"
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            name, "rendered"))
        pytest.fail(f"rendered {what} differs from {name} "
                    f"(UPDATE_GOLDEN=1 rewrites it after review):\n{diff}")
