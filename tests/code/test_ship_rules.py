"""code/ignore, code/gitinfo: what ships is what git lists, or nothing at all.

Real git, real files, real shells: a repository git cannot list (another uid's, refused
as "dubious ownership"; a stand-in ``git`` first on PATH that refuses or hangs; no git at
all) is refused with git's reason and the fix, never walked without its ignore sources;
a nested repository ships what its own git lists; the credential table; the allow line
``--dry-run`` suggests allows exactly that file; a suggested shell command is quoted.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.code import gitinfo, snapshot
from clusterctl.code.ignore import CREDENTIALS, WorkdirError, walk

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

REAL_GIT = shutil.which("git")
REPO_ROOT = Path(__file__).resolve().parents[2]
OTHER_UID = 12345


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    return root


def git(root: Path, *args: str) -> str:
    return subprocess.run([REAL_GIT, "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout


def shipped(root: Path, **kw) -> list[str]:
    return sorted(f.path for f in walk(root, **kw))


def refused(root: Path) -> WorkdirError:
    with pytest.raises(WorkdirError) as info:
        walk(root)
    assert info.value.exit_code == 2
    return info.value


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A HOME of the test's own (its ~/.gitconfig is the "global" config), no system config."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    return home


def audit_repository(tmp_path: Path, home: Path) -> tuple[Path, Path]:
    """The audit's p2: the repository's .gitignore drops ``proj/secretdata/`` and ``*.bin``,
    ``core.excludesFile`` drops ``private_notes.txt``; the workdir is ``proj``."""
    top = tmp_path / "repo"
    top.mkdir()
    git(top, "init", "-q")
    tree(top, {".gitignore": "proj/secretdata/\n*.bin\n", "proj/train.py": "print(1)\n",
               "proj/model.bin": "weights", "proj/private_notes.txt": "notes",
               "proj/secretdata/a.txt": "secret"})
    (home / "excludes").write_text("private_notes.txt\n")
    git(top, "config", "--global", "core.excludesFile", str(home / "excludes"))
    return top.resolve(), (top / "proj").resolve()


def stand_in_git(tmp_path: Path, script: str, monkeypatch) -> None:
    """Put a stand-in ``git`` (a shell script, not the real one) first on PATH."""
    bin_dir = tmp_path / "stand-in-bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text("#!/bin/sh\n" + script)
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


# --------------------------------------------------------------------------- 1. git cannot list


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="hands the repository to another uid with chown (root)")
def test_another_users_repository_is_refused_with_gits_reason_and_the_fix(tmp_path, home):
    top, proj = audit_repository(tmp_path, home)
    assert shipped(proj) == ["train.py"]
    for p in [top, *top.rglob("*")]:
        os.chown(p, OTHER_UID, OTHER_UID, follow_symlinks=False)
    message = str(refused(proj))
    # before: model.bin, private_notes.txt and secretdata/a.txt shipped, without a word
    assert message.startswith(f"workdir {proj}: it is in the git repository {top}, but git cannot list it ")
    assert "dubious ownership" in message and "Traceback" not in message
    hint = message.split("trust this one: ")[1]
    assert hint == f"git config --global --add safe.directory {shlex.quote(str(top))}"
    subprocess.run(["sh", "-c", hint], check=True)  # the hint, followed, is the fix
    assert shipped(proj) == ["train.py"]


def test_a_git_that_refuses_is_named_and_the_workdir_refused(tmp_path, home, monkeypatch):
    _, proj = audit_repository(tmp_path, home)
    stand_in_git(tmp_path, "echo 'fatal: stand-in git: refusing every repository' >&2\nexit 128\n",
                 monkeypatch)
    message = str(refused(proj))
    assert "(stand-in git: refusing every repository)" in message
    assert f"valid: a repository git can read (git -C {proj} status shows git's own error)" in message
    with pytest.raises(WorkdirError, match="git cannot list it"):
        snapshot.take(proj)


def test_a_git_that_hangs_on_ls_files_is_refused_in_time(tmp_path, home, monkeypatch):
    top, proj = audit_repository(tmp_path, home)
    # the stand-in answers everything through the real git, but never lists files
    stand_in_git(tmp_path, f'case "$*" in *ls-files*) exec sleep 30;; esac\nexec {REAL_GIT} "$@"\n',
                 monkeypatch)
    monkeypatch.setattr(gitinfo, "TIMEOUT_S", 0.5)
    started = time.monotonic()
    message = str(refused(proj))
    assert time.monotonic() - started < 10
    assert f"it is in the git repository {top}" in message
    assert "(`git ls-files` did not answer within 0.5 s)" in message


def test_no_git_inside_a_repository_is_refused(tmp_path, home, monkeypatch):
    _, proj = audit_repository(tmp_path, home)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    message = str(refused(proj))
    assert "(git is not installed (no git on PATH))" in message and "install it" in message


def test_a_failing_git_also_names_what_a_walk_finds_wrong(tmp_path, home, monkeypatch):
    """A FIFO planted as a .gitignore is what hangs git: it is named too, not only the hang."""
    _, proj = audit_repository(tmp_path, home)
    os.mkfifo(proj / "sub-gitignore-fifo")
    stand_in_git(tmp_path, "exit 1\n", monkeypatch)
    error = refused(proj)
    assert [p.split(":")[0] for p in error.problems] == ["git", "sub-gitignore-fifo"]
    assert "`git rev-parse` failed with exit status 1" in error.problems[0]


def test_outside_any_repository_the_plain_walk_stays(tmp_path, home, monkeypatch):
    plain = tree(tmp_path / "plain", {".gitignore": "*.bin\n", "train.py": "", "m.bin": ""})
    expected = [".gitignore", "train.py"]
    assert shipped(plain) == expected
    stand_in_git(tmp_path, "echo 'fatal: stand-in git: refusing' >&2\nexit 128\n", monkeypatch)
    assert shipped(plain) == expected
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert shipped(plain) == expected


def test_a_dot_git_git_would_not_take_for_a_repository_is_no_repository(tmp_path, home, monkeypatch):
    root = tree(tmp_path / "w", {".git/info/exclude": "x.txt\n", "x.txt": "", "a.py": ""})
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gitinfo.repository_above(root) is None
    assert shipped(root) == ["a.py"]


def test_the_refusal_through_the_command_line_exit_2_no_traceback(tmp_path, home, monkeypatch):
    _, proj = audit_repository(tmp_path, home)
    stand_in_git(tmp_path, "echo 'fatal: stand-in git: refusing' >&2\nexit 128\n", monkeypatch)
    result = dry_run(tmp_path, proj)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "git cannot list it (stand-in git: refusing)" in result.stderr
    assert "# code:" not in result.stdout


# --------------------------------------------------------------------------- 2. nested repositories


def test_a_nested_repository_ships_what_its_own_git_lists(tmp_path, home):
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    tree(outer, {"train.py": "", "nested/n.py": "", "nested/local_secret.txt": "", "nested/model.ckpt": "",
                 "nested/deeper/d.py": "", "nested/deeper/d.tmp": ""})
    git(outer / "nested", "init", "-q")
    (outer / "nested" / ".git" / "info" / "exclude").write_text("local_secret.txt\n")
    git(outer / "nested" / "deeper", "init", "-q")
    (outer / "nested" / "deeper" / ".git" / "info" / "exclude").write_text("*.tmp\n")
    (home / "excludes").write_text("*.ckpt\n")
    git(outer, "config", "--global", "core.excludesFile", str(home / "excludes"))
    assert git(outer / "nested", "ls-files", "-co", "--exclude-standard").split() == ["deeper/", "n.py"]
    assert shipped(outer) == ["nested/deeper/d.py", "nested/n.py", "train.py"]
    assert shipped(outer / "nested") == ["deeper/d.py", "n.py"]


def test_a_submodule_ships_what_its_own_git_lists(tmp_path, home):
    lib = tmp_path / "lib"
    lib.mkdir()
    git(lib, "init", "-q")
    tree(lib, {"l.py": ""})
    git(lib, "add", "l.py")
    git(lib, "commit", "-q", "-m", "lib")
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    tree(outer, {"train.py": ""})
    git(outer, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "sub")
    tree(outer, {"sub/scratch.tmp": "", "sub/new.py": ""})
    (outer / ".git" / "modules" / "sub" / "info").mkdir(exist_ok=True)
    (outer / ".git" / "modules" / "sub" / "info" / "exclude").write_text("*.tmp\n")
    assert sorted(git(outer / "sub", "ls-files", "-co", "--exclude-standard").split()) == ["l.py", "new.py"]
    assert shipped(outer) == [".gitmodules", "sub/l.py", "sub/new.py", "train.py"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="hands the repository to another uid with chown (root)")
def test_a_nested_repository_git_refuses_is_a_problem_a_clusterctlignore_line_solves(tmp_path, home):
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    tree(outer, {"train.py": "", "nested/n.py": "", "nested/local_secret.txt": ""})
    git(outer / "nested", "init", "-q")
    for p in [outer / "nested", *(outer / "nested").rglob("*")]:
        os.chown(p, OTHER_UID, OTHER_UID, follow_symlinks=False)
    (problem,) = refused(outer).problems
    nested = (outer / "nested").resolve()
    assert problem.startswith("nested/: a nested git repository git cannot list (detected dubious ownership")
    assert f"safe.directory {shlex.quote(str(nested))}, or leave it out" in problem
    line = problem.split('the line "')[1].split('"')[0]
    assert line == "/nested/"
    (outer / ".clusterctlignore").write_text(line + "\n")
    assert shipped(outer) == [".clusterctlignore", "train.py"]


# --------------------------------------------------------------------------- 3. credentials

#: For every row of CREDENTIALS (same order), paths it decides; the "!" row's ship.
SAMPLES: dict[str, list[str]] = {
    "id_rsa*": ["id_rsa", "ID_RSA", "keys/id_rsa_work", "id_rsa.old"],
    "id_dsa*": ["id_dsa"],
    "id_ecdsa*": ["id_ecdsa", "id_ecdsa_sk"],
    "id_ed25519*": ["id_ed25519", "keys/Id_Ed25519"],
    "!*.pub": ["id_ed25519.pub", "keys/ID_RSA.PUB", "id_ecdsa_sk.pub", "deploy.pub"],
    ".env": [".env", "conf/.ENV"],
    ".env.*": [".env.prod", ".env.example"],
    ".envrc": [".envrc"],
    ".ssh/": [".ssh/", "home/.ssh/"],
    "*.pem": ["server.pem", "Server.PEM"],
    "*.key": ["tls.key"],
    "*.p12": ["certs/client.p12"],
    "*.pfx": ["a.pfx"],
    "*.ppk": ["putty.ppk"],
    "*.jks": ["trust.jks"],
    "*.keystore": ["release.keystore"],
    "*.kdbx": ["vault.kdbx"],
    ".netrc": [".netrc"],
    ".pypirc": [".pypirc"],
    ".npmrc": [".npmrc"],
    ".git-credentials": [".git-credentials"],
    ".aws/": [".aws/"],
    "**/.docker/config.json": [".docker/config.json", "home/.docker/config.json"],
    "**/.kube/config": [".kube/config"],
    ".gnupg/": [".gnupg/"],
    ".vault-token": [".vault-token"],
    "credentials": ["credentials"],
    "credentials.json": ["credentials.json"],
    "*.credentials": ["db.credentials"],
    ".htpasswd": [".htpasswd"],
    "kubeconfig": ["kubeconfig", "clusters/KUBECONFIG"],
    "kubeconfig*.yaml": ["kubeconfig.yaml", "kubeconfig-prod.yaml"],
    "kubeconfig*.yml": ["kubeconfig.yml"],
    "*.kubeconfig": ["prod.kubeconfig"],
    "*service[-_]account*.json": ["service-account.json", "my_service_account.json",
                                  "gcp-service-account-key.json"],
    "sa[-_]key*.json": ["sa-key.json", "sa_key_prod.json"],
    "*[-_]sa[-_]key*.json": ["gcp-sa-key.json", "prod_sa_key.json"],
    "application_default_credentials.json": ["application_default_credentials.json"],
    ".config/gcloud/": [".config/gcloud/"],
    ".azure/": [".azure/"],
    ".pgpass": [".pgpass"],
    ".my.cnf": [".my.cnf"],
    ".s3cfg": [".s3cfg"],
    ".boto": [".boto"],
    "*.tfstate": ["terraform.tfstate", "infra/prod.tfstate"],
    "*.tfstate.backup": ["terraform.tfstate.backup"],
    ".dockercfg": [".dockercfg"],
    ".hf_token": [".hf_token"],
    "**/.huggingface/token": [".huggingface/token"],
    "**/huggingface/token": [".cache/huggingface/token", "hf_home/huggingface/token"],
    "**/huggingface/stored_tokens": [".cache/huggingface/stored_tokens"],
}

#: Names close to a credential's that are code or data, and ship.
NOT_CREDENTIALS = ["token", "tokenizer.json", "config.json", "kubeconfig.py", "visa-keys.json",
                   "terraform.tf", "my.cnf", "boto.cfg", "huggingface/config.json", "keys.py",
                   "service.py", "public.pub"]


def test_every_credential_row_has_samples():
    assert list(SAMPLES) == [pattern for pattern, _ in CREDENTIALS]


@pytest.mark.parametrize(("pattern", "path"), [(p, x) for p, xs in SAMPLES.items() for x in xs])
def test_a_credential_row(tmp_path, pattern, path):
    tree(tmp_path, {"train.py": "", path + ("secret" if path.endswith("/") else ""): "s3cr3t"})
    left: list = []
    ships = shipped(tmp_path, left_out=left)
    if pattern.startswith("!"):
        assert path in ships and left == []
    else:
        assert ships == ["train.py"]
        assert [(x.path, x.why) for x in left] == [(path, dict(CREDENTIALS)[pattern])]


def test_near_names_ship(tmp_path):
    tree(tmp_path, dict.fromkeys(NOT_CREDENTIALS, ""))
    left: list = []
    assert shipped(tmp_path, left_out=left) == sorted(NOT_CREDENTIALS) and left == []


# --------------------------------------------------------------------------- 4. the allow line


@pytest.mark.parametrize("name", ["a[1].pem", "certs/b*.key", "c?.p12", "sp ace.pem", "#x.pem", "!x.pem",
                                  "back\\slash.pem", "d]e.pem", ".env.[prod]"])
def test_the_allow_line_allows_exactly_that_file(tmp_path, name):
    decoys = {"a1.pem": "", "certs/bb.key": "", "cc.p12": "", "x.pem": ""}
    tree(tmp_path, {name: "allowed", **decoys})
    left: list = []
    walk(tmp_path, left_out=left)
    (mine,) = [x for x in left if x.path == name]
    (tmp_path / ".clusterctlignore").write_text(mine.allow_line + "\n")
    left = []
    assert name in shipped(tmp_path, left_out=left)
    assert sorted(x.path for x in left) == sorted(decoys)


def test_an_unescaped_glob_on_a_bang_line_is_a_wildcard_and_takes_nothing_back(tmp_path):
    tree(tmp_path, {"a[1].pem": "", "a1.pem": "", ".clusterctlignore": "!/a[1].pem\n"})
    left: list = []
    assert shipped(tmp_path, left_out=left) == [".clusterctlignore"]
    assert sorted(x.path for x in left) == ["a1.pem", "a[1].pem"]
    assert [x.allow_line for x in sorted(left, key=lambda x: x.path)] == ["!/a1.pem", "!/a\\[1\\].pem"]


def test_the_dry_run_hint_followed_ships_the_file(tmp_path, home):
    proj = tree(tmp_path / "proj", {"train.py": "", "a[1].pem": "ca"})
    out = dry_run(tmp_path, proj)
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("# code: left out")]
    allow = line.split('to ship it, name it: "')[1].split('"')[0]
    assert allow == "!/a\\[1\\].pem"
    (proj / ".clusterctlignore").write_text(allow + "\n")
    out = dry_run(tmp_path, proj)
    assert out.returncode == 0 and "left out" not in out.stdout
    assert "3 files" in out.stdout.splitlines()[0]


# --------------------------------------------------------------------------- 5. shell-quoted hints


@pytest.mark.parametrize(("name", "target"), [
    ("x; touch PWNED #", "train.py"), ("$(touch PWNED)", "train.py"), ("-f", "train.py"),
    ("sub/it's", "-t.py"), ("a b", "sub dir/m.py"),
])
def test_the_suggested_ln_command_is_quoted_and_does_what_it_says(tmp_path, name, target):
    root = tree(tmp_path / "proj", {"train.py": "", "-t.py": "", "sub dir/m.py": "", "sub/x.py": ""})
    (root / name).symlink_to(root / target)
    (problem,) = refused(root).problems
    command = problem.split("valid: a relative link (")[1].split("), or leave it out")[0]
    assert command.startswith("ln -sfn ")
    subprocess.run(["sh", "-c", command], cwd=root, check=True)
    assert not list(tmp_path.rglob("PWNED"))
    found = {f.path: f for f in walk(root)}
    assert found[name].kind == "link"
    assert os.path.realpath(root / name) == str((root / target).resolve())


# --------------------------------------------------------------------------- the command line


def dry_run(tmp_path: Path, workdir: Path) -> subprocess.CompletedProcess:
    """``clusterctl launch --dry-run`` on ``workdir``, as a user runs it (a real process)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "CLUSTERCTL_RUNS": str(tmp_path / "runs")}
    return subprocess.run(
        [sys.executable, "-m", "clusterctl", "launch", "--target", "cpu", "--workdir", str(workdir),
         "--nodes", str(REPO_ROOT / "inventories" / "example.yaml"), "--dry-run", "--", "python", "train.py"],
        env=env, capture_output=True, text=True, timeout=120, check=False)
