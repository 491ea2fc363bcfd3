"""Typed tools: arguments validated and converted by pydantic from the signature, schemas with
descriptions and constraints, and docstrings in every common style."""

from __future__ import annotations

import enum
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

import bootstrap
from datamachine.tools import ToolExecutor, tool


class Unit(enum.Enum):
    KG = "kg"
    LB = "lb"


class Street(BaseModel):
    name: str
    number: int


class Address(BaseModel):
    street: Street
    city: str
    zip_code: str = Field(pattern=r"^\d{5}$", description="Five digits.")


SEEN: list[dict[str, Any]] = []


@tool
def ship(addr: Address, unit: Unit, n: Annotated[int, Field(ge=1, le=10)],
         note: str | None = None, express: bool = False) -> str:
    """Ship a parcel.

    Args:
        addr: Where to ship it.
        unit: The weight unit.
        n: How many parcels.
        note: A note for the courier.
        express: Ship overnight.
    """
    SEEN.append({"addr": addr, "unit": unit, "n": n, "note": note, "express": express})
    return f"{n} parcel(s) to {addr.city}"


def call(params: dict[str, Any]) -> dict[str, Any]:
    result = ToolExecutor([ship])({"id": "c", "name": "ship", "parameters": params}, {})
    assert isinstance(result, dict)
    return result


GOOD = {"addr": {"street": {"name": "Main", "number": "5"}, "city": "Lyon",
                 "zip_code": "69001"}, "unit": "kg", "n": "3"}


def test_the_function_receives_instances_converted_and_its_own_defaults() -> None:
    SEEN.clear()
    assert call(GOOD)["result"] == "3 parcel(s) to Lyon"
    [seen] = SEEN
    assert isinstance(seen["addr"], Address)
    assert seen["addr"].street == Street(name="Main", number=5)  # "5" became 5
    assert seen["unit"] is Unit.KG
    assert seen["n"] == 3
    assert (seen["note"], seen["express"]) == (None, False)  # left out: the defaults


def test_every_wrong_field_is_listed_for_the_model() -> None:
    SEEN.clear()
    result = call({"addr": {"street": {"name": 5}, "city": "Lyon", "zip_code": "6900"},
                   "unit": "c", "n": 99})
    assert (result["success"], result["error_type"]) == (False, "invalid_arguments")
    problems = result["invalid_arguments"]
    assert problems == [
        "addr.street.name: Input should be a valid string (got 5)",
        "addr.street.number is required",
        "addr.zip_code: String should match pattern '^\\d{5}$' (got \"6900\")",
        "unit: Input should be 'kg' or 'lb' (got \"c\")",
        "n: Input should be less than or equal to 10 (got 99)",
    ]
    assert result["error"].startswith('Tool "ship" received invalid arguments: addr.street.name')
    assert SEEN == []  # the tool never ran


def test_the_schema_carries_descriptions_constraints_enums_and_models() -> None:
    schema = ship.parameters
    props = schema["properties"]
    assert ship.description == "Ship a parcel."
    assert props["n"] == {"type": "integer", "minimum": 1, "maximum": 10,
                          "description": "How many parcels."}
    assert props["unit"] == {"enum": ["kg", "lb"], "type": "string",
                             "description": "The weight unit."}
    assert props["note"] == {"type": ["string", "null"], "default": None,
                             "description": "A note for the courier."}
    assert props["express"]["default"] is False
    assert props["addr"]["$ref"] == "#/$defs/Address"
    address = schema["$defs"]["Address"]
    assert address["properties"]["zip_code"] == {
        "type": "string", "pattern": r"^\d{5}$", "description": "Five digits."}
    assert schema["required"] == ["addr", "unit", "n"]
    assert schema["additionalProperties"] is False


def test_a_field_description_wins_over_the_docstring() -> None:
    @tool
    def f(x: Annotated[int, Field(description="From the field.")]) -> int:
        """F.

        Args:
            x: From the docstring.
        """
        return x

    assert f.parameters["properties"]["x"]["description"] == "From the field."


@pytest.mark.parametrize("doc", [
    """Convert a temperature.

    :param value: Degrees to convert.
    :param unit: Either C or F.
    :returns: The converted value.
    """,
    """Convert a temperature.

    Parameters
    ----------
    value : float
        Degrees to convert.
    unit : str
        Either C or F.
    """,
    """Convert a temperature.

    Args:
        value: Degrees to convert.
        unit: Either C or F.
    """,
])
def test_rest_numpy_and_google_docstrings_describe_the_parameters(doc: str) -> None:
    def convert(value: float, unit: str) -> float:
        return value

    convert.__doc__ = doc
    made = tool(convert)
    props = made.parameters["properties"]
    assert made.description == "Convert a temperature."
    assert props["value"]["description"] == "Degrees to convert."
    assert props["unit"]["description"] == "Either C or F."


def test_a_model_corrects_its_call_on_the_next_turn() -> None:
    SEEN.clear()
    bad = {**GOOD, "n": 99}
    script = [{"tool_calls": [{"id": "c1", "name": "ship", "parameters": bad}]},
              {"tool_calls": [{"id": "c2", "name": "ship", "parameters": GOOD}]},
              {"content": "Shipped."}]
    with bootstrap.boot(":memory:", load_entrypoints=False) as host:
        result = host.run_conversation([{"role": "user", "content": "ship it"}], [ship],
                                       "scripted", "m", payload={"script": script})
    assert (result.status, result.final_content) == ("completed", "Shipped.")
    first, second = (r["result"] for r in result.tool_execution_results)
    assert first["error_type"] == "invalid_arguments"
    assert "n: Input should be less than or equal to 10 (got 99)" in first["error"]
    assert second["result"] == "3 parcel(s) to Lyon"
    assert len(SEEN) == 1
    # What the model read on turn 2 was the error.
    tool_messages = [m for m in result.messages if m.type == "tool_result"]
    assert tool_messages[0].content == first["error"]
