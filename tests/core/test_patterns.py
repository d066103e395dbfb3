"""Every pattern in the source anchors its end with \\Z (or uses fullmatch), never with a
bare ``$``: ``$`` also matches before a trailing newline, so ``re.match(r"^[A-Z_]+$", "X\\n")``
accepts an env key, a --set key or a run id that ends in a newline."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "clusterctl"
_RE_CALLS = {"compile", "match", "search", "fullmatch", "sub", "split", "findall", "finditer"}


def _patterns():
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _RE_CALLS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "re" and node.args):
                first = node.args[0]
                parts = [first] if isinstance(first, ast.Constant) else (
                    [v for v in first.values if isinstance(v, ast.Constant)] if isinstance(first, ast.JoinedStr) else [])
                text = "".join(str(p.value) for p in parts)
                if text:
                    yield f"{path.relative_to(SRC)}:{node.lineno}", text


def _ends_with_bare_dollar(pattern: str) -> bool:
    """A ``$`` that is not escaped and not inside a character class, anywhere in the pattern."""
    in_class = escaped = False
    for c in pattern:
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == "[":
            in_class = True
        elif c == "]":
            in_class = False
        elif c == "$" and not in_class:
            return True
    return False


def test_the_scan_finds_patterns_and_tells_dollar_from_escaped_dollar():
    found = dict(_patterns())
    assert len(found) > 20  # the scan sees the source's patterns
    assert _ends_with_bare_dollar(r"^[A-Z]+$") and not _ends_with_bare_dollar(r"^[A-Z]+\Z")
    assert not _ends_with_bare_dollar(r"\$(?=[$(])")  # an escaped $ and a $ in a class


def test_no_pattern_ends_with_a_bare_dollar():
    bad = [f"{where}: {pattern!r}" for where, pattern in _patterns() if _ends_with_bare_dollar(pattern)]
    assert not bad, "use \\Z (or fullmatch) instead of $:\n" + "\n".join(bad)


def test_why_it_matters():
    assert re.match(r"^[A-Z_]+$", "KEY\n") and not re.match(r"^[A-Z_]+\Z", "KEY\n")
