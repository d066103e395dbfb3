"""The collective check's pure part: rounds, nccl-tests' formula, parsing, the verdict on numbers."""

from __future__ import annotations

import itertools
import json

import pytest

from clusterctl.run.collective import model
from clusterctl.run.collective.model import MARK, NodeReport, Thresholds

MiB = 1 << 20


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 16])
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n):
    rounds = model.round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [p for r in rounds for p in r]
    assert sorted(seen) == sorted(itertools.combinations(range(n), 2))
    for r in rounds:
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks)), f"a rank is in two pairs of one round: {r}"


def test_round_robin_of_fewer_than_two_is_empty():
    assert model.round_robin(1) == [] and model.round_robin(0) == []


@pytest.mark.parametrize("n", [3, 4, 5, 8, 9, 16, 500])
def test_default_pair_rounds_give_each_node_a_few_distinct_partners_at_any_size(n):
    rounds = model.pair_rounds(n)
    assert len(rounds) == min(model.DEFAULT_PAIR_ROUNDS, len(model.round_robin(n)))
    partners = {r: set() for r in range(n)}
    for pairs in rounds:
        assert len({x for p in pairs for x in p}) == 2 * len(pairs)      # disjoint in a round
        for a, b in pairs:
            partners[a].add(b)
            partners[b].add(a)
    want = min(model.DEFAULT_PAIR_ROUNDS, n - 1)
    assert all(len(p) >= want - (n % 2) for p in partners.values())
    assert model.pair_rounds(n, None) == model.round_robin(n)


def test_bus_bandwidth_is_nccl_tests_formula():
    # nccl-tests all_reduce: algbw = S/t, busbw = algbw * 2(n-1)/n
    assert model.bus_bandwidth(1_000_000_000, 1.0, 8) == pytest.approx(1.75e9)
    assert model.bus_bandwidth(1_000_000_000, 0.5, 2) == pytest.approx(2e9)  # 2 ranks: busbw = algbw
    assert model.bus_bandwidth(4 * MiB, 0.01, 4) == pytest.approx(4 * MiB / 0.01 * 1.5)
    assert model.bus_bandwidth(1, 0.0, 4) == 0.0


def _line(kind, **fields):
    return MARK + json.dumps({"kind": kind, "at": 1.0, **fields})


def test_parse_probe_output_reads_measurements_and_keeps_other_lines():
    text = "\n".join([
        "some warning from torch",
        _line("versions", torch="2.13.0+cpu", backend="gloo", backend_version="x", device="cpu"),
        _line("joined", seconds=0.5),
        _line("world", bytes=MiB, seconds=[0.1, 0.2, 0.3]),
        _line("pair", peer=2, bytes=MiB, seconds=[0.05, 0.06]),
        MARK + "{not json",
        _line("done"),
    ])
    r = model.parse_probe_output("node2", 1, text)
    assert r.versions["torch"] == "2.13.0+cpu" and r.joined == 0.5 and r.done
    assert r.world == {MiB: [0.1, 0.2, 0.3]} and r.pairs == {2: [0.05, 0.06]}
    assert r.pair_bytes == MiB and r.error is None
    assert r.tail == ["some warning from torch", MARK + "{not json"]
    err = model.parse_probe_output("n", 0, _line("error", phase="join", error="RuntimeError: x"))
    assert err.error == "join: RuntimeError: x" and not err.done


def _reports(n, pair_seconds, world_seconds=0.1, nbytes=MiB, rounds=None):
    """Reports of n nodes whose pair (a, b) all_reduce took pair_seconds(a, b), for the pairs
    of ``rounds`` pair rounds (None: every pair)."""
    met = {p for r in model.pair_rounds(n, rounds) for p in r}
    reports = []
    for rank in range(n):
        r = NodeReport(f"node{rank + 1}", rank, exit_code=0, joined=0.1, done=True,
                       world={nbytes: [world_seconds] * 3}, pair_bytes=nbytes)
        for peer in range(n):
            if (min(rank, peer), max(rank, peer)) in met:
                r.pairs[peer] = [pair_seconds(min(rank, peer), max(rank, peer))] * 3
        reports.append(r)
    return reports


def _slow_node(slow_rank, fast=0.01, slow=0.1):
    return lambda a, b: slow if slow_rank in (a, b) else fast


def test_measure_takes_the_slowest_rank_per_iteration_then_the_median():
    a = NodeReport("a", 0, world={MiB: [0.1, 0.5, 0.2]}, done=True)
    b = NodeReport("b", 1, world={MiB: [0.3, 0.1, 0.1]}, done=True)
    m = model.measure([b, a])
    # per iteration max: 0.3, 0.5, 0.2 -> median 0.3
    assert m.nodes == ["a", "b"] and m.world[0].seconds == pytest.approx(0.3)
    assert m.world[0].busbw == pytest.approx(MiB / 0.3)


def test_one_slow_node_of_four_is_named():
    m = model.measure(_reports(4, _slow_node(2)))
    v = model.decide(m, Thresholds())
    assert not v.ok and v.named == ["node3"]
    assert [x.status for x in v.nodes] == ["ok", "ok", "slow", "ok"]
    assert "node3" in v.message and "10.0x below" in v.nodes[2].reason
    assert m.pairs[(0, 1)] == pytest.approx(MiB / 0.01)
    assert model.matrix_rows(m)[2][0] == pytest.approx(MiB / 0.1) and model.matrix_rows(m)[2][2] is None


def test_two_slow_nodes_of_eight_are_both_named():
    slow = {3, 6}
    m = model.measure(_reports(8, lambda a, b: 0.1 if slow & {a, b} else 0.01))
    assert model.decide(m, Thresholds()).named == ["node4", "node7"]


@pytest.mark.parametrize("slow", [{0}, {7}, {2, 5}, {0, 1}])
def test_three_pair_rounds_name_up_to_two_slow_nodes_of_eight_for_sure(slow):
    m = model.measure(_reports(8, lambda a, b: 0.1 if slow & {a, b} else 0.01, rounds=3))
    assert len(m.pairs) == 12            # 3 rounds x 4 pairs, not all 28
    v = model.decide(m, Thresholds())
    assert v.named == [f"node{r + 1}" for r in sorted(slow)]
    assert "may be healthy" not in v.message


def test_a_node_whose_partners_were_all_slow_is_named_as_unsure_and_all_rounds_settle_it():
    """8 nodes, 3 rounds: node1 (rank 0) meets ranks 7, 6 and 5 (the circle method); with
    those three slow, healthy node1 never met a good partner."""
    partners = {b if a == 0 else a for r in model.pair_rounds(8) for (a, b) in r if 0 in (a, b)}
    assert partners == {5, 6, 7}
    slow = {5, 6, 7}
    pair = lambda a, b: 0.1 if slow & {a, b} else 0.01  # noqa: E731
    v = model.decide(model.measure(_reports(8, pair, rounds=3)), Thresholds())
    assert v.named == ["node1", "node6", "node7", "node8"]
    assert "node1: every partner it met was slow too, so it may be healthy" in v.message
    assert "--pair-rounds all" in v.message
    assert "may be healthy" in v.nodes[0].reason and "may be healthy" not in v.nodes[5].reason
    every = model.decide(model.measure(_reports(8, pair)), Thresholds())
    assert every.named == ["node6", "node7", "node8"] and "may be healthy" not in every.message


def test_healthy_nodes_pass_with_the_measured_bus_bandwidth():
    m = model.measure(_reports(4, lambda a, b: 0.01 + 0.001 * (a + b), world_seconds=0.02))
    v = model.decide(m, Thresholds())
    assert v.ok and v.named == [] and v.busbw == pytest.approx(MiB / 0.02 * 1.5)
    assert "all 4 nodes healthy" in v.message and "MB/s" in v.message


def test_a_slowdown_within_the_limit_passes_and_beyond_it_fails():
    m = model.measure(_reports(4, _slow_node(1, fast=0.01, slow=0.025)))  # 2.5x
    assert model.decide(m, Thresholds(max_slowdown=3)).ok
    assert model.decide(m, Thresholds(max_slowdown=2)).named == ["node2"]


def test_absolute_threshold_names_nodes_and_a_low_total():
    m = model.measure(_reports(4, lambda a, b: 0.01, world_seconds=0.02))
    pair_bw, total = MiB / 0.01, MiB / 0.02 * 1.5
    assert total < pair_bw
    assert model.decide(m, Thresholds(min_busbw=total * 0.9)).ok
    v = model.decide(m, Thresholds(min_busbw=pair_bw * 2))
    assert not v.ok and v.named == ["node1", "node2", "node3", "node4"]
    low = model.decide(m, Thresholds(min_busbw=(total + pair_bw) / 2))  # pairs pass, total not
    assert not low.ok and low.named == [] and "no single node stands out" in low.message


def test_two_nodes_cannot_tell_which_of_the_pair_is_slow():
    m = model.measure(_reports(2, lambda a, b: 0.1))
    v = model.decide(m, Thresholds(min_busbw=MiB / 0.05))
    assert v.named == ["node1", "node2"] and "either may be" in v.message


def test_a_container_that_could_not_start_is_named_and_the_others_not_measured():
    reports = [NodeReport("node1", 0, stopped=True, exit_code=137),
               NodeReport("node2", 1, start_error="container could not start: docker run exited 125: no such image"),
               NodeReport("node3", 2, stopped=True)]
    v = model.decide(model.measure(reports), Thresholds())
    assert not v.ok and v.named == ["node2"]
    assert [x.status for x in v.nodes] == ["not measured", "broken", "not measured"]
    assert "node2" in v.message and "no such image" in v.message
    assert v.nodes[0].reason == "stopped when node2 failed"


def test_a_node_that_never_joined_is_named():
    ok = _reports(3, lambda a, b: 0.01)
    ok[1] = NodeReport("node2", 1, exit_code=3, error="join: timeout")
    for r in ok:
        if r.rank != 1:
            r.done, r.stopped = False, True
    ok[0].stopped = False
    ok[0].error = "world: connection reset"
    v = model.decide(model.measure(ok), Thresholds())
    assert "node2" in v.named and "did not join" in v.nodes[1].reason


def test_nobody_joining_is_no_measurement_and_fails():
    reports = [NodeReport(f"node{i + 1}", i, exit_code=3, error="join: timed out") for i in range(3)]
    v = model.decide(model.measure(reports), Thresholds())
    assert not v.ok and v.named == [] and v.message.startswith("no measurement")


def test_json_has_the_matrix_and_every_node():
    m = model.measure(_reports(3, _slow_node(0)))
    t = Thresholds(max_slowdown=2)
    data = model.to_json(m, model.decide(m, t), t, check_id="c1")
    assert data["check_id"] == "c1" and not data["ok"] and len(data["matrix"]) == 3
    assert [n["status"] for n in data["nodes"]] == ["slow", "ok", "ok"]
    json.dumps(data)


@pytest.mark.parametrize("value,expected", [(2.5e9, "2.50 GB/s"), (1.5e6, "1.50 MB/s"),
                                            (2e3, "2.00 kB/s"), (12, "12 B/s"), (None, "-")])
def test_fmt_rate(value, expected):
    assert model.fmt_rate(value) == expected


# --------------------------------------------------------------------------- the plan (pure)

def test_the_probe_runs_with_launchs_plan_interactive_and_without_secrets(tmp_path):
    from clusterctl.cluster.inventory import load_inventory
    from clusterctl.run import plan
    from clusterctl.run.collective import check

    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - {name: a, host: 10.0.0.1, env: {HF_TOKEN: s3cret}}\n"
                   "  - {name: b, host: 10.0.0.2}\n  - {name: c, host: 10.0.0.3}\n")
    inventory = load_inventory(inv)
    job = check.check_job(job=None, target="cpu", image=None)
    options = check.Options(sizes=(MiB, 4 * MiB), pair_bytes=MiB, iters=2)
    plans = plan.make_plan(check.probe_job(job, 3, "gloo", options), inventory, run_id="cc-1",
                           interfaces={"a": "eth0", "b": "eth1", "c": "eth0"},
                           addresses={"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"})
    argv = check.container_argv(plans[1])
    assert argv[:5] == ["docker", "run", "-i", "--rm", "--net=host"] and "-d" not in argv
    assert argv[-4:-1] == ["clusterctl/cpu:2.13.0", "python3", "-"]
    cfg = json.loads(argv[-1])   # the braces doubled for the job template are single again
    assert {k: v for k, v in cfg.items() if k != "rounds"} == {
        "backend": "gloo", "device": "cpu", "module": [], "version": "torch",   # the table's gloo
        "sizes": [MiB, 4 * MiB], "iters": 2, "pair_bytes": MiB, "timeout": options.collective_timeout}
    assert sorted(tuple(p) for r in cfg["rounds"] for p in r) == [(0, 1), (0, 2), (1, 2)]
    env = dict(a.split("=", 1) for a, prev in zip(argv[1:], argv[:-1], strict=True) if prev == "-e")
    assert env["NODE_RANK"] == "1" and env["NNODES"] == "3" and env["MASTER_ADDR"] == "10.0.0.1"
    assert env["GLOO_SOCKET_IFNAME"] == "eth1"
    a = check.container_argv(plans[0])
    assert "s3cret" not in " ".join(a) and "--env-file" not in a   # no secret, stdin is the probe
    assert "--label" in a and "io.clusterctl.run=cc-1" in a   # found and removed by label


def test_probe_source_is_the_shipped_script():
    from clusterctl.run.collective import check

    text = check.probe_source().decode()
    assert "CLUSTERCTL-PROBE " in text and "init_process_group" in text
    compile(text, "probe.py", "exec")


# --------------------------------------------------------------------------- the budget (pure)

def test_parse_reads_the_budget_record_and_skipped_sizes():
    text = "\n".join([_line("skipped", bytes=16 * MiB, predicted=24.5),
                      _line("budget", phase="pair round 2", peer=3)])
    r = model.parse_probe_output("node2", 1, text)
    assert r.out_of_budget == "pair round 2" and r.unfinished_peer == 3
    assert r.skipped == {16 * MiB: 24.5} and not r.done and r.error is None
    r = model.parse_probe_output("node2", 1, _line("budget", phase="join", peer=None))
    assert r.out_of_budget == "join" and r.unfinished_peer is None


def test_a_node_with_no_pair_finished_in_the_budget_is_named_slow_with_the_pair():
    """node3 finished no pair: its pair with node2 was cut short in round 3 (its earlier
    rounds' pairs never finished either), the others' pairs are fast."""
    reports = _reports(4, _slow_node(2))
    for r in reports:
        r.pairs.pop(2, None)
        r.world = {}
    reports[2].pairs = {}
    for r in reports:
        r.done, r.exit_code, r.out_of_budget = False, 4, "pair round 3"
    reports[2].unfinished_peer, reports[1].unfinished_peer = 1, 2
    m = model.measure(reports)
    assert m.unfinished == {(1, 2)} and (1, 2) not in m.pairs
    v = model.decide(m, Thresholds())
    assert not v.ok and v.named == ["node3"], v.message
    assert [x.status for x in v.nodes] == ["ok", "ok", "slow", "ok"]
    assert "no pair finished within the budget" in v.nodes[2].reason
    assert "with node2" in v.nodes[2].reason and "pair round 3" in v.nodes[2].reason
    assert v.message.startswith("slow: node3")
    data = model.to_json(m, v, Thresholds())
    assert data["unfinished"] == [{"a": "node2", "b": "node3"}]
    assert data["nodes"][2]["out_of_budget"] == "pair round 3"


def test_both_nodes_of_the_only_unfinished_pair_are_named_and_one_may_be_healthy():
    reports = [NodeReport(f"node{i + 1}", i, exit_code=4, joined=0.1, out_of_budget="pair round 1",
                          unfinished_peer=1 - i) for i in range(2)]
    v = model.decide(model.measure(reports), Thresholds())
    assert v.named == ["node1", "node2"] and "either may be the slow one" in v.message


def test_a_budget_that_ends_in_the_world_phase_keeps_the_verdict_of_the_pairs():
    reports = _reports(4, _slow_node(3))
    for r in reports:   # a second size did not finish anywhere: its figures are not there
        r.done, r.exit_code, r.out_of_budget = False, 4, "world"
    v = model.decide(model.measure(reports), Thresholds())
    assert v.named == ["node4"] and [x.status for x in v.nodes] == ["ok", "ok", "ok", "slow"]
    healthy = _reports(4, lambda a, b: 0.01)
    for r in healthy:
        r.skipped = {16 * MiB: 30.0}
    m = model.measure(healthy)
    v = model.decide(m, Thresholds())
    assert v.ok and m.skipped == [16 * MiB] and "16 MiB left out" in v.message


def test_out_of_budget_before_any_pair_is_no_measurement_not_broken():
    reports = [NodeReport(f"node{i + 1}", i, exit_code=4, out_of_budget="join") for i in range(3)]
    v = model.decide(model.measure(reports), Thresholds())
    assert not v.ok and v.named == [] and v.message.startswith("no measurement")
    assert all(x.status == model.STOPPED and "budget was up in join" in x.reason for x in v.nodes)


def test_the_probe_budget_is_what_is_left_of_the_checks_and_caps_the_timeouts():
    from clusterctl.run.collective import check

    o = check.Options()
    assert o.budget == check.DEFAULT_BUDGET == 45.0
    budget, timeout = check.probe_budget(o, spent=5.0)
    assert budget == 45.0 - 5.0 - check.START_MARGIN - check.END_MARGIN
    assert timeout == 45.0 - 5.0   # the containers get the rest of the budget
    assert check.probe_budget(o, spent=44.0) == (check.MIN_PROBE_BUDGET, check.MIN_PROBE_BUDGET
                                                 + check.START_MARGIN + check.END_MARGIN)
    assert check.probe_budget(check.Options(budget=None), spent=5.0) == (None, 300.0)
    cfg = check.config(4, "gloo", check.Options(budget=60), budget=20.0)
    assert cfg["budget"] == 20.0 and cfg["timeout"] == 20.0   # the process group's too
    assert "budget" not in check.config(4, "gloo", check.Options(budget=None))
