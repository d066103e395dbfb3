"""The generated reference pages (docs/hooks.py, clusterctl.cli.reference) hold what the
code holds: every command and option of the real click tree, every key of the job-file
and inventory models (each with a description), the environment a real plan gives every
container, and every exit status the source can end with.

Each check walks the real objects on its own (not through the renderer) so a command,
option, key, variable or status the renderer dropped, or one added to the code without
its documentation, fails here.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest
import typer
import typer.main
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from clusterctl.cli import app, reference
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.inventory.model import (
    DEFAULT_FIELDS,
    NODE_FIELDS,
    SSH_FIELDS,
    TOP_FIELDS,
    Defaults,
    InventoryFile,
    Node,
    SSHSettings,
)
from clusterctl.core import exitcodes
from clusterctl.image import targets
from clusterctl.run import jobs, plan, recovery
from clusterctl.run.jobs import load_job
from tests.fixtures import REPO

SRC = REPO / "src" / "clusterctl"
JOB_EXAMPLE = REPO / "jobs" / "ddp-smoke.yaml"
INVENTORY_EXAMPLE = REPO / "inventories" / "example.yaml"


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return reference.reference_pages(("jobs/ddp-smoke.yaml", JOB_EXAMPLE.read_text()),
                                     ("inventories/example.yaml", INVENTORY_EXAMPLE.read_text()))


# --------------------------------------------------------------------------- the CLI page

def _tree(cmd, path=("clusterctl",), parent=None):
    """(path, command, ctx) of every visible command, walked here independently."""
    ctx = typer.Context(cmd, info_name=path[-1], parent=parent)
    yield path, cmd, ctx
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if not sub.hidden:
                yield from _tree(sub, (*path, name), ctx)


def _sections(page: str) -> dict[str, str]:
    """Command name -> its section of the CLI page (from its heading to the next)."""
    parts = re.split(r"^#{2,3} `([^`]+)` \{ #[a-z0-9-]+ \}$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


ROOT = typer.main.get_command(app)
COMMANDS = list(_tree(ROOT))


def test_the_tree_is_the_whole_cli():
    """The walk below sees the commands `clusterctl --help` lists and the groups' commands."""
    names = {" ".join(p[1:]) for p, _, _ in COMMANDS}
    assert {"launch", "check", "push", "export", "sandbox up", "engine status"} <= names


@pytest.mark.parametrize("path,cmd,ctx", COMMANDS, ids=[" ".join(p) for p, _, _ in COMMANDS])
def test_every_command_and_option_is_on_the_cli_page(pages, path, cmd, ctx):
    section = _sections(pages["reference/cli.md"])[" ".join(path)]
    assert cmd.get_usage(ctx) in section
    first_help_line = (cmd.help or "").strip().splitlines()[0]
    assert reference.md(first_help_line) in section
    for param in cmd.get_params(ctx):
        if param.hidden:
            continue
        names = param.opts + param.secondary_opts if param.param_type_name == "option" \
            else [(param.metavar or param.name).upper()]
        for name in names:
            assert f"`{name}`" in section, f"{' '.join(path)}: {name} missing"
        if param.help:
            assert reference.md(param.help, cell=True) in section
        if param.required:
            row = next(line for line in section.splitlines() if line.startswith(f"| `{names[0]}`"))
            assert "| required |" in row


@pytest.mark.parametrize("path,cmd,ctx", COMMANDS, ids=[" ".join(p) for p, _, _ in COMMANDS])
def test_every_command_lists_its_exit_statuses(pages, path, cmd, ctx):
    section = _sections(pages["reference/cli.md"])[" ".join(path)]
    line = next(ln for ln in section.splitlines() if ln.startswith("**Exit status:**"))
    shown = {int(c) for c in re.findall(r"`(\d+)`", line)}
    assert {0, 1, 2} <= shown
    if path == ("clusterctl", "launch"):
        assert {120, 121, 122, 124, 125, 130, 143, 255} <= shown and "any other" in line
    elif path == ("clusterctl", "attach"):      # it ends with the run's exit status
        assert {120, 121, 122, 124, 125, 130, 143, 255} <= shown and "any other" in line
    else:
        assert 124 not in shown


def test_commands_come_in_help_order(pages):
    """The top-level commands appear in the order `clusterctl --help` prints them."""
    result = CliRunner().invoke(app, ["--help"], prog_name="clusterctl", env={"COLUMNS": "200"})
    listed = re.search(r"Commands:\n(.*)", result.output, re.S).group(1)
    help_order = [line.split()[0] for line in listed.splitlines() if line.startswith("  ") and line.split()]
    headings = [name.split()[1] for name in _sections(pages["reference/cli.md"])
                if len(name.split()) == 2]
    assert headings == help_order


def test_a_tiny_app_renders_defaults_types_and_keeps_hidden_things_hidden():
    tiny = typer.Typer(rich_markup_mode=None)

    @tiny.command("shown")
    def shown(name: str = typer.Argument(..., help="Who."),
              count: int = typer.Option(7, "--count", min=1, help="How many <at most>."),
              fast: bool = typer.Option(False, "--fast/--slow", help="Speed."),
              secret: str = typer.Option("x", "--hidden-opt", hidden=True)) -> None:
        """Say hello to NAME."""

    @tiny.command("ghost", hidden=True)
    def ghost() -> None:
        """Not for users."""

    page = reference.cli_page(typer.main.get_command(tiny), prog="tiny")
    sections = _sections(page)
    assert set(sections) == {"tiny", "tiny shown"}
    shown_section = sections["tiny shown"]
    assert "| `NAME` | `str` | required | Who. |" in shown_section
    assert "| `--count` | `int range` | `7` | How many &lt;at most&gt;. At least 1. |" in shown_section
    assert "| `--fast` / `--slow` | flag | `--slow` | Speed. |" in shown_section
    assert "hidden-opt" not in page and "ghost" not in page


# --------------------------------------------------------------------------- model keys

def _all_fields(model: type[BaseModel], prefix: str = ""):
    """(key path, FieldInfo) of every field, nested models included, walked here."""
    for name, info in model.model_fields.items():
        yield prefix + name, info
        inner = [a for a in (info.annotation, *typing.get_args(info.annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if inner:
            many = typing.get_origin(info.annotation) is list
            yield from _all_fields(inner[0], f"{prefix}{name}{'[]' if many else ''}.")


@pytest.mark.parametrize("model,page", [(jobs._Spec, "reference/job-file.md"),
                                        (InventoryFile, "reference/inventory.md")])
def test_every_key_has_a_description_and_is_on_its_page(pages, model, page):
    keys = list(_all_fields(model))
    assert len(keys) > 10
    for key, info in keys:
        assert info.description and len(info.description) > 10, f"{key} has no description"
        assert f"| `{key}` |" in pages[page]
        assert reference.md(info.description, cell=True) in pages[page]


def test_nested_keys_are_spelled_with_their_path(pages):
    inv = pages["reference/inventory.md"]
    for key in ("ssh.tree", "ssh.node_identity_file", "defaults.env", "nodes[].slots", "nodes[].host"):
        assert f"| `{key}` |" in inv
    assert "| `nodes[].host` | text | required |" in inv
    assert "| `nodes[].name` | text | the host |" in inv
    assert "| `master_port` | integer 1 to 65535 | `29500` |" in inv
    assert "| `nproc_per_node` | integer or \"slots\" | `slots` |" in pages["reference/job-file.md"]


def test_the_models_hold_every_key_the_readers_accept():
    """The documented models are the ones the readers validate with (the key tuples)."""
    assert tuple(InventoryFile.model_fields) == TOP_FIELDS
    assert tuple(Defaults.model_fields) == DEFAULT_FIELDS
    assert set(Node.model_fields) == set(NODE_FIELDS)
    assert tuple(SSHSettings.model_fields) == SSH_FIELDS
    assert InventoryFile.model_fields["ssh"].annotation is SSHSettings
    assert set(jobs._Spec.model_fields) == set(jobs.KEY_HELP)
    assert tuple(jobs.PLACEHOLDERS) == jobs.LAUNCH_VALUES


def test_a_new_model_key_appears_with_type_default_and_description():
    class Leaf(BaseModel):
        depth: typing.Annotated[int, Field(ge=2, le=9)] = Field(3, description="How deep it goes.")

    class Tiny(BaseModel):
        name: str = Field(description="The name, `required`.")
        tags: list[str] = Field(default_factory=list, description="Some tags.")
        leaf: Leaf = Field(default_factory=Leaf, description="One leaf.")
        leaves: list[Leaf] = Field([], description="Many leaves.")

    rows = {r.key: r for r in reference.model_keys(Tiny)}
    assert list(rows) == ["name", "tags", "leaf", "leaves", "leaf.depth", "leaves[].depth"]
    assert (rows["name"].type, rows["name"].default, rows["name"].required) == ("text", "required", True)
    assert (rows["tags"].type, rows["tags"].default) == ("list of text", "`[]`")
    assert rows["leaves[].depth"].type == "integer 2 to 9"
    assert rows["leaves[].depth"].default == "`3`"
    assert rows["leaf.depth"].description == "How deep it goes."
    table = reference.keys_table(rows.values())
    assert "| `leaves[].depth` | integer 2 to 9 | `3` | How deep it goes. |" in table


@pytest.mark.parametrize("page,path", [("reference/job-file.md", JOB_EXAMPLE),
                                       ("reference/inventory.md", INVENTORY_EXAMPLE)])
def test_the_complete_examples_are_the_shipped_files_verbatim(pages, page, path):
    assert f"```yaml\n{path.read_text().rstrip()}\n```" in pages[page]


def test_the_examples_are_valid():
    assert load_job(JOB_EXAMPLE).command
    assert len(load_inventory(INVENTORY_EXAMPLE)) == 3


# --------------------------------------------------------------------------- environment

@pytest.fixture
def two_nodes(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent("""
        nodes:
          - {name: n1, host: 10.0.0.11, slots: 2}
          - {name: n2, host: 10.0.0.12, slots: 2}
    """))
    return load_inventory(path)


def test_the_environment_table_is_what_a_real_plan_gives_every_container(two_nodes, pages):
    job = load_job("ddp-smoke")
    plans = plan.make_plan(job, two_nodes, run_id="r1", interfaces={"n1": "eth0", "n2": "eth1"})
    own = set(job.env) | set(targets.get_target(job.target).env) | set(jobs.CONTRACTS[job.contract])
    for p in plans:
        assert set(p.env) - own == set(plan.CONTAINER_ENV) | set(recovery.RESUME_ENV) - {
            "CLUSTERCTL_CHECKPOINT_DIR"}, p.node      # that one only with a checkpoint
    for name in [*plan.CONTAINER_ENV, *recovery.RESUME_ENV]:
        assert f"| `{name}` |" in pages["reference/environment.md"]


@pytest.mark.parametrize("contract", list(jobs.CONTRACTS))
def test_each_contract_adds_what_the_page_says(tmp_path, two_nodes, pages, contract):
    job_file = tmp_path / "j.yaml"
    job_file.write_text(f"target: cpu\ncontract: {contract}\ncommand: [true]\n")
    [p, _] = plan.make_plan(load_job(job_file), two_nodes, run_id="r1")
    added = set(p.env) - set(plan.CONTAINER_ENV) - set(targets.get_target("cpu").env) - set(recovery.RESUME_ENV)
    assert added == set(jobs.CONTRACTS[contract])
    row = next(ln for ln in pages["reference/environment.md"].splitlines() if ln.startswith(f"| `{contract}` |"))
    assert sorted(re.findall(r"`([A-Z_]+)` =", row)) == sorted(added)


def test_the_precedence_the_page_lists_is_the_plans(tmp_path, pages):
    """Turn the layers on lowest first: each one the page lists later wins."""
    layers = [name for name, _ in plan.ENV_LAYERS]
    assert layers == ["target", "job", "inventory", "--set"]
    var = next(iter(targets.get_target("cpu").env))         # OMP_NUM_THREADS
    for top in range(len(layers)):
        on = set(layers[:top + 1])
        job_file = tmp_path / "j.yaml"
        job_file.write_text(f"target: cpu\ncommand: [true]\nenv: {{{var}: job, NNODES: job}}\n"
                            if "job" in on else "target: cpu\ncommand: [true]\n")
        inv = tmp_path / "inv.yaml"
        inv.write_text("nodes:\n  - {host: 10.0.0.11" + (f", env: {{{var}: inventory}}" if "inventory" in on else "")
                       + "}\n")
        sets = {var: "--set"} if "--set" in on else {}
        [p] = plan.make_plan(load_job(job_file), load_inventory(inv), run_id="r", overrides=sets)
        expected = layers[top] if layers[top] != "target" else targets.get_target("cpu").env[var]
        assert p.env[var] == expected
        assert p.env["NNODES"] == ("job" if "job" in on else "1")   # any layer beats the launch values
    listed = re.findall(r"^\d\. \*\*(.+?)\*\*", pages["reference/environment.md"], re.M)
    assert listed == ["launch values", *[reference.md(n) for n in layers]]


def test_the_environment_page_has_the_add_host_note(pages):
    assert "--add-host NAME:ADDRESS" in pages["reference/environment.md"]
    assert plan.host_entries({"n1": "10.0.0.11"}) == ["--add-host=n1:10.0.0.11", "--add-host=n1:::ffff:10.0.0.11"]


# --------------------------------------------------------------------------- exit statuses

def _raised_literals() -> dict[int, list[str]]:
    """Every exit status written as a number in the source: ``typer.Exit(N)``, ``ctx.exit(N)``,
    ``exit_code = N`` (class attributes), ``exit_code=N`` keywords and ``*_EXIT = N``.
    run/mpi.py is left out: it is the spawner inside the container, not a command."""
    found: dict[int, list[str]] = {}

    def note(node, where):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            found.setdefault(node.value, []).append(where)
        elif isinstance(node, ast.IfExp):
            note(node.body, where)
            note(node.orelse, where)

    for path in sorted(SRC.rglob("*.py")):
        if path.name == "mpi.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if name in ("Exit", "exit") and node.args:
                    note(node.args[0], where)
                for kw in node.keywords:
                    if kw.arg == "exit_code":
                        note(kw.value, where)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    tname = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
                    if tname == "exit_code" or tname.endswith("_EXIT"):
                        note(node.value, where)
    return found


def test_every_exit_status_the_code_raises_is_in_the_table():
    found = _raised_literals()
    assert 1 in found     # the scan sees the CLI's typer.Exit(1)
    missing = {code: where for code, where in found.items() if code not in exitcodes.codes()}
    assert not missing, f"exit statuses not in clusterctl.core.exitcodes: {missing}"


def test_the_named_exit_statuses_are_the_tables():
    from clusterctl.core.errors import ClusterctlError, UserError
    from clusterctl.run import records, supervise, suspicious, watchdog

    used = {ClusterctlError.exit_code, UserError.exit_code, watchdog.HANG_EXIT,
            suspicious.SUSPICIOUS_EXIT, supervise.NODE_LOST_EXIT, supervise.INTERRUPTED_EXIT,
            supervise.TERMINATED_EXIT, records.STOPPED_EXIT}
    assert used <= exitcodes.codes()
    assert (UserError.exit_code, watchdog.HANG_EXIT, supervise.NODE_LOST_EXIT) == (2, 124, 255)


def test_the_exit_status_page_has_every_row(pages):
    page = pages["reference/exit-status.md"]
    codes = [s.code for s in exitcodes.EXIT_STATUSES if s.code is not None]
    assert codes == sorted(set(codes))
    for s in exitcodes.EXIT_STATUSES:
        cell = f"`{s.code}`" if s.code is not None else "other"
        assert f"| {cell} | {reference.md(s.name, cell=True)} | {reference.md(s.meaning, cell=True)} |" in page


def test_text_is_escaped_for_markdown_outside_code():
    assert reference.md("runs/<run-id>/ and PET_* `a_<b>`") == r"runs/&lt;run-id&gt;/ and PET\_\* `a_<b>`"
    assert reference.md("a | b `x|y`\nnext", cell=True) == r"a &#124; b `x\|y` next"


# --------------------------------------------------------------------------- the real site

@pytest.mark.slow
def test_the_real_site_builds_strict_with_the_generated_pages(tmp_path):
    """(That the committed pages are what the code renders: tests/docs/test_reference_pages.py.)"""
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for path, _, _ in COMMANDS:
        assert f'id="{reference.anchor(" ".join(path))}"' in cli
        assert f"<code>{' '.join(path)}</code>" in cli
    for page in reference.PAGES:
        html = site / Path(page).with_suffix("") / "index.html"
        assert html.is_file(), page
