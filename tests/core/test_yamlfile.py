"""core/yamlfile: the one YAML reader (lines, repeated keys, merge keys, syntax errors,
limits) and the one problem collector that inventories, jobs and target data share."""

from __future__ import annotations

import time

import pytest
import yaml

from clusterctl.core import yamlfile
from clusterctl.core.errors import UserError
from clusterctl.core.yamlfile import FileProblems, Problems, bracketed, dotted, parse, read_text


def load(text: str, **kw):
    """(values, problems) of ``text``; FileProblems when the reader stops."""
    problems = Problems("f.yaml")
    return parse(text, problems, **kw), problems


def refused(text: str, **kw) -> FileProblems:
    with pytest.raises(FileProblems) as info:
        load(text, **kw)
    assert info.value.exit_code == 2 and "Traceback" not in info.value.message
    return info.value


def test_values_and_the_line_of_every_key_path():
    data, problems = load("# comment\na: 1\nb:\n  - x\n  - {c: 2, d: [3]}\n")
    assert data == {"a": 1, "b": ["x", {"c": 2, "d": [3]}]}
    assert problems.lines[("a",)] == 2 and problems.lines[("b",)] == 3
    assert problems.lines[("b", 0)] == 4 and problems.lines[("b", 1, "d")] == 5
    assert problems.line(("b", 1, "missing")) == 5  # a missing key points at its mapping
    assert problems.found == []


def test_empty_document_is_none():
    assert load("")[0] is None and load("# only a comment\n")[0] is None


def test_verbatim_scalars_are_the_text_written():
    data, _ = load("env: {A: 1, B: yes, C: 0755, D: 1.50, E: ~}\nn: 0755\n",
                   verbatim=lambda path: path[:1] == ("env",) and len(path) == 2)
    assert data["env"] == {"A": "1", "B": "yes", "C": "0755", "D": "1.50", "E": None}
    assert data["n"] == 493  # YAML 1.1 octal outside the verbatim part


def test_a_repeated_key_is_a_problem_on_its_line():
    data, problems = load("a: 1\nb:\n  c: 2\n  d: 3\n  c: 4\n")
    assert data["b"]["c"] == 4
    [p] = problems.found
    assert (p.line, p.field, p.valid) == (5, "b.c", "each key once per mapping")
    assert "first on line 3" in p.problem


def test_a_repeated_key_in_an_anchor_is_reported_once():
    _, problems = load("x: &x {a: 1, a: 2}\ny: *x\nz: *x\n")
    assert [(p.line, p.field) for p in problems.found] == [(1, "x.a")]


def test_merge_keys_as_yaml_1_1_with_lines_at_the_merged_definition():
    text = ("defaults: &d\n"
            "  slots: 8\n"
            "  user: root\n"
            "other: &o {zone: west, user: other}\n"
            "node:\n"
            "  <<: [*d, *o]\n"
            "  user: admin\n")
    data, problems = load(text)
    assert data["node"] == {"slots": 8, "user": "admin", "zone": "west"}
    assert problems.lines[("node", "slots")] == 2  # where the merged mapping defines it
    assert problems.lines[("node", "zone")] == 4
    assert problems.lines[("node", "user")] == 7  # the mapping's own key wins, with its line
    assert problems.found == []  # a merged key the mapping also writes is not written twice
    data, _ = load("a: &a {k: 1}\nb: &b {k: 2}\nc: {<<: [*a, *b]}\n")
    assert data["c"] == {"k": 1}  # the earlier merged mapping wins


def test_a_merge_of_a_non_mapping_is_a_located_problem():
    err = refused("a: 1\nb:\n  <<: 5\n")
    assert err.problems[0].field == "(YAML syntax)" and "for merging" in err.message


@pytest.mark.parametrize("text, line, words, valid", [
    ("a: 1\nb: [1, 2\nc: 3\n", 3, "flow sequence that began on line 2", "brackets"),
    ("a:\n  - 1\n - 2\n", 3, "a '-' list item indented differently", "check indentation"),
    ("a:\n\tb: 1\n", 2, "'\\t'", "indent with spaces"),
    ("a: 1\n---\nb: 2\n", 2, "another document", "well-formed YAML"),
    ("a: !custom 1\n", 1, "could not determine a constructor", "well-formed YAML"),
    ("a: *undefined\n", 1, "found undefined alias", "well-formed YAML"),
])
def test_syntax_errors_are_one_located_problem_in_plain_words(text, line, words, valid):
    err = refused(text)
    [p] = err.problems
    assert (p.line, p.field) == (line, "(YAML syntax)"), err.message
    assert words in p.problem and valid in p.valid, err.message


def test_syntax_hint_names_a_good_file_of_the_same_kind():
    err = refused("a: [1\n", like="inventories/example.yaml")
    assert "YAML as in inventories/example.yaml" in err.problems[0].valid


def test_keys_that_are_not_plain_values_are_problems():
    data, problems = load("? [a, b]\n: 1\nok: 2\n")
    assert data == {"ok": 2}
    assert problems.found[0].problem == "a key is a list"


def test_unreadable_scalars_stay_text_for_validation():
    data, problems = load(f"date: 2024-13-01\nbig: {'9' * 5000}\n")
    assert data == {"date": "2024-13-01", "big": "9" * 5000} and problems.found == []


def test_an_alias_bomb_is_refused_quickly():
    """Nine levels of nine aliases would be 387 million values."""
    text = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
    start = time.monotonic()
    err = refused(text)
    assert time.monotonic() - start < 20
    assert len(err.problems) == 1 and f"more than {yamlfile.MAX_VALUES:,} values" in err.message
    assert "alias" in err.message


def test_an_alias_inside_its_own_anchor_is_refused():
    for text in ("a: &a [1, *a]\n", "a: &a {b: *a}\n"):
        err = refused(text)
        assert "inside the anchor" in err.message and err.problems[0].line == 1


def test_nesting_too_deep_for_the_reader_is_refused():
    err = refused("a: 1\nb: " + "[" * 3000 + "]" * 3000 + "\n")
    assert "nest deeper" in err.message and err.problems[0].line == 2


# ------------------------------------------------------------------ nesting, every shape

def _flows(levels: int) -> tuple[str, str]:
    """Opening and closing text of ``levels`` flow mappings and sequences, alternating."""
    opening = "".join("{a: " if i % 2 == 0 else "[" for i in range(levels))
    closing = "".join("}" if i % 2 == 0 else "]" for i in reversed(range(levels)))
    return opening, closing


def _mixed(levels: int) -> str:
    opening, closing = _flows(levels - 3)  # the file's mapping, a block list, a block mapping
    return "x:\n - a: " + opening + "1" + closing + "\n"


#: (shape, text of a document nesting ``levels`` lists/mappings (its own mapping included,
#: holding ``x``), the line of the first level too many, the most levels 1 MiB can hold).
#: Indented block levels take one more space each, so 1 MiB holds about 1,400 of them.
NESTINGS = [
    ("block sequences", lambda n: "x:\n " + "- " * (n - 1) + "1\n", lambda: 2, 10_000),
    ("indented block sequences",
     lambda n: "x:\n" + "".join(" " * i + "-\n" for i in range(1, n)) + " " * n + "1\n", lambda: 65, 1_400),
    ("block mappings",
     lambda n: "x:\n" + "".join(" " * i + "a:\n" for i in range(1, n)) + " " * n + "1\n", lambda: 65, 1_400),
    ("block mappings as keys", lambda n: "x:\n " + "? " * (n - 1) + "1\n", lambda: 2, 10_000),
    ("flow sequences", lambda n: "x: " + "[" * (n - 1) + "1" + "]" * (n - 1) + "\n", lambda: 1, 10_000),
    ("flow mappings", lambda n: "x: " + "{a: " * (n - 1) + "1" + "}" * (n - 1) + "\n", lambda: 1, 10_000),
    ("mixed", _mixed, lambda: 2, 10_000),
]


def depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max([depth(v) for v in value.values()], default=0)
    if isinstance(value, list):
        return 1 + max([depth(v) for v in value], default=0)
    return 0


@pytest.mark.parametrize("shape, make, line, deepest", NESTINGS, ids=[n[0] for n in NESTINGS])
def test_nesting_at_the_limit_loads(shape, make, line, deepest):
    data, problems = load(make(yamlfile.MAX_DEPTH))
    assert not any("nest" in p.problem for p in problems.found)
    if shape == "block mappings as keys":  # loaded; a mapping as a key is validation's business
        assert [p.problem for p in problems.found] == ["a key is a mapping"]
    else:
        assert problems.found == [] and depth(data) == yamlfile.MAX_DEPTH


@pytest.mark.parametrize("shape, make, line, deepest", NESTINGS, ids=[n[0] for n in NESTINGS])
@pytest.mark.parametrize("levels", ["limit + 1", "deepest"])
def test_nesting_past_the_limit_is_refused_at_its_line_in_well_under_a_second(shape, make, line, deepest,
                                                                             levels):
    text = make(yamlfile.MAX_DEPTH + 1 if levels == "limit + 1" else deepest)
    assert len(text.encode()) <= yamlfile.MAX_BYTES  # a file clusterctl reads, not one it refuses by size
    start = time.process_time()   # this process's CPU: other processes' load does not count
    err = refused(text)
    took = time.process_time() - start
    assert took < 1.0, f"{took:.2f} CPU s to refuse {shape} nested {levels}"
    assert err.message.splitlines()[1:] == [
        f"f.yaml:{line()}: (YAML): lists or mappings nest deeper than {yamlfile.MAX_DEPTH} levels; "
        f"valid: at most {yamlfile.MAX_DEPTH} levels (inventories, jobs and targets need a few)"]


class _CountedSafeLoader(yaml.SafeLoader):
    """PyYAML's pure-Python loader, counting the texts it is given (``made``)."""

    made: list[int] = []

    def __init__(self, stream):
        self.made.append(len(stream))
        super().__init__(stream)


@pytest.mark.parametrize("shape, make, line, deepest", NESTINGS, ids=[n[0] for n in NESTINGS])
def test_nesting_past_the_limit_never_reaches_the_pure_python_parser(monkeypatch, shape, make, line, deepest):
    """Whatever libyaml does with a deep file, the pure-Python parser (whose time grows with the
    depth: 13 s for ``[`` * 5,000) never reads it.  libyaml 0.2.5 (PyYAML 6.0.3) has no nesting
    limit; the libyaml of PyYAML 6.0.4 stops at 1,000 levels while looking ahead on a line, as
    a syntax error that ``parse`` must not re-read in the pure-Python parser's words.  Counted,
    not timed: the cost is in which parser reads the file."""
    if yamlfile._FastLoader is yaml.SafeLoader:
        pytest.skip("PyYAML without libyaml: the pure-Python parser is the only one")
    monkeypatch.setattr(_CountedSafeLoader, "made", [])
    monkeypatch.setattr(yamlfile.yaml, "SafeLoader", _CountedSafeLoader)
    err = refused(make(deepest))
    assert _CountedSafeLoader.made == []
    assert [(p.line, p.field) for p in err.problems] == [(line(), "(YAML)")]
    assert f"nest deeper than {yamlfile.MAX_DEPTH} levels" in err.message


def test_libyamls_own_nesting_limit_is_told_in_clusterctls_words_at_the_level_too_many():
    """The words ``parse`` recognises are libyaml's own (a libyaml that words its limit
    differently fails here, not silently slow in users' hands); the file is refused at the
    line of its 65th level, not where libyaml's look-ahead stopped."""
    text = "x: ok\ny: " + "[" * 30 + "\n" + "[" * 1000 + "]" * 1030 + "\n"
    try:
        for _ in yaml.parse(text, Loader=yamlfile._FastLoader):  # events only: nothing recurses
            pass
    except yaml.YAMLError as e:
        if "nesting" not in str(e):
            raise
        assert e.problem == yamlfile._LIBYAML_TOO_DEEP and e.problem_mark.line == 2
    else:
        pytest.skip(f"PyYAML {yaml.__version__}: its parser has no nesting limit of its own (6.0.3 and older)")
    err = refused(text)
    assert err.message.splitlines()[1:] == [
        f"f.yaml:3: (YAML): lists or mappings nest deeper than {yamlfile.MAX_DEPTH} levels; "
        f"valid: at most {yamlfile.MAX_DEPTH} levels (inventories, jobs and targets need a few)"]


def test_only_an_alias_makes_a_finished_list_too_deep_and_the_message_says_so():
    inner = "[" * 40 + "1" + "]" * 40  # 40 levels under the anchor
    fits = f"x: &x {inner}\ny: " + "[" * 23 + "*x" + "]" * 23 + "\n"  # 1 + 23 + 40 = 64
    assert depth(load(fits)[0]) == yamlfile.MAX_DEPTH
    err = refused(f"x: &x {inner}\ny: " + "[" * 24 + "*x" + "]" * 24 + "\n")  # 65
    assert err.problems[0].line == 2 and "counting the levels an alias (*name) brings" in err.message


def test_a_syntax_error_late_in_a_large_file_keeps_libyamls_words_and_is_quick(monkeypatch):
    """PyYAML's pure-Python parser (plainer words) takes about 6 s per MB: past
    ``PLAIN_WORDS_BYTES`` the error is told in libyaml's words, at the same line, and the
    pure-Python parser never runs (counted, not timed: a wall-clock bound failed once on a
    loaded CI machine, and the cost is in which parser reads the MB, not in the clock)."""
    if yamlfile._FastLoader is yaml.SafeLoader:
        pytest.skip("PyYAML without libyaml: the pure-Python parser is the only one")
    made = []

    class Counted(yaml.SafeLoader):
        def __init__(self, stream):
            made.append(len(stream))
            super().__init__(stream)

    monkeypatch.setattr(yamlfile.yaml, "SafeLoader", Counted)
    text = "nodes:\n" + "  - {host: 10.0.0.1, slots: 8}\n" * 30_000 + "  - {host: [}\n"
    err = refused(text)
    assert made == []                                  # the MB went through libyaml alone
    [p] = err.problems
    assert p.line == 30_002 and "flow node that began on line 30002" in p.problem
    small = refused("nodes:\n  - {host: [}\n").problems[0]  # a small file: the plainer words
    assert small.line == 2 and "expected the node content, but found '}'" in small.problem
    assert made == [len("nodes:\n  - {host: [}\n")]      # from the pure-Python parser, once


def test_problems_are_reported_at_once_sorted_by_line_with_file_line_field_valid():
    problems = Problems("inv.yaml")
    problems.lines.update({("nodes",): 3, ("nodes", 0): 4})
    problems.add(("nodes", 0, "port"), "70000 is out of range", "a whole number from 1 to 65535")
    problems.add(2, "unknown", "one of a or b", field="top")
    problems.add((), "the file is empty", "a mapping")
    with pytest.raises(FileProblems) as info:
        problems.raise_if_any()
    assert isinstance(info.value, UserError) and info.value.exit_code == 2
    assert info.value.message.splitlines() == [
        "inv.yaml: 3 problems in the file (nothing was started):",
        "inv.yaml:1: (file): the file is empty; valid: a mapping",
        "inv.yaml:2: top: unknown; valid: one of a or b",
        "inv.yaml:4: nodes[0].port: 70000 is out of range; valid: a whole number from 1 to 65535",
    ]
    Problems("ok.yaml").raise_if_any()  # nothing found: nothing raised


def test_the_error_class_names_the_kind_of_file():
    class JobProblems(FileProblems):
        what = "job file"

    problems = Problems("job.yaml", spell=dotted, error=JobProblems)
    problems.add(("command", 1), "unknown placeholder {x}", "")
    with pytest.raises(JobProblems, match=r"(?s)1 problem in the job file.*job.yaml:1: command.1: "
                                          r"unknown placeholder \{x\}$"):
        problems.raise_if_any()


def test_field_spellings():
    assert bracketed(("nodes", 0, "env", "A")) == "nodes[0].env.A" and bracketed(()) == "(file)"
    assert dotted(("command", 1)) == "command.1" and dotted(()) == "(file)"


def test_read_text_drops_a_bom_and_refuses_large_or_binary_files(tmp_path):
    f = tmp_path / "f.yaml"
    f.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert read_text(f, "inventory") == "a: 1\n"
    f.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(UserError, match="cannot read the inventory .*valid: a readable UTF-8 text file"):
        read_text(f, "inventory")
    f.write_bytes(b"#" * (yamlfile.MAX_BYTES + 1))
    with pytest.raises(UserError, match=r"f.yaml: is larger than 1024 KiB, far more than any job file; valid: a file of at most"):
        read_text(f, "job file")
    with pytest.raises(UserError, match="cannot read the inventory"):
        read_text(tmp_path / "missing.yaml", "inventory")
