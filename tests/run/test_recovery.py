"""The recovery rules (clusterctl.run.recovery): pure, facts in, a decision out.

Every rule of the module docstring has a case here that would fail if the rule changed:
exit-code classes, blame and exclusion, crash loops (same failure, no checkpoint
progress), the restart budget, spares taking ranks, shrinking within nnodes.
"""

from __future__ import annotations

import pytest

from clusterctl.run import recovery
from clusterctl.run.recovery import AttemptEnd, Policy, decide, replace_nodes


def failed(attempt, node="n2", code=1, line="boom", kind="exit", **kw):
    return AttemptEnd(attempt, "failed", code, node=node, kind=kind, last_line=line, **kw)


def test_success_interrupt_and_suspicious_end_the_run_whatever_the_budget():
    p = Policy(max_restarts=5)
    for state, code in (("succeeded", 0), ("interrupted", 130), ("suspicious", 125)):
        d = decide([AttemptEnd(0, state, code)], p)
        assert (d.action, d.exit_code) == ("end", code)


def test_without_restarts_the_run_ends_with_its_own_exit_status():
    d = decide([failed(0, code=7)], Policy(max_restarts=0))
    assert (d.action, d.exit_code) == ("end", 7)


def test_a_failure_restarts_and_counts_until_the_budget_is_spent():
    p = Policy(max_restarts=2, exclude_after=10)
    history = [failed(0, line="a")]
    assert decide(history, p).action == "restart" and decide(history, p).counted
    history.append(failed(1, line="b"))
    assert decide(history, p).action == "restart"
    history.append(failed(2, line="c"))
    d = decide(history, p)
    assert (d.action, d.exit_code) == ("end", recovery.RESTARTS_EXHAUSTED)
    assert "2 of 2" in d.reason


def test_retryable_codes_do_not_count_and_blame_nobody():
    p = Policy(max_restarts=1, retry_on_exit=frozenset({33}), exclude_after=10)
    history = [failed(i, code=33, line=f"x{i}") for i in range(5)]
    d = decide(history, p)
    assert d.action == "restart" and not d.counted and d.exclude == {}
    assert recovery.blame_counts(history, p) == {}


def test_a_fatal_code_ends_at_once_with_that_code():
    d = decide([failed(0, code=3)], Policy(max_restarts=9, fatal_on_exit=frozenset({3})))
    assert (d.action, d.exit_code) == ("end", 3) and "fatal" in d.reason


def test_signals_restart_but_do_not_blame_the_node():
    p = Policy(max_restarts=9, exclude_after=1)
    d = decide([failed(0, code=137)], p)
    assert d.action == "restart" and d.counted and d.exclude == {}


def test_a_node_blamed_k_times_is_excluded():
    p = Policy(max_restarts=9, exclude_after=2)
    history = [failed(0, node="n2", line="one")]
    assert decide(history, p).exclude == {}
    history.append(failed(1, node="n2", line="two"))
    assert list(decide(history, p).exclude) == ["n2"]


def test_a_lost_node_is_excluded_at_once():
    d = decide([failed(0, node="n1", code=255, kind="lost", lost=("n1",))], Policy(max_restarts=3))
    assert d.action == "restart" and list(d.exclude) == ["n1"]


def test_a_hang_blames_its_odd_ranks():
    p = Policy(max_restarts=3, exclude_after=1)
    d = decide([AttemptEnd(0, "hung", 124, kind="hang", blamed=("n3",))], p)
    assert d.action == "restart" and list(d.exclude) == ["n3"]


def test_the_same_failure_k_times_in_a_row_is_a_crash_loop():
    p = Policy(max_restarts=99, exclude_after=3)
    history = [failed(i, node="n2", code=1, line="ValueError: bad") for i in range(3)]
    d = decide(history, p)
    assert (d.action, d.exit_code) == ("end", recovery.CRASH_LOOP)
    assert "3 times in a row" in d.reason and "ValueError: bad" in d.reason
    # a different last line breaks the run of equal failures
    history[1] = failed(1, node="n2", code=1, line="other")
    assert decide(history, p).action == "restart"


def test_no_checkpoint_progress_for_three_attempts_is_a_crash_loop():
    p = Policy(max_restarts=99, exclude_after=99, checkpoint="/ck")
    marks = ["1.0 10 step-1", "2.0 10 step-2", "2.0 10 step-2", "2.0 10 step-2"]
    history = [failed(i, line=f"l{i}", checkpoint=m) for i, m in enumerate(marks[1:])]
    assert decide(history[:2], p, initial_checkpoint=marks[0]).action == "restart"
    d = decide(history + [failed(3, line="l3", checkpoint=marks[3])], p, initial_checkpoint=marks[0])
    assert (d.action, d.exit_code) == ("end", recovery.CRASH_LOOP) and "no checkpoint progress" in d.reason
    # progress in the window: no crash loop
    history[-1] = failed(2, line="l2", checkpoint="3.0 10 step-3")
    assert decide(history, p, initial_checkpoint=marks[0]).action == "restart"


def test_spares_take_the_excluded_nodes_ranks_and_the_master_may_change():
    nodes, left, swaps = replace_nodes(["m", "a", "b"], ["s1", "s2"], {"m": "lost"}, min_nodes=None)
    assert nodes == ["s1", "a", "b"] and left == ["s2"] and swaps == {"m": "s1"}


def test_without_a_spare_the_run_shrinks_only_down_to_min_nodes():
    nodes, _, _ = replace_nodes(["a", "b", "c"], [], {"b": "lost"}, min_nodes=2)
    assert nodes == ["a", "c"]
    with pytest.raises(recovery.NotEnoughNodes, match="needs 3"):
        replace_nodes(["a", "b", "c"], [], {"b": "lost"}, min_nodes=None)
    with pytest.raises(recovery.NotEnoughNodes, match="needs 2"):
        replace_nodes(["a", "b"], [], {"b": "lost"}, min_nodes=2)


def test_nnodes_picks_the_first_nodes_and_keeps_the_rest_as_spares():
    assert recovery.initial_nodes(["a", "b", "c"], ["s"], max_nodes=2, min_nodes=1) == (["a", "b"], ["c", "s"])
    assert recovery.initial_nodes(["a", "b"], ["s"], max_nodes=None, min_nodes=None) == (["a", "b"], ["s"])
    with pytest.raises(recovery.NotEnoughNodes):
        recovery.initial_nodes(["a"], [], max_nodes=3, min_nodes=2)


def test_the_resume_contract_is_the_same_for_every_rank():
    env = recovery.environment("r1", 2, ["n1", "n3"], "/shared/ck")
    assert env == {"CLUSTERCTL_RUN_ID": "r1", "CLUSTERCTL_ATTEMPT": "2",
                   "CLUSTERCTL_EXCLUDED_NODES": "n1,n3", "CLUSTERCTL_CHECKPOINT_DIR": "/shared/ck"}
    assert set(env) == set(recovery.RESUME_ENV)


def test_a_node_that_could_not_get_the_image_is_replaced_like_one_failing_its_checks():
    """A node lost in the middle of the relay push (the nodes after it are fed again) is
    named by PushFailed; launch excludes it and a spare takes its rank, as for preflight."""
    from clusterctl.run.launch import CollectiveFailed, PushFailed, _failed_nodes

    got = _failed_nodes(PushFailed({"node2": "the node stopped answering (link down)"}))
    assert got == {"node2": "could not get the image: the node stopped answering (link down)"}
    assert _failed_nodes(CollectiveFailed({"node3": "slow: 8 Mbit/s"})) == {"node3": "slow: 8 Mbit/s"}
    nodes, spares, swaps = recovery.replace_nodes(["node1", "node2", "node3"], ["node4"], got, min_nodes=None)
    assert nodes == ["node1", "node4", "node3"] and spares == [] and swaps == {"node2": "node4"}
