"""The program after ``--``: how ``launch`` and ``exec`` take a command exactly as typed.

``clusterctl launch --workdir . -- python train.py --lr 3e-4`` and
``clusterctl exec --nodes FILE -- df -h``: the words after the first ``--`` never fill
an option or argument of clusterctl's own; the command finds them in
``ctx.meta[COMMAND_META]`` (absent when no ``--`` was given).
"""

from __future__ import annotations

import typer

COMMAND_META = "clusterctl.command"


class CommandAfterDashes(typer.core.TyperCommand):
    """A command whose words after ``--`` are the program to run, kept exactly as typed
    (``launch --workdir . -- python train.py --lr 3e-4``): they never fill an argument."""

    def parse_args(self, ctx, args):
        if "--" in args:
            cut = args.index("--")
            ctx.meta[COMMAND_META] = args[cut + 1:]
            args = args[:cut]
        return super().parse_args(ctx, args)
