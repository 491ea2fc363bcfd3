"""The ``datamachine`` command line (click).

Exit codes follow the run lifecycle (DESIGN.md 5.5a): 0 completed, 1 error or lock contention,
2 usage error, 3 budget exceeded, incomplete or aborted. Errors print one clear line; ``--debug``
shows the traceback. Plugins add commands through the ``register_commands(cli)`` hook.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from datamachine.cli.app import cli

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point."""
    from datamachine.cli.app import load_plugin_commands

    load_plugin_commands()
    try:
        return cli.main(args=argv, prog_name="datamachine", standalone_mode=True)
    except click.exceptions.Exit as exc:  # pragma: no cover - click handles this itself
        sys.exit(exc.exit_code)
