"""Building a tool's JSON schema from type hints and its description from the docstring."""

from __future__ import annotations

import enum
from typing import Any, Literal, Optional

from pydantic import BaseModel

from datamachine.tools import ToolContext, tool
from datamachine.tools.docstrings import parse_docstring


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: int
    y: int


class Shape(BaseModel):
    corners: list[Point]


def test_simple_types_map_to_json_schema_types() -> None:
    @tool
    def f(s: str, i: int, x: float, b: bool, anything: Any) -> None:
        """F."""

    props = f.parameters["properties"]
    assert props["s"] == {"type": "string"}
    assert props["i"] == {"type": "integer"}
    assert props["x"] == {"type": "number"}
    assert props["b"] == {"type": "boolean"}
    assert props["anything"] == {}


def test_parameters_without_defaults_are_required_in_signature_order() -> None:
    @tool
    def f(b: str, a: int, c: int = 3, d: str | None = None) -> None:
        """F."""

    assert f.parameters["type"] == "object"
    assert f.parameters["required"] == ["b", "a"]
    assert f.parameters["properties"]["c"]["default"] == 3
    assert f.parameters["properties"]["d"]["default"] is None


def test_containers_literals_optionals_and_enums() -> None:
    @tool
    def f(
        tags: list[str],
        matrix: list[list[int]],
        counts: dict[str, int],
        raw: dict,  # type: ignore[type-arg]
        kind: Literal["a", "b"],
        level: Literal[1, 2, 3],
        maybe: Optional[int] = None,  # noqa: UP045 - the spelling under test
        either: str | None = None,
        colour: Colour = Colour.RED,
    ) -> None:
        """F."""

    props = f.parameters["properties"]
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["matrix"] == {"type": "array",
                               "items": {"type": "array", "items": {"type": "integer"}}}
    assert props["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["raw"] == {"type": "object"}
    assert props["kind"] == {"enum": ["a", "b"], "type": "string"}
    assert props["level"] == {"enum": [1, 2, 3], "type": "integer"}
    assert props["maybe"] == {"type": ["integer", "null"], "default": None}
    assert props["either"] == {"type": ["string", "null"], "default": None}
    # An enum default is given to the model as its value.
    assert props["colour"] == {"enum": ["red", "blue"], "type": "string", "default": "red"}
    assert f.parameters["required"] == ["tags", "matrix", "counts", "raw", "kind", "level"]


def test_pydantic_models_keep_resolvable_references() -> None:
    @tool
    def draw(shape: Shape) -> None:
        """Draw."""

    schema = draw.parameters
    # Models are definitions at the root, so every reference resolves against the tool schema.
    assert schema["properties"]["shape"] == {"$ref": "#/$defs/Shape"}
    ref = schema["$defs"]["Shape"]["properties"]["corners"]["items"]["$ref"]
    assert ref == "#/$defs/Point"
    assert schema["$defs"]["Point"]["required"] == ["x", "y"]


def test_context_parameter_is_not_part_of_the_schema() -> None:
    @tool
    def f(query: str, context: ToolContext) -> str:
        """F."""
        return query

    assert list(f.parameters["properties"]) == ["query"]
    assert f.parameters["required"] == ["query"]
    assert f.wants_context is True


def test_docstring_first_paragraph_is_the_description_and_args_describe_parameters() -> None:
    @tool
    def search(query: str, limit: int = 5, *, exact: bool = False) -> list[str]:
        """Search the archive for documents
        that match a query.

        Results are ranked by relevance.

        Args:
            query: Words to look for.
                Quotes make a phrase.
            limit (int): How many results to return.
            exact: Only exact matches.

        Returns:
            Matching titles.
        """
        return []

    assert search.description == "Search the archive for documents that match a query."
    props = search.parameters["properties"]
    assert props["query"]["description"] == "Words to look for. Quotes make a phrase."
    assert props["limit"]["description"] == "How many results to return."
    assert props["exact"]["description"] == "Only exact matches."


def test_numpy_style_parameters_section_is_read() -> None:
    parsed = parse_docstring(
        """Convert a temperature.

        Parameters
        ----------
        value : float
            Degrees to convert.
        unit : str
            Either C or F.

        Returns
        -------
        float
        """
    )
    assert parsed.description == "Convert a temperature."
    assert parsed.params == {"value": "Degrees to convert.", "unit": "Either C or F."}


def test_docstring_without_sections_and_missing_docstring() -> None:
    assert parse_docstring("Just one line.").params == {}
    assert parse_docstring(None).description == ""

    @tool
    def bare(x: int) -> int:
        return x

    assert bare.description == ""
    assert "description" not in bare.parameters["properties"]["x"]


def test_explicit_description_and_parameters_win_over_the_function() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    @tool(name="lookup", description="Look something up.", parameters=schema)
    def f(**kwargs: Any) -> None:
        """Ignored docstring."""

    assert f.name == "lookup"
    assert f.description == "Look something up."
    assert f.parameters == schema
    assert f.to_provider_dict() == {"name": "lookup", "description": "Look something up.",
                                    "parameters": schema}
