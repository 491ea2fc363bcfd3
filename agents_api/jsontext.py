"""JSON text on the hot path: the standard library's C encoder, called directly.

Every turn encodes a few small values (the envelopes behind the running prompt hash, a tool
result the model reads, the canonical key of a tool call, the rows the transcript store writes).
``json.dumps`` and ``JSONEncoder.encode`` spend more time in their Python wrapper (argument
handling, building a fresh C encoder per call) than the C encoder spends encoding such values.
:func:`json_encoder` builds the C encoder once and returns a function that produces exactly
what ``json.dumps(value, ...)`` would for the same options.

The one difference is how a cycle is found: the reusable encoder keeps no cycle markers (they
are per call state), so a self-referencing value first hits the recursion limit and is then
handed to the standard encoder, which raises its usual ``ValueError``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic_core import PydanticSerializationError
from pydantic_core import to_json as _to_json

__all__ = ["compact_json", "json_encoder"]

_make_c_encoder: Any
try:  # CPython's accelerator; other interpreters take the standard path.
    from _json import encode_basestring as _quote
    from _json import encode_basestring_ascii as _quote_ascii
    from _json import make_encoder as _make_c_encoder
except ImportError:  # pragma: no cover - CPython always has it
    _make_c_encoder = None


def json_encoder(
    *,
    sort_keys: bool = False,
    separators: tuple[str, str] = (", ", ": "),
    ensure_ascii: bool = False,
    default: Callable[[Any], Any] | None = str,
) -> Callable[[Any], str]:
    """A function equivalent to ``json.dumps(value, sort_keys=..., separators=...,
    ensure_ascii=..., default=...)``, built once and safe to share between threads."""
    standard = json.JSONEncoder(sort_keys=sort_keys, separators=separators,
                                ensure_ascii=ensure_ascii, default=default)
    if _make_c_encoder is None:  # pragma: no cover
        return standard.encode
    item_separator, key_separator = separators
    c_encode = _make_c_encoder(
        None, standard.default, _quote_ascii if ensure_ascii else _quote, None, key_separator,
        item_separator, sort_keys, False, True,
    )

    def encode(value: Any) -> str:
        try:
            return "".join(c_encode(value, 0))
        except RecursionError:
            return standard.encode(value)  # a cycle: the standard encoder names it

    return encode


_stdlib_compact = json_encoder(separators=(",", ":"), ensure_ascii=False, default=str)


def compact_json(value: Any) -> str:
    """Compact JSON (``separators=(",", ":")``, UTF-8 text) for values that are stored, not
    compared: the transcript store's envelopes.

    pydantic-core's serializer writes such a value in well under half the instructions of the
    standard library's C encoder. For plain JSON values (dicts with str, int, float or bool
    keys, lists, strings, numbers, booleans, None) the text reads back to the same values as
    ``json.dumps``'; a float's exponent may lose its leading zero (``1e-7``). Where JSON has no
    one answer it follows pydantic's JSON mode: datetimes, dates and times in ISO 8601, enums
    as their value, sets, frozensets, tuples and generators as lists, dataclasses and models as
    objects, UTF-8 bytes as text, a ``None`` key as ``"None"``, other keys as their text;
    anything else as its ``str()``. A value it refuses (bytes that are not UTF-8, a cycle) goes
    to the standard encoder, which writes ``str()`` or raises its usual ``ValueError``.
    """
    try:
        return _to_json(value, fallback=str).decode()
    except (PydanticSerializationError, ValueError, TypeError):
        return _stdlib_compact(value)
