"""The recovery rules are one table (clusterctl.run.recovery.RULES): the SSH decision
evaluates it, the sbatch script's requeue block and the export's restart policy are
generated from it, and docs/how-to/restarts.md shows it.

A rule added to the table (here a made-up one, in a table of the test's own) is taken up by
all three with no other change: the real functions, the requeue block run by a real bash.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace

import pytest

from clusterctl.run import recovery
from clusterctl.run.export import recovery_settings
from clusterctl.run.jobs import load_job
from clusterctl.run.recovery import RULES, AttemptEnd, Form, Policy, Rule, decide
from clusterctl.run.slurm.script import recovery_shell
from tests.fixtures import REPO

#: exit 75 (EX_TEMPFAIL) ends the run, whatever the job says
TEMPFAIL = Rule("tempfail", "exit-code", "end", "a rank exited 75: the run ends", codes=frozenset({75}),
                slurm=Form("no requeue"), kubernetes=Form("ExitCode", "the operator retries it"))
#: exit 138 (Kubeflow's "retry me") restarts without counting, whatever the job says
RETRY_ME = Rule("retry_me", "exit-code", "not-counted", "a rank exited 138: restart, not counted",
                codes=frozenset({138}), slurm=Form(None, "Slurm counts every requeue"),
                kubernetes=Form("ExitCode", "the operator fails the job on it"))


def _with(rule: Rule, after: str) -> tuple[Rule, ...]:
    i = [r.name for r in RULES].index(after) + 1
    return (*RULES[:i], rule, *RULES[i:])


def _job(**given):
    return load_job("ddp-smoke", given)


def _run_block(tmp_path, block: str, code: int, records: list[tuple[str, int]]) -> tuple[str, bool]:
    """The requeue block run by bash after a step that ended ``code``: (its output, requeued?)."""
    run_dir = tmp_path / "run"
    (run_dir / "slurm").mkdir(parents=True)
    for node, c in records:
        (run_dir / "slurm" / f"{node}.json").write_text(
            f'{{"node": "{node}", "rank": 0, "exit_code": {c}, "finished": "x", "stopped": false}}\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/requeued\n')
    (bin_dir / "scontrol").chmod(0o755)
    script = f'CLUSTERCTL_RUN_DIR={run_dir}\nCLUSTERCTL_ATTEMPT=0\nSLURM_JOB_ID=42\ncode={code}\n{block}'
    res = subprocess.run(["bash", "-c", script], env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == code, res.stderr
    return res.stdout, (tmp_path / "requeued").exists()


def test_the_page_shows_the_table():
    page = (REPO / "docs" / "how-to" / "restarts.md").read_text()
    shown = re.search(r"<!-- recovery-rules: .*? -->\n(.*?)<!-- /recovery-rules -->", page, re.S)
    assert shown, "docs/how-to/restarts.md lost its recovery-rules markers"
    assert shown.group(1) == recovery.rules_markdown(), (
        "docs/how-to/restarts.md's rule table differs from RULES: paste "
        "clusterctl.run.recovery.rules_markdown() between the markers")
    assert len(re.findall(r"^\| \d+ \| `", shown.group(1), re.M)) == len(RULES)


def test_every_rule_has_a_condition_the_decision_evaluates_and_forms_with_reasons():
    for rule in RULES:
        assert rule.when in recovery.CONDITIONS and rule.doc
        for form in (rule.slurm, rule.kubernetes):
            assert form.says or form.why, rule.name
    with pytest.raises(ValueError):
        Rule("bad", "exit-code", "end", "no codes")
    with pytest.raises(ValueError):
        replace(TEMPFAIL, when="sunspots")


def test_an_added_end_rule_is_taken_up_by_the_decision_the_script_and_the_export(tmp_path):
    rules = _with(TEMPFAIL, after="fatal_on_exit")
    end = [AttemptEnd(0, "failed", 75, node="n2", kind="exit", last_line="tempfail")]
    policy = Policy(max_restarts=3)
    # SSH: without the rule exit 75 restarts; with it the run ends with 75
    assert decide(end, policy).action == "restart"
    d = decide(end, policy, rules=rules)
    assert (d.action, d.exit_code) == ("end", 75) and "tempfail" in d.reason
    assert decide([replace(end[0], exit_code=1)], policy, rules=rules).action == "restart"
    # Slurm: an arm of its own, before the restart budget's; bash takes it
    job = _job(max_restarts=2)
    block = recovery_shell(job, rules)
    assert "tempfail" not in recovery_shell(job)
    assert """grep -qsE '"exit_code": (75), .*"stopped": false'""" in block
    out, requeued = _run_block(tmp_path / "with", block, 75, [("node1", 75)])
    assert "no requeue: a rank exited with a code of tempfail (75)" in out and not requeued
    out, requeued = _run_block(tmp_path / "without", recovery_shell(job), 75, [("node1", 75)])
    assert "requeue: attempt 0 failed (exit 75), restart 1/2" in out and requeued
    # Kubernetes: the PyTorchJob's restart policy becomes ExitCode, and the notes say why
    assert recovery_settings(job, "pytorchjob", 2, "torch-distributed")[0] == "OnFailure"
    policy_k8s, backoff, notes = recovery_settings(job, "pytorchjob", 2, "torch-distributed", rules)
    assert (policy_k8s, backoff) == ("ExitCode", 2)
    assert any(n.startswith("tempfail 75: restartPolicy ExitCode") for n in notes)
    assert not any("Not expressible" in n for n in notes)          # 75 fails the job there
    _, _, notes = recovery_settings(job, "trainjob", 2, "torch-distributed", rules)
    assert any(n.startswith("tempfail 75: a TrainJob cannot say them") for n in notes)


def test_an_added_not_counted_rule_is_taken_up_by_the_decision_the_script_and_the_export(tmp_path):
    rules = _with(RETRY_ME, after="retry_on_exit")
    end = [AttemptEnd(0, "failed", 138, node="n2", kind="exit", last_line="again")]
    # SSH: a job without restarts now restarts on 138, not counted, blaming nobody
    assert decide(end, Policy()).action == "end"
    d = decide(end, Policy(), rules=rules)
    assert (d.action, d.counted) == ("restart", False)
    tempfail = replace(end[0], exit_code=76)          # below 128: only a not-counted code spares n2
    other = replace(RETRY_ME, codes=frozenset({76}))
    assert recovery.blamed_nodes(tempfail, Policy(), rules=_with(other, "retry_on_exit")) == []
    assert recovery.blamed_nodes(tempfail, Policy()) == ["n2"]
    # Slurm cannot: the requeue block says so where the job may restart at all
    block = recovery_shell(_job(max_restarts=1), rules)
    assert "# retry_me (138): Slurm counts every requeue.\n" in block
    assert "retry_me" not in recovery_shell(_job(max_restarts=1))
    # Kubernetes: a job without restarts gets ExitCode (138 is one the operator retries)
    job = _job()
    assert recovery_settings(job, "pytorchjob", 2, "torch-distributed")[:2] == ("Never", 0)
    policy_k8s, backoff, notes = recovery_settings(job, "pytorchjob", 2, "torch-distributed", rules)
    assert (policy_k8s, backoff) == ("ExitCode", recovery.MAX_ATTEMPTS)
    assert any(n.startswith("retry_me 138: restartPolicy ExitCode") for n in notes)
    # a code the operator does not retry is reported with the rule's reason
    _, _, notes = recovery_settings(job, "pytorchjob", 2, "torch-distributed", _with(other, "retry_on_exit"))
    assert "Not expressible under ExitCode: retry_me 76 (the operator fails the job on it)." in notes
