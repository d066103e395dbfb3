"""benchmarks/peers.py without a sandbox or a peer: its refusals, the project it makes from
examples/own-project, how it reads a command's output, its rows and its plot.

The benchmark itself (sandbox, Ray, pdsh) runs only by hand (`make bench-peers`): the peers
are installed by it into a scratch venv, never in CI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import peers, plot
from tests.benchmarks.test_plot import COND, DATA, REPO, png_size, roundtrip


@pytest.mark.parametrize(("args", "message"), [
    (["--repeat", "0"], 'argument --repeat: "0": give a whole number, 1 or more'),
    (["--nodes", "2,0"], 'argument --nodes: "2,0": give node counts from 1 to'),
    (["--ways", "ray,slurmm"], '--ways "ray,slurmm": give ways from clusterctl, by-hand, ray, mpirun, clusterctl-slurm, torchx'),
    (["--ways", "ray,ray"], "each once"),
    (["--name", "Bad Name!"], "Bad Name!"),
    (["--subnet", "10.1.2.3/33"], "10.1.2.3/33"),
])
def test_bad_input_is_one_message_and_exit_2_before_anything(args, message):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "peers.py"), *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_an_output_in_a_missing_directory_is_refused(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "peers.py"), "--plot",
                          str(tmp_path / "no" / "p.png")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert f"{tmp_path / 'no' / 'p.png'}: its directory does not exist" in out.stderr


def test_the_project_is_the_example_with_the_benchmarks_lines(tmp_path):
    project = tmp_path / "p"
    peers.make_project(project)
    text = (project / "train.py").read_text()
    example = (REPO / "examples" / "own-project" / "train.py").read_text()
    # everything of the example is still there, plus the additions (the node-lost run's too)
    assert text.count("\n") == example.count("\n") + 10 + 2 + peers.RECOVERY_LINES.count("\n")
    assert 'VALUE = "start"\nFAIL_RANK = -1\n' in text and "if owned:" in text
    assert "start = resume(model, data, cfg, rank)" in text and "keep(step, model, rank)" in text
    peers.edit(project, "VALUE", '"v2"')
    peers.edit(project, "FAIL_RANK", "1")
    assert 'VALUE = "v2"\nFAIL_RANK = 1\n' in (project / "train.py").read_text()
    compile((project / "train.py").read_text(), "train.py", "exec")
    compile((project / "ray_train.py").read_text(), "ray_train.py", "exec")
    compile((project / "mpi_train.py").read_text(), "mpi_train.py", "exec")
    assert ".deps/" in (project / ".gitignore").read_text().splitlines()
    assert (project / "model" / "__init__.py").is_file() and (project / "config.toml").is_file()


def test_watch_reads_ranks_failures_and_metrics_lines():
    script = (
        "import json, sys, time\n"
        "print('peers-bench value=old rank=0 ', flush=True)\n"
        "for r in (0, 1):\n"
        "    print(f'(RayTrainWorker pid=1) peers-bench value=new rank={r} ', flush=True)\n"
        "    print('clusterctl-metrics ' + json.dumps({'rank': r, 'step': 1}), flush=True)\n"
        "print('clusterctl-metrics {\"rank\": 0, \"st' + 'clusterctl-metrics {}', flush=True)\n"
        "print(f'peers-bench failing rank=1 t={time.time():.3f}', flush=True)\n"
        "sys.exit(3)\n")
    res = peers.watch([sys.executable, "-c", script], {}, 2, "new")
    assert res.rc == 3 and not res.killed
    assert res.ranks_s is not None and res.ranks_s <= res.exit_s
    assert res.fail_at is not None and res.lines_ok == 2 and res.lines_mixed == 1
    # a job that goes on after its failure is killed --stop-wait seconds later
    res = peers.watch([sys.executable, "-c", "import time\nprint(f'peers-bench failing rank=1 "
                       "t={time.time():.3f}', flush=True)\ntime.sleep(60)"], {}, 1, stop_at=1)
    assert res.killed and res.exit_s < 20


def test_rows_ratios_and_table():
    rows = peers.add_ratios([
        {"nodes": 2, "way": "clusterctl", "result": "ok", "setup_s": 20.0, "edit_s": 4.0,
         "fail_stop_s": 2.0, "fail_exit_s": 1.5, "fail_rc": 3, "head_cpu_s": 1.0, "head_mb": 100,
         "lines_expected": 400, "lines_ok": 400, "lines_mixed": 0},
        {"nodes": 2, "way": "ray", "result": "ok", "setup_s": 30.0, "edit_s": 12.0,
         "fail_stop_s": 5.0, "fail_exit_s": 4.0, "fail_rc": 1, "head_cpu_s": 2.0, "head_mb": 80,
         "ray_head_mb": 800, "ray_head_procs": 20, "cluster_up_s": 9.0,
         "lines_expected": 400, "lines_ok": 390, "lines_mixed": 0},
        {"nodes": 2, "way": "by-hand", "result": "ok", "edit_s": 5.0, "fail_rc": None,
         "fail_note": "still running 90 s after the rank failed: killed by the benchmark"},
        {"nodes": 2, "way": "torchx", "result": "ok", "setup_s": 30.0, "edit_s": 28.0,
         "edit_queued_s": 24.0, "fail_stop_s": 1.5, "fail_rc": 1},
        {"nodes": 2, "way": "clusterctl-slurm", "result": "ok", "setup_s": 7.5, "edit_s": 5.0,
         "fail_stop_s": 1.2, "fail_rc": 1},
    ])
    ray = rows[1]
    assert ray["x_edit_s"] == 3.0 and ray["x_setup_s"] == 1.5 and ray["x_head_mb"] == 0.8
    doc = roundtrip(plot.document("peers", "python benchmarks/peers.py",
                                  {**COND, "repeat": 1, "steps": 200}, rows=rows,
                                  published=[{"what": "dstack submit -> running", "seconds": 10}]))
    table = plot.table(doc)
    assert "| 2 | ray | 30.0 (1.50x) | 12.0 (3.00x) | 5.0 (2.50x) | 4.0 | 1 | 2.0 (2.00x) | 80 (0.80x) " \
           "| 390 of 400 | ok |" in table
    assert "| 2 | by-hand | - | 5.0 (1.25x) | - | - | killed |" in table
    assert "| 2 | 20 | 800 |" in table and "| dstack submit -> running | 10.0 | - |" in table
    # the two ways through Slurm side by side: TorchX over clusterctl's Slurm way, Slurm's queue apart
    assert "| 2 | clusterctl-slurm | 7.5 | 5.0 | - | 1.2 | 1 |\n" \
           "| 2 | torchx | 30.0 (4.00x) | 28.0 (5.60x) | 24 | 1.5 (1.25x) | 1 |" in table


def test_the_committed_data_file_draws(tmp_path):
    doc = plot.load(DATA / "peers.json")
    assert {r["way"] for r in doc["rows"]} >= {"clusterctl"}
    out = plot.draw(doc, tmp_path / "peers.png")
    assert png_size(out) == (800, 450)
    assert json.loads((DATA / "peers.json").read_text())["benchmark"] == "peers"
    assert (Path(DATA).parent / "img" / "peers.png").is_file()


def test_lost_run_times_every_rank_of_the_next_attempt_from_the_fault(tmp_path):
    """A stand-in job (no cluster: this tests the benchmark's reading): two ranks step until
    the fault, which the script sees as a file; then a "next attempt" (a start time after
    the fault) resumes and prints its weights. The fault waits for every rank past
    LOST_AT_STEP and for ``ready``."""
    flag = tmp_path / "fault"
    script = (
        "import json, os, sys, time\n"
        "def line(rank, step, start):\n"
        "    print('clusterctl-metrics ' + json.dumps({'rank': rank, 'step': step, 'time': time.time(),"
        " 'start': start}), flush=True)\n"
        "t0 = time.time()\n"
        "step = 0\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    step += 1\n"
        "    for r in (0, 1): line(r, step, t0)\n"
        "    time.sleep(0.02)\n"
        "time.sleep(0.3)\n"
        "t1 = time.time()\n"
        "for r in (0, 1): print(f'peers-bench resumed rank={r} step=6 t={t1}', flush=True)\n"
        "for r in (0, 1): line(r, 7, t1)\n"
        "print('rank 0/2 weights-sha256=abc123', flush=True)\n")
    asked = []

    def ready():
        asked.append(time.time())
        return len(asked) > 3           # not at once: the spare first joins

    def fault():
        flag.write_text("down")
        return time.time()
    res = peers.lost_run([sys.executable, "-c", script], {}, 2, ready, fault, timeout=60)
    assert res["rc"] == 0 and res["fault_at"] is not None and len(asked) == 4
    assert 0.3 <= res["training_again_s"] < 10 and res["resumed_from"] == 6 and res["weights"] == "abc123"
    # a job that never gets past the fault step is never faulted, and says so
    res = peers.lost_run([sys.executable, "-c", "print('clusterctl-metrics {\"rank\": 0, \"step\": 1, "
                          "\"time\": 1, \"start\": 0}')"], {}, 1, lambda: True, fault, timeout=30)
    assert res["fault_at"] is None and "training_again_s" not in res


def _stand_ins(bin_dir: Path, submit_out: str, exit_codes: str) -> None:
    """Stand-ins for `torchx` and `scontrol` (the real ones need a Slurm cluster: the benchmark
    runs them): the submit prints ``submit_out`` and writes both replicas' output files; the
    job is RUNNING for its first two queries, then FAILED with ``exit_codes`` per component,
    submitted at 23:59:50 and started at 00:00:25 (the first component; the next 3 s sooner)."""
    bin_dir.mkdir()
    (bin_dir / "torchx").write_text(
        "#!/bin/sh\nprintf 'torchx 2026-11-29 INFO Log directory\\n' >&2\n"
        f"printf '%s\\n' '{submit_out}'\n"
        "printf 'peers-bench value=x rank=0 \\n' > slurm-7-train-0.out\n"
        "printf 'peers-bench value=x rank=1 \\n' > slurm-7-train-1.out\n"
        "printf 'Traceback (most recent call last):\\n' > slurm-7-train-1.err\nexit 1\n")
    codes = " ".join(f"ExitCode={c}:0" for c in exit_codes.split(","))
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\nn=$(cat queries 2>/dev/null || echo 0); echo $((n + 1)) > queries\n"
        "if [ \"$n\" -lt 2 ]; then echo '   JobState=RUNNING Reason=None'; exit 0; fi\n"
        "t=25; for c in " + codes + "; do echo '   JobState=FAILED Reason=NonZeroExitCode'; "
        "echo \"   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 $c\"; "
        "echo '   SubmitTime=2026-11-29T23:59:50 EligibleTime=2026-11-29T23:59:50'; "
        "echo \"   StartTime=2026-11-30T00:00:$t EndTime=2026-11-30T00:01:00\"; t=$((t - 3)); done\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)


def test_torchx_follow_prints_every_replicas_output_and_exits_with_the_jobs_code_stand_in_slurm(tmp_path):
    _stand_ins(tmp_path / "bin", "slurm://torchx/7", "0,1")
    script = peers.TORCHX_FOLLOW.format(submit="torchx run -s slurm dist.ddp", last=1, settle=0)
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})
    assert r.returncode == 1, r.stderr                    # the largest of the components' codes
    assert r.stdout.splitlines() == ["peers-bench value=x rank=0 ", "peers-bench value=x rank=1 ",
                                     "Traceback (most recent call last):",
                                     "peers-bench slurm-queued-s=35"]   # to the last start
    for f in (*tmp_path.glob("slurm-7-*"), tmp_path / "queries"):
        f.unlink()
    res = peers.watch(["bash", "-c", f"cd {tmp_path}\n" + script],
                      {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}, 2, "x")
    assert res.rc == 1 and res.ranks_s is not None and res.queued_s == 35


def test_torchx_follow_without_a_job_handle_says_what_torchx_said_and_exits_125(tmp_path):
    _stand_ins(tmp_path / "bin", "sbatch: error: Batch job submission failed", "0")
    script = peers.TORCHX_FOLLOW.format(submit="torchx run -s slurm dist.ddp", last=1, settle=0)
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})
    assert r.returncode == 125 and "Batch job submission failed" in r.stderr and r.stdout == ""
