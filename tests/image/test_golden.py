"""Golden files: the exact rendered Dockerfile of every target and variant, and entrypoint.sh of every target.

A template or data change shows up here as a diff to review.  After reviewing,
rewrite the files with ``UPDATE_GOLDEN=1 python -m pytest tests/image/test_golden.py``
(or ``make golden``): both kinds are rewritten.  The same Dockerfile variants are
linted by tests/image/test_hadolint.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.image.render import dockerfile_text, entrypoint_text
from clusterctl.image.targets import load_targets
from tests.fixtures.golden import matches_golden

GOLDEN_DIR = Path(__file__).parent / "golden"

# (golden file name, target, torch, offline = rendered as with --wheelhouse DIR, --base-image)
VARIANTS = [
    ("cpu.Dockerfile", "cpu", None, False, None),
    ("ipex-1.10.0.Dockerfile", "ipex", "1.10.0", False, None),
    ("ipex-1.12.1.Dockerfile", "ipex", "1.12.1", False, None),
    ("ipex-2.3.1.Dockerfile", "ipex", "2.3.1", False, None),
    ("ipex-2.3.1-wheelhouse.Dockerfile", "ipex", "2.3.1", True, None),
    # IPEX on the local Debian base (what this machine builds): python3, pip from its wheel
    ("ipex-2.8.0-local-base.Dockerfile", "ipex", "2.8.0", True, "clusterctl/base:bookworm"),
    ("accl.Dockerfile", "accl", None, False, None),
    ("accl-wheelhouse.Dockerfile", "accl", None, True, None),
    ("nccl.Dockerfile", "nccl", None, False, None),
    ("nccl-wheelhouse.Dockerfile", "nccl", None, True, None),
    ("cambricon.Dockerfile", "cambricon", None, False, None),
    ("cambricon-wheelhouse.Dockerfile", "cambricon", None, True, None),
]

# (golden file name, target, torch): the entrypoint does not depend on --wheelhouse;
# ipex sets up oneCCL through torch_ccl up to 1.11 and oneccl_bindings_for_pytorch after.
ENTRYPOINT_VARIANTS = [
    ("cpu.entrypoint.sh", "cpu", None),
    ("ipex-1.10.0.entrypoint.sh", "ipex", "1.10.0"),
    ("ipex-2.3.1.entrypoint.sh", "ipex", "2.3.1"),
    ("accl.entrypoint.sh", "accl", None),
    ("nccl.entrypoint.sh", "nccl", None),
    ("cambricon.entrypoint.sh", "cambricon", None),
]


def render_variant(target: str, torch: str | None, offline: bool, base: str | None = None) -> str:
    return dockerfile_text(target, torch=torch, offline=offline, base_image=base)


def _matches_golden(name: str, text: str, what: str) -> None:
    matches_golden(GOLDEN_DIR, name, text, what)


@pytest.mark.parametrize(("name", "target", "torch", "offline", "base"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_rendered_dockerfile_matches_golden(name, target, torch, offline, base):
    _matches_golden(name, render_variant(target, torch, offline, base), target)


@pytest.mark.parametrize(("name", "target", "torch"), ENTRYPOINT_VARIANTS, ids=[v[0] for v in ENTRYPOINT_VARIANTS])
def test_rendered_entrypoint_matches_golden(name, target, torch):
    _matches_golden(name, entrypoint_text(target, torch=torch), f"{target} entrypoint.sh")


def test_every_golden_file_is_a_variant():
    """A golden file nobody renders any more is stale and must go."""
    assert sorted(p.name for p in GOLDEN_DIR.iterdir()) == \
        sorted(v[0] for v in VARIANTS + ENTRYPOINT_VARIANTS)


def test_every_renderable_target_has_a_golden_variant():
    renderable = {t.name for t in load_targets().values() if t.renderable}
    assert renderable == {v[1] for v in VARIANTS}
    assert renderable == {v[1] for v in ENTRYPOINT_VARIANTS}
