"""``datamachine tools [NAME]``: the tools this host offers, with their JSON schemas.

Every tool comes through the host's tool registry: the built-in ones, plugins' and the tools of
MCP servers (``datamachine-mcp`` registers them at boot as ``<server>__<tool>``), each tagged
with the plugin that registered it.
"""

from __future__ import annotations

from typing import Any

import click

from agents_api.jsontext import pretty_json
from datamachine.cli.app import State, handle_errors
from datamachine.cli.output import emit_json
from datamachine.cli.tables import table
from datamachine.errors import UsageError

__all__ = ["tools"]


def _described(tool: Any) -> dict[str, Any]:
    return {"name": tool.name, "plugin": tool.plugin,
            "description": (tool.description or "").strip(), "parameters": tool.parameters}


def _first_line(text: str) -> str:
    lines = text.splitlines()
    return lines[0] if lines else ""


def _print_schema(row: dict[str, Any]) -> None:
    click.echo(click.style(row["name"], bold=True) + f"  (plugin: {row['plugin'] or '-'})")
    for line in row["description"].splitlines() or ["(no description)"]:
        click.echo(f"  {line}")
    click.echo("  parameters:")
    for line in pretty_json(row["parameters"]).splitlines():
        click.echo(f"    {line}")


@click.command("tools")
@click.argument("name", required=False)
@click.option("--schema", is_flag=True,
              help="Show each tool's whole description and JSON parameter schema.")
@click.option("--json", "as_json", is_flag=True,
              help="Name, plugin, description and parameters (the JSON schema) of each tool.")
@click.pass_obj
@handle_errors
def tools(state: State, name: str | None, schema: bool, as_json: bool) -> None:
    """Every tool this host offers (plugins' and MCP servers'), with the plugin it came from;
    with NAME, that tool's description and JSON parameter schema."""
    registry = state.host.tools
    if name is not None:
        found = registry.get(name)
        if found is None:
            known = ", ".join(registry.names()) or "none"
            raise UsageError(f"No registered tool is named {name!r} (registered: {known}).")
        rows = [_described(found)]
    else:
        rows = [_described(registry.get(tool_name)) for tool_name in registry.names()]
    if as_json:
        emit_json(rows[0] if name is not None else rows)
        return
    if name is not None or schema:
        for index, row in enumerate(rows):
            if index:
                click.echo()
            _print_schema(row)
        return
    table(["name", "plugin", "description"],
          [[r["name"], r["plugin"] or "-", _first_line(r["description"])] for r in rows],
          whole=("name",), clip=("description",))
