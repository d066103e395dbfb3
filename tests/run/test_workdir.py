"""`launch --workdir` on the real 3-node sandbox with the real cpu image: the user's own project.

Real parts only: each node's own sshd and dockerd, real torchrun processes, the real code
store on the head and trees on the nodes (each sandbox node has its own code_dir).  One
project is launched, edited, launched again, left unchanged, and run again by run id; a
second test adds a requirements file.  Timings are printed, never asserted.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster.inventory import load_inventory
from clusterctl.run import records

runner = CliRunner()
pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

TRAIN_BODY = """\
import os
import torch.distributed as dist
from mypkg.values import VALUE
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()}/{dist.get_world_size()} value={VALUE} cwd={os.getcwd()} "
      f"code={os.environ['CLUSTERCTL_CODE_DIGEST']} data={os.path.exists('data')}", flush=True)
"""
# ends as examples/own-project/train.py does (os._exit: gloo's SIGABRT at exit, troubleshooting.md)
TRAIN_END = "dist.barrier()\ndist.destroy_process_group()\nos._exit(0)\n"
TRAIN = TRAIN_BODY + TRAIN_END


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "proj"
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "values.py").write_text("VALUE = 1\n")
    (root / "train.py").write_text(TRAIN)
    (root / ".gitignore").write_text("data/\n")
    (root / "data").mkdir()
    with open(root / "data" / "big.bin", "wb") as f:     # 64 MB that must never travel
        f.truncate(64 << 20)
    return root


def launch(sb, image: str, project: Path, *extra: str, nproc: str = "2"):
    t0 = time.monotonic()
    res = runner.invoke(app, ["launch", "--nodes", str(sb.inventory_path), "--image", image,
                              "--workdir", str(project), "--nproc-per-node", nproc, *extra,
                              "--", "python", "train.py"])
    print(f"launch --workdir {' '.join(extra)}: {time.monotonic() - t0:.1f}s")
    return res


def values(output: str) -> dict[int, tuple[str, str, str, str]]:
    """rank -> (value, cwd, code digest, data present) as every rank printed them."""
    found = re.findall(r"rank (\d+)/6 value=(\S+) cwd=(\S+) code=(sha256:[0-9a-f]{64}) data=(True|False)", output)
    return {int(r): rest for r, *rest in found}


def test_own_project_edit_unchanged_and_rerun(clean_nodes, cpu_image, runs_dir, project):
    sb = clean_nodes
    res = launch(sb, cpu_image, project)
    assert res.exit_code == 0, res.output
    first = records.list_runs()[0]
    seen = values(res.output)
    assert sorted(seen) == list(range(6)), res.output
    assert {v for v, *_ in seen.values()} == {"1"}
    assert {(cwd, code, data) for _, cwd, code, data in seen.values()} == {
        ("/workspace", first.code.digest, "False")}       # same code on every rank, no data/
    assert first.code.files == 4 and first.code.bytes < 4096
    assert all(0 < sent < 64 * 1024 for sent in first.code.sent.values()), first.code.sent
    # on the nodes: the tree is there, without the ignored 64 MB file
    inventory = load_inventory(sb.inventory_path)
    for node in inventory.nodes:
        tree = Path(node.code_dir) / "trees" / first.code.digest.split(":")[1]
        assert (tree / "mypkg" / "values.py").read_text() == "VALUE = 1\n"
        assert not (tree / "data").exists()

    # a one-line edit: every rank runs the new value; only the change travels
    (project / "mypkg" / "values.py").write_text("VALUE = 2\n")
    res = launch(sb, cpu_image, project)
    assert res.exit_code == 0, res.output
    second = records.list_runs()[0]
    assert {v for v, *_ in values(res.output).values()} == {"2"}, res.output
    assert second.code.digest != first.code.digest
    assert set(second.code.sent) == set(sb.nodes)
    assert all(0 < sent <= 64 * 1024 for sent in second.code.sent.values()), second.code.sent
    assert "3 delta" in res.output

    # unchanged: nothing is sent
    res = launch(sb, cpu_image, project)
    assert res.exit_code == 0, res.output
    assert records.list_runs()[0].code.sent == {n: 0 for n in sb.nodes}
    assert "3 present" in res.output

    # a rerun of the first run after the edit runs the OLD code, on the same nodes; its dry run
    # shows that code (not a fresh snapshot of the edited directory) and the image it runs on
    res = runner.invoke(app, ["launch", "--rerun", first.run_id, "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert {p["env"]["CLUSTERCTL_CODE_DIGEST"] for p in shown} == {first.code.digest}
    assert {p["image"] for p in shown} == {first.image}
    res = runner.invoke(app, ["launch", "--rerun", first.run_id])
    assert res.exit_code == 0, res.output
    rerun = records.list_runs()[0]
    assert rerun.run_id != first.run_id and rerun.code.digest == first.code.digest
    assert {(v, code) for v, _, code, _ in values(res.output).values()} == {("1", first.code.digest)}


def test_requirements_become_a_layer_every_rank_imports(clean_nodes, cpu_image, runs_dir, project):
    sb = clean_nodes
    (project / "requirements.txt").write_text("six==1.16.0\n")
    (project / "train.py").write_text(TRAIN_BODY + "import six\nprint('six', six.__version__, flush=True)\n"
                                      + TRAIN_END)
    res = launch(sb, cpu_image, project, nproc="1")
    assert res.exit_code == 0, res.output
    assert res.output.count("six 1.16.0") == 3, res.output
    rec = records.list_runs()[0]
    assert rec.code.requirements_digest and rec.code.requirements_digest.startswith("sha256:")
    assert rec.code.image and rec.code.image.startswith("clusterctl-deps/") and rec.image == rec.code.image
    # unchanged requirements: the same layer, no build
    res = launch(sb, cpu_image, project, nproc="1")
    assert res.exit_code == 0, res.output
    assert records.list_runs()[0].code.image == rec.code.image
