"""A typed function's arguments: their JSON schema and their validation, both by pydantic.

An author writes ``ship(addr: Addr, unit: Unit, n: Annotated[int, Field(ge=1, le=10)])`` and
expects the model's ``{"addr": {...}, "unit": "kg", "n": "3"}`` to arrive as an ``Addr``, a
``Unit`` and ``3``, and ``n=99`` to be refused. So the signature becomes one pydantic type (a
TypedDict of the parameters, ``NotRequired`` for those with defaults, so a value the model left
out is simply not passed and the function's own default applies); its JSON schema is what the
model is shown (descriptions from ``Field`` or the docstring, constraints, nested models under
``$defs``), and validating the model's arguments against it is one pydantic-core call per tool
call that checks, converts and builds the instances. Every way the arguments can be wrong comes
back as one ``invalid_arguments`` result listing each field's error, so the model can fix its
call.

One :class:`SignatureArguments` is made per function and shared by every ``Tool`` built on it.
"""

from __future__ import annotations

import enum
import functools
import inspect
import weakref
from collections.abc import Callable, Mapping
from typing import Annotated, Any, NotRequired, get_args, get_origin, get_type_hints

from pydantic import ConfigDict, Field, PydanticSchemaGenerationError, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from typing_extensions import TypedDict

from agents_api.jsontext import plain_json
from datamachine.errors import InvalidToolDefinition
from datamachine.tools.arguments import INVALID_ARGUMENTS
from datamachine.tools.docstrings import parse_docstring
from datamachine.tools.validation import ParameterError

__all__ = ["CONTEXT_PARAMETER", "SignatureArguments", "signature_arguments"]

# The parameter name through which a tool function asks for its ToolContext.
CONTEXT_PARAMETER = "context"

_CACHE: weakref.WeakKeyDictionary[Any, SignatureArguments] = weakref.WeakKeyDictionary()


def signature_arguments(function: Callable[..., Any]) -> SignatureArguments:
    """The (cached) typed arguments of ``function``; InvalidToolDefinition when its signature
    cannot be described."""
    try:
        cached = _CACHE.get(function)
    except TypeError:  # not weak-referenceable: built every time
        return SignatureArguments(function)
    if cached is None:
        cached = SignatureArguments(function)
        _CACHE[function] = cached
    return cached


class SignatureArguments:
    """The schema and validator of one function's keyword parameters.

    ``schema``: the JSON-schema object of the parameters; ``description``: the docstring's
    first paragraph; ``accepted``: the names the function takes (None with ``**kwargs``).
    """

    __slots__ = ("_adapter", "_required", "accepted", "description", "schema", "takes_kwargs")

    _adapter: TypeAdapter[Any]

    def __init__(self, function: Callable[..., Any]) -> None:
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError) as exc:
            raise InvalidToolDefinition(
                f"cannot read the signature of its function ({exc}); pass parameters= "
                "explicitly") from None
        hints = _type_hints(function, signature)
        doc = parse_docstring(inspect.getdoc(_documented(function)))
        fields: dict[str, Any] = {}
        required: list[str] = []
        defaults: dict[str, Any] = {}
        self.takes_kwargs = False
        for param in signature.parameters.values():
            if param.kind is param.VAR_KEYWORD:
                self.takes_kwargs = True
                continue
            if param.name == CONTEXT_PARAMETER or param.kind is param.VAR_POSITIONAL:
                continue
            if param.kind is param.POSITIONAL_ONLY:
                raise InvalidToolDefinition(
                    f"parameter {param.name!r} is positional-only; tools are called with "
                    "keyword arguments, so remove the '/' from the signature")
            annotation = _described(hints.get(param.name, Any), doc.params.get(param.name))
            if param.default is param.empty:
                required.append(param.name)
                fields[param.name] = annotation
            else:
                fields[param.name] = NotRequired[annotation]
                defaults[param.name] = param.default
        make_typed_dict: Any = TypedDict  # built from a runtime name and fields
        arguments: Any = make_typed_dict(f"{_name(function)}_arguments", fields)
        arguments.__pydantic_config__ = ConfigDict(
            extra="allow" if self.takes_kwargs else "forbid")
        try:
            self._adapter = TypeAdapter(arguments)
            schema = self._adapter.json_schema()
        except (PydanticSchemaGenerationError, TypeError, NameError) as exc:
            raise InvalidToolDefinition(
                f"its parameters cannot be described as JSON schema ({exc})") from None
        self.schema = _tidy(schema, defaults, required, self.takes_kwargs)
        self.description = doc.description
        self._required = tuple(required)
        self.accepted = None if self.takes_kwargs else frozenset(fields)

    def validate(self, params: Mapping[str, Any], tool_name: str = "") -> dict[str, Any]:
        """The keyword arguments to call the function with (checked and converted), or
        :class:`ParameterError` with ``error_type="invalid_arguments"`` listing each field
        (messages name ``tool_name``)."""
        # Models send null (or "") for "not given": a required one is missing, an optional one
        # falls back to the function's default.
        missing = [name for name in self._required if params.get(name) in (None, "")]
        if missing:
            raise ParameterError(
                f'Tool "{tool_name}" requires the following parameters: '
                f"{', '.join(missing)}.", INVALID_ARGUMENTS, {"missing_parameters": missing})
        if None in params.values():
            params = {key: value for key, value in params.items() if value is not None}
        try:
            validated: dict[str, Any] = self._adapter.validate_python(params)
            return validated
        except ValidationError as exc:
            errors = exc.errors()
            problems = [_problem(error) for error in errors]
            extra: dict[str, Any] = {"invalid_arguments": problems}
            unknown = [str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden"]
            known = ""
            if unknown:
                extra["unknown_parameters"] = unknown
                known = f" Its parameters are: {', '.join(sorted(self.accepted or ()))}."
            raise ParameterError(
                f'Tool "{tool_name}" received invalid arguments: {"; ".join(problems)}.{known} '
                "Fix them and call again.", INVALID_ARGUMENTS, extra) from None

    def named(self, tool_name: str) -> NamedArguments:
        """This validator for the tool ``tool_name`` (whose name its errors carry)."""
        return NamedArguments(self, tool_name)


class NamedArguments:
    """One tool's validator: a shared :class:`SignatureArguments` and the tool's name."""

    __slots__ = ("_arguments", "_name", "accepted")

    def __init__(self, arguments: SignatureArguments, tool_name: str) -> None:
        self._arguments = arguments
        self._name = tool_name
        self.accepted = arguments.accepted

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """See :meth:`SignatureArguments.validate`."""
        return self._arguments.validate(params, self._name)


def _problem(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "arguments"
    if error["type"] == "missing":
        return f"{where} is required"
    if error["type"] == "extra_forbidden":
        return f"{where} is not a parameter of this tool"
    return f"{where}: {error['msg']} (got {_shown(error.get('input'))})"


def _shown(value: Any) -> str:
    try:
        text = plain_json(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _described(annotation: Any, text: str | None) -> Any:
    # A docstring's description, unless the annotation's own Field already has one.
    if not text:
        return annotation
    if get_origin(annotation) is Annotated and any(
            isinstance(meta, FieldInfo) and meta.description for meta in get_args(annotation)[1:]):
        return annotation
    return Annotated[annotation, Field(description=text)]


def _tidy(schema: dict[str, Any], defaults: Mapping[str, Any], required: list[str],
          takes_kwargs: bool) -> dict[str, Any]:
    """The schema a model is shown: pydantic's, without its generated titles, with the
    function's JSON-safe defaults, and ``required`` always present."""
    tidy = _simplified(_untitled(schema))
    properties = tidy.setdefault("properties", {})
    for name, default in defaults.items():
        value = default.value if isinstance(default, enum.Enum) else default
        if name in properties and _json_safe(value):
            properties[name].setdefault("default", value)
    tidy["type"] = "object"
    tidy["required"] = list(required)
    if takes_kwargs:
        tidy.pop("additionalProperties", None)
    return tidy


def _simplified(schema: dict[str, Any]) -> dict[str, Any]:
    """Shapes small models read more reliably, meaning the same: a plain enum inline instead
    of a ``$ref`` (and its definition dropped when nothing else uses it), ``"type": [T,
    "null"]`` instead of an ``anyOf`` for an optional scalar, and no ``additionalProperties:
    true`` (the default)."""
    defs = schema.get("$defs", {})
    enums = {f"#/$defs/{name}": definition for name, definition in defs.items()
             if "enum" in definition and "properties" not in definition}
    simplified: dict[str, Any] = _rewrite(schema, enums)
    if "$defs" in simplified:
        text = plain_json({k: v for k, v in simplified.items() if k != "$defs"}) + plain_json(
            {name: d for name, d in simplified["$defs"].items()
             if f"#/$defs/{name}" not in enums})
        kept = {name: d for name, d in simplified["$defs"].items()
                if f"#/$defs/{name}" not in enums or f'"#/$defs/{name}"' in text}
        if kept:
            simplified["$defs"] = kept
        else:
            del simplified["$defs"]
    return simplified


def _rewrite(node: Any, enums: Mapping[str, Any]) -> Any:
    if isinstance(node, list):
        return [_rewrite(item, enums) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref in enums:
        return {**_rewrite(enums[ref], enums), **{k: _rewrite(v, enums)
                                                  for k, v in node.items() if k != "$ref"}}
    out = {key: _rewrite(value, enums) for key, value in node.items()}
    if out.get("additionalProperties") is True:
        del out["additionalProperties"]
    branches = out.get("anyOf")
    if isinstance(branches, list) and len(branches) == 2 and {"type": "null"} in branches:
        other = branches[0] if branches[1] == {"type": "null"} else branches[1]
        if isinstance(other.get("type"), str) and set(other) <= {"type", "items",
                                                                  "additionalProperties"}:
            del out["anyOf"]
            out = {**other, **out, "type": [other["type"], "null"]}
    return out


def _untitled(node: Any, in_properties: bool = False) -> Any:
    if isinstance(node, dict):
        return {key: _untitled(value, key in ("properties", "$defs"))
                for key, value in node.items()
                if in_properties or key != "title"}
    if isinstance(node, list):
        return [_untitled(item) for item in node]
    return node


def _json_safe(value: Any) -> bool:
    try:
        plain_json(value)
    except (TypeError, ValueError):
        return False
    return True


def _name(function: Callable[..., Any]) -> str:
    name = getattr(_documented(function), "__name__", None) or type(function).__name__
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)


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
        return get_type_hints(target, include_extras=True)
    except NameError as exc:
        raise InvalidToolDefinition(
            f"cannot resolve the type hints of its function ({exc}); make sure every "
            "annotation names an importable type") from None
    except TypeError:
        # Not introspectable (a builtin, an exotic callable): use what the signature shows.
        return {name: p.annotation for name, p in signature.parameters.items()
                if p.annotation is not p.empty and not isinstance(p.annotation, str)}
