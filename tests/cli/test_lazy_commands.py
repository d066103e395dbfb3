"""The top-level command group loads a command's module only when that command runs.

:data:`clusterctl.cli.COMMANDS` names each command's module; these tests fail when the
table and the modules' ``register`` disagree (a command missing from ``--help``, or one
listed that nothing declares), and when a command's run imports another command's module
(an eager import in the package would make every ``clusterctl`` process pay for all).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import clusterctl.cli as cli
from tests.fixtures import REPO

CLI_DIR = Path(cli.__file__).parent


def _modules_with_register() -> set[str]:
    return {p.stem for p in CLI_DIR.glob("*.py")
            if any(isinstance(n, ast.FunctionDef) and n.name == "register"
                   for n in ast.parse(p.read_text()).body)}


def test_every_module_that_registers_commands_is_in_the_table():
    assert _modules_with_register() == set(cli.COMMANDS.values())


@pytest.mark.parametrize("module", sorted(set(cli.COMMANDS.values())))
def test_a_module_registers_exactly_the_commands_the_table_gives_it(module):
    assert set(cli.registered(module)) == {c for c, m in cli.COMMANDS.items() if m == module}


def test_help_lists_every_command_in_table_order():
    got = CliRunner().invoke(cli.app, ["--help"], terminal_width=200)
    assert got.exit_code == 0, got.output
    listed = [line.split()[0] for line in got.output.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == list(cli.COMMANDS)


def test_an_unknown_command_is_refused_with_a_suggestion():
    got = CliRunner().invoke(cli.app, ["nodez"])
    assert got.exit_code == 2
    assert "No such command 'nodez'" in got.output and "nodes" in got.output


@pytest.mark.parametrize("command", ["nodes", "exec", "targets"])
def test_a_command_imports_no_other_commands_module(command):
    """A fresh interpreter runs ``clusterctl COMMAND --help`` and lists the command
    modules it imported: only the command's own (and what that one imports on purpose)."""
    probe = ("import sys\nfrom clusterctl.cli import app\n"
             f"try:\n    app([{command!r}, '--help'])\nexcept SystemExit:\n    pass\n"
             "print(' '.join(m.rsplit('.', 1)[1] for m in sys.modules "
             "if m.startswith('clusterctl.cli.')))")
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=REPO, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                     "PYTHONPATH": f"{REPO / 'src'}:{REPO}"})
    assert got.returncode == 0, got.stderr
    loaded = set(got.stdout.split()[-1:] and got.stdout.splitlines()[-1].split())
    own = cli.COMMANDS[command]
    others = loaded & set(cli.COMMANDS.values()) - {own, "nodes"}  # --nodes is shared
    assert own in loaded and not others, loaded
