"""What must match across nodes (cluster.consistency), on given facts: pure, no node."""

from __future__ import annotations

import pytest

from clusterctl.cluster import consistency, preflight
from clusterctl.cluster.consistency import PROBLEM, WARNING

ORDER = ["node1", "node2", "node3", "node4"]


def _facts(**odd):
    """Four nodes alike; ``odd`` = {node: {fact: value}} replaces some values."""
    base = {"docker_version": "20.10.24", "kernel": "6.1.0-21-amd64", "driver": None,
            "image_id": "sha256:" + "a" * 64}
    return {n: {**base, **odd.get(n, {})} for n in ORDER}


def test_alike_nodes_have_no_findings():
    assert consistency.compare(_facts(), ORDER) == []


@pytest.mark.parametrize("fact,value,severity,words", [
    ("image_id", "sha256:" + "b" * 64, PROBLEM, ["image ID sha256:bbbbbbbbbbbb differs",
                                                 "the other 3 nodes' sha256:aaaaaaaaaaaa"]),
    ("kernel", "5.10.0-28-amd64", WARNING, ["kernel 5.10.0-28-amd64 differs", "6.1.0-21-amd64"]),
    ("docker_version", "24.0.5", WARNING, ["Docker version 24.0.5 differs"]),
    ("torch", "2.12.0", PROBLEM, ["torch version in the image 2.12.0"]),
])
def test_the_odd_node_is_named_with_both_values(fact, value, severity, words):
    facts = _facts(node3={fact: value})
    if fact == "torch":
        for n in ORDER:
            facts[n].setdefault("torch", "2.13.0")
        facts["node3"]["torch"] = value
    [f] = consistency.compare(facts, ORDER)
    assert (f.node, f.fact, f.severity) == ("node3", fact, severity)
    assert all(w in f.message for w in words), f.message


def test_a_tie_takes_the_masters_value_as_reference():
    facts = {"node1": {"kernel": "A"}, "node2": {"kernel": "B"}}
    [f] = consistency.compare(facts, ["node1", "node2"])
    assert f.node == "node2" and "node1's (the master) A" in f.message


def test_unknown_values_are_not_compared():
    facts = _facts(node2={"driver": "nvidia 550.54.15"}, node4={"kernel": None})
    assert consistency.compare(facts, ORDER) == []


def test_drivers_that_differ_are_a_warning():
    facts = _facts(**{n: {"driver": "nvidia 550.54.15"} for n in ORDER[:3]},
                   node4={"driver": "nvidia 535.104.05"})
    [f] = consistency.compare(facts, ORDER)
    assert f.node == "node4" and f.severity == WARNING and "accelerator driver" in f.message


@pytest.mark.parametrize("offset,uncertainty,warned", [
    (0.2, 0.1, False), (1.5, 0.1, True), (-3.0, 0.2, True), (1.3, 0.5, False), (None, None, False)])
def test_clock_skew_over_one_second_is_a_warning(offset, uncertainty, warned):
    f = consistency.clock_finding("node2", offset, uncertainty)
    assert (f is not None) == warned
    if warned:
        assert f.severity == WARNING and ("ahead" if offset > 0 else "behind") in f.message


def test_parse_facts():
    assert preflight.parse_facts("6.1.0-21-amd64\n1763890000.123456789\nnvidia 550.54.15\n") == (
        "6.1.0-21-amd64", 1763890000.123456789, "nvidia 550.54.15")
    assert preflight.parse_facts("6.1.0\n1763890000.5\n\n") == ("6.1.0", 1763890000.5, None)
    assert preflight.parse_facts("") == (None, None, None)


def test_apply_consistency_puts_problems_and_warnings_on_the_odd_node():
    checks = [preflight.NodeCheck(node=n, host=n, ssh=True, docker_version="20.10.24",
                                  kernel="6.1", image_id="sha256:" + "a" * 64,
                                  clock_offset=0.01, clock_uncertainty=0.05) for n in ORDER]
    checks[1].image_id = "sha256:" + "c" * 64
    checks[3].clock_offset = 4.0
    preflight.apply_consistency(checks)
    assert [bool(c.problems) for c in checks] == [False, True, False, False]
    assert "image ID" in checks[1].problems[0] and not checks[1].ok
    assert checks[3].ok and "clock is 4.0 s ahead" in checks[3].warnings[0]


def test_backend_versions_text():
    assert preflight.backend_versions({"torch": "2.13.0"}) == "gloo (in torch)"
    assert preflight.backend_versions({"torch": "2.3", "nccl": "2.19.3", "torch_accl": "0.3"}) == \
        "nccl 2.19.3, torch_accl 0.3"
