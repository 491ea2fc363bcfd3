"""The ``datamachine`` command line (click).

Exit codes follow the run lifecycle (DESIGN.md 5.5a): 0 completed, 1 error or lock contention,
2 usage error, 3 budget exceeded, incomplete or aborted. Errors print one clear line; ``--debug``
shows the traceback. Plugins add commands through the ``register_commands(cli)`` hook.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, TextIO

import click

from datamachine.cli.app import cli

__all__ = ["cli", "main"]


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """A plugin that failed to load is one line on stderr, not a warning with its source."""
    from datamachine.errors import PluginLoadWarning

    if issubclass(category, PluginLoadWarning):
        click.echo(f"Warning: {message}", err=True)
        return
    _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point."""
    from datamachine.cli.app import load_plugin_commands

    warnings.showwarning = _show_warning
    load_plugin_commands()
    try:
        return cli.main(args=argv, prog_name="datamachine", standalone_mode=True)
    except click.exceptions.Exit as exc:  # pragma: no cover - click handles this itself
        sys.exit(exc.exit_code)
