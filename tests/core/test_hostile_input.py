"""Everything read back is untrusted input, and every refusal is safe to print (issue 41 item 6).

One table of hostile cases per class, each class checked at its one guard:

(a) a file that is not regular or is huge: :func:`clusterctl.core.files.read_input` (job and
    inventory YAML, requirements, ignore files) and ``read_regular`` (records);
(b) names and digests read back from a record: :func:`clusterctl.run.records.read_back_problem`;
(c)/(d) credentials and unbounded input quoted back: :func:`clusterctl.core.text.shown`;
(e) numbers past what the target takes: export's int32 and slot bounds, the record's restarts;
(f) a value in a copy-paste shell line: validated (namespace) or ``shlex.quote``-d;
(g) ``--dry-run`` plans the nodes launch starts on (spares left out, nnodes applied):
    :func:`clusterctl.run.launch.first_nodes`;
(h) an empty command word: the job's command check.

Every refusal: exit 2 (UserError), no traceback, and the hostile bytes never printed raw.
"""

from __future__ import annotations

import json
import os
import shlex

import pytest
import yaml

from clusterctl.core.errors import UserError
from clusterctl.core.yamlfile import read_text
from clusterctl.run import records
from tests.fixtures.hostile import bounded, cli, refused

SECRET = "s3cr3tPW"


# --------------------------------------------------------------------------- (a) not regular, huge

def _fifo(p):
    os.mkfifo(p)
    return p


def _dir(p):
    p.mkdir()
    return p


def _huge(p, size=64 << 20):
    with open(p, "wb") as f:       # sparse: no disk used, but read whole it is 64 MiB
        f.truncate(size)
    return p


NOT_REGULAR = [("fifo", _fifo, "FIFO"), ("directory", _dir, "directory"), ("huge", _huge, "larger than")]


@pytest.mark.parametrize("kind,make,said", NOT_REGULAR, ids=[k for k, _, _ in NOT_REGULAR])
def test_read_input_refuses_what_is_not_a_bounded_regular_file(tmp_path, kind, make, said):
    from clusterctl.core.files import read_input
    p = make(tmp_path / "f")
    box = bounded(lambda: read_input(p, "the file", limit=1 << 20, valid="a file"))
    assert isinstance(box.get("error"), UserError) and said in str(box["error"]), box
    assert str(p) in str(box["error"])


@pytest.mark.parametrize("kind,make,said", NOT_REGULAR, ids=[k for k, _, _ in NOT_REGULAR])
def test_yaml_files_are_never_waited_on_nor_read_whole(tmp_path, kind, make, said):
    p = make(tmp_path / "inv.yaml")
    box = bounded(lambda: read_text(p, "inventory"))
    assert isinstance(box.get("error"), UserError), box


@pytest.mark.parametrize("kind,make,said", NOT_REGULAR, ids=[k for k, _, _ in NOT_REGULAR])
def test_requirements_file_is_never_waited_on_nor_read_whole(tmp_path, kind, make, said):
    from clusterctl.image import deps
    p = make(tmp_path / "requirements.txt")
    box = bounded(lambda: deps.read_requirements(p))
    assert isinstance(box.get("error"), UserError) and str(p) in str(box["error"]), box


@pytest.mark.parametrize("name", [".gitignore", ".clusterctlignore"])
def test_an_ignore_file_that_is_a_fifo_is_named_not_waited_on(tmp_path, name):
    from clusterctl.code import ignore
    (tmp_path / "train.py").write_text("print(1)\n")
    os.mkfifo(tmp_path / name)
    box = bounded(lambda: ignore.walk(tmp_path, use_git=False))
    err = box.get("error")
    assert isinstance(err, UserError) and name in str(err) and "FIFO" in str(err), box


@pytest.mark.parametrize("kind,make,said", NOT_REGULAR, ids=[k for k, _, _ in NOT_REGULAR])
def test_a_run_record_that_is_not_a_bounded_regular_file(runs_dir, kind, make, said):
    (runs_dir / "r1").mkdir(parents=True)
    make(runs_dir / "r1" / "run.json")
    box = bounded(lambda: records.load("r1"))
    assert isinstance(box.get("error"), UserError) and "run.json" in str(box["error"]), box
    box = bounded(lambda: records.list_runs())
    assert box.get("value") == [], box


# --------------------------------------------------------------------------- (b) names read back

def _record(run_id="r1", **kw) -> dict:
    base = {"run_id": run_id, "job": "ddp-smoke", "inventory": "/x/inv.yaml", "image": "img:1",
            "nodes": [{"node": "node1", "host": "10.0.0.11", "rank": 0, "container": "r1-node1"}]}
    return {**base, **kw}


def _plant(runs_dir, data: dict):
    d = runs_dir / data["run_id"]
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps(data))


NODE = {"node": "node1", "host": "10.0.0.11", "rank": 0, "container": "r1-node1"}
HOSTILE_RECORDS = {
    "node name ..": {"nodes": [{**NODE, "node": ".."}]},
    "node name with /": {"nodes": [{**NODE, "node": "../../home/alice/.ssh/authorized_keys"}]},
    "node name with ESC": {"nodes": [{**NODE, "node": "node1\x1b[2J"}]},
    "spare ..": {"spares": ["../x"]},
    "flight key ..": {"flight": {"..": "gone"}},
    "excluded key with newline": {"excluded": {"node1\nnode2": "lost"}},
    "attempt node ..": {"attempts": [{"attempt": 0, "nodes": [{**NODE, "node": "../a"}]}]},
    "image with ESC": {"image": "img:1\x1b]0;pwned\x07"},
    "container with CR": {"nodes": [{**NODE, "container": "c\rX"}]},
    "host with NUL": {"nodes": [{**NODE, "host": "10.0.0.11\x00"}]},
    "digest not one": {"image_digest": "sha256:../../x"},
    "max_restarts unbounded": {"max_restarts": 10**12},
    "attempt negative": {"attempt": -1},
}


@pytest.mark.parametrize("case", HOSTILE_RECORDS, ids=list(HOSTILE_RECORDS))
def test_a_record_with_a_hostile_name_is_not_a_run(runs_dir, case):
    _plant(runs_dir, _record(**HOSTILE_RECORDS[case]))
    with pytest.raises(UserError, match="is not to be trusted") as e:
        records.load("r1")
    assert "\x1b" not in str(e.value) and "\r" not in str(e.value) and "\x00" not in str(e.value)
    assert records.list_runs() == []
    out = cli("logs", "r1").output + cli("status", "r1").output
    assert "Traceback" not in out and "\x1b" not in out


def test_a_good_record_still_loads(runs_dir):
    _plant(runs_dir, _record(spares=["node-2"], image_digest="sha256:" + "a" * 64))
    assert records.load("r1").nodes[0].node == "node1"


@pytest.mark.parametrize("run_id", ["x" * 5000, "a\x1b[2Jb", "../../etc/passwd"])
def test_an_unknown_run_id_is_quoted_escaped_and_cut(runs_dir, run_id):
    out = refused(cli("logs", run_id))
    assert "\x1b" not in out and "x" * 200 not in out


# --------------------------------------------------------------------------- (c)/(d) quoted back

CREDENTIALS = [
    f"alice:{SECRET}@reg.example:5000",
    f"https://alice:{SECRET}@reg.example:5000/ns",
    f"https://{SECRET}@reg.example",
    f"alice:{SECRET}@reg.example:5000/team/x:1",
    f"oauth2:{SECRET}@10.0.0.5:5000",
]


@pytest.mark.parametrize("value", CREDENTIALS)
def test_shown_masks_a_credential(value):
    from clusterctl.core.text import shown
    assert SECRET not in shown(value) and "****@" in shown(value)


@pytest.mark.parametrize("value", ["ubuntu:22.04@sha256:" + "a" * 64, "reg:5000/x:1@sha256:ab",
                                   "alice@node1", "plain"])
def test_shown_keeps_what_is_not_a_credential(value):
    from clusterctl.core.text import without_credentials
    assert without_credentials(value) == value


@pytest.mark.parametrize("value", CREDENTIALS)
def test_registry_options_never_quote_a_credential(tmp_path, value):
    out = refused(cli("export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", "--registry", value),
                  "--registry")
    assert SECRET not in out


@pytest.mark.parametrize("value", CREDENTIALS)
def test_an_inventory_registry_never_quotes_a_credential(tmp_path, value):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"registry": value, "nodes": [{"name": "n1", "host": "n1.invalid"}]}))
    out = refused(cli("launch", "ddp-smoke", "--nodes", str(inv), "--dry-run"), "registry")
    assert SECRET not in out


@pytest.mark.parametrize("value", [f"alice:{SECRET}@reg.example:5000/x:1", f"u:{SECRET}@h/x"])
def test_an_image_with_a_credential_is_refused_and_masked(value):
    out = refused(cli("export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", "--image", value),
                  "credential")
    assert SECRET not in out


LONG = [("registry", "a" * 100_000 + "://"), ("secret-name", "A" * 100_000),
        ("pull-secret", "B" * 100_000), ("namespace", "C" * 100_000)]


@pytest.mark.parametrize("option,value", LONG, ids=[o for o, _ in LONG])
def test_unbounded_input_is_never_echoed_whole(option, value):
    out = refused(cli("export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", f"--{option}", value))
    assert len(out) < 2000 and "characters)" in out


def test_a_long_requirements_line_is_cut(tmp_path):
    from clusterctl.image import deps
    p = tmp_path / "requirements.txt"
    p.write_text("numpy\n" + "!" * 100_000 + "\x1b[2J\n")
    with pytest.raises(UserError) as e:
        deps.read_requirements(p)
    assert len(str(e.value)) < 1000 and ":2:" in str(e.value) and "characters)" in str(e.value)


def test_shown_cuts_and_escapes():
    from clusterctl.core.text import SHOWN_MAX, shown
    assert len(shown("x" * 10_000)) < SHOWN_MAX + 40 and "10000 characters" in shown("x" * 10_000)
    assert "\x1b" not in shown("a\x1b[2J") and "\\x1b" in shown("a\x1b[2J")


# --------------------------------------------------------------------------- (e) numbers

@pytest.mark.parametrize("args", [["--nnodes", "2147483648"], ["--nnodes", "3000000000"],
                                  ["--nnodes", "0"], ["--slots", "1025"], ["--slots", "3000000000"],
                                  ["--set", "NPROC_PER_NODE=99999999999"]])
def test_export_numbers_past_what_kubernetes_takes(args):
    base = ["export", "ddp-smoke", "--to", "pytorchjob"] + ([] if "--nnodes" in args else ["--nnodes", "2"])
    box = bounded(lambda: cli(*base, *args), timeout=30)
    refused(box["value"], "valid:")


def test_export_int32_edge_is_taken():
    res = cli("export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", "--slots", "1024")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("slots", [1025, 10**9])
def test_inventory_slots_arebounded(tmp_path, slots):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "n1", "host": "n1.invalid", "slots": slots}]}))
    box = bounded(lambda: cli("launch", "ddp-smoke", "--nodes", str(inv), "--dry-run"), timeout=30)
    refused(box["value"], "slots")


# --------------------------------------------------------------------------- (f) copy-paste lines

@pytest.mark.parametrize("ns", ["x; rm -rf ~", "$(id)", "a b", "`id`", "UPPER", "-n"])
def test_a_namespace_that_would_reach_the_kubectl_line_is_refused(ns):
    refused(cli("export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", "--namespace", ns), "--namespace")


@pytest.mark.parametrize("host,kh", [("node1", "/home/a b/known_hosts"), ("[n1]:2222", "/tmp/$(id)"),
                                     ("n'1", "/k")])
def test_ssh_keygen_line_is_quoted(host, kh):
    import paramiko

    from clusterctl.cluster.transport import hostkeys
    key = paramiko.RSAKey.generate(1024)
    text = hostkeys.describe_host_key_error(hostkeys.HostKeyChanged(host, key, key, kh))
    line = text.split("`ssh-keygen")[1].split("`")[0]
    assert shlex.split("ssh-keygen" + line) == ["ssh-keygen", "-R", host, "-f", kh]


# --------------------------------------------------------------------------- (g) dry run = launch

@pytest.mark.parametrize("nodes,nnodes,expect", [
    ([("a", False), ("b", False), ("s", True)], None, ["a", "b"]),
    ([("s", True), ("a", False), ("b", False)], None, ["a", "b"]),
    ([("a", False), ("b", False), ("c", False), ("s", True)], "2:3", ["a", "b", "c"]),
    ([("a", False), ("b", False), ("c", False)], "1:2", ["a", "b"]),
])
def test_dry_run_plans_the_nodes_launch_starts_on(tmp_path, runs_dir, nodes, nnodes, expect):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": n, "host": f"{n}.invalid", **({"spare": True} if s else {})}
                                             for n, s in nodes]}))
    job = tmp_path / "j.yaml"
    job.write_text(yaml.safe_dump({"image": "busybox", "command": ["true"],
                                   **({"nnodes": nnodes} if nnodes else {})}))
    res = cli("launch", str(job), "--nodes", str(inv), "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    plans = json.loads(res.output)
    assert [p["node"] for p in plans] == expect
    assert {p["env"].get("PET_NNODES") for p in plans} == {str(len(expect))}


# --------------------------------------------------------------------------- (h) empty command word

@pytest.mark.parametrize("command", [[""], ["  "], ["\t", "x"], ["", "train.py"]])
def test_an_empty_command_word_is_refused(tmp_path, command):
    job = tmp_path / "j.yaml"
    job.write_text(yaml.safe_dump({"image": "busybox", "command": command}))
    refused(cli("export", str(job), "--to", "pytorchjob", "--nnodes", "2"), "command.0", "empty")


@pytest.mark.parametrize("word", ["", " "])
def test_an_empty_command_word_after_dashes_is_refused(tmp_path, word):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "n1", "host": "n1.invalid"}]}))
    refused(cli("launch", "ddp-smoke", "--nodes", str(inv), "--dry-run", "--", word, "x"), "empty")


def test_an_empty_later_argument_is_still_an_argument(tmp_path):
    job = tmp_path / "j.yaml"
    job.write_text(yaml.safe_dump({"image": "busybox", "command": ["echo", ""]}))
    assert cli("export", str(job), "--to", "pytorchjob", "--nnodes", "2").exit_code == 0


def test_a_lock_whose_directory_cannot_be_made_is_a_message_not_a_traceback(tmp_path):
    """A HOME whose ``.cache`` cannot be made (another user's, or a file where the directory
    would go: the latter even as root) ends a push or a build with a message naming the
    directory and the variables that move it (seen as two users sharing a head: issue 41)."""
    from clusterctl.core.errors import UserError
    from clusterctl.core.files import one_at_a_time

    (tmp_path / ".cache").write_text("a file, not a directory\n")
    lock = tmp_path / ".cache" / "clusterctl" / "push" / "node1.lock"
    with pytest.raises(UserError) as got, one_at_a_time(lock, print, "push"):
        pytest.fail("the block ran without its lock")
    said = got.value.message
    assert f"cannot make the directory {lock.parent}" in said and "one push run at a time" in said, said
    assert "CLUSTERCTL_CACHE" in said and "nothing was started" in said, said
    assert not (tmp_path / ".cache").is_dir()
