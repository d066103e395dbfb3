"""Names, keys and secrets under hostile input, through the CLI (typer's CliRunner).

* Names and keys: a key or id that ends in a newline (``$`` in a pattern accepted it), and
  NUL or other control characters in any field, are refused when the input is validated:
  exit 2, the file, line and field named, the character shown as an escape (``\\x1b``),
  never echoed raw to the terminal, nothing planned.
* Secrets: a secret value appears nowhere: not in messages about the value or its key, not in
  the ``--json`` plan through a parameter copied into a variable of another name, not on
  docker run's command line, not in a Kubernetes manifest.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app

CONTROL = "\x00\x01\x07\x08\x0b\x0c\x0d\x1b\x7f\x85\x9b"  # every kind: NUL, BEL, ESC, DEL, C1 controls
SECRET = "s3cr3t-hf-value"


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def refused(result, *words: str) -> str:
    out = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "docker run -d" not in result.output  # nothing planned
    assert not any(c in result.output for c in CONTROL), repr(result.output)  # shown as escapes only
    for w in words:
        assert w in out, result.output
    return out


@pytest.fixture
def inv(tmp_path):
    return write(tmp_path, "inv.yaml", "nodes: [{name: a, host: 10.0.0.11}, {name: b, host: 10.0.0.12}]\n")


@pytest.fixture
def job(tmp_path):
    return write(tmp_path, "job.yaml", "image: x/y:1\ncommand: [run]\n")


# --------------------------------------------------------------------------- a trailing newline

def test_keys_and_ids_ending_in_a_newline_are_refused(tmp_path, inv, job):
    bad_inv = write(tmp_path, "nl.yaml", 'nodes:\n  - host: 10.0.0.11\n    env: {"OK\\n": x}\n')
    refused(cli("nodes", "--nodes", str(bad_inv)), f"{bad_inv}:3: nodes[0].env", "not an environment variable name")
    bad_job = write(tmp_path, "nl-job.yaml", 'image: x/y:1\ncommand: [run]\nenv: {"A\\n": x}\n')
    refused(cli("launch", str(bad_job), "--nodes", str(inv), "--dry-run"), f"{bad_job}:3: env.A\\n",
            "not a valid variable name")
    refused(cli("launch", str(job), "--nodes", str(inv), "--dry-run", "--set", "PHASE\n=2"),
            "is not a valid variable name")
    refused(cli("launch", str(job), "--nodes", str(inv), "--dry-run", "--run-id", "r1\n"), "--run-id", "is not valid")
    refused(cli("build", "--target", "accl", "--dry-run", "--build-arg", "ACCL_INSTALLER_URL\n=x"), "--build-arg")


# --------------------------------------------------------------------------- control characters

INVENTORY_FIELDS = [  # (field, YAML text of one node, the field's spelling in the message)
    ("host", '{host: "10.0.0.11\\0"}', "nodes[0].host"),
    ("host with an escape sequence", '{host: "10.0.0.11\\e[2J"}', "nodes[0].host"),
    ("name", '{name: "a\\x07", host: 10.0.0.11}', "nodes[0].name"),
    ("user", '{host: 10.0.0.11, user: "root\\e]0;x\\a"}', "nodes[0].user"),
    ("identity_file", '{host: 10.0.0.11, identity_file: "key\\0"}', "nodes[0].identity_file"),
    ("device", '{host: 10.0.0.11, devices: ["/dev/x\\x7f"]}', "nodes[0].devices[0]"),
    ("label key", '{host: 10.0.0.11, labels: {"r\\x1b": a}}', "nodes[0].labels"),
    ("label value", '{host: 10.0.0.11, labels: {rack: "a\\r"}}', "nodes[0].labels.rack"),
    ("env value", '{host: 10.0.0.11, env: {MODE: "a\\0b"}}', "nodes[0].env.MODE"),
]


@pytest.mark.parametrize("field, node, spelled", INVENTORY_FIELDS, ids=[f[0] for f in INVENTORY_FIELDS])
def test_a_control_character_in_an_inventory_field_is_refused_naming_it(tmp_path, field, node, spelled):
    path = write(tmp_path, "inv.yaml", f"nodes:\n  - {node}\n")
    out = refused(cli("nodes", "--nodes", str(path)), f"{path}:2: {spelled}")
    assert "\\x" in out or "\\r" in out, out  # the character, as an escape


def test_a_control_character_in_a_hostfile_is_refused_naming_the_line(tmp_path):
    path = write(tmp_path, "hosts", "node1 slots=2\nnode2\x1b[31m slots=2\n")
    refused(cli("nodes", "--nodes", str(path)), f"{path}:2: host", "\\x1b", "control character")


JOB_FIELDS = [  # (field, job YAML, the field in the message)
    ("image", 'image: "x/y:1\\e"\ncommand: [run]\n', ":1: image"),
    ("description", 'description: "a\\nb"\nimage: x/y:1\ncommand: [run]\n', ":1: description"),
    ("command item", 'image: x/y:1\ncommand: [run, "a\\0b"]\n', ":2: command.1"),
    ("docker_args item", 'image: x/y:1\ncommand: [run]\ndocker_args: ["--cap-add=X\\e"]\n', ":3: docker_args.0"),
    ("mount", 'image: x/y:1\ncommand: [run]\nmounts: ["/a\\x01:/b"]\n', ":3: mounts.0"),
    ("env value", 'image: x/y:1\ncommand: [run]\nenv: {MODE: "a\\x1b"}\n', ":3: env.MODE"),
    ("params value", 'image: x/y:1\ncommand: [run]\nparams: {DIR: "/d\\0"}\n', ":3: params.DIR"),
]


@pytest.mark.parametrize("field, text, where", JOB_FIELDS, ids=[f[0] for f in JOB_FIELDS])
def test_a_control_character_in_a_job_field_is_refused_naming_it(tmp_path, inv, field, text, where):
    path = write(tmp_path, "job.yaml", text)
    out = refused(cli("launch", str(path), "--nodes", str(inv), "--dry-run"), f"{path}{where}", "contains a")
    assert "(nothing was started)" in out


def test_tab_and_line_feed_stay_allowed_in_free_text(tmp_path, inv):
    path = write(tmp_path, "job.yaml", 'image: x/y:1\ncommand: [python, -c, "a = 1\\nprint(a)\\t# ok"]\n'
                                       'env: {NOTE: "line one\\nline two"}\n')
    result = cli("launch", str(path), "--nodes", str(inv), "--dry-run", "--json", "--set", "X=a\tb")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)[0]
    assert plan["argv"][-1] == "a = 1\nprint(a)\t# ok" and plan["env"]["X"] == "a\tb"


def test_a_control_character_in_a_set_value_or_image_option_is_refused(inv, job):
    out = refused(cli("launch", str(job), "--nodes", str(inv), "--dry-run", "--set", "MODE=a\x1b[2Jb"),
                  "--set MODE=...", "contains a control character (\\x1b)")
    assert "a\\x1b[2Jb" not in out  # the value itself is not shown (it may be a secret)
    refused(cli("launch", str(job), "--nodes", str(inv), "--dry-run", "--image", "x/y:1\x07"),
            "--image 'x/y:1\\x07' is not a valid image reference", "control character (\\x07)")


# --------------------------------------------------------------------------- secrets

def test_no_secret_in_messages_about_the_value_or_its_key(tmp_path, inv, job):
    cases = [
        cli("launch", str(job), "--nodes", str(inv), "--dry-run", "--set", f"HF_TOKEN\n={SECRET}"),
        cli("launch", str(job), "--nodes", str(inv), "--dry-run", "--set", f"HF-TOKEN={SECRET}"),
        cli("launch", str(job), "--nodes", str(inv), "--dry-run", "--set", SECRET),  # the name forgotten
        cli("launch", str(job), "--nodes", str(inv), "--dry-run", "--set", f"HF_TOKEN={SECRET}\x00"),
        cli("launch", str(write(tmp_path, "braces.yaml", f'image: x/y:1\ncommand: [run]\nenv: {{HF_TOKEN: "{SECRET}{{x"}}\n')),
            "--nodes", str(inv), "--dry-run"),
        cli("launch", str(write(tmp_path, "typed.yaml", f'image: x/y:1\ncommand: [run]\nenv: {{HF_TOKEN: [{SECRET}]}}\n')),
            "--nodes", str(inv), "--dry-run"),
        cli("launch", str(write(tmp_path, "nul.yaml", f'image: x/y:1\ncommand: [run]\nenv: {{HF_TOKEN: "{SECRET}\\0"}}\n')),
            "--nodes", str(inv), "--dry-run"),
        cli("nodes", "--nodes", str(write(tmp_path, "inv-nul.yaml",
                                          f'nodes: [{{host: 10.0.0.1, env: {{API_KEY: "{SECRET}\\0"}}}}]\n'))),
    ]
    for result in cases:
        assert result.exit_code == 2, result.output
        assert SECRET not in result.output and "s3cr3t" not in result.output, result.output
        assert "Traceback" not in result.output


COPY_JOB = f"""
    image: x/y:1
    command: [run]
    params: {{HF_TOKEN: default-{SECRET}}}
    env:
      HF_TOKEN: "{{HF_TOKEN}}"
      HUB_AUTH: "Bearer {{HF_TOKEN}}"
      PLAIN: visible
"""


@pytest.mark.parametrize("given", [None, f"given-{SECRET}"], ids=["param default", "param from --set"])
def test_a_secret_parameter_copied_into_another_variable_is_secret_there_too(tmp_path, inv, given):
    job = write(tmp_path, "copy.yaml", COPY_JOB)
    sets = ["--set", f"HF_TOKEN={given}"] if given else []
    result = cli("launch", str(job), "--nodes", str(inv), "--dry-run", "--json", *sets)
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output, result.output  # not in env, argv or anywhere in the plan
    for node in json.loads(result.output):
        assert node["env"]["HUB_AUTH"] == "****" and node["env"]["HF_TOKEN"] == "****"
        assert node["env"]["PLAIN"] == "visible"
        assert {"HUB_AUTH", "HF_TOKEN"} <= set(node["secrets"])
        assert "--env-file" in node["argv"] and not any("HUB_AUTH" in a for a in node["argv"])
    text = cli("launch", str(job), "--nodes", str(inv), "--dry-run", *sets).output
    assert SECRET not in text and "HUB_AUTH=****" in text


def test_the_real_plan_carries_the_copy_on_stdin_only(tmp_path, inv):
    from clusterctl.cluster.inventory import load_inventory
    from clusterctl.run.jobs import load_job
    from clusterctl.run.plan import make_plan
    job = load_job(write(tmp_path, "copy.yaml", COPY_JOB))
    for plan in make_plan(job, load_inventory(inv), run_id="r", overrides={"HF_TOKEN": SECRET}):
        assert not any(SECRET in a for a in plan.argv)
        assert f"HUB_AUTH=Bearer {SECRET}\n" in plan.stdin.decode()


def test_a_secret_parameter_on_the_command_line_is_refused_without_its_value(tmp_path, inv):
    job = write(tmp_path, "cmd.yaml", f"""
        image: x/y:1
        params: {{HF_TOKEN: {SECRET}}}
        command: [train, --token, "{{HF_TOKEN}}"]
    """)
    out = refused(cli("launch", str(job), "--nodes", str(inv), "--dry-run"), f"{job}:3: command.2",
                  "{HF_TOKEN} is a secret parameter", "pass it through env")
    assert SECRET not in out


def test_a_kubernetes_manifest_never_carries_the_copy(tmp_path):
    job = write(tmp_path, "copy.yaml", COPY_JOB.replace("      HF_TOKEN: \"{HF_TOKEN}\"\n", ""))
    result = cli("export", str(job), "--to", "pytorchjob", "--nnodes", "2", "--image", "r/x:1",
                 "--set", f"HF_TOKEN=given-{SECRET}")
    # the copy becomes a reference to the Secret (exit 0), the value is nowhere in what is
    # printed (manifest and the stderr note), and the note says how to create the Secret
    assert result.exit_code == 0 and SECRET not in result.output, result.output
    manifest = yaml.safe_load(result.stdout)
    env = {e["name"]: e for e in manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["HUB_AUTH"] == {"name": "HUB_AUTH",
                               "valueFrom": {"secretKeyRef": {"name": "copy-secrets", "key": "HUB_AUTH"}}}
    assert env["PLAIN"] == {"name": "PLAIN", "value": "visible"}
    assert "kubectl create secret generic copy-secrets --from-literal=HUB_AUTH=..." in result.stderr
