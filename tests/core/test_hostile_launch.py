"""Hostile launch and export input that the first audit of issue 41 item 6 missed, class by
class, each checked through the real CLI at the guard that now refuses it (exit 2, no
traceback, the hostile bytes never printed raw, nothing started or written):

(b) a job's name (its file's name) holding a line break or an escape: it reached a Slurm
    script's header as a shell line and an exported manifest as a YAML document
    (:data:`clusterctl.run.jobs.JOB_NAME_RE`); export's --runtime and --rdma-resource;
(d) a 300-character variable name echoed whole (:data:`clusterctl.core.secretnames.ENV_NAME`);
(e) numbers past what the target takes: processes per node (1 to 1024, as slots and export),
    Slurm --nnodes and --time, digits that are not ASCII ('²' made int() raise, '３' passed
    and reached docker as it was: :func:`clusterctl.core.text.digits`);
(f) a mount whose path holds ',' (pyxis separates mounts with it) or a line break
    (:func:`clusterctl.run.jobs.mount_problem`); an inventory host or user a shell would read
    as more than a word;
(g) plans that differed from the launch: Slurm ignored the job's ``nnodes`` (and export took
    any --nnodes), an SSH --dry-run did not say the image goes through the inventory's
    registry, ``--resume --dry-run`` resumed;
(h) an empty program once placeholders are filled (:meth:`clusterctl.run.jobs.Job.check_filled_command`).
"""

from __future__ import annotations

import pytest
import yaml

from tests.fixtures.hostile import cli, refused


@pytest.fixture
def where(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump({"nodes": [
        {"name": f"n{i}", "host": "127.0.0.1", "port": i} for i in (1, 2, 3)]
        + [{"name": "s1", "host": "127.0.0.1", "port": 4, "spare": True}]}))
    return tmp_path


def job(where, name: str, **keys) -> str:
    path = where / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"image": "busybox", "command": ["sh", "-c", "true"], **keys}))
    return str(path)


LAUNCHES = {
    "ssh": ["launch", "{job}", "--nodes", "inv.yaml", "--dry-run"],
    "slurm": ["launch", "{job}", "--nodes", "inv.yaml", "--dry-run", "--scheduler", "slurm"],
    "pytorchjob": ["export", "{job}", "--to", "pytorchjob", "--nnodes", "2", "-o", "out.yaml"],
    "trainjob": ["export", "{job}", "--to", "trainjob", "--nnodes", "2", "-o", "out.yaml"],
}


def each_way(path: str, *extra: str):
    for way, args in LAUNCHES.items():
        yield way, cli(*[a.replace("{job}", path) for a in args], *extra)


# --------------------------------------------------------------------------- (b) job names

@pytest.mark.parametrize("name", ["x\ntouch PWNED\n#", "e\x1b[31mx", "y\n---\n{kind: ConfigMap}\n#",
                                  "my job", "a" * 129, "-dash", "c\x9bd"])
def test_a_job_name_that_would_break_a_line_or_a_word_is_refused(where, name):
    path = job(where, name)
    for way, res in each_way(path):
        out = refused(res, "cannot be used in labels, records and scripts", "e.g. train-bert.yaml")
        assert "PWNED\n" not in out and "\n---\n" not in out, (way, out)
    assert not (where / "out.yaml").exists() and not (where / "runs").exists()


def test_a_usual_job_name_is_taken(where):
    path = job(where, "train-bert_2.v1")
    for way, res in each_way(path):
        assert res.exit_code == 0, (way, res.output)


@pytest.mark.parametrize("args,said", [
    (["--runtime", "a\x1bX"], "--runtime 'a\\x1bX': not a ClusterTrainingRuntime name"),
    (["--runtime", "r" * 300], "... (300 characters)"),
    (["--rdma-resource", "bad\x9b;$(id)"], "not a Kubernetes resource name"),
    (["--rdma-resource", "a/b/c d"], "not a Kubernetes resource name"),
])
def test_export_names_the_cluster_must_take_are_checked(where, args, said):
    refused(cli("export", "ddp-smoke", "--to", "trainjob", "--nnodes", "2", *args, "-o", "out.yaml"), said)
    assert not (where / "out.yaml").exists()


def test_a_usual_rdma_resource_is_taken(where):
    res = cli("export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", "--rdma-resource",
              "nvidia.com/hostdev", "-o", "out.yaml")
    assert res.exit_code == 0, res.output


# --------------------------------------------------------------------------- (d) unbounded

def test_a_long_variable_name_is_cut_in_the_refusal(where):
    out = refused(cli("launch", "ddp-smoke", "--nodes", "inv.yaml", "--dry-run", "--set",
                      "A" * 300 + "=1"), "is not a valid variable name", "(300 characters)")
    assert "A" * 200 not in out


# --------------------------------------------------------------------------- (e) numbers

@pytest.mark.parametrize("given,said", [
    (["--set", "NPROC_PER_NODE=99999999999"], "from 1 to 1024"),
    (["--set", "NPROC_PER_NODE=\u00b2"], "from 1 to 1024"),
    (["--set", "NPROC_PER_NODE=\uff13"], "from 1 to 1024"),
    (["--nproc-per-node", "1025"], "--nproc-per-node (job key nproc_per_node): 1025 processes"),
    (["--set", "MASTER_PORT=\u00b2"], "is not a port"),
    (["--set", "MASTER_PORT=\uff12\uff19\uff15\uff10\uff11"], "is not a port"),
    (["--set", "MASTER_PORT= 29501 "], "is not a port"),
])
def test_numbers_past_what_the_node_takes_or_not_in_ascii_digits(where, given, said):
    for way in ("ssh", "slurm"):
        args = [a.replace("{job}", "ddp-smoke") for a in LAUNCHES[way]]
        refused(cli(*args, *given), said)


@pytest.mark.parametrize("args,said", [
    (["--nnodes", "100001"], "from 1 to 100,000"),
    (["--nnodes", "2", "--time", "99999999999999"], "is not a Slurm time limit"),
    (["--nnodes", "2", "--time", "1-99:99:99"], "hours under 24 after days"),
    (["--nnodes", "2", "--partition", "p" * 300], "(300 characters)"),
])
def test_slurm_numbers_past_what_sbatch_takes(where, args, said):
    refused(cli("launch", "ddp-smoke", "--scheduler", "slurm", "--dry-run", *args), said)


# --------------------------------------------------------------------------- (f) shell words

@pytest.mark.parametrize("value,said", [("/data,/etc", "holds a ','"), ("/data\nX", "line break")])
def test_a_mount_path_that_would_split_the_mount_list_or_a_line(where, value, said):
    for way, res in each_way("bert", "--set", f"BERT_DIR={value}", "--image", "r.example/x:1"):
        if way == "slurm":
            res = cli(*[a.replace("{job}", "bert") for a in LAUNCHES[way]], "--container", "pyxis",
                      "--set", f"BERT_DIR={value}", "--image", "r.example/x:1")
        out = refused(res, said, "mounts.0")
        assert "/etc:/workspace" not in out.replace("/data,/etc:/workspace", ""), (way, out)


@pytest.mark.parametrize("node,said", [
    ({"host": "h1;id"}, "is not a host name or address"),
    ({"host": "$(id)"}, "is not a host name or address"),
    ({"host": "a`b`"}, "is not a host name or address"),
    ({"host": "10.0.0.1", "user": "$(id)"}, "is not a login name"),
    ({"host": "10.0.0.1", "user": "a;b"}, "is not a login name"),
    ({"host": "10.0.0.1", "devices": ["/dev/x,/etc"]}, "is not an absolute device path"),
    ({"host": "10.0.0.1", "name": "n" * 254}, "is not a usable node name"),
])
def test_inventory_values_a_shell_or_docker_would_split_are_refused(where, node, said):
    (where / "bad.yaml").write_text(yaml.safe_dump({"nodes": [node]}))
    refused(cli("launch", "ddp-smoke", "--nodes", "bad.yaml", "--dry-run"), "bad.yaml", said)


@pytest.mark.parametrize("node", [{"host": "fe80::1%eth0"}, {"host": "node-1.example.com", "user": "DOMAIN\\bob"},
                                  {"host": "10.0.0.1", "user": "bob@REALM"}, {"host": "10.0.0.1", "user": "host$"},
                                  {"host": "10.0.0.1", "devices": ["/dev/infiniband/uverbs0:/dev/x:rw"]}])
def test_usual_inventory_values_are_taken(where, node):
    (where / "ok.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", **node}]}))
    res = cli("launch", "ddp-smoke", "--nodes", "ok.yaml", "--dry-run")
    assert res.exit_code == 0, res.output


# --------------------------------------------------------------------------- (g) plan = launch

def test_slurm_and_export_take_the_jobs_nnodes_as_the_ssh_launch_does(where):
    path = job(where, "two", nnodes=2)
    ssh = cli("launch", path, "--nodes", "inv.yaml", "--dry-run")
    assert ssh.exit_code == 0 and "# n3 " not in ssh.output and "# n2 " in ssh.output, ssh.output
    slurm = cli("launch", path, "--nodes", "inv.yaml", "--dry-run", "--scheduler", "slurm")
    assert slurm.exit_code == 0, slurm.output
    assert "#SBATCH --nodes=2\n" in slurm.output and "#SBATCH --nodelist=n1,n2\n" in slurm.output
    assert "n3 (past the job's nnodes in inv.yaml)" in slurm.output
    assert "s1 (spare: true in inv.yaml)" in slurm.output
    for args in (["launch", path, "--nnodes", "3", "--dry-run", "--scheduler", "slurm"],
                 ["export", path, "--to", "pytorchjob", "--nnodes", "3", "-o", "out.yaml"]):
        refused(cli(*args), "--nnodes 3:", "the job runs on nnodes 2; valid: --nnodes 2")
    ranged = job(where, "ranged", nnodes="1:2")
    assert cli("export", ranged, "--to", "pytorchjob", "--nnodes", "1", "-o", "out.yaml").exit_code == 0
    refused(cli("export", ranged, "--to", "pytorchjob", "--nnodes", "3", "-o", "out.yaml"),
            "valid: --nnodes from 1 to 2")


def test_an_ssh_dry_run_says_the_image_goes_through_the_inventorys_registry(where):
    (where / "reg.yaml").write_text(yaml.safe_dump({"registry": "127.0.0.1:5999", "nodes": [
        {"name": "n1", "host": "127.0.0.1", "port": 1}]}))
    res = cli("launch", "ddp-smoke", "--nodes", "reg.yaml", "--dry-run")
    assert res.exit_code == 0, res.output
    assert res.output.startswith("# image: clusterctl/cpu:") and "is pushed to 127.0.0.1:5999 at launch" \
        in res.output and "127.0.0.1:5999/cpu@sha256:...)" in res.output, res.output[:400]


def test_resume_with_dry_run_is_refused_before_anything_is_read(where):
    refused(cli("launch", "--resume", "ddp-smoke-1", "--dry-run"), "no plan to show", "Nothing was done")


# --------------------------------------------------------------------------- (h) empty program

@pytest.mark.parametrize("sets", [["--set", "CMD="], ["--set", "CMD= "]])
def test_an_empty_program_once_placeholders_are_filled_is_refused(where, sets):
    path = job(where, "ph", params={"CMD": "echo"}, command=["{CMD}", "hi"])
    for way, res in each_way(path, *sets):
        assert "command.0" in refused(res, "is empty once its placeholders are filled"), way
    assert not (where / "out.yaml").exists()
    empty_param = job(where, "ph2", params={"CMD": ""}, command=["{CMD}", "hi"])
    for way, res in each_way(empty_param):
        assert "command.0" in refused(res, "is empty once its placeholders are filled"), way


# --------------------------------------------------------------------------- more of (b)-(e)

@pytest.mark.parametrize("value,secret", [
    ("https://alice:p@ssS3CR3T@pypi.example/simple", "ssS3CR3T"),     # '@' in the password
    ("alice:p@ssS3CR3T@reg.example:5000", "ssS3CR3T"),
    ("git+https://tok@en@github.com/x.git", "en@"),
])
def test_a_password_holding_an_at_sign_is_masked_whole(value, secret):
    from clusterctl.core.text import shown, without_credentials
    assert secret not in without_credentials(value) and secret not in shown(value)
    assert without_credentials(value).endswith(value.rsplit("@", 1)[1])


@pytest.mark.parametrize("char", ["\u202e", "\u2066", "\u200b", "\ufeff", "\u200f"])
def test_characters_that_reorder_or_hide_text_are_refused_and_escaped(where, char):
    from clusterctl.core.text import control_problem, escaped
    assert control_problem(f"a{char}b") and char not in escaped(f"a{char}b")
    (where / "bidi.yaml").write_text(yaml.safe_dump({"nodes": [{"name": f"n{char}1", "host": "10.0.0.1"}]}))
    out = refused(cli("launch", "ddp-smoke", "--nodes", "bidi.yaml", "--dry-run"), "bidi.yaml")
    assert char not in out


def test_an_empty_run_id_is_refused_not_replaced(where):
    refused(cli("launch", "ddp-smoke", "--nodes", "inv.yaml", "--dry-run", "--run-id", ""),
            "--run-id '' is not valid")


@pytest.mark.parametrize("args,said", [
    (["--hang-timeout", "99999999999h"], "is more than 3650 days"),
    (["--fail-grace", "99999999999999999999"], "--fail-grace"),
])
def test_durations_past_any_use_are_refused(where, args, said):
    refused(cli("launch", "ddp-smoke", "--nodes", "inv.yaml", "--dry-run", *args), said)


@pytest.mark.parametrize("ssh,said", [({"connect_timeout": float("inf")}, "connect_timeout"),
                                      ({"connect_timeout": 1e9}, "connect_timeout"),
                                      ({"fanout": 10**20}, "fanout")])
def test_inventory_ssh_numbers_past_any_use_are_refused(where, ssh, said):
    (where / "ssh.yaml").write_text(yaml.safe_dump({"ssh": ssh, "nodes": [{"name": "n1", "host": "10.0.0.1"}]}))
    refused(cli("launch", "ddp-smoke", "--nodes", "ssh.yaml", "--dry-run"), "ssh.yaml", said)


def test_an_export_output_path_is_quoted_safely(where):
    out = refused(cli("export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", "-o",
                      "/nonexistent\x1b[2J/" + "d" * 300 + "/x.yaml"), "does not exist")
    assert "d" * 200 not in out


@pytest.mark.parametrize("target", ["/dev/null", "fifo"])
def test_export_never_replaces_a_device_or_a_pipe_with_its_file(where, target):
    """-o writes through a temporary file renamed over the target: over /dev/null (as root) that
    made /dev/null a regular file, and every later `>/dev/null` wrote into it."""
    import os
    import stat
    path = target if target.startswith("/") else str(where / target)
    if target == "fifo":
        os.mkfifo(path)
    before = os.lstat(path)
    refused(cli("export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", "-o", path),
            "is not a regular file")
    after = os.lstat(path)
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (before.st_ino, stat.S_IFMT(before.st_mode))


def test_check_takes_its_image_through_the_one_guard(where):
    out = refused(cli("check", "--nodes", "inv.yaml", "--image", "u:s3cr3tPW@r.example/x:1"),
                  "is not a valid image reference")
    assert "s3cr3tPW" not in out


def test_the_build_dry_run_shows_values_as_typed_not_as_markup(where):
    res = cli("build", "--target", "cpu", "--dry-run", "--build-arg", "HTTP_PROXY=http://[bold]p[/bold]:3128")
    assert res.exit_code == 0, res.output
    assert "[bold]p[/bold]" in res.output


@pytest.mark.parametrize("pattern,refused_", [("(a*)*b", True), ("(a+)+", True), ("(x|y+)*", True),
                                              ("(?:\\d+,)*\\d+", True), ("(?>\\d+,)*\\d+", False),
                                              ("(?:\\d++,)*\\d+", False), ("^step [0-9]+/", False),
                                              ("(ab)+c", False), ("Epoch \\d+", False)])
def test_a_start_line_that_backtracks_exponentially_is_refused(where, pattern, refused_):
    """Every output line is matched against hang_start_line: '(a*)*b' took 0.8 s on 24 a's,
    doubling with each one more."""
    res = cli("launch", "ddp-smoke", "--nodes", "inv.yaml", "--dry-run", "--hang-timeout", "5m",
              "--hang-start-line", pattern)
    if refused_:
        refused(res, "repeats a group that repeats inside", "(?>")
    else:
        assert res.exit_code == 0, res.output


@pytest.mark.parametrize("value", ["https://u:s3cr3tPW@pypi.example/simple", "https://s3cr3tPWtoken@h.example/x",
                                   "u:s3cr3tPW@reg.example:5000/x"])
def test_a_url_holding_a_credential_is_a_secret_whatever_its_name(where, value):
    """PIP_INDEX_URL=https://user:pw@host is a secret though its name says nothing: it goes
    through the env file (never docker's argv), is masked in the plan and the manifest is
    given a secretKeyRef, as a variable named like a secret is."""
    import json
    for args in (["launch", "ddp-smoke", "--nodes", "inv.yaml", "--dry-run"],
                 ["launch", "ddp-smoke", "--nodes", "inv.yaml", "--dry-run", "--json"],
                 ["launch", "ddp-smoke", "--nnodes", "2", "--dry-run", "--scheduler", "slurm"],
                 ["export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2"],
                 ["export", "ddp-smoke", "--to", "trainjob", "--nnodes", "2"]):
        res = cli(*args, "--set", f"PIP_INDEX_URL={value}")
        assert res.exit_code == 0, (args, res.output)
        assert "s3cr3tPW" not in res.output, (args, res.output)
        if "--json" in args:
            plans = json.loads(res.stdout)
            assert all("PIP_INDEX_URL" in p["secrets"] for p in plans), plans[0]["secrets"]
        elif args[0] == "export":
            assert "key: PIP_INDEX_URL" in res.stdout
    from clusterctl.run import request
    spec = request.spec_of(None, {"env": {"PIP_INDEX_URL": value, "LR": "1"}, "command": ["true"]})
    assert spec["secret_env"] == ["PIP_INDEX_URL"] and "s3cr3tPW" not in json.dumps(spec)


def test_a_slurm_launch_checks_the_image_before_it_builds_a_code_layer_on_it(where):
    (where / "wd").mkdir()
    (where / "wd" / "t.py").write_text("print(1)\n")
    out = refused(cli("launch", "--scheduler", "slurm", "--nnodes", "2", "--dry-run", "--image",
                      "u:s3cr3tPW@r.example/x:1", "--workdir", "wd", "--", "python", "t.py"),
                  "is not a valid image reference")
    assert "s3cr3tPW" not in out
