"""``datamachine tools`` shows each tool's parameters, as ``llm tools`` shows signatures
(DESIGN.md 19 and 25)."""

from __future__ import annotations

import enum
from pathlib import Path

from click.testing import CliRunner
from pydantic import BaseModel

from datamachine import Tool, tool
from datamachine.cli import cli
from datamachine.cli.tools_cmd import signature


class Place(BaseModel):
    city: str


class Unit(enum.Enum):
    C = "c"
    F = "f"


@tool
def forecast(place: Place, days: list[int], unit: Unit = Unit.C,
             note: str | None = None) -> str:
    """Forecast the weather."""
    return "sunny"


def test_a_typed_tool_reads_as_its_signature() -> None:
    assert signature(forecast.parameters) == (
        '(place: Place, days: array[integer], unit: "c" | "f" = "c", '
        'note: string | null = null)')


def test_a_hand_written_schema_reads_the_same_way() -> None:
    def lookup(q: str, top: int = 3, kind: str = "any") -> list[str]:
        return [q]

    schema = {"type": "object", "required": ["q"],
              "properties": {"q": {"type": "string"}, "top": {"type": "integer", "default": 3},
                             "kind": {"enum": ["any", "exact"]}}}
    made = Tool(name="lookup", description="Look it up.", parameters=schema, function=lookup)
    assert signature(made.parameters) == '(q: string, top: integer = 3, kind?: "any" | "exact")'
    assert signature({"type": "object", "properties": {}}) == "()"


def test_the_listing_shows_every_tools_parameters(tmp_path: Path) -> None:
    done = CliRunner().invoke(cli, ["--db", str(tmp_path / "t.db"), "tools"])
    assert done.exit_code == 0, done.output
    header, *rows = done.stdout.splitlines()
    assert header.split() == ["name", "parameters", "plugin", "description"]
    [remote] = [row for row in rows if row.startswith("call_remote_agent ")]
    assert "(site: string, message: string)" in remote

    one = CliRunner().invoke(cli, ["--db", str(tmp_path / "t.db"), "tools",
                                   "call_remote_agent"])
    assert one.exit_code == 0
    assert one.stdout.splitlines()[1] == "  call_remote_agent(site: string, message: string)"
