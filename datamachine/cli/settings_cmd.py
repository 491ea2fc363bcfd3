"""``datamachine settings``: read and write site settings."""

from __future__ import annotations

import json
from typing import Any

import click

from agents_api.jsontext import compact_json
from datamachine.cli.app import State, handle_errors
from datamachine.cli.output import emit_json, table

__all__ = ["settings"]


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


@click.group()
def settings() -> None:
    """Read and write site settings (stored as JSON in SQLite)."""


@settings.command("get")
@click.argument("key")
@click.pass_obj
@handle_errors
def settings_get(state: State, key: str) -> None:
    """Print one setting's value as JSON (environment overrides applied)."""
    emit_json(state.host.settings.get(key))


@settings.command("set")
@click.argument("key")
@click.argument("value")
@click.pass_obj
@handle_errors
def settings_set(state: State, key: str, value: str) -> None:
    """Store VALUE (JSON, or a plain string) under KEY; budget settings are validated."""
    state.host.settings.set(key, _parse_value(value))
    click.echo(f"{key} = {compact_json(state.host.settings.stored(key))}")


@settings.command("unset")
@click.argument("key")
@click.pass_obj
@handle_errors
def settings_unset(state: State, key: str) -> None:
    """Remove a stored setting."""
    removed = state.host.settings.delete(key)
    click.echo(f"{key} {'removed' if removed else 'was not set'}")


@settings.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def settings_list(state: State, as_json: bool) -> None:
    """Every setting with its source (env or db)."""
    values = state.host.settings.all()
    if as_json:
        emit_json(values)
        return
    table(["key", "value", "from"],
           [[k, compact_json(v), state.host.settings.source(k)] for k, v in values.items()])
