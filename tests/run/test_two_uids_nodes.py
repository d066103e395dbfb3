"""Two real unprivileged users of one group launching on the same real sandbox nodes (issue 41).

tests/run/test_two_uids.py shows, without nodes, what one user's files can make the other's
clusterctl do. Here both really run: ccalice and ccbob (same group, umask 022, a runs
directory they share) each launch ddp-smoke detached on the session's 3-node sandbox with a
copy of its key of their own, reaching this machine's Docker engine through the engine
socket's group (as a site's ``docker`` group gives it). Then each one's record is theirs,
the two runs hold different master ports, either sees the other's run, bob's ``stop`` of
alice's run is refused and leaves her containers running, and each stops their own.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from clusterctl.cluster import engine
from tests.fixtures.two_uids import ALICE, BOB, ok, run_as

#: a ddp-smoke that lasts about a minute: long enough for every step below
LONG = ("--set", "DDP_SMOKE_STEPS=300", "--set", "DDP_SMOKE_STEP_SECONDS=0.2")


def _engine_url() -> str:
    """The engine the session's images are in, as clusterctl finds it (DOCKER_HOST, the
    standard socket, else clusterctl's own engine: CI sets no DOCKER_HOST)."""
    url = engine.engine_url()
    assert url and url.startswith("unix://"), f"engine {url}: the test needs the engine's socket"
    return url


def _engine_socket() -> Path:
    return Path(_engine_url().removeprefix("unix://"))


@pytest.fixture
def inventories(shared, two_users, clean_nodes, cpu_image) -> Iterator[dict[str, Path]]:
    """Each user's inventory of the sandbox: in a directory of their own, naming a copy of
    the sandbox's key that is theirs (0600); both users in the engine socket's group for
    the test (taken out after, unless they were in it already)."""
    group = grp.getgrgid(_engine_socket().stat().st_gid)
    assert group.gr_gid != 0, f"{_engine_socket()} belongs to group root: no group to share it through"
    data = yaml.safe_load(clean_nodes.inventory_path.read_text())
    made, added = {}, []
    for user, pw in two_users.items():
        home = shared.parent / user
        home.mkdir(mode=0o700)
        key = home / "id_ed25519"
        shutil.copyfile(clean_nodes.key, key)
        own = {**data, "defaults": {**data["defaults"], "identity_file": str(key)},
               "nodes": [{**n, "identity_file": str(key)} for n in data["nodes"]]}
        (home / "nodes.yaml").write_text(yaml.safe_dump(own, sort_keys=False))
        for p in (home, key, home / "nodes.yaml"):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(key, 0o600)
        made[user] = home / "nodes.yaml"
        if user not in group.gr_mem:
            subprocess.run(["usermod", "-aG", group.gr_name, user], check=True)
            added.append(user)
    try:
        yield made
    finally:
        for user in added:
            subprocess.run(["gpasswd", "-d", user, group.gr_name], capture_output=True)


def _running(cluster, run_id: str) -> dict[str, str]:
    """Each node's state of ``run_id``'s container (absent: no container)."""
    got = {}
    for node in cluster.nodes:
        r = cluster.node_docker(node, "ps", "-a", "--filter", f"label=io.clusterctl.run={run_id}",
                                "--format", "{{.State}}", check=False)
        if r.stdout.strip():
            got[node] = r.stdout.strip()
    return got


def test_two_users_share_the_nodes_and_neither_can_stop_the_others_run(inventories, shared, clean_nodes,
                                                                        cpu_image, two_users):
    env = {"DOCKER_HOST": _engine_url()}
    home = {user: dict(env, HOME=str(inv.parent)) for user, inv in inventories.items()}
    ids = {}
    for user in (ALICE, BOB):
        got = run_as(user, shared, f"""
            cli("launch", "launch", "ddp-smoke", "--nodes", {str(inventories[user])!r}, "--image",
                {cpu_image!r}, "--detach", "--nproc-per-node", "1", *{LONG!r})
            cli("runs", "runs", "--mine", "--json")
        """, **home[user])
        ok(got["launch"])
        mine = json.loads(ok(got["runs"]))
        assert len(mine) == 1 and mine[0]["user"] == user, mine
        ids[user] = mine[0]["run_id"]
    alice_run, bob_run = ids[ALICE], ids[BOB]
    for user, run_id in ids.items():          # each record is its launcher's file, and running
        rec = shared / run_id / "run.json"
        assert rec.stat().st_uid == two_users[user].pw_uid, (user, rec)
        assert set(_running(clean_nodes, run_id).values()) == {"running"}, _running(clean_nodes, run_id)
    ports = {u: json.loads((shared / r / "run.json").read_text())["master_port"] for u, r in ids.items()}
    assert ports[ALICE] != ports[BOB], ports

    got = run_as(BOB, shared, f"""
        cli("all", "runs", "--json")
        cli("her-inventory", "status", {alice_run!r})
        cli("status", "status", {alice_run!r}, "--json", "--nodes", {str(inventories[BOB])!r})
        cli("stop", "stop", {alice_run!r})
    """, **home[BOB])
    assert {(r["run_id"], r["user"]) for r in json.loads(ok(got["all"]))} == {
        (alice_run, ALICE), (bob_run, BOB)}
    assert {n["node"] for n in json.loads(ok(got["status"]))["nodes"]} == set(clean_nodes.nodes)
    assert "cannot reach the inventory" in ok(got["her-inventory"], 2)   # hers is in her 0700 dir
    refused = ok(got["stop"], 2)
    assert f"run {alice_run} is user {ALICE}'s run, not yours ({BOB})" in refused, refused
    assert set(_running(clean_nodes, alice_run).values()) == {"running"}   # bob stopped nothing

    for user, run_id in ids.items():
        ok(run_as(user, shared, f'cli("stop", "stop", {run_id!r})\n', **home[user])["stop"])
        assert _running(clean_nodes, run_id) == {}, (user, _running(clean_nodes, run_id))
