"""The benchmarks' JSON documents and plots (benchmarks/plot.py), and the benchmark pages.

Each script's rows -> document step is called with rows shaped like a real run's (the
scripts' own row functions on their own result objects); the documents must survive
JSON and the shape check unchanged. plot.py draws every committed data file; the pages'
tables must be what plot.py makes of the data files, so page and data cannot drift.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import (
    collective,
    launch,
    plot,
    push,
    registry,
    scale,
    ssh_clients,
    validate,
    workdir,
)
from benchmarks import (
    exec as exec_bench,
)

REPO = Path(__file__).resolve().parents[2]
PAGES = REPO / "docs" / "benchmarks"
DATA = PAGES / "data"
COND = {"date": "2026-11-25 10:00:00 UTC", "host": "h", "cpus": 2, "load_average": [0.5, 3.25]}


def roundtrip(doc: dict) -> dict:
    back = json.loads(plot.dumps(doc))
    assert back == doc
    return plot.validate(back)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# --------------------------------------------------------------------------- the scripts' shapes


def test_push_rows_round_trip():
    trace = ("# 8 nodes\n0.50 node1 plan-end\n0.90 node8 plan-end\n0.95 - all-started\n"
             "2.40 - all-ready\n25.3 - head-send-end\n27.7 node8 last-byte\n28.4 - relay-end rc=0\n")
    where = push.phases(trace)
    assert list(where) == list(plot.PHASES)
    assert where["plan"] == 0.9 and where["hops_up"] == pytest.approx(1.45)
    rows = [push.row(1, "star", "cold", 24.1, 44_800_000, 44_500_000, 1.0, 22.2, True),
            push.row(8, "relay", "cold", 28.4, 45_000_000, 44_500_000, 1.15, 22.2, True, where),
            push.row(8, "by-hand", "cold", 192.0, 358_100_000, 0, 8.04, 22.2, False)]

    class Image:
        ref = "clusterctl-bench/push:files"

    doc = push.json_document(rows, Image(), 44_500_000, 4, "16mbit", 5.0, "python benchmarks/push.py", COND)
    back = roundtrip(doc)
    assert back["conditions"]["bytes_per_second"] == 2e6 and back["conditions"]["ideal_seconds"] == 22.25
    assert back["rows"][1]["where"]["head_sends"] == pytest.approx(22.9)
    assert back["rows"][2]["result"] == "FAILED" and back["rows"][0]["mb_out"] == 44.8
    assert "| 8 | relay | cold | 28.4 | 45.0 | 44.5 | 1.15 | 1.28 | ok |" in plot.table(back)


def test_launch_rows_round_trip():
    runs = [launch.Launch(wall=5.8, wall_pre=4.0, cpu=0.24, cpu_pre=0.2, node_cpu=4.8, dispatch=0.01,
                          stop_cpu=0.11, stop_wall=2.0),
            launch.Launch(wall=6.0, wall_pre=4.2, cpu=0.26, cpu_pre=0.21, node_cpu=5.2, dispatch=0.03,
                          stop_cpu=0.13, stop_wall=2.4)]
    tear = [launch.Teardown(0.6, 0.05, 0.5, 0.25, 0.53, 0.001, 0.004),
            launch.Teardown(0.7, 0.04, 0.6, 0.27, 0.55, 0.001, 0.003)]
    results = {"launch": [launch.launch_row(16, "direct", runs, cores=2),
                          launch.launch_row(1, "direct", runs[:1], cores=2)],
               "process": [{"nodes": 16, "design": "direct", "cpu": 0.87, "wall": 6.1},
                           {"nodes": 1, "design": "direct", "cpu": 0.6, "wall": 1.0, "stop_cpu": 0.5,
                            "stop_wall": 0.8},
                           {"nodes": 16, "design": "default", "cpu": 0.66, "wall": 6.9, "stop_cpu": 0.7,
                            "stop_wall": 2.2}],
               "teardown": [launch.teardown_row(16, "new", tear, (7.0, 8.5, 9.25))],
               "ratios": [{"design": "direct", "what": "host_cpu", "nodes": [1, 16], "value": 10.5}]}
    args = argparse.Namespace(repeat=2, image="clusterctl/base:1")
    back = roundtrip(launch.json_document(results, args, "python benchmarks/launch.py", COND))
    row = back["launch"][0]
    assert row["host_cpu"] == 0.25 and row["cpu_start"] == pytest.approx(0.045) and row["wall"] == 5.9
    td = back["teardown"][0]
    assert td["stopped"] == 0.65 and td["each_run"] == [0.6, 0.7] and td["lines_last"] == 0.0035
    assert back["conditions"]["fail_grace"] == launch.supervise.Settings.fail_grace
    assert "| 16 | 0.250 (0.205 / 0.045) | 5.90 | 0.87 | 0.66 |" in plot.table(back)
    # the processes a user runs, launch --detach then stop (the row without stop: not here)
    assert "| 16 | default | 0.66 | 6.90 | 0.70 | 2.20 |" in plot.table(back)
    assert "| 1 | direct | 0.60 | 1.00 | 0.50 | 0.80 |" in plot.table(back)
    assert "| 16 | direct | 0.87 |" not in plot.table(back)
    # where the wall goes: the nodes' CPU, per node, spread over the run's cores, the dispatch
    assert row["node_cpu"] == 5.0 and row["dispatch"] == 0.02
    assert row["node_cpu_per_node_ms"] == 312.5 and row["node_floor"] == 2.5   # 5.0 s over 16 nodes, 2 cores
    assert "| 16 | direct | 5.90 | 5.00 | 312 | 2.50 | 0.020 |" in plot.table(back)
    assert "| 1 | direct | 5.80 | 4.80 | 4800 | 2.40 | 0.010 |" in plot.table(back)   # one run: its own
    # the stop after each launch, in the benchmark's own process
    assert row["stop_host_cpu"] == 0.12 and row["stop_wall"] == 2.2
    assert "| 16 | direct | 0.120 | 2.20 |" in plot.table(back)
    assert "| 1 | direct | 0.110 | 2.00 |" in plot.table(back)


def test_collective_rows_round_trip():
    rows = [collective.row(2, 17.4, 1.5, 12.1, None, 9.0, "slow: node1, node2", 233980.0, 234070.0),
            collective.row(8, 51.8, 16.4, 41.1, 93.7, 242.0, "slow: node8", 233120.0, 2.34e6)]
    args = argparse.Namespace(bandwidth="20mbit", image="clusterctl/cpu:2.13.0")
    doc = collective.json_document({"seconds": 8.7, "verdict": "all 2 nodes healthy"}, rows, args,
                                   237.2, "python benchmarks/collective.py", COND)
    back = roundtrip(doc)
    assert back["conditions"]["slow_bandwidth"] == "2mbit"
    assert back["rows"][1]["measuring_s"] == pytest.approx(24.7) and back["rows"][1]["vs_all"] == 1.809
    assert "| 2 | 17.4 | 1.5 | 10.6 | (= 3 rounds) | 9 | - | 0.5x |" in plot.table(back)


def test_validate_rows_round_trip():
    new = {"wall": 0.92, "cpu": 0.86, "rss_mb": 198.2}
    rows = [validate.row(10_000, "yaml", {"wall": 0.34, "cpu": 0.34, "rss_mb": 60.0},
                         {"wall": 2.49, "cpu": 2.40, "rss_mb": 70.0}, 60),
            validate.row(100_000, "hostfile", new, None, 60)]
    back = roundtrip(validate.json_document(rows, 60, "python benchmarks/validate.py", COND))
    assert back["rows"][0]["prev_over_new"] == 7.06 and back["rows"][1]["prev_stopped"] is True
    assert back["rows"][1]["prev_over_new"] == 70    # the bound the script prints: >70x
    table = plot.table(back)
    assert "| 100,000 | hostfile | 0.86 | 0.92 | 198 | > 60 (stopped) | > 70x |" in table


def test_scale_rows_round_trip():
    tally = scale.Tally(expected=3, nodes=2)
    for rank in (0, 1):
        for seq in range(3):
            tally.add(f"chatty node={rank} seq={seq} xxxx")
    tally.add("chatty node=1 seq=2 xxxx")            # a duplicate
    mem = scale.Memory(rss=[50.0, 60.0, 64.0, 61.0], threads=[5, 9], hwm=65.0, first_line=1)
    result = scale.Result("keeps up", 49.04, 0, tally, mem, files=tally, merged=6)
    args = argparse.Namespace(nodes=2, rate=625.0, seconds=30.0, stall=10.0, image="clusterctl/base:1")
    doc = scale.json_document([scale.row(result)], args, {"sandbox_up_s": 1.512, "push_s": 80.0},
                              "python benchmarks/scale.py", COND)
    back = roundtrip(doc)
    row = back["rows"][0]
    assert (row["stdout"], row["duplicated"], row["missing"]) == (6, 1, 0)
    assert (row["peak_mb"], row["growth_mb"], row["steady_mb"], row["threads"]) == (65.0, 4.0, 61.0, 9)
    assert back["conditions"]["sandbox_up_s"] == 1.51
    assert "| keeps up | 49.0 | 6 | 6 | 0 | 1 | 0 | 0 | 65.0 | +4.0 |" in plot.table(back)


def test_workdir_rows_round_trip():
    def m(seconds, payload, link, **phases):
        return workdir.Measure(seconds, seconds + 2.0, payload, link, phases)

    snap = [workdir.snapshot_row("warm", 2001, 22.61, [0.065, 0.064, 0.071], "page cache"),
            workdir.snapshot_row("cold", 2001, 22.61, [0.21, 0.25], "pages dropped")]
    delta = [{"what": "one-line edit", "bytes": 300}, {"what": "whole tree", "bytes": 5_749_494}]
    rows = [workdir.row(4, "workdir", "python", m(9.0, 1_437_000, 1_500_000),
                        [m(6.2, 302, 12_000, snapshot=0.6, ship=0.7), m(6.4, 298, 13_000, snapshot=0.8, ship=0.5),
                         m(7.1, 302, 12_500, snapshot=0.7, ship=0.6)]),
            workdir.row(4, "workdir", "no-op", None, [m(2.5, 302, 11_000), m(2.7, 302, 11_000)]),
            workdir.row(4, "workdir", "no-op, unchanged", None, [m(2.1, 0, 9_000)]),
            workdir.row(4, "by-hand", "python", None, [m(13.0, 22_562_547, 24_600_000, build=2.5)]),
            workdir.row(4, "rsync", "no-op", None,
                        [workdir.Measure(3.0, 3.0, None, 0, {}, ok=False, error="rsync exited 12: x")])]
    args = argparse.Namespace(bandwidth="1gbit", files=2000, repeat=3, image="clusterctl/cpu:2.13.0",
                              slots=1, seed=1)
    doc = workdir.json_document(snap, delta, rows, args, {"nodes_held": 16, "push_s": 301.4},
                                "python benchmarks/workdir.py", COND)
    back = roundtrip(doc)
    first = back["rows"][0]
    assert (first["cold"], first["median"], first["worst"]) == (9.0, 6.4, 7.1)
    assert first["bytes_node"] == 302 and first["cold_bytes_node"] == 1_437_000
    assert first["phases"] == {"snapshot": 0.7, "ship": 0.6} and first["ranks_exit"] == 8.4
    assert back["rows"][4]["result"].startswith("FAILED: rsync exited 12")
    assert back["ratios"] == [{"nodes": 4, "program": "python", "what": "by-hand / workdir", "value": 2.03}]
    goals = {g["what"]: g for g in back["goals"]}
    assert goals["no-op job end to end (unchanged tree), 4 nodes"]["met"] is False
    assert goals["bytes per node for a one-line edit (run.json code.sent, largest node)"]["value"] == 302
    assert goals["workdir's own share (no-op after an edit, edit to exit), 16 nodes"]["met"] is None
    table = plot.table(back)
    assert "| 4 | workdir | python | 9.00 | 6.40 | 7.10 | 302 | 1,437,000 | 12,500 | snapshot 0.70, ship 0.60 | ok |" in table
    assert "| 4 | python | 2.03x |" in table and "| warm | 2,001 | 22.6 | 0.065 | 0.071 | 3 | page cache |" in table


def test_registry_rows_round_trip():
    def out(seconds, registry_s=None, relay_s=None, pull_s=None, wire=None, failures=()):
        return registry.Outcome(seconds, registry_s, relay_s, pull_s, wire, list(failures))

    s, ideal = 1_198_000_000, 19.17
    rows = [registry.row(8, "relay", "cold", out(30.2, relay_s=30.2, wire="zstd"), 560_000_000, s, ideal, 1),
            registry.row(8, "registry+relay", "cold", out(61.0, 24.1, 33.4, 3.5, "none"),
                         1_210_000_000, s, ideal, 1, 0.8712),
            registry.row(8, "registry+relay", "cold", out(59.0, 23.0, 32.0, 4.0, "none"),
                         1_206_000_000, s, ideal, 2),
            registry.row(8, "pull", "cold", out(95.0, 24.0, pull_s=71.0), 3_600_000_000, s, ideal, 1),
            registry.row(8, "pull", "warm", out(2.0, 0.5, pull_s=1.5), 44_000_000, s, ideal, 1),
            registry.row(8, "registry+relay", "warm", out(4.0, 0.5, 3.0, 0.5), 6_000_000, s, ideal, 1),
            registry.row(4, "relay", "warm", out(3.0, relay_s=3.0, failures=["node2: gone"]),
                         5_000_000, s, ideal, 1)]
    cond = {**COND, "bandwidth": "500mbit", "bytes_per_second": 62.5e6, "image_mb": 1198.0,
            "ideal_seconds": ideal, "registry_mb": 402.3, "layer_mb": 5.0, "repeat": 2}
    back = roundtrip(registry.json_document(rows, cond, "python benchmarks/registry.py"))
    assert back["rows"][1]["x_s"] == 1.01 and back["rows"][1]["t_over_ideal"] == 3.18
    assert back["rows"][6]["result"] == "FAILED: node2: gone"
    ratios = {(r["nodes"], r["case"], r["what"]): r["value"] for r in back["ratios"]}
    # medians: c cold = 60.0 s and 1208.0 MB; a failed run counts in none of them
    assert ratios[(8, "cold", "a/c seconds")] == 1.58 and ratios[(8, "cold", "b/c seconds")] == 0.5
    assert ratios[(8, "cold", "a/c head bytes")] == 2.98 and ratios[(8, "warm", "a/c seconds")] == 0.5
    assert not any(k[0] == 4 for k in ratios), "no c run at 4 nodes: no ratio"
    goals = {g["what"]: g for g in back["goals"]}
    link = goals["8 nodes cold, push with a registry: head link busy (bytes / S, in S/B)"]
    assert (link["value"], link["met"]) == (1.01, True)
    assert goals["8 nodes cold, push with a registry: wall time (x S/B)"]["met"] is False
    assert goals["8 nodes cold, every node pulls: head link busy (bytes / S, in S/B)"]["value"] == 3.0
    table = plot.table(back)
    assert "| 8 | cold | 1 | registry+relay | 61.0 | 3.18 | 1210.0 | 1.010 | 24.1 | 33.4 | 3.5 | none | 0.87 | ok |" in table
    assert "| 8 | cold | 1.58x | 0.50x | 2.98x | 0.46x |" in table
    assert table.index("| 8 | cold | 1 | relay |") < table.index("| 8 | cold | 1 | registry+relay |")
    assert table.index("| 8 | cold | 2 |") < table.index("| 8 | warm | 1 |")


def test_ssh_clients_rows_round_trip():
    # (head CPU s, wall s) per round, as measure() returns them; medians over the rounds
    results = {(1, "clusterctl"): [(0.012, 0.1), (0.010, 0.1), (0.011, 0.2)],
               (1, "openssh"): [(0.100, 0.3)],
               (8, "openssh-kex"): [(0.280, 0.5), (0.300, 0.6)],
               (8, "clusterctl"): [(0.096, 0.4), (0.088, 0.5)],
               (8, "paramiko"): [(0.048, 0.3), (0.050, 0.3)]}
    rows = ssh_clients.rows_for(results)
    assert [(r["nodes"], r["client"]) for r in rows] == [
        (1, "clusterctl"), (1, "openssh"), (8, "clusterctl"), (8, "paramiko"), (8, "openssh-kex")]
    doc = plot.document("ssh_clients", "python benchmarks/ssh_clients.py",
                        {**COND, "repeat": 2, "commands": 3, "openssh": "OpenSSH_9.2p1"}, rows=rows)
    back = roundtrip(doc)
    by = {(r["nodes"], r["client"]): r for r in back["rows"]}
    assert by[(1, "clusterctl")]["cpu_per_node_ms"] == 11.0 and by[(1, "openssh")]["over_clusterctl"] == 9.09
    assert by[(8, "openssh-kex")]["cpu_per_node_ms"] == 36.25 and by[(8, "paramiko")]["over_clusterctl"] == 0.53
    table = plot.table(back)
    assert "| 8 | openssh-kex | 36.2 | 3.15x | 0.290 | 0.55 |" in table


def test_exec_rows_round_trip_and_outputs_are_checked():
    results = {(8, "pdsh"): [(0.30, 0.9), (0.34, 1.1)], (8, "clusterctl"): [(0.60, 0.8), (0.64, 0.7)],
               (8, "by-hand"): [(0.9, 3.0)], (1, "clusterctl"): [(0.5, 0.6)], (1, "clush"): [(0.25, 0.4)]}
    rows = exec_bench.rows_for(results)
    assert [(r["nodes"], r["way"]) for r in rows] == [
        (1, "clusterctl"), (1, "clush"), (8, "clusterctl"), (8, "pdsh"), (8, "by-hand")]
    doc = plot.document("exec", "python benchmarks/exec.py",
                        {**COND, "repeat": 2, "command": "uname -r", "fanout": 64}, rows=rows)
    back = roundtrip(doc)
    by = {(r["nodes"], r["way"]): r for r in back["rows"]}
    assert by[(8, "pdsh")]["cpu_over_clusterctl"] == 0.52 and by[(8, "by-hand")]["wall_over_clusterctl"] == 4.0
    assert by[(1, "clush")]["cpu_per_node_ms"] == 250.0
    assert "| 8 | by-hand | 0.900 | 1.45x | 3.00 | 4.00x |" in plot.table(back)
    # every node must answer: once per node (pdsh, the loop), once under all nodes (folded)
    assert exec_bench.answered("pdsh", "10.0.0.1: 6.1\n10.0.0.2: 6.1\n", 2, "6.1")
    assert not exec_bench.answered("pdsh", "10.0.0.1: 6.1\n", 2, "6.1")
    assert exec_bench.answered("clush", "---------------\n10.0.0.[1-2] (2)\n---------------\n6.1\n", 2, "6.1")
    assert not exec_bench.answered("clush", "a\n6.1\nb\n6.1\n", 2, "6.1")


# --------------------------------------------------------------------------- bad data


def committed() -> list[Path]:
    files = sorted(DATA.glob("*.json"))
    assert files, f"no data files in {DATA}"
    return files


@pytest.mark.parametrize(("benchmark", "key", "field"), [
    ("push", "rows", "seconds"), ("launch", "launch", "host_cpu"), ("collective", "rows", "verdict_s"),
    ("validate", "rows", "new_cpu"), ("scale", "rows", "peak_mb"), ("push", "conditions", "ideal_seconds"),
    ("workdir", "rows", "median"), ("registry", "rows", "seconds"), ("registry", "conditions", "ideal_seconds"),
])
def test_a_missing_field_is_named_with_its_file(tmp_path, capsys, benchmark, key, field):
    source = next(f for f in committed() if json.loads(f.read_text())["benchmark"] == benchmark
                  and json.loads(f.read_text()).get(key))
    doc = json.loads(source.read_text())
    target = doc[key] if key == "conditions" else doc[key][-1]
    del target[field]
    bad = tmp_path / source.name
    bad.write_text(json.dumps(doc))
    with pytest.raises(plot.DataError) as e:
        plot.load(bad)
    where = "conditions" if key == "conditions" else f"{key}[{len(doc[key]) - 1}]"
    assert str(e.value).startswith(f"{bad}: {where}: missing field \"{field}\"")
    assert plot.main([str(bad), "--out", str(tmp_path / "x.png")]) == 2
    assert f'{bad}: {where}: missing field "{field}"' in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["rows"][0].update(seconds="fast"), 'rows[0]: field "seconds" is "fast"; valid: a num'),
    (lambda d: d.update(benchmark="pushh"), 'field "benchmark" is "pushh"; valid: one of push'),
    (lambda d: d.update(rows=[]), "no rows: give at least one of the fields rows"),
    (lambda d: d.pop("source"), 'top level: missing field "source"'),
])
def test_wrong_data_is_one_clear_message(tmp_path, change, message):
    doc = json.loads((DATA / "push.json").read_text())
    change(doc)
    bad = tmp_path / "push.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(plot.DataError, match=re.escape(message)) as e:
        plot.load(bad)
    assert str(e.value).startswith(str(bad))
    (tmp_path / "notjson.json").write_text("{\n  nope")
    with pytest.raises(plot.DataError, match=r"notjson.json: line 2: not JSON"):
        plot.load(tmp_path / "notjson.json")


@pytest.mark.parametrize(("args", "message"), [
    (["--repeat", "0"], 'argument --repeat: "0": give a whole number, 1 or more'),
    (["--commands", "x"], 'argument --commands: "x": give a whole number, 1 or more'),
    (["--nodes", "1,0"], 'argument --nodes: "1,0": give node counts from 1 to'),
    (["--name", "Bad Name!"], "Bad Name!"),
])
def test_the_ssh_benchmark_refuses_bad_input_before_any_sandbox(args, message):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ssh_clients.py"), *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_script_refuses_an_output_in_a_missing_directory(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "validate.py"), "--nodes", "10",
                          "--json", str(tmp_path / "no" / "v.json")], capture_output=True, text=True)
    assert out.returncode == 2
    assert f"--json {tmp_path / 'no' / 'v.json'}: its directory does not exist" in out.stderr
    with pytest.raises(Exception, match="its directory does not exist"):
        plot.check_outputs(None, str(tmp_path / "no" / "p.png"))


# --------------------------------------------------------------------------- plots


@pytest.mark.slow   # every plot, 14 s of CPU; in the fast tier the docs' `make bench-plots` block draws them all
def test_every_committed_data_file_draws_an_800x450_png(tmp_path):
    written = plot.draw_all(DATA, tmp_path)
    assert sorted(p.name for p in written) == sorted(f"{f.stem}.png" for f in committed())
    for path in written:
        assert png_size(path) == (800, 450), path
    again = plot.draw(plot.load(DATA / "push.json"), tmp_path / "again.png")
    assert again.read_bytes() == (tmp_path / "push.png").read_bytes(), "same data, same bytes"
    # the committed images: one per data file, none without one (make bench-plots redraws them)
    assert sorted(p.name for p in (PAGES / "img").glob("*.png")) == sorted(p.name for p in written)
    for path in (PAGES / "img").glob("*.png"):
        assert png_size(path) == (800, 450), path


def test_the_command_line_draws_one_file_and_prints_tables(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plot.py"), str(DATA / "collective.json"),
                          "--out", str(tmp_path / "c.png")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert png_size(tmp_path / "c.png") == (800, 450)
    tables = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plot.py"), "--tables"],
                            capture_output=True, text=True)
    assert tables.returncode == 0, tables.stderr
    assert tables.stdout.count("<!-- bench-table: ") == len(committed())


# --------------------------------------------------------------------------- pages and data


def page_tables() -> list[tuple[Path, str, str]]:
    """(page, data file name, the table(s) under its marker) for every marker on the pages."""
    found = []
    for page in sorted(PAGES.glob("*.md")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = re.fullmatch(r"<!-- bench-table: ([\w.-]+\.json) -->", line.strip())
            if m:
                found.append((page, m.group(1), "\n".join(_table_lines(lines[i + 1:]))))
    return found


def _table_lines(lines: list[str]) -> list[str]:
    """The table(s) right after a marker: lines starting with "|", tables separated by one
    blank line (plot.launch_table gives launch and teardown tables one after the other)."""
    out: list[str] = []
    for j, line in enumerate(lines):
        if line.startswith("|"):
            out.append(line)
        elif line == "" and out and j + 1 < len(lines) and lines[j + 1].startswith("|"):
            out.append(line)
        else:
            break
    return out


def test_every_table_on_the_pages_is_its_data_file():
    tables = page_tables()
    assert {name for _, name, _ in tables} == {f.name for f in committed()}, \
        "every data file has its table on a page, and every marked table has its data file"
    for page, name, text in tables:
        expected = plot.table(plot.load(DATA / name))
        assert text == expected, f"{page.name}: the table of {name} differs from the data file " \
                                 f"(python benchmarks/plot.py --tables {DATA / name} prints it)"


def _values(value, numbers: set[float], strings: set[str]) -> None:
    if isinstance(value, dict):
        for v in value.values():
            _values(v, numbers, strings)
    elif isinstance(value, list):
        for v in value:
            _values(v, numbers, strings)
    elif isinstance(value, str):
        strings.add(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        numbers.add(float(value))


def test_every_figure_in_a_page_table_is_a_data_figure():
    """The other direction, figure by figure: every number in a marked table's rows is one
    of its data file's figures (to the digits shown; a "> N x" bound: a ratio of two), so a figure
    typed into a page fails even if the table code changed with it."""
    for page, name, text in page_tables():
        doc = plot.load(DATA / name)
        numbers: set[float] = set()
        strings: set[str] = set()
        _values({k: v for k, v in doc.items() if k not in ("source", "command")}, numbers, strings)
        rows = [line for line in text.splitlines()
                if line.startswith("|") and not line.startswith("|---")]
        headers = {line for line in rows if not re.search(r"\d", line.split("|")[1])}
        for line in rows:
            if line in headers:
                continue
            for cell in line.strip("|").split("|"):
                for known in sorted(strings, key=len, reverse=True):   # labels: runs, verdicts
                    if len(known) > 2:
                        cell = cell.replace(known, " ")
                for figure in re.findall(r"\d[\d,]*(?:\.\d+)?(?![\d.])", cell):
                    value = float(figure.replace(",", ""))
                    half = 0.5 * 10 ** -_decimals(figure) + 1e-9
                    # "> 70x": a previous design stopped at the limit, the bound limit / new
                    ratio = cell.strip().startswith(">") and any(
                        abs(value - a / b) <= half for a in numbers for b in numbers if b)
                    assert any(abs(value - n) <= half for n in numbers) or ratio, \
                        f"{page.name}, {name}: {figure} in '{cell.strip()}' is no figure of the data"


def _decimals(figure: str) -> int:
    return len(figure.split(".")[1]) if "." in figure else 0


def test_every_image_on_the_pages_exists():
    for page in PAGES.glob("*.md"):
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text()):
            assert (PAGES / image).is_file(), f"{page.name}: {image} is missing"
