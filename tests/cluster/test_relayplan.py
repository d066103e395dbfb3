"""The relay plan (pure: which node feeds which) and the one-push agent (real keys, no node).

plan_relay, choose_strategy, cut_off and plan_refeed take facts and give chains; HopAgent is checked
with a real ed25519 key: what it offers, that its signatures verify, and that it
refuses once its budget is spent or the push closed it.
"""

from __future__ import annotations

import paramiko
import pytest

from clusterctl.cluster.distribute import (
    choose_strategy,
    cut_off,
    failed_upstream,
    plan_refeed,
    plan_relay,
)
from clusterctl.cluster.transport.agent import HopAgent

A, B = frozenset({"sha256:a"}), frozenset({"sha256:b"})


def test_nodes_needing_the_same_layers_form_one_chain_fed_once_by_the_head():
    plan = plan_relay({"n1": A, "n2": A, "n3": A, "n4": A})
    assert plan.chains == (("n1", "n2", "n3", "n4"),)
    assert plan.roots == ["n1"]
    assert [plan.feeder(n) for n in ("n1", "n2", "n3", "n4")] == [None, "n1", "n2", "n3"]
    assert plan.hops == [("n1", "n2"), ("n2", "n3"), ("n3", "n4")]
    assert plan.children("n2") == ["n3"] and plan.children("n4") == []
    assert plan.downstream("n2") == ["n3", "n4"]


def test_different_needs_get_different_chains_in_inventory_order():
    plan = plan_relay({"n1": A, "n2": B, "n3": A, "n4": B, "n5": A})
    assert plan.chains == (("n1", "n3", "n5"), ("n2", "n4"))
    assert plan.roots == ["n1", "n2"]
    assert plan.feeder("n4") == "n2"


def test_width_splits_a_group_into_chains_of_near_equal_length():
    plan = plan_relay({f"n{i}": A for i in range(1, 8)}, width=3)
    assert plan.chains == (("n1", "n2", "n3"), ("n4", "n5"), ("n6", "n7"))
    assert plan_relay({"n1": A}, width=4).chains == (("n1",),)
    with pytest.raises(ValueError):
        plan_relay({"n1": A}, width=0)


def test_every_node_is_fed_exactly_once():
    needs = {f"n{i}": (A if i % 3 else B) for i in range(1, 20)}
    plan = plan_relay(needs, width=2)
    assert sorted(plan.nodes) == sorted(needs)
    fed = [b for _, b in plan.hops] + plan.roots
    assert sorted(fed) == sorted(needs)


def test_choose_strategy():
    assert choose_strategy("auto", ["n1"]) == "star"
    assert choose_strategy("auto", ["n1", "n2"]) == "star"
    assert choose_strategy("auto", ["n1", "n2", "n3"]) == "relay"
    assert choose_strategy("star", ["n1", "n2", "n3"]) == "star"
    assert choose_strategy("relay", ["n1"]) == "relay"
    # a small change (what the star would send, when the source knows it) goes by star
    from clusterctl.cluster.distribute.relayplan import RELAY_FROM_BYTES
    four = ["n1", "n2", "n3", "n4"]
    assert choose_strategy("auto", four, 4 * 5_300_000) == "star"
    assert choose_strategy("auto", four, RELAY_FROM_BYTES) == "relay"
    assert choose_strategy("auto", four, None) == "relay"
    assert choose_strategy("relay", four, 1) == "relay"
    with pytest.raises(ValueError):
        choose_strategy("tree", ["n1"])


def _sign_request(key: paramiko.PKey, data: bytes) -> bytes:
    m = paramiko.Message()
    m.add_byte(bytes([13]))
    m.add_string(key.asbytes())
    m.add_string(data)
    m.add_int(0)
    return m.asbytes()


def _bind(host: paramiko.PKey, session_id: bytes, *, forwarding: bool = False,
          signed_by: paramiko.PKey | None = None) -> bytes:
    """A session-bind@openssh.com request as a node's ssh sends it: the host key's own
    signature over the session id (``signed_by`` another key: a forged one)."""
    sig = (signed_by or host).sign_ssh_data(session_id)
    m = paramiko.Message()
    m.add_byte(bytes([27]))
    m.add_string("session-bind@openssh.com")
    m.add_string(host.asbytes())
    m.add_string(session_id)
    m.add_string(sig.asbytes())
    m.add_boolean(forwarding)
    return m.asbytes()


def _login(session_id: bytes, key: paramiko.PKey, user: str = "root", service: str = "ssh-connection") -> bytes:
    """The userauth data an ssh asks the agent to sign (RFC 4252 section 7)."""
    m = paramiko.Message()
    m.add_string(session_id)
    m.add_byte(bytes([50]))
    m.add_string(user)
    m.add_string(service)
    m.add_string("publickey")
    m.add_boolean(True)
    m.add_string(key.get_name())
    m.add_string(key.asbytes())
    return m.asbytes()


def test_push_agent_signs_within_its_budget_and_nothing_after_close():
    key, node = _ed25519(), _ed25519()
    public = paramiko.Ed25519Key(data=key.asbytes())
    agent = HopAgent(key, budget=2, destinations={node.asbytes(): {"root"}})
    answer = paramiko.Message(agent._answer(bytes([11]), []))
    assert answer.get_byte() == bytes([12]) and answer.get_int() == 1
    assert answer.get_binary() == key.asbytes()
    for sid in (b"session-1", b"session-2"):
        binds: list = []
        assert agent._answer(_bind(node, sid), binds) == bytes([6])
        data = _login(sid, key)
        reply = paramiko.Message(agent._answer(_sign_request(key, data), binds))
        assert reply.get_byte() == bytes([14])
        assert public.verify_ssh_sig(data, paramiko.Message(reply.get_binary()))
    binds = []
    agent._answer(_bind(node, b"session-3"), binds)
    assert agent._answer(_sign_request(key, _login(b"session-3", key)), binds) == bytes([5])  # over budget
    other = HopAgent(key, budget=5, destinations={node.asbytes(): {"root"}})
    other.close()
    binds = []
    other._answer(_bind(node, b"x"), binds)
    assert other._answer(bytes([11]), binds) == bytes([5])
    assert other._answer(_sign_request(key, _login(b"x", key)), binds) == bytes([5])
    assert other._answer(_sign_request(_ed25519(), _login(b"x", key)), binds) == bytes([5])  # a key it does not hold


def test_the_agent_signs_only_a_login_bound_to_a_planned_node():
    """Destination constraints (issue 24: the tree safe by default), with real keys and
    signatures: what a node holding the forwarded socket can and cannot get signed."""
    key, planned, stranger = _ed25519(), _ed25519(), _ed25519()
    agent = HopAgent(key, budget=10, destinations={planned.asbytes(): {"root"}})

    def sign(sid, binds, data=None):
        return agent._answer(_sign_request(key, data or _login(sid, key)), binds)[0]

    assert sign(b"s1", []) == 5                                     # an ssh that did not bind (< 8.9)
    assert "did not bind" in agent.refused[-1]
    b: list = []
    assert agent._answer(_bind(stranger, b"s2"), b) == bytes([5])   # a host not planned
    assert "not one of the planned nodes" in agent.refused[-1] and sign(b"s2", b) == 5
    b = []
    assert agent._answer(_bind(planned, b"s3", signed_by=stranger), b) == bytes([5])   # forged
    assert "does not hold" in agent.refused[-1] and sign(b"s3", b) == 5
    b = []
    assert agent._answer(_bind(planned, b"s4"), b) == bytes([6])
    assert sign(b"another", b) == 5                                 # bound to s4, asked for another
    assert "another session" in agent.refused[-1]
    assert agent._answer(_bind(planned, b"s5"), b) == bytes([5])    # bound for a login: no rebinding
    b = []
    assert agent._answer(_bind(planned, b"s6", forwarding=True), b) == bytes([6])
    assert sign(b"s6", b) == 5                                      # only forwarded through s6
    assert agent._answer(_bind(planned, b"s7"), b) == bytes([6])    # then bound for a login: ok
    b = []
    assert agent._answer(_bind(planned, b"s8"), b) == bytes([6])
    assert sign(b"s8", b, _login(b"s8", key, user="admin")) == 5    # the planned host, another user
    assert "not the user planned for the bound node" in agent.refused[-1]
    assert sign(b"s8", b, _login(b"s8", key, service="other")) == 5  # another service
    assert "not ssh-connection" in agent.refused[-1]
    b = []
    assert agent._answer(_bind(planned, b"s7"), b) == bytes([6])
    assert sign(b"s7", b) == 14
    assert agent._answer(bytes([27]) + b"\x00\x00\x00\x04junk", []) == bytes([5])   # other extension
    assert agent.signed == 1


def _ed25519() -> paramiko.PKey:
    import io
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        return paramiko.Ed25519Key.from_private_key(io.StringIO(path.read_text()))



def test_compression_is_chosen_only_when_the_link_is_the_bottleneck():
    from clusterctl.cluster.distribute.wire import should_compress

    MBs = 1e6
    assert should_compress(10 * MBs, 0.4, 200 * MBs)[0] is True        # slow link, fast zstd
    assert should_compress(200 * MBs, 0.4, 250 * MBs)[0] is False       # zstd barely keeps up
    ok, why = should_compress(10 * MBs, 0.95, 500 * MBs)                # random bytes
    assert ok is False and "95%" in why


# --------------------------------------------------------------------------- a node lost mid-push

CHAIN6 = plan_relay({f"n{i}": A for i in range(1, 7)})  # n1 -> n2 -> ... -> n6


def test_a_lost_middle_node_cuts_off_every_node_after_it_that_has_not_completed():
    assert cut_off(CHAIN6, lost={"n3"}) == ["n4", "n5", "n6"]
    # the lost node itself has failed (named), it is not fed again; nodes above it go on
    assert "n3" not in cut_off(CHAIN6, lost={"n3"})
    # a node below that already has the image (its whole stream) fed all of it onward too
    assert cut_off(CHAIN6, lost={"n3"}, completed={"n4", "n5", "n6"}) == []
    assert cut_off(CHAIN6, lost={"n3"}, completed={"n4"}) == []
    assert cut_off(CHAIN6, lost={"n3"}, completed={"n5"}) == ["n4"]
    # two lost nodes in one chain: the one below is failed too, the rest cut off
    assert cut_off(CHAIN6, lost={"n2", "n4"}) == ["n3", "n5", "n6"]
    assert cut_off(CHAIN6, lost=set()) == []
    # the chain's first node is fed by the head: nothing above it to lose
    assert cut_off(CHAIN6, lost={"n1"}) == ["n2", "n3", "n4", "n5", "n6"]


def test_a_broken_hop_cuts_off_the_node_it_fed_but_not_its_feeder():
    assert cut_off(CHAIN6, lost=set(), broken={("n2", "n3")}) == ["n3", "n4", "n5", "n6"]
    assert cut_off(CHAIN6, lost=set(), broken={("n5", "n6")}) == ["n6"]


def test_only_the_chain_with_the_failure_is_cut_off():
    plan = plan_relay({f"n{i}": A for i in range(1, 7)}, width=2)  # n1-n2-n3, n4-n5-n6
    assert cut_off(plan, lost={"n2"}) == ["n3"]
    assert cut_off(plan, lost={"n2", "n4"}) == ["n3", "n5", "n6"]


def test_the_cut_off_nodes_are_fed_again_from_the_head_one_new_chain_per_broken_chain():
    refeed = plan_refeed(CHAIN6, cut_off(CHAIN6, lost={"n3"}))
    assert refeed.chains == (("n4", "n5", "n6"),)
    assert refeed.roots == ["n4"] and refeed.feeder("n4") is None
    assert refeed.feeder("n6") == "n5"
    # a node of the old chain not fed again is left out: the next one is fed by the one before
    assert plan_refeed(CHAIN6, ["n3", "n5", "n6"]).chains == (("n3", "n5", "n6"),)
    # two chains broken: two new chains (their need and the push's width kept), in order
    plan = plan_relay({"a1": A, "b1": B, "a2": A, "b2": B, "a3": A, "b3": B})
    cut = cut_off(plan, lost={"a1", "b2"})
    assert cut == ["a2", "a3", "b3"]
    assert plan_refeed(plan, cut).chains == (("a2", "a3"), ("b3",))
    assert plan_refeed(plan, []).chains == ()
    with pytest.raises(ValueError, match="not in the plan: x9"):
        plan_refeed(plan, ["a2", "x9"])


def test_the_failure_that_cut_a_node_off_is_the_nearest_one_above_it():
    assert failed_upstream(CHAIN6, "n5", lost={"n3"}) == "n3"
    assert failed_upstream(CHAIN6, "n4", lost={"n3"}) == "n3"
    assert failed_upstream(CHAIN6, "n5", lost={"n2", "n4"}) == "n4"
    assert failed_upstream(CHAIN6, "n6", lost=set(), broken={("n4", "n5")}) == "n4"
    assert failed_upstream(CHAIN6, "n3", lost={"n5"}) is None
    assert failed_upstream(CHAIN6, "n1", lost={"n2"}) is None


def test_keep_drops_nodes_and_closes_the_chain_over_them():
    assert CHAIN6.keep(["n1", "n3", "n6"]).chains == (("n1", "n3", "n6"),)
    assert CHAIN6.keep([]).chains == ()
    assert CHAIN6.keep(["n6", "n2"]).chains == (("n2", "n6"),)  # the plan's order, not the argument's
