"""Where clusterctl finds its own data and keeps its state.

In a source checkout the data directories are the repository's own
``templates/``, ``jobs/`` and ``inventories/``; in an installed wheel they are
shipped under ``clusterctl/_data/`` (see pyproject.toml).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # clusterctl/
_REPO_DIR = PACKAGE_DIR.parent.parent  # a source checkout: src/clusterctl -> the repository
_SHIPPED = PACKAGE_DIR / "_data"


def _data_dir(name: str) -> Path:
    shipped = _SHIPPED / name
    if shipped.is_dir():
        return shipped
    return _REPO_DIR / name


def templates_dir() -> Path:
    return _data_dir("templates")


def jobs_dir() -> Path:
    return _data_dir("jobs")


def inventories_dir() -> Path:
    return _data_dir("inventories")


def cache_dir() -> Path:
    """Host-side cache (wheelhouses, downloaded vendor files). CLUSTERCTL_CACHE overrides."""
    env = os.environ.get("CLUSTERCTL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "clusterctl"


def state_dir() -> Path:
    """Machine-wide state of the sandbox and local engine (needs root). CLUSTERCTL_STATE overrides."""
    return Path(os.environ.get("CLUSTERCTL_STATE", "/run/clusterctl"))


def runs_dir() -> Path:
    """Run records (logs, run.json): ``./runs`` of the directory you launch from, yours alone;
    CLUSTERCTL_RUNS overrides (e.g. a directory a group shares: ``clusterctl runs --share``).
    The one place that says where records live; :func:`clusterctl.run.records.check_runs_dir`
    refuses one others may write into without the sticky bit."""
    return Path(os.environ.get("CLUSTERCTL_RUNS", "runs"))


def examples_dir() -> Path:
    """Example training scripts baked into images (ddp_smoke.py)."""
    return _data_dir("examples")
