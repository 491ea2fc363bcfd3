"""``datamachine tools [NAME]``: the tools this host offers, with their parameters.

As ``llm tools`` shows each tool's signature, the listing shows each tool's parameters as a
signature read from its JSON schema (what the model is shown, whatever made the tool: a typed
function, a hand-written schema, an MCP server): ``(query: string, limit: integer = 10)``,
``name?: type`` for an optional parameter without a default, ``"a" | "b"`` for an enum,
``array[string]``, the ``$ref``'d model's name. ``NAME`` or ``--schema`` print the whole schema.

Every tool comes through the host's tool registry: the built-in ones, plugins' and the tools of
MCP servers (``datamachine-mcp`` registers them at boot as ``<server>__<tool>``), each tagged
with the plugin that registered it.
"""

from __future__ import annotations

from typing import Any

import click

from agents_api.jsontext import compact_json, pretty_json
from datamachine.cli.app import State, handle_errors
from datamachine.cli.output import emit_json
from datamachine.cli.tables import table
from datamachine.errors import UsageError

__all__ = ["signature", "tools"]


def _described(tool: Any) -> dict[str, Any]:
    return {"name": tool.name, "plugin": tool.plugin,
            "description": (tool.description or "").strip(), "parameters": tool.parameters}


def _type_of(schema: Any) -> str:
    """A JSON schema's type, short: ``string``, ``array[integer]``, ``"a" | "b"``."""
    if not isinstance(schema, dict):
        return "any"
    if isinstance(schema.get("$ref"), str):
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if isinstance(schema.get("enum"), list):
        return " | ".join(compact_json(value) for value in schema["enum"])
    if "const" in schema:
        return compact_json(schema["const"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(_type_of(option) for option in schema[key])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array[{_type_of(schema['items'])}]"
    return str(kind) if isinstance(kind, str) else "any"


def signature(parameters: Any) -> str:
    """The parameters of a tool's JSON schema as a signature, in the schema's order:
    ``(url: string, timeout?: number, kind: "fact" | "todo" = "fact")``."""
    if not isinstance(parameters, dict) or not isinstance(parameters.get("properties"), dict):
        return "()"
    required = parameters.get("required")
    needed = set(required) if isinstance(required, list) else set()
    shown = []
    for name, schema in parameters["properties"].items():
        kind = _type_of(schema)
        if name in needed:
            shown.append(f"{name}: {kind}")
        elif isinstance(schema, dict) and "default" in schema:
            shown.append(f"{name}: {kind} = {compact_json(schema['default'])}")
        else:
            shown.append(f"{name}?: {kind}")
    return f"({', '.join(shown)})"


def _first_line(text: str) -> str:
    lines = text.splitlines()
    return lines[0] if lines else ""


def _print_schema(row: dict[str, Any]) -> None:
    click.echo(click.style(row["name"], bold=True) + f"  (plugin: {row['plugin'] or '-'})")
    click.echo(f"  {row['name']}{signature(row['parameters'])}")
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
    """Every tool this host offers (plugins' and MCP servers'): its parameters as a signature,
    the plugin it came from and its description; with NAME, that tool's whole description and
    JSON parameter schema."""
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
    table(["name", "parameters", "plugin", "description"],
          [[r["name"], signature(r["parameters"]), r["plugin"] or "-",
            _first_line(r["description"])] for r in rows],
          whole=("name",), clip=("description",))
