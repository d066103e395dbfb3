"""Which files of a user's project directory (the workdir) ship to the cluster.

One job: walk the workdir and say which regular files and symbolic links ship, or refuse
it with every problem named at once.  Nothing here reads a file's content (hashing is
:mod:`clusterctl.code.snapshot`'s job); only ignore files are read.

Contract:

``walk(root, *, max_files=MAX_FILES) -> list[Found]``
    The entries that ship, each a :class:`Found` (path relative to the root, ``file`` or
    ``link``, its ``lstat`` and a link's target text), in walk order (callers sort).
    Raises :class:`WorkdirError` (a ``UserError``, exit status 2) listing every problem.
``check_root(root) -> Path``
    The workdir as an absolute path without symbolic links; ``WorkdirError`` when it does
    not exist or is not a directory.
``ignore_line(path, *, directory=False) -> str``
    The one line that, added to the root's ``.clusterctlignore``, leaves ``path`` out
    (anchored with ``/`` and escaped, so it drops that path and nothing else).
``shown(path) -> str``
    A path as messages print it (control characters and bytes that are not UTF-8 escaped).
``BUILTIN_EXCLUDES``
    What never ships unless a ``.clusterctlignore`` takes it back, with why.

What is left out, in the order the rules are read (the last rule that matches a path
decides, as in git):

1. ``.git`` (a directory, or the file of a worktree or submodule): never, whatever any
   ignore file says.  It is history, not code, and it is the largest thing in most
   checkouts (Ray's and SkyPilot's users' top complaint: ``.git`` filling the upload cap).
2. :data:`BUILTIN_EXCLUDES`, and any directory that holds a ``pyvenv.cfg`` (a virtual
   environment, whatever it is called).
3. Inside a git work tree: what ``git ls-files --cached --others --exclude-standard``
   does not list in the root (:func:`clusterctl.code.gitinfo.listed`: every ignore source
   git reads, the parents' ``.gitignore`` and ``core.excludesFile`` included; tracked
   files are listed even when a ``.gitignore`` names them).  Below a gitlink (a
   submodule, a nested repository) that repository's own git lists what is there.  When
   git cannot list the root's repository (no git, a git that hangs, another user's
   repository: "dubious ownership") the workdir is refused, naming git's reason and the
   fix: a walk without git would miss the parents' ``.gitignore``, ``info/exclude`` and
   ``core.excludesFile`` and ship what git leaves out.  A nested repository git cannot
   list is a problem of the walk (a ``.clusterctlignore`` line may leave it out).
   Outside any repository (no ``.git`` in the root or above it), and with
   ``use_git=False``: ``.git/info/exclude`` when the root holds one, then 4.
4. For each directory from the root down: its ``.gitignore`` (unless git has read it, 3),
   then its ``.clusterctlignore`` (same syntax), both relative to that directory.  Deeper
   files are read later, so they decide first; at one level ``.clusterctlignore`` comes
   after ``.gitignore``, so its ``!pattern`` takes back what ``.gitignore`` dropped.  To
   take back what a deeper ``.gitignore`` drops, write the ``!`` line in a
   ``.clusterctlignore`` at that depth.
5. :data:`CREDENTIALS`, after all of the above: a path that would ship and looks like a
   credential (matched case-insensitively) is left out unless a ``.clusterctlignore``
   names it on a ``!`` line without wildcards (a glob character escaped with ``\\`` is
   no wildcard; :class:`LeftOut` says which and why and gives that line;
   ``walk(left_out=...)`` collects them).

A built-in exclusion (2) is lifted only by a ``!`` line of a ``.clusterctlignore``: a
``.gitignore`` written as an allow-list (``*`` then ``!*/`` and ``!*.py``) would otherwise
take back every ``.venv/`` and ship thousands of files nobody meant to send.

As in git, an excluded directory is not entered, so nothing below it can be taken back
(unless a later rule takes back the directory itself); a symbolic link is matched as a
file, never as a directory, and is never followed.  Ignore files are read only when they
are regular files (git, too, does not follow a symlinked ``.gitignore``).  Patterns use
git's own rules (``pathspec``'s ``GitIgnoreSpec``); a ``.gitignore`` line git would not
accept is skipped as git skips it, one in a ``.clusterctlignore`` is a problem.

Refused (each problem names the path relative to the root and what would be valid,
usually the ``.clusterctlignore`` line that leaves the path out): a symbolic link whose
target is absolute, leaves the tree as written, or resolves outside it; a FIFO, socket or
device (seen with ``lstat``, never opened: opening a FIFO blocks); a name with a control
character or bytes that are not UTF-8 (the manifest is UTF-8 text, one entry a line); a
file or directory that cannot be read.  An excluded path is never refused.

Bounded: past ``max_files`` directory entries seen (ignored ones in directories that are
entered count too: each is read and held while its directory is sorted) the walk stops
with a message naming the top-level directory with the most entries.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pathspec import GitIgnoreSpec, PathSpec

from clusterctl.code import gitinfo
from clusterctl.core.errors import UserError
from clusterctl.core.files import read_input
from clusterctl.core.text import control_problem, escaped

#: Directory entries seen before the walk stops (a home directory given by mistake).
MAX_FILES = 100_000
#: The largest ignore file read (a generated .gitignore is a few KB).
MAX_IGNORE_FILE_BYTES = 1 << 20
#: The ignore files read in every directory, in this order.
IGNORE_FILES = (".gitignore", ".clusterctlignore")
#: Never ships, and no ignore file can take it back.
NEVER = ".git"
#: A directory holding this file is a virtual environment (PEP 405), whatever its name.
VENV_MARKER = "pyvenv.cfg"
#: pathspec's pure-Python matcher, always (``backend=`` is why pyproject asks pathspec>=1.0):
#: its "best" one (re2 or hyperscan, when installed) ranks matches differently in corner
#: cases and cannot take a name that is not UTF-8, and the same tree must ship the same
#: files on every machine.
BACKEND = "simple"
#: Problems shown in one message; the error's ``problems`` holds them all.
SHOWN_PROBLEMS = 50

#: Left out unless a ``.clusterctlignore`` takes them back (``!build/keep.py``, ``!*.pyc``):
#: gitignore patterns, each with why.
BUILTIN_EXCLUDES: tuple[tuple[str, str], ...] = (
    ("__pycache__/", "Python's bytecode cache, rebuilt on the nodes"),
    ("*.pyc", "Python bytecode"),
    (".venv/", "a virtual environment: the image has the packages"),
    ("venv/", "a virtual environment: the image has the packages"),
    (".mypy_cache/", "a tool's cache"),
    (".pytest_cache/", "a tool's cache"),
    (".ipynb_checkpoints/", "Jupyter's autosaves"),
)

#: Credential-like files: never shipped, whatever git or any ignore file says, unless a
#: ``.clusterctlignore`` names that very path on a ``!`` line without wildcards (the
#: allow list: ``!.env.example``, ``!certs/ca.pem``, ``!/a\[1\].pem``).  A wildcard line
#: (``!*``, ``!*.pem``) never takes one back.  gitignore patterns (all lowercase: a path
#: is matched in lowercase, so ``ID_RSA`` is one too), each with why; the last row that
#: matches decides, and a ``!`` row says what it matches is no credential.
#: ``--dry-run`` lists the ones a workdir held.
CREDENTIALS: tuple[tuple[str, str], ...] = (
    ("id_rsa*", "an SSH private key"),
    ("id_dsa*", "an SSH private key"),
    ("id_ecdsa*", "an SSH private key"),
    ("id_ed25519*", "an SSH private key"),
    ("!*.pub", "a public key: no secret"),
    (".env", "an environment file (they usually hold secrets)"),
    (".env.*", "an environment file (they usually hold secrets)"),
    (".envrc", "direnv's environment file (it usually exports secrets)"),
    (".ssh/", "SSH keys and configuration"),
    ("*.pem", "a certificate or private key"),
    ("*.key", "a private key"),
    ("*.p12", "a PKCS#12 key store"),
    ("*.pfx", "a PKCS#12 key store"),
    ("*.ppk", "a PuTTY private key"),
    ("*.jks", "a Java key store"),
    ("*.keystore", "a key store"),
    ("*.kdbx", "a KeePass password database"),
    (".netrc", "login passwords"),
    (".pypirc", "PyPI upload credentials"),
    (".npmrc", "npm registry tokens"),
    (".git-credentials", "git's stored passwords"),
    (".aws/", "AWS credentials"),
    ("**/.docker/config.json", "registry logins"),
    ("**/.kube/config", "Kubernetes credentials"),
    (".gnupg/", "GnuPG keys"),
    (".vault-token", "a HashiCorp Vault token"),
    ("credentials", "a credentials file"),
    ("credentials.json", "a credentials file"),
    ("*.credentials", "a credentials file"),
    (".htpasswd", "password hashes"),
    ("kubeconfig", "Kubernetes credentials"),
    ("kubeconfig*.yaml", "Kubernetes credentials"),
    ("kubeconfig*.yml", "Kubernetes credentials"),
    ("*.kubeconfig", "Kubernetes credentials"),
    ("*service[-_]account*.json", "a cloud service account key"),
    ("sa[-_]key*.json", "a cloud service account key"),
    ("*[-_]sa[-_]key*.json", "a cloud service account key"),
    ("application_default_credentials.json", "Google Cloud's login"),
    (".config/gcloud/", "Google Cloud's logins"),
    (".azure/", "Azure's logins"),
    (".pgpass", "PostgreSQL passwords"),
    (".my.cnf", "MySQL passwords"),
    (".s3cfg", "s3cmd's S3 keys"),
    (".boto", "boto's and gsutil's cloud keys"),
    ("*.tfstate", "Terraform state (it holds the secrets of what it made)"),
    ("*.tfstate.backup", "Terraform state (it holds the secrets of what it made)"),
    (".dockercfg", "registry logins"),
    (".hf_token", "a Hugging Face token"),
    ("**/.huggingface/token", "a Hugging Face token"),
    ("**/huggingface/token", "a Hugging Face token"),
    ("**/huggingface/stored_tokens", "Hugging Face tokens"),
)

_BUILTIN = "built-in"
_GIT = "git"
_OURS = "clusterctl"
_LISTED = "git ls-files"
_GLOB = frozenset("*?[")


class WorkdirError(UserError):
    """The workdir cannot ship as it is; ``problems`` holds every problem (one line each)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


@dataclass(frozen=True)
class Found:
    """One entry that ships: a regular file or a symbolic link."""

    path: str                # relative to the root, '/'-separated, no "./"
    kind: str                # "file" or "link"
    stat: os.stat_result     # its lstat, taken during the walk
    target: str = ""         # links: the link text


@dataclass(frozen=True)
class _Layer:
    """The rules of one ignore file (or the built-ins), for paths under ``base``."""

    base: str                # "" for the root, else "sub/dir/"
    files: GitIgnoreSpec     # asked about files (git's rules, as pathspec replicates them)
    dirs: PathSpec           # the same patterns, asked about directories (see _excluded)
    kind: str                # _BUILTIN, _LISTED, _GIT or _OURS
    source: str              # ".gitignore", "sub/.clusterctlignore", "built-in" (for reading)
    listed: gitinfo.Listed | None = None   # _LISTED: what git lists
    named: frozenset[str] = frozenset()    # _OURS: paths its "!" lines name (no wildcard)


@dataclass(frozen=True)
class LeftOut:
    """A credential-like path the workdir holds that did not ship, and why."""

    path: str                # relative to the root; a directory ends with "/"
    why: str

    @property
    def allow_line(self) -> str:
        """The ``.clusterctlignore`` line that ships it after all (its path, named, escaped)."""
        return "!" + ignore_line(self.path.rstrip("/"))


def shown(path: str) -> str:
    """``path`` as a message prints it: undecodable bytes as ``\\xff``, controls as escapes."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        path = os.fsencode(path).decode("utf-8", "backslashreplace")
    return escaped(path)


def ignore_line(path: str, *, directory: bool = False) -> str:
    """The ``.clusterctlignore`` line (at the root) that leaves out ``path`` and nothing else.

    Special characters are escaped; a character no ignore file can hold (a control
    character, a byte that is not UTF-8) becomes ``?``, which matches any one character.
    """
    out = []
    for c in path:
        if c in "*?[]\\!# ":
            out.append("\\" + c)
        elif control_problem(c) or "\udc80" <= c <= "\udcff":
            out.append("?")
        else:
            out.append(c)
    return "/" + "".join(out) + ("/" if directory else "")


def _leave_out(path: str, directory: bool = False) -> str:
    return f'or leave it out with the line "{ignore_line(path, directory=directory)}" in .clusterctlignore'


def check_root(root: Path | str) -> Path:
    """``root`` as an absolute path without symbolic links; WorkdirError when it is no directory."""
    name = shown(os.fspath(root))
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise WorkdirError(f"workdir {name}: does not exist; valid: a directory (the project "
                           "to ship, e.g. . for the current one)") from None
    except NotADirectoryError:
        raise WorkdirError(f"workdir {name}: a part of the path is a file, not a directory; "
                           "valid: a directory (the project to ship)") from None
    except OSError as e:
        raise WorkdirError(f"workdir {name}: cannot be read ({e.strerror}); valid: a "
                           "directory you can read") from None
    if not stat.S_ISDIR(st.st_mode):
        what = "a file" if stat.S_ISREG(st.st_mode) else "not a directory"
        raise WorkdirError(f"workdir {name}: is {what}; valid: a directory (the project to "
                           "ship; its files ship, with their paths relative to it)")
    return Path(os.path.realpath(root))


def _read_rules(path: Path, rel: str, base: str, kind: str, problems: dict[str, str]) -> _Layer | None:
    """The layer of one ignore file (``rel``: its path relative to the root, for messages)."""
    try:  # a regular file only: a FIFO planted as .gitignore is never waited on
        data = read_input(path, "an ignore file", limit=MAX_IGNORE_FILE_BYTES + 1,
                          valid="an ignore file you can read")
    except UserError as e:
        problems[rel] = (f"{shown(rel)}: {str(e).split(': ', 1)[-1].rstrip('.')}, so what it "
                         "leaves out is unknown")
        return None
    except OSError as e:
        problems[rel] = (f"{shown(rel)}: cannot be read ({e.strerror}), so what it leaves out "
                         "is unknown; valid: an ignore file you can read")
        return None
    if len(data) > MAX_IGNORE_FILE_BYTES:
        problems[rel] = (f"{shown(rel)}: larger than {MAX_IGNORE_FILE_BYTES >> 10} KiB, far "
                         "more than an ignore file; valid: a file of ignore patterns")
        return None
    # surrogateescape: a pattern with bytes that are not UTF-8 still matches such a name
    lines = data.decode("utf-8", "surrogateescape").splitlines()
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    patterns = []
    named = set()
    for number, line in enumerate(lines, 1):
        if kind == _OURS and line.startswith("!") and (path := _literal(line[1:])):
            named.add(base + path.strip("/"))
        try:
            # "#": a comment keeps the pattern's index equal to its line's (pathspec drops "")
            GitIgnoreSpec.from_lines([line or "#"], backend=BACKEND)
            patterns.append(line or "#")
        except ValueError:  # pathspec's pattern errors (the class moved in pathspec 1.0)
            patterns.append("#")
            if kind == _OURS:
                problems[f"{rel}:{number}"] = (
                    f"{shown(rel)}:{number}: {shown(line)!r} is not a valid pattern; valid: "
                    "a gitignore pattern (https://git-scm.com/docs/gitignore)")
    return _layer(base, patterns, kind, rel, named=frozenset(named))


def _literal(pattern: str) -> str | None:
    """The path ``pattern`` names when it holds no wildcard (``\\[`` is a literal ``[``), its
    escapes undone; None for a pattern with one (``*``, ``?``, ``[`` not escaped)."""
    while pattern.endswith(" ") and not pattern.endswith("\\ "):  # git drops trailing spaces
        pattern = pattern[:-1]
    out = []
    escape = False
    for c in pattern:
        if escape:
            out.append(c)
            escape = False
        elif c == "\\":
            escape = True
        elif c in _GLOB:
            return None
        else:
            out.append(c)
    return None if escape else "".join(out)


def _layer(base: str, lines: list[str], kind: str, source: str, **extra) -> _Layer:
    files = GitIgnoreSpec.from_lines(lines, backend=BACKEND)
    return _Layer(base, files, PathSpec(files.patterns, backend=BACKEND), kind, source, **extra)


_BUILTIN_LAYER = _layer("", [p for p, _ in BUILTIN_EXCLUDES], _BUILTIN, "built-in")
_CREDENTIALS = [(GitIgnoreSpec.from_lines([p.removeprefix("!")], backend=BACKEND), p.startswith("!"), why)
                for p, why in CREDENTIALS]


def _credential(path: str, is_dir: bool, layers: tuple[_Layer, ...]) -> str | None:
    """Why ``path`` is credential-like and not on the allow list, or None."""
    probe = (path + "/" if is_dir else path).lower()
    credential = None
    for spec, negated, why in _CREDENTIALS:  # the last row that matches decides
        if spec.match_file(probe):
            credential = None if negated else why
    if credential and any(path in layer.named for layer in layers if layer.kind == _OURS):
        return None
    return credential


def _git_exclude(root: Path) -> Path | None:
    """``info/exclude`` of the repository whose work tree top is ``root``, if any."""
    dot_git = root / NEVER
    try:
        if dot_git.is_dir():
            return dot_git / "info" / "exclude"
        if dot_git.is_file():  # a worktree or submodule: "gitdir: PATH"
            text = dot_git.read_text(encoding="utf-8", errors="replace").strip()
            if not text.startswith("gitdir:"):
                return None
            gitdir = root / text[len("gitdir:"):].strip()
            common = gitdir / "commondir"  # a worktree keeps info/ in the main repository
            if common.is_file():
                gitdir = gitdir / common.read_text(encoding="utf-8", errors="replace").strip()
            return gitdir / "info" / "exclude"
    except OSError:
        return None
    return None


def _excluded(path: str, is_dir: bool, venv: bool, layers: tuple[_Layer, ...]) -> bool:
    """Whether ``path`` (relative to the root) is left out, by the rules in the module docstring.

    A file is asked of ``GitIgnoreSpec`` (git's own precedence within one file, as pathspec
    replicates it).  A directory ("dir/") is asked of a plain ``PathSpec`` of the same
    patterns, where the last matching line wins: GitIgnoreSpec ranks a pattern that
    matches the name (``*``) above one that matches it as a directory (``!*/``), which is
    right for the files below but would keep the walk out of every directory of an
    allow-list ``.gitignore`` (``*``, ``!*/``, ``!*.py``), where git enters them all.
    """
    excluded = False
    builtin = False  # left out by a built-in, which only a .clusterctlignore "!" lifts
    for layer in layers:
        if layer.kind == _LISTED:
            if not layer.listed.has(path, is_dir):
                excluded = True
            continue
        rel = path[len(layer.base):]
        include = (layer.dirs.check_file(rel + "/") if is_dir else layer.files.check_file(rel)).include
        if layer.kind == _BUILTIN:
            if include or venv:
                excluded = builtin = True
        elif include:
            excluded = True
        elif include is False:
            if layer.kind == _OURS:
                excluded = builtin = False
            else:
                excluded = builtin
    return excluded


def _text_problem(text: str) -> str | None:
    """Why ``text`` (a name, a link's target) cannot be in the manifest, or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "has bytes that are not UTF-8"
    return control_problem(text)


def _shell(path: str) -> str:
    """``path`` as a shell command takes it: controls escaped, quoted, never read as an option."""
    return shlex.quote(shown("./" + path if path.startswith("-") else path))


def _link_problem(root: str, path: str, target: str) -> str | None:
    """Why the link at ``path`` (text ``target``) cannot ship, or None."""
    if bad := _text_problem(target):
        return (f"is a symbolic link whose target {bad}; valid: a target in UTF-8 without "
                "control characters")
    if os.path.isabs(target):
        real = os.path.realpath(os.path.join(root, path))
        if real == root or real.startswith(root + os.sep):
            rel = os.path.relpath(real, os.path.dirname(os.path.join(root, path)))
            return (f"is a symbolic link to the absolute path {shown(target)}, which the nodes "
                    f"do not have; valid: a relative link (ln -sfn {_shell(rel)} {_shell(path)})")
        return (f"is a symbolic link to {shown(target)}, outside the workdir; valid: a link "
                "to a path inside the workdir")
    lexical = os.path.normpath(os.path.join(os.path.dirname(path), target))
    if lexical == ".." or lexical.startswith("../"):
        return (f"is a symbolic link to {shown(target)}, which leaves the workdir; valid: a "
                "relative link that stays inside it")
    real = os.path.realpath(os.path.join(root, path))
    if real != root and not real.startswith(root + os.sep):
        return (f"is a symbolic link to {shown(target)}, which resolves to {shown(real)}, "
                "outside the workdir; valid: a link to a path inside the workdir")
    return None


def _special(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "a special file"


def _too_many(root: Path, max_files: int, per_top: Counter) -> WorkdirError:
    message = (f"workdir {shown(str(root))}: more than {max_files:,} entries (files, links and "
               "directories, ignored ones included in directories that are entered); is it "
               "the project directory?")
    if per_top:
        top, count = max(per_top.items(), key=lambda kv: (kv[1], kv[0]))
        if top:
            message += (f" The most are under {shown(top)}/ ({count:,} seen); leave it out with "
                        f'the line "{ignore_line(top, directory=True)}" in .clusterctlignore.')
    return WorkdirError(message)


def walk(root: Path | str, *, max_files: int = MAX_FILES, use_git: bool = True,
         left_out: list[LeftOut] | None = None) -> list[Found]:
    """The entries of ``root`` that ship (see the module docstring); WorkdirError otherwise.

    ``left_out``, when given, receives the credential-like paths that did not ship.
    ``use_git=False``: our own reading of the ignore files even inside a work tree.
    """
    real_root = check_root(root)
    top = str(real_root)
    layers: tuple[_Layer, ...] = (_BUILTIN_LAYER,)
    problems: dict[str, str] = {}
    try:
        listed = gitinfo.listed(real_root, max_files) if use_git else None
    except gitinfo.TooMany:
        raise _too_many(real_root, max_files, Counter()) from None
    except gitinfo.Unlisted as e:
        raise _unlisted(real_root, e, max_files) from None
    if listed is not None:
        layers += (_Layer("", _BUILTIN_LAYER.files, _BUILTIN_LAYER.dirs, _LISTED, _LISTED, listed),)
        if not listed.files and not listed.unlisted and _holds_anything(real_root):
            raise WorkdirError(
                f"workdir {shown(top)}: git lists no file in it (its .gitignore files, "
                "info/exclude or core.excludesFile leave out everything; `git check-ignore -v "
                "PATH` says which rule); valid: a directory with files git tracks or does not "
                "ignore, or take them back with \"!\" lines in a .clusterctlignore")
    else:
        exclude = _git_exclude(real_root)
        if exclude is not None and exclude.is_file():
            layer = _read_rules(exclude, ".git/info/exclude", "", _GIT, problems)
            if layer:
                layers += (layer,)
    found: list[Found] = []
    seen = 0
    per_top: Counter = Counter()  # entries seen under each top-level directory
    todo: list[tuple[str, tuple[_Layer, ...]]] = [("", layers)]
    while todo:
        base, layers = todo.pop()
        directory = os.path.join(top, base)
        entries = []
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    seen += 1
                    per_top[base.partition("/")[0]] += 1
                    if seen > max_files:
                        raise _too_many(real_root, max_files, per_top)
                    entries.append(entry)
        except OSError as e:
            if not base:
                raise WorkdirError(f"workdir {shown(top)}: cannot be read ({e.strerror}); valid: "
                                   "a directory you can read") from None
            where = base.rstrip("/")
            problems[base] = (f"{shown(where)}/: the directory cannot be read ({e.strerror}); "
                              f"valid: a directory you can read (chmod u+rx), {_leave_out(where, True)}")
            continue
        entries.sort(key=lambda e: os.fsencode(e.name))
        names = {e.name: e for e in entries}
        for name, kind in zip(IGNORE_FILES, (_GIT, _OURS), strict=True):
            entry = names.get(name)
            if kind == _GIT and listed is not None:  # git has read the .gitignore files
                continue
            if entry is not None and entry.is_file(follow_symlinks=False):
                layer = _read_rules(Path(entry.path), base + name, base, kind, problems)
                if layer:
                    layers += (layer,)
        for entry in entries:
            if entry.name == NEVER:
                continue
            path = base + entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as e:
                problems[path] = (f"{shown(path)}: cannot be read ({e.strerror}); valid: a path "
                                  f"you can read, {_leave_out(path)}")
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            venv = is_dir and os.path.lexists(os.path.join(entry.path, VENV_MARKER))
            if _excluded(path, is_dir, venv, layers):
                continue
            if why := _credential(path, is_dir, layers):
                if left_out is not None:
                    left_out.append(LeftOut(path + ("/" if is_dir else ""), why))
                continue
            if bad := _text_problem(entry.name):
                problems[path] = (f"{shown(path)}: its name {bad}; valid: a UTF-8 name without control "
                                  f"characters (rename it), {_leave_out(path, is_dir)}")
                continue
            if is_dir and listed is not None and path in listed.unlisted:
                why = listed.unlisted[path]
                problems[path] = (f"{shown(path)}/: a nested git repository git cannot list "
                                  f"({shown(why)}), so what its ignore files leave out is unknown; "
                                  f"valid: {_git_fix(why, Path(entry.path), Path(entry.path))}, "
                                  f"{_leave_out(path, True)}")
                continue
            if is_dir:
                todo.append((path + "/", layers))
            elif stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(entry.path)
                except OSError as e:
                    problems[path] = f"{shown(path)}: the link cannot be read ({e.strerror})"
                    continue
                if bad := _link_problem(top, path, target):
                    problems[path] = f"{shown(path)}: {bad}, {_leave_out(path)}"
                    continue
                found.append(Found(path, "link", st, target))
            elif stat.S_ISREG(st.st_mode):
                if not os.access(entry.path, os.R_OK):
                    problems[path] = (f"{shown(path)}: cannot be read (permission denied); "
                                      f"valid: a file you can read (chmod u+r), {_leave_out(path)}")
                    continue
                found.append(Found(path, "file", st))
            else:
                problems[path] = (f"{shown(path)}: is {_special(st.st_mode)}; only regular files, "
                                  f"directories and symbolic links ship, {_leave_out(path)}")
    if problems:
        raise problems_error(real_root, [problems[k] for k in sorted(problems, key=os.fsencode)])
    return found


def _unlisted(root: Path, e: gitinfo.Unlisted, max_files: int) -> WorkdirError:
    """The refusal of a workdir in a repository git cannot list, with what a walk without
    git finds wrong besides (a FIFO planted as a .gitignore is what makes git hang)."""
    problem = (f"it is in the git repository {shown(str(e.repository))}, but git cannot list it "
               f"({shown(e.why)}), so what git leaves out (the .gitignore files above it, "
               ".git/info/exclude, core.excludesFile) is unknown; "
               f"valid: {_git_fix(e.why, e.repository, root)}")
    try:
        walk(root, max_files=max_files, use_git=False)
    except WorkdirError as other:
        if other.problems:
            return problems_error(root, [f"git: {problem}", *other.problems])
    return WorkdirError(f"workdir {shown(str(root))}: {problem}")


def _git_fix(why: str, repository: Path, where: Path) -> str:
    """What would let git list ``where`` in ``repository``, given git's reason ``why``."""
    if "dubious ownership" in why:
        return ("a repository you own, or trust this one: git config --global --add "
                f"safe.directory {_shell(str(repository))}")
    if "not installed" in why:
        return "git on PATH (install it): git says what of a repository ships"
    if "did not answer" in why:
        return (f"a repository git lists within {gitinfo.TIMEOUT_S:g} s (see what it does with: "
                f"git -C {_shell(str(where))} ls-files --others --exclude-standard)")
    return (f"a repository git can read (git -C {_shell(str(where))} status shows git's own "
            "error)")


def _holds_anything(root: Path) -> bool:
    """Whether ``root`` has an entry besides ``.git``."""
    with os.scandir(root) as it:
        return any(e.name != NEVER for e in it)


def problems_error(root: Path, problems: list[str]) -> WorkdirError:
    """One WorkdirError listing ``problems`` (the first SHOWN_PROBLEMS; all in ``.problems``)."""
    n = len(problems)
    head = f"workdir {shown(str(root))}: {n} problem{'s' if n != 1 else ''}, nothing was shipped:"
    lines = problems[:SHOWN_PROBLEMS]
    if n > SHOWN_PROBLEMS:
        lines.append(f"... and {n - SHOWN_PROBLEMS:,} more")
    return WorkdirError("\n  ".join([head, *lines]), problems)
