"""clusterctl's own YAML files (inventories, job specs, target data): read them, and report
every problem in them at once.

One job: turn a YAML text into plain Python values that remember the line of every key,
and collect what is wrong with such a file so that a newcomer can fix it in one pass.
Every problem is shown as ``FILE:LINE: field: problem; valid: ...`` (one line each, sorted
by line) under one ``FileProblems`` error, a ``UserError`` (exit status 2).  Pure: no
clusterctl imports but ``core.errors``; the only file access is ``read_text``.

Contract (what other modules call):

``read_text(path, what)``
    The text of a file (UTF-8, a leading BOM dropped); a ``UserError`` naming the file when it
    cannot be read or is larger than ``MAX_BYTES``.
``Problems(file, spell=bracketed, error=FileProblems)``
    The collector of one file.  ``problems.lines`` maps a key path (a tuple such as
    ``("nodes", 0, "host")``; ``()`` is the file) to its 1-based line.
    ``add(where, problem, valid, field=None)`` records one problem at a key path (on the line
    of its longest known prefix: a missing key points at its mapping) or at a line number;
    ``raise_if_any()`` raises ``error(file, problems)``.
``parse(text, problems, verbatim=None, like=None)``
    The document's values (None for an empty file), recording each key's line in
    ``problems.lines``.  A key written twice in one mapping is a problem (YAML would silently
    keep the last).  A syntax error, more than ``MAX_VALUES`` values after expanding aliases
    (a "billion laughs" file), an alias inside its own anchor or nesting too deep for the
    reader raise ``FileProblems`` at once.
``FileProblems``, ``Problem``
    The error (``.file``, ``.problems`` sorted by line) and one problem.
``bracketed``, ``dotted``
    How a key path is spelled as a field: ``nodes[0].host`` or ``command.1``.

Merge keys (``<<: *defaults``, ``<<: [*a, *b]``) work as YAML 1.1 defines them, for every
file: the mapping's own keys win over merged ones, earlier merged mappings over later
ones, and a merged key's line is the line where the merged mapping defines it.

Scalars where ``verbatim(path)`` is true are kept as the text written (``PHASE: 1`` gives
``"1"``, ``FLAG: yes`` gives ``"yes"``, ``MASK: 0755`` gives ``"0755"``); a null stays None.
Elsewhere a scalar YAML cannot turn into a value (a date such as ``2024-13-01``, an integer
with thousands of digits) is kept as its text, for validation to describe.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from clusterctl.core.errors import UserError

#: Largest file read (bytes).  Inventories, jobs and target data are a few kilobytes; the
#: limit keeps a wrong path (a log, a disk image) from filling memory in the YAML reader.
MAX_BYTES = 1024 * 1024

#: Most values one document may hold once its aliases are expanded (each alias repeats all
#: the values of its anchor, so a small file can otherwise ask for billions).
MAX_VALUES = 200_000

_NULL = "tag:yaml.org,2002:null"
_MERGE = "tag:yaml.org,2002:merge"


# --------------------------------------------------------------------------- problems

def bracketed(path: tuple) -> str:
    """``nodes[0].env.NAME``: list indexes in brackets (inventories, target data)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(file)"


def dotted(path: tuple) -> str:
    """``command.1``, ``env.PHASE``: every part after a dot (job files)."""
    return ".".join(str(p) for p in path) or "(file)"


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a file, located by line and field."""

    line: int
    field: str
    problem: str
    valid: str

    def render(self, file: str) -> str:
        valid = f"; valid: {self.valid}" if self.valid else ""
        return f"{file}:{self.line}: {self.field}: {self.problem}{valid}"


class FileProblems(UserError):
    """Every problem of one file, one ``FILE:LINE: field: problem; valid: ...`` line each
    under a heading that counts them (exit status 2)."""

    what = "file"  # subclasses name the kind of file: "inventory", "job file"

    def __init__(self, file: str | os.PathLike, problems: list[Problem]) -> None:
        self.file = str(file)
        self.problems = sorted(problems, key=lambda p: p.line)
        n = len(self.problems)
        head = f"{self.file}: {n} problem{'s' if n != 1 else ''} in the {self.what} (nothing was started):"
        super().__init__("\n".join([head, *(p.render(self.file) for p in self.problems)]))


class Problems:
    """Collects the problems of one file; ``lines`` locates key paths (see the module docstring)."""

    def __init__(self, file: str | os.PathLike, *, spell: Callable[[tuple], str] = bracketed,
                 error: type[FileProblems] = FileProblems) -> None:
        self.file = str(file)
        self.spell = spell
        self.error = error
        self.lines: dict[tuple, int] = {(): 1}
        self.found: list[Problem] = []

    def line(self, path: tuple) -> int:
        """Line of the longest known prefix of ``path`` (a missing key points at its mapping)."""
        for i in range(len(path), -1, -1):
            if path[:i] in self.lines:
                return self.lines[path[:i]]
        return 1

    def add(self, where: tuple | int, problem: str, valid: str, *, field: str | None = None) -> None:
        """One problem at a key path or a line; ``field`` defaults to the path's spelling."""
        if isinstance(where, int):
            self.found.append(Problem(where, field or "(file)", problem, valid))
        else:
            self.found.append(Problem(self.line(where), field or self.spell(where), problem, valid))

    def __len__(self) -> int:
        return len(self.found)

    def raise_if_any(self) -> None:
        if self.found:
            raise self.error(self.file, self.found)


# --------------------------------------------------------------------------- reading

def read_text(path: str | os.PathLike, what: str) -> str:
    """The text of ``path`` (a ``what`` such as "inventory"): UTF-8, at most MAX_BYTES."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise UserError(f"{path}: cannot read the {what} ({e.strerror or e}); "
                        "valid: a readable UTF-8 text file") from None
    if len(data) > MAX_BYTES:
        raise UserError(f"{path}: is larger than {MAX_BYTES // 1024} KiB, far more than any {what}; "
                        f"valid: a file of at most {MAX_BYTES // 1024} KiB (is this the right file?)")
    try:
        return data.decode("utf-8-sig")  # a BOM from a Windows editor is not content
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: cannot read the {what} ({e}); valid: a readable UTF-8 text file") from None


_YAML_TOKENS = {  # PyYAML's parser tokens in a newcomer's words
    "<block end>": "the end of the indented block",
    "'<block sequence start>'": "a '-' list item indented differently from the ones above",
    "'<block mapping start>'": "a key indented differently from the ones above",
}


def _syntax_problem(e: yaml.YAMLError, like: str | None) -> Problem:
    """A YAML syntax error at the line PyYAML stopped, naming where the open construct began."""
    mark = getattr(e, "problem_mark", None)
    context_mark = getattr(e, "context_mark", None)
    what = getattr(e, "problem", None) or str(e)
    for token, plain in _YAML_TOKENS.items():
        what = what.replace(token, plain)
    context = getattr(e, "context", None)
    if context and context_mark is not None:
        what += f" ({context} that began on line {context_mark.line + 1})"
    check = "check indentation, colons, quotes and brackets on this line and the lines above"
    valid = ("indent with spaces (YAML does not allow tabs)" if "\\t" in what or "\t" in what else
             f"YAML as in {like} ({check})" if like else f"well-formed YAML ({check})")
    at = mark or context_mark
    return Problem(at.line + 1 if at else 1, "(YAML syntax)", what, valid)


def parse(text: str, problems: Problems, *, verbatim: Callable[[tuple], bool] | None = None,
          like: str | None = None) -> Any:
    """The values of the YAML document ``text`` (see the module docstring); ``like`` names a
    good file of the same kind for the syntax-error hint."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        return _Builder(loader, problems, verbatim or (lambda path: False)).build(root, ())
    except yaml.YAMLError as e:
        problems.found.append(_syntax_problem(e, like))
    except RecursionError:
        problems.add(loader.get_mark().line + 1, "lists or mappings nest deeper than clusterctl reads",
                     "a flatter file (inventories, jobs and targets need a few levels)",
                     field="(YAML syntax)")
    finally:
        loader.dispose()
    raise problems.error(problems.file, problems.found)


class _Builder:
    """Python values from a composed YAML document, recording lines and repeated keys."""

    def __init__(self, loader: yaml.SafeLoader, problems: Problems, verbatim: Callable[[tuple], bool]) -> None:
        self.loader = loader
        self.problems = problems
        self.verbatim = verbatim
        self.values = 0
        self.active: set[int] = set()  # the nodes being built (an alias inside its own anchor)
        self.checked: set[int] = set()  # mappings whose repeated keys were reported (aliases repeat them)

    def build(self, node: yaml.Node, path: tuple) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            self._refuse(node, f"holds more than {MAX_VALUES:,} values (counting every value "
                         "an alias (*name) repeats)", f"at most {MAX_VALUES:,} values; aliases that "
                         "repeat a few values, not aliases of aliases")
        self.problems.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if id(node) in self.active:
            self._refuse(node, "an alias (*name) is inside the anchor (&name) it refers to",
                         "aliases to anchors defined before them and outside them")
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
            return self._mapping(node, path)
        finally:
            self.active.discard(id(node))

    def _refuse(self, node: yaml.Node, problem: str, valid: str) -> None:
        self.problems.add(node.start_mark.line + 1, problem, valid, field="(YAML)")
        raise self.problems.error(self.problems.file, self.problems.found)

    def _scalar(self, node: yaml.ScalarNode, path: tuple) -> Any:
        if self.verbatim(path) and node.tag != _NULL:
            return node.value
        try:
            return self.loader.construct_object(node, deep=True)
        except (ValueError, OverflowError):  # e.g. a date 2024-13-01: the text, for validation to describe
            return node.value

    def _key(self, node: yaml.Node) -> Any:
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, ())
        return {} if isinstance(node, yaml.MappingNode) else []  # described as "a mapping" / "a list"

    def _mapping(self, node: yaml.MappingNode, path: tuple) -> dict:
        if id(node) not in self.checked:
            self.checked.add(id(node))
            first: dict = {}
            for k, _ in node.value:
                if k.tag == _MERGE:
                    continue
                key = self._key(k)
                if not isinstance(key, (str, int, float, bool)):
                    continue
                if key in first:
                    self.problems.add(k.start_mark.line + 1, f"is written twice (first on line {first[key]}; "
                                      "the last one would silently win)", "each key once per mapping",
                                      field=self.problems.spell(path + (key,)))
                first.setdefault(key, k.start_mark.line + 1)
        self.loader.flatten_mapping(node)  # merge keys: merged pairs first, so the mapping's own win
        out: dict = {}
        for k, v in node.value:
            key = self._key(k)
            if not isinstance(key, (str, int, float, bool)):
                self.problems.add(path, f"a key is {show(key)}", "plain text keys")
                continue
            self.problems.lines[path + (key,)] = k.start_mark.line + 1
            out[key] = self.build(v, path + (key,))
        return out


def show(value: Any) -> str:
    """A value as the user wrote it, in YAML terms (for messages)."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return str(value)
