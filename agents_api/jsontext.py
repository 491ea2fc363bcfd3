"""JSON text, from one encoder: pydantic-core's ``to_json``.

Every turn encodes a few small values (a tool result the model reads, the canonical key of a
tool call, the pieces of the running prompt hash, the rows the transcript store writes), so the
encoder is on the loop's hot path; pydantic-core's, written in Rust, is three to seven times
faster than the standard library's for such values, and it ships with pydantic.

Values JSON cannot hold are written the way pydantic writes them in JSON mode: datetimes,
dates and times in ISO 8601, enums as their value, sets and tuples as lists, dataclasses and
models as objects, anything else as its ``str()``. Bytes are written as UTF-8 text (as URL-safe
base64 when they are not UTF-8); NaN and infinities as ``NaN`` and ``Infinity`` (as
``json.dumps`` writes them). A value that contains itself raises ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

__all__ = ["canonical_bytes", "canonical_json", "compact_bytes", "compact_json",
           "non_finite_path", "plain_json", "pretty_json"]


def compact_bytes(value: Any) -> bytes:
    """Compact JSON (no whitespace) as UTF-8 bytes, keys in the value's own order."""
    try:
        return to_json(value, fallback=str)
    except PydanticSerializationError as exc:
        if "Circular reference" in str(exc):
            raise ValueError("Circular reference detected") from None
        return to_json(value, fallback=str, bytes_mode="base64")


def compact_json(value: Any) -> str:
    """Compact JSON text: what the transcript store writes and what a model reads of a tool
    result."""
    return compact_bytes(value).decode()


def canonical_bytes(value: Any) -> bytes:
    """One spelling per value, as UTF-8 bytes: compact, with every object's keys sorted (so key
    order never matters). Keys that cannot be compared (``1`` and ``"a"`` in one object) raise
    ``TypeError``."""
    return compact_bytes(_sorted(value))


def canonical_json(value: Any) -> str:
    """:func:`canonical_bytes` as text: duplicate-call keys, hashes."""
    return canonical_bytes(value).decode()


_FLAT = frozenset({str, int, float, bool, type(None)})


def _flat(value: dict[Any, Any]) -> bool:
    # A loop, not all(genexpr): this runs for every tool call, and a generator costs more
    # than the small objects it checks.
    for item in value.values():  # noqa: SIM110
        if type(item) not in _FLAT:
            return False
    return True


def _sorted(value: Any) -> Any:
    if type(value) is dict and _flat(value):
        return dict(sorted(value.items()))  # the common case: a flat object of scalars
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_sorted(item) for item in value]
    return value


def plain_json(value: Any) -> str:
    """Compact JSON of a value that must be data (a setting, a job's engine data): anything
    pydantic cannot write without guessing (an arbitrary object) raises ``TypeError``."""
    try:
        return to_json(value).decode()
    except PydanticSerializationError as exc:
        raise TypeError(str(exc).removeprefix("Unable to serialize unknown type: ")) from None


def non_finite_path(value: Any, where: str = "") -> str | None:
    """Where a NaN or an infinity hides in ``value`` (``"['a'][0]"``, ``""`` for the value
    itself), else None. JSON has no spelling for either: :func:`plain_json` writes them as
    ``NaN``/``Infinity``, which other JSON readers refuse and which never compare equal to
    themselves, so data that must read back the same (a setting, engine data) checks here."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = non_finite_path(item, f"{where}[{key!r}]")
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = non_finite_path(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def pretty_json(value: Any) -> str:
    """JSON indented by two spaces, for people (the command line)."""
    return to_json(value, indent=2, fallback=str).decode()
