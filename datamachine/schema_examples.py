"""Arguments made from a tool's JSON schema: what :class:`datamachine.testing.TestModel` sends.

The values are the plainest ones the schema allows, the same for the same schema and seed, so
a test can assert on what the tool received: ``"a"`` for a string (``"b"`` with ``seed=1``),
``0`` for a number, ``True`` for a boolean, one item for an array, the required properties of
an object; the first of an ``enum`` or an ``anyOf``; the bounds (``minimum``, ``minLength``,
``minItems``...) and the common string formats (``date``, ``date-time``, ``email``,
``uri``, ``uuid``) are respected. ``pattern`` is not: a tool whose argument must match one gets
a plain string, and its own validation says so, as it would to a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["example_arguments", "example_value"]

_FORMATS = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00",
    "email": "a@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
}
# A schema that refers to itself ($ref cycles) stops growing at this depth.
_MAX_DEPTH = 8


def example_arguments(schema: Mapping[str, Any], *, seed: int = 0) -> dict[str, Any]:
    """The arguments of one call to a tool whose ``parameters`` are ``schema`` (an object
    schema; anything that is not a dict makes ``{}``)."""
    value = example_value(schema, seed=seed)
    return value if isinstance(value, dict) else {}


def example_value(schema: Mapping[str, Any], *, seed: int = 0) -> Any:
    """A value that ``schema`` accepts (see the module docstring); ``$ref`` is resolved
    against the schema's own ``$defs`` / ``definitions``."""
    return _Maker(schema, seed).make(schema, 0)


class _Maker:
    __slots__ = ("root", "seed")

    def __init__(self, root: Mapping[str, Any], seed: int) -> None:
        self.root = root
        self.seed = seed

    def make(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
            return None
        if "$ref" in schema:
            return self.make(self._resolved(schema), depth + 1)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][self.seed % len(schema["enum"])]
        if "default" in schema and "type" not in schema and "properties" not in schema:
            return schema["default"]
        for key in ("anyOf", "oneOf"):
            choices = [c for c in schema.get(key) or () if not _is_null(c)]
            if choices:
                return self.make(choices[0], depth + 1)
        if isinstance(schema.get("allOf"), list):
            return self.make(_merged(schema), depth + 1)
        return self._typed(schema, _kind(schema), depth)

    def _typed(self, schema: Mapping[str, Any], kind: str, depth: int) -> Any:
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "integer":
            return int(self._number(schema, integer=True))
        if kind == "number":
            return float(self._number(schema, integer=False))
        if kind == "boolean":
            return self.seed % 2 == 0
        if kind == "null":
            return None
        return self._string(schema)

    def _resolved(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return {}
        target: Any = self.root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        if not isinstance(target, Mapping):
            return {}
        rest = {key: value for key, value in schema.items() if key != "$ref"}
        return {**target, **rest}

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            return {}
        required = schema.get("required")
        names = [name for name in properties if isinstance(required, list) and name in required]
        return {name: self.make(properties[name], depth + 1) for name in names}

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list):
            return [self.make(item, depth + 1) for item in prefix]
        least = schema.get("minItems")
        most = schema.get("maxItems")
        count = max(least if isinstance(least, int) else 0, 1)
        if isinstance(most, int):
            count = min(count, most)
        items = schema.get("items")
        if not isinstance(items, Mapping):
            return ["a"] * count
        return [self.make(items, depth + 1) for _ in range(count)]

    def _number(self, schema: Mapping[str, Any], *, integer: bool) -> float:
        value: float = self.seed
        step = 1 if integer else 0.5
        low, above = _bound(schema, "minimum"), _bound(schema, "exclusiveMinimum")
        high, below = _bound(schema, "maximum"), _bound(schema, "exclusiveMaximum")
        if low is not None and value < low:
            value = low
        if above is not None and value <= above:
            value = above + step
        if high is not None and value > high:
            value = high
        if below is not None and value >= below:
            value = below - step
        multiple = _bound(schema, "multipleOf")
        if multiple is not None and multiple > 0:
            value = math.ceil(value / multiple) * multiple
        return math.ceil(value) if integer else value

    def _string(self, schema: Mapping[str, Any]) -> str:
        fixed = _FORMATS.get(str(schema.get("format", "")))
        if fixed is not None:
            return fixed
        letter = "abcdefghijklmnopqrstuvwxyz"[self.seed % 26]
        least = schema.get("minLength")
        most = schema.get("maxLength")
        length = max(least if isinstance(least, int) else 0, 1)
        if isinstance(most, int):
            length = min(length, most)
        return letter * length


def _kind(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    if "properties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    return "string"


def _is_null(schema: Any) -> bool:
    return isinstance(schema, Mapping) and schema.get("type") == "null"


def _bound(schema: Mapping[str, Any], key: str) -> float | None:
    value = schema.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def _merged(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``allOf``'s parts as one schema: their properties and required names together."""
    merged: dict[str, Any] = {key: value for key, value in schema.items() if key != "allOf"}
    for part in schema.get("allOf") or ():
        if not isinstance(part, Mapping):
            continue
        for key, value in part.items():
            if key == "properties" and isinstance(value, Mapping):
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required" and isinstance(value, list):
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged.setdefault(key, value)
    return merged
