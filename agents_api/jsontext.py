"""JSON text, from one encoder: the standard library's, built once per spelling.

Every turn encodes a few small values (a tool result the model reads, the canonical key of a
tool call, the pieces of the running prompt hash, the rows the transcript store writes). A
``json.JSONEncoder`` built once and reused skips ``json.dumps``'s per-call argument handling;
the output is exactly what ``json.dumps`` writes with the same options. Values JSON cannot hold
(datetimes, paths, sets) are written as their ``str()``, so storing a run never fails on them.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["canonical_json", "compact_json", "readable_json"]

_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)
_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              default=str)
_readable = json.JSONEncoder(ensure_ascii=False, default=str)


def compact_json(value: Any) -> str:
    """``json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)``: what the
    transcript store writes."""
    return _compact.encode(value)


def canonical_json(value: Any) -> str:
    """One spelling per value (sorted keys, no whitespace): duplicate keys and prompt hashes."""
    return _canonical.encode(value)


def readable_json(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, default=str)``: what a model reads of a tool
    result."""
    return _readable.encode(value)
