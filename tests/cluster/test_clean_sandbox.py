"""`clusterctl clean` on the real 3-node sandbox: a stale code tree, a stale image and a stale
kept-login directory are listed and (with --yes) removed on every node, while a live run's
containers (real ones, on each node's own engine, labelled as a run's, its code tree mounted)
keep their tree and their image.

The images are made here, not built: a tiny real image (this machine's sleep and its
libraries) whose creation time is set in the past, so `--older-than` can choose them while
the images other tests of the session put on the nodes (made today) stay."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app

pytestmark = pytest.mark.sandbox

OLD = time.mktime((2020, 1, 2, 0, 0, 0, 0, 0, -1))


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, int(OLD)
    tar.addfile(info, io.BytesIO(data))


def _image_archive(label: str) -> bytes:
    """A `docker load` archive of one real, runnable image: /bin/sleep and what it links,
    labelled as clusterctl's images are, made in 2020."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        for path in ("/bin/sleep", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"):
            _add(t, path.lstrip("/"), Path(path).read_bytes())
        _add(t, "label", label.encode(), 0o644)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "created": "2020-01-02T00:00:00Z",
        "config": {"Labels": {"io.clusterctl.target": label}, "Cmd": ["/bin/sleep", "600"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        _add(t, "layer.tar", layer_bytes, 0o644)
        _add(t, config_name, config, 0o644)
        _add(t, "manifest.json", json.dumps([{"Config": config_name, "RepoTags": None,
                                              "Layers": ["layer.tar"]}]).encode(), 0o644)
    return out.getvalue()


def _load(sb, node: str, archive: bytes) -> str:
    got = subprocess.run(["docker", "-H", sb.docker_host(node), "load"], input=archive,
                         capture_output=True, check=True)
    return got.stdout.decode().split("Loaded image ID: ")[1].strip()


def _clean(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["clean", *args])
    return res.exit_code, res.output


def test_clean_lists_and_removes_what_is_stale_and_keeps_a_live_runs_tree_and_image(clean_nodes):
    sb = clean_nodes
    inventory = str(sb.inventory_path)
    code_dirs = {n["name"]: Path(n["code_dir"]) for n in yaml.safe_load(sb.inventory_path.read_text())["nodes"]}
    live_tree, stale_tree = "1c" * 32, "5e" * 32
    login = Path(f"/tmp/clusterctl-mux.cleantest{os.getpid()}")
    run_id = f"cleantest-{os.getpid()}"
    images: dict[str, tuple[str, str]] = {}
    try:
        # on every node: two trees, both last used in 2020; the live one mounted by a running
        # container of a run (its image also from 2020); a stale image; a stale login directory
        run_archive, stale_archive = _image_archive("clean-test-run"), _image_archive("clean-test-stale")
        for node, code in code_dirs.items():
            for digest in (live_tree, stale_tree):
                (code / "trees" / digest).mkdir(parents=True, exist_ok=True)
                (code / "trees" / digest / "train.py").write_text("print(1)\n")
                os.utime(code / "trees" / digest, (OLD, OLD))
            images[node] = (_load(sb, node, run_archive), _load(sb, node, stale_archive))
            sb.node_docker(node, "run", "-d", "--label", f"io.clusterctl.run={run_id}",
                           "-v", f"{code / 'trees' / live_tree}:/workspace:ro", images[node][0],
                           "/bin/sleep", "600")
        login.mkdir()
        os.utime(login, (OLD, OLD))
        run_image, stale_image = images[next(iter(images))]

        # the dry run: every node names the stale three to go, the live run's two to stay
        code, out = _clean("--nodes", inventory, "--older-than", "2000h", "--json")
        assert code == 0, out
        reports = json.loads(out)
        assert [r["node"] for r in reports] == list(code_dirs)
        for r in reports:
            mine = {i["name"]: i for i in r["items"]
                    if i["name"] in (live_tree, stale_tree, run_image, stale_image, login.name)}
            assert {n: i["remove"] for n, i in mine.items()} == {
                live_tree: False, stale_tree: True, run_image: False, stale_image: True,
                login.name: True}, (r["node"], mine)
            assert mine[live_tree]["reason"] == f"mounted by a live container (run {run_id})"
            assert mine[run_image]["reason"] == f"a live container uses it (run {run_id})"
            assert mine[stale_tree]["bytes"] > 0 and mine[stale_image]["bytes"] > 0
        for node, code in code_dirs.items():     # a dry run changes nothing
            assert (code / "trees" / stale_tree).is_dir()
            assert sb.node_docker(node, "image", "inspect", stale_image, check=False).returncode == 0
        code, text = _clean("--nodes", inventory, "--older-than", "2000h")
        assert code == 0 and f"remove tree  {stale_tree[:12]}" in text and "would be freed" in text, text

        # --yes: exactly those go, on every node
        code, out = _clean("--nodes", inventory, "--older-than", "2000h", "--yes", "--json")
        assert code == 0, out
        logins = []
        for r in json.loads(out):
            done = {i["name"]: i.get("removed") for i in r["items"] if i["remove"]}
            assert done[stale_tree] and done[stale_image], (r["node"], done)
            # the nodes share this machine's /tmp: a node whose clean looks after another
            # node's removed the directory does not find it any more
            logins += [done[login.name]] if login.name in done else []
        assert any(logins), out
        for node, code in code_dirs.items():
            assert not (code / "trees" / stale_tree).exists()
            assert (code / "trees" / live_tree / "train.py").is_file()
            assert sb.node_docker(node, "image", "inspect", images[node][1], check=False).returncode != 0
            assert sb.node_docker(node, "image", "inspect", images[node][0], check=False).returncode == 0
        assert not login.exists()

        # and listed again, nothing of them is left to go
        code, out = _clean("--nodes", inventory, "--older-than", "2000h", "--json")
        assert code == 0, out
        for r in json.loads(out):
            names = {i["name"] for i in r["items"]}
            assert stale_tree not in names and stale_image not in names and login.name not in names
            assert live_tree in names and run_image in names
    finally:
        for node, code in code_dirs.items():
            ids = sb.node_docker(node, "ps", "-aq", "--filter", f"label=io.clusterctl.run={run_id}",
                                 check=False).stdout.split()
            if ids:
                sb.node_docker(node, "rm", "--force", *ids, check=False)
            for image_id in images.get(node, ()):
                sb.node_docker(node, "image", "rm", "--force", image_id, check=False)
            for digest in (live_tree, stale_tree):
                subprocess.run(["rm", "-rf", str(code / "trees" / digest)], check=False)
        subprocess.run(["rm", "-rf", str(login)], check=False)
