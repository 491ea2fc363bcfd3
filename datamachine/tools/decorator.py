"""``@datamachine.tool``: turn a typed, documented function into a :class:`Tool`.

The function's name, type hints and docstring already say what the model needs to know, so the
decorator reads them instead of asking the author to write a JSON schema by hand. It works bare
(``@tool``) and with options (``@tool(name="search", runtime={...})``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, overload

from agents_api.errors import brief_repr
from datamachine.errors import InvalidToolDefinition
from datamachine.tools.definition import Tool

__all__ = ["tool"]


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    handler: str | None = None,
    runtime: dict[str, Any] | None = None,
    effects: str | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    handler: str | None = None,
    runtime: dict[str, Any] | None = None,
    effects: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Build a :class:`Tool` from a function.

    The tool's name defaults to the function's name; its description to the docstring's first
    paragraph; its schema to one built from the type hints (a parameter without a default is
    required; ``Args:`` lines describe parameters). A parameter named ``context`` is not part of
    the schema: the executor passes a :class:`ToolContext` there. ``effects`` is
    ``runtime={"effects": ...}``: ``"read"`` (the default), ``"idempotent"`` or ``"write"``
    (anything else is an ``InvalidToolDefinition`` naming ``effects``, raised here).
    """

    if runtime is not None and not isinstance(runtime, Mapping):
        raise InvalidToolDefinition(
            f"@tool(runtime=...) must be a dict of runtime options (for example "
            f"{{'effects': 'write'}}), got {brief_repr(runtime)}.")

    def build(fn: Callable[..., Any]) -> Tool:
        if not callable(fn):
            raise InvalidToolDefinition(
                f"@tool decorates a function, got {type(fn).__name__}."
            )
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        declared = dict(runtime or {})
        if effects is not None:
            declared["effects"] = effects
        return Tool(
            name=tool_name,
            description=description or "",
            parameters=parameters,
            function=fn,
            handler=handler,
            runtime=declared,
        )

    if function is not None:
        return build(function)
    return build
