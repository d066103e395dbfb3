"""clusterctl.core.invoker: who ran `sudo clusterctl ...`, and paths handed to them.

invoker() is pure given its two arguments; hand_over() changes real owners, which only
root may do (the chown tests are skipped otherwise: `make test` runs them as root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterctl.core.invoker import Invoker, hand_over, invoker

SUDO = {"SUDO_UID": "1000", "SUDO_GID": "1001", "SUDO_USER": "ana"}


def test_the_user_sudo_names_when_root_runs_for_them():
    assert invoker(SUDO, euid=0) == Invoker(1000, 1001, "ana")
    assert invoker({**SUDO, "SUDO_USER": ""}, euid=0) == Invoker(1000, 1001, "1000")


@pytest.mark.parametrize(("env", "euid"), [
    (SUDO, 1000),                                  # not root: `sudo -u ana` or no sudo at all
    ({}, 0),                                       # root's own shell
    ({**SUDO, "SUDO_UID": "0"}, 0),                # root ran sudo
    ({**SUDO, "SUDO_UID": "x"}, 0),                # not a number
    ({"SUDO_UID": "1000"}, 0),                     # no group
    ({**SUDO, "SUDO_GID": "-1"}, 0),
])
def test_nobody_to_hand_over_to(env, euid):
    assert invoker(env, euid=euid) is None


def test_without_an_invoker_nothing_changes(tmp_path, monkeypatch):
    monkeypatch.delenv("SUDO_UID", raising=False)
    f = tmp_path / "key"
    f.write_text("k")
    before = f.stat()
    assert hand_over(f) is None
    assert (f.stat().st_uid, f.stat().st_gid) == (before.st_uid, before.st_gid)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")
def test_hand_over_changes_the_owner_never_through_a_link(tmp_path: Path):
    ana = Invoker(4242, 4343, "ana")
    key, sock, target = tmp_path / "key", tmp_path / "sock", tmp_path / "etc-shadow"
    for p in (key, sock, target):
        p.write_text("x")
    os.chown(sock, 0, 7)
    planted = tmp_path / "planted"
    planted.symlink_to(target)
    assert hand_over(key, tmp_path / "missing", planted, to=ana) == ana
    assert hand_over(sock, group=False, to=ana) == ana
    assert (key.stat().st_uid, key.stat().st_gid) == (4242, 4343)
    assert (sock.stat().st_uid, sock.stat().st_gid) == (4242, 7)       # a socket keeps its group
    assert (planted.lstat().st_uid, target.stat().st_uid) == (4242, 0)  # the link, not its target


@pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")
def test_sudo_render_into_the_users_checkout_leaves_it_theirs_and_elsewhere_roots(tmp_path, monkeypatch):
    """Issue 42: `sudo clusterctl build` left a root-owned dockerfiles/ in the user's
    checkout, which their next `clusterctl render` could not replace."""
    from clusterctl.image.context import render_context

    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65534")
    monkeypatch.setenv("SUDO_USER", "nobody")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    os.chown(checkout, 65534, 65534)
    out = render_context("cpu", out_dir=checkout / "dockerfiles" / "cpu")
    made = [checkout / "dockerfiles", *sorted((checkout / "dockerfiles").rglob("*"))]
    assert out.context_dir == checkout / "dockerfiles" / "cpu" and len(made) > 4
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in made} == {(65534, 65534)}, made
    assert checkout.stat().st_uid == 65534 and tmp_path.stat().st_uid == 0   # above: untouched
    elsewhere = tmp_path / "opt"                                           # root's place: stays root's
    render_context("cpu", out_dir=elsewhere / "cpu")
    assert {p.lstat().st_uid for p in [elsewhere, *elsewhere.rglob("*")]} == {0}


@pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")
def test_a_tree_handed_over_keeps_hard_linked_files_and_never_follows_links(tmp_path):
    from clusterctl.core.invoker import hand_over_tree

    cache = tmp_path / "cache.whl"
    cache.write_text("wheel")
    target = tmp_path / "secret"
    target.write_text("root's")
    top = tmp_path / "a" / "b" / "ctx"
    (top / "wheels").mkdir(parents=True)
    os.link(cache, top / "wheels" / "w.whl")
    (top / "Dockerfile").write_text("FROM x\n")
    (top / "link").symlink_to(target)
    hand_over_tree(top, below=tmp_path, to=Invoker(65534, 65534, "nobody"))
    for p in (tmp_path / "a", tmp_path / "a" / "b", top, top / "wheels", top / "Dockerfile", top / "link"):
        assert p.lstat().st_uid == 65534, p
    assert cache.stat().st_uid == 0 and target.stat().st_uid == 0 and tmp_path.stat().st_uid == 0
