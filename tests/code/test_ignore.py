"""code/ignore: which files of a workdir ship (nested ignore files, built-ins) and what is
refused (links out of the tree, FIFOs, bad names, unreadable files), all at once."""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pytest

from clusterctl.code import ignore
from clusterctl.code.ignore import WorkdirError, ignore_line, walk


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    """Write ``files`` (relative path -> content) under ``root``."""
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return root


def shipped(root: Path, **kw) -> list[str]:
    return sorted(f.path for f in walk(root, **kw))


def refused(root: Path, **kw) -> WorkdirError:
    with pytest.raises(WorkdirError) as info:
        walk(root, **kw)
    assert info.value.exit_code == 2
    return info.value


# --------------------------------------------------------------------------- ignore files

def test_nested_gitignores_with_negation_deeper_files_decide(tmp_path):
    tree(tmp_path, {
        ".gitignore": "*.log\n!keep.log\n# a comment\n\n/only_top.txt\nbuild/\n",
        "a.log": "", "keep.log": "", "only_top.txt": "", "main.py": "",
        "build/out.o": "",
        "sub/.gitignore": "!*.log\n*.tmp\n/local.txt\n",
        "sub/b.log": "", "sub/x.tmp": "", "sub/local.txt": "", "sub/only_top.txt": "",
        "sub/deep/c.log": "", "sub/deep/y.tmp": "", "sub/deep/local.txt": "",
        "other/d.log": "", "other/z.tmp": "",
    })
    assert shipped(tmp_path) == [
        ".gitignore", "keep.log", "main.py", "other/z.tmp",
        "sub/.gitignore", "sub/b.log", "sub/deep/c.log", "sub/deep/local.txt", "sub/only_top.txt",
    ]


def test_clusterctlignore_takes_back_what_gitignore_drops_at_the_same_level(tmp_path):
    tree(tmp_path, {
        ".gitignore": "*.bin\nnotes/\n",
        ".clusterctlignore": "!weights.bin\ndata/\n",
        "weights.bin": "w", "other.bin": "o", "notes/n.txt": "", "data/d.csv": "", "run.py": "",
    })
    assert shipped(tmp_path) == [".clusterctlignore", ".gitignore", "run.py", "weights.bin"]


def test_clusterctlignore_takes_back_a_builtin_and_gitignore_cannot(tmp_path):
    tree(tmp_path, {
        ".gitignore": "!.env\n",
        ".clusterctlignore": "!.env.example\n!certs/ca.pem\n",
        ".env": "TOKEN=x", ".env.example": "TOKEN=", ".env.local": "TOKEN=y",
        "certs/ca.pem": "ca", "certs/server.pem": "key",
    })
    assert shipped(tmp_path) == [".clusterctlignore", ".env.example", ".gitignore", "certs/ca.pem"]


def test_an_allow_list_gitignore_does_not_take_back_a_virtualenv(tmp_path):
    tree(tmp_path, {
        ".gitignore": "*\n!*/\n!*.py\n!.gitignore\n",
        "src/a.py": "", "src/data.csv": "",
        ".venv/lib/site.py": "", "__pycache__/a.py": "",
    })
    assert shipped(tmp_path) == [".gitignore", "src/a.py"]


def test_dot_git_never_ships_even_when_taken_back(tmp_path):
    tree(tmp_path, {
        ".clusterctlignore": "!.git\n!.git/\n!.git/**\n!HEAD\n",
        ".git/HEAD": "ref: refs/heads/main\n", ".git/objects/ab/cd": "x",
        "sub/.git": "gitdir: ../.git/modules/sub\n", "sub/code.py": "",
    })
    assert shipped(tmp_path) == [".clusterctlignore", "sub/code.py"]


def test_builtins(tmp_path):
    tree(tmp_path, {
        "train.py": "", "pkg/__pycache__/m.cpython-311.pyc": "", "pkg/m.py": "", "old.pyc": "",
        "myenv/pyvenv.cfg": "home = /usr/bin\n", "myenv/lib/python3.11/site-packages/x.py": "",
        "deep/er/any-name/pyvenv.cfg": "", "deep/er/any-name/bin/python": "", "deep/er/kept.py": "",
        "venv/bin/activate": "", ".venv/bin/activate": "",
        ".env": "", "conf/.env.prod": "", "id_rsa": "", "keys/id_ed25519.pub": "",
        "server.pem": "", "tls.key": "", ".netrc": "",
        ".mypy_cache/x": "", ".pytest_cache/y": "", "nb/.ipynb_checkpoints/z": "", "nb/a.ipynb": "",
    })
    # keys/id_ed25519.pub: a public key is no secret
    assert shipped(tmp_path) == ["deep/er/kept.py", "keys/id_ed25519.pub", "nb/a.ipynb", "pkg/m.py", "train.py"]
    assert ".git/" not in [p for p, _ in ignore.BUILTIN_EXCLUDES]  # .git is not liftable


def test_git_info_exclude_at_a_repository_top(tmp_path):
    tree(tmp_path, {".git/info/exclude": "secret.txt\n", "secret.txt": "", "sub/secret.txt": "",
                    "a.py": ""})
    assert shipped(tmp_path) == ["a.py"]
    # a workdir below the repository's top does not read it (only its own ignore files)
    assert shipped(tmp_path / "sub") == ["secret.txt"]


def test_excluded_directory_is_not_entered(tmp_path):
    tree(tmp_path, {".gitignore": "cache/\n", "a.py": ""})
    (tmp_path / "cache").mkdir()
    os.mkfifo(tmp_path / "cache" / "fifo")  # would be refused if the walk went in
    (tmp_path / "cache" / "bad\nname").write_text("")
    assert shipped(tmp_path) == [".gitignore", "a.py"]


def test_a_pattern_in_a_nested_file_is_relative_to_its_directory(tmp_path):
    tree(tmp_path, {"a/.gitignore": "b/c.txt\n", "a/b/c.txt": "", "b/c.txt": "", "a/x/b/c.txt": ""})
    assert shipped(tmp_path) == ["a/.gitignore", "a/x/b/c.txt", "b/c.txt"]


def test_a_symlinked_ignore_file_is_not_read(tmp_path):
    tree(tmp_path, {"rules": "*.py\n", "a.py": ""})
    (tmp_path / ".gitignore").symlink_to("rules")
    assert shipped(tmp_path) == [".gitignore", "a.py", "rules"]


def test_invalid_patterns(tmp_path):
    tree(tmp_path, {".gitignore": "!\n*.log\n", "a.log": "", "a.py": ""})
    assert shipped(tmp_path) == [".gitignore", "a.py"]  # git skips the line; so do we
    tree(tmp_path, {".clusterctlignore": "*.tmp\n\\\n"})
    err = refused(tmp_path)
    assert ".clusterctlignore:2:" in str(err) and "not a valid pattern" in str(err)


@pytest.mark.parametrize("name", ["a b[1]*.txt", "#hash", "!bang", "trailing ", "q?.txt"])
def test_the_suggested_ignore_line_drops_that_path_only(tmp_path, name):
    tree(tmp_path, {name: "", "sub/" + name: "", "a[1]b.txt": "", "keep.txt": ""})
    (tmp_path / ".clusterctlignore").write_text(ignore_line(name) + "\n")
    assert shipped(tmp_path) == sorted([".clusterctlignore", "a[1]b.txt", "keep.txt", "sub/" + name])


# --------------------------------------------------------------------------- links

def test_links_inside_the_tree_ship_as_links_and_are_not_followed(tmp_path):
    tree(tmp_path, {"data/real.txt": "x", "lib/m.py": ""})
    (tmp_path / "alias.txt").symlink_to("data/real.txt")
    (tmp_path / "lib" / "up").symlink_to("..")            # a loop, and not walked
    (tmp_path / "libdir").symlink_to("lib")               # a link to a directory: a link
    (tmp_path / "dangling").symlink_to("nowhere/file")    # inside, if it existed
    found = {f.path: f for f in walk(tmp_path)}
    assert sorted(found) == ["alias.txt", "dangling", "data/real.txt", "lib/m.py", "lib/up", "libdir"]
    assert found["alias.txt"].kind == "link" and found["alias.txt"].target == "data/real.txt"
    assert found["libdir"].kind == "link" and found["data/real.txt"].kind == "file"


def test_links_out_of_the_tree_are_refused(tmp_path):
    root = tree(tmp_path / "proj", {"a.py": "", "sub/b.py": ""})
    (tmp_path / "secret").write_text("s")
    (root / "up").symlink_to("../secret")
    (root / "abs").symlink_to("/etc/passwd")
    (root / "sub" / "inside_abs").symlink_to(root / "a.py")
    (root / "sub" / "via").symlink_to("../up")           # stays inside as written, resolves out
    err = refused(root)
    by_path = {p.split(":")[0]: p for p in err.problems}
    assert sorted(by_path) == ["abs", "sub/inside_abs", "sub/via", "up"]
    assert "leaves the workdir" in by_path["up"] and '"/up"' in by_path["up"]
    assert "outside the workdir" in by_path["abs"]
    assert "ln -sfn ../a.py sub/inside_abs" in by_path["sub/inside_abs"]
    assert "resolves to" in by_path["sub/via"] and str(tmp_path / "secret") in by_path["sub/via"]


def test_a_link_out_of_the_tree_that_is_ignored_is_fine(tmp_path):
    tree(tmp_path, {".clusterctlignore": "/escape\n", "a.py": ""})
    (tmp_path / "escape").symlink_to("/etc")
    assert shipped(tmp_path) == [".clusterctlignore", "a.py"]


# --------------------------------------------------------------------------- refusals

def _walk_in_thread(root: Path, seconds: float = 10.0):
    """walk(root) in a daemon thread: (finished, result or exception)."""
    out: list = []

    def go():
        try:
            out.append(walk(root))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    return (not t.is_alive()), (out[0] if out else None)


def test_a_fifo_is_refused_without_being_opened(tmp_path):
    tree(tmp_path, {"a.py": ""})
    os.mkfifo(tmp_path / "pipe")
    finished, result = _walk_in_thread(tmp_path)
    assert finished, "walk blocked: it opened the FIFO"
    assert isinstance(result, WorkdirError)
    assert result.problems == [
        'pipe: is a FIFO (named pipe); only regular files, directories and symbolic links ship, '
        'or leave it out with the line "/pipe" in .clusterctlignore']


def test_a_socket_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a socket's path must be short
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind("sock")
        err = refused(tmp_path)
        assert err.problems[0].startswith("sock: is a socket")
    finally:
        s.close()


@pytest.mark.parametrize(("name", "shown"), [
    ("new\nline.py", "new\\nline.py"), ("tab\there.py", "tab\\there.py"),
    ("esc\x1b[31m.py", "esc\\x1b[31m.py"), ("del\x7f.py", "del\\x7f.py"),
    (os.fsdecode(b"latin\xe9.py"), "latin\\xe9.py"),
])
def test_names_that_cannot_be_a_manifest_line_are_refused(tmp_path, name, shown):
    tree(tmp_path, {"ok.py": ""})
    os.mkdir(os.path.join(os.fsencode(tmp_path), b"dir"))
    with open(os.path.join(os.fsencode(tmp_path), b"dir", os.fsencode(name)), "wb"):
        pass
    err = refused(tmp_path)
    assert len(err.problems) == 1
    problem = err.problems[0]
    assert problem.startswith(f"dir/{shown}: its name ") and "rename it" in problem
    assert all(c >= " " for c in str(err).replace("\n", "")), "the message holds a control character"
    # the line it suggests does leave it out
    line = problem.split('the line "')[1].split('"')[0]
    (tmp_path / ".clusterctlignore").write_text(line + "\n")
    assert shipped(tmp_path) == [".clusterctlignore", "ok.py"]


def test_every_problem_at_once(tmp_path):
    root = tree(tmp_path / "proj", {"a.py": "", "z/ok.py": ""})
    os.mkfifo(root / "z" / "fifo")
    (root / "out").symlink_to("/etc/hostname")
    (root / "bad\tname").write_text("")
    err = refused(root)
    assert [p.split(":")[0] for p in err.problems] == ["bad\\tname", "out", "z/fifo"]
    assert str(err).startswith(f"workdir {root}: 3 problems, nothing was shipped:\n  ")
    for p in err.problems:
        assert p in str(err)


def test_many_problems_are_counted_not_all_printed(tmp_path):
    for i in range(ignore.SHOWN_PROBLEMS + 7):
        os.mkfifo(tmp_path / f"f{i:03d}")
    err = refused(tmp_path)
    assert len(err.problems) == ignore.SHOWN_PROBLEMS + 7
    assert str(err).endswith("... and 7 more") and str(err).count("FIFO") == ignore.SHOWN_PROBLEMS


def _as_nobody(fn, *args):
    """fn(*args) in a child that runs as nobody (root reads any file): result or exception."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                result = fn(*args)
            except BaseException as e:  # noqa: BLE001
                result = e
            data = pickle.dumps(result if not isinstance(result, WorkdirError)
                                else ("WorkdirError", str(result), result.problems))
            with os.fdopen(w, "wb") as f:
                f.write(data)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


@pytest.fixture
def world_readable_tmp():
    """A directory that another user can enter (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="clusterctl-test-"))
    d.chmod(0o755)
    yield d
    for p in [d, *d.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
    shutil.rmtree(d)


def test_unreadable_files_and_directories_are_refused(world_readable_tmp):
    root = tree(world_readable_tmp / "proj", {"a.py": "", "secret.py": "", "locked/b.py": ""})
    for p in [root, root / "locked", *root.rglob("*.py")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (root / "secret.py").chmod(0o000)
    (root / "locked").chmod(0o000)
    if os.geteuid() == 0:
        result = _as_nobody(walk, root)
        assert isinstance(result, tuple) and result[0] == "WorkdirError", result
        problems = result[2]
    else:
        problems = refused(root).problems
    assert problems == [
        "locked/: the directory cannot be read (Permission denied); valid: a directory you can "
        'read (chmod u+rx), or leave it out with the line "/locked/" in .clusterctlignore',
        "secret.py: cannot be read (permission denied); valid: a file you can read (chmod u+r), "
        'or leave it out with the line "/secret.py" in .clusterctlignore']


# --------------------------------------------------------------------------- root, bounds

def test_a_root_that_is_no_directory(tmp_path):
    with pytest.raises(WorkdirError, match="does not exist; valid: a directory"):
        walk(tmp_path / "missing")
    (tmp_path / "file.py").write_text("")
    with pytest.raises(WorkdirError, match=r"file.py: is a file; valid: a directory"):
        walk(tmp_path / "file.py")
    with pytest.raises(WorkdirError, match="a part of the path is a file"):
        walk(tmp_path / "file.py" / "x")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(WorkdirError, match="is not a directory"):
        walk(tmp_path / "fifo")


def test_a_root_given_through_a_link_is_walked(tmp_path):
    tree(tmp_path / "real", {"a.py": ""})
    (tmp_path / "link").symlink_to("real")
    assert shipped(tmp_path / "link") == ["a.py"]
    assert ignore.check_root(tmp_path / "link") == tmp_path / "real"


def test_max_files_stops_the_walk_and_names_the_biggest_directory(tmp_path):
    tree(tmp_path, {"a.py": "", **{f"data/{i:03d}.csv": "" for i in range(40)}, "lib/b.py": ""})
    err = refused(tmp_path, max_files=20)
    assert "more than 20 entries" in str(err)
    assert 'The most are under data/ (' in str(err) and '"/data/" in .clusterctlignore' in str(err)
    assert len(shipped(tmp_path, max_files=44)) == 42  # 40 + a.py + lib/b.py, 44 entries seen
    with pytest.raises(WorkdirError):
        walk(tmp_path, max_files=43)


def test_ignored_files_in_an_entered_directory_count_but_an_ignored_directory_does_not(tmp_path):
    tree(tmp_path, {".gitignore": "big/\n", **{f"big/{i}": "" for i in range(50)}, "a.py": ""})
    assert shipped(tmp_path, max_files=5) == [".gitignore", "a.py"]


def test_modes_are_not_decided_here(tmp_path):
    tree(tmp_path, {"run.sh": "#!/bin/sh\n"})
    (tmp_path / "run.sh").chmod(0o700)
    (found,) = walk(tmp_path)
    assert stat.S_IMODE(found.stat.st_mode) == 0o700  # the raw lstat; snapshot normalises


# --------------------------------------------------------------------------- git agrees

GIT_SCENARIOS = {
    "nested negation": {
        ".gitignore": "*.log\n!keep.log\n/only_top.txt\nbuild/\n",
        "a.log": "", "keep.log": "", "only_top.txt": "", "build/o": "", "x/build/o": "",
        "sub/.gitignore": "!*.log\n*.tmp\n", "sub/b.log": "", "sub/c.tmp": "", "sub/d/e.log": "",
        "sub/only_top.txt": "",
    },
    "allow-list": {
        ".gitignore": "*\n!*/\n!*.py\n!.gitignore\n",
        "a.py": "", "b.txt": "", "src/c.py": "", "src/d.csv": "", "src/e/f.py": "",
    },
    "a directory taken back": {
        ".gitignore": "/data/*\n!/data/keep/\n", "data/a.csv": "", "data/keep/b.csv": "",
        "data/keep/deep/c.csv": "", "data/other/d.csv": "", "x/data/e.csv": "",
    },
    "no file back from an excluded directory": {
        ".gitignore": "logs/\n!logs/keep.txt\n", "logs/keep.txt": "", "logs/a.txt": "", "main.py": "",
    },
    "stars and anchors": {
        ".gitignore": "doc/**/*.pdf\na/**/b\n**/tmp\nfoo/*\n/build\n[abc].txt\n?.md\n",
        "doc/x.pdf": "", "doc/1/2/y.pdf": "", "doc/z.txt": "", "a/b": "", "a/1/2/b": "", "c/a/b": "",
        "tmp": "", "q/tmp/r": "", "foo/x": "", "foo/y/z": "", "bar/foo/x": "", "build": "",
        "sub/build": "", "a.txt": "", "d.txt": "", "z.md": "", "zz.md": "",
    },
    "escapes and spaces": {
        ".gitignore": "\\#hash\n\\!bang\ntrailing   \nkeep\\ \n# comment\n",
        "#hash": "", "!bang": "", "trailing": "", "keep ": "", "keep": "", "# comment": "",
    },
    "info/exclude below .gitignore": {
        ".git/info/exclude": "*.dat\n!b.dat\n", ".gitignore": "c.dat\n",
        "a.dat": "", "b.dat": "", "c.dat": "", "d.txt": "",
    },
    "a nested file decides for its own directory": {
        ".gitignore": "*.bin\n", "a/.gitignore": "!*.bin\n/local/\n", "a/x.bin": "", "y.bin": "",
        "a/local/z": "", "a/b/local/w": "", "local/v": "",
    },
}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("name", sorted(GIT_SCENARIOS))
def test_the_same_files_as_git(tmp_path, name, monkeypatch):
    """Where no built-in applies, what ships is what ``git ls-files --others --exclude-standard``
    lists: the ignore files mean what they mean to git."""
    import subprocess

    files = GIT_SCENARIOS[name]
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    tree(root, files)
    (root / "linkdir").symlink_to("src")  # a link is a file to both
    monkeypatch.setenv("HOME", str(tmp_path))  # no user's global excludes
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    out = subprocess.run(["git", "-c", "core.excludesFile=", "ls-files", "-z", "--others",
                          "--exclude-standard"], cwd=root, capture_output=True, check=True).stdout
    git = sorted(p.decode() for p in out.split(b"\0") if p)
    assert shipped(root) == git
    assert shipped(root, use_git=False) == git   # our own reading, where git cannot be asked


# --------------------------------------------------------------------------- inside a repository


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """An empty git repository whose config is only its own (no user or system excludes)."""
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("needs git")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def _git(root: Path, *args: str) -> None:
    import subprocess

    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


def test_a_workdir_below_the_top_ships_what_git_lists_there_parents_ignore_files_included(repo):
    tree(repo, {
        ".gitignore": "secrets/\n*.secret\n", ".git/info/exclude": "scratch.txt\n",
        "proj/train.py": "", "proj/secrets/token": "t", "proj/a.secret": "s",
        "proj/scratch.txt": "", "proj/sub/.gitignore": "*.tmp\n", "proj/sub/x.tmp": "", "proj/sub/y.py": "",
    })
    # the previous design read only the workdir's own ignore files: the parents' rules leaked
    assert "secrets/token" in shipped(repo / "proj", use_git=False)
    assert shipped(repo / "proj") == ["sub/.gitignore", "sub/y.py", "train.py"]


def test_the_users_global_excludes_file_is_honoured(repo, tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "ignore").write_text("*.scratch\n")
    _git(repo, "config", "core.excludesFile", str(tmp_path / "home" / "ignore"))
    tree(repo, {"a.py": "", "b.scratch": ""})
    assert shipped(repo) == ["a.py"]


def test_a_tracked_file_ships_even_when_a_gitignore_names_it(repo):
    tree(repo, {"a.py": "", "config.local": "tracked", ".gitignore": "*.local\n", "b.local": ""})
    _git(repo, "add", "-f", "a.py", "config.local", ".gitignore")
    assert shipped(repo) == [".gitignore", "a.py", "config.local"]   # as `git ls-files` says


def test_credentials_never_ship_even_tracked_and_are_reported(repo):
    files = {"train.py": "", ".envrc": "export TOKEN=x", ".pypirc": "[pypi]", ".npmrc": "//r/:_authToken=x",
             ".git-credentials": "https://u:p@h", ".aws/credentials": "[default]", "certs/client.p12": "",
             "keys/putty.ppk": "", ".env.example": "TOKEN=", "home/.docker/config.json": "{}", "ok.json": ""}
    tree(repo, files)
    _git(repo, "add", "-f", *files)
    left: list = []
    assert shipped(repo, left_out=left) == ["ok.json", "train.py"]
    assert {x.path for x in left} == {".envrc", ".pypirc", ".npmrc", ".git-credentials", ".aws/",
                                       "certs/client.p12", "keys/putty.ppk", ".env.example",
                                       "home/.docker/config.json"}
    assert all(x.why for x in left)


def test_only_a_named_path_takes_a_credential_back(repo):
    tree(repo, {".clusterctlignore": "!.env.example\n!*.p12\n!*\n!certs/ca.pem\n", ".env.example": "",
                ".env": "", "a.p12": "", "certs/ca.pem": "", "certs/key.pem": ""})
    left: list = []
    assert shipped(repo, left_out=left) == [".clusterctlignore", ".env.example", "certs/ca.pem"]
    assert sorted(x.path for x in left) == [".env", "a.p12", "certs/key.pem"]


def test_clusterctlignore_still_takes_back_a_directory_git_ignores(repo):
    tree(repo, {".gitignore": "data/\n", ".clusterctlignore": "!data/\n", "data/a.csv": "", "m.py": ""})
    assert shipped(repo) == [".clusterctlignore", ".gitignore", "data/a.csv", "m.py"]


def test_inside_a_nested_repository_its_own_ignore_files_apply(repo):
    inner = repo / "vendor" / "lib"
    inner.mkdir(parents=True)
    _git(inner, "init", "-q")
    tree(repo, {"main.py": "", "vendor/lib/.gitignore": "*.o\n", "vendor/lib/x.c": "",
                "vendor/lib/x.o": ""})
    assert shipped(repo) == ["main.py", "vendor/lib/.gitignore", "vendor/lib/x.c"]


def test_a_repositorys_fsmonitor_is_never_run(repo, tmp_path):
    marker = tmp_path / "ran"
    hook = tmp_path / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    _git(repo, "config", "core.fsmonitor", str(hook))
    tree(repo, {"a.py": ""})
    assert shipped(repo) == ["a.py"]
    assert not marker.exists()


def test_a_workdir_git_ignores_whole_is_refused_with_the_way_to_see_why(repo):
    tree(repo, {".gitignore": "out/\n", "out/a.bin": "", "b.py": ""})
    error = refused(repo / "out")
    assert "git lists no file" in str(error) and "git check-ignore -v" in str(error)
