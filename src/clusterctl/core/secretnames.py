"""Which environment variables are secrets, by name, and keeping their values off argv.

One job: the secret-name rule (:func:`is_secret_name`, read by jobs, plans, exports and
logs alike) and the first thing the ``clusterctl`` command does with its own command line
(:func:`move_off_argv`, :func:`reexec_without_secrets`).

A process's command line is world-readable (``ps``, ``/proc/PID/cmdline``); its
environment is readable only by its own user and root.  So a secret typed as
``--env HF_TOKEN=...`` or ``--set HF_TOKEN=...`` is moved, before anything else runs, into
the environment of a fresh ``clusterctl`` process (``execve``), whose command line says
``--env HF_TOKEN`` / ``--set HF_TOKEN``: the form that takes the value from clusterctl's
environment, which is also the way to give a secret without typing it at all.  The old
command line was visible only while Python started (tens of milliseconds); a name the
rule does not know (a job's own ``secrets:`` entry) cannot be known this early: launch
warns about it (:data:`ARGV_HINT`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence

#: Words (of a name split at ``_``) that make an environment variable secret without being
#: listed: anywhere in the name, or (:data:`SECRET_LAST_WORDS`) as its last word only, so
#: that settings about tokens or keys (PAD_TOKEN_ID, MAX_TOKENS, KEY_COLUMN) are not secrets.
SECRET_WORDS: tuple[str, ...] = ("SECRET", "PASSWORD", "PASSWD")
SECRET_LAST_WORDS: tuple[str, ...] = ("TOKEN", "KEY", "APIKEY")
#: The rule in words, for the job-file reference, the environment page and messages.
SECRET_RULE = ("a name is secret without being listed when one of its `_`-separated words is "
               + ", ".join(f"`{w}`" for w in SECRET_WORDS) + ", or its last word is "
               + ", ".join(f"`{w}`" for w in SECRET_LAST_WORDS) + ", in any case (`HF_TOKEN`, "
               "`WANDB_API_KEY`, `DB_PASSWORD`; not `PAD_TOKEN_ID`, `TOKENIZERS_PARALLELISM`, "
               "`MAX_TOKENS`, `KEY_COLUMN`)")
#: The options whose ``NAME=VALUE`` items are environment variables (or parameters).
VALUE_OPTIONS = ("--env", "--set")
#: Set in the fresh process so that it never moves (and execs) again.
MOVED_MARK = "CLUSTERCTL_ARGV_MOVED"
#: How to keep a secret off the command line, for messages.
ARGV_HINT = ("export NAME=... (or read it from a file: `export NAME=$(cat FILE)`) and give "
             "`--env NAME` or `--set NAME` without a value: the value then never appears in "
             "this machine's process list")

#: An environment variable name (what a secret's name must be to be moved or masked by name);
#: at most 255 characters: a longer one is no one's variable and would be echoed whole.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}\Z")


def is_secret_name(name: str, declared: Sequence[str] = ()) -> bool:
    """True when ``name`` is declared secret or named like one (:data:`SECRET_RULE`): a word
    SECRET, PASSWORD or PASSWD, or a last word TOKEN, KEY or APIKEY.  By words, never by
    substring: TOKENIZERS_PARALLELISM, PAD_TOKEN_ID or MONKEY are settings."""
    words = name.upper().split("_")
    return (name in declared or words[-1] in SECRET_LAST_WORDS
            or any(w in SECRET_WORDS for w in words))


def move_off_argv(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``argv`` with every secret ``--env``/``--set`` value taken out, and those values.

    ``--env NAME=VALUE``, ``--env=NAME=VALUE`` and the same for ``--set``, where NAME is a
    secret by :func:`is_secret_name`, become ``--env NAME`` (``--set NAME``); the values come
    back as ``{NAME: VALUE}``.  Everything after a bare ``--`` (the job's own command) is
    left as it is, and so is every other item.
    """
    out: list[str] = []
    moved: dict[str, str] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            out.extend(argv[i:])
            break
        option, eq, inline = word.partition("=")
        if option in VALUE_OPTIONS and eq:
            item, step = inline, 1
        elif word in VALUE_OPTIONS and i + 1 < len(argv):
            option, item, step = word, argv[i + 1], 2
        else:
            out.append(word)
            i += 1
            continue
        name, sep, value = item.partition("=")
        if sep and ENV_NAME.match(name) and is_secret_name(name):
            moved[name] = value
            out += [option, name]
        else:
            out += argv[i:i + step]
        i += step
    return out, moved


def reexec_without_secrets(argv: Sequence[str] | None = None,
                           environ: Mapping[str, str] | None = None) -> None:
    """When ``argv`` (default ``sys.argv``) holds a secret value, exec this command again with
    the values in the environment instead (see the module docstring); else return."""
    argv = list(sys.argv if argv is None else argv)
    environ = os.environ if environ is None else environ
    if environ.get(MOVED_MARK):
        return
    rest, moved = move_off_argv(argv[1:])
    if not moved:
        return
    env = {**environ, **moved, MOVED_MARK: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "clusterctl", *rest], env)
