"""The documentation's shell examples, read from the pages (pure functions) and checked.

The convention every page follows (README.md and docs/**/*.md): every fenced block of
language sh, bash, console or shell that holds a ``clusterctl`` or ``make`` command line
has, on the line directly before its fence, exactly one marker:

    <!-- doc-test: run -->                 run as written, no cluster, exit 0
    <!-- doc-test: run exit=N -->          the same, the last command exits N
    <!-- doc-test: sandbox -->             run as written against a 2-node sandbox
    <!-- doc-test: sandbox exit=N -->      the same, the last command exits N
    <!-- doc-test: parse (REASON) -->      only parsed: each clusterctl line against the real
                                           CLI, each make line names a real target
    <!-- doc-test: output -->              (a text block right after a run/sandbox block)
                                           must appear in that block's output
    <!-- doc-test: message -->             (a text block) a message as clusterctl prints it;
                                           each line must come from a string in src/clusterctl

This module parses pages into :class:`Block` s (file, line, language, marker, command
lines, the output block after it) and holds the checks the tests run: the convention
itself (:func:`scan`), a command line against the typer app's click tree
(:func:`check_cli_args`), a make line (:func:`check_make_args`), running a block
(:func:`run_block`), output containment (:func:`output_mismatch`) and messages against
the source (:func:`source_patterns`, :func:`message_mismatches`).  Parsing is pure;
running and the make check touch the machine.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

SHELL_LANGS = frozenset({"sh", "bash", "console", "shell"})
TEXT_LANGS = frozenset({"", "text", "txt", "plain", "plaintext"})
RUNNABLE = frozenset({"run", "sandbox"})

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*doc-test:(?P<body>.*?)-->\s*$")
_ANY_MARKER = re.compile(r"<!--\s*doc-test", re.IGNORECASE)
_MARKER_BODY = re.compile(r"^(?P<kind>run|sandbox)(?:\s+exit=(?P<exit>\d{1,3}))?$"
                          r"|^(?P<parse>parse)\s*(?:\((?P<reason>.*)\))?$|^(?P<plain>output|message)$"
                          r"|^file\s+(?P<path>\S+)$")
# a `file PATH` block: its text is written to PATH (relative, inside the repository copy)
# before the page's run and sandbox blocks run, so a job or inventory a page shows is used
# as written by the commands after it
_FILE_PATH = re.compile(r"^(?!/)(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9_./-]+$")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(?P<word>[A-Za-z_][A-Za-z0-9_]*)\1")
_SUBST = re.compile(r"\$\(([^()]*)\)|`([^`]*)`")
_FD_REDIRECT = re.compile(r"(?<![\w./=-])\d+(?=[<>])")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# commands that run the next word as a command (their own options skipped)
_WRAPPERS = frozenset({"sudo", "env", "time", "nohup", "exec", "command", "salloc", "srun",
                       "sbatch", "timeout", "nice", "stdbuf"})


@dataclass(frozen=True)
class Marker:
    kind: str                    # run, sandbox, parse, output, message
    line: int
    exit: int = 0
    reason: str = ""
    path: str = ""               # a `file PATH` marker's path


@dataclass(frozen=True)
class Command:
    line: int                    # the line of the page the command starts on
    text: str                    # as written: continuations joined, `$ `/`sudo ` stripped
    sudo: bool = False           # written with `sudo ` in front (a user runs it through sudo)

    @property
    def simple(self) -> list[list[str]]:
        return simple_commands(self.text)


@dataclass
class Block:
    file: str                    # path relative to the repository root
    line: int                    # the opening fence's line (1-based)
    lang: str
    body: list[str]
    marker: Marker | None = None
    end_line: int = 0            # the closing fence's line
    commands: list[Command] = field(default_factory=list)
    output: Block | None = None  # the `output` block after a run/sandbox block

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def text(self) -> str:
        return "\n".join(self.body)

    def programs(self) -> set[str]:
        """The programs of interest (clusterctl, make) its command lines run."""
        return {prog for c in self.commands for prog, _ in invocations(c.text)}


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass
class Page:
    file: str
    blocks: list[Block]
    problems: list[Problem]


# --------------------------------------------------------------------------- pages

def doc_pages(repo: Path) -> list[Path]:
    """README.md, then docs/ pages in mkdocs.yml's nav order, then any other docs/**/*.md."""
    import yaml

    pages = [repo / "README.md"] if (repo / "README.md").exists() else []
    docs = repo / "docs"
    nav: list[str] = []

    def walk(node) -> None:
        if isinstance(node, str):
            nav.append(node)
        elif isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict):
            for n in node.values():
                walk(n)

    mk = repo / "mkdocs.yml"
    if mk.exists():
        walk((yaml.safe_load(mk.read_text()) or {}).get("nav", []))
    on_disk = sorted(docs.rglob("*.md")) if docs.is_dir() else []
    ordered = [docs / p for p in nav if (docs / p) in on_disk]
    return pages + ordered + [p for p in on_disk if p not in ordered]


def parse_marker(body: str, line: int) -> Marker | str:
    """The marker of a `<!-- doc-test: BODY -->` comment, or what is wrong with it."""
    body = " ".join(body.split())
    m = _MARKER_BODY.match(body)
    if not m:
        return (f'unknown doc-test marker "{body}" (known: run, run exit=N, sandbox, '
                "sandbox exit=N, parse (REASON), output, message, file PATH)")
    if m["kind"]:
        return Marker(m["kind"], line, exit=int(m["exit"] or 0))
    if m["plain"]:
        return Marker(m["plain"], line)
    if m["path"]:
        if not _FILE_PATH.match(m["path"]):
            return (f'a "file" marker names a relative path inside the repository copy '
                    f'(letters, digits, _ . / -; no "..", not absolute), not "{m["path"]}"')
        return Marker("file", line, path=m["path"])
    reason = (m["reason"] or "").strip()
    if not reason:
        return 'a "parse" marker needs its reason in words: <!-- doc-test: parse (WHY) -->'
    return Marker("parse", line, reason=reason)


def parse_page(text: str, file: str) -> Page:
    """Every fenced block of a page with its marker and commands, and the page's problems
    with the convention (each naming FILE:LINE)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    problems: list[Problem] = []
    pending: Marker | None = None      # a marker on the line before the current one
    bad_marker_line = -1               # a marker line with a problem (already reported)
    prev_block_end = -10               # index of the last closing fence
    prev_block: Block | None = None
    i = 0
    while i < len(lines):
        raw = lines[i]
        lineno = i + 1
        fence = _FENCE.match(raw)
        if fence:
            indent, ticks = fence["indent"], fence["fence"]
            info = fence["info"].strip()
            lang = info.split()[0].strip("{}.").lower() if info else ""
            body: list[str] = []
            j = i + 1
            while j < len(lines):
                close = lines[j].strip()
                if close.startswith(ticks) and set(close) == {ticks[0]}:
                    break
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
                j += 1
            block = Block(file, lineno, lang, body, end_line=j + 1)
            marker = pending if pending and pending.line == lineno - 1 else None
            block.marker = marker
            if lang in SHELL_LANGS:
                block.commands = extract_commands(body, lineno + 1, console=(lang == "console"))
            problems += [p for p in _block_problems(block, prev_block, prev_block_end, lines)
                         if not (bad_marker_line == lineno - 1 and p.line == lineno)]
            if marker and marker.kind == "output" and prev_block and prev_block.marker \
                    and prev_block.marker.kind in RUNNABLE and _only_blank(lines, prev_block_end + 1, i - 1):
                prev_block.output = block
            blocks.append(block)
            prev_block, prev_block_end = block, j
            pending = None
            i = j + 1
            continue
        if _ANY_MARKER.search(raw):
            m = _MARKER.match(raw)
            parsed = parse_marker(m["body"], lineno) if m else \
                "a doc-test marker must be a line of its own: <!-- doc-test: KIND -->"
            if isinstance(parsed, str):
                problems.append(Problem(file, lineno, parsed))
                pending = None
                bad_marker_line = lineno
            else:
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                if not _FENCE.match(nxt):
                    problems.append(Problem(file, lineno, "a doc-test marker must be on the line directly "
                                                          "before a code fence"))
                pending = parsed
        i += 1
    return Page(file, blocks, problems)


def _only_blank(lines: list[str], start: int, stop: int) -> bool:
    """Lines[start:stop] (0-based indexes) are all blank."""
    return all(not lines[k].strip() for k in range(start, stop))


def _block_problems(block: Block, prev: Block | None, prev_end: int, lines: list[str]) -> list[Problem]:
    out: list[Problem] = []
    m = block.marker

    def problem(msg: str, line: int | None = None) -> None:
        out.append(Problem(block.file, line or block.line, msg))

    progs = block.programs()
    if block.lang in SHELL_LANGS:
        if progs and m is None:
            problem(f"this {block.lang} block has {' and '.join(sorted(progs))} command lines and no "
                    "<!-- doc-test: ... --> marker on the line before its fence (run, run exit=N, sandbox, "
                    "parse (REASON))")
        if m and m.kind in ("output", "message", "file"):
            problem(f'a "{m.kind}" marker belongs on a text (or, for file, a yaml) block, '
                    f'not a {block.lang} block', m.line)
        if m and m.kind in RUNNABLE:
            for c in block.commands:
                words = c.text.split()
                if words and (words[0] in ("cd", "export", "unset", "source", ".", "alias", "set")
                              or all(_ASSIGN.match(w) for w in words)):
                    problem(f'"{c.text}": each command line of a {m.kind} block runs in a shell of its '
                            "own, so what it sets does not reach the next line; put it on the line "
                            "that needs it (X=1 clusterctl ...)", c.line)
        if m and m.kind in RUNNABLE | {"parse"} and not block.commands:
            problem(f'a "{m.kind}" marker on a block without command lines', m.line)
    else:
        if m and m.kind in ("run", "sandbox", "parse"):
            problem(f'a "{m.kind}" marker on a {block.lang or "plain"} block: it goes on an sh, bash, '
                    "console or shell block", m.line)
        if m and m.kind in ("output", "message") and block.lang not in TEXT_LANGS:
            problem(f'a "{m.kind}" block must be a text block, not {block.lang}', m.line)
        if (m is None or m.kind not in ("output", "message")) and block.lang in TEXT_LANGS:
            for k, ln in enumerate(block.body):
                s = ln.strip()
                if s.startswith("$ "):
                    progs = {p for p, _ in invocations(s[2:])}
                    if progs:
                        problem(f"a transcript with a {'/'.join(sorted(progs))} command line "
                                f"({s[:60]}) in a {'plain' if not block.lang else block.lang} block: make "
                                "it a console block with a doc-test marker", block.line + 1 + k)
                        break
    if m and m.kind == "output":
        ok = (prev is not None and prev.marker is not None and prev.marker.kind in RUNNABLE
              and _only_blank(lines, prev_end + 1, m.line - 1))
        if not ok:
            problem('an "output" block must come right after a run or sandbox block (only blank lines '
                    "between that block's closing fence and the marker)", m.line)
    return out


def extract_commands(body: list[str], first_line: int, *, console: bool = False) -> list[Command]:
    """The command lines of a shell block: comments and blank lines dropped, `\\`
    continuations joined, heredocs kept with their command, `$ ` and `sudo ` stripped.
    In a console block with `$ ` prompts only prompted lines are commands (the rest is output)."""
    prompted = console and any(ln.lstrip().startswith("$ ") or ln.strip() == "$" for ln in body)
    out: list[Command] = []
    i = 0
    while i < len(body):
        line = body[i].strip()
        start = i
        i += 1
        if prompted:
            if not line.startswith("$"):
                continue
            line = line[1:].strip()
        if not line or line.startswith("#"):
            continue
        parts = [line]
        while parts[-1].endswith("\\") and i < len(body):
            parts[-1] = parts[-1][:-1].rstrip()
            nxt = body[i].strip()
            if prompted and nxt.startswith("> "):
                nxt = nxt[2:]
            parts.append(nxt)
            i += 1
        text = " ".join(p for p in parts if p)
        heredoc = _HEREDOC.search(_strip_quoted(text))
        if heredoc:
            doc = []
            while i < len(body) and body[i].strip() != heredoc["word"]:
                doc.append(body[i])
                i += 1
            text = "\n".join([text, *doc, heredoc["word"]])
            i += 1
        stripped = strip_prefixes(text)
        if stripped:
            out.append(Command(first_line + start, stripped, sudo=_sudo_first(text)))
    return out


def strip_prefixes(text: str) -> str:
    """`$ ` prompts and `sudo ` (with its options) in front of a command line go."""
    while True:
        t = text.lstrip()
        if t.startswith("$ "):
            text = t[2:]
        elif t.startswith("sudo "):
            rest = t[5:].lstrip()
            while rest.startswith("-") and " " in rest:     # sudo -E, sudo -H ...
                rest = rest.split(" ", 1)[1].lstrip()
            text = rest
        else:
            return t


def _sudo_first(text: str) -> bool:
    """Whether the command line starts with `sudo` (after any `$ ` prompt)."""
    t = text.lstrip()
    while t.startswith("$ "):
        t = t[2:].lstrip()
    return t.startswith("sudo ")


def _strip_quoted(text: str) -> str:
    return re.sub(r"'[^']*'|\"[^\"]*\"", "''", text)


# --------------------------------------------------------------------------- command lines

def simple_commands(text: str) -> list[list[str]]:
    """The simple commands of a command line, as argv lists: pipes, &&, ||, ; split it,
    redirections go, $(...) and `...` are their own commands (and one word, SUBST, where
    they stood), heredoc bodies are not commands, comments go."""
    first = text.split("\n", 1)[0]
    inner: list[list[str]] = []

    def sub(m: re.Match) -> str:
        inner.extend(simple_commands(m.group(1) if m.group(1) is not None else m.group(2)))
        return "SUBST"

    first = _SUBST.sub(sub, first)
    first = _FD_REDIRECT.sub("", first)
    try:
        lex = shlex.shlex(first, posix=True, punctuation_chars=";&|<>")
        lex.whitespace_split = True
        tokens = list(lex)
    except ValueError:          # unbalanced quotes: the words as they are
        tokens = first.split()
    cmds: list[list[str]] = [[]]
    skip = False
    for tok in tokens:
        if skip:
            skip = False
            continue
        if tok and set(tok) <= set(";&|"):
            cmds.append([])
        elif tok and set(tok) <= set("<>&"):
            skip = True           # the redirection's target
        else:
            cmds[-1].append(tok)
    return [c for c in cmds if c] + inner


def invocation(argv: list[str]) -> tuple[str, list[str]] | None:
    """("clusterctl", args) or ("make", args) when the simple command runs one of them
    (after VAR=value words and wrappers such as sudo, env, time, salloc), else None."""
    words = list(argv)
    while words and _ASSIGN.match(words[0]):
        words.pop(0)
    if words and Path(words[0]).name in _WRAPPERS:
        for k, w in enumerate(words):
            if Path(w).name in ("clusterctl", "make"):
                words = words[k:]
                break
        else:
            return None
    if not words:
        return None
    prog = Path(words[0]).name
    if prog in ("clusterctl", "make") and (prog == words[0] or "/" in words[0]):
        return prog, words[1:]
    return None


def invocations(text: str) -> list[tuple[str, list[str]]]:
    return [inv for argv in simple_commands(text) if (inv := invocation(argv))]


# --------------------------------------------------------------------------- the parse check

@lru_cache(maxsize=1)
def cli_root():
    """The typer app's click command tree (typer >= 0.29 vendors click: nothing from `click`)."""
    import typer

    from clusterctl.cli import app

    return typer.main.get_command(app)


def _usage_error():
    import typer

    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def check_cli_args(args: list[str]) -> str | None:
    """None when `clusterctl ARGS` names a real command whose options and arguments parse
    (click's own make_context, resilient_parsing off); else click's message."""
    import typer

    usage_error = _usage_error()
    root = cli_root()
    args = list(args)
    # typer's eager completion option would install a completion script: check it by name only
    if "--install-completion" in args:
        if not any("--install-completion" in p.opts for p in root.params):
            return "no such option: --install-completion"
        args.remove("--install-completion")
        if not args:
            return None
    cmd, name, ctx = root, "clusterctl", None
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            while True:
                ctx = cmd.make_context(name, args, parent=ctx, resilient_parsing=False)
                if not hasattr(cmd, "resolve_command"):
                    return None
                rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
                if not rest:
                    return None
                name, sub, args = cmd.resolve_command(ctx, rest)
                if sub is None:
                    return f'no such command "{rest[0]}"'
                cmd = sub
    except typer.Exit as e:
        return None if e.exit_code == 0 else f"exits {e.exit_code} while parsing"
    except SystemExit as e:         # typer's completion callbacks end with sys.exit(0)
        return None if e.code in (0, None) else f"exits {e.code} while parsing"
    except usage_error as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            return None
        where = f" (in `{e.ctx.command_path}`)" if getattr(e, "ctx", None) else ""
        return f"{e.format_message()}{where}"


def check_make_args(args: list[str], repo: Path) -> str | None:
    """None when `make -n ARGS` succeeds in the repository (every target exists); nothing runs."""
    res = subprocess.run(["make", "-n", *args], cwd=repo, capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    if res.returncode == 0:
        return None
    return f"`make -n {' '.join(args)}` exits {res.returncode}: {(res.stderr or res.stdout).strip()[-300:]}"


def parse_failures(block: Block, repo: Path) -> list[str]:
    """Every clusterctl line of the block that does not parse, every make line whose target
    does not exist, as FILE:LINE: ... ."""
    bad = []
    for c in block.commands:
        for prog, args in invocations(c.text):
            why = check_cli_args(args) if prog == "clusterctl" else check_make_args(args, repo)
            if why:
                bad.append(f"{block.file}:{c.line}: `{prog} {shlex.join(args)}`: {why}")
    return bad


# --------------------------------------------------------------------------- running

@dataclass
class Ran:
    command: Command
    status: int | None           # None: timed out
    output: str
    seconds: float


def run_command(cmd: Command, cwd: Path, env: dict[str, str], timeout: float, *,
                as_user: Sequence[str] = ()) -> Ran:
    """`bash -c TEXT`, stdout and stderr merged, in its own process group (killed whole on timeout).
    ``as_user``: the argv that runs it as another user (``setpriv --reuid ...``), who runs a
    line written with `sudo` through sudo (root runs it without)."""
    t0 = time.monotonic()
    text = f"sudo {cmd.text}" if as_user and cmd.sudo else cmd.text
    proc = subprocess.Popen([*as_user, "bash", "-c", text], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        data, _ = proc.communicate(timeout=timeout)
        status: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        data, _ = proc.communicate()
        status = None
    return Ran(cmd, status, _ANSI.sub("", data.decode(errors="replace")), time.monotonic() - t0)


def run_block(block: Block, cwd: Path, env: dict[str, str], timeout: float = 60, *,
              as_user: Sequence[str] = ()) -> tuple[list[Ran], str | None]:
    """Run the block's command lines in order, each with its own `bash -c`; stop at the first
    unexpected status (earlier lines 0, the last one the marker's exit). Returns what ran and
    None, or what went wrong (naming FILE:LINE), output check included."""
    expected_last = block.marker.exit if block.marker else 0
    ran: list[Ran] = []
    for k, cmd in enumerate(block.commands):
        r = run_command(cmd, cwd, env, timeout, as_user=as_user)
        ran.append(r)
        want = expected_last if k == len(block.commands) - 1 else 0
        if r.status != want:
            got = f"ran past its {timeout:.0f} s" if r.status is None else f"exited {r.status}"
            return ran, (f"{block.file}:{cmd.line}: `{cmd.text}` {got}, expected exit {want}; "
                         f"its output:\n{r.output[-3000:]}")
    if block.output is not None:
        why = output_mismatch("".join(r.output for r in ran), block.output.text)
        if why:
            return ran, f"{block.output.id}: the output block does not match what the commands printed: {why}"
    return ran, None


def normalize_lines(text: str) -> list[str]:
    return [" ".join(ln.split()) for ln in _ANSI.sub("", text).splitlines() if ln.strip()]


def output_mismatch(output: str, expected: str) -> str | None:
    """None when the expected lines appear in the output in order (whitespace-normalized; runs
    of lines between `...` lines contiguous; a `...` line matches any lines); else why not."""
    have = normalize_lines(output)
    segments: list[list[str]] = [[]]
    for ln in normalize_lines(expected):
        if ln == "...":
            segments.append([])
        else:
            segments[-1].append(ln)
    pos = 0
    for seg in (s for s in segments if s):
        found = next((k for k in range(pos, len(have) - len(seg) + 1) if have[k:k + len(seg)] == seg), None)
        if found is None:
            return ("these lines are not in the output (in this order, after the previous part):\n  "
                    + "\n  ".join(seg) + "\n--- output ---\n" + "\n".join(have[-60:]))
        pos = found + len(seg)
    return None


# --------------------------------------------------------------------------- messages

_MARKUP = re.compile(r"\[/?(?:bold|dim|italic|underline|reverse|strike|blink|red|green|yellow|blue|"
                     r"magenta|cyan|white|black|b|i|u)(?: [a-z_ ]+)?\]|\[/\]")
#: a field of an f-string that holds at most this many words may stand for any value
VALUE_WORDS = 3
#: at least this share of a message line's words must be source text (the rest: values)
MIN_LITERAL_SHARE = 0.5


@dataclass(frozen=True)
class SourceString:
    where: str                   # file:line in src/
    pieces: tuple[str | None, ...]   # literal text, None for a formatted field
    regex: re.Pattern = field(compare=False, hash=False, repr=False)
    anchor: str = ""             # its longest literal piece (normalized), for a quick filter
    literal: int = 0             # literal characters (non-space)


def _pieces(node: ast.AST) -> list[str | None] | None:
    """The literal pieces and fields of a string expression: a constant, an f-string, `+`
    of strings, "...".format(...), "..." % (...); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        out: list[str | None] = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value))
            else:
                out.append(None)
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _pieces(node.left), _pieces(node.right)
        if left is None and right is None:
            return None
        return (left or [None]) + (right or [None])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and \
            isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
        return _interleave(re.split(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfgxi]", node.left.value))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
            and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str):
        return _interleave(re.split(r"\{[^{}]*\}", node.func.value.value))
    return None


def _interleave(literals: list[str]) -> list[str | None]:
    out: list[str | None] = []
    for k, lit in enumerate(literals):
        if k:
            out.append(None)
        out.append(lit)
    return out


def _string_nodes(tree: ast.AST):
    """String expressions of a module, outermost only (an f-string's parts are not
    strings of their own), docstrings left out."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    seen: set[int] = set()

    def visit(node: ast.AST) -> None:
        if id(node) in docstrings:
            return
        pieces = _pieces(node) if id(node) not in seen else None
        if pieces is not None and any(isinstance(p, str) and p.strip() for p in pieces):
            yield_list.append((node, pieces))
            for sub in ast.walk(node):
                seen.add(id(sub))
            # fields of an f-string may hold strings of their own (conditional texts)
            for sub in ast.walk(node):
                if isinstance(sub, ast.FormattedValue):
                    visit(sub.value)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    yield_list: list = []
    visit(tree)
    return yield_list


def _compile(pieces: list[str | None]) -> tuple[re.Pattern, str, int] | None:
    parts: list[str] = []
    literal = 0
    anchor = ""
    for p in pieces:
        if p is None:
            if not parts or parts[-1] != "(?P<f>)":
                parts.append("(?P<f>)")
            continue
        n = _MARKUP.sub("", p)
        if not n.strip():
            if n and parts and parts[-1] != " ":
                parts.append(" ")
            continue
        lead, trail = n[:1].isspace(), n[-1:].isspace()
        n = " ".join(n.split())
        if lead:
            parts.append(" ")
        parts.append(n)
        if trail:
            parts.append(" ")
        literal += len(n.replace(" ", ""))
        if len(n) > len(anchor):
            anchor = n
    if literal == 0:
        return None
    rx, k = [], 0
    for p in parts:
        if p == "(?P<f>)":
            rx.append(f"(?P<f{k}>.*?)")
            k += 1
        elif p == " ":
            rx.append(r"\s*")
        else:
            rx.append(re.escape(p))
    try:
        return re.compile(r"\s*" + "".join(rx) + r"\s*", re.DOTALL), anchor, literal
    except re.error:
        return None


def source_patterns(src: Path) -> list[SourceString]:
    """Every string of src/ (constants, f-strings with their fields as wildcards, `+`,
    .format and % of literals), split at newlines into line patterns."""
    found: list[SourceString] = []
    for path in sorted(src.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(), str(path))
        except SyntaxError:
            continue
        for node, pieces in _string_nodes(tree):
            # one pattern per line of a multi-line string
            lines: list[list[str | None]] = [[]]
            for p in pieces:
                if p is None:
                    lines[-1].append(None)
                    continue
                chunks = p.split("\n")
                lines[-1].append(chunks[0])
                for c in chunks[1:]:
                    lines.append([c])
            for ln in lines:
                compiled = _compile(ln)
                if compiled:
                    rx, anchor, literal = compiled
                    found.append(SourceString(f"{path.relative_to(src.parent)}:{node.lineno}", tuple(ln),
                                              rx, anchor, literal))
    return found


class _Matcher:
    def __init__(self, patterns: list[SourceString]):
        self.patterns = patterns
        self.memo: dict[tuple[str, int], int | None] = {}   # (string, depth): a depth cuts the search
        self.active: set[str] = set()   # strings being read now (a cycle back to one is cut)
        self.cut = False                # a cycle was cut while reading the current string

    def literal_cover(self, s: str, depth: int = 0) -> int | None:
        """How many words of ``s`` are source text (the best way to read it), or None when
        ``s`` cannot be made from one source string whose fields hold values (at most
        VALUE_WORDS words, or a `...` the doc leaves out) or, recursively, other source
        strings; at every level at least MIN_LITERAL_SHARE of the words must be source text."""
        s = " ".join(s.split())
        if (s, depth) in self.memo:
            return self.memo[(s, depth)]
        if s in self.active:      # no cycles; what was read under a cut cycle is not memoised
            self.cut = True
            return None
        self.active.add(s)
        outer_cut, self.cut = self.cut, False
        words = len(s.split())
        best: int | None = None
        if depth < 6:
            for p in self.patterns:
                if p.anchor not in s:
                    continue
                m = p.regex.fullmatch(s)
                if not m:
                    continue
                literal: int | None = words
                for value in m.groupdict().values():
                    n = len(value.split())
                    if n <= VALUE_WORDS:
                        literal -= n       # a value (or one the doc leaves out)
                        continue
                    inner = self.literal_cover(value, depth + 1)
                    if inner is None:
                        literal = None
                        break
                    literal -= n - inner
                if literal is not None and literal >= MIN_LITERAL_SHARE * words and \
                        (best is None or literal > best):
                    best = literal
        self.active.discard(s)
        if not self.cut:
            self.memo[(s, depth)] = best
        self.cut = outer_cut or self.cut
        return best


def message_mismatches(text: str, patterns: list[SourceString]) -> list[str]:
    """The lines of a doc message that no source string (with the doc's values standing
    for its fields) accounts for. A line `...` matches anything; `...` inside a line stands
    for one value the doc leaves out."""
    matcher = _Matcher(patterns)
    bad = []
    for raw in text.splitlines():
        line = " ".join(raw.split())
        if not line or line == "...":
            continue
        if matcher.literal_cover(line) is None:
            bad.append(line)
    return bad


# --------------------------------------------------------------------------- file blocks

def file_blocks(blocks: list[Block]) -> list[Block]:
    """The `file PATH` blocks among ``blocks``, in page order."""
    return [b for b in blocks if b.marker and b.marker.kind == "file"]


def write_files(blocks: list[Block], root: Path) -> None:
    """Write every `file PATH` block's text to root/PATH (a later block of the same path wins)."""
    for b in file_blocks(blocks):
        target = root / b.marker.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(b.text + "\n")
