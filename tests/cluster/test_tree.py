"""Tree fan-out (clusterctl.cluster.transport.tree): every node's commands through ONE
connection from this machine, the nodes logging in to each other.

The plan and the reading of results are pure and tested on their own.  The rest runs on
the real 3-node sandbox with a tree of width 1 (node1 -> node2 -> node3), so a node
two hops down is reached through a node that was itself reached by a hop: agent
forwarding through two levels, and a middle node that can break.  Which connections this
machine opened is read from the Cluster itself (``is_connected``), not guessed.
"""

from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from clusterctl.cluster import preflight as pf
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import Cluster, tree
from clusterctl.cluster.transport.agent import HopAgent, load_key
from clusterctl.cluster.transport.hopssh import HOP_KEX
from clusterctl.core.errors import NodeError
from tests.fixtures.sandbox import kept_login_dirs

# --------------------------------------------------------------------------- pure


def test_plan_tree_is_breadth_first_with_width_children_per_node():
    names = [f"n{i}" for i in range(1, 8)]
    assert tree.plan_tree(names, 1) == {"n1": "n1", "n2": "n1/n2", "n3": "n1/n2/n3", "n4": "n1/n2/n3/n4",
                                        "n5": "n1/n2/n3/n4/n5", "n6": "n1/n2/n3/n4/n5/n6",
                                        "n7": "n1/n2/n3/n4/n5/n6/n7"}
    assert tree.plan_tree(names, 2) == {"n1": "n1", "n2": "n1/n2", "n3": "n1/n3", "n4": "n1/n2/n4",
                                        "n5": "n1/n2/n5", "n6": "n1/n3/n6", "n7": "n1/n3/n7"}
    star = tree.plan_tree(names, 32)
    assert all(star[n] == f"n1/{n}" for n in names[1:])
    # 500 nodes at the default width: two levels below the root, never more
    big = tree.plan_tree([f"n{i}" for i in range(500)], tree.DEFAULT_WIDTH)
    assert max(p.count("/") for p in big.values()) == 2
    children = {}
    for p in big.values():
        parent = p.rpartition("/")[0]
        if parent:
            children[parent] = children.get(parent, 0) + 1
    assert max(children.values()) == tree.DEFAULT_WIDTH


def _chunks(kind: str, name: str, k: int, data: bytes, width: int = 8) -> list[str]:
    """What a node's ``chunks`` writes for ``data`` (base64 in lines of ``width`` characters)."""
    text = base64.b64encode(data).decode()
    return [f"clusterctl-tree-{kind} {name} {k} {len(p)} {p}" for p in
            (text[i:i + width] for i in range(0, len(text), width))]


def test_parse_results_keeps_only_complete_nodes_and_names_failed_hops():
    cmds = {"a": [tree.Command(("true",)), tree.Command(("uname",))], "b": [tree.Command(("x",))],
            "c": [tree.Command(("y",))], "d": [tree.Command(("z",))]}
    b64 = lambda t: base64.b64encode(t.encode()).decode()  # noqa: E731
    # the lines of several nodes and commands come mixed; each one's pieces in order
    linux, oops, one = (_chunks("o", "a", 2, b"Linux\n"), _chunks("e", "a", 2, b"oops"),
                        _chunks("o", "b", 1, "only one, \u00e9\n".encode()))
    cut = _chunks("o", "d", 1, b"a line its parent died writing")
    stdout = "\n".join([
        "clusterctl-tree-r a 1 0 .",
        linux[0], one[0], *linux[1:], *oops, *one[1:],
        "clusterctl-tree-r a 2 3 .",
        "clusterctl-tree-r b 1 0 .",
        "clusterctl-tree-r c 2 0 .",              # c has one command: a 2nd is not its
        "clusterctl-tree-r z 1 0 .",              # not asked for: ignored
        "some noise a node printed",
        cut[0], cut[1][:-3],                      # d: a piece cut short (LEN tells) ...
        "clusterctl-tree-r d 1 0 .",              # ... so d is not complete, whatever follows
        "clusterctl-tree-r c 1 0",                # cut short before its end: not c's status
        f"clusterctl-tree-hop c 255 {b64('Permission denied (publickey).')} .",
    ])
    done, hops = tree.parse_results(stdout, cmds)
    assert sorted(done) == ["a", "b"]
    assert [(r.exit_code, r.stdout, r.stderr) for r in done["a"]] == [(0, "", ""), (3, "Linux\n", "oops")]
    assert done["a"][1].argv == ["uname"] and done["b"][0].stdout == "only one, \u00e9\n"
    assert hops == {"c": "ssh from its parent node exited 255: Permission denied (publickey)."}


def test_the_receiver_hands_each_piece_on_as_it_comes_and_holds_nothing():
    cmds = {"a": [tree.Command(("cat",))]}
    seen = []
    receiver = tree.Receiver(cmds, lambda *piece: seen.append(piece))
    for line in _chunks("o", "a", 1, b"x" * 30, width=12):
        receiver.line(line)
        assert seen[-1][:3] == ("a", 1, "out")      # at once, not at the command's end
    assert b"".join(p[3] for p in seen) == b"x" * 30
    assert receiver.complete() == {}
    receiver.line("clusterctl-tree-r a 1 0 .")
    assert receiver.complete() == {"a": [0]}


@pytest.mark.parametrize(("setting", "nodes", "each_node_anyway", "expected"), [
    (None, tree.AUTO_MIN_NODES, False, True),        # the default, from 16 nodes on
    (None, tree.AUTO_MIN_NODES - 1, False, False),   # below: a connection per node
    (None, 64, True, False),                         # shipping code opens them anyway
    ("auto", 64, False, True),
    (True, 2, True, True),                           # asked for: always (2+ nodes)
    (True, 1, False, False),
    (False, 64, False, False),
])
def test_when_the_tree_is_taken(tmp_path, setting, nodes, each_node_anyway, expected):
    data = {"nodes": [{"host": f"10.9.0.{i + 1}"} for i in range(nodes)]}
    if setting is not None:
        data["ssh"] = {"tree": setting}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    cluster = Cluster(load_inventory(path), known_hosts=tmp_path / "known_hosts")
    cluster.each_node_anyway = each_node_anyway
    assert tree.enabled(cluster) is expected


# --------------------------------------------------------------------------- on the sandbox


def tree_inventory(sb, tmp_path: Path, **ssh) -> Path:
    data = yaml.safe_load(sb.inventory_path.read_text())
    data["ssh"].update({"tree": True, "tree_width": 1, **ssh})
    out = tmp_path / "tree.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def tree_leftovers(sb) -> list[str]:
    """Tree directories on this machine (the nodes share its files) and the tree's processes
    in the sandbox's nodes (their network namespaces): nothing may outlive a call.  A
    process is shown with the tree directories its command line names (after the script)."""
    found = [str(d) for d in Path("/tmp").glob("clusterctl-tree.*")]
    for marker in ("clusterctl-tree", '"$@" < "$IN"'):
        for p in sb.node_processes(marker, width=None):
            dirs = " ".join(re.findall(r"/tmp/clusterctl-tree\.[0-9a-f]+\.[0-9a-f]+", p))
            found.append(f"process {p[:80]!r} {dirs}".rstrip())
    return found


#: each node says where it runs (its addresses), what it was given and what came on stdin
PROBE = ("sh", "-c", 'ip -o -4 addr show | grep -o "inet [0-9.]*"; printf "<%s>" "$@"; cat; exit 7',
         "probe", "two words", "it's $(not run) `either`", "new\nline", "")


def probes(inventory_path: Path) -> dict[str, list[tree.Command]]:
    inv = load_inventory(inventory_path)
    return {n.name: [tree.Command(PROBE, f"secret for {n.name}\n".encode()),
                     tree.Command(("uname", "-m"))] for n in inv.nodes}


def check_probes(sb, results) -> None:
    for name, ip in sb.nodes.items():
        probe, uname = results[name]
        assert probe.exit_code == 7 and uname.exit_code == 0, (name, probe, uname)
        assert f"inet {ip}" in probe.stdout, (name, probe.stdout)      # it ran on that node
        assert ("<two words><it's $(not run) `either`><new\nline><>"
                f"secret for {name}\n") in probe.stdout, probe.stdout   # argv verbatim, stdin
        assert uname.stdout.strip() == subprocess.run(["uname", "-m"], capture_output=True,
                                                      text=True).stdout.strip()


@pytest.mark.parametrize("mode", ["agent", "node key"])
def test_every_node_runs_its_commands_through_one_connection(sandbox3, tmp_path, mode):
    sb = sandbox3
    extra = {"node_identity_file": str(sb.key)} if mode == "node key" else {}
    inv_path = tree_inventory(sb, tmp_path, **extra)
    seen = []
    with Cluster(load_inventory(inv_path)) as cluster:
        results = tree.run_commands(cluster, probes(inv_path), timeout=60, on_tree=seen.append)
        opened = [n for n in sb.nodes if cluster.is_connected(n)]
    check_probes(sb, results)
    first = next(iter(sb.nodes))
    assert opened == [first], opened                       # node2 and node3 came through it
    assert seen == [{"tree": list(sb.nodes), "direct": [], "hops": {}}]
    assert tree_leftovers(sb) == []


def logins(sb) -> dict[str, list[str]]:
    """Where each node's logins came from so far (its own sshd's log: one line per login)."""
    return {n: re.findall(r"Accepted publickey for \S+ from (\S+) ", sb.sshd_log(n)) for n in sb.nodes}


def mux_leftovers(sb, earlier: frozenset[str] = frozenset()) -> list[str]:
    """Directories of kept logins on this machine (the nodes share its files) but those
    ``earlier`` (another test's node cut off mid-run keeps its own until a later tree
    call's sweep), and the OpenSSH control masters in the sandbox's nodes: none may
    outlive the command."""
    return ([str(d) for d in kept_login_dirs() if str(d) not in earlier]
            + [f"process {p[:100]!r}" for p in sb.node_processes("clusterctl-mux.", width=None)
               if " [mux]" in p])


def only(sb, names):
    """The sandbox as check_probes sees it, with only ``names``."""
    return type(sb)(**{**sb.__dict__, "nodes": {n: sb.nodes[n] for n in names}})


@pytest.mark.parametrize("mode", ["agent", "node key"])
def test_a_command_logs_in_to_each_node_once_for_all_its_tree_calls(sandbox3, tmp_path, mode):
    """``cluster.tree_reuse`` (launch: preflight, start, follow, stop): each node is logged in
    to once per command, in the first tree call that takes it, and its parent keeps that
    login (an OpenSSH control master) for the command's next calls.  Call 1 takes node1 and
    node2 (node1 -> node2); calls 2 and 3 take all three (node1 -> node2 -> node3): node2's
    new login to node3 is signed through node1's master, made in call 1, by the agent of the
    call in progress.  Each node's sshd saw one login in all, every result came through the
    tree, and the cluster's close ended both masters (no login) and removed what they left."""
    sb = sandbox3
    names = list(sb.nodes)
    first, second, third = names
    extra = {"node_identity_file": str(sb.key)} if mode == "node key" else {}
    inv_path = tree_inventory(sb, tmp_path, **extra)
    before, seen, earlier = logins(sb), [], frozenset(mux_leftovers(sb))
    asked = probes(inv_path)
    with Cluster(load_inventory(inv_path)) as cluster:
        cluster.tree_reuse = True
        pair = {n: asked[n] for n in (first, second)}
        check_probes(only(sb, pair), tree.run_commands(cluster, pair, timeout=60, on_tree=seen.append))
        for _ in range(2):
            check_probes(sb, tree.run_commands(cluster, asked, timeout=60, on_tree=seen.append))
        during, masters = logins(sb), mux_leftovers(sb, earlier)
        opened = [n for n in names if cluster.is_connected(n)]
    assert opened == [first], opened
    assert [s["tree"] for s in seen] == [[first, second], names, names], seen
    assert {n: during[n][len(before[n]):] for n in names} == {
        first: [sb.head_ip], second: [sb.nodes[first]], third: [sb.nodes[second]]}
    assert logins(sb) == during                       # the close went over the masters
    assert len([m for m in masters if m.startswith("process")]) == 2, masters
    assert mux_leftovers(sb, earlier) == [] and tree_leftovers(sb) == []


def test_kept_logins_of_a_killed_command_end_by_themselves_and_the_next_removes_their_rest(
        sandbox3, tmp_path, monkeypatch):
    """The process holding the command is killed (SIGKILL: no close) while its tree call
    runs, with the nodes' logins kept: the tree's processes end (heartbeat), the masters
    end once idle for MUX_PERSIST seconds (5 here), and what they leave (a directory with a
    link) is removed by a later command's tree once MUX_SWEEP_MIN minutes old (0 here).
    (With 2 s, one of the two masters was once missing while the second call ran, in one
    whole-suite run of four: on 2 loaded cores the gap between the two calls can near 2 s,
    and a master that idles out just then is not the one the second call's hop uses.)"""
    import os
    import signal
    import sys
    import time

    sb = sandbox3
    inv_path = tree_inventory(sb, tmp_path)
    earlier = frozenset(mux_leftovers(sb))
    program = (
        "import sys\n"
        "from clusterctl.cluster.inventory import load_inventory\n"
        "from clusterctl.cluster.transport import Cluster, tree\n"
        "tree.MUX_PERSIST = 5\n"
        "inv = load_inventory(sys.argv[1])\n"
        "with Cluster(inv) as c:\n"
        "    c.tree_reuse = True\n"
        "    tree.run_commands(c, {n.name: [tree.Command(('true',))] for n in inv.nodes}, timeout=60)\n"
        "    tree.run_commands(c, {n.name: [tree.Command(('sleep', '300'))] for n in inv.nodes}, timeout=600)\n")
    child = subprocess.Popen([sys.executable, "-c", program, str(inv_path)], env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(sb.node_processes("sleep\0" "300", width=None)) < 3:
            time.sleep(0.2)
        masters = [p for p in mux_leftovers(sb) if p.startswith("process")]
        assert len(masters) == 2, mux_leftovers(sb, earlier)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (tree_leftovers(sb) or
                                           any(p.startswith("process") for p in mux_leftovers(sb))):
        time.sleep(0.5)
    assert tree_leftovers(sb) == []
    rest = mux_leftovers(sb, earlier)
    assert len(rest) == 2 and not any(p.startswith("process") for p in rest), rest
    assert not [f for d in rest for f in Path(d).iterdir() if f.name != "agent"], rest   # sockets gone

    monkeypatch.setattr(tree, "MUX_SWEEP_MIN", 0)
    with Cluster(load_inventory(inv_path)) as cluster:
        cluster.tree_reuse = True
        check_probes(sb, tree.run_commands(cluster, probes(inv_path), timeout=60))
        assert not set(rest) & set(mux_leftovers(sb)), mux_leftovers(sb)
    assert mux_leftovers(sb, earlier) == [] and tree_leftovers(sb) == []


def hop_login(sb, *options: str) -> tuple[subprocess.CompletedProcess, str | None]:
    """node1's own OpenSSH client logs in to node2 as a hop does (strict host key, the
    sandbox's key), with ``-v``: the result and the key exchange it negotiated."""
    first, second = list(sb.nodes)[:2]
    r = sb.in_netns(first, ["ssh", "-v", "-F", "/dev/null", "-T", "-o", "BatchMode=yes",
                            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={sb.known_hosts}",
                            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
                            "-i", str(sb.key), *options, f"root@{sb.nodes[second]}", "true"],
                    capture_output=True, text=True, timeout=60)
    found = re.search(r"kex: algorithm: (\S+)", r.stderr)
    return r, found.group(1) if found else None


def test_a_hop_leaves_out_only_the_slow_key_exchange(sandbox3):
    """HOP_KEX on the real OpenSSH of the nodes (tree and relay hops pass it): the client's
    own default list without sntrup761 and nothing else, in its order, and a real login
    between two nodes with it negotiates no sntrup761 (its key generation is most of a
    hop's CPU: see transport.hopssh).  The tree tests above prove the hops still log in."""
    def proposal(*options: str) -> list[str]:
        r = subprocess.run(["ssh", "-F", "/dev/null", "-G", *options, "node"],
                           capture_output=True, text=True, check=True)
        return next(line.split()[1] for line in r.stdout.splitlines()
                    if line.startswith("kexalgorithms ")).split(",")
    default, ours = proposal(), proposal("-o", f"KexAlgorithms={HOP_KEX}")
    assert ours == [k for k in default if not k.startswith("sntrup761")], (default, ours)
    plain, plain_kex = hop_login(sandbox3)
    hop, hop_kex = hop_login(sandbox3, "-o", f"KexAlgorithms={HOP_KEX}")
    assert plain.returncode == 0 and hop.returncode == 0, (plain.stderr[-500:], hop.stderr[-500:])
    assert plain_kex == default[0]           # without it, the client's first choice
    assert hop_kex == ours[0] and not hop_kex.startswith("sntrup761"), hop_kex


def test_a_node_the_tree_cannot_reach_is_run_on_its_own_connection(sandbox3, tmp_path):
    sb = sandbox3
    # a key that is not on the nodes: every hop is refused, so every node but the root
    # comes back through its own connection, and the hops' failures are named
    inv_path = tree_inventory(sb, tmp_path, node_identity_file="/nonexistent/clusterctl-key")
    seen = []
    with Cluster(load_inventory(inv_path)) as cluster:
        results = tree.run_commands(cluster, probes(inv_path), timeout=60, on_tree=seen.append)
        opened = [n for n in sb.nodes if cluster.is_connected(n)]
    check_probes(sb, results)
    names = list(sb.nodes)
    assert opened == names
    assert seen[0]["direct"] == names[1:]
    assert list(seen[0]["hops"]) == [names[1]], seen       # node3 hangs below node2: never tried
    assert "exited 255" in seen[0]["hops"][names[1]]
    assert tree_leftovers(sb) == []


def test_a_hop_that_failed_is_not_tried_again_in_the_same_command(sandbox3, tmp_path):
    """launch makes two tree calls (preflight, start) on one Cluster: a node whose hop
    failed in the first goes straight to its own connection in the next, so a node the
    others cannot reach costs the hop's timeout once per command, not once per call."""
    sb = sandbox3
    names = list(sb.nodes)
    inv_path = tree_inventory(sb, tmp_path, node_identity_file="/nonexistent/clusterctl-key")
    seen = []
    with Cluster(load_inventory(inv_path)) as cluster:
        for _ in range(3):
            check_probes(sb, tree.run_commands(cluster, probes(inv_path), timeout=60, on_tree=seen.append))
    assert [s["tree"] for s in seen] == [names, [names[0], names[2]], []], seen
    assert [list(s["hops"]) for s in seen] == [[names[1]], [names[2]], []], seen
    assert seen[2]["direct"] == names
    assert tree_leftovers(sb) == []


def test_a_broken_middle_node_is_named_and_the_node_below_it_still_runs(sandbox3, tmp_path):
    sb = sandbox3
    names = list(sb.nodes)
    inv_path = tree_inventory(sb, tmp_path)
    sb.stop_sshd(names[1])
    try:
        with Cluster(load_inventory(inv_path), connect_timeout=3) as cluster:
            results = tree.run_commands(cluster, probes(inv_path), timeout=60)
    finally:
        sb.start_sshd(names[1])
    assert isinstance(results[names[1]], NodeError) and results[names[1]].node == names[1]
    assert "refused" in results[names[1]].reason or "connect" in results[names[1]].reason
    ok = {n: r for n, r in results.items() if n != names[1]}
    check_probes(type(sb)(**{**sb.__dict__, "nodes": {n: sb.nodes[n] for n in ok}}), ok)
    assert tree_leftovers(sb) == []


def test_preflight_through_the_tree_finds_what_it_finds_node_by_node(sandbox3, tmp_path):
    sb = sandbox3
    names = list(sb.nodes)

    def checks(path):
        with Cluster(load_inventory(path)) as cluster:
            found = pf.run_preflight(cluster, devices_for=lambda n: ["/dev/clusterctl-none"]
                                     if n.name == names[2] else [], image_ref="clusterctl/none:0")
            return found, [n for n in names if cluster.is_connected(n)]

    direct, direct_opened = checks(sb.inventory_path)
    via_tree, tree_opened = checks(tree_inventory(sb, tmp_path))
    assert direct_opened == names and tree_opened == names[:1]
    fields = ("node", "ssh", "arch", "docker_version", "docker_root", "interface", "address",
              "init_binary", "init", "kernel", "driver", "problems", "missing_devices",
              "master_port_free", "image_id", "free_bytes")
    for d, t in zip(direct, via_tree, strict=True):
        for f in fields:
            if f == "free_bytes":   # the disk (this machine's, shared) moves between the two runs
                assert d.free_bytes and t.free_bytes, d.node
                assert abs(d.free_bytes - t.free_bytes) < max(2**31, d.free_bytes // 10), d.node
            else:
                assert getattr(d, f, None) == getattr(t, f, None), (d.node, f)
    problems = {c.node: c.problems for c in via_tree}
    assert problems[names[0]] == problems[names[1]] == []
    assert any("/dev/clusterctl-none" in p for p in problems[names[2]]), problems
    assert tree_leftovers(sb) == []


def test_known_hosts_index_finds_plain_and_hashed_entries_and_nothing_else(tmp_path):
    import paramiko

    from clusterctl.cluster.transport.hostkeys import known_hosts_index
    keys = [paramiko.RSAKey.generate(1024) for _ in range(3)]
    hk = paramiko.HostKeys()
    hk.add("10.0.0.1", "ssh-rsa", keys[0])
    hk.add("[10.0.0.2]:2222", "ssh-rsa", keys[1])
    hk.add(paramiko.HostKeys.hash_host("10.0.0.3"), "ssh-rsa", keys[2])
    index = known_hosts_index(hk)
    assert index("10.0.0.1") == [("ssh-rsa", keys[0].get_base64())]
    assert index("[10.0.0.2]:2222") == [("ssh-rsa", keys[1].get_base64())]
    assert index("10.0.0.2") == []                      # another port is another host
    assert index("10.0.0.3") == [("ssh-rsa", keys[2].get_base64())]   # hashed: matched one by one
    assert index("10.0.0.4") == []


def test_nothing_is_left_on_the_nodes_when_clusterctl_is_killed_mid_tree(sandbox3, tmp_path):
    """SIGKILL of the process holding the root's connection: the root's heartbeat then fails
    to write, it ends its part (its hops with it), and so does every node below it.  The
    directories checked are the ones this tree's processes (in the sandbox's namespaces)
    named while it ran: another session's tree on this machine is none of this test's."""
    import os
    import signal
    import sys
    import time

    sb = sandbox3
    inv_path = tree_inventory(sb, tmp_path)
    program = (
        "import sys\n"
        "from clusterctl.cluster.inventory import load_inventory\n"
        "from clusterctl.cluster.transport import Cluster, tree\n"
        "inv = load_inventory(sys.argv[1])\n"
        "with Cluster(inv) as c:\n"
        "    tree.run_commands(c, {n.name: [tree.Command(('sleep', '300'))] for n in inv.nodes}, timeout=600)\n")
    child = subprocess.Popen([sys.executable, "-c", program, str(inv_path)], env=os.environ.copy())
    ours: set[str] = set()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (len(ours) < len(sb.nodes) or not
                                               all(Path(d).is_dir() for d in ours)):
            for p in tree_leftovers(sb):
                ours |= set(re.findall(r"/tmp/clusterctl-tree\.[0-9a-f]+\.[0-9a-f]+", p))
            time.sleep(0.2)
        assert len(ours) == len(sb.nodes) and all(Path(d).is_dir() for d in ours), ours
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    def left() -> list[str]:
        return [d for d in ours if Path(d).exists()] + [p for p in tree_leftovers(sb)
                                                        if p.startswith("process")]
    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left() == []


def test_the_forwarded_agent_signs_only_for_the_planned_nodes(sandbox3):
    """The hop agent (the tree's and the relay's no-set-up mode) under the real nodes'
    OpenSSH: node1 holds the forwarded socket, with signatures to spare (a budget of 5),
    and its ``ssh`` logins are bound to their destination's host key.  Its login to
    node2 (a planned destination) is signed; its login to node3 (not planned) is not,
    although the same login with the sandbox's key file works (node3 is reachable and
    the command is right).  The budget alone would have signed both."""
    sb = sandbox3
    first, second, third = list(sb.nodes)

    def host_key(ip: str) -> bytes:
        line = next(line for line in sb.known_hosts.read_text().splitlines()
                    if line.split()[0] in (ip, f"[{ip}]:22"))
        return base64.b64decode(line.split()[2])

    def login(node: str, how: str, word: str, user: str = "root") -> str:
        return ("ssh -F /dev/null -T -o BatchMode=yes -o StrictHostKeyChecking=yes "
                f"-o UserKnownHostsFile={sb.known_hosts} -o GlobalKnownHostsFile=/dev/null "
                f"{how} {user}@{sb.nodes[node]} echo {word}; echo {word}-rc=$?; ")
    agent_only = "-o IdentityFile=/nonexistent"
    script = ("ssh-add -l; " + login(second, agent_only, "otheruser", user="daemon")
              + login(second, agent_only, "planned") + login(third, agent_only, "stranger")
              + login(third, f"-o IdentityAgent=none -i {sb.key}", "keyfile"))
    agent = HopAgent(load_key(sb.key), budget=5, destinations={host_key(sb.nodes[second]): {"root"}})
    with Cluster(load_inventory(sb.inventory_path)) as cluster:
        conn = cluster.connection(first)
        chan = conn.exec_channel(["sh", "-c", script], forward_agent=agent.handler)
        result = conn.wait_channel(chan, ["sh"], timeout=60)
    agent.close()
    out = result.stdout
    assert "clusterctl hop" in out, result                      # the agent was there (ssh-add -l)
    assert "\nplanned\nplanned-rc=0" in out, result
    assert "\nstranger\n" not in out and "stranger-rc=255" in out, result
    # the planned node as another user: the sandbox's sshd takes the key for any user (one
    # AuthorizedKeysFile), so a signed login as daemon would get in and exit 1 (nologin)
    assert "\notheruser\n" not in out and "otheruser-rc=255" in out, result
    assert "\nkeyfile\nkeyfile-rc=0" in out, result
    assert agent.signed == 1, agent.signed
    # daemon's login: bound to the planned node, the signature refused for another user;
    # the stranger's binding refused, its ssh asks for the signature anyway: refused, unbound
    assert agent.refused[0] == "a login as 'daemon', not the user planned for the bound node", agent.refused
    assert "a login to a host that is not one of the planned nodes" in agent.refused, agent.refused
    assert all("planned" in why or "did not bind" in why for why in agent.refused), agent.refused


def _usr_image(sb, node: str, tmp_path: Path) -> str:
    """A tiny image on ``node``'s own daemon: symlinks into /usr, which the container mounts
    from this machine (no registry, no base image)."""
    root = tmp_path / "img"
    if not root.exists():
        root.mkdir()
        for link in ("bin", "lib", "lib64", "sbin"):
            (root / link).symlink_to(f"usr/{link}")
        subprocess.run(["tar", "-C", str(root), "-cf", str(tmp_path / "img.tar"), "."], check=True)
    sb.node_docker(node, "import", str(tmp_path / "img.tar"), "cc-test/usr:1")
    return "cc-test/usr:1"


@pytest.mark.parametrize("how", ["tree", "hops refused"])
def test_stop_through_the_tree_brings_every_line_back_once(sandbox3, tmp_path, how):
    """``clusterctl stop``'s part on the nodes (containers.stop_nodes) with the tree on: each
    node's container runs until stopped, having written 20,000 lines (about 1 MB with
    docker's timestamps, so many pieces per node, mixed on the way up) and a last line
    without its newline.  Every line comes back exactly once and in order, with the final
    states, and this machine opened one connection.  With every hop refused, node2 and
    node3 are stopped on their own connections and read once, not twice."""
    import os
    import time

    from clusterctl.cluster import containers

    sb = sandbox3
    names = list(sb.nodes)
    extra = {"node_identity_file": "/nonexistent/clusterctl-key"} if how == "hops refused" else {}
    inv_path = tree_inventory(sb, tmp_path, **extra)
    run_id = f"treestop-{os.getpid()}-{how.split()[0]}"
    count = 20000
    for node in names:
        image = _usr_image(sb, node, tmp_path)
        sb.node_docker(node, "run", "-d", "--label", f"{containers.RUN_LABEL}={run_id}",
                       "--name", f"{run_id}-{node}", "--net=none", "-v", "/usr:/usr:ro", image, "sh", "-c",
                       f'seq 1 {count} | sed "s/^/{node} line /"; printf "{node} last words"; exec sleep 600')
    try:
        for node in names:
            deadline = time.monotonic() + 30
            while f"line {count}" not in sb.node_docker(node, "logs", "--tail", "1", f"{run_id}-{node}").stdout:
                assert time.monotonic() < deadline, node
                time.sleep(0.2)
        with Cluster(load_inventory(inv_path)) as cluster:
            got = containers.stop_nodes(cluster, run_id, names, grace=1, timeout=30)
            opened = [n for n in names if cluster.is_connected(n)]
    finally:
        for node in names:
            sb.node_docker(node, "rm", "--force", f"{run_id}-{node}", check=False)
    assert opened == (names[:1] if how == "tree" else names)
    for node in names:
        r = got[node]
        assert isinstance(r, containers.NodeStop) and r.error is None, (node, r)
        assert r.was_running == [f"{run_id}-{node}"], r.was_running
        (state,) = r.containers
        assert (state.name, state.running, state.exit_code) == (f"{run_id}-{node}", False, 137), state
        texts = [text for _, text in r.lines]
        assert len(texts) == count + 1, (node, len(texts), texts[-3:])
        assert texts == [f"{node} line {i}" for i in range(1, count + 1)] + [f"{node} last words"]
        assert sb.node_docker(node, "ps", "-aq", "--filter", f"label={containers.RUN_LABEL}={run_id}"
                              ).stdout.split() == [], node
    assert tree_leftovers(sb) == []


def test_a_line_written_whole_by_a_command_comes_as_it_is_and_a_cut_one_cuts_its_node():
    """The "clusterctl-tree-l NAME K TEXT ." lines a command writes itself (a followed run's
    log stream): each is that node's K-th command's output line, its text as it was
    (spaces, a trailing " ." of its own, an empty line); one without its final " ." was cut
    short by a dying hop, and nothing more of that node is taken."""
    got = []
    receiver = tree.Receiver({"a": [tree.Command(("x",))], "b": [tree.Command(("x",))]},
                             lambda n, k, s, d: got.append((n, k, s, d)))
    for line in ["clusterctl-tree-l a 1 2026-11-27T10:00:00.1Z  two  spaces .",
                 "clusterctl-tree-l a 1 ends with . .", "clusterctl-tree-l a 1  .",
                 "clusterctl-tree-l a 2 not asked .", "clusterctl-tree-l c 1 nobody .",
                 "clusterctl-tree-l b 1 cut sho", "clusterctl-tree-l b 1 after the cut ."]:
        receiver.line(line)
    assert got == [("a", 1, "out", b"2026-11-27T10:00:00.1Z  two  spaces\n"),
                   ("a", 1, "out", b"ends with .\n"), ("a", 1, "out", b"\n")]
    assert receiver.cut == {"b"}


def test_the_receiver_tells_each_end_and_each_failed_hop_as_its_line_arrives():
    codes, hops = [], []
    receiver = tree.Receiver({"a": [tree.Command(("x",)), tree.Command(("y",))]}, lambda *a: None,
                             on_code=lambda n, k, rc: codes.append((n, k, rc)),
                             on_hop=lambda n, why: hops.append((n, why)))
    receiver.line("clusterctl-tree-r a 2 3 .")
    assert codes == [("a", 2, 3)]
    receiver.line("clusterctl-tree-r a 3 0 .")      # not asked: not told
    receiver.line("clusterctl-tree-hop b 255 " + base64.b64encode(b"Connection timed out").decode() + " .")
    assert codes == [("a", 2, 3)]
    assert hops == [("b", "ssh from its parent node exited 255: Connection timed out")]
