"""Control characters in values that came from a user: found at validation, named safely.

One job: say whether a value holds a character no name, address, path or one-line field
may hold (NUL, escape sequences, other C0/C1 controls, DEL), and describe it without
printing it (an ESC echoed into a terminal would act there).  Pure.

Contract:

``control_problem(value, *, multiline=False)``
    ``None``, or why the value is refused: ``"contains a NUL character (\\x00)"``,
    ``"contains a control character (\\x1b)"``, ``"contains a line break (\\n)"``.
    ``multiline=True`` allows tab and line feed (free text: an env value, a command
    argument); everything else that is a control character is refused.
``escaped(value)``
    The value with every control character written as a Python escape (``\\x1b``), for
    messages that quote a value.
"""

from __future__ import annotations

import re

_ANY = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_BUT_TAB_LF = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def control_problem(value: str, *, multiline: bool = False) -> str | None:
    """Why ``value`` holds a character it may not (see the module docstring), or None."""
    m = (_BUT_TAB_LF if multiline else _ANY).search(value)
    if m is None:
        return None
    c = m.group()
    code = repr(c)[1:-1]
    if c == "\0":
        return f"contains a NUL character ({code})"
    if c in "\n\r":
        return f"contains a line break ({code})"
    if c == "\t":
        return f"contains a tab ({code})"
    return f"contains a control character ({code})"


def escaped(value: str) -> str:
    """``value`` with control characters shown as escapes (safe to print)."""
    return _ANY.sub(lambda m: repr(m.group())[1:-1], value)
