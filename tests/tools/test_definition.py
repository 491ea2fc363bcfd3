"""Tool definitions are validated when they are made, with errors naming the field."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from datamachine.errors import InvalidToolDefinition, UsageError
from datamachine.tools import Tool, tool


def echo(text: str) -> str:
    """Say it back."""
    return text


def test_tool_built_with_keywords_fills_schema_and_description_from_function() -> None:
    t = Tool(name="echo", function=echo)
    assert t.description == "Say it back."
    assert t.parameters == {"type": "object", "properties": {"text": {"type": "string"}},
                            "required": ["text"], "additionalProperties": False}
    assert t.runtime == {}
    assert t.handler is None
    assert t("hi") == "hi"  # a Tool still calls like its function


def test_explicit_schema_gets_object_defaults_without_touching_the_callers_dict() -> None:
    schema: dict[str, Any] = {"properties": {"text": {"type": "string"}}}
    t = Tool(name="echo", description="d", parameters=schema, function=echo)
    assert t.parameters == {"type": "object", "properties": {"text": {"type": "string"}},
                            "required": []}
    assert schema == {"properties": {"text": {"type": "string"}}}


def test_missing_name_is_a_usage_error_naming_the_field() -> None:
    with pytest.raises(InvalidToolDefinition, match="missing required field 'name'") as info:
        Tool(description="no name", function=echo)
    assert isinstance(info.value, UsageError)


@pytest.mark.parametrize("name", ["", "has space", "dots.are.out", "x" * 65, "ünï"])
def test_provider_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidToolDefinition, match="must be 1-64 characters"):
        Tool(name=name, function=echo)


def test_longest_safe_name_is_accepted() -> None:
    assert Tool(name="a-B_9" + "x" * 59, function=echo).name.endswith("x")


def test_function_must_be_callable_and_present() -> None:
    with pytest.raises(InvalidToolDefinition, match="Tool 'x': field 'function' must be callable"):
        Tool(name="x", function="not callable")
    with pytest.raises(InvalidToolDefinition, match="missing required field 'function'"):
        Tool(name="x")


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"type": "array"}, 'JSON-schema object \\("type": "object"\\), got \'array\''),
        ({"properties": {"a": "string"}}, "parameters.properties must map"),
        ({"properties": {}, "required": ["a"]}, "required names a, which"),
        ({"properties": {}, "required": "a"}, "parameters.required must be a list"),
    ],
)
def test_malformed_parameter_schemas_are_refused(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidToolDefinition, match=message):
        Tool(name="x", function=echo, parameters=parameters)


def test_runtime_values_are_checked_and_exposed() -> None:
    t = Tool(name="x", function=echo,
             runtime={"duplicate_policy": "repeatable", "completion_signal": "terminal",
                      "custom_plugin_key": 1})
    assert t.repeatable
    assert t.terminal
    assert not Tool(name="y", function=echo).repeatable
    with pytest.raises(InvalidToolDefinition, match=r"runtime\.duplicate_policy must be one of"):
        Tool(name="x", function=echo, runtime={"duplicate_policy": "sometimes"})
    with pytest.raises(InvalidToolDefinition, match=r"runtime\.completion_signal"):
        Tool(name="x", function=echo, runtime={"completion_signal": "maybe"})


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(InvalidToolDefinition, match="field 'descripton'"):
        Tool(name="x", function=echo, descripton="typo")


def test_positional_only_parameters_cannot_be_called_by_keyword() -> None:
    def f(a: int, /) -> int:
        return a

    with pytest.raises(InvalidToolDefinition, match="Tool 'f': parameter 'a' is positional-only"):
        tool(f)


def test_unresolvable_annotation_is_reported() -> None:
    def f(a: "NoSuchType") -> None:  # type: ignore[name-defined]  # noqa: F821, UP037
        """F."""

    with pytest.raises(InvalidToolDefinition, match="cannot resolve the type hints"):
        tool(f)


def test_decorator_bare_and_with_options() -> None:
    @tool
    def plain(x: int) -> int:
        """Plain."""
        return x

    @tool(name="renamed", runtime={"duplicate_policy": "repeatable"}, handler="publish")
    def with_options(x: int) -> int:
        """With options."""
        return x

    assert isinstance(plain, Tool)
    assert plain.name == "plain"
    assert with_options.name == "renamed"
    assert with_options.repeatable
    assert with_options.handler == "publish"


def test_decorated_lambda_needs_a_name() -> None:
    with pytest.raises(InvalidToolDefinition, match="'<lambda>' must be 1-64"):
        tool(lambda: None)
    assert tool(name="now")(lambda: 1).name == "now"


def test_async_functions_and_async_callable_objects_are_detected() -> None:
    async def fetch(url: str) -> str:
        """Fetch."""
        return url

    class Poller:
        """Poll a queue."""

        async def __call__(self, queue: str) -> str:
            return queue

    assert tool(fetch).is_async
    poller = Tool(name="poll", function=Poller())
    assert poller.is_async
    assert poller.description == "Poll a queue."
    assert poller.parameters["required"] == ["queue"]
    assert asyncio.run(poller(queue="q")) == "q"
    assert not tool(echo).is_async


def test_tools_are_hashable_and_equal_by_definition() -> None:
    first = Tool(name="echo", function=echo)
    same = Tool(name="echo", function=echo)
    assert first == same
    assert len({first, same, Tool(name="other", function=echo)}) == 2
