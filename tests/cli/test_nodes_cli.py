"""`clusterctl nodes` and the shared --nodes option, through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cli.nodes import NodesOption
from clusterctl.cluster.inventory import load_inventory
from clusterctl.core import console
from clusterctl.core.paths import inventories_dir
from tests.fixtures import INVENTORIES

CORPUS = INVENTORIES


@pytest.fixture
def wide(monkeypatch):
    """A wide console so each table row stays on one line (CliRunner output is not a terminal)."""
    monkeypatch.setattr(console.out, "width", 250)


def _rows(output: str) -> list[list[str]]:
    """Table body rows as lists of cell texts."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells:
            rows.append(cells)
    return rows


def test_nodes_table_in_rank_order_with_master_and_port(wide):
    path = CORPUS / "good_full.yaml"
    result = CliRunner().invoke(app, ["nodes", "--nodes", str(path)])
    assert result.exit_code == 0, result.output
    assert _rows(result.stdout) == [
        ["0 (master)", "node2", "10.0.0.12", "2222", "trainer", "8", "/dev/infiniband", "eth0",
         "rack=b,zone=west"],
        ["1", "node1", "10.0.0.11", "2222", "trainer", "8", "/dev/infiniband", "eth0", "rack=a,zone=west"],
        ["2", "gpu-box", "gpu-box", "22", "admin", "4", "", "ib0", "rack=a,zone=west"],
    ]
    assert "master: node2 (10.0.0.12), master port 23456; 3 nodes, 20 slots" in result.stdout
    assert "~/.ssh/config" not in result.stdout  # every port and user is written in the file
    assert (f"ssh: host keys checked against {CORPUS / 'keys/known_hosts'} (new hosts recorded on first "
            "contact), connect timeout 2.5s, 4 nodes at once") in result.stdout


def test_json_output_for_scripts_leaves_env_values_out():
    result = CliRunner().invoke(app, ["nodes", "-n", str(CORPUS / "good_full.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["master"], doc["master_port"], doc["format"]) == ("node2", 23456, "yaml")
    assert doc["ssh"] == {"known_hosts": str(CORPUS / "keys/known_hosts"), "accept_new_host_keys": True,
                          "connect_timeout": 2.5, "fanout": 4}
    assert [(n["rank"], n["name"], n["port"], n["slots"], n["master"]) for n in doc["nodes"]] == [
        (0, "node2", 2222, 8, True), (1, "node1", 2222, 8, False), (2, "gpu-box", 22, 4, False)]
    assert doc["nodes"][0]["env_names"] == ["EMPTY", "FLAG", "MASK", "NCCL_DEBUG", "NCCL_IB_HCA",
                                            "OMP_NUM_THREADS"]
    assert "mlx5_0" not in result.stdout and "INFO" not in result.stdout
    assert doc["nodes"][1]["identity_file"] == str(CORPUS / "keys/id_placeholder")
    hostfile = CliRunner().invoke(app, ["nodes", "-n", str(CORPUS / "good_mpi_hostfile"), "--json"])
    assert [(n["port"], n["user"]) for n in json.loads(hostfile.stdout)["nodes"]] == [(None, None)] * 4


def test_hostfile_nodes_show_what_ssh_config_decides(wide):
    result = CliRunner().invoke(app, ["nodes", "-n", str(CORPUS / "good_deepspeed_hostfile")])
    assert result.exit_code == 0, result.output
    assert _rows(result.stdout) == [
        ["0 (master)", "worker-1", "worker-1", "-", "-", "8", "", "(auto)", ""],
        ["1", "worker-2", "worker-2", "-", "-", "8", "", "(auto)", ""],
    ]
    assert "-: taken from ~/.ssh/config" in result.stdout
    assert "master port 29500; 2 nodes, 16 slots" in result.stdout
    assert "ssh: host keys checked against ~/.ssh/known_hosts, connect timeout 10s, 32 nodes at once" \
        in result.stdout


def test_shipped_example_through_the_cli(wide):
    result = CliRunner().invoke(app, ["nodes", "-n", str(inventories_dir() / "example.yaml")])
    assert result.exit_code == 0, result.output
    assert [r[:2] for r in _rows(result.stdout)] == [["0 (master)", "node1"], ["1", "node2"], ["2", "node3"]]


def test_values_are_shown_as_text_not_markup(tmp_path, wide):
    inv = tmp_path / "inv.yaml"
    inv.write_text('nodes:\n  - {name: a, host: h1, labels: {note: "[/x] [bold]y"}}\n')
    result = CliRunner().invoke(app, ["nodes", "-n", str(inv)])
    assert result.exit_code == 0, result.output
    assert _rows(result.stdout)[0][-1] == "note=[/x] [bold]y"


def test_inventory_from_environment_variable(wide):
    path = CORPUS / "good_minimal.yaml"
    result = CliRunner().invoke(app, ["nodes"], env={"CLUSTERCTL_NODES": str(path)})
    assert result.exit_code == 0, result.output
    assert [r[1] for r in _rows(result.stdout)] == ["10.0.0.11", "10.0.0.12"]


def test_no_inventory_given_is_a_usage_error():
    result = CliRunner().invoke(app, ["nodes"], env={"CLUSTERCTL_NODES": None})
    assert result.exit_code == 2
    assert "--nodes" in result.output and "CLUSTERCTL_NODES" in result.output


def test_nodes_option_is_reusable_by_other_commands(tmp_path):
    """Another command group takes the inventory the same way: --nodes/-n FILE or $CLUSTERCTL_NODES."""
    other = typer.Typer()
    seen = []

    @other.command()
    def show(nodes: NodesOption) -> None:
        seen.append(load_inventory(nodes).names)

    @other.command()
    def other_cmd(nodes: NodesOption) -> None:
        seen.append(str(nodes))

    path = str(CORPUS / "good_mpi_hostfile")
    runner = CliRunner()
    assert runner.invoke(other, ["show", "--nodes", path]).exit_code == 0
    assert runner.invoke(other, ["show", "-n", path]).exit_code == 0
    assert runner.invoke(other, ["other-cmd"], env={"CLUSTERCTL_NODES": path}).exit_code == 0
    names = ["node1", "node2", "node3", "node4.cluster.example"]
    assert seen == [names, names, path]


def test_error_message_with_brackets_is_printed_verbatim(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text('nodes:\n  - {name: "[/x]", host: h1}\n')
    result = CliRunner().invoke(app, ["nodes", "-n", str(inv)])
    assert result.exit_code == 2
    assert f'{inv}:2: nodes[0].name: "[/x]" is not a usable node name' in result.stderr
