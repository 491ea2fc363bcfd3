"""A tool call's arguments as the model wrote them: decoded, or explained.

Models write tool-call arguments as JSON text, and small or hurried models get it wrong: a
missing brace, a trailing comma, a list instead of an object, or an object cut off by the
output token limit. None of that may end a run. A provider passes arguments it could not decode
on as the raw text (``parameters`` is then a string); the tool executor turns such a call into
a failed tool result with ``error_type="invalid_arguments"`` carrying :func:`arguments_problem`'s
explanation, so the model reads what was wrong and can call again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agents_api.jsontext import compact_json

__all__ = ["INVALID_ARGUMENTS", "arguments_problem", "coerce_parameters", "excerpt",
           "sendable_parameters"]

INVALID_ARGUMENTS = "invalid_arguments"

_EXCERPT_CHARS = 200


def excerpt(text: str, limit: int = _EXCERPT_CHARS) -> str:
    """``text`` shortened to ``limit`` characters, marked when shortened."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def coerce_parameters(raw: Any) -> dict[str, Any] | None:
    """A tool call's arguments as a dict: ``None``/``""`` → ``{}``, a JSON object string is
    decoded (some providers send arguments as a string); anything else is None (invalid)."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, Mapping):
        return dict(raw)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            decoded = json.loads(raw)
        except ValueError:
            return None
        return decoded if isinstance(decoded, dict) else None
    return None


def sendable_parameters(raw: Any) -> dict[str, Any]:
    """A past call's parameters as they are sent back to a provider in the history: the object,
    or ``{}`` for arguments that never decoded. Some servers re-parse the arguments of every
    earlier call (llama.cpp's chat templates do) and refuse the whole request over one that is
    not an object; the call's tool result already tells the model what it sent."""
    if type(raw) is dict:
        return raw
    return coerce_parameters(raw) or {}


def _cut_off(text: str, error: json.JSONDecodeError) -> bool:
    # The decoder ran out of text while a value was still open: the object was cut short,
    # typically by the output token limit, rather than mistyped in the middle.
    return error.pos >= len(text.rstrip()) or error.msg.startswith("Unterminated string")


def arguments_problem(tool_name: str, raw: Any) -> str:
    """What is wrong with ``raw`` as the arguments of a call to ``tool_name``, in words the
    model can act on (what it sent, what was expected)."""
    if isinstance(raw, str):
        try:
            decoded = json.loads(raw)
        except json.JSONDecodeError as exc:
            if _cut_off(raw, exc):
                why = ("they end before the JSON object does (cut off, perhaps by the output "
                       "token limit)")
            else:
                why = f"they are not valid JSON ({exc.msg} at character {exc.pos + 1})"
            shown = excerpt(raw)
        else:
            why = f"they are JSON {_json_kind(decoded)}, not an object"
            shown = excerpt(raw)
    else:
        why = f"they are {type(raw).__name__}, not a JSON object"
        shown = excerpt(compact_json(raw))
    return (f"The arguments of your call to '{tool_name}' could not be used: {why}. You sent: "
            f"{shown}. Call '{tool_name}' again with its arguments as one JSON object.")


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"
