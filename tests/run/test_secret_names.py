"""Which variables are secret, and which values masking may rewrite (issue 41): a name is
secret by its words, never by a substring (TOKENIZERS_PARALLELISM, PAD_TOKEN_ID are
settings); a secret whose value is short or common (a boolean, a number, a port, an
address) is never a mask pattern, so it cannot rewrite every ``0`` or ``false`` of the
output, taint MASTER_ADDR / MASTER_PORT or make ``--rerun`` refuse; a secret given with
``--env`` (by its name or listed under ``secrets:``) is never written to run.json."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from clusterctl.cluster import containers
from clusterctl.cluster.inventory import load_inventory
from clusterctl.core.errors import UserError
from clusterctl.run import logs, request
from clusterctl.run.jobs import is_secret_name, load_job
from clusterctl.run.launch import new_record
from clusterctl.run.logs import LogSink
from clusterctl.run.plan import (
    MASK,
    make_plan,
    maskable,
    masked,
    render_dry_run,
    secret_values,
    unmasked_secrets,
)
from clusterctl.run.records import RunRecord
from clusterctl.run.spool import Spool

SECRET_BY_NAME = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY",
                  "AWS_SESSION_TOKEN", "GITHUB_TOKEN", "DB_PASSWORD", "OPENAI_API_KEY",
                  "CLIENT_SECRET", "SMTP_PASSWD", "MY_APIKEY", "TOKEN", "ssh_key", "my_secret_x"]
NOT_SECRET_BY_NAME = ["TOKENIZERS_PARALLELISM", "PAD_TOKEN_ID", "EOS_TOKEN_ID", "BOS_TOKEN_ID",
                      "MAX_TOKENS", "MAX_NEW_TOKENS", "KEY_COLUMN", "NUM_KEYS", "MONKEY",
                      "HF_TOKEN_PATH", "KEYBOARD", "PHASE"]


@pytest.mark.parametrize("name", SECRET_BY_NAME)
def test_a_name_whose_words_say_secret_is_secret(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRET_BY_NAME)
def test_a_setting_that_only_contains_a_marker_is_not_secret(name):
    assert not is_secret_name(name)
    assert is_secret_name(name, [name])          # listed under secrets: it is


@pytest.mark.parametrize("value", ["0", "1", "false", "True", "yes", "off", "abc", "1234567",
                                   "29500", "123456789", "3.14159265", "1e-05", "10.0.0.12",
                                   "192.168.100.200", "fe80::1:2:3:4", "  0  "])
def test_short_or_common_values_are_never_mask_patterns(value):
    assert not maskable(value)


@pytest.mark.parametrize("value", ["hf_abcdefgh", "s3cr3t-pw", "Bearer xyz123", "12345678a"])
def test_secret_looking_values_are_mask_patterns(value):
    assert maskable(value)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def hf_plans(tmp_path):
    """A Hugging Face style job: settings named like tokens, one real token, and a listed
    secret whose value is too short to mask."""
    job = load_job(write(tmp_path, "job.yaml", """
        image: x/y:1
        nproc_per_node: 1
        secrets: [PIN]
        env: {TOKENIZERS_PARALLELISM: "false", PAD_TOKEN_ID: "0", PIN: "1234", HF_TOKEN: hf_real_token_value}
        command: [python, train.py, --epochs, "10", --flag=false]
    """))
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        nodes:
          - {name: n1, host: 10.0.0.1}
          - {name: n2, host: 10.0.0.2}
    """))
    return job, inv, make_plan(job, inv, run_id="r", master_addr="10.0.0.1")


def test_settings_named_like_tokens_are_not_secret_and_taint_nothing(hf_plans):
    _, _, plans = hf_plans
    for p in plans:
        assert p.secrets == {"HF_TOKEN", "PIN"}
        assert "MASTER_ADDR" not in p.secrets and "MASTER_PORT" not in p.secrets
        m = masked(p)
        assert m.env["TOKENIZERS_PARALLELISM"] == "false" and m.env["PAD_TOKEN_ID"] == "0"
        assert m.env["MASTER_ADDR"] == "10.0.0.1" and m.env["MASTER_PORT"] == p.env["MASTER_PORT"]
        assert m.env["HF_TOKEN"] == MASK and m.env["PIN"] == MASK     # by name, whatever the value
        assert m.command == p.command and m.argv == p.argv            # no `0`/`false` rewritten
        assert "PIN=1234" in p.stdin.decode() and not any("1234" in a for a in p.argv)
    assert secret_values(plans) == ["hf_real_token_value"]
    text = render_dry_run(plans)
    assert "TOKENIZERS_PARALLELISM=false" in text and "--epochs 10" in text
    assert "hf_real_token_value" not in text and "1234" not in text


def test_a_secret_too_short_to_mask_is_named_never_shown(hf_plans):
    _, _, plans = hf_plans
    assert unmasked_secrets(plans) == ["PIN"]


def test_log_lines_keep_their_zeros(tmp_path, hf_plans):
    _, _, plans = hf_plans
    sink = LogSink({"n1": 0}, run_dir=tmp_path / "run", redact=secret_values(plans) + ["0", "false"])
    sink.write("n1", "step 10 loss 0.50 shuffle=false token hf_real_token_value")
    sink.close()
    assert sink.last["n1"][-1] == f"step 10 loss 0.50 shuffle=false token {MASK}"
    assert (tmp_path / "run" / "n1.log").read_text().strip() == sink.last["n1"][-1]


def test_the_record_keeps_settings_and_master_and_masks_secrets_by_name(hf_plans):
    job, inv, plans = hf_plans
    argv = ["clusterctl", "launch", "job.yaml", "--set", "PAD_TOKEN_ID=0", "--set", "PIN=1234",
            "--set=HF_TOKEN=hf_real_token_value", "--env", "TOKENIZERS_PARALLELISM=false"]
    record = new_record(job, inv, plans, "r", image_id=None, detached=False, argv=argv)
    dumped = repr(record)
    assert "hf_real_token_value" not in dumped and "1234" not in dumped
    assert record.argv[4] == "PAD_TOKEN_ID=0" and record.argv[6] == f"PIN={MASK}"
    assert record.argv[7] == f"--set=HF_TOKEN={MASK}" and record.argv[9] == "TOKENIZERS_PARALLELISM=false"
    assert record.master_addr == "10.0.0.1" and record.master_port == int(plans[0].env["MASTER_PORT"])
    assert all(n.env["PAD_TOKEN_ID"] == "0" and n.env["MASTER_PORT"] != MASK for n in record.nodes)
    # --rerun asks again for the secrets only, never for PAD_TOKEN_ID
    with pytest.raises(UserError, match="given PIN with --set") as info:
        request.recorded_sets(record, [])
    assert "PAD_TOKEN_ID" not in info.value.message
    assert request.recorded_sets(record, ["PIN=1", "HF_TOKEN=h"]) == ["PAD_TOKEN_ID=0", "PIN=1", "HF_TOKEN=h"]


def test_a_listed_secret_given_with_env_is_not_recorded(tmp_path):
    job = write(tmp_path, "job.yaml", """
        image: x/y:1
        secrets: [PIN, DB_DSN]
        command: [run]
    """)
    inv = write(tmp_path, "inv.yaml", "nodes:\n  - {name: n1, host: 10.0.0.1}\n")
    given = {"env": {"DB_DSN": "postgres://u:pw@db/x", "PIN": "1234", "HF_TOKEN": "hf_xyz_value",
                     "PAD_TOKEN_ID": "0"}}
    prepared = request.fresh(request.LaunchRequest(job=str(job), nodes=inv, given=given))
    spec = prepared.record_spec
    dumped = json.dumps(spec)
    assert "postgres://" not in dumped and "1234" not in dumped and "hf_xyz_value" not in dumped
    assert spec["flags"]["env"] == {"PAD_TOKEN_ID": "0"}
    assert spec["secret_env"] == ["DB_DSN", "HF_TOKEN", "PIN"]


# --------------------------------------------------------------------------- stop and logs
# Output that no follower masked (a detached run): `stop` saves it and `clusterctl logs`
# shows it with the same masking, the values read from the containers' own environment
# (stop's inspect of them; never shown or stored), the names from the run record.

def test_the_record_says_which_variables_were_masked(hf_plans):
    job, inv, plans = hf_plans
    record = new_record(job, inv, plans, "r", image_id=None, detached=True)
    assert logs.secret_names(record) == {"HF_TOKEN", "PIN"}


def test_stop_reads_the_containers_env_with_their_states_and_never_shows_it():
    """The stop script's inspect section as it sends it: a JSON object line per container
    (name, state, labels), then a JSON string line per secret variable it let through."""
    token, got = "t0k", []
    reader = containers._StopReader("n1", token, lambda key, text: got.append(text))
    head = {"Name": "/r-n1", "State": {"Status": "running"}, "Config": {"Labels": {}}}
    env = ["HF_TOKEN=hf_real_token_value", "PIN=1234", "EQ=a=b"]
    for line in [f"@@{token} before", json.dumps(head), *map(json.dumps, env), "not json {",
                 f"@@{token} logs abc", "2026-01-01T00:00:01.000000000Z token hf_real_token_value",
                 f"@@{token} after", json.dumps({**head, "State": {"Status": "exited"}}),
                 f"@@{token} removed"]:
        reader.line(line)
    result = reader.finish(0)
    assert result.env == {"HF_TOKEN": "hf_real_token_value", "PIN": "1234", "EQ": "a=b"}
    assert result.was_running == ["r-n1"] and [c.status for c in result.containers] == ["exited"]
    assert "hf_real_token_value" not in repr(result)
    assert got == ["token hf_real_token_value"]     # the raw line: masked where it is saved


@pytest.mark.docker
def test_the_stop_script_sends_only_state_labels_and_the_secret_variables(docker_client, base_image):
    """The real stop script (what `clusterctl stop` runs on a node, through tree parents too)
    against a real container: of its environment only the run's secret names leave the node;
    a setting's value, the command and the mounts never do."""
    import os
    import subprocess
    import uuid

    from docker.errors import NotFound

    from clusterctl.cluster import engine

    run_id = f"secret-stop-{uuid.uuid4().hex[:8]}"
    box = docker_client.containers.run(
        base_image, ["sh", "-c", "echo token hf_secret_value_123; exec sleep 300"], detach=True,
        network_mode="none", name=f"{run_id}-node1", labels={containers.RUN_LABEL: run_id},
        environment={"HF_TOKEN": "hf_secret_value_123", "OTHER_SETTING": "not_for_the_head_42"})
    try:
        argv = containers._stop_argv(run_id, "t0k", 1, secret_names={"HF_TOKEN", "bad name|.*"})
        assert argv[-1] == "HF_TOKEN"       # a name that is no identifier never reaches grep
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "DOCKER_HOST": engine.engine_url()})
        assert res.returncode == 0, res.stderr
        for hidden in ("not_for_the_head_42", "OTHER_SETTING", "sleep 300", '"Mounts"', '"Image"'):
            assert hidden not in res.stdout, (hidden, res.stdout)
        reader = containers._StopReader("node1", "t0k", None)
        for line in res.stdout.splitlines():
            reader.line(line)
        result = reader.finish(res.returncode)
        assert result.env == {"HF_TOKEN": "hf_secret_value_123"}
        assert result.was_running == [f"{run_id}-node1"] and result.error is None
        (state,) = result.containers
        assert state.status == "exited" and state.exit_code == 137 and state.name == f"{run_id}-node1"
        assert [text for _, text in result.lines] == ["token hf_secret_value_123"]
    finally:
        try:
            box.remove(force=True)
        except NotFound:
            pass    # the script removed it


def test_output_saved_by_stop_is_masked_as_followed_output(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path))
    record = RunRecord(run_id="r1", job="j", inventory="inv.yaml", image="img", nodes=[
        {"node": "n1", "host": "n1", "rank": 0, "container": "c0",
         "env": {"HF_TOKEN": MASK, "PIN": MASK, "PAD_TOKEN_ID": "0"}}])
    secret = logs.stop_redact(record, {"n1": {"HF_TOKEN": "hf_real_token_value", "PIN": "1234",
                                              "PAD_TOKEN_ID": "0", "PATH": "/bin"}})
    assert secret == ["hf_real_token_value"]          # PIN: too short to mask; PATH: no secret
    with Spool() as spool:
        spool.writer("n1")("2026-01-01T00:00:01.000000000", "loss 0.5 pin 1234 tok hf_real_token_value")
        logs.keep_stopped_output(record, spool, ["n1"], redact=secret)
    want = f"loss 0.5 pin 1234 tok {MASK}"
    assert record.log_path("n1").read_text() == want + "\n"
    assert list(logs.lines_from_files(record)) == [("n1", want)]      # what `clusterctl logs` shows


def test_logs_from_the_nodes_mask_with_the_values_their_containers_hold(capsys):
    sink = LogSink({"n1": 0}, stream=__import__("sys").stdout, color=False)
    sources = [logs.Source("n1", 0, "c0", redact=("hf_real_token_value", "0"))]
    logs.redact_sources(sink, sources)
    sink.write("n1", "step 0 tok hf_real_token_value")
    sink.flush()
    assert capsys.readouterr().out == f"n1[0]| step 0 tok {MASK}\n"
    assert "hf_real_token_value" not in repr(sources)
