"""clusterctl's own YAML files (inventories, job specs, target data): read them, and report
every problem in them at once.

One job: turn a YAML text into plain Python values that remember the line of every key,
and collect what is wrong with such a file so that a newcomer can fix it in one pass.
Every problem is shown as ``FILE:LINE: field: problem; valid: ...`` (one line each, sorted
by line) under one ``FileProblems`` error, a ``UserError`` (exit status 2).  Pure: no
clusterctl imports but ``core.errors`` and ``core.text``; the only file access is ``read_text``.

Contract (what other modules call):

``read_text(path, what, limit=MAX_BYTES)``
    The text of a file (UTF-8, a leading BOM dropped); a ``UserError`` naming the file when it
    cannot be read or is larger than ``limit`` bytes (the limit is in the message).
``Problems(file, spell=bracketed, error=FileProblems)``
    The collector of one file.  ``problems.lines`` maps a key path (a tuple such as
    ``("nodes", 0, "host")``; ``()`` is the file) to its 1-based line.
    ``add(where, problem, valid, field=None)`` records one problem at a key path (on the line
    of its longest known prefix: a missing key points at its mapping) or at a line number;
    ``raise_if_any()`` raises ``error(file, problems)``.
``parse(text, problems, verbatim=None, like=None, max_values=MAX_VALUES)``
    The document's values (None for an empty file), recording each key's line in
    ``problems.lines``.  A key written twice in one mapping is a problem (YAML would silently
    keep the last).  A syntax error, more than ``max_values`` values after expanding aliases
    (a "billion laughs" file, also through merge keys), an alias inside its own anchor or
    lists and mappings nested more than ``MAX_DEPTH`` levels (counting what aliases bring)
    raise ``FileProblems`` at once, naming the line and the limit.  These limits are checked
    while the text is read (libyaml's parser where PyYAML has it, and a composer without
    recursion), before any value is built, so memory stays proportional to the text.
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
from pydantic import BaseModel, ValidationError

from clusterctl.core.errors import UserError
from clusterctl.core.files import TooLarge, read_input
from clusterctl.core.text import escaped

#: Largest file read by default (bytes).  Jobs and target data are a few kilobytes; the
#: limit keeps a wrong path (a log, a disk image) from filling memory in the YAML reader.
#: Inventories pass a larger limit of their own (a 100,000-node cluster is a few MB).
MAX_BYTES = 1024 * 1024

#: Most values one document may hold once its aliases are expanded (each alias repeats all
#: the values of its anchor, so a small file can otherwise ask for billions).  Counted while
#: the file is read, before any value is built: memory stays proportional to the text.
MAX_VALUES = 1_000_000

#: Deepest nesting of lists and mappings, counting the levels aliases bring (inventories,
#: jobs and target data need four or five).  Each list or mapping is one level, a scalar
#: none: ``a: [1]`` is two levels.  Checked on each event while the text is read, so a file
#: nested thousands deep is refused at the line of its first list or mapping too many, in
#: time proportional to the text read up to there, and no reader recurses deeper than this.
MAX_DEPTH = 64

#: Most text (bytes, up to the line after a syntax error) parsed again by PyYAML's
#: pure-Python parser for its plainer words (see ``_plain_error``): that parser takes about
#: 6 s per MB, so an error deeper in a large file keeps libyaml's words instead.
PLAIN_WORDS_BYTES = 32 * 1024

#: Most problems one message lists (the heading still counts them all).
MAX_SHOWN = 100

_NULL = "tag:yaml.org,2002:null"
_MERGE = "tag:yaml.org,2002:merge"


# --------------------------------------------------------------------------- problems

def bracketed(path: tuple) -> str:
    """``nodes[0].env.NAME``: list indexes in brackets (inventories, target data)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{escaped(str(part))}" if out else escaped(str(part)))
    return out or "(file)"


def dotted(path: tuple) -> str:
    """``command.1``, ``env.PHASE``: every part after a dot (job files)."""
    return ".".join(escaped(str(p)) for p in path) or "(file)"


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
        self.file = escaped(str(file))      # a file's name may hold a line break or an escape
        self.problems = sorted(problems, key=lambda p: p.line)
        n = len(self.problems)
        head = f"{self.file}: {n:,} problem{'s' if n != 1 else ''} in the {self.what} (nothing was started):"
        shown = [p.render(self.file) for p in self.problems[:MAX_SHOWN]]
        if n > MAX_SHOWN:  # a 100,000-node file with one mistake repeated is not a 100,000-line message
            shown.append(f"{self.file}: ... and {n - MAX_SHOWN:,} more problems after line "
                         f"{self.problems[MAX_SHOWN - 1].line} (fix these first)")
        super().__init__("\n".join([head, *shown]))


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

def read_text(path: str | os.PathLike, what: str, *, limit: int = MAX_BYTES) -> str:
    """The text of ``path`` (a ``what`` such as "inventory"): UTF-8, at most ``limit`` bytes."""
    try:  # a regular file only (a FIFO is never waited on), never more than limit read
        data = read_input(path, f"the {what}", limit=limit, valid="a readable UTF-8 text file")
    except FileNotFoundError as e:
        raise UserError(f"{path}: cannot read the {what} ({e.strerror or e}); "
                        "valid: a readable UTF-8 text file") from None
    except TooLarge:
        data = None
    if data is None:
        raise UserError(f"{path}: is larger than {limit // 1024} KiB, far more than any {what}; "
                        f"valid: a file of at most {limit // 1024} KiB (is this the right file?)")
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
          like: str | None = None, max_values: int | None = None) -> Any:
    """The values of the YAML document ``text`` (see the module docstring); ``like`` names a
    good file of the same kind for the syntax-error hint; ``max_values`` (default
    ``MAX_VALUES``) bounds the values the document may hold once its aliases are expanded."""
    limits = _Limits(max_values or MAX_VALUES, MAX_DEPTH)
    try:
        root, loader = _compose_fast(text, problems, limits)
        if root is None:
            return None
        return _Builder(loader, problems, verbatim or (lambda path: False)).build(root, ())
    except yaml.YAMLError as e:
        _refuse_if_too_deep_for_libyaml(text, e, problems, limits)
        problems.found.append(_syntax_problem(_plain_error(text, e), like))
    except RecursionError:  # not expected (depth is bounded before building): a message, never a traceback
        problems.add(1, f"lists or mappings nest deeper than clusterctl reads (at most {MAX_DEPTH} levels)",
                     "a flatter file (inventories, jobs and targets need a few levels)", field="(YAML)")
    raise problems.error(problems.file, problems.found)


# --------------------------------------------------------------------------- composing

@dataclass(frozen=True)
class _Limits:
    values: int
    depth: int


class _Open:
    """A collection being composed: its node, its expanded size and depth so far."""

    __slots__ = ("node", "size", "depth", "anchor", "key")

    def __init__(self, node: yaml.Node, anchor: str | None) -> None:
        self.node, self.size, self.depth, self.anchor, self.key = node, 1, 1, anchor, None


_OPEN_ANCHOR = object()  # an anchor whose node is still being composed


def _compose_fast(text: str, problems: Problems, limits: _Limits) -> tuple[yaml.Node | None, Any]:
    """The document's node graph, parsed by libyaml where PyYAML has it (the pure-Python
    parser otherwise), and the loader whose constructor builds values from it."""
    loader = _FastLoader(text)
    try:
        return _compose(loader, problems, limits), loader
    finally:
        loader.dispose()


def _compose(loader: Any, problems: Problems, limits: _Limits) -> yaml.Node | None:
    """PyYAML's composer without recursion and with limits: every node's size and depth are
    counted as if its aliases were expanded (an alias adds the size of its anchor's node,
    known once that node is complete), so a document that would expand past ``limits.values``
    values or nest past ``limits.depth`` levels is refused as soon as it is read that far, in
    memory proportional to what was read (each value of the text is one node; aliases add none).
    A node's depth counts lists and mappings (a scalar is 0, an empty list 1); a list or
    mapping written too deep is refused at its start event, so only an alias can make a
    completed node too deep for its parent.
    """
    def refuse(mark: Any, problem: str, valid: str) -> None:
        problems.add(mark.line + 1, problem, valid, field="(YAML)")
        raise problems.error(problems.file, problems.found)

    loader.get_event()  # stream start
    if loader.check_event(yaml.StreamEndEvent):
        loader.get_event()
        return None
    start = loader.get_event()  # document start
    anchors: dict[str, Any] = {}
    stack: list[_Open] = []
    resolve, scalar_event, alias_event = loader.resolve, yaml.ScalarEvent, yaml.AliasEvent
    sequence_start, mapping_start = yaml.SequenceStartEvent, yaml.MappingStartEvent
    ScalarNode, SequenceNode, MappingNode = yaml.ScalarNode, yaml.SequenceNode, yaml.MappingNode
    max_values, max_depth = limits.values, limits.depth
    while True:
        event = loader.get_event()
        kind = type(event)
        if kind is scalar_event:
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolve(ScalarNode, event.value, event.implicit)
            node, size, depth = ScalarNode(tag, event.value, event.start_mark, None, event.style), 1, 0
            if event.anchor is not None:
                anchors[event.anchor] = (node, size, depth)
        elif kind is sequence_start or kind is mapping_start:
            cls = SequenceNode if kind is sequence_start else MappingNode
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolve(cls, None, event.implicit)
            if len(stack) + 1 > max_depth:
                refuse(event.start_mark, f"lists or mappings nest deeper than {max_depth} levels",
                       f"at most {max_depth} levels (inventories, jobs and targets need a few)")
            stack.append(_Open(cls(tag, [], event.start_mark, None, event.flow_style), event.anchor))
            if event.anchor is not None:
                anchors[event.anchor] = _OPEN_ANCHOR
            continue
        elif kind is alias_event:
            found = anchors.get(event.anchor)
            if found is None:
                raise yaml.composer.ComposerError(None, None, f"found undefined alias {event.anchor!r}",
                                                  event.start_mark)
            if found is _OPEN_ANCHOR:
                refuse(event.start_mark, "an alias (*name) is inside the anchor (&name) it refers to",
                       "aliases to anchors defined before them and outside them")
            node, size, depth = found
        else:  # the end of a sequence or mapping
            done = stack.pop()
            node, size, depth = done.node, done.size, done.depth
            if done.anchor is not None:
                anchors[done.anchor] = (node, size, depth)
        if not stack:
            break
        parent = stack[-1]
        parent.size += size
        if depth >= parent.depth:
            parent.depth = depth + 1
            if parent.depth + len(stack) - 1 > max_depth:
                refuse(event.start_mark, f"lists or mappings nest deeper than {max_depth} levels "
                       "(counting the levels an alias (*name) brings)",
                       f"at most {max_depth} levels (inventories, jobs and targets need a few)")
        if parent.size > max_values:
            refuse(event.start_mark, f"holds more than {max_values:,} values (counting every value "
                   "an alias (*name) repeats)", f"at most {max_values:,} values; aliases that "
                   "repeat a few values, not aliases of aliases")
        if parent.key is not None:
            parent.node.value.append((parent.key, node))
            parent.key = None
        elif parent.node.__class__ is MappingNode:
            parent.key = node
        else:
            parent.node.value.append(node)
    loader.get_event()  # document end
    if not loader.check_event(yaml.StreamEndEvent):
        event = loader.get_event()
        raise yaml.composer.ComposerError("expected a single document in the stream", start.start_mark,
                                          "but found another document", event.start_mark)
    return node


_FastLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: libyaml's words when a file nests past its own limit (1,000 levels; the libyaml in
#: PyYAML 6.0.4 and newer wheels), in flow or block collections.
_LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"


def _refuse_if_too_deep_for_libyaml(text: str, error: yaml.YAMLError, problems: Problems,
                                    limits: _Limits) -> None:
    """Refuse a file libyaml stopped at its own nesting limit with clusterctl's words and line.

    libyaml's scanner looks ahead up to 1,024 characters on a line (a ``[`` may be a key), so
    ``[[[[...`` reaches libyaml's limit before the composer has seen the level too many.  The
    text before the point libyaml stopped at is composed again, by libyaml (it holds fewer
    levels than libyaml's limit, more than ``limits.depth``), so the composer refuses it at the
    line of its level too many, as with a libyaml that has no limit of its own.  The
    pure-Python parser never reads it: its time grows with the depth (13 s for 5,000 levels).
    Returns when ``error`` is not libyaml's nesting limit."""
    mark = getattr(error, "problem_mark", None)
    if getattr(error, "problem", None) != _LIBYAML_TOO_DEEP or mark is None:
        return
    try:
        _compose_fast(text[:mark.index], problems, limits)  # raises FileProblems at the level too many
    except yaml.YAMLError:
        pass
    # not refused before libyaml's limit (not expected): its line, in clusterctl's words
    problems.add(mark.line + 1, f"lists or mappings nest deeper than {limits.depth} levels",
                 f"at most {limits.depth} levels (inventories, jobs and targets need a few)", field="(YAML)")
    raise problems.error(problems.file, problems.found)


def _plain_error(text: str, error: yaml.YAMLError) -> yaml.YAMLError:
    """The same syntax error in the words of PyYAML's pure-Python parser, which names the
    construct it was reading (libyaml's words are terser).  Only the text up to the line
    after the error is parsed again, and only when that is at most ``PLAIN_WORDS_BYTES``, so
    a syntax error costs a few tenths of a second at most, wherever it is in a large file."""
    if _FastLoader is yaml.SafeLoader:
        return error
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if mark is None:
        return error
    end = -1
    for _ in range(mark.line + 2):
        end = text.find("\n", end + 1)
        if end < 0:
            end = len(text)
            break
    if end + 1 > PLAIN_WORDS_BYTES:  # linear, but slow in pure Python: libyaml's words will do
        return error
    loader = yaml.SafeLoader(text[:end + 1])
    try:
        while loader.check_event():
            loader.get_event()
    except yaml.YAMLError as plain:
        plain_mark = getattr(plain, "problem_mark", None) or getattr(plain, "context_mark", None)
        if plain_mark is not None and plain_mark.line <= mark.line + 1:
            return plain
    finally:
        loader.dispose()
    return error


class _Builder:
    """Python values from a composed YAML document, recording lines and repeated keys."""

    def __init__(self, loader: yaml.SafeLoader, problems: Problems, verbatim: Callable[[tuple], bool]) -> None:
        self.loader = loader
        self.problems = problems
        self.verbatim = verbatim
        self.active: set[int] = set()  # the nodes being built (an alias inside its own anchor)
        self.checked: set[int] = set()  # mappings whose repeated keys were reported (aliases repeat them)

    def build(self, node: yaml.Node, path: tuple) -> Any:
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
        return f'"{escaped(value)}"'  # a control character is shown as \x1b, never sent to the terminal
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return escaped(str(value))  # a path holding a NUL or an escape sequence is shown escaped


def validate_model(model: type[BaseModel], data: Any, where: tuple, problems: Problems) -> Any:
    """``model`` from ``data`` at key path ``where``, or None with each pydantic error a problem."""
    valid = f"the fields described at the top of {os.path.basename(problems.file)}"
    if not isinstance(data, dict):
        problems.add(where, f"{show(data)} is not a mapping", f"a mapping with {valid}")
        return None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        for e in err.errors():
            loc = where + tuple(p for p in e["loc"] if p != "[key]")
            if e["type"] == "missing":
                problem = "is missing"
            elif e["type"] == "extra_forbidden":
                problem = f'unknown field "{loc[-1]}"'
            else:
                msg = e["msg"].removeprefix("Value error, ")
                problem = f"{msg[:1].lower()}{msg[1:]} (got {show(e['input'])})"
            problems.add(loc, problem, valid)
        return None
