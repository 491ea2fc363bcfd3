"""Building a tool's JSON schema from a Python function's signature and docstring.

Authors write an ordinary typed function; the model needs a JSON-schema object. Common
annotations (``str``, ``int``, ``float``, ``bool``, ``list[...]``, ``dict[...]``, ``Literal``,
``Optional``/``X | None``, enums) map to plain, provider-friendly schema by hand; anything richer
(pydantic models, TypedDicts) goes through pydantic, with its ``$defs`` hoisted to the root so
references still resolve. A parameter without a default is required.
"""

from __future__ import annotations

import enum
import functools
import inspect
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from agents_api.jsontext import plain_json
from datamachine.errors import InvalidToolDefinition
from datamachine.tools.docstrings import parse_docstring

__all__ = ["CONTEXT_PARAMETER", "annotation_schema", "function_schema"]

# The parameter name through which a tool function asks for its ToolContext.
CONTEXT_PARAMETER = "context"

_SIMPLE: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                           type(None): "null"}


def function_schema(function: Callable[..., Any]) -> tuple[dict[str, Any], str]:
    """Return ``(parameters_schema, description)`` for ``function``.

    The ``context`` parameter and ``*args``/``**kwargs`` are left out: the model never fills
    them. Descriptions come from the docstring's ``Args:`` section. Raises
    :class:`InvalidToolDefinition` (without a tool name; the caller adds it).
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as exc:
        raise InvalidToolDefinition(
            f"cannot read the signature of its function ({exc}); pass parameters= explicitly"
        ) from None
    hints = _type_hints(function, signature)
    doc = parse_docstring(inspect.getdoc(_documented(function)))
    properties: dict[str, Any] = {}
    required: list[str] = []
    defs: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.name == CONTEXT_PARAMETER:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise InvalidToolDefinition(
                f"parameter {param.name!r} is positional-only; tools are called with keyword "
                "arguments, so remove the '/' from the signature"
            )
        annotation = hints.get(param.name, Any)
        try:
            prop = annotation_schema(annotation, defs)
        except TypeError as exc:
            raise InvalidToolDefinition(
                f"parameter {param.name!r} has an annotation that cannot be described as JSON "
                f"schema ({exc})"
            ) from None
        text = doc.params.get(param.name)
        if text:
            prop["description"] = text
        if param.default is param.empty:
            required.append(param.name)
        else:
            default = param.default.value if isinstance(param.default, enum.Enum) else (
                param.default
            )
            if _json_safe(default):
                prop["default"] = default
        properties[param.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if defs:
        schema["$defs"] = defs
    return schema, doc.description


def _documented(function: Callable[..., Any]) -> Any:
    # A partial documents its wrapped function; a callable object documents itself or __call__.
    if isinstance(function, functools.partial):
        return function.func
    return function


def _type_hints(function: Callable[..., Any], signature: inspect.Signature) -> dict[str, Any]:
    target: Any = function
    if isinstance(function, functools.partial):
        target = function.func
    elif not (inspect.isfunction(function) or inspect.ismethod(function)):
        target = inspect.getattr_static(type(function), "__call__", function)
    try:
        return get_type_hints(target)
    except NameError as exc:
        raise InvalidToolDefinition(
            f"cannot resolve the type hints of its function ({exc}); make sure every "
            "annotation names an importable type"
        ) from None
    except TypeError:
        # Not introspectable (a builtin, an exotic callable): use what the signature shows.
        return {name: p.annotation for name, p in signature.parameters.items()
                if p.annotation is not p.empty and not isinstance(p.annotation, str)}


def annotation_schema(annotation: Any, defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON schema of one annotation; ``defs`` collects shared definitions for the root."""
    if defs is None:
        defs = {}
    if annotation is Any or annotation is inspect.Parameter.empty:
        return {}
    if annotation in _SIMPLE:
        return {"type": _SIMPLE[annotation]}
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return _literal_schema(args)
    if origin is Union or origin is types.UnionType:
        return _union_schema(args, defs)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _literal_schema(tuple(member.value for member in annotation))
    if annotation in (list, tuple, set, frozenset) or origin in (
        list, tuple, set, frozenset, Sequence
    ) or annotation is Sequence:
        return _array_schema(origin or annotation, args, defs)
    if annotation is dict or annotation is Mapping or origin in (dict, Mapping):
        schema: dict[str, Any] = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            schema["additionalProperties"] = annotation_schema(args[1], defs)
        return schema
    return _pydantic_schema(annotation, defs)


def _literal_schema(values: tuple[Any, ...]) -> dict[str, Any]:
    schema: dict[str, Any] = {"enum": list(values)}
    kinds = {_SIMPLE.get(type(value)) for value in values}
    if len(kinds) == 1 and None not in kinds:
        schema["type"] = kinds.pop()
    return schema


def _union_schema(args: tuple[Any, ...], defs: dict[str, Any]) -> dict[str, Any]:
    non_null = [arg for arg in args if arg is not type(None)]
    nullable = len(non_null) < len(args)
    if len(non_null) == 1:
        inner = annotation_schema(non_null[0], defs)
        if not nullable:
            return inner
        kind = inner.get("type")
        if isinstance(kind, str) and set(inner) <= {"type", "items", "additionalProperties"}:
            # ["string", "null"] reads better to models than an anyOf for plain Optionals.
            return {**inner, "type": [kind, "null"]}
        return {"anyOf": [inner, {"type": "null"}]}
    branches = [annotation_schema(arg, defs) for arg in non_null]
    if nullable:
        branches.append({"type": "null"})
    return {"anyOf": branches}


def _array_schema(container: Any, args: tuple[Any, ...], defs: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array"}
    if container is tuple and args and args[-1] is not Ellipsis:
        schema["prefixItems"] = [annotation_schema(arg, defs) for arg in args]
        schema["minItems"] = schema["maxItems"] = len(args)
        return schema
    if args and args[0] is not Any:
        schema["items"] = annotation_schema(args[0], defs)
    if container in (set, frozenset):
        schema["uniqueItems"] = True
    return schema


def _pydantic_schema(annotation: Any, defs: dict[str, Any]) -> dict[str, Any]:
    from pydantic import PydanticSchemaGenerationError, TypeAdapter

    try:
        schema = TypeAdapter(annotation).json_schema()
    except PydanticSchemaGenerationError as exc:
        raise TypeError(f"{annotation!r} is not a JSON-describable type") from exc
    defs.update(schema.pop("$defs", {}))
    return schema


def _json_safe(value: Any) -> bool:
    try:
        plain_json(value)
    except (TypeError, ValueError):
        return False
    return True
