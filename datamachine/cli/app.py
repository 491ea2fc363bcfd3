"""The root click group, shared options, and the mapping from errors to exit codes."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from datamachine.errors import BootError, DataMachineError, UsageError

__all__ = ["EXIT_CODES", "State", "cli", "exit_code_for", "handle_errors", "load_plugin_commands"]

EXIT_CODES = {
    "completed": 0,
    "error": 1,
    "transcript_lock_contention": 1,
    "incomplete": 3,
    "budget_exceeded": 3,
    "aborted": 3,
    "awaiting_confirmation": 4,
}

F = TypeVar("F", bound=Callable[..., Any])


def exit_code_for(status: str, budget: str | None = None) -> int:
    """The process exit code for a run's status; 3 for any stop on a budget (``budget``: the
    result's), also an ``error`` once a budget such as ``provider_retries`` ran out."""
    if budget is not None and status in ("error", "incomplete", "budget_exceeded"):
        return 3
    return EXIT_CODES.get(status, 1)


class State:
    """Per-invocation options and the lazily booted host."""

    def __init__(self, db: Path | str | None, debug: bool) -> None:
        self.db = db
        self.debug = debug
        self._host: Any = None

    @property
    def host(self) -> Any:
        if self._host is None:
            from datamachine.booting import boot

            self._host = boot(db_path=self.db)
        return self._host

    def close(self) -> None:
        """Close the host, if this invocation booted one."""
        host, self._host = self._host, None
        if host is not None:
            host.close()


def handle_errors(func: F) -> F:
    """Print a DataMachineError as one line and exit 1 (2 for usage errors)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        state = click.get_current_context().find_object(State)
        try:
            return func(*args, **kwargs)
        except DataMachineError as exc:
            if state is not None and state.debug:
                raise
            message = str(exc)
            if isinstance(exc, BootError) and "DATAMACHINE_LOAD_PLUGINS" not in message:
                # Two plugins claiming one name, a plugin's bad registration: the host cannot
                # boot until one is left out.
                message += (" (DATAMACHINE_LOAD_PLUGINS=dist-a,dist-b boots with only the "
                            "plugins named.)")
            click.echo(f"Error: {message}", err=True)
            sys.exit(2 if isinstance(exc, UsageError) else 1)

    return wrapper  # type: ignore[return-value]


@click.group()
@click.version_option(package_name="datamachine-agents")
@click.option("--db", envvar="DATAMACHINE_DB", metavar="PATH|URL",
              help="Database file, or a postgresql:// URL (default: $DATAMACHINE_DB or the "
                   "user data directory).")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, db: str | None, debug: bool) -> None:
    """datamachine: bounded LLM agent loops with named budgets."""
    from datamachine.storage.database import is_postgres_url

    # A URL stays text: a postgresql:// one opens PostgreSQL, any other is refused by name.
    target = None if not db else db if is_postgres_url(db) or "://" in db \
        else Path(db).expanduser()
    state = ctx.obj = State(target, debug)
    # Whatever the command, the host it booted is closed (plugins' servers and processes too).
    ctx.call_on_close(state.close)


_plugin_commands_loaded = False


def load_plugin_commands() -> None:
    """Let installed plugins add commands (``register_commands(cli)``), once per process."""
    global _plugin_commands_loaded
    if _plugin_commands_loaded:
        return
    _plugin_commands_loaded = True
    from datamachine.plugins import LOAD_PLUGINS_ENV, make_plugin_manager

    pm, _ = make_plugin_manager()
    for impl in pm.hook.register_commands.get_hookimpls():
        try:
            impl.function(*[{"cli": cli}[name] for name in impl.argnames])
        except Exception as exc:  # one plugin's commands missing, every other command works
            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            click.echo(f"Warning: plugin {impl.plugin_name!r} could not add its commands "
                       f"({why}); set {LOAD_PLUGINS_ENV} to leave it out.", err=True)


def _register_builtin_commands() -> None:
    from datamachine.cli import (
        admin,
        chat_cmd,
        continue_cmd,
        demo,
        docs_cmd,
        jobs_cmd,
        models_cmd,
        resume_cmd,
        run_cmd,
        server_cmds,
        settings_cmd,
        spend_cmd,
        tools_cmd,
    )

    server_cmds.register(cli)
    cli.add_command(demo.demo)
    cli.add_command(docs_cmd.docs)
    cli.add_command(run_cmd.run)
    cli.add_command(chat_cmd.chat)
    cli.add_command(continue_cmd.continue_)
    cli.add_command(resume_cmd.resume)
    cli.add_command(resume_cmd.resolve)
    cli.add_command(spend_cmd.spend)
    cli.add_command(settings_cmd.settings)
    cli.add_command(tools_cmd.tools)
    cli.add_command(models_cmd.models)
    cli.add_command(jobs_cmd.worker)
    admin.jobs.add_command(jobs_cmd.jobs_enqueue)
    admin.jobs.add_command(jobs_cmd.jobs_requeue)
    for command in admin.COMMANDS:
        cli.add_command(command)


_register_builtin_commands()
