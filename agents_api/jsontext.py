"""JSON text, from one encoder: pydantic-core's ``to_json``.

Every turn encodes a few small values (a tool result the model reads, the canonical key of a
tool call, the pieces of the running prompt hash, the rows the transcript store writes), so the
encoder is on the loop's hot path; pydantic-core's, written in Rust, is three to seven times
faster than the standard library's for such values, and it ships with pydantic.

Values JSON cannot hold are written the way pydantic writes them in JSON mode: datetimes,
dates and times in ISO 8601, enums as their value, sets and tuples as lists, dataclasses and
models as objects, anything else as its ``str()``. Bytes are written as UTF-8 text (as URL-safe
base64 when they are not UTF-8); NaN and infinities as ``NaN`` and ``Infinity`` (as
``json.dumps`` writes them; :func:`pretty_json`, the command line's, as ``null``); a lone
surrogate (text no UTF-8 can hold) as U+FFFD. A value that contains itself raises
``ValueError``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping

from pydantic_core import PydanticSerializationError, to_json

from agents_api.errors import brief_repr

__all__ = ["canonical_bytes", "canonical_json", "compact_bytes", "compact_json",
           "plain_json", "pretty_json", "unreadable"]


def compact_bytes(value: object) -> bytes:
    """Compact JSON (no whitespace) as UTF-8 bytes, keys in the value's own order."""
    try:
        return to_json(value, fallback=str)
    except PydanticSerializationError as exc:
        if "Circular reference" in str(exc):
            raise ValueError("Circular reference detected") from None
        # Bytes that are not UTF-8 (written as base64), or text that cannot be written: a lone
        # surrogate (from a bad decoder; UTF-8 has no spelling for it), a key that is an
        # integer of more than 4,300 digits, an object whose str() raises. Rare, so only this
        # second attempt pays for rebuilding the value.
        return to_json(_writable(value), fallback=_safe_text, bytes_mode="base64")


def _safe_text(value: object) -> str:
    try:
        return _unicode(str(value))
    except Exception:  # an object whose str() raises still gets written
        return _unicode(brief_repr(value))


def _unicode(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (valid text otherwise unchanged)."""
    if text.isascii():
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _writable(value: object) -> object:
    if isinstance(value, str):
        return _unicode(value)
    if isinstance(value, Mapping):
        return {_safe_text(key): _writable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_writable(item) for item in value]
    return value


def compact_json(value: object) -> str:
    """Compact JSON text: what the transcript store writes and what a model reads of a tool
    result."""
    return compact_bytes(value).decode()


def canonical_bytes(value: object) -> bytes:
    """One spelling per value, as UTF-8 bytes: compact, with every object's keys sorted (so key
    order never matters). Keys that cannot be compared (``1`` and ``"a"`` in one object) raise
    ``TypeError``."""
    return compact_bytes(_sorted(value))


def canonical_json(value: object) -> str:
    """:func:`canonical_bytes` as text: duplicate-call keys, hashes."""
    return canonical_bytes(value).decode()


_FLAT = frozenset({str, int, float, bool, type(None)})


def _flat(value: dict[object, object]) -> bool:
    # A loop, not all(genexpr): this runs for every tool call, and a generator costs more
    # than the small objects it checks.
    for item in value.values():  # noqa: SIM110
        if type(item) not in _FLAT:
            return False
    return True


def _sorted(value: object) -> object:
    if type(value) is dict and _flat(value):
        # The common case: a flat object of scalars (one key or none: in order already).
        return dict(sorted(value.items())) if len(value) > 1 else value
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_sorted(item) for item in value]
    return value


def plain_json(value: object) -> str:
    """Compact JSON of a value that must be data (a setting, a job's engine data): anything
    pydantic cannot write without guessing (an arbitrary object) raises ``TypeError``."""
    try:
        return to_json(value).decode()
    except PydanticSerializationError as exc:
        raise TypeError(str(exc).removeprefix("Unable to serialize unknown type: ")) from None


def unreadable(value: object, where: str = "") -> tuple[str, str] | None:
    """``(where, what)`` for the first part of ``value`` that JSON text cannot carry back,
    else None. ``where`` is its path (``"['a'][0]"``, ``""`` for the value itself).

    Two kinds: a NaN or an infinity (:func:`plain_json` writes ``NaN``/``Infinity``, which other
    JSON readers refuse and which never compare equal to themselves), and an integer longer
    than Python reads back from text (``json.loads`` raises ``ValueError`` past
    ``sys.get_int_max_str_digits()`` digits). Data that must read back the same (a setting, a
    job's engine data) checks here before it is stored.
    """
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, "NaN and infinities are not JSON")
    if isinstance(value, int):
        limit = sys.get_int_max_str_digits()
        # log10(2) digits per bit: the length without writing the number out.
        if limit and value.bit_length() * 0.30103 > limit - 1:
            return (where, f"an integer of more than {limit:,} digits does not read back")
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = unreadable(item, f"{where}[{key!r}]") if isinstance(key, str) else (
                unreadable(key, f"{where} (a key)") or unreadable(item, f"{where}[...]"))
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = unreadable(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def pretty_json(value: object) -> str:
    """JSON indented by two spaces, for people and scripts (the command line's ``--json``):
    standard JSON, so NaN and infinities are written as ``null`` (as JavaScript's
    ``JSON.stringify`` writes them), never as ``NaN``, which other readers refuse."""
    return to_json(value, indent=2, fallback=str, inf_nan_mode="null").decode()
