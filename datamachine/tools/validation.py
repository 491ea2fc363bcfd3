"""Checking a model's tool arguments against the tool's schema before the tool runs.

Models get arguments wrong in a handful of ways: a required one left out, a number sent as a
string, a name that does not exist. Each becomes a failed tool result the model can read and
correct, instead of a ``TypeError`` from deep inside the tool. The checker is compiled once per
tool, so a call costs one pass over the arguments it was given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from agents_api.jsontext import plain_json
from datamachine.tools.arguments import INVALID_ARGUMENTS

__all__ = ["ArgumentValidator", "ParameterError", "ParameterValidator", "type_problem"]

_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number",
               "boolean": "a boolean", "array": "an array", "object": "an object",
               "null": "null"}


class ArgumentValidator(Protocol):
    """What the executor calls: the arguments to call the tool with, or ParameterError."""

    accepted: frozenset[str] | None

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Checked (and, for typed tools, converted) keyword arguments."""


class ParameterError(Exception):
    """Arguments that do not fit the schema; ``error_type`` and ``extra`` go into the result."""

    def __init__(self, message: str, error_type: str, extra: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type
        self.extra = extra


def _matches_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list | tuple)
    if kind == "object":
        return isinstance(value, Mapping)
    if kind == "null":
        return value is None
    return True  # a type this checker does not know: let the tool decide


def _describe(value: Any) -> str:
    try:
        text = plain_json(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def type_problem(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    """Why ``value`` does not fit ``schema`` (type, enum, anyOf, array items), or None."""
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(_describe(v) for v in schema["enum"])
        return f"{where} must be one of {allowed} (got {_describe(value)})"
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches and all(
            type_problem(value, b, where) is not None for b in branches if isinstance(b, Mapping)
        ):
            return f"{where} has an unexpected type (got {_describe(value)})"
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []
    if kinds and not any(_matches_type(value, k) for k in kinds if isinstance(k, str)):
        expected = " or ".join(_TYPE_NAMES.get(k, k) for k in kinds if isinstance(k, str))
        return f"{where} must be {expected} (got {_describe(value)})"
    items = schema.get("items")
    if isinstance(items, Mapping) and isinstance(value, list | tuple):
        for index, item in enumerate(value):
            problem = type_problem(item, items, f"{where}[{index}]")
            if problem is not None:
                return problem
    return None


class ParameterValidator:
    """A tool's compiled argument checker.

    ``accepted`` is the set of argument names the function can take, or None when it takes
    ``**kwargs`` (and the schema does not forbid extra properties).
    """

    __slots__ = ("_integers", "_properties", "_required", "_simple", "_tool_name", "accepted")

    def __init__(
        self, tool_name: str, schema: Mapping[str, Any], accepted: frozenset[str] | None
    ) -> None:
        self._tool_name = tool_name
        properties = schema.get("properties") or {}
        self._properties: dict[str, Mapping[str, Any]] = {
            name: prop for name, prop in properties.items() if isinstance(prop, Mapping)
        }
        self._required: tuple[str, ...] = tuple(schema.get("required") or ())
        # Most properties are just {"type": ...}: those get a direct type test per call, and
        # the full schema walk only runs to explain a failure or for richer schemas.
        self._simple: dict[str, str] = {
            name: prop["type"] for name, prop in self._properties.items()
            if isinstance(prop.get("type"), str)
            and not {"enum", "anyOf", "oneOf", "items"} & prop.keys()
        }
        # Floats like 3.0 sent for an integer parameter are passed on as ints.
        self._integers = frozenset(
            name for name, prop in self._properties.items() if prop.get("type") == "integer"
        )
        if schema.get("additionalProperties") is False:
            accepted = frozenset(self._properties) if accepted is None else (
                accepted & frozenset(self._properties)
            )
        self.accepted = accepted

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Return the arguments to call the tool with, or raise :class:`ParameterError`."""
        # Missing and empty (None or "") are both missing: the model left the value out.
        missing = [name for name in self._required if params.get(name) in (None, "")]
        if missing:
            raise ParameterError(
                f'Tool "{self._tool_name}" requires the following parameters: '
                f"{', '.join(missing)}.",
                INVALID_ARGUMENTS,
                {"missing_parameters": missing},
            )
        if self.accepted is not None:
            unknown = [name for name in params if name not in self.accepted]
            if unknown:
                allowed = ", ".join(sorted(self.accepted)) or "(none)"
                raise ParameterError(
                    f'Tool "{self._tool_name}" does not accept the parameter(s) '
                    f"{', '.join(unknown)}. Accepted parameters: {allowed}.",
                    INVALID_ARGUMENTS,
                    {"unknown_parameters": unknown},
                )
        problems: list[str] = []
        arguments: dict[str, Any] = {}
        for name, value in params.items():
            if value is None and name not in self._required:
                # Models send null for "not given": the function's own default applies.
                continue
            simple = self._simple.get(name)
            if simple is not None and _matches_type(value, simple):
                prop = None
            else:
                prop = self._properties.get(name)
            if prop is not None:
                problem = type_problem(value, prop, name)
                if problem is not None:
                    problems.append(problem)
                    continue
            if name in self._integers and isinstance(value, float):
                value = int(value)
            arguments[name] = value
        if problems:
            raise ParameterError(
                f'Tool "{self._tool_name}" received invalid parameters: {"; ".join(problems)}.',
                INVALID_ARGUMENTS,
                {"invalid_arguments": problems},
            )
        return arguments
