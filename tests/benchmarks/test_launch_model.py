"""benchmarks/launch_model.py: the least-squares model of the launch's head cost (pure)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("launch_model", ROOT / "benchmarks" / "launch_model.py")
launch_model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launch_model)


def test_a_line_is_fitted_exactly_and_projected():
    fixed, per = launch_model.fit([(1, 0.03), (4, 0.06), (16, 0.18)])
    assert round(fixed, 6) == 0.02 and round(per, 6) == 0.01
    doc = {"launch": [{"nodes": n, "design": "d", "host_cpu": 0.02 + 0.01 * n} for n in (1, 4, 16)]}
    [row] = launch_model.model(doc, [1000])
    assert round(row["projected"][1000], 6) == 10.02 and round(row["ratio"][1000], 3) == round(10.02 / 0.03, 3)


def test_the_published_data_is_modelled_within_its_own_scatter():
    doc = json.loads((ROOT / "docs" / "benchmarks" / "data" / "launch-tree.json").read_text())
    rows = {(r["design"], r["measure"]): r for r in launch_model.model(doc, [256, 1000])}
    direct = rows[("direct", "launch host CPU s")]
    assert direct["worst_error"] < 0.02 and 0.01 < direct["per_node"] < 0.02
    # the tree with the nodes' own key costs the head a small fraction per node of direct's
    assert rows[("tree-key", "launch host CPU s")]["per_node"] < direct["per_node"] / 10


def test_the_wall_on_nodes_with_cores_of_their_own_adds_the_heads_cpu_beyond_one_node():
    doc = {"launch": [{"nodes": n, "design": "direct", "host_cpu": 0.02 + 0.01 * n,
                       **({"wall": 0.4} if n == 1 else {})} for n in (1, 4, 16)]}
    rows = {r["measure"]: r for r in launch_model.model(doc, [32, 1000])}
    own = rows[launch_model.OWN_CORES]
    # the one-node wall, plus 10 ms of serial head CPU for each node beyond the first
    assert round(own["projected"][32], 6) == round(0.4 + 0.01 * 31, 6)
    assert round(own["ratio"][1000], 3) == round((0.4 + 0.01 * 999) / 0.4, 3)
    assert own["measured"] == [] and own["worst_error"] is None   # an estimate, not a fit
    # no one-node wall of the default path: nothing to estimate from
    del doc["launch"][0]["wall"]
    assert launch_model.OWN_CORES not in {r["measure"] for r in launch_model.model(doc, [32])}


def test_each_designs_stop_starts_from_the_one_node_stop():
    """``clusterctl stop`` takes the tree as the launch's inventory says: a series per
    design; one node never takes the tree, so the one-node stop (measured once, under any
    design's name) is the first point of every design's series."""
    doc = {"process": [{"nodes": 1, "design": "direct", "cpu": 0.6, "stop_cpu": 0.51},
                       {"nodes": 8, "design": "direct", "cpu": 0.7, "stop_cpu": 0.58},
                       {"nodes": 32, "design": "direct", "cpu": 0.8, "stop_cpu": 0.82},
                       {"nodes": 8, "design": "default", "cpu": 0.6, "stop_cpu": 0.52},
                       {"nodes": 32, "design": "default", "cpu": 0.8, "stop_cpu": 0.55}]}
    rows = {(r["design"], r["measure"]): r for r in launch_model.model(doc, [256])}
    direct, default = rows[("direct", "stop process CPU s")], rows[("default", "stop process CPU s")]
    assert direct["measured"] == [(1, 0.51), (8, 0.58), (32, 0.82)]
    assert default["measured"] == [(1, 0.51), (8, 0.52), (32, 0.55)]
    assert round(direct["per_node"], 6) == 0.01 and round(direct["fixed"], 6) == 0.5
    assert round(direct["projected"][256], 6) == 3.06
    assert default["per_node"] < direct["per_node"] / 5


def test_the_stop_inside_the_process_is_modelled_per_design_the_same_way():
    doc = {"launch": [{"nodes": 1, "design": "direct", "host_cpu": 0.04, "stop_host_cpu": 0.02},
                      {"nodes": 32, "design": "direct", "host_cpu": 0.8, "stop_host_cpu": 0.34},
                      {"nodes": 32, "design": "tree-agent", "host_cpu": 0.4, "stop_host_cpu": 0.05}]}
    rows = {(r["design"], r["measure"]): r for r in launch_model.model(doc, [1000])}
    direct, tree = rows[("direct", "stop host CPU s")], rows[("tree-agent", "stop host CPU s")]
    assert tree["measured"] == [(1, 0.02), (32, 0.05)]
    assert round(direct["per_node"], 6) == round(0.32 / 31, 6)
    assert round(tree["projected"][1000], 6) == round(0.02 + 0.03 / 31 * 999, 6)
