"""YAML that explodes, through the CLI, for every kind of YAML file clusterctl reads.

An alias bomb ("billion laughs"), the same through merge keys and anchors hidden in keys,
nesting too deep (written out, or built from aliases) and an oversize file: each ends in one
message naming the file, the line and the limit, exit status 2, no traceback, nothing
started.  Nesting is tried in every shape (block, flow, mixed), one level past the limit and
as deep as the file size limit allows, and must be refused in well under a second.  Inventories go through ``clusterctl nodes``, jobs through ``clusterctl launch
--dry-run``; target data has no command-line path (it ships with clusterctl), so it is read
with ``build.targets.load_targets``.  The memory bound is checked on a real ``clusterctl``
process under an address-space limit.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster import inventory
from clusterctl.core import yamlfile
from clusterctl.core.errors import UserError
from clusterctl.image import targets
from tests.core.test_yamlfile import NESTINGS
from tests.fixtures import INVENTORIES


def alias_bomb(prefix: str = "") -> str:
    """Nine levels of nine aliases: 387 million values once expanded, 400 bytes written."""
    return prefix + "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))


def merge_bomb_in_keys(prefix: str = "") -> str:
    """Anchors defined inside keys (never built themselves), merged nine times per level;
    the value that finally merges the last one is on line 20."""
    text = prefix + "? &m0 {k0: x, k1: x, k2: x, k3: x, k4: x, k5: x, k6: x, k7: x, k8: x}\n: 1\n"
    for i in range(1, 10):
        text += f"? &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}]}}\n: 1\n"
    return text + "z: {<<: *m9}\n"


def deep(prefix: str = "") -> str:
    return prefix + "x: " + "[" * 5000 + "]" * 5000 + "\n"


def deep_through_aliases(prefix: str = "") -> str:
    """Twenty anchors of ten levels each, each holding the one before: 200 levels, 40 lines."""
    text = prefix
    for i in range(1, 21):
        inner = f"*c{i - 1}" if i > 1 else "1"
        text += f"? &c{i} " + "[" * 10 + inner + "]" * 10 + "\n: 1\n"
    return text + "z: *c20\n"


# (name, text maker, words in the message, the line the message must name for an empty prefix)
CASES = [
    ("alias bomb", alias_bomb, f"more than {yamlfile.MAX_VALUES:,} values", None),
    ("merge bomb in keys", merge_bomb_in_keys, f"more than {yamlfile.MAX_VALUES:,} values", None),
    ("deep nesting", deep, f"nest deeper than {yamlfile.MAX_DEPTH} levels", 1),
    ("deep through aliases", deep_through_aliases,
     f"nest deeper than {yamlfile.MAX_DEPTH} levels (counting the levels an alias", None),
]


def _check(output: str, path, words: str, line: int | None, offset: int) -> None:
    assert "Traceback" not in output and "RecursionError" not in output, output
    assert words in output, output
    located = [t for t in output.split() if t.startswith(f"{path}:")]
    assert located, output  # FILE:LINE: names the file and the line
    if line is not None:
        assert f"{path}:{line + offset}:" in output, output


@pytest.mark.parametrize("name, make, words, line", CASES, ids=[c[0] for c in CASES])
def test_inventory_that_explodes_is_a_message_and_exit_2(tmp_path, name, make, words, line):
    inv = tmp_path / "cluster.yaml"
    inv.write_text(make("nodes: [{host: 10.0.0.11}]\n"))
    result = CliRunner().invoke(app, ["nodes", "--nodes", str(inv)])
    assert result.exit_code == 2, result.output
    _check(result.output, inv, words, line, offset=1)


@pytest.mark.parametrize("name, make, words, line", CASES, ids=[c[0] for c in CASES])
def test_job_that_explodes_is_a_message_and_exit_2(tmp_path, name, make, words, line):
    job = tmp_path / "job.yaml"
    job.write_text(make("target: cpu\ncommand: [echo, hi]\n"))
    result = CliRunner().invoke(app, ["launch", str(job), "--nodes", str(INVENTORIES / "good_minimal.yaml"),
                                      "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "docker run" not in result.output  # nothing planned
    _check(result.output, job, words, line, offset=2)


@pytest.mark.parametrize("name, make, words, line", CASES, ids=[c[0] for c in CASES])
def test_target_data_that_explodes_is_a_message(tmp_path, name, make, words, line):
    """Target data ships with clusterctl (no command-line option reads another file)."""
    data = tmp_path / "targets.yaml"
    data.write_text(make("targets: {}\n"))
    with pytest.raises(UserError) as info:
        targets.load_targets(data)
    assert info.value.exit_code == 2
    _check(info.value.message, data, words, line, offset=1)


def test_oversize_files_are_refused_before_they_are_read_whole(tmp_path):
    inv, job = tmp_path / "cluster.yaml", tmp_path / "job.yaml"
    inv.write_bytes(b"# " + b"x" * inventory.MAX_BYTES + b"\n")
    job.write_bytes(b"# " + b"x" * yamlfile.MAX_BYTES + b"\n")
    result = CliRunner().invoke(app, ["nodes", "--nodes", str(inv)])
    assert result.exit_code == 2
    assert f"{inv}: is larger than {inventory.MAX_BYTES // 1024} KiB" in result.output
    assert f"at most {inventory.MAX_BYTES // 1024} KiB" in result.output
    result = CliRunner().invoke(app, ["launch", str(job), "--nodes", str(INVENTORIES / "good_minimal.yaml"),
                                      "--dry-run"])
    assert result.exit_code == 2 and f"{job}: is larger than {yamlfile.MAX_BYTES // 1024} KiB" in result.output


def test_a_hostfile_as_large_as_the_inventory_limit_is_refused_too(tmp_path):
    hosts = tmp_path / "hosts"
    line = b"node1 slots=8\n"
    hosts.write_bytes(line * (inventory.MAX_BYTES // len(line) + 1))
    result = CliRunner().invoke(app, ["nodes", "--nodes", str(hosts)])
    assert result.exit_code == 2 and f"{hosts}: is larger than" in result.output


#: Address space the clusterctl process may use: Python with typer, pydantic and rich
#: needs about 0.4 GB of it; the alias bomb, built, would need over 30 GB.
ADDRESS_SPACE = 1024 * 1024 * 1024
#: Resident memory the refusal may take: about what ``clusterctl --help`` takes, plus room.
MAX_RSS_KB = 200 * 1024

#: clusterctl's own CLI, reporting its peak resident memory on the way out: VmHWM of this
#: process image (getrusage's ru_maxrss would include the pytest process it was forked from).
_MEASURED = ("import atexit, sys\n"
             "def peak():\n"
             "    hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')]\n"
             "    print('peak-rss-kb', hwm[0], file=sys.stderr)\n"
             "atexit.register(peak)\n"
             "from clusterctl.cli import main\n"
             "sys.argv = ['clusterctl', *sys.argv[1:]]\n"
             "main()\n")


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.mark.parametrize("make", [alias_bomb, merge_bomb_in_keys], ids=["alias bomb", "merge bomb"])
def test_a_bomb_is_refused_by_a_real_clusterctl_in_bounded_memory(tmp_path, make):
    inv = tmp_path / "cluster.yaml"
    inv.write_text(make("nodes: [{host: 10.0.0.11}]\n"))
    proc = subprocess.run([sys.executable, "-c", _MEASURED, "nodes", "--nodes", str(inv)],
                          capture_output=True, text=True, preexec_fn=_limited,
                          timeout=300)  # a hang guard, not a speed claim
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "MemoryError" not in text and "Traceback" not in text, text
    assert f"more than {yamlfile.MAX_VALUES:,} values" in text and f"{inv}:" in text
    peak = int(text.split("peak-rss-kb")[1].split()[0])
    assert peak < MAX_RSS_KB, f"peak resident memory {peak} KB"


# ------------------------------------------------------------------ nesting, every shape

#: (kind of file, what comes before the nested entry, how clusterctl reads the file).
def _read_inventory(path):
    return CliRunner().invoke(app, ["nodes", "--nodes", str(path)])


def _read_job(path):
    return CliRunner().invoke(app, ["launch", str(path), "--nodes", str(INVENTORIES / "good_minimal.yaml"),
                                    "--dry-run"])


def _read_target_data(path):
    """Target data has no command-line path: the loader, its error as a result (None: loaded)."""
    try:
        targets.load_targets(path)
    except UserError as e:
        return e
    return None


FILE_KINDS = [
    ("inventory", "nodes: [{host: 10.0.0.11}]\n", _read_inventory),
    ("job", "target: cpu\ncommand: [echo, hi]\n", _read_job),
    ("target data", "targets: {}\n", _read_target_data),
]


def _outcome(result) -> tuple[int, str]:
    if result is None:
        return 0, ""
    if isinstance(result, UserError):
        return result.exit_code, result.message
    return result.exit_code, result.output


@pytest.mark.parametrize("kind, prefix, read", FILE_KINDS, ids=[k[0] for k in FILE_KINDS])
@pytest.mark.parametrize("shape, make, line, deepest", NESTINGS, ids=[n[0] for n in NESTINGS])
@pytest.mark.parametrize("levels", ["limit + 1", "deepest"])
def test_nesting_past_the_limit_is_refused_in_well_under_a_second(tmp_path, kind, prefix, read, shape, make,
                                                                  line, deepest, levels):
    path = tmp_path / "file.yaml"
    path.write_text(prefix + make(yamlfile.MAX_DEPTH + 1 if levels == "limit + 1" else deepest))
    start = time.perf_counter()
    code, output = _outcome(read(path))
    took = time.perf_counter() - start
    assert code == 2, output
    assert took < 1.0, f"{took:.2f} s to refuse a {kind} with {shape} nested {levels}"
    assert "Traceback" not in output and "RecursionError" not in output, output
    assert "docker run" not in output  # nothing planned
    at = f"{path}:{line() + prefix.count(chr(10))}: (YAML): lists or mappings nest deeper than"
    assert f"{at} {yamlfile.MAX_DEPTH} levels; valid: at most {yamlfile.MAX_DEPTH} levels" in output, output


@pytest.mark.parametrize("kind, prefix, read", FILE_KINDS, ids=[k[0] for k in FILE_KINDS])
@pytest.mark.parametrize("shape, make, line, deepest", NESTINGS, ids=[n[0] for n in NESTINGS])
def test_nesting_at_the_limit_is_read_and_x_is_what_is_wrong(tmp_path, kind, prefix, read, shape, make, line,
                                                               deepest):
    """Read in full: an inventory or job is refused by validation (x is not one of its keys),
    not by the reader; target data ignores keys it does not use, so it loads."""
    path = tmp_path / "file.yaml"
    path.write_text(prefix + make(yamlfile.MAX_DEPTH))
    code, output = _outcome(read(path))
    if kind == "target data" and shape == "block mappings as keys":  # read; a mapping as a key is not
        assert code == 2 and "a key is a mapping" in output and "nest deeper" not in output, output
    elif kind == "target data":
        assert code == 0, output
    else:
        assert code == 2 and "Traceback" not in output and "nest deeper" not in output, output
        assert f"{path}:{prefix.count(chr(10)) + 1}: x: unknown" in output, output


#: clusterctl's own CLI, telling how much CPU it spent from its command line to its exit (the
#: work: on 2 shared cores the suite's background image builds stretch wall time past a
#: second (CI, 2026-11-29), while the defect this guards against cost 7 to 17 s of CPU).
_TIMED = ("import atexit, sys, time\n"
          "from clusterctl.cli import main\n"
          "start = time.process_time()\n"
          "atexit.register(lambda: print('took-s', time.process_time() - start, file=sys.stderr))\n"
          "sys.argv = ['clusterctl', *sys.argv[1:]]\n"
          "main()\n")


@pytest.mark.parametrize("shape", ["flow sequences", "block mappings"])
def test_a_real_clusterctl_refuses_a_deep_inventory_in_well_under_a_second(tmp_path, shape):
    [(make, deepest)] = [(n[1], n[3]) for n in NESTINGS if n[0] == shape]
    inv = tmp_path / "cluster.yaml"
    inv.write_text("nodes: [{host: 10.0.0.11}]\n" + make(deepest))
    proc = subprocess.run([sys.executable, "-c", _TIMED, "check", "--nodes", str(inv)],
                          capture_output=True, text=True, timeout=120)  # a hang guard
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in text, text
    assert f"{inv}:" in text and f"nest deeper than {yamlfile.MAX_DEPTH} levels" in text, text
    took = float(text.split("took-s")[1].split()[0])
    assert took < 1.0, f"{took:.2f} s of CPU from the command line to the refusal"
