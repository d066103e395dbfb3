"""The hang watchdog's clock (pure): a slow, silent start is not a hang.

A rank importing torch, joining the rendezvous or loading data writes nothing for a
while; a rank stopped mid-training (SIGSTOP, a dead GPU) makes every rank silent too.
The watchdog tells them apart by when the job *started*: its first line (torchrun's own
log lines aside) or the first line ``hang_start_line`` matches.  Before that the silence
allowed is ``hang_start_timeout``; after it, ``hang_timeout``.  The log lines below are
copied from torchrun 2.13 in the cpu image (``docker run ... torchrun --nproc-per-node 2``).
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.core.errors import UserError
from clusterctl.run import jobs
from clusterctl.run.launch import hang_settings
from clusterctl.run.stacks import NodeDump
from clusterctl.run.supervise import Settings, allowed_silence, silence, starts_clock
from clusterctl.run.watchdog import HangReport

TORCHRUN = [
    "W1126 09:23:57.245005 77 torch/distributed/run.py:774] ",
    "W1126 09:23:57.245005 77 torch/distributed/run.py:774] *****************************************",
    "W1126 09:23:57.245005 77 torch/distributed/run.py:774] Setting OMP_NUM_THREADS environment "
    "variable for each process to be 1 in default",
    "[W1126 09:23:57.245005242 socket.cpp:207] [c10d] The hostname of the client socket cannot be "
    "retrieved. err=-3",
    "I1126 09:23:58.1 77 torch/distributed/elastic/agent/server/api.py:880] [default] starting workers",
]


def test_torchruns_own_log_lines_do_not_start_the_clock_any_other_line_does():
    for line in TORCHRUN:
        assert not starts_clock(line, None), line
    for line in ["rank 0 starting (pid 12)", "hi", "", "W1126 my own warning",
                 "epoch 1 torch/distributed/run.py mentioned"]:
        assert starts_clock(line, None), line


def test_a_start_line_starts_the_clock_only_where_it_matches_anywhere_in_the_line():
    pattern = re.compile(r"step \d+/")
    assert starts_clock("rank 3 step 1/8 loss=0.5", pattern)
    assert not starts_clock("rank 3 starting (pid 12)", pattern)
    assert not starts_clock("rank 3 resumed from step 4 of 8 (attempt 1)", pattern)


def test_before_the_start_the_start_timeout_applies_after_it_the_hang_timeout():
    s = Settings(hang_timeout=10, hang_start_timeout=300)
    assert allowed_silence(s, started=False) == 300 and allowed_silence(s, started=True) == 10
    # 60 s of silence: a slow start before the job started, a hang after it
    assert silence(1060, 1000, started=False, settings=s) is None
    assert silence(1060, 1000, started=True, settings=s) == 60
    assert silence(1009.9, 1000, started=True, settings=s) is None
    assert silence(1300, 1000, started=False, settings=s) == 300
    # no start timeout: the hang timeout throughout (as before start lines existed)
    assert allowed_silence(Settings(hang_timeout=10), started=False) == 10
    # no watchdog at all
    assert silence(10 ** 9, 0, started=True, settings=Settings()) is None
    assert allowed_silence(Settings(hang_start_timeout=5), started=False) is None


def job(tmp_path, text: str) -> jobs.Job:
    path = tmp_path / "j.yaml"
    path.write_text("image: x\ncommand: [run]\n" + text)
    return jobs.load_job(path)


def test_the_start_timeout_defaults_to_the_longer_of_the_hang_timeout_and_5_minutes(tmp_path):
    plain = job(tmp_path, "")
    assert hang_settings(plain, None) == {"hang_timeout": None, "hang_start_timeout": None,
                                          "hang_start_line": None}
    assert hang_settings(plain, 20)["hang_start_timeout"] == jobs.HANG_START_DEFAULT == 300
    assert hang_settings(plain, 900)["hang_start_timeout"] == 900
    keyed = job(tmp_path, "hang_timeout: 15s\nhang_start_timeout: 2m\nhang_start_line: 'step \\d+'\n")
    assert hang_settings(keyed, keyed.hang_timeout) == {
        "hang_timeout": 15, "hang_start_timeout": 120, "hang_start_line": r"step \d+"}


@pytest.mark.parametrize("text, key, valid", [
    ("hang_start_timeout: 5x\n", ":3: hang_start_timeout", "a duration such as 90s"),
    ("hang_start_timeout: 0\n", ":3: hang_start_timeout", "more than 0"),
    ("hang_start_line: 'step ('\n", ":3: hang_start_line", "is not a regular expression"),
    ("hang_start_line: ''\n", ":3: hang_start_line", "is empty"),
    (f"hang_start_line: '{'x' * 201}'\n", ":3: hang_start_line", "longer than 200 characters"),
    ("hang_start_line: [a]\n", ":3: hang_start_line", "valid:"),
])
def test_bad_watchdog_keys_name_the_file_line_and_key(tmp_path, text, key, valid):
    with pytest.raises(UserError) as e:
        job(tmp_path, text)
    assert f"j.yaml{key}" in e.value.message and valid in e.value.message, e.value.message


def test_the_flags_reach_the_job_and_a_bad_one_exits_2_naming_the_flag(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - {name: n1, host: 127.0.0.1}\n")
    res = CliRunner().invoke(app, ["launch", "--target", "cpu", "--nodes", str(inv), "--dry-run",
                                   "--hang-timeout", "20s", "--hang-start-line", "step (", "--", "true"])
    assert res.exit_code == 2, res.output
    assert "(command line)" in res.output and "hang_start_line" in res.output \
        and "is not a regular expression" in res.output, res.output
    assert "Traceback" not in res.output


def test_a_hang_before_the_start_says_so_and_names_the_start_timeout():
    report = HangReport(timeout=300, silent_for=300.2, last_output=0, detected=300, starting=True,
                        start_line=r"step \d+", dumps=[NodeDump("node1", error="x")])
    head = report.summary_lines()[0]
    assert head.startswith("HANG: the job did not start: no rank wrote a line matching 'step \\d+' "
                           "(hang_start_line), and no output for 5m (--hang-start-timeout 5m)"), head
    assert report.record()["phase"] == "start"
    running = HangReport(timeout=15, silent_for=15.1, last_output=0, detected=15)
    assert running.summary_lines()[0].startswith("HANG: no rank wrote output for 15.1s (--hang-timeout 15s)")
    assert running.record()["phase"] == "running"
