"""The arguments TestModel makes from a tool's JSON schema: the plainest values the schema
accepts, the same every time (datamachine.schema_examples)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

from datamachine.schema_examples import example_arguments, example_value


@pytest.mark.parametrize(("schema", "expected"), [
    ({"type": "string"}, "a"),
    ({"type": "string", "minLength": 3}, "aaa"),
    ({"type": "string", "format": "date"}, "2024-01-01"),
    ({"type": "string", "format": "email"}, "a@example.com"),
    ({"type": "integer", "minimum": 5, "maximum": 9}, 5),
    ({"type": "integer", "exclusiveMinimum": 5}, 6),
    ({"type": "integer", "maximum": -3}, -3),
    ({"type": "number", "multipleOf": 0.25, "minimum": 0.3}, 0.5),
    ({"type": "boolean"}, True),
    ({"type": "null"}, None),
    ({"type": ["null", "integer"]}, 0),
    ({"enum": ["red", "green"]}, "red"),
    ({"const": 7}, 7),
    ({"anyOf": [{"type": "null"}, {"type": "integer"}]}, 0),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, [0, 0]),
    ({"type": "array", "items": {"type": "string"}, "maxItems": 0}, []),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}]}, ["a", True]),
])
def test_each_kind_of_schema_gets_its_plainest_value(schema: dict[str, Any],
                                                     expected: Any) -> None:
    assert example_value(schema) == expected


def test_only_required_properties_are_filled_and_refs_are_resolved() -> None:
    class Address(BaseModel):
        city: str
        zip_code: str = Field(min_length=5)
        note: str = ""

    class Order(BaseModel):
        address: Address
        quantity: int = Field(ge=1)
        gift: bool = False

    assert example_arguments(Order.model_json_schema()) == {
        "address": {"city": "a", "zip_code": "aaaaa"}, "quantity": 1}


def test_the_seed_varies_the_values() -> None:
    schema = {"type": "object", "required": ["s", "n", "b", "e"], "properties": {
        "s": {"type": "string"}, "n": {"type": "integer"}, "b": {"type": "boolean"},
        "e": {"enum": ["x", "y"]}}}
    assert example_arguments(schema, seed=1) == {"s": "b", "n": 1, "b": False, "e": "y"}


def test_all_of_is_merged_and_a_schema_that_refers_to_itself_stops() -> None:
    merged = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                         "required": ["a"]},
                        {"properties": {"b": {"type": "string"}}, "required": ["b"]}]}
    assert example_value(merged) == {"a": 0, "b": "a"}
    looped = {"$ref": "#/$defs/node", "$defs": {"node": {
        "type": "object", "required": ["next"], "properties": {"next": {"$ref": "#/$defs/node"}}}}}
    value = example_value(looped)
    depth = 0
    while isinstance(value, dict):
        value, depth = value["next"], depth + 1
    assert value is None
    assert depth <= 8


def test_anything_but_an_object_schema_makes_no_arguments() -> None:
    assert example_arguments({"type": "string"}) == {}
    assert example_arguments({"$ref": "#/nowhere"}) == {}
