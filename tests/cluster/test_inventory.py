"""The inventory loader against a corpus of real files (tests/fixtures/inventories/).

Every broken file must be reported as ``FILE:LINE: field: problem; valid: hint``
with the exact line and field, through the library (InventoryError, a
UserError) and through ``clusterctl nodes --nodes FILE`` (exit status 2, the
same line, no traceback). Good files must parse to exactly the expected nodes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster.inventory import MAX_BYTES as INVENTORY_MAX_BYTES
from clusterctl.cluster.inventory import (
    InventoryError,
    Node,
    SSHSettings,
    detect_format,
    load_inventory,
)
from clusterctl.cluster.transport import Cluster
from clusterctl.core.errors import UserError
from clusterctl.core.paths import inventories_dir
from clusterctl.core.yamlfile import MAX_SHOWN
from tests.fixtures import INVENTORIES

CORPUS = INVENTORIES
KEYS = CORPUS / "keys"

# file, line, field, words of the problem, words of the hint ("valid: ...")
BROKEN = [
    ("bad_duplicate_names.yaml", 5, "nodes[2].name", '"node1" is already the name of nodes[0] on line 3',
     "a name unique in this inventory"),
    ("bad_duplicate_address.yaml", 11, "nodes[2].host", "10.0.0.11 port 2222 is already nodes[0] on line 5",
     "distinct host and port"),
    ("bad_port_range.yaml", 5, "nodes[0].port", "70000 is out of range", "from 1 to 65535"),
    ("bad_master_port.yaml", 3, "master_port", "0 is out of range", "from 1 to 65535"),
    ("bad_identity_missing.yaml", 5, "nodes[0].identity_file", f"{KEYS}/does-not-exist does not exist",
     "a readable private key"),
    ("bad_identity_directory.yaml", 7, "nodes[1].identity_file", f"{KEYS} is not a file",
     "a readable private key"),
    ("bad_identity_public.yaml", 4, "defaults.identity_file", "is a public key", "a readable private key"),
    ("bad_unknown_field.yaml", 5, "nodes[0].prot", 'unknown field "prot" (did you mean "port"?)',
     "one of name, host, port"),
    ("bad_no_nodes_key.yaml", 1, "nodes", "the node list is missing", "a list of nodes"),
    ("bad_empty_nodes.yaml", 3, "nodes", "the node list is empty", "a list of nodes"),
    ("bad_empty.yaml", 1, "(file)", "the file is empty", "a mapping with nodes:"),
    ("bad_node_not_mapping.yaml", 4, "nodes[1]", "42 is not a node", "a list of nodes"),
    ("bad_slots_type.yaml", 5, "nodes[0].slots", '"eight" is not a whole number', "a whole number of at least 1"),
    ("bad_two_masters.yaml", 8, "nodes[1].master", "a second master (nodes[0] on line 3 is master too)",
     "at most one node with master: true"),
    ("bad_malformed_indent.yaml", 5, "(YAML syntax)", "a '-' list item indented differently",
     "check indentation"),
    ("bad_malformed_flow.yaml", 5, "(YAML syntax)", "flow mapping that began on line 4", "brackets"),
    ("bad_malformed_tab.yaml", 4, "(YAML syntax)", "'\\t'", "indent with spaces"),
    ("bad_hostfile_slots", 3, "slots", '"x" is not a whole number of at least 1 (in "node2 slots=x")',
     "host slots=N"),
    ("bad_hostfile_mpich", 3, "slots", '"0" is not a whole number of at least 1 (in "node2:0")', "host:N"),
    ("bad_hostfile_extra_word", 3, "host", 'unexpected "4" (did you mean "slots=4"?)', "host slots=N"),
    ("bad_deepspeed_key", 3, "host", 'unknown setting "slot=8" (did you mean "slots"?)', "host slots=N"),
    ("bad_hostfile_duplicate", 4, "host", "worker-1 port 22 is already line 2", "distinct host and port"),
    ("bad_env_null.yaml", 9, "nodes[0].env.NCCL_SOCKET_IFNAME", "an empty value is not text",
     'write "" for an empty value'),
    ("bad_env_name.yaml", 5, "nodes[0].env.NCCL-DEBUG", 'key "NCCL-DEBUG" is not an environment variable name',
     "variable names to text"),
    ("bad_env_secret.yaml", 4, "defaults.env", "the value is not a mapping", "variable names to text"),
    ("bad_known_hosts_dir.yaml", 3, "ssh.known_hosts", f"{KEYS} is a directory", "a known_hosts file"),
    ("bad_duplicate_key.yaml", 6, "nodes[0].slots", "is written twice (first on line 5",
     "each key once per mapping"),
    ("bad_host_with_user.yaml", 4, "nodes[0].host", '"root@10.0.0.11" holds a user', "no user@"),
    ("bad_host_option.yaml", 4, "nodes[0].host", "starts with '-'", "an address or ~/.ssh/config alias"),
    ("bad_defaults_port.yaml", 3, "defaults.port", '"22" is not a whole number', "from 1 to 65535"),
    ("bad_devices.yaml", 7, "nodes[0].devices[1]", '"dev/shm" is not an absolute device path',
     "absolute device paths"),
    ("bad_code_dir_colon.yaml", 5, "nodes[0].code_dir", "holds ':', which a container mount",
     "without ':'"),
]

# files with more than one problem: every (line, field, words) must be reported
MANY = {
    "bad_many_problems.yaml": [
        (2, "master_port", "70000 is out of range"),
        (6, "nodes[0].prot", 'did you mean "port"?'),
        (7, "nodes[1].name", '"node1" is already the name of nodes[0]'),
        (9, "nodes[1].slots", '"eight" is not a whole number'),
        (15, "nodes[3].master", "a second master"),
    ],
    "bad_unknown_top_field.yaml": [
        (1, "nodes", "the node list is missing"),
        (3, "node", 'unknown field "node" (did you mean "nodes"?)'),
    ],
    "bad_defaults_node_key.yaml": [
        (4, "defaults.host", '"host" cannot be a default (it belongs to each node)'),
        (6, "nodes[0].host", "is missing"),
    ],
    "bad_other_tools_words.yaml": [
        (3, "nodes[0].hostname", 'unknown field "hostname" (did you mean "host"?)'),
        (3, "nodes[0].host", "is missing"),
        (4, "nodes[0].gpus", 'unknown field "gpus" (did you mean "slots"?)'),
        (5, "nodes[0].nic", 'unknown field "nic" (did you mean "interface"?)'),
    ],
    "bad_ssh_settings.yaml": [
        (3, "ssh.accept_new_host_keys", '"yes" is not true or false'),
        (4, "ssh.fanout", "0 is out of range"),
        (5, "ssh.tree", '"on" is not true, false or auto'),
        (6, "ssh.tree_width", "0 is out of range"),
        (7, "ssh.node_identity_file", "contains whitespace"),
    ],
}


def _problem_line(path: Path, line: int, field: str) -> str:
    return f"{path}:{line}: {field}: "


def _reported(message: str, path: Path, line: int, field: str) -> str:
    """The one message line for (line, field); fails when there is none."""
    prefix = _problem_line(path, line, field)
    hits = [m for m in message.splitlines() if m.startswith(prefix)]
    assert len(hits) == 1, f"expected one line starting {prefix!r} in:\n{message}"
    return hits[0]


def test_corpus_has_a_case_for_every_broken_file():
    files = {p.name for p in CORPUS.iterdir() if p.name.startswith("bad_")}
    assert files == {c[0] for c in BROKEN} | set(MANY)


@pytest.mark.parametrize("name,line,field,problem,hint", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_file_is_reported_with_file_line_field_and_hint(name, line, field, problem, hint):
    path = CORPUS / name
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    err = info.value
    assert isinstance(err, UserError) and err.exit_code == 2
    assert len(err.problems) == 1, err.message  # exactly this problem, no follow-on noise
    text = _reported(err.message, path, line, field)
    before, _, valid = text.partition("; valid: ")
    assert problem in before
    assert hint in valid


@pytest.mark.parametrize("name", sorted(MANY))
def test_all_problems_of_a_file_are_reported_at_once(name):
    path = CORPUS / name
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert len(info.value.problems) == len(MANY[name]), info.value.message
    for line, field, words in MANY[name]:
        assert words in _reported(info.value.message, path, line, field)
    assert [p.line for p in info.value.problems] == sorted(p.line for p in info.value.problems)


@pytest.mark.parametrize("name,line,field", [(c[0], c[1], c[2]) for c in BROKEN]
                         + [(n, *MANY[n][0][:2]) for n in sorted(MANY)],
                         ids=[c[0] for c in BROKEN] + sorted(MANY))
def test_broken_file_through_the_cli_exits_2_with_the_message(name, line, field):
    path = CORPUS / name
    result = CliRunner().invoke(app, ["nodes", "--nodes", str(path)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert _problem_line(path, line, field) in result.stderr
    assert result.stdout == ""  # no table: nothing printed as if the inventory were valid


def test_env_values_are_never_echoed():
    """env may carry tokens: a bad env value is described, not printed."""
    with pytest.raises(InventoryError) as info:
        load_inventory(CORPUS / "bad_env_secret.yaml")
    assert "secret-token-123" not in info.value.message
    result = CliRunner().invoke(app, ["nodes", "-n", str(CORPUS / "bad_env_secret.yaml")])
    assert result.exit_code == 2 and "secret-token-123" not in result.output


def test_missing_file_names_it_and_what_would_be_valid(tmp_path):
    path = tmp_path / "no-such-inventory.yaml"
    with pytest.raises(UserError) as info:
        load_inventory(path)
    assert str(path) in info.value.message and "does not exist" in info.value.message
    assert "inventories/example.yaml" in info.value.message
    result = CliRunner().invoke(app, ["nodes", "-n", str(path)])
    assert result.exit_code == 2
    assert f"{path}: inventory file does not exist" in result.output


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(UserError, match="is not a file"):
        load_inventory(tmp_path)


# ----------------------------------------------------------------------------- good inventories

def test_full_yaml_parses_to_exactly_these_nodes():
    inv = load_inventory(CORPUS / "good_full.yaml")
    assert inv.format == "yaml"
    assert inv.master_port == 23456
    assert inv.ssh == SSHSettings(known_hosts=KEYS / "known_hosts", accept_new_host_keys=True,
                                  connect_timeout=2.5, fanout=4)
    common = dict(user="trainer", port=2222, identity_file=KEYS / "id_placeholder", slots=8,
                  devices=["/dev/infiniband"], interface="eth0")
    expected = [
        Node(name="node2", host="10.0.0.12", master=True, labels={"rack": "b", "zone": "west"},
             env={"NCCL_IB_HCA": "mlx5_0", "OMP_NUM_THREADS": "4", "NCCL_DEBUG": "INFO",
                  "FLAG": "yes", "MASK": "0755", "EMPTY": ""}, **common),
        Node(name="node1", host="10.0.0.11", labels={"rack": "a", "zone": "west"},
             env={"NCCL_IB_HCA": "mlx5_0", "OMP_NUM_THREADS": "4"}, **common),
        Node(name="gpu-box", host="gpu-box", port=22, user="admin", identity_file=KEYS / "id_placeholder",
             slots=4, devices=[], interface="ib0", labels={"rack": "a", "zone": "west"},
             env={"NCCL_IB_HCA": "mlx5_0", "OMP_NUM_THREADS": "4"}),
    ]
    assert [n.model_dump() for n in inv.nodes] == [n.model_dump() for n in expected]
    assert inv.master.name == "node2"
    assert [inv.rank(n) for n in ("node2", "node1", "gpu-box")] == [0, 1, 2]
    assert inv.node("gpu-box").slots == 4


def test_minimal_yaml_hosts_only_take_ssh_config_defaults():
    inv = load_inventory(CORPUS / "good_minimal.yaml")
    assert [(n.name, n.host, n.master, n.slots) for n in inv] == [
        ("10.0.0.11", "10.0.0.11", True, 1), ("10.0.0.12", "10.0.0.12", False, 1)]
    for n in inv:  # nothing written: the transport asks ~/.ssh/config
        assert n.user is None and n.identity_file is None
        assert "port" not in n.model_fields_set
    assert inv.master_port == 29500 and inv.ssh == SSHSettings()


def test_mpi_hostfile():
    inv = load_inventory(CORPUS / "good_mpi_hostfile")
    assert inv.format == "hostfile"
    assert [(n.name, n.host, n.slots, n.master) for n in inv] == [
        ("node1", "node1", 1, True), ("node2", "node2", 4, False), ("node3", "node3", 2, False),
        ("node4.cluster.example", "node4.cluster.example", 1, False)]
    assert all(n.user is None and n.identity_file is None and "port" not in n.model_fields_set
               for n in inv)


def test_deepspeed_hostfile():
    inv = load_inventory(CORPUS / "good_deepspeed_hostfile")
    assert [(n.name, n.slots, inv.rank(n.name)) for n in inv] == [("worker-1", 8, 0), ("worker-2", 8, 1)]


def test_hostfile_with_byte_order_mark_and_user_at_host():
    inv = load_inventory(CORPUS / "good_bom_hostfile")
    assert [(n.name, n.host, n.user, n.slots) for n in inv] == [
        ("worker-1", "worker-1", None, 2), ("worker-2", "worker-2", "admin", 2)]


def test_shipped_example_parses_as_documented():
    inv = load_inventory(inventories_dir() / "example.yaml")
    assert inv.names == ["node1", "node2", "node3"] and inv.master.name == "node1"
    assert inv.master_port == 29500
    node1, node2, node3 = inv.nodes
    assert (node1.user, node1.port, node1.slots, node1.interface) == ("root", 22, 8, "eth0")
    assert node1.identity_file is None  # commented out in the example: it must exist when loaded
    assert node2.labels == {"rack": "b"} and node2.env == {"NCCL_IB_HCA": "mlx5_0"}
    assert node3.slots == 4 and node3.env == {"NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "INFO"}
    assert inv.ssh.known_hosts == Path("~/.ssh/known_hosts").expanduser()


def test_tilde_and_relative_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home/.ssh").mkdir(parents=True)
    (tmp_path / "home/.ssh/id_test").write_text("placeholder")
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv/key").write_text("placeholder")
    inv_file = tmp_path / "inv/cluster.yaml"
    inv_file.write_text("ssh: {known_hosts: kh}\n"
                        "nodes:\n"
                        "  - {name: a, host: h1, identity_file: ~/.ssh/id_test}\n"
                        "  - {name: b, host: h2, identity_file: key}\n")
    inv = load_inventory(inv_file)
    assert inv.node("a").identity_file == tmp_path / "home/.ssh/id_test"
    assert inv.node("b").identity_file == tmp_path / "inv/key"
    assert inv.ssh.known_hosts == tmp_path / "inv/kh"


def test_yaml_merge_keys_and_anchors(tmp_path):
    f = tmp_path / "anchors.yaml"
    f.write_text("x-gpu: &gpu {slots: 8, labels: {kind: gpu}}\n"
                 "nodes: []\n")
    with pytest.raises(InventoryError, match='unknown field "x-gpu"'):
        load_inventory(f)
    f.write_text("nodes:\n"
                 "  - &base {name: a, host: h1, slots: 8}\n"
                 "  - {<<: *base, name: b, host: h2}\n")
    inv = load_inventory(f)
    assert [(n.name, n.host, n.slots) for n in inv] == [("a", "h1", 8), ("b", "h2", 8)]
    f.write_text("nodes:\n"
                 "  - &base {name: a, host: h1, slots: eight}\n"
                 "  - {<<: *base, name: b, host: h2}\n"
                 "  - {<<: *base, name: c, host: h3, slots: 2}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(f)  # a merged value is located where the merged mapping writes it
    assert [(p.line, p.field) for p in info.value.problems] == [(2, "nodes[0].slots"), (2, "nodes[1].slots")]


def test_an_alias_bomb_is_refused_with_exit_2(tmp_path):
    f = tmp_path / "bomb.yaml"
    f.write_text("x: &a0 [h, h, h, h, h, h, h, h, h]\n"
                 + "".join(f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
                 + "nodes: *a9\n")
    result = CliRunner().invoke(app, ["nodes", "--nodes", str(f)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{f}:" in result.stderr and "values (counting every value an alias" in " ".join(result.stderr.split())


def test_an_oversized_file_is_refused_before_it_is_parsed(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("node1\n" * (INVENTORY_MAX_BYTES // 6 + 1))
    with pytest.raises(UserError, match=r"hosts: is larger than .* any inventory; valid: a file of at most"):
        load_inventory(f)


def test_a_mistake_repeated_on_every_line_is_counted_not_listed_in_full(tmp_path):
    """200,000 duplicate lines: the heading counts every problem, the message lists the first
    ones and says how many more there are (a message, not a 30 MB wall of text)."""
    f = tmp_path / "hosts"
    f.write_text("node1\n" * 200_000)
    with pytest.raises(UserError) as info:
        load_inventory(f)
    lines = info.value.message.splitlines()
    assert lines[0] == f"{f}: 199,999 problems in the inventory (nothing was started):"
    assert lines[1] == f"{f}:2: host: node1 port 22 is already line 1; valid: each node at a distinct host and port"
    assert len(lines) == 1 + MAX_SHOWN + 1
    assert lines[-1] == f"{f}: ... and {199_999 - MAX_SHOWN:,} more problems after line {MAX_SHOWN + 1} (fix these first)"


def test_hostfile_named_yaml_says_why_it_was_read_as_yaml(tmp_path):
    f = tmp_path / "hosts.yaml"
    f.write_text("worker-1 slots=8\nworker-2 slots=8\n")
    with pytest.raises(InventoryError, match=r"hosts.yaml:1: \(file\): the file is .* not a mapping; "
                                             r"valid: .*name does not end in .yaml"):
        load_inventory(f)


def test_format_detection():
    assert detect_format(Path("x.yaml"), "node1 slots=4\n") == "yaml"
    assert detect_format(Path("hosts"), "# c\nnode1 slots=4\nnode2:4\n") == "hostfile"
    assert detect_format(Path("hosts"), "nodes:\n  - host: a\n") == "yaml"
    assert detect_format(Path("hosts"), "- a\n- b\n") == "yaml"
    assert detect_format(Path("hosts"), "node1\nnode9:\n") == "hostfile"  # host:N with N missing
    assert detect_format(Path("hosts"), "# typo of nodes:\nnode:\n  - host: a\n") == "yaml"
    assert detect_format(Path("hosts"), "master_port: 1\n") == "yaml"


# ----------------------------------------------------------------------------- the Inventory API

def test_inventory_api_by_name():
    inv = load_inventory(CORPUS / "good_full.yaml")
    with pytest.raises(UserError, match='no node named .node3.*did you mean "node2"'):
        inv.node("node3")
    with pytest.raises(UserError, match="no node named"):
        inv.rank("nope")
    assert [n.name for n in inv.select(["gpu-box", "node2"])] == ["node2", "gpu-box"]
    assert inv.select(None) == inv.nodes and len(inv) == 3


def test_inventory_built_in_code_is_put_in_rank_order(tmp_path):
    from clusterctl.cluster.inventory import Inventory

    a, b = Node(name="a", host="h1"), Node(name="b", host="h2", master=True)
    inv = Inventory(tmp_path / "x.yaml", [a, b])
    assert inv.names == ["b", "a"] and inv.master.name == "b"
    first_is_master = Inventory(tmp_path / "x.yaml", [a, Node(name="c", host="h3")])
    assert first_is_master.master.name == "a" and first_is_master.master.master is True
    with pytest.raises(UserError, match="at most one node with master"):
        Inventory(tmp_path / "x.yaml", [b, b.model_copy(update={"name": "c"})])


def test_nodes_are_frozen_and_hashable():
    n = Node(name="a", host="h1", env={"A": "1"})
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        n.port = 2
    assert {n: 1}[Node(name="a", host="h1", env={"A": "1"})] == 1
    assert len({n, Node(name="a", host="h1", env={"A": "2"})}) == 2


# ----------------------------------------------------------------------------- never a traceback

_REPLACEMENTS = ["", "~", "[]", "{}", "[1, 2]", "{a: 1}", '"text"', "-1", "0", "3.5", "true", "&a x", "*nope"]


def _mutations(text: str):
    """Every line deleted, and every value replaced by each kind of wrong value."""
    lines = text.splitlines()
    for i in range(len(lines)):
        yield "\n".join(lines[:i] + lines[i + 1:])
        head, colon, _ = lines[i].partition(": ")
        if colon and not head.lstrip().startswith("#"):
            for r in _REPLACEMENTS:
                yield "\n".join(lines[:i] + [f"{head}: {r}"] + lines[i + 1:])


def test_no_edit_of_a_good_file_gives_a_traceback(tmp_path):
    """Deleting any line of good_full.yaml or giving any value a wrong kind is a located problem,
    never an exception of another kind, and never a problem outside the file's lines."""
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys/id_placeholder").write_text("placeholder")
    f = tmp_path / "inv.yaml"
    failures = 0
    for text in _mutations((CORPUS / "good_full.yaml").read_text()):
        f.write_text(text)
        try:
            load_inventory(f)
        except InventoryError as e:
            failures += 1
            n_lines = len(text.splitlines())
            assert all(1 <= p.line <= max(n_lines, 1) for p in e.problems), (text, e.message)
            assert all(p.valid for p in e.problems), e.message
    assert failures > 100  # the mutations do break the file


@pytest.mark.parametrize("bad", ["node9:x", "node9 slots=", "node9 =4", "node9 slots=4=5", "@", ":",
                                 "node9:", "node9 slots=-1", "node9 max_slots=two", "node9 a b",
                                 "-node9", "node9 slots=1.5", "user@", "node9:"])
def test_hostfile_bad_line_is_located(tmp_path, bad):
    f = tmp_path / "hosts"
    f.write_text(f"# hosts\nnode1 slots=2\n{bad}\nnode3\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(f)
    assert {p.line for p in info.value.problems} == {3}, info.value.message
    assert all(p.valid for p in info.value.problems)


# ----------------------------------------------------------------------------- against a real sshd

def test_hostfile_nodes_reach_a_real_sshd_through_ssh_config(loopback_sshd, tmp_path):
    """Hostfile nodes write no port/user/key: ~/.ssh/config (here ssh -F) supplies them at connect time."""
    sshd = loopback_sshd
    config = tmp_path / "ssh_config"
    config.write_text("".join(f"Host worker-{i}\n  HostName {h}\n  Port {sshd.port}\n  User {sshd.user}\n"
                              f"  IdentityFile {sshd.key}\n" for i, h in enumerate(sshd.hosts[:2], 1)))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# DeepSpeed style\nworker-1 slots=2\nworker-2 slots=2\n")
    inv = load_inventory(hostfile)
    with Cluster(inv, known_hosts=sshd.known_hosts, ssh_config=config) as cluster:
        seen = cluster.map(lambda c: c.run(["printenv", "SSH_CONNECTION"], check=True).stdout.split()[2:])
    assert seen == {"worker-1": [sshd.hosts[0], str(sshd.port)], "worker-2": [sshd.hosts[1], str(sshd.port)]}


def test_relative_key_and_known_hosts_work_over_real_ssh_from_any_directory(loopback_sshd, tmp_path,
                                                                             monkeypatch):
    """identity_file and known_hosts relative to the inventory file, not to the working directory."""
    sshd = loopback_sshd
    cluster_dir = tmp_path / "cluster"
    (cluster_dir / "keys").mkdir(parents=True)
    shutil.copy(sshd.key, cluster_dir / "keys/id")
    shutil.copy(sshd.known_hosts, cluster_dir / "keys/known_hosts")
    (cluster_dir / "inv.yaml").write_text(
        "ssh: {known_hosts: keys/known_hosts}\n"
        f"defaults: {{user: {sshd.user}, port: {sshd.port}, identity_file: keys/id}}\n"
        f"nodes: [{sshd.hosts[0]}, {sshd.hosts[1]}]\n")
    monkeypatch.chdir(tmp_path)
    inv = load_inventory("cluster/inv.yaml")
    monkeypatch.chdir("/")
    with Cluster(inv) as cluster:
        codes = cluster.map(lambda c: c.run(["true"]).exit_code)
    assert codes == {sshd.hosts[0]: 0, sshd.hosts[1]: 0}
