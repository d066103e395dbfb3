"""The reference pages of the documentation site, rendered from the code itself.

Pure: objects in, Markdown text out (docs/hooks.py reads the example files, writes the
pages to docs/reference/ for ``make reference`` and checks them when the site is built;
nothing here reads a file or touches a machine).

* :func:`cli_page` walks the click command tree typer builds from the app
  (``typer.main.get_command(app)``): every command in ``--help`` order, its help, usage,
  arguments and options (hidden ones stay hidden) and the exit statuses of
  :mod:`clusterctl.core.exitcodes` that apply to it.
* :func:`model_keys` / :func:`keys_table` turn a pydantic model's fields (their
  ``Field(description=...)``, type, default and constraints) into rows, nested
  models and lists of models included (``ssh.tree``, ``nodes[].slots``); the job-file
  and inventory pages are built on them.
* :func:`environment_page` and :func:`exit_status_page` render the tables of
  :mod:`clusterctl.run.plan` (``CONTAINER_ENV``, ``ENV_LAYERS``) and
  :mod:`clusterctl.core.exitcodes`.

typer >= 0.29 carries its own copy of click and no longer installs click: nothing is
imported from ``click`` here; the command and parameter objects are read through
their attributes (``opts``, ``help``, ``hidden``, ``get_params``, ``list_commands``).
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import typer.main
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from clusterctl.core import exitcodes, secretnames
from clusterctl.core.exitcodes import EXIT_STATUSES, ExitStatus

#: The page paths (relative to docs/) this module renders, in nav order.
PAGES = ("reference/cli.md", "reference/job-file.md", "reference/inventory.md",
         "reference/environment.md", "reference/exit-status.md")

_GENERATED = ("<!-- Generated from {source} by `make reference` (docs/hooks.py); "
              "do not edit: the site's build and the tests check it against the code. -->\n\n")


# --------------------------------------------------------------------------- Markdown text

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_SPECIAL = re.compile(r"[\\*_<>\[\]|#]")
#: Python-Markdown takes a backslash escape for these; ``<``, ``>`` and ``|`` become entities.
_ENTITY = {"<": "&lt;", ">": "&gt;", "|": "&#124;"}


def _escape(text: str) -> str:
    return _SPECIAL.sub(lambda m: _ENTITY.get(m.group(0), "\\" + m.group(0)), text)


def md(text: str, *, cell: bool = False) -> str:
    """``text`` as Markdown that shows as written: characters Markdown would read as markup
    (``*``, ``_``, ``<run-id>``, ``[...]``) escaped outside `code spans`, which are kept.
    ``cell``: for a table cell (one line; ``|`` escaped inside code spans too)."""
    out, last = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_escape(text[last:m.start()]))
        span = m.group(0)
        out.append(span.replace("|", "\\|") if cell else span)
        last = m.end()
    out.append(_escape(text[last:]))
    result = "".join(out)
    return " ".join(result.split()) if cell else result


def code(text: str) -> str:
    """``text`` as one inline code span (any backticks in it fenced by longer runs)."""
    text = str(text)
    ticks = "`" * (max((len(t) for t in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _fence(text: str, lang: str = "text") -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}\n"


def anchor(path: str) -> str:
    """The id of a command's heading on the CLI page: ``clusterctl-sandbox-up``."""
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


# --------------------------------------------------------------------------- the CLI

@dataclass(frozen=True)
class CommandDoc:
    """One command of the tree: its path (``("clusterctl", "sandbox", "up")``), the click
    command object and the context it was reached with."""

    path: tuple[str, ...]
    command: Any
    ctx: Any

    @property
    def name(self) -> str:
        return " ".join(self.path)

    @property
    def sub_path(self) -> str:
        """The path without the program: ``"sandbox up"`` ("" for the root)."""
        return " ".join(self.path[1:])

    @property
    def is_group(self) -> bool:
        return hasattr(self.command, "list_commands")


def walk_commands(command, prog: str = "clusterctl") -> list[CommandDoc]:
    """The root and every visible command below it, depth first, each group's commands in
    their ``--help`` order."""
    found: list[CommandDoc] = []

    def visit(cmd, path: tuple[str, ...], parent) -> None:
        ctx = typer.Context(cmd, info_name=path[-1], parent=parent)
        found.append(CommandDoc(path, cmd, ctx))
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None and not getattr(sub, "hidden", False):
                    visit(sub, (*path, name), ctx)

    visit(command, (prog,), None)
    return found


def visible_params(doc: CommandDoc) -> list:
    """The command's arguments and options as ``--help`` lists them, hidden ones left out."""
    return [p for p in doc.command.get_params(doc.ctx) if not getattr(p, "hidden", False)]


def _is_argument(param) -> bool:
    return getattr(param, "param_type_name", None) == "argument" or type(param).__name__.endswith("Argument")


def _param_name(param) -> str:
    if _is_argument(param):
        return code((param.metavar or param.name).upper())
    names = ", ".join(code(o) for o in param.opts)
    if param.secondary_opts:
        names += " / " + ", ".join(code(o) for o in param.secondary_opts)
    return names


def _param_type(param, ctx) -> str:
    if getattr(param, "is_flag", False) and not _is_argument(param):
        return "flag"
    if param.metavar:
        shown = param.metavar
    else:
        shown = param.display_type(ctx).strip("<>")
        if param.multiple and shown.startswith("list[") and shown.endswith("]"):
            shown = shown[5:-1]
    return code(shown) + (" (repeatable)" if param.multiple else "")


def _param_default(param, ctx) -> str:
    if param.required:
        return "required"
    default = param.get_default(ctx, call=False)
    if callable(default):
        return "(computed)"
    if getattr(param, "is_flag", False) and not _is_argument(param):
        if param.secondary_opts:
            if default is None:
                return "not set"
            return code(param.opts[0] if default else param.secondary_opts[0])
        return "off" if not default else "on"
    if default is None or default == () or default == []:
        return "not set"
    if isinstance(default, list | tuple):
        return ", ".join(code(d) for d in default)
    return code(default)


def _param_help(param) -> str:
    parts = [param.help or ""]
    if param.envvar:
        names = param.envvar if isinstance(param.envvar, list | tuple) else [param.envvar]
        parts.append("Environment variable: " + ", ".join(f"`{n}`" for n in names) + ".")
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    if lo is not None and hi is not None:
        parts.append(f"Range: {lo} to {hi}.")
    elif lo is not None:
        parts.append(f"At least {lo}.")
    elif hi is not None:
        parts.append(f"At most {hi}.")
    return md(" ".join(p for p in parts if p), cell=True)


def exit_line(statuses: Iterable[ExitStatus]) -> str:
    """``**Exit status:** `0` ok, `1` failed, ...``: a command's statuses, by name."""
    parts = [f"{code(s.code)} {md(s.name)}" if s.code is not None else f"any other: {md(s.name)}"
             for s in statuses]
    return f"**Exit status:** {', '.join(parts)} ([what each means](exit-status.md)).\n"


def command_section(doc: CommandDoc, level: int = 2) -> str:
    """One command's section: heading, help, usage, parameters, sub-commands, exit statuses."""
    cmd = doc.command
    out = [f"{'#' * level} `{doc.name}` {{ #{anchor(doc.name)} }}\n"]
    if getattr(cmd, "deprecated", False):
        out.append("*Deprecated.*\n")
    if cmd.help:
        out.append(md(typing.cast(str, cmd.help)).strip() + "\n")
    out.append(_fence(cmd.get_usage(doc.ctx)))
    params = visible_params(doc)
    args = [p for p in params if _is_argument(p)]
    opts = [p for p in params if not _is_argument(p)]
    for title, group in (("Arguments", args), ("Options", opts)):
        if group:
            out.append(f"**{title}**\n")
            out.append(_table(["name", "type", "default", "description"],
                              [[_param_name(p), _param_type(p, doc.ctx), _param_default(p, doc.ctx),
                                _param_help(p)] for p in group]))
    if doc.is_group and len(doc.path) > 1:
        subs = [(name, cmd.get_command(doc.ctx, name)) for name in cmd.list_commands(doc.ctx)]
        rows = [[f"[`{doc.name} {name}`](#{anchor(f'{doc.name} {name}')})",
                 md(sub.get_short_help_str(limit=120), cell=True)]
                for name, sub in subs if sub is not None and not getattr(sub, "hidden", False)]
        out.append("**Commands**\n")
        out.append(_table(["command", "what it does"], rows))
    out.append(exit_line(exitcodes.statuses_for(doc.sub_path or "clusterctl")))
    return "\n".join(out)


def cli_page(command, prog: str = "clusterctl") -> str:
    """reference/cli.md: every command of the click tree ``command``, in ``--help`` order."""
    docs = walk_commands(command, prog)
    out = [_GENERATED.format(source="the typer app (clusterctl.cli.app)"),
           "# CLI reference\n",
           f"Every command of `{prog}`, its arguments and options with their defaults, and the exit "
           "statuses it can end with, generated from the command tree itself (the same text as "
           f"`{prog} COMMAND --help`). Options that name an environment variable take their "
           "default from it. Bad input of any command ends in one message naming what was wrong "
           "and what would be valid, with exit status 2; see [Exit statuses](exit-status.md).\n",
           _table(["command", "what it does"],
                  [[f"[`{d.name}`](#{anchor(d.name)})",
                    md(d.command.get_short_help_str(limit=120), cell=True)] for d in docs[1:]])]
    for d in docs:
        out.append(command_section(d, level=2 if len(d.path) <= 2 else 3))
    return "\n".join(out)


# --------------------------------------------------------------------------- model keys

@dataclass(frozen=True)
class KeyDoc:
    """One key of a YAML file, from a pydantic field: ``section`` is the key path of the
    mapping it belongs to ("" for the top level, ``"nodes[]"``)."""

    key: str
    section: str
    type: str
    default: str
    description: str
    required: bool


_SIMPLE = {str: "text", int: "integer", float: "number", bool: "boolean", Path: "path",
           type(None): "null"}


def _constraints(metadata: Iterable[Any]) -> str:
    got = {}
    for m in metadata:
        for attr in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            value = getattr(m, attr, None)
            if value is not None and not callable(value):
                got[attr] = value
    words = []
    if "ge" in got and "le" in got:
        words.append(f"{got.pop('ge'):g} to {got.pop('le'):g}")
    for attr, word in (("ge", ">= {}"), ("gt", "> {}"), ("le", "<= {}"), ("lt", "< {}")):
        if attr in got:
            words.append(word.format(f"{got[attr]:g}"))
    for attr, word in (("min_length", "at least"), ("max_length", "at most")):
        if attr in got:
            n = got[attr]
            words.append(f"({word} {n} item{'' if n == 1 else 's'})")
    return " ".join(words)


def type_text(annotation: Any, metadata: Iterable[Any] = ()) -> str:
    """A field's type in words: ``integer 1 to 65535``, ``list of text``,
    ``mapping of text to text``, ``integer or "slots"``, ``mapping`` for a model."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0], [*args[1:], *metadata])
    limits = _constraints(metadata)
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a) for a in args if a is not type(None)]
        text = " or ".join(parts)
    elif origin is typing.Literal:
        text = " or ".join(json.dumps(a) for a in args)
    elif origin in (list, tuple, set, frozenset):
        text = f"list of {type_text(args[0])}" if args else "list"
    elif origin is dict:
        text = f"mapping of {type_text(args[0])} to {type_text(args[1])}" if args else "mapping"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        text = "mapping"
    else:
        text = _SIMPLE.get(annotation, getattr(annotation, "__name__", str(annotation)))
    return f"{text} {limits}" if limits else text


def _default_text(info) -> str:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "doc_default" in extra:
        return md(str(extra["doc_default"]), cell=True)
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default
    if value is PydanticUndefined or value is None:
        return "not set"
    if isinstance(value, BaseModel):
        return "see its keys"
    if isinstance(value, bool):
        return code(str(value).lower())
    if value == "":
        return code('""')
    if isinstance(value, float):
        return code(f"{value:g}")
    if isinstance(value, Path):
        return code(str(value))
    if isinstance(value, list | dict):
        return code(json.dumps(value))
    return code(value)


def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the model ``annotation`` holds, whether as a list of them), else (None, False)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _model_in(args[0])
    if origin in (typing.Union, types.UnionType):
        for a in args:
            found = _model_in(a)
            if found[0] is not None:
                return found
        return None, False
    if origin in (list, tuple) and args:
        inner, _ = _model_in(args[0])
        return inner, inner is not None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def model_keys(model: type[BaseModel], prefix: str = "") -> list[KeyDoc]:
    """Every key of ``model``, nested models' keys after theirs (``ssh`` then ``ssh.tree``,
    ``nodes`` then ``nodes[].host``); in each mapping the required keys first, then the
    model's field order; the nested mappings in the model's field order."""
    rows: list[KeyDoc] = []
    nested: list[tuple[type[BaseModel], str]] = []
    fields = sorted(model.model_fields.items(), key=lambda kv: not kv[1].is_required())
    for name, info in fields:
        key = f"{prefix}{name}"
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        inner, many = _model_in(info.annotation)
        if "doc_type" in extra:
            shown = md(str(extra["doc_type"]), cell=True)
        elif inner is not None:
            shown = "list of mappings" if many else "mapping"
            lim = _constraints(info.metadata)
            shown += f" {lim}" if lim else ""
        else:
            shown = md(type_text(info.annotation, info.metadata), cell=True)
        rows.append(KeyDoc(key=key, section=prefix.rstrip("."), type=shown,
                           default=_default_text(info), description=info.description or "",
                           required=info.is_required() and "doc_default" not in extra))
    for name, info in model.model_fields.items():
        inner, many = _model_in(info.annotation)
        if inner is not None:
            nested.append((inner, f"{prefix}{name}[]." if many else f"{prefix}{name}."))
    for inner, sub in nested:
        rows += model_keys(inner, sub)
    return rows


def keys_table(rows: Iterable[KeyDoc]) -> str:
    return _table(["key", "type", "default", "description"],
                  [[code(r.key), r.type, r.default, md(r.description, cell=True)] for r in rows])


def _sections(rows: list[KeyDoc], top_title: str) -> str:
    out, order = [], list(dict.fromkeys(r.section for r in rows))
    for section in order:
        title = top_title if not section else f"`{section}`"
        out.append(f"## {title}\n")
        out.append(keys_table([r for r in rows if r.section == section]))
    return "\n".join(out)


# --------------------------------------------------------------------------- the pages

def job_file_page(spec_model: type[BaseModel], placeholders: Mapping[str, str],
                  example_name: str, example_text: str) -> str:
    """reference/job-file.md: every key of the job file (``spec_model``), the placeholders
    and a complete example (``example_text``, the shipped file, verbatim)."""
    rows = model_keys(spec_model)
    return "\n".join([
        _GENERATED.format(source="the job file's model (clusterctl.run.jobs)"),
        "# Job file reference\n",
        "A job is a small YAML file: what runs in the container on every node (the inventory "
        "says where). Shipped jobs live in `jobs/` and are named by their file stem "
        "(`ddp-smoke`); any other job is given by the path of its file. Unknown keys are an "
        "error, and every problem is reported at once as `FILE:LINE: key: problem; valid: ...` "
        "with exit status 2. `command` is required, and at least one of `target` and `image`.\n",
        _sections(rows, "Keys"),
        "## Placeholders\n",
        "Values in `env`, `command`, `docker_args` and `mounts` may hold `{name}` placeholders, "
        "filled per node at launch; every `params` name is one too. Write `{{` and `}}` for "
        "literal braces. An unknown placeholder is an error naming the file, line and key; values "
        "given with `--set` are never expanded.\n",
        _table(["placeholder", "value"],
               [[code("{" + name + "}"), md(text, cell=True)] for name, text in placeholders.items()]),
        "## A complete example\n",
        f"The shipped `{example_name}`, as it is on disk:\n",
        _fence(example_text, "yaml"),
    ])


def inventory_page(file_model: type[BaseModel], example_name: str, example_text: str) -> str:
    """reference/inventory.md: every key of a YAML inventory (``file_model`` and the models
    it nests) and a complete example (``example_text``, verbatim)."""
    rows = model_keys(file_model)
    return "\n".join([
        _GENERATED.format(source="the inventory's models (clusterctl.cluster.inventory.model)"),
        "# Inventory reference\n",
        "An inventory says which nodes a cluster has and how clusterctl reaches them; every "
        "command that talks to nodes takes it as `--nodes FILE` (or `CLUSTERCTL_NODES`). "
        "Besides this YAML format, an MPI hostfile (`host`, `host:N` or `host slots=N` per "
        "line, `#` comments) and a DeepSpeed hostfile (`host slots=N`) are accepted; their "
        "nodes take user, port and key from `~/.ssh/config`. Unknown keys are an error, and "
        "every problem is reported at once as `FILE:LINE: field: problem; valid: ...` with exit "
        "status 2, before anything touches a node. Values under `env` and `labels` are text "
        "taken exactly as written.\n",
        _sections(rows, "Top-level keys"),
        "## A complete example\n",
        f"The shipped `{example_name}`, as it is on disk:\n",
        _fence(example_text, "yaml"),
    ])


def environment_page(container_env: Mapping[str, str], layers: Iterable[tuple[str, str]],
                     contracts: Mapping[str, Mapping[str, str]],
                     per_process: Mapping[str, Mapping[str, str]] | None = None,
                     target_env: Mapping[str, Mapping[str, str]] | None = None,
                     code_env: Mapping[str, str] | None = None,
                     resume_env: Mapping[str, str] | None = None) -> str:
    """reference/environment.md: the variables every container gets, what each contract
    adds, what a workdir run adds, the precedence of the layers, the targets' defaults and
    the ``--add-host`` note."""
    from clusterctl.run import plan

    layers = list(layers)
    out = [
        _GENERATED.format(source="clusterctl.run.plan.CONTAINER_ENV and ENV_LAYERS"),
        "# Container environment reference\n",
        "## What every container gets\n",
        "Every container of a launch gets these variables, whatever its job and target. The "
        "interface variables are set when the inventory names the node's `interface` or "
        "preflight found the one holding the node's address.\n",
        _table(["variable", "value"],
               [[code(k), md(v, cell=True)] for k, v in container_env.items()]),
        "## What each contract adds\n",
        "The job's `contract` says which launch variables the program in the image reads; "
        "each adds these to the ones above (the value's placeholders are described in the "
        "[job file reference](job-file.md#placeholders)).\n",
        _table(["contract", "adds"],
               [[code(name), ", ".join(f"{code(k)} = {code(v)}" for k, v in extra.items()) or "nothing"]
                for name, extra in contracts.items()]),
    ]
    for name, variables in (per_process or {}).items():
        out.append(f"With `contract: {name}` the container starts the node's processes itself, "
                   "each with its own " + " and ".join(f"{code(k)} ({md(v)})" for k, v in variables.items())
                   + ".\n")
    if code_env:
        out += [
            "## What a run of your own project adds\n",
            "With a `workdir` (`launch --workdir DIR`), the project's copy is mounted read-only "
            "at `/workspace`, the command's working directory, and every container also gets "
            "(after every layer below: nothing replaces it):\n",
            _table(["variable", "value"], [[code(k), md(v, cell=True)] for k, v in code_env.items()]),
        ]
    if resume_env:
        out += [
            "## The resume contract\n",
            "Every container of an SSH launch also gets these (after every layer below: nothing "
            "replaces them), the same on every rank of an attempt; a run that restarts "
            "(`--max-restarts`, docs/how-to/restarts.md) raises the attempt and names the "
            "nodes it left behind:\n",
            _table(["variable", "value"], [[code(k), md(v, cell=True)] for k, v in resume_env.items()]),
        ]
    out += [
        "## Precedence\n",
        "Lowest first; a later layer wins over an earlier one for the same name:\n",
        "\n".join(["1. **launch values**: the variables above and the contract's"]
                  + [f"{i}. **{md(name)}**: {md(text)}" for i, (name, text) in enumerate(layers, 2)]) + "\n",
        "A `MASTER_ADDR`, `MASTER_PORT` or `NPROC_PER_NODE` given by the inventory's env or "
        "`--set` also becomes the `{master_addr}`, `{master_port}` or `{nproc_per_node}` "
        "placeholder value, so the `PET_*` variables and a command line such as torchrun's "
        "`--master-addr={master_addr}` agree with it. `--set NAME=VALUE` where NAME is one of "
        "the job's `params` sets that parameter instead of a variable.\n",
    ]
    if target_env:
        out += ["## The targets' defaults\n",
                "Layer 2: the environment each target gives its containers (a target with a "
                "flight recorder, such as nccl, also sets the recorder's variables, listed here "
                "with its env).\n",
                _table(["target", "environment"],
                       [[code(t), ", ".join(f"{code(k)} = {code(v)}" for k, v in env.items()) or "none"]
                        for t, env in target_env.items()])]
    out += [
        "## Secrets\n",
        "A variable is secret when the job lists it under `secrets`; " + secretnames.SECRET_RULE + ". "
        "Its value never appears in `docker run`'s "
        "argv: the container reads it from an env file on `docker run`'s stdin "
        "(`--env-file /dev/stdin`), and dry runs, logs and run records show `****`. A value "
        f"shorter than {plan.MASK_MIN_CHARS} characters, a number or an address is not masked "
        "in output (masking it would rewrite every `0` or address): launch warns, naming the "
        "variable.\n",
        "## Node names: `--add-host`\n",
        "Every container can resolve every node of the inventory by name: each node given by "
        "an IPv4 address (or an `~/.ssh/config` alias for one) becomes an "
        "`--add-host NAME:ADDRESS` entry, also in the IPv4-mapped IPv6 form "
        "(`::ffff:ADDRESS`) in which torch's c10d sees its peers. Without them, nodes that "
        "cannot reach a DNS server make every rank warn \"The hostname of the client socket "
        "cannot be retrieved\".\n",
    ]
    return "\n".join(out)


def exit_status_page(statuses: Iterable[ExitStatus] = EXIT_STATUSES) -> str:
    """reference/exit-status.md: the table of exit statuses and the commands of each."""
    rows = [[code(s.code) if s.code is not None else "other", md(s.name, cell=True),
             md(s.meaning, cell=True),
             "every command" if exitcodes.ALL in s.commands
             else ", ".join(f"[`{c}`](cli.md#{anchor('clusterctl ' + c)})" for c in s.commands)]
            for s in statuses]
    return "\n".join([
        _GENERATED.format(source="clusterctl.core.exitcodes"),
        "# Exit statuses\n",
        "What the exit status of a `clusterctl` command means. Each command's section of the "
        "[CLI reference](cli.md) lists the ones it can end with.\n",
        _table(["status", "name", "meaning", "commands"], rows),
    ])


#: What the per-process variables of ``contract: mpi`` hold (clusterctl.run.mpi.process_env).
MPI_PER_PROCESS = {
    "PMI_RANK": "the node's first global rank + i for its process i",
    "MPI_LOCALRANKID": "i, the process's index on its node",
}


def reference_pages(job_example: tuple[str, str], inventory_example: tuple[str, str]) -> dict[str, str]:
    """Every reference page, path (relative to docs/) -> Markdown, from the real app, models
    and tables; the examples are (name, text) of the shipped files, read by the caller."""
    from clusterctl.cli import app
    from clusterctl.cluster.inventory.model import InventoryFile
    from clusterctl.image import targets
    from clusterctl.run import jobs, plan, recovery

    def target_env(name: str) -> dict[str, str]:
        t = targets.get_target(name)
        recorder = t.flight_recorder.environment() if t.flight_recorder is not None else {}
        return {**recorder, **t.env}

    return {
        "reference/cli.md": cli_page(typer.main.get_command(app)),
        "reference/job-file.md": job_file_page(jobs._Spec, jobs.PLACEHOLDERS, *job_example),
        "reference/inventory.md": inventory_page(InventoryFile, *inventory_example),
        "reference/environment.md": environment_page(
            plan.CONTAINER_ENV, plan.ENV_LAYERS, jobs.CONTRACTS, {"mpi": MPI_PER_PROCESS},
            {name: target_env(name) for name in targets.target_names()}, plan.CODE_ENV,
            recovery.RESUME_ENV),
        "reference/exit-status.md": exit_status_page(),
    }
