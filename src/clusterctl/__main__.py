"""``clusterctl`` (the console script) and ``python -m clusterctl``.

Before the command-line interface is even imported, a secret typed on the command line
(``--env HF_TOKEN=...``) is moved into the environment of a fresh process
(:func:`clusterctl.core.secretnames.reexec_without_secrets`): the process list shows
everyone's command lines.
"""

from __future__ import annotations


def main() -> None:
    from clusterctl.core.secretnames import reexec_without_secrets

    reexec_without_secrets()
    from clusterctl.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
