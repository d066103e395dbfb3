"""Control characters in values that came from a user: found at validation, named safely.

One job: say whether a value holds a character no name, address, path or one-line field
may hold (NUL, escape sequences, other C0/C1 controls, DEL, and the invisible characters
that reorder or hide text: bidi overrides and isolates, zero-width space, BOM), and describe
it without printing it (an ESC echoed into a terminal would act there).  Pure.

Contract:

``control_problem(value, *, multiline=False)``
    ``None``, or why the value is refused: ``"contains a NUL character (\\x00)"``,
    ``"contains a control character (\\x1b)"``, ``"contains a line break (\\n)"``.
    ``multiline=True`` allows tab and line feed (free text: an env value, a command
    argument); everything else that is a control character is refused.
``escaped(value)``
    The value with every control character written as a Python escape (``\\x1b``), for
    messages that quote a value.
``without_credentials(value)``
    The value with the credential of a URL or a registry reference masked:
    ``https://user:pass@host/x`` -> ``https://****@host/x``, ``user:pass@host:5000/x:1`` ->
    ``****@host:5000/x:1``; a digest (``repo@sha256:...``) and ``user@host`` stay.
``shown(value, limit=SHOWN_MAX)``
    How a refusal quotes a value it was given or read back: credentials masked, control
    characters escaped, quoted (``repr``), and cut at ``limit`` characters with the length
    said, so no input, however long or hostile, reaches a terminal or a log whole.  Every
    message quoting untrusted input goes through it.
"""

from __future__ import annotations

import re

# C0, DEL, C1, and the invisible characters that reorder or hide text on a terminal (bidi
# embeddings, overrides and isolates, LRM/RLM, the zero-width space, the BOM: "Trojan Source")
_FORMAT = "\u200b\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff"
_ANY = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_FORMAT}]")
_BUT_TAB_LF = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_FORMAT}]")


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


def digits(value: str) -> bool:
    """Whether ``value`` is a whole number in ASCII digits: ``str.isdigit`` is true for '²'
    (which ``int`` refuses) and for '３' (which ``int`` takes, and docker, sbatch and torchrun
    would not)."""
    return value.isascii() and value.isdigit()


def escaped(value: str) -> str:
    """``value`` with control characters shown as escapes (safe to print)."""
    return _ANY.sub(lambda m: repr(m.group())[1:-1], value)


#: The most characters of a value a message quotes; the rest is cut and its length said.
SHOWN_MAX = 120
# userinfo after a scheme (any: a token alone is a credential), or USER:PASS@ at the start
# of a word; never a digest's '@sha256:' (``repo:tag@sha256:...``)
# (a password may hold '@' itself: the userinfo ends at the host's '@', the last before '/')
_URL_USERINFO = re.compile(r"(?<=://)[^\s/]+@")
_REF_USERINFO = re.compile(r"(?:^|(?<=[\s'\"=,(\[]))[^\s/@:'\"=]*:[^\s/'\"]*@(?!sha256:)")


def without_credentials(value: str) -> str:
    """``value`` with a URL's or a reference's ``user:password@`` shown as ``****@``."""
    return _REF_USERINFO.sub("****@", _URL_USERINFO.sub("****@", value))


def shown(value: object, limit: int = SHOWN_MAX, *, quoted: bool = True) -> str:
    """``value`` quoted safe to print (see the module docstring); ``quoted=False``: not put in
    quotes (a line of a file named by its number), its control characters escaped."""
    text = without_credentials(str(value))
    cut = text if len(text) <= limit else text[:limit]
    out = repr(cut) if quoted else escaped(cut)
    return out if cut is text else f"{out}... ({len(str(value))} characters)"
