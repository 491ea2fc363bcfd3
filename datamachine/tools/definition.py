"""The tool definition every run offers to a model: :class:`Tool`.

A ``Tool`` is what crosses the boundary between plugins, the host and providers, so it is a
pydantic model validated once, when it is defined: a tool with no name, a provider-unsafe name
or a malformed schema fails at import or boot, not three turns into a run. What the executor
needs to call it quickly (is it async, does it want a context, which arguments can it take) is
worked out here too, once.
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents_api.errors import brief_repr
from agents_api.jsontext import canonical_json
from datamachine.errors import InvalidToolDefinition
from datamachine.tools.docstrings import parse_docstring
from datamachine.tools.typed import CONTEXT_PARAMETER, signature_arguments
from datamachine.tools.validation import ArgumentValidator, ParameterValidator

__all__ = ["DUPLICATE_POLICIES", "EFFECTS", "JSON_SCHEMA_TYPES", "TOOL_NAME_PATTERN", "Tool",
           "definition_problem", "tool_problem"]

# Names every provider accepts for a function (OpenAI's rule is the strictest).
TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
DUPLICATE_POLICIES = frozenset({"reject", "repeatable"})
# What a call does to the world (DESIGN.md 24): "read" (safe to repeat, the default),
# "idempotent" (repeats are safe with the same idempotency key), "write" (must not repeat unasked).
EFFECTS = ("read", "idempotent", "write")
COMPLETION_SIGNALS = frozenset({"terminal"})


class Tool(BaseModel):
    """One tool: its provider-facing name, description and JSON schema, and the function.

    Build it with keyword arguments, or let ``@datamachine.tool`` build it from a typed
    function. ``parameters`` is a JSON-schema object; when left out it is generated from the
    function's signature, as is an empty ``description`` from its docstring. ``runtime`` may say
    ``completion_signal: "terminal"`` (a successful call ends the run's task),
    ``duplicate_policy: "repeatable"`` (identical calls are never rejected as duplicates) and
    ``effects``: ``"read"`` (the default: safe to repeat), ``"idempotent"`` (repeats are safe
    with the same ``ToolContext.idempotency_key``) or ``"write"`` (must not run twice unasked).
    ``handler`` names the pipeline handler the tool stands for, if any; ``plugin`` is set by the
    tool registry to the plugin that registered it.

    Invalid definitions raise :class:`datamachine.errors.InvalidToolDefinition` naming the field.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid",
                              arbitrary_types_allowed=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    function: Callable[..., Any]
    handler: str | None = None
    runtime: dict[str, Any] = Field(default_factory=dict)
    plugin: str | None = None

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidToolDefinition(_explain(exc, data)) from None

    @model_validator(mode="before")
    @classmethod
    def _fill_from_function(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("parameters"), dict):
            # Defaults are filled in below; never on the caller's own dict.
            data["parameters"] = dict(data["parameters"])
        function = data.get("function")
        if not callable(function):
            return data  # field validation reports what is missing
        needs_schema = data.get("parameters") is None
        needs_description = not data.get("description")
        if needs_schema:
            try:
                arguments = signature_arguments(function)
            except InvalidToolDefinition as exc:
                # Reported with the tool's name by __init__, like every other field error.
                raise ValueError(str(exc)) from None
            data["parameters"] = copy.deepcopy(arguments.schema)
            description = arguments.description
        elif needs_description:
            description = parse_docstring(inspect.getdoc(function)).description
        if needs_description:
            data["description"] = description
        return data

    @model_validator(mode="after")
    def _check(self) -> Tool:
        _fill_schema_defaults(self.parameters)
        problem = tool_problem(self) or definition_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    # -- what calling and offering the tool needs, worked out once --------------------------
    # A functools.cached_property, not a pydantic PrivateAttr: reading a private attribute goes
    # through BaseModel.__getattr__ (about 18 k instructions, a run reads four), while a cached
    # property is a plain instance attribute once computed. model_copy copies it along, so
    # _derived() checks it was made from this tool's own values.
    @cached_property
    def _compiled(self) -> _Compiled:
        return _compile(self)

    def _derived(self) -> _Compiled:
        compiled = self._compiled
        if compiled.source != _source(self):
            return _compile(self)  # a copy with other values: worked out again, not kept
        return compiled

    # -- what the rest of the package reads ------------------------------------------------
    def to_provider_dict(self) -> dict[str, Any]:
        """``{"name", "description", "parameters"}``: the shape every provider request uses."""
        return {"name": self.name, "description": self.description,
                "parameters": self.parameters}

    def provider_json(self) -> str:
        """The JSON of :meth:`to_provider_dict` (sorted keys), which request metadata sizes and
        hashes once per run (written once per tool and kept)."""
        return self._derived().provider_json

    @property
    def repeatable(self) -> bool:
        """True when identical calls may run again (``duplicate_policy: "repeatable"``)."""
        return self.runtime.get("duplicate_policy") == "repeatable"

    @property
    def effects(self) -> str:
        """What a call does to the world: ``read`` (undeclared, or declared None), ``idempotent``
        or ``write``."""
        declared = self.runtime.get("effects")
        return "read" if declared is None else str(declared)

    @property
    def terminal(self) -> bool:
        """True when a successful call signals the task is done (``completion_signal``)."""
        return self.runtime.get("completion_signal") == "terminal"

    @property
    def wants_context(self) -> bool:
        """Whether the function declares a ``context`` parameter (it gets a ToolContext)."""
        return self._derived().wants_context

    @property
    def is_async(self) -> bool:
        """Whether calling the function returns a coroutine."""
        return self._derived().is_async

    @property
    def validator(self) -> ArgumentValidator:
        """The compiled argument checker: pydantic's, from the function's signature, when the
        schema was made from it; else a checker of the schema the tool was given."""
        return self._derived().validator

    def _identity(self) -> tuple[Any, ...]:
        return (self.name, self.description, self.parameters, self.function, self.handler,
                self.runtime, self.plugin)

    def __eq__(self, other: object) -> bool:
        # Two definitions of the same tool are equal; the compiled helpers do not count.
        if not isinstance(other, Tool):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        # The generated hash would hash the schema dicts and fail; name and function identify
        # a tool (equal tools hash equal, so tools work in sets and as dict keys).
        return hash((self.name, id(self.function), self.plugin))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in tests and plain Python code)."""
        return self.function(*args, **kwargs)


@dataclass(frozen=True, slots=True)
class _Compiled:
    """What the executor and the turn runner read of a tool, and the values it was made from
    (``source``: name, description, the parameters and the function object)."""

    source: tuple[str, str, int, int]
    wants_context: bool
    is_async: bool
    validator: ArgumentValidator
    provider_json: str


def _source(tool: Tool) -> tuple[str, str, int, int]:
    return (tool.name, tool.description, id(tool.parameters), id(tool.function))


def _compile(tool: Tool) -> _Compiled:
    signature = _signature(tool.function)
    accepted: frozenset[str] | None = None
    wants_context = False
    if signature is not None:
        params = signature.parameters
        wants_context = CONTEXT_PARAMETER in params
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if not takes_kwargs:
            accepted = frozenset(
                name for name, p in params.items()
                if name != CONTEXT_PARAMETER
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            )
    return _Compiled(
        source=_source(tool), wants_context=wants_context,
        is_async=_is_coroutine_function(tool.function),
        validator=_validator(tool, accepted),
        provider_json=canonical_json(tool.to_provider_dict()))


def _validator(tool: Tool, accepted: frozenset[str] | None) -> ArgumentValidator:
    # The function's own types when the schema is the one its signature gives (the typed
    # path: conversion, models, constraints); a schema given by hand (an MCP server's, a
    # plugin's) is checked as a schema.
    try:
        typed = signature_arguments(tool.function)
    except InvalidToolDefinition:
        typed = None
    if typed is not None and typed.schema == tool.parameters:
        return typed.named(tool.name)
    return ParameterValidator(tool.name, tool.parameters, accepted)


def _signature(function: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: pass arguments through unchecked


def _is_coroutine_function(function: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    # A callable object whose __call__ is async behaves like an async function.
    return inspect.iscoroutinefunction(inspect.getattr_static(type(function), "__call__", None))


def tool_problem(tool: Tool) -> str | None:
    """Why ``tool`` breaks the rules every definition is checked against, else None: a
    provider-safe name, a callable function, a JSON-schema object of parameters, a known
    runtime. What ``Tool(...)`` checks when it is built, and what a run checks again for a tool
    that skipped it (``model_copy(update=...)``, ``model_construct``, a schema changed later).
    """
    name = tool.name
    if not isinstance(name, str) or not TOOL_NAME_PATTERN.fullmatch(name):
        return (f"name {brief_repr(name)} must be 1-64 characters of letters, digits, '_' or "
                "'-' (the names every provider accepts)")
    if not callable(tool.function):
        return f"field 'function' must be callable, got {type(tool.function).__name__}"
    if not isinstance(tool.description, str):
        return f"field 'description' must be a string, got {type(tool.description).__name__}"
    return _schema_problem(tool.parameters) or _runtime_problem(tool.runtime)


def definition_problem(tool: Tool) -> str | None:
    """What is checked once, when a tool is defined (a whole walk of its schema, too slow to
    repeat every run): the schema is JSON (no Python set, no non-string key, no NaN), every
    ``type`` is a JSON-schema type, every ``$ref`` points into the schema, and every parameter
    is one the function takes (unless it takes ``**kwargs``)."""
    problem = _node_problem(tool.parameters, "parameters", tool.parameters)
    if problem is not None:
        return problem
    return _unknown_parameter(tool)


# JSON-schema keywords whose values are schemas: a map of them, a list of them, or one.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_ONE = frozenset({"items", "additionalProperties", "not", "if", "then", "else",
                         "contains", "propertyNames", "unevaluatedProperties",
                         "unevaluatedItems", "additionalItems"})
JSON_SCHEMA_TYPES = ("string", "number", "integer", "boolean", "array", "object", "null")


def _data_problem(value: Any, path: str) -> str | None:
    """Why ``value`` is not JSON data, or None."""
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if value == value and abs(value) != float("inf") else (
            f"{path} is {value!r}, which JSON cannot hold")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the key {brief_repr(key)}; JSON keys are strings"
            found = _data_problem(item, f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _data_problem(item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    hint = " (use a list)" if isinstance(value, set | frozenset | tuple) else ""
    return f"{path} is a Python {type(value).__name__}; a JSON schema holds JSON values{hint}"


def _node_problem(node: Any, path: str, root: dict[str, Any]) -> str | None:
    """Why the schema ``node`` (at ``path``) is not a usable JSON schema, or None."""
    if isinstance(node, bool):
        return None  # true / false are schemas
    if not isinstance(node, dict):
        return _data_problem(node, path) or f"{path} must be a schema (a dict)"
    for key, value in node.items():
        if not isinstance(key, str):
            return f"{path} has the key {brief_repr(key)}; JSON keys are strings"
        found = _keyword_value_problem(key, value, f"{path}.{key}", root)
        if found is not None:
            return found
    return None


def _keyword_value_problem(key: str, value: Any, where: str,
                           root: dict[str, Any]) -> str | None:
    """Why the value of one schema keyword is wrong: a sub-schema (or a map or list of them)
    is walked, any other value must be JSON data."""
    subschemas: list[tuple[str, Any]] = []
    if key in _SCHEMA_MAPS and isinstance(value, dict):
        subschemas = [(f"{where}.{name}", sub) for name, sub in value.items()]
    elif isinstance(value, list) and (key in _SCHEMA_LISTS or key == "items"):
        subschemas = [(f"{where}[{index}]", sub) for index, sub in enumerate(value)]
    elif key in _SCHEMA_ONE:
        subschemas = [(where, value)]
    else:
        return _data_problem(value, where) or _keyword_problem(key, value, where, root)
    for sub_path, sub in subschemas:
        found = _node_problem(sub, sub_path, root)
        if found is not None:
            return found
    return _data_problem(value, where)  # a map's own keys (a set of names is no map)


def _keyword_problem(key: str, value: Any, where: str, root: dict[str, Any]) -> str | None:
    if key == "type":
        kinds = value if isinstance(value, list) else [value]
        for kind in kinds:
            if kind not in JSON_SCHEMA_TYPES:
                return (f"{where} {brief_repr(kind)} is not a JSON-schema type (one of "
                        f"{', '.join(JSON_SCHEMA_TYPES)})")
    elif key == "$ref" and not _resolves(root, value):
        return (f"{where} {brief_repr(value)} points to nothing in the schema (define it under "
                "parameters.$defs and refer to it as '#/$defs/Name')")
    return None


def _resolves(root: dict[str, Any], ref: object) -> bool:
    """Whether the local reference ``ref`` (``#/$defs/Place``) names a part of ``root``."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return False
    node: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdecimal() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def _unknown_parameter(tool: Tool) -> str | None:
    """A parameter the schema offers that the function cannot take, or None."""
    signature = _signature(tool.function)
    properties = tool.parameters.get("properties")
    if signature is None or not isinstance(properties, dict):
        return None
    params = signature.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    taken = [name for name, p in params.items() if name != CONTEXT_PARAMETER
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in properties:
        if name not in taken:
            function = getattr(tool.function, "__name__", "the function")
            return (f"parameters.properties.{name}: {function}() takes no parameter {name!r} "
                    f"(it takes: {', '.join(taken) or 'none'}); rename the parameter, add it "
                    "to the function, or give the function **kwargs")
    return None


def _fill_schema_defaults(schema: dict[str, Any]) -> None:
    # What a definition may leave out: an object with no parameters (the tool's own copy).
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    schema.setdefault("required", [])


def _schema_problem(schema: object) -> str | None:
    if not isinstance(schema, dict):
        return f"parameters must be a JSON-schema object, got {type(schema).__name__}"
    kind = schema.get("type", "object")
    if kind != "object":
        return f'parameters must be a JSON-schema object ("type": "object"), got {kind!r}'
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(key, str) and isinstance(value, dict) for key, value in properties.items()
    ):
        return "parameters.properties must map each parameter name to a schema dict"
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(item, str) for item in required):
        return "parameters.required must be a list of parameter names"
    unknown = [item for item in required if item not in properties]
    if unknown:
        return (f"parameters.required names {', '.join(unknown)}, which parameters.properties "
                "does not define")
    return None


def _runtime_problem(runtime: object) -> str | None:
    if not isinstance(runtime, dict):
        return f"runtime must be a dict, got {type(runtime).__name__}"
    approval = runtime.get("requires_approval")
    if approval is not None and not isinstance(approval, bool):
        return f"runtime.requires_approval must be true or false, got {approval!r}"
    policy = runtime.get("duplicate_policy")
    if policy is not None and policy not in DUPLICATE_POLICIES:
        return (f"runtime.duplicate_policy must be one of {sorted(DUPLICATE_POLICIES)}, "
                f"got {policy!r}")
    effects = runtime.get("effects")
    if effects is not None and effects not in EFFECTS:
        return (f"runtime.effects must be one of 'read' (safe to repeat), 'idempotent' "
                f"(repeats are safe with the same idempotency key) or 'write' (must not run "
                f"twice unasked), got {effects!r}")
    signal = runtime.get("completion_signal")
    if signal is not None and signal not in COMPLETION_SIGNALS:
        return (f"runtime.completion_signal must be one of {sorted(COMPLETION_SIGNALS)}, "
                f"got {signal!r}")
    return None


_FIELD_HELP: dict[str, str] = {
    "name": "a name of 1-64 letters, digits, '_' or '-'",
    "function": "the callable that runs the tool",
    "parameters": "a JSON-schema object",
    "description": "a string telling the model what the tool does",
    "runtime": "a dict such as {'duplicate_policy': 'repeatable'}",
}


def _explain(exc: ValidationError, data: dict[str, Any]) -> str:
    name = data.get("name")
    label = f"Tool {name!r}" if isinstance(name, str) and name else "Tool definition"
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "definition"
        if error["type"] == "missing":
            hint = _FIELD_HELP.get(field)
            parts.append(f"missing required field {field!r}" + (f" ({hint})" if hint else ""))
        elif error["type"] == "callable_type":
            parts.append(f"field 'function' must be callable, got {type(error['input']).__name__}")
        else:
            message = str(error["msg"]).removeprefix("Value error, ")
            parts.append(f"field {field!r}: {message}" if error["loc"] else message)
    return f"{label}: {'; '.join(parts)}."
