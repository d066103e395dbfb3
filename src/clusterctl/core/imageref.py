"""Image references from a user: checked at the one place they enter, refused safely.

One job: say whether a value is a Docker image reference a command may hand to an engine,
a node, a manifest or a copy-paste line (``--image``, ``--tag``, ``--base-image``,
``push IMAGE``, a job's ``image:``), and refuse anything else with a message that names
where the value came from, quotes it safely and says what is valid.  Pure.

Contract:

``check_image(ref, what)``
    ``ref`` when it is ``[HOST[:PORT]/]PATH[:TAG][@sha256:DIGEST]`` by Docker's grammar:
    HOST a DNS name or IPv4 address (upper-case allowed; a first part is a HOST when it
    holds a '.' or ':' or is ``localhost``, Docker's rule), PATH lower-case components
    (``[a-z0-9]`` separated by ``.``, ``_``, ``__`` or dashes), HOST and PATH together at
    most :data:`NAME_MAX` characters, TAG ``[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}``, DIGEST 64
    lower-case hex digits.  Otherwise a ``UserError`` (exit 2), ``WHAT 'VALUE' is not a valid
    image reference (WHY); valid: ...``, ``what`` the option or ``file:line: field``: empty,
    a control character, whitespace, a leading ``-`` (docker would read an option), a
    credential (``user:password@`` or ``user@`` before the registry: ``docker login`` keeps
    credentials, a reference never does), a name over :data:`NAME_MAX`, anything else
    outside the grammar (upper-case path, a bad digest, ``../x``, ``x;id``, ``$(id).x/y``).
    Every message quotes the value with
    :func:`clusterctl.core.text.shown` (the credential masked, controls escaped, cut) and
    never holds a credential.
``VALID``
    What a valid reference looks like, for other messages (``valid: ...``).
"""

from __future__ import annotations

import re

from clusterctl.core.errors import UserError
from clusterctl.core.text import control_problem, shown, without_credentials

#: Docker's bound on a reference's name (registry host and path, without tag or digest).
NAME_MAX = 255
VALID = ("an image reference [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST] with a lower-case "
         "NAME, e.g. clusterctl/cpu:2.13.0, nvcr.io/nvidia/pytorch:24.05-py3 or "
         "localhost:5000/x@sha256:<64 hex digits>")

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?"
_HOST_RE = re.compile(rf"^{_HOST}\Z")
_PATH = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*\Z")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")
# an '@' that starts no digest: userinfo (``user@`` / ``user:password@``) before the registry
_USERINFO = re.compile(r"^.*@(?!sha256:)", re.DOTALL)


def _masked(ref: str) -> str:
    """``ref`` with every credential shown as ``****@`` (also a lone ``user@``)."""
    return _USERINFO.sub("****@", without_credentials(ref))


def _parts(ref: str) -> tuple[str, str | None, str | None]:
    """(name, tag or None, digest or None) of ``ref``, split as Docker splits it."""
    name, at, digest = ref.partition("@")
    head, colon, tag = name.rpartition(":")
    if colon and "/" not in tag:
        return head, tag, digest if at else None
    return name, None, digest if at else None


def _problem(ref: str) -> str | None:
    """Why ``ref`` is no image reference (a clause), or None."""
    problem = control_problem(ref)
    if problem:
        return f"it {problem}"
    if any(c.isspace() for c in ref):
        return "it contains whitespace"
    if ref.startswith("-"):
        return "it starts with '-', which docker would read as an option"
    if _masked(ref) != ref:
        return ("it holds a credential, user:password@ or user@ before the registry: `docker "
                "login REGISTRY` keeps credentials, never a reference")
    name, tag, digest = _parts(ref)
    if len(name) > NAME_MAX:
        return f"its name is {len(name)} characters; Docker's limit is {NAME_MAX}"
    if digest is not None and not _DIGEST.match(digest):
        return "a digest is @sha256: and 64 lower-case hex digits"
    if tag is not None and not _TAG.match(tag):
        return "a tag is at most 128 letters, digits, '_', '.' and '-', not starting with '.' or '-'"
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):   # Docker's rule
        if not _HOST_RE.match(first):
            return "a registry is HOST[:PORT]: DNS labels or an IPv4 address, a port of digits"
        name = rest
    if not _PATH.match(name):
        if _PATH.match(name.lower()):
            return "the repository name must be lower-case; only a registry HOST may have capitals"
        return ("a name is '/'-separated parts of lower-case letters and digits joined by '.', "
                "'_', '__' or '-', after an optional HOST[:PORT]/")
    return None


def check_image(ref: object, what: str) -> str:
    """``ref`` when it is a valid image reference; otherwise a UserError naming ``what``
    (see the module docstring)."""
    if not isinstance(ref, str) or not ref:
        raise UserError(f"{what} {shown(ref or '')} is not a valid image reference (it is empty); "
                        f"valid: {VALID}.")
    why = _problem(ref)
    if why:
        # shown() of the masked value: a lone user@ is no URL credential shown() would see
        raise UserError(f"{what} {shown(_masked(ref))} is not a valid image reference ({why}); "
                        f"valid: {VALID}.")
    return ref


__all__ = ["NAME_MAX", "VALID", "check_image"]
