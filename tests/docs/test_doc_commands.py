"""Every shell command the documentation shows is true (issue 20, items 3 and 4).

The pages are README.md and docs/**/*.md (docs/reference/ included: `make reference` writes it).
Their convention (tests/docs/doccmds.py has it in full): a sh/bash/console/shell block
with clusterctl or make command lines has a `<!-- doc-test: KIND -->` marker on the line
before its fence. Here:

* the convention itself holds on every page (a problem names FILE:LINE);
* every clusterctl line of every block, whatever its marker, parses against the real
  typer app (command path, options, arguments), every make line names a real target;
* every `run` block runs as written, each line with its own `bash -c`, in a fresh copy of
  the repository's files, with the venv's bin/ first on PATH, CLUSTERCTL_PLAIN=1 and a
  DOCKER_HOST that answers nothing (a run block must not need an engine); the last line
  exits with the marker's status, the others 0; its `output` block is in what it printed;
* every `message` block (a message of an error that needs nodes) comes from strings in
  src/clusterctl, with the doc's values where the code has fields.

`sandbox` blocks run in tests/docs/test_doc_sandbox.py. The checks themselves are tested
on the pages in tests/docs/fixtures/, each with one kind of mistake that must be caught.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs import doccmds
from tests.fixtures import REPO

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SRC = REPO / "src" / "clusterctl"
#: how long one command line of a run block may take
RUN_TIMEOUT = 60
#: where DOCKER_HOST points while run blocks run: nothing answers there
NO_ENGINE = "unix:///nonexistent/clusterctl-doc-test/docker.sock"


def _pages() -> list[doccmds.Page]:
    return [doccmds.parse_page(p.read_text(), str(p.relative_to(REPO))) for p in doccmds.doc_pages(REPO)]


PAGES = _pages()
BLOCKS = [b for page in PAGES for b in page.blocks]
WITH_COMMANDS = [b for b in BLOCKS if b.programs()]
RUN_BLOCKS = [b for b in BLOCKS if b.marker and b.marker.kind == "run" and b.commands]
MESSAGE_BLOCKS = [b for b in BLOCKS if b.marker and b.marker.kind == "message"]


def _ids(blocks: list[doccmds.Block]) -> list[str]:
    return [b.id for b in blocks]


def fixture_page(name: str) -> doccmds.Page:
    path = FIXTURES / name
    return doccmds.parse_page(path.read_text(), str(path.relative_to(REPO)))


# --------------------------------------------------------------------------- the environment

def scratch_copy(dest: Path) -> Path:
    """The repository's files (tracked, and untracked but not ignored: the working tree as
    it is) copied into dest; `.venv` there is the venv these tests run in, for make lines."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if not src.exists() and not src.is_symlink():
            continue                     # deleted in the working tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, target)
    venv = Path(sys.executable).parent.parent
    if (venv / "pyvenv.cfg").exists() and not (dest / ".venv").exists():
        (dest / ".venv").symlink_to(venv)
    return dest


def doc_env(**extra: str) -> dict[str, str]:
    """What a reader's shell has after setup: the venv's bin/ first on PATH (the venv these
    tests run in), plain output; no engine (DOCKER_HOST points at nothing), no terminal size."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "CLUSTERCTL_RUNS", "CLUSTERCTL_PLAIN", "DOCKER_HOST")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if env.get("PYTHONPATH"):   # run from a source tree: keep it, resolved (cwd changes)
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    env.update({"CLUSTERCTL_PLAIN": "1", "DOCKER_HOST": NO_ENGINE, **extra})
    return env


@pytest.fixture(scope="module")
def source_patterns() -> list[doccmds.SourceString]:
    return doccmds.source_patterns(SRC)


_timings: list[tuple[str, float]] = []


PAGE_OF = {page.file: page for page in PAGES}


def _written_before(block: doccmds.Block) -> list[doccmds.Block]:
    """The blocks above ``block`` on its page (their `file PATH` blocks are written first)."""
    page = PAGE_OF.get(block.file)
    return [b for b in (page.blocks if page else []) if b.line < block.line]


def run_failure(block: doccmds.Block, tmp_path: Path) -> str | None:
    cwd = scratch_copy(tmp_path / "repo")
    # the `file PATH` blocks above it on its page, as the reader has written them by now
    doccmds.write_files(_written_before(block), cwd)
    ran, why = doccmds.run_block(block, cwd, doc_env(), timeout=RUN_TIMEOUT)
    _timings.append((block.id, sum(r.seconds for r in ran)))
    return why


# --------------------------------------------------------------------------- the real pages

def test_the_pages_follow_the_doc_test_convention():
    problems = [str(p) for page in PAGES for p in page.problems]
    assert not problems, "problems with the doc-test markers:\n" + "\n".join(problems)


@pytest.mark.parametrize("block", WITH_COMMANDS, ids=_ids(WITH_COMMANDS))
def test_every_command_line_parses(block):
    bad = doccmds.parse_failures(block, REPO)
    assert not bad, "\n".join(bad)


#: run blocks that passed, by all that decides how one ends: its lines, the exit and output
#: it expects, the `file` blocks written before it (each runs in a fresh copy of the same
#: tree, with the same environment).  A block the same as one that passed passes: five
#: pages show `make bench-plots`, 10 s or more each.
_passed: set[tuple] = set()


def _outcome_key(block: doccmds.Block) -> tuple:
    files = tuple((b.marker.path, b.text) for b in doccmds.file_blocks(_written_before(block)))
    return (tuple(c.text for c in block.commands), block.marker.exit,
            block.output.text if block.output else None, files)


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=_ids(RUN_BLOCKS))
def test_run_block(block, tmp_path):
    key = _outcome_key(block)
    if key in _passed:
        return   # the same block passed on an earlier page
    why = run_failure(block, tmp_path)
    assert why is None, why
    _passed.add(key)


@pytest.mark.parametrize("block", MESSAGE_BLOCKS, ids=_ids(MESSAGE_BLOCKS))
def test_message_block_is_what_clusterctl_prints(block, source_patterns):
    bad = doccmds.message_mismatches(block.text, source_patterns)
    assert not bad, (f"{block.id}: these lines of the message come from no string in src/clusterctl "
                     "(reworded in the code, or in the doc?):\n" + "\n".join(bad))


def test_run_blocks_time(capsys):
    """Not a check: prints how long the run blocks of this session took (pytest -s shows it)."""
    if _timings:
        with capsys.disabled():
            total = sum(s for _, s in _timings)
            print(f"\n{len(_timings)} run blocks in {total:.1f} s; slowest: "
                  + ", ".join(f"{i} {s:.1f}s" for i, s in sorted(_timings, key=lambda t: -t[1])[:3]))


# --------------------------------------------------------------------------- the checks themselves

def test_the_fixture_pages_are_not_read_as_documentation():
    pages = [p.resolve() for p in doccmds.doc_pages(REPO)]
    assert pages and not any(FIXTURES in p.parents for p in pages)
    assert (REPO / "README.md").resolve() in pages


def test_a_page_that_follows_the_convention_passes_every_check(tmp_path, source_patterns):
    page = fixture_page("good.md")
    assert page.problems == []
    kinds = [(b.lang, b.marker.kind if b.marker else None) for b in page.blocks]
    assert kinds == [("sh", "run"), ("text", "output"), ("console", "run"), ("text", "output"),
                     ("bash", "parse"), ("text", "message"), ("yaml", None), ("", None)]
    run, _, err, _, parse, message, _, _ = page.blocks
    # comments, `sudo `, `$ ` prompts and continuations; a console block's output lines are no commands
    assert [c.text for c in run.commands] == [
        "clusterctl nodes --nodes tests/fixtures/inventories/good_minimal.yaml   # rank order",
        "clusterctl targets"]
    assert [(c.line, c.text) for c in err.commands] == [
        (23, "clusterctl nodes --nodes tests/fixtures/inventories/bad_port_range.yaml")]
    assert err.marker.exit == 2 and run.output is page.blocks[1] and err.output is page.blocks[3]
    assert parse.marker.reason == "needs GPUs and a real cluster"
    assert [inv for c in parse.commands for inv in doccmds.invocations(c.text)] == [
        ("clusterctl", ["launch", "ddp-smoke-nccl", "--nodes", "cluster.yaml", "--set", "A=1"]),
        ("clusterctl", ["logs", "SUBST", "--node", "node1"]),
        ("clusterctl", ["runs", "--json"]),
        ("clusterctl", ["launch", "ddp-smoke", "--nodes", "slurm"]),
        ("make", ["image", "TARGET=accl"]),
        ("clusterctl", ["--install-completion"])]
    assert [f for b in page.blocks for f in doccmds.parse_failures(b, REPO)] == []
    for block in (run, err):
        assert run_failure(block, tmp_path / str(block.line)) is None
    assert doccmds.message_mismatches(message.text, source_patterns) == []


def test_the_convention_problems_are_named_with_file_and_line():
    page = fixture_page("unmarked.md")
    got = [(p.line, p.message.split(" (")[0].split(":")[0]) for p in page.problems]
    where = "tests/docs/fixtures/unmarked.md"
    text = "\n".join(str(p) for p in page.problems)
    assert f"{where}:3: this sh block has clusterctl command lines and no <!-- doc-test" in text
    assert f'{where}:7: unknown doc-test marker "runn"' in text
    assert f'{where}:12: a "parse" marker needs its reason in words' in text
    assert f'{where}:17: an "output" block must come right after a run or sandbox block' in text
    assert f"{where}:22: a doc-test marker must be on the line directly before a code fence" in text
    assert f"{where}:24: this sh block has make command lines and no <!-- doc-test" in text
    assert f"{where}:29: a transcript with a clusterctl command line" in text
    assert f'{where}:34: "export CLUSTERCTL_PLAIN=1": each command line of a run block runs in a shell' in text
    assert len(got) == 8, text


def test_a_bad_option_an_unknown_command_a_missing_argument_and_target_are_caught():
    (block,) = fixture_page("bad_option.md").blocks
    bad = doccmds.parse_failures(block, REPO)
    where = "tests/docs/fixtures/bad_option.md"
    assert len(bad) == 4, "\n".join(bad)
    assert bad[0].startswith(f"{where}:5: `clusterctl launch ddp-smoke --nodez cluster.yaml`: ")
    assert "No such option: --nodez" in bad[0]
    assert bad[1].startswith(f"{where}:6: `clusterctl lunch ddp-smoke`: ") and "lunch" in bad[1]
    assert bad[2].startswith(f"{where}:7: `clusterctl export --to pytorchjob`: ") and "Missing argument" in bad[2]
    assert bad[3].startswith(f"{where}:8: `make no-such-target`: `make -n no-such-target` exits 2")


def test_a_wrong_expected_exit_is_caught(tmp_path):
    (block,) = fixture_page("wrong_exit.md").blocks
    why = run_failure(block, tmp_path)
    assert why is not None and why.startswith(
        "tests/docs/fixtures/wrong_exit.md:6: `clusterctl nodes --nodes tests/fixtures/inventories/"
        "bad_port_range.yaml` exited 2, expected exit 0")
    assert "70000 is out of range" in why


def test_a_wrong_output_block_is_caught(tmp_path):
    page = fixture_page("wrong_output.md")
    assert page.problems == []
    why = run_failure(page.blocks[0], tmp_path)
    assert why is not None and why.startswith("tests/docs/fixtures/wrong_output.md:9: the output block does not match")
    assert "3 nodes, 3 slots" in why and "2 nodes, 2 slots" in why      # expected, and what was printed


def test_a_reworded_message_is_caught(source_patterns):
    blocks = fixture_page("reworded_message.md").blocks
    for block in blocks:
        assert doccmds.message_mismatches(block.text, source_patterns) == [" ".join(block.text.split())], block.id


def test_output_matching_normalizes_whitespace_and_takes_dots_for_any_lines():
    out = "a  b\n\nc\n  d\ne\nf\n"
    assert doccmds.output_mismatch(out, "a b\nc") is None
    assert doccmds.output_mismatch(out, "a b\n...\ne\nf") is None
    assert doccmds.output_mismatch(out, "...\nd\n") is None
    assert doccmds.output_mismatch(out, "a b\nd") is not None         # not contiguous without ...
    assert doccmds.output_mismatch(out, "e\n...\na b") is not None    # order counts
    assert doccmds.output_mismatch(out, "a") is not None              # whole lines, not parts


def test_a_message_field_takes_values_but_not_prose(source_patterns):
    ok = "error: invalid --slots 0: give a whole number of processes per node, 1 or more."
    assert doccmds.message_mismatches(ok, source_patterns) == []
    # the value of a field may be left out as `...`, or be a few words; a field's longer text
    # must itself come from the source
    assert doccmds.message_mismatches(ok.replace(" 0:", " ...:"), source_patterns) == []
    assert doccmds.message_mismatches(ok.replace("per node", "per node, say"), source_patterns) != []


def test_a_command_that_outlives_its_timeout_fails_and_its_processes_go(tmp_path):
    block = doccmds.parse_page("<!-- doc-test: run -->\n```sh\nsleep 30 & sleep 30; clusterctl targets\n```\n",
                               "t.md").blocks[0]
    t0 = time.monotonic()
    ran, why = doccmds.run_block(block, tmp_path, doc_env(), timeout=1)
    assert time.monotonic() - t0 < 10
    assert why.startswith("t.md:3: `sleep 30 & sleep 30; clusterctl targets` ran past its 1 s")
    assert ran[0].status is None


def test_a_file_block_is_written_before_the_run_blocks_after_it(tmp_path):
    page = fixture_page("file_block.md")
    # a path leaving the repository copy is refused, naming the line
    assert [str(p) for p in page.problems] == [
        'tests/docs/fixtures/file_block.md:22: a "file" marker names a relative path inside the '
        'repository copy (letters, digits, _ . / -; no "..", not absolute), not "../outside.yaml"']
    written, run = page.blocks[0], page.blocks[1]
    assert written.marker.path == "conf/my-inventory.yaml" and run.marker.kind == "run"
    cwd = scratch_copy(tmp_path / "repo")
    doccmds.write_files([b for b in page.blocks if b.line < run.line], cwd)
    assert (cwd / "conf/my-inventory.yaml").read_text() == written.text + "\n"
    _, why = doccmds.run_block(run, cwd, doc_env(), timeout=RUN_TIMEOUT)
    assert why is None, why
    # the command uses the file as the page shows it: a mistake in the file fails the block
    (cwd / "conf/my-inventory.yaml").write_text(written.text.replace("2222", "70000") + "\n")
    _, why = doccmds.run_block(run, cwd, doc_env(), timeout=RUN_TIMEOUT)
    assert why is not None and "exited 2, expected exit 0" in why
