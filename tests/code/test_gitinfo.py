"""code/gitinfo: a workdir's commit and whether it has changes, from a real git; unknowns
(never an error) outside a repository or without git."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from clusterctl.code import gitinfo
from clusterctl.code.gitinfo import GitState, git_state

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A repository with one commit: a.py, sub/b.py and a .gitignore (*.log)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = tmp_path / "repo"
    (root / "sub").mkdir(parents=True)
    git(tmp_path, "init", "-q", str(root))
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "t")
    (root / "a.py").write_text("a\n")
    (root / "sub" / "b.py").write_text("b\n")
    (root / ".gitignore").write_text("*.log\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "one")
    return root


def test_a_clean_repository(repo):
    state = git_state(repo)
    assert state == GitState(git(repo, "rev-parse", "HEAD"), False, str(repo.resolve()))
    assert len(state.commit) == 40


def test_changes_make_it_dirty(repo):
    (repo / "run.log").write_text("ignored\n")
    assert git_state(repo).dirty is False  # an ignored file is no change
    (repo / "a.py").write_text("changed\n")
    assert git_state(repo).dirty is True
    git(repo, "checkout", "--", "a.py")
    (repo / "new.py").write_text("untracked\n")
    assert git_state(repo).dirty is True
    (repo / "new.py").unlink()
    assert git_state(repo).dirty is False


def test_only_changes_under_the_workdir_count(repo):
    (repo / "a.py").write_text("changed outside sub/\n")
    state = git_state(repo / "sub")
    assert state.dirty is False and state.toplevel == str(repo.resolve())
    assert state.commit == git(repo, "rev-parse", "HEAD")
    (repo / "sub" / "b.py").write_text("changed\n")
    assert git_state(repo / "sub").dirty is True


def test_status_does_not_rewrite_the_index(repo):
    """GIT_OPTIONAL_LOCKS=0: a plain ``git status`` would refresh the index (and take its lock)."""
    os.utime(repo / "a.py", (2_000_000_000, 2_000_000_000))  # same content, stale stat info
    index = repo / ".git" / "index"
    before = index.stat().st_mtime_ns, index.read_bytes()
    assert git_state(repo).dirty is False
    assert (index.stat().st_mtime_ns, index.read_bytes()) == before
    git(repo, "status", "--porcelain")  # the control: without the variable it is rewritten
    assert (index.stat().st_mtime_ns, index.read_bytes()) != before


def test_before_the_first_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    git(tmp_path, "init", "-q", str(tmp_path / "fresh"))
    (tmp_path / "fresh" / "a.py").write_text("")
    state = git_state(tmp_path / "fresh")
    assert state == GitState(None, True, str((tmp_path / "fresh").resolve()))


def test_outside_a_repository_everything_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    (tmp_path / "plain").mkdir()
    assert git_state(tmp_path / "plain") == GitState(None, None, None)
    assert git_state(tmp_path / "missing") == GitState(None, None, None)


def test_without_git_everything_is_unknown(repo, monkeypatch):
    monkeypatch.setenv("PATH", str(repo))  # no git there
    assert git_state(repo) == GitState(None, None, None)


def test_a_git_that_hangs_gives_unknowns(repo, tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    # sleep is a child of sh, which a kill of sh alone would leave holding the output open
    (fake / "git").write_text(f"#!/bin/sh\n{shutil.which('sleep')} 30\necho late\n")
    (fake / "git").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    monkeypatch.setattr(gitinfo, "TIMEOUT_S", 0.3)
    started = time.monotonic()
    assert git_state(repo) == GitState(None, None, None)
    assert time.monotonic() - started < 5
